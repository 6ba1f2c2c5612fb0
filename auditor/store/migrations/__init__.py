"""Alembic migration environment of the audit database (shipped inside the package).

``env.py`` imports only the store's metadata (:mod:`auditor.store.models`) and engine factory;
``versions/`` holds one file per schema revision. Run them with ``auditor db upgrade`` (or
``alembic upgrade head`` from the repository root, which reads ``alembic.ini``).
"""
