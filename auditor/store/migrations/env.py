"""Alembic environment: migrates the audit database described by ``auditor.store.models``.

The connection comes from, in order: ``config.attributes["connection"]`` or
``config.attributes["engine"]`` (set by :func:`auditor.store.db.alembic_config`), the
``sqlalchemy.url`` main option (``alembic -x`` / ini), else :func:`auditor.store.db.resolve_db_url`
(``$AUDITOR_DB_URL`` or the default SQLite file). SQLite runs in batch mode so ALTERs work.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from auditor.store.db import make_engine, resolve_db_url
from auditor.store.models import UTCDateTime, metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Render the custom UTC timestamp type as a plain ``sa.DateTime(timezone=True)``."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure_kwargs(dialect_name: str) -> dict[str, Any]:
    return {
        "target_metadata": target_metadata,
        "render_as_batch": dialect_name == "sqlite",
        "render_item": render_item,
        "compare_type": True,
        "compare_server_default": True,
    }


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or resolve_db_url(None)


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``)."""
    url = _url()
    context.configure(
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **_configure_kwargs(url.split(":", 1)[0].split("+", 1)[0]),
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_with_connection(connection: Any) -> None:
    context.configure(connection=connection, **_configure_kwargs(connection.dialect.name))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a live connection."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with_connection(connection)
        return
    given = config.attributes.get("engine")
    owned = given is None
    engine = make_engine(_url()) if given is None else given
    try:
        with engine.begin() as conn:
            _run_with_connection(conn)
    finally:
        if owned:
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
