"""spec-auditor dashboard (Streamlit): read-only views over the audit database.

Start it with ``auditor dashboard [--db URL] [--port P]`` (loopback by default), or directly with
``streamlit run dashboard/app.py -- --db URL``. The database URL comes from ``--db``, else
``$AUDITOR_DB_URL``, else the default SQLite file (``auditor.store.db.resolve_db_url``).

Pages (sidebar; also addressable as ``?page=<slug>``): Providers, Speed vs fidelity, History,
Run detail (``?page=run&run=RUN_ID``) and Calibration. An empty database shows a first screen
explaining ``auditor demo`` instead of a traceback. Served beyond loopback it asks for a login first
(:mod:`dashboard.auth`). All provider-controlled text is escaped
(``dashboard.render.escape_md``); nothing is rendered as raw HTML.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:  # `streamlit run dashboard/app.py` puts dashboard/ (not the repo root) on sys.path
    import dashboard  # noqa: F401
except ImportError:  # pragma: no cover - only without the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st

from dashboard import auth, data
from dashboard.render import escape_md
from dashboard.views import calibration, common, history, overview, run_detail, speed

#: slug → (sidebar label, renderer, uses the sidebar filters)
PAGES = {
    "providers": ("Providers", overview.render, True),
    "speed": ("Speed vs fidelity", speed.render, True),
    "history": ("History", history.render, False),
    "run": ("Run detail", run_detail.render, False),
    "calibration": ("Calibration", calibration.render, False),
}


def main() -> None:
    """Build the page for this rerun."""
    st.set_page_config(page_title="spec-auditor", page_icon="🔎", layout="wide")
    if not auth.require_login():  # off loopback: a login before anything is read (dashboard.auth)
        return
    db_url = data.dashboard_db_url()
    st.sidebar.title("spec-auditor")
    common.init_from_query("page", list(PAGES), "providers")
    page = st.sidebar.radio("Page", list(PAGES), format_func=lambda s: PAGES[s][0], key="page")
    common.sync_query("page", page)
    for param, owner in (("run", "run"), ("provider", "history")):
        if page != owner:
            common.sync_query(param, None)
    if st.sidebar.button("Refresh data", key="refresh"):
        st.cache_data.clear()
    st.sidebar.caption(f"Database: {escape_md(data.display_url(db_url))}")

    state, detail = data.database_state(db_url)
    _label, render, uses_filters = PAGES[page]
    if state != "ok" and not (page == "calibration" and state == "empty"):
        common.first_screen(state, detail, data.display_url(db_url))
        return
    filters = common.sidebar_filters(db_url) if uses_filters else common.Filters()
    render(db_url, filters)


main()
