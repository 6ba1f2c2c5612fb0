"""Alembic revision scripts (one file per schema revision, oldest first)."""
