"""Dashboard pages; each module exposes ``render(db_url: str, filters: Filters) -> None``."""
