"""Shared page pieces: filters, the empty-database first screen, verdict legends."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from dashboard import data
from dashboard.render import VERDICT_HEX, escape_md


@dataclass(frozen=True)
class Filters:
    """Sidebar filters (empty tuples: no restriction; dates inclusive, UTC)."""

    models: tuple[str, ...] = ()
    suites: tuple[str, ...] = ()
    since: dt.date | None = None
    until: dt.date | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the overview/scatter queries."""
        return {
            "models": list(self.models) or None,
            "suites": list(self.suites) or None,
            "since": self.since,
            "until": self.until,
        }


def init_from_query(key: str, options: list[Any], default: Any = None) -> None:
    """Before creating widget ``key``: seed its session state from the URL query parameter of
    the same name (deep links such as ``?page=run&run=RUN_ID``) when the value is valid, and
    drop a stale state value that is no longer among ``options``."""
    if key in st.session_state and st.session_state[key] in options:
        return
    wanted = st.query_params.get(key)
    if wanted in options:
        st.session_state[key] = wanted
    elif default in options:
        st.session_state[key] = default
    elif options:
        st.session_state[key] = options[0]


def sync_query(key: str, value: Any) -> None:
    """Mirror a widget value into the URL (``?key=value``) so the view can be shared."""
    if value is None:
        st.query_params.pop(key, None)
    elif st.query_params.get(key) != str(value):
        st.query_params[key] = str(value)


def sidebar_filters(db_url: str) -> Filters:
    """Model / suite / date filters in the sidebar, from the values present in the database."""
    opts = data.query(db_url, "filter_options")
    st.sidebar.markdown("**Filters**")
    models = st.sidebar.multiselect("Model", opts["models"], key="f_models")
    suites = st.sidebar.multiselect("Suite", opts["suites"], key="f_suites")
    since = until = None
    if opts["first"] and opts["last"]:
        lo, hi = opts["first"].date(), opts["last"].date()
        picked = st.sidebar.date_input("Date range (UTC)", value=(lo, hi), min_value=lo, max_value=hi, key="f_dates")
        if isinstance(picked, tuple | list):
            since = picked[0] if len(picked) > 0 else None
            until = picked[1] if len(picked) > 1 else None
        elif isinstance(picked, dt.date):
            since = until = picked
    return Filters(models=tuple(models), suites=tuple(suites), since=since, until=until)


def first_screen(state: str, detail: str, db_display: str) -> None:
    """The screen shown when the database has no runs (or cannot be read)."""
    st.title("spec-auditor dashboard")
    if state == "error":
        st.error(
            "The audit database could not be read. Check `--db` / `$AUDITOR_DB_URL` and that the "
            "database server is running."
        )
        st.code(detail, language=None)
    else:
        st.info("No audits in this database yet — nothing to show.")
    st.markdown(
        "**Get started.** Run the demo: it serves three simulated providers (honest, quantized, "
        "relaxed speculative verification), audits each of them against the reference model and "
        "stores the results here:"
    )
    st.code("auditor demo", language="bash")
    st.markdown("Or audit a provider from your `providers.toml`, then reload this page:")
    st.code("auditor check PROVIDER_NAME\nauditor dashboard", language="bash")
    st.caption(f"Database: {escape_md(db_display)} (state: {state})")


def verdict_color_scale(present: Any = None) -> Any:
    """Altair colour scale mapping verdicts to the badge hues (only those ``present``, when
    given, so the legend lists what is on the chart; unknown verdicts are grey-blue)."""
    import altair as alt

    names = list(VERDICT_HEX)
    if present is not None:
        seen = [v for v in dict.fromkeys(present) if v]
        names = [v for v in names if v in seen] + [v for v in seen if v not in VERDICT_HEX]
    return alt.Scale(domain=names, range=[VERDICT_HEX.get(v, "#4c78a8") for v in names])
