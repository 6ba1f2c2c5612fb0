"""The audit database: SQLAlchemy 2.0 models, engine/session helpers, query functions.

Typical use::

    from auditor.store import open_store, queries as q

    store = open_store(db_url)            # resolves --db / $AUDITOR_DB_URL / default; migrates
    with store.session() as s:            # one transaction: commit on success
        run = q.create_run(s, provider_name="local-sim", kind="probe", suite="smoke")

Migrations live in ``auditor/store/migrations`` (see ``alembic/README.md``); models in
:mod:`auditor.store.models` are the authoritative schema.
"""

from auditor.store import models, queries
from auditor.store.db import (
    ENV_DB_URL,
    Store,
    StoreError,
    current_revision,
    default_db_path,
    downgrade,
    head_revision,
    make_engine,
    open_store,
    redact_url,
    resolve_db_url,
    upgrade,
)
from auditor.store.models import *  # noqa: F403  (the names in auditor.store.models.__all__)

__all__ = [  # the models (auditor.store.models.__all__), then the engine/session helpers
    *models.__all__,
    "ENV_DB_URL",
    "Store",
    "StoreError",
    "current_revision",
    "default_db_path",
    "downgrade",
    "head_revision",
    "make_engine",
    "open_store",
    "queries",
    "redact_url",
    "resolve_db_url",
    "upgrade",
]
