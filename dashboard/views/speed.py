"""Speed vs fidelity: throughput (tokens/s) against fidelity (KL or clear-mismatch rate), and the
speed profiles of ``auditor speed`` (tokens/s per workload and concurrency, with the speculation
fingerprint: mean accepted tokens per verification step)."""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
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


def scatter_chart(df: pd.DataFrame, metric: str, noise_floor: float | None) -> alt.LayerChart | alt.FacetChart:
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
        render_speed_profiles(db_url)
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
    render_speed_profiles(db_url)


# -- speed profiles (auditor speed) ---------------------------------------------------------------

#: ``speculation.detected`` (True / False / None or absent) as the table shows it
_SPECULATES: dict[object, str] = {True: "yes", False: "no"}

SPEED_COLUMNS = ["provider", "run_id", "date", "workload", "concurrency", "ttft_s", "tpot_ms", "tokens_per_s",
                 "throughput", "tokens_per_step", "ci_low", "ci_high", "speculates", "tpot_ratio_vs_chat"]


def speed_cells_frame(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (speed run, workload, concurrency) cell from ``audit_runs`` rows of kind
    ``speed`` (dicts with ``provider_name``, ``run_id``, ``started_at``, ``summary``); malformed
    summaries are skipped. ``speculates`` is yes / no / cannot tell."""
    rows = []
    for r in runs:
        summary = r.get("summary") or {}
        cells = summary.get("cells") if isinstance(summary, dict) else None
        if not isinstance(cells, list):
            continue
        for c in cells:
            if not isinstance(c, dict):
                continue
            spec = c.get("speculation")
            sp = spec if isinstance(spec, dict) else {}
            ci95 = sp.get("ci95")
            ci = ci95 if isinstance(ci95, list) and len(ci95) == 2 else [None, None]
            tpot = c.get("tpot_median_s")
            rows.append({
                "provider": r.get("provider_name"), "run_id": r.get("run_id"), "date": fmt_dt(r.get("started_at")),
                "workload": c.get("workload"), "concurrency": c.get("concurrency"),
                "ttft_s": c.get("ttft_median_s"), "tpot_ms": tpot * 1e3 if isinstance(tpot, (int, float)) else None,
                "tokens_per_s": c.get("tokens_per_s_median"), "throughput": c.get("throughput_tokens_per_s"),
                "tokens_per_step": sp.get("mean_accepted_tokens_per_step"), "ci_low": ci[0], "ci_high": ci[1],
                "speculates": _SPECULATES.get(sp.get("detected"), "cannot tell"),
                "tpot_ratio_vs_chat": c.get("tpot_ratio_vs_chat"),
            })
    return pd.DataFrame(rows, columns=SPEED_COLUMNS)


def padded_domain(values: Any, frac: float = 0.12) -> list[float] | alt.UndefinedType:
    """``[lo, hi]`` around the finite ``values`` with ``frac`` of the span (at least 0.1) on each side, so
    points at the extremes (the repetition workload's, issue 38 item 7) are drawn whole, not clipped at a
    corner; Altair's automatic domain when there is no finite value."""
    xs = [float(v) for v in (values if values is not None else []) if v is not None and np.isfinite(float(v))]
    if not xs:
        return alt.Undefined
    lo, hi = min(xs), max(xs)
    pad = max(frac * (hi - lo), 0.1)
    return [lo - pad, hi + pad]


def speed_profile_chart(df: pd.DataFrame) -> alt.HConcatChart:
    """Left: output tokens/s per request against concurrency, one line per (provider, workload).
    Right: the fingerprint (mean tokens per step) against the TPOT ratio to chat, per cell."""
    base = alt.Chart(df)
    tip = ["provider:N", "workload:N", "concurrency:Q", alt.Tooltip("tokens_per_s:Q", format=".1f"),
           alt.Tooltip("tpot_ms:Q", format=".1f"), alt.Tooltip("tokens_per_step:Q", format=".2f"), "speculates:N"]
    lines = base.mark_line(point=True).encode(
        x=alt.X("concurrency:Q", title="Concurrency (requests in flight)", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("tokens_per_s:Q", title="Output tokens/s per request"),
        color=alt.Color("workload:N", title="Workload"),
        strokeDash=alt.StrokeDash("provider:N", title="Provider"),
        tooltip=tip,
    ).properties(height=320, width=380)
    spec = base.transform_filter("datum.tokens_per_step != null").mark_point(filled=True, size=120).encode(
        x=alt.X("tokens_per_step:Q", title="Mean accepted tokens per step (fingerprint)",
                scale=alt.Scale(domain=padded_domain(df.get("tokens_per_step")), nice=False, zero=False)),
        y=alt.Y("tpot_ratio_vs_chat:Q", title="TPOT of chat / TPOT of this workload",
                scale=alt.Scale(domain=padded_domain(df.get("tpot_ratio_vs_chat")), nice=False, zero=False)),
        color=alt.Color("workload:N", title="Workload"),
        shape=alt.Shape("provider:N", title="Provider"),
        tooltip=tip,
    ).properties(height=320, width=380)
    return alt.hconcat(lines, spec)


@st.cache_data(ttl=data.CACHE_TTL_S, show_spinner=False)
def _speed_runs(db_url: str, limit: int = 20) -> list[dict[str, Any]]:
    from sqlalchemy.orm import Session

    from auditor.store import queries

    with Session(data.get_engine(db_url)) as s:
        return [{"provider_name": r.provider_name, "run_id": r.id, "started_at": r.started_at, "summary": r.summary}
                for r in queries.list_runs(s, kind="speed", status="completed", limit=limit)]


def render_speed_profiles(db_url: str) -> None:
    """The speed-profile section: chart and table of the newest speed run per provider."""
    st.subheader("Speed profile per workload and load")
    try:
        runs = _speed_runs(db_url)
    except Exception as exc:  # an old schema must not break the page
        st.caption(f"Speed profiles unavailable: {escape_md(type(exc).__name__)}")
        return
    newest: dict[str, dict[str, Any]] = {}
    for r in runs:  # newest first
        newest.setdefault(r["provider_name"], r)
    df = speed_cells_frame(list(newest.values()))
    if df.empty:
        st.caption("No speed profile yet: run `auditor speed --provider NAME` (TTFT, TPOT and tokens/s per "
                   "workload and concurrency, with the speculation fingerprint).")
        return
    st.caption(
        "Where does the speed come from? Speculation emits several tokens per verification step; it pays most "
        "on predictable text (repetition, code) and at low concurrency. The fingerprint is evidence read from "
        "stream timing, not a verdict; time-batched streams show 'cannot tell'."
    )
    st.altair_chart(speed_profile_chart(df), width="stretch")
    rows = [
        [escape_md(str(x["workload"])), str(x["concurrency"]), f"**{escape_md(str(x['provider']))}**",
         fmt_num(x["ttft_s"], 3), fmt_num(x["tpot_ms"], 3), fmt_num(x["tokens_per_s"], 4),
         (f"{fmt_num(x['tokens_per_step'], 3)} [{fmt_num(x['ci_low'], 3)}, {fmt_num(x['ci_high'], 3)}]"
          if x["tokens_per_step"] is not None and x["tokens_per_step"] == x["tokens_per_step"] else "—"),
         escape_md(x["speculates"]), md_code(str(x["run_id"]), in_table=True)]
        for x in df.to_dict("records")
    ]
    st.markdown(md_table(["Workload", "Concurrency", "Provider", "TTFT (s)", "TPOT (ms)", "Tokens/s",
                          "Tokens/step [95% CI]", "Speculates", "Run"], rows,
                         align=["l", "r", "l", "r", "r", "r", "r", "l", "l"]))
