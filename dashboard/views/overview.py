"""Providers overview: one row per provider/model with its combined standing (every recent suite,
every cause: ``auditor.watch.standing``), the latest run's verdict and key figures."""

from __future__ import annotations

import csv
import io
from collections import Counter
from typing import Any

import streamlit as st

from auditor.util import kl_floor_text
from dashboard import data
from dashboard.render import (
    answer_badge,
    escape_md,
    fmt_dt,
    fmt_ms,
    fmt_num,
    fmt_p,
    fmt_tokens,
    fmt_usd,
    md_code,
    md_table,
    verdict_badge,
)
from dashboard.views.common import Filters

#: The overview's columns (issue 38, item 4): the provider, the buyer's two answers, the standing and the
#: KL ratio first, so they are on screen at 1,400 px; the detector p-values belong on the run page.
HEADERS = [
    "Provider",
    "Original precision?",
    "Strict verification?",
    "Standing (recent suites)",
    "KL × noise floor",
    "Latest run",
    "Date (UTC)",
    "Model",
    "Tokens/s",
    "TTFT / TPOT p50",
    "Spent (tokens · USD)",
]


def _kl_cell(kl: Any, floor: Any, ratio: Any = None) -> str:
    """The KL × floor cell: the stored ``kl_floor_ratio`` (the figure every report shows, issue 38 item 1) with the
    mean KL; runs stored before it show only the mean KL in nats (a ratio of the summary means would be a
    second, different number for the same thing)."""
    if ratio is not None:
        return f"**{kl_floor_text(ratio)}×**" + (f" ({fmt_num(kl)} nats)" if kl is not None else "")
    if kl is None:
        return "—"
    return f"{fmt_num(kl)} nats" + (f" (floor {fmt_num(floor)})" if floor else "")


def answer_cell(r: dict[str, Any], key: str) -> str:
    """The standing's answer to question ``key`` (``precision`` / ``verification``) as a badge; "—" without one."""
    for q in (r.get("standing_detail") or {}).get("questions") or []:
        if q.get("key") == key:
            return answer_badge(q.get("answer"))
    return "—"


def standing_cell(r: dict[str, Any]) -> str:
    """The combined standing badge, the suites it covers and every distinct cause (markdown, escaped)."""
    st = r.get("standing")
    if not st:  # no completed audit; or its standing predates revision 0005 (the reason says to upgrade)
        return escape_md(r["standing_reason"]) if r.get("standing_reason") else "—"
    causes: list[str] = []
    for c in r.get("causes") or []:
        if c["verdict"] not in causes and c["verdict"] != st:
            causes.append(c["verdict"])
    suites = ", ".join(escape_md(str(x)) for x in r.get("standing_suites") or [])
    return (verdict_badge(st) + (" + " + " + ".join(verdict_badge(c) for c in causes) if causes else "")
            + (f" over {suites}" if suites else ""))


