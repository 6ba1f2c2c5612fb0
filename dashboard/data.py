"""Cached, read-only data access for the dashboard (through :mod:`auditor.store.dashboard_queries` and, for the
run-detail page, :mod:`auditor.store.run_detail_queries`).

The engine is cached per URL with ``st.cache_resource``; query results (plain dicts/lists) with
``st.cache_data`` for :data:`CACHE_TTL_S` seconds, so reruns triggered by widgets do not hit the
database. The sidebar's "Refresh" button clears the data cache.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import streamlit as st
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from auditor.store import dashboard_queries, run_detail_queries
from auditor.store.db import make_engine, redact_url, resolve_db_url

#: Seconds a query result stays cached.
CACHE_TTL_S = 30


def dashboard_db_url(argv: Sequence[str] | None = None) -> str:
    """The database URL: ``--db URL`` among the script arguments (``streamlit run app.py -- --db
    URL``), else ``$AUDITOR_DB_URL``, else the default SQLite file (see ``auditor.store.db``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    url = None
    for i, a in enumerate(args):
        if a == "--db" and i + 1 < len(args):
            url = args[i + 1]
        elif a.startswith("--db="):
            url = a.split("=", 1)[1]
    return resolve_db_url(url)


@st.cache_resource(show_spinner=False)
def get_engine(db_url: str) -> Any:
    """One SQLAlchemy engine per URL for the life of the Streamlit server."""
    return make_engine(db_url)


def _sqlite_file_missing(db_url: str) -> bool:
    u = make_url(db_url)
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return False
    return not Path(u.database).expanduser().exists()


@st.cache_data(ttl=5, show_spinner=False)
def database_state(db_url: str) -> tuple[str, str]:
    """``(state, detail)`` with state one of ``"missing"`` (no SQLite file yet), ``"no_schema"``
    (never migrated), ``"empty"`` (no runs), ``"ok"`` or ``"error"`` (detail: the message)."""
    try:
        if _sqlite_file_missing(db_url):
            return "missing", ""
        with Session(get_engine(db_url)) as s:
            if not dashboard_queries.has_schema(s):
                return "no_schema", ""
            n = dashboard_queries.count_runs(s)
        return ("ok" if n else "empty"), str(n)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def query_function(name: str) -> Callable[..., Any]:
    """The store query ``name``: from :mod:`auditor.store.run_detail_queries` when it is one of the run-detail
    page's (``run_detail``, ``probe_detail``, ...), else from :mod:`auditor.store.dashboard_queries`.

    Raises:
        AttributeError: neither module defines ``name``.
    """
    module = run_detail_queries if name in run_detail_queries.__all__ else dashboard_queries
    fn: Callable[..., Any] = getattr(module, name)
    return fn


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def query(db_url: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the query ``name`` (:func:`query_function`) as ``fn(session, *args, **kwargs)`` (cached)."""
    fn = query_function(name)
    with Session(get_engine(db_url)) as s:
        return fn(s, *args, **kwargs)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def shipped_calibration() -> list[dict[str, Any]]:
    """The calibration shipped with this release (``dashboard_queries.shipped_calibration_table``; cached)."""
    return dashboard_queries.shipped_calibration_table()


def display_url(db_url: str) -> str:
    """The URL with any password hidden."""
    return redact_url(db_url)
