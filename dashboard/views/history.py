"""History: verdict and key statistics of one provider over time; verdict changes marked."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.render import (
    escape_md,
    fmt_dt,
    fmt_ms,
    fmt_num,
    fmt_pct,
    fmt_usd,
    md_code,
    md_table,
    verdict_badge,
)
from dashboard.views.common import Filters, init_from_query, sync_query, verdict_color_scale

STATS = {
    "mean_kl": "Mean KL (nats/token)",
    "clear_mismatch_rate": "Greedy clear-mismatch rate",
    "tokens_per_s": "Throughput (tokens/s)",
    "ttft_median_s": "TTFT median (s)",
    "tpot_median_s": "TPOT median (s)",
}


#: Least width of the History time axis (s): one run, or runs seconds apart, still get a readable axis
#: (issue 38 item 7: one run drew a single tick labelled ".055", a millisecond).
MIN_SPAN_S = 2 * 3600.0


def time_domain(rows: list[dict[str, Any]]) -> list[float]:
    """``[start, end]`` of the time axis in epoch milliseconds (Vega-Lite's temporal domain): the runs'
    span widened by 5% each side, and to at least :data:`MIN_SPAN_S` around its middle."""
    ts = [r["started_at"].timestamp() for r in rows if r.get("started_at") is not None]
    if not ts:
        return []
    lo, hi = min(ts), max(ts)
    pad = max(0.05 * (hi - lo), (MIN_SPAN_S - (hi - lo)) / 2, 0.0)
    return [(lo - pad) * 1000.0, (hi + pad) * 1000.0]


def history_chart(rows: list[dict[str, Any]], stat: str) -> alt.LayerChart | alt.FacetChart | None:
    """Line of ``stat`` over time, points coloured by verdict, rules at verdict changes."""
    pts = [
        {"time": r["started_at"].isoformat(), "value": r[stat], "verdict": r["verdict"] or "",
         "run_id": r["run_id"], "date": fmt_dt(r["started_at"])}
        for r in rows
        if r.get(stat) is not None
    ]  # fmt: skip
    if not pts:
        return None
    df = pd.DataFrame(pts)
    base = alt.Chart(df).encode(x=alt.X("time:T", title="Run start (UTC)", scale=alt.Scale(domain=time_domain(rows)),
                                       axis=alt.Axis(format="%b %d %H:%M", labelAngle=-30)))
    line = base.mark_line(color="#888").encode(y=alt.Y("value:Q", title=STATS[stat]))
    dots = base.mark_circle(size=140).encode(
        y="value:Q",
        color=alt.Color(
            "verdict:N", scale=verdict_color_scale(df["verdict"]), title="Verdict", legend=alt.Legend(orient="bottom")
        ),
        tooltip=["date:N", "verdict:N", "run_id:N", alt.Tooltip("value:Q", format=".4g", title=STATS[stat])],
    )
    layers = [line, dots]
    changes = [
        {"time": r["started_at"].isoformat(), "label": f"{r['changed_from']} → {r['verdict']}"}
        for r in rows
        if r.get("changed_from")
    ]
    if changes:
        cdf = pd.DataFrame(changes)
        layers.append(alt.Chart(cdf).mark_rule(color="#c62828", strokeDash=[4, 3]).encode(x="time:T"))
        layers.append(
            alt.Chart(cdf)
            .mark_text(align="left", dx=4, baseline="top", color="#c62828")
            .encode(x="time:T", y=alt.value(2), text="label:N")
        )
    return alt.layer(*layers).properties(height=340)


def render(db_url: str, filters: Filters) -> None:
    """Draw the History page."""
    st.header("History")
    providers = data.query(db_url, "filter_options")["providers"]
    if not providers:
        st.info("No providers yet.")
        return
    c1, c2 = st.columns([1, 1])
    init_from_query("provider", providers)
    provider = c1.selectbox("Provider", providers, key="provider")
    sync_query("provider", provider)
    stat = c2.selectbox("Statistic", list(STATS), format_func=lambda s: STATS[s], key="history_stat")
    assert stat is not None  # STATS is not empty
    rows = data.query(db_url, "provider_history", provider)
    if not rows:
        st.info("This provider has no runs.")
        return
    chart = history_chart(rows, stat)
    if chart is None:
        st.info(f"No run of this provider recorded {STATS[stat].lower()}.")
    else:
        st.altair_chart(chart, width="stretch")
    changes = [r for r in rows if r["changed_from"]]
    if changes:
        st.markdown(
            "**Verdict changes:** "
            + "; ".join(
                f"{fmt_dt(r['started_at'])}: {verdict_badge(r['changed_from'])} → {verdict_badge(r['verdict'])}"
                for r in changes
            )
        )
    else:
        st.markdown("**Verdict changes:** none — the verdict has been stable.")
    table = [
        [
            fmt_dt(r["started_at"]),
            md_code(r["run_id"], in_table=True),
            escape_md(r["status"]),
            verdict_badge(r["verdict"]),
            (f"⚠ changed from {verdict_badge(r['changed_from'])}" if r["changed_from"] else ""),
            fmt_num(r["mean_kl"]),
            fmt_pct(r["clear_mismatch_rate"]),
            fmt_num(r["tokens_per_s"], 4),
            fmt_ms(r["ttft_median_s"]),
            escape_md(fmt_usd(r["cost_usd"])),
        ]
        for r in reversed(rows)
    ]
    st.markdown(
        md_table(
            ["Date", "Run", "Status", "Verdict", "Change", "Mean KL", "Clear mismatch", "Tokens/s", "TTFT p50", "USD"],
            table,
            align=["l", "l", "l", "l", "l", "r", "r", "r", "r", "r"],
        )
    )
    alerts = [a for a in data.query(db_url, "recent_alerts", limit=200) if a["provider_name"] == provider]
    if alerts:
        st.markdown("**Alerts sent**")
        for a in alerts[:20]:
            hook = "" if a["webhook_status"] is None else f" (webhook HTTP {a['webhook_status']})"
            st.markdown(f"- {fmt_dt(a['created_at'])}: {escape_md(a['message'], max_len=300)}{escape_md(hook)}")