def overview_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers (:data:`HEADERS`) and markdown cells of the overview table (provider text escaped)."""
    out = []
    for r in rows:
        date = fmt_dt(r["started_at"]).removesuffix(" UTC").replace(" ", "\u00a0")
        if r["last_status"] not in ("completed", None) and r["last_started_at"] != r["started_at"]:
            date += f" (newest run {escape_md(r['last_status'])})"
        out.append(
            [
                f"**{escape_md(r['provider_name'])}**",
                answer_cell(r, "precision"),
                answer_cell(r, "verification"),
                standing_cell(r),
                _kl_cell(r["mean_kl"], r["noise_floor"], r.get("kl_floor_ratio")),
                verdict_badge(r["verdict"]) + (f" ({escape_md(r['suite'])})" if r.get("suite") else ""),
                date,
                escape_md(r["model"] or "—"),
                fmt_num(r["tokens_per_s"], 4),
                f"{fmt_ms(r['ttft_median_s'])} / {fmt_ms(r['tpot_median_s'])}",
                f"{fmt_tokens(r['tokens'])} · {escape_md(fmt_usd(r['cost_usd']))}",
            ]
        )
    return list(HEADERS), out


def why_markdown(r: dict[str, Any]) -> str:
    """The "Why" entry of a row: the standing, the buyer's two questions (``standing_detail["questions"]``,
    :mod:`auditor.watch.standing`), every cause (suite, run, rule, deciding evidence),
    what no recent audit tested, and the latest run's verdict and reason (markdown, escaped)."""
    who = f"**{escape_md(r['provider_name'])}** ({escape_md(r['model'] or '—')})"
    reason = r["verdict_reason"] or ("no verdict yet" if not r["verdict"] else "")
    latest = f"latest run {md_code(r['run_id'])}: {verdict_badge(r['verdict'])} {escape_md(reason, max_len=400)}"
    if not r.get("standing"):
        return f"- {who}, {latest}"
    lines = [f"- {who}: standing {verdict_badge(r['standing'])} — {escape_md(r['standing_reason'], max_len=400)}"]
    for q in (r.get("standing_detail") or {}).get("questions") or []:
        lines.append(f"  - {escape_md(q.get('question'))} **{escape_md(q.get('answer'))}** — "
                     f"{escape_md(q.get('evidence'), max_len=400)}")
    for c in r.get("causes") or []:
        ev = ", ".join(f"{e.get('detector')} p_adj={fmt_p(e.get('p_adjusted'))}" for e in c.get("evidence") or [])
        tag = "primary" if c["primary"] else f"also, in a {c['audit_verdict']} audit"
        lines.append(f"  - {verdict_badge(c['verdict'])} ({escape_md(tag)}; suite {escape_md(str(c['suite']))}, run "
                     f"{md_code(c['run_id'])}, rule {md_code(str(c['rule']))}): {escape_md(c['reason'], max_len=300)}"
                     + (f" — {escape_md(ev)}" if ev else ""))
    for n in r.get("not_tested") or []:
        lines.append(f"  - not tested: {escape_md(n['what'])} — {escape_md(n['why'], max_len=200)}")
    lines.append(f"  - {latest}")
    return "\n".join(lines)


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    cols = [
        "provider_name", "model", "standing", "verdict", "run_id", "started_at", "clear_mismatch_rate", "mean_kl",
        "noise_floor", "tokens", "cost_usd", "ttft_median_s", "tpot_median_s", "tokens_per_s", "n_runs",
    ]  # fmt: skip
    w = csv.writer(buf)
    w.writerow(cols + ["detector_p_adjusted", "causes"])
    for r in rows:
        det = ";".join(f"{d['name']}={d['p_adjusted']}" for d in r["detectors"])
        causes = ";".join(f"{c['verdict']}@{c['suite']}:{c['run_id']}" for c in r.get("causes") or [])
        w.writerow([r.get(c) for c in cols] + [det, causes])
    return buf.getvalue()


def render(db_url: str, filters: Filters) -> None:
    """Draw the Providers page."""
    st.header("Providers")
    st.caption(
        "Standing per provider and model: the worst verdict of the newest audit of each suite within 7 days "
        "of its newest audit, with every cause any of them found; then the latest run's verdict and the "
        "figures behind it (`auditor report --provider NAME`). KL is per token in nats against the reference "
        "model, shown as a multiple of the honest-vs-honest noise floor. Each detector's p-value is on the "
        "run page. Tokens and USD are summed over the runs in the selected period."
    )
    rows = data.query(db_url, "provider_overview", **filters.kwargs())
    if not rows:
        st.info("No runs match the filters. Widen the date range or clear the model/suite filters.")
        return
    counts = Counter(r.get("standing") or "no verdict" for r in rows)
    st.markdown(
        f"**{len(rows)} provider/model pairs** — "
        + " · ".join(
            f"{verdict_badge(v) if v != 'no verdict' else 'no verdict'} × {n}" for v, n in sorted(counts.items())
        )
    )
    headers, cells = overview_table(rows)
    st.markdown(md_table(headers, cells, align=["l", "l", "l", "l", "r", "l", "l", "l", "r", "r", "r"]))
    st.markdown("**Why**")
    for r in rows:
        st.markdown(why_markdown(r))
    st.download_button("Download as CSV", _csv(rows), file_name="providers.csv", mime="text/csv", key="dl_overview")
