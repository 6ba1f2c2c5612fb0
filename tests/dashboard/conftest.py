"""Fixtures for the dashboard tests: a migrated SQLite database seeded with the demo fixtures
(three providers, twelve runs), an empty migrated one, and a URL whose file does not exist."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

#: Newest seeded run time (fixed so dates in assertions are stable).
SEED_NOW = dt.datetime(2026, 3, 20, 12, 0, tzinfo=dt.UTC)
APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture(scope="session")
def seeded(tmp_path_factory):
    """``(url, seed_summary)`` of a migrated SQLite file holding :func:`seed_demo` data."""
    from auditor.store.db import open_store
    from tests.fixtures_store import seed_demo

    path = tmp_path_factory.mktemp("seeded") / "auditor.db"
    url = f"sqlite:///{path}"
    store = open_store(url)
    with store.session() as s:
        summary = seed_demo(s, now=SEED_NOW)
    store.close()
    return url, summary


@pytest.fixture(scope="session")
def empty_url(tmp_path_factory) -> str:
    """A migrated SQLite database with no rows."""
    from auditor.store.db import open_store

    path = tmp_path_factory.mktemp("empty") / "auditor.db"
    url = f"sqlite:///{path}"
    open_store(url).close()
    return url


@pytest.fixture
def app_test(monkeypatch):
    """Factory: an ``AppTest`` of dashboard/app.py against ``db_url`` with query params set."""
    from streamlit.testing.v1 import AppTest

    def make(db_url: str, **query: str):
        monkeypatch.setenv("AUDITOR_DB_URL", db_url)
        at = AppTest.from_file(str(APP), default_timeout=60)
        for k, v in query.items():
            at.query_params[k] = v
        return at.run()

    return make
