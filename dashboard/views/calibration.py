"""Calibration: measured rejection rates of the audit per simulator profile and budget."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data
from dashboard.render import escape_md, fmt_dt, fmt_pct, fmt_tokens, md_table
from dashboard.views.common import Filters


def render(db_url: str, filters: Filters) -> None:
    """Draw the Calibration page (works on an empty database too)."""
    st.header("Calibration")
    st.caption(
        "How often the audit rejects, measured on the simulator where the truth is known: on the "
        "honest profile this is the false-positive rate (should stay near alpha); on degraded "
        "profiles it is the power. Intervals are 95% binomial confidence intervals."
    )
    local = data.query(db_url, "calibration_table")
    shipped = data.shipped_calibration()
    if not local and not shipped:
        st.info(
            "No calibration results yet. Calibration audits the simulator's honest and degraded "
            "profiles many times to measure the false-positive rate and the power at each token "
            "budget; run it with:"
        )
        st.code("auditor calibrate", language="bash")
        return
    if local:
        st.subheader("Measured in this database")
        st.caption("From `auditor calibrate` runs stored here; `auditor plan` prefers these for their models.")
        _table(local)
    if shipped:
        st.subheader("Shipped with this release")
        st.caption("`docs/calibration.json`: the committed benchmark `auditor plan` reads when this database "
                   "has none for a model." + ("" if local else " Run `auditor calibrate` to measure your own."))
        _table(shipped)


def _table(rows: list[dict[str, Any]]) -> None:
    """One calibration table (rows of ``calibration_table`` / ``shipped_calibration_table``)."""
    table = [
        [
            escape_md(r["model"]),
            escape_md(r["profile"]),
            escape_md(r.get("suite") or "default"),
            fmt_tokens(r["budget_tokens"]),
            fmt_tokens(r["audits"]),
            fmt_pct(r["rejection_rate"]),
            f"[{fmt_pct(r['ci_low'])}, {fmt_pct(r['ci_high'])}]",
            fmt_pct(r["cause_correct_rate"]),
            fmt_dt(r["created_at"]),
        ]
        for r in rows
    ]
    st.markdown(
        md_table(
            ["Model", "Profile", "Suite", "Budget (tokens)", "Audits", "Rejection rate", "95% CI", "Cause correct", "Measured"],
            table,
            align=["l", "l", "l", "r", "r", "r", "l", "r", "l"],
        )
    )
