"""Speed vs fidelity: throughput (tokens/s) against fidelity (KL or clear-mismatch rate)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.render import escape_md, fmt_dt, fmt_num, fmt_pct, md_code, md_table, verdict_badge
from dashboard.views.common import Filters, verdict_color_scale

#: Fidelity axes offered: summary key → (axis title, formatter).
METRICS = {
    "mean_kl": ("Mean KL vs reference (nats/token) — lower is more faithful", fmt_num),
    "clear_mismatch_rate": ("Greedy clear-mismatch rate — lower is more faithful", fmt_pct),
}


def scatter_frame(points: list[dict[str, Any]], metric: str) -> pd.DataFrame:
    """Plottable points: rows with both ``tokens_per_s`` and ``metric`` present."""
    rows = [
        {
            "provider": p["provider_name"],
            "model": p["model"] or "",
            "verdict": p["verdict"] or "",
            "run_id": p["run_id"],
            "date": fmt_dt(p["started_at"]),
            "tokens_per_s": p["tokens_per_s"],
            metric: p[metric],
        }
        for p in points
        if p.get("tokens_per_s") is not None and p.get(metric) is not None
    ]
    return pd.DataFrame(rows, columns=["provider", "model", "verdict", "run_id", "date", "tokens_per_s", metric])


def scatter_chart(df: pd.DataFrame, metric: str, noise_floor: float | None) -> alt.LayerChart:
    """Altair scatter (one circle per point, labelled with the provider) plus a noise-floor rule."""
    title = METRICS[metric][0]
    base = alt.Chart(df)
    # Head-room on the right so the provider labels of the least faithful points stay visible.
    x_max = max([float(df[metric].max()), noise_floor or 0.0]) * 1.3 or 1.0
    y_max = float(df["tokens_per_s"].max()) * 1.1 or 1.0
    points = base.mark_circle(size=260, opacity=0.85).encode(
        x=alt.X(f"{metric}:Q", title=title, scale=alt.Scale(domain=[0, x_max], nice=False)),
        y=alt.Y("tokens_per_s:Q", title="Throughput (tokens/s) — higher is faster", scale=alt.Scale(domain=[0, y_max])),
        color=alt.Color(
            "verdict:N", scale=verdict_color_scale(df["verdict"]), title="Verdict", legend=alt.Legend(orient="bottom")
        ),
        tooltip=["provider:N", "model:N", "verdict:N", "date:N", "run_id:N",
                 alt.Tooltip("tokens_per_s:Q", format=".1f"), alt.Tooltip(f"{metric}:Q", format=".4g")],
    )  # fmt: skip
    labels = base.mark_text(align="left", dx=12, dy=-6, fontSize=13).encode(
        x=f"{metric}:Q", y="tokens_per_s:Q", text="provider:N"
    )
    layers = [points, labels]
    if metric == "mean_kl" and noise_floor is not None:
        rule = (
            alt.Chart(pd.DataFrame({"floor": [noise_floor]}))
            .mark_rule(strokeDash=[6, 4], color="#555")
            .encode(x="floor:Q", tooltip=[alt.Tooltip("floor:Q", title="noise floor (nats)", format=".4g")])
        )
        layers.append(rule)
    return alt.layer(*layers).properties(height=420)


def render(db_url: str, filters: Filters) -> None:
    """Draw the Speed vs fidelity page."""
    st.header("Speed vs fidelity")
    st.caption(
        "Which kind of speedup are you buying? Up is faster; right is further from the reference "
        "model. A fast provider far to the right got its speed by changing the model (quantization) "
        "or by accepting drafts the target would reject (relaxed verification) — lossless "
        "speculative decoding is fast *and* stays at the noise floor (dashed line)."
    )
    c1, c2 = st.columns([2, 1])
    metric = c1.radio(
        "Fidelity axis", list(METRICS), format_func=lambda m: METRICS[m][0].split(" —")[0],
        horizontal=True, key="speed_metric",
    )  # fmt: skip
    all_runs = c2.checkbox("Every run (not only the latest per provider)", key="speed_all")
    points = data.query(db_url, "speed_fidelity_points", latest_only=not all_runs, **filters.kwargs())
    if not points:
        st.info("No run with a verdict matches the filters.")
        return
    df = scatter_frame(points, metric)
    floors = [p["noise_floor"] for p in points if p.get("noise_floor") is not None]
    if df.empty:
        st.info("These runs recorded no throughput or fidelity figures, so there is nothing to plot.")
    else:
        st.altair_chart(scatter_chart(df, metric, (sum(floors) / len(floors)) if floors else None), width="stretch")
    fmt = METRICS[metric][1]
    rows = [
        [
            f"**{escape_md(p['provider_name'])}**",
            escape_md(p["model"] or "—"),
            verdict_badge(p["verdict"]),
            fmt_num(p["tokens_per_s"], 4),
            fmt(p[metric]),
            fmt_dt(p["started_at"]),
            md_code(p["run_id"], in_table=True),
        ]
        for p in sorted(points, key=lambda p: -(p.get("tokens_per_s") or 0))
    ]
    st.markdown(
        md_table(
            ["Provider", "Model", "Verdict", "Tokens/s", METRICS[metric][0].split(" —")[0], "Date", "Run"],
            rows,
            align=["l", "l", "l", "r", "r", "l", "l"],
        )
    )
