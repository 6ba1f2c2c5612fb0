"""Run detail: every cause found (primary and secondary, with the deciding evidence), the
parameter-compliance pre-flight checks stored with the run (failed ones named), every detector,
the strongest evidence at token level, raw responses, chunk sizes. Runs stored before causes or
pre-flights existed render without those sections."""

from __future__ import annotations

import json
import math
from typing import Any

import altair as alt
import pandas as pd
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
    fmt_pct,
    fmt_tokens,
    fmt_usd,
    md_code,
    md_table,
    verdict_badge,
    visible_token,
)
from dashboard.views.common import Filters, init_from_query, sync_query

#: Longest raw response shown inline (characters); longer ones are cut with a note.
MAX_RAW_CHARS = 200_000
#: Evidence items rendered per detector.
MAX_EVIDENCE = 5


def _get(item: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in item and item[n] is not None:
            return item[n]
    return None


def _entry(entry: Any) -> tuple[Any, Any]:
    """``(token id or text, logprob)`` of one top-k entry ``[id|text, logprob]`` or dict."""
    if isinstance(entry, dict):
        return _get(entry, "token_id", "id", "token"), entry.get("logprob")
    if isinstance(entry, list | tuple) and entry:
        return entry[0], (entry[1] if len(entry) > 1 else None)
    return None, None


def _token_label(tok: Any, id_text: dict[int, str], text: str | None = None) -> str:
    """Markdown for a token: its visible text when known (escaped), else ``id N``."""
    if text is None and isinstance(tok, str):
        text = tok
    if text is None and isinstance(tok, int) and tok in id_text:
        text = id_text[tok]
    if text is not None:
        return escape_md(visible_token(text))
    return f"id {escape_md(tok)}" if tok is not None else "—"


def token_evidence_md(item: dict[str, Any]) -> str | None:
    """Markdown for one token-level evidence item, or None when it is not token-level.

    Reads the ``auditor.detectors`` evidence format (``token_id``/``token``, ``ref_top5`` as
    ``[[id, logprob], ...]`` with optional ``ref_top5_tokens`` texts, ``ref_margin``, ``kl``,
    ...) plus the ``_view`` added by ``run_detail_queries.run_detail`` (context text, id→text).
    The emitted token is highlighted after its context; the reference top-5 is a table with
    log-probabilities (nats), probabilities, and the provider's token marked.
    """
    top = _get(item, "ref_top5", "reference_top", "ref_top")
    tok_id = item.get("token_id")
    tok_text = _get(item, "token", "provider_token")
    if not isinstance(top, list) or (tok_id is None and tok_text is None):
        return None
    view = item.get("_view") or {}
    id_text: dict[int, str] = dict(view.get("id_text") or {})
    if tok_text is None:
        tok_text = view.get("token_text")
    if isinstance(tok_id, int) and tok_text is not None:
        id_text.setdefault(tok_id, str(tok_text))
    texts = item.get("ref_top5_tokens") if isinstance(item.get("ref_top5_tokens"), list) else None

    lines = []
    where = []
    probe = view.get("probe_key") or _get(item, "prompt_id", "probe_key")
    if probe is not None:
        where.append(f"probe {md_code(probe)}")
    if item.get("position") is not None:
        where.append(f"position {escape_md(item['position'])}")
    if where:
        lines.append("**" + ", ".join(where) + "**")
    context = str(_get(view, "context") or _get(item, "context") or "")
    tail = ("…" + context[-160:]) if len(context) > 160 else context
    shown = _token_label(tok_id if tok_text is None else tok_text, id_text)
    lines.append(f"{escape_md(tail)} :red-background[**{shown}**]  ← token the provider emitted")
    extra = []
    margin = _get(item, "ref_margin", "margin")
    if margin is not None:
        extra.append(f"reference margin (top-1 − top-2): **{fmt_num(margin)} nats**")
    if item.get("ref_token_logprob") is not None:
        extra.append(f"reference logprob of the provider's token: {fmt_num(item['ref_token_logprob'])} nats")
    if item.get("kl") is not None:
        extra.append(f"KL at this position: {fmt_num(item['kl'])} nats")
    if item.get("clear") is True:
        extra.append("**clear mismatch**")
    if extra:
        lines.append("; ".join(extra))

    # issue 38 item 5: the provider's own reported probabilities beside the reference's at this position
    prov: dict[Any, Any] = {}
    for entry in item.get("provider_top5") or [] if isinstance(item.get("provider_top5"), list) else []:
        t, lp = _entry(entry)
        if t is not None:
            prov.setdefault(t, lp)
    own = item.get("provider_token_logprob")
    if own is not None and tok_id is not None:
        prov.setdefault(tok_id, own)
    rows = []
    found = False
    seen: set[Any] = set()
    for rank, entry in enumerate(top[:5], start=1):
        t, lp = _entry(entry)
        seen.add(t)
        text = texts[rank - 1] if texts and rank - 1 < len(texts) and isinstance(texts[rank - 1], str) else None
        is_provider = (tok_id is not None and t == tok_id) or (tok_id is None and t == tok_text)
        found = found or is_provider
        note = "← provider's token" if is_provider else ("reference top-1" if rank == 1 else "")
        rows.append([str(rank), _token_label(t, id_text, text), fmt_num(lp), _prob(lp),
                     fmt_num(prov.get(t)) if t in prov else "not listed", _prob(prov.get(t)), note])
    for t, lp in prov.items():  # listed by the provider, outside the reference top-5
        if t not in seen:
            is_provider = tok_id is not None and t == tok_id
            rows.append(["—", _token_label(t, id_text), "below top-5", "—", fmt_num(lp), _prob(lp),
                         "← provider's token" if is_provider else "provider's list only"])
    table = md_table(["Rank", "Token", "Reference logprob (nats)", "Reference prob", "Provider logprob (nats)",
                      "Provider prob", ""], rows, align=["r", "l", "r", "r", "r", "r", "l"])
    if not found:
        lines.append("The provider's token is **not in the reference top-5**.")
    if not prov:
        lines.append("The provider reported no probabilities at this position.")
    return "\n\n".join(lines) + "\n\n" + table


def _prob(lp: Any) -> str:
    """``exp(lp)`` as a percentage, "—" when absent or not a number."""
    try:
        return fmt_pct(math.exp(float(lp))) if lp is not None else "—"
    except (TypeError, ValueError, OverflowError):
        return "—"


def generic_evidence_md(item: Any) -> str:
    """A key/value markdown table for an evidence item of any other shape (values escaped)."""
    if not isinstance(item, dict):
        return escape_md(json.dumps(item, default=str), max_len=500)
    rows = [[escape_md(k), escape_md(json.dumps(v, default=str), max_len=300)] for k, v in item.items() if k != "_view"]
    return md_table(["Field", "Value"], rows)


def _raw_probe(db_url: str, probe_id: int, probe_key: str, key: str) -> None:
    """Raw request/response of one probe inside an expander (one click away)."""
    with st.expander(f"Raw response of probe {escape_md(probe_key)}", expanded=False, key=f"exp_{key}"):
        detail = data.query(db_url, "probe_detail", probe_id)
        if detail is None:
            st.write("This probe is not stored in the run.")
            return
        _probe_body(detail)


def _probe_body(detail: dict[str, Any]) -> None:
    st.markdown(
        f"mode {escape_md(detail['mode'] or '—')} · status {escape_md(detail['status'])} · "
        f"finish {escape_md(detail['finish_reason'] or '—')} · anomalies "
        f"{escape_md(', '.join(map(str, detail['anomalies'])) or 'none')}"
    )
    st.markdown("**Request**")
    st.code(json.dumps(detail["request_json"], indent=2, default=str), language="json")
    for a in detail["attempts"]:
        st.markdown(
            f"**Attempt {a['attempt_no']}** — HTTP {escape_md(a['http_status'] if a['http_status'] is not None else '—')}, "
            f"latency {fmt_ms(a['latency_s'])}, TTFT {fmt_ms(a['ttft_s'])}"
            + (f", error: {escape_md(a['error'], max_len=300)}" if a["error"] else "")
        )
        raw = a["response_text"] or ""
        if len(raw) > MAX_RAW_CHARS:
            st.caption(f"Showing the first {MAX_RAW_CHARS:,} of {len(raw):,} characters.")
            raw = raw[:MAX_RAW_CHARS]
        st.code(raw or "(empty body)", language="json" if raw.lstrip().startswith("{") else None)
    if detail["tokens"]:
        st.markdown("**Normalized tokens**")
        st.markdown(
            md_table(
                ["Pos", "Token", "logprob", "Ref id", "Anomalies"],
                [
                    [
                        str(t["position"]),
                        escape_md(visible_token(t["token"])),
                        fmt_num(t["logprob"]),
                        escape_md(t["ref_token_id"] if t["ref_token_id"] is not None else "unaligned"),
                        escape_md(", ".join(map(str, t["anomalies"]))),
                    ]
                    for t in detail["tokens"][:300]
                ],
                align=["r", "l", "r", "r", "l"],
            )
        )


def chunk_histogram(hist: dict[int, int]) -> alt.Chart:
    """Bar chart of streamed chunks by number of tokens they carried."""
    df = pd.DataFrame({"tokens_in_chunk": [str(k) for k in hist], "chunks": list(hist.values())})
    return (
        alt.Chart(df)
        .mark_bar(color="#4c78a8")
        .encode(
            x=alt.X("tokens_in_chunk:O", title="Tokens per stream chunk", sort=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("chunks:Q", title="Chunks"),
            tooltip=["tokens_in_chunk:O", "chunks:Q"],
        )
        .properties(height=240)
    )


def questions_table(questions: list[dict[str, Any]]) -> str:
    """Markdown table of the buyer's two questions (``run_detail``'s ``questions``: question, answer
    badge, the answer in plain words, then the evidence in figures; every text escaped; issue 38, item 6:
    plain words before statistics); "" when there are none (no verdict yet). Answers stored before they
    carried ``plain`` show "—" there."""
    if not questions:
        return ""
    rows = [[escape_md(q.get("question")), answer_badge(q.get("answer")),
             escape_md(q.get("plain") or "—", max_len=300), escape_md(q.get("evidence"), max_len=600)]
            for q in questions]
    return md_table(["Question", "Answer", "In plain words", "Evidence in figures"], rows)


#: Badge colour of each rules-out status.
RULES_OUT_COLORS = {"ruled out": "green", "not ruled out": "orange", "not tested": "gray"}


def rules_out_table(records: Any) -> str:
    """Markdown table of what the audit rules out (``run_detail``'s ``rules_out``: per deviation class
    ``label``, ``question``, ``status``, ``power``, ``detector``, ``n``; every text escaped); "" when
    there is no such record (rejections, runs stored before it existed) or it is malformed."""
    if not isinstance(records, list):
        return ""
    rows = []
    for r in records:
        if not isinstance(r, dict):
            continue
        status = str(r.get("status") or "")
        det = f"{r.get('detector')} on {r.get('n')} positions" if r.get("detector") else "—"
        rows.append([escape_md(r.get("label") or r.get("key")), escape_md(r.get("question")),
                     f":{RULES_OUT_COLORS.get(status, 'gray')}-badge[{escape_md(status or '?')}]",
                     fmt_pct(r.get("power"), 0) if r.get("power") is not None else "—", escape_md(det)])
    if not rows:
        return ""
    return md_table(["Deviation", "Question", "At 95% power", "Power", "Deciding test"], rows)


def causes_md(d: dict[str, Any]) -> str:
    """Markdown list of every cause of a run: the primary verdict, then each secondary cause
    (``run_detail``'s ``secondary_causes``: verdict, rule, reason, deciding detectors with their
    Holm-adjusted p), plus the provider failures and the responses excluded from the detectors when
    recorded; "" for a run without a verdict. Every text is escaped."""
    if not d.get("verdict"):
        return ""
    rule = (d.get("verdict_details") or {}).get("rule")
    lines = [f"- {verdict_badge(d['verdict'])} **primary**" + (f" (rule {md_code(rule)})" if rule else "")]
    for c in d.get("secondary_causes") or []:
        ev = ", ".join(f"{escape_md(e.get('detector'))} p (Holm) {fmt_p(e.get('p_adjusted'))}"
                       for e in c.get("evidence") or [] if isinstance(e, dict))
        lines.append(f"- {verdict_badge(c.get('verdict'))} **also**"
                     + (f" (rule {md_code(c['rule'])})" if c.get("rule") else "")
                     + f": {escape_md(c.get('reason') or '', max_len=600)}" + (f" — deciding evidence: {ev}" if ev else ""))
    if not d.get("secondary_causes"):
        lines.append("- No other cause is established at the run's family-wise alpha.")
    for fd in (d.get("verdict_details") or {}).get("findings") or []:  # issue 37 item 6: one account
        if isinstance(fd, dict) and fd.get("explained_by"):
            lines.append(f"- Not a separate cause: {escape_md(fd.get('detector'))} rejects, explained by "
                         f"{verdict_badge(fd.get('explained_by'))}: {escape_md(fd.get('implication') or '', max_len=600)}")
    f = d.get("provider_failures") or {}
    if f.get("failed"):
        kinds = ", ".join(f"{escape_md(k)} {escape_md(v)}" for k, v in (f.get("kinds") or {}).items())
        lines.append(f"- Provider failures: {escape_md(f.get('failed'))} of {escape_md(f.get('total'))} probes"
                     f" ({fmt_pct(f.get('share'))})" + (f": {kinds}" if kinds else ""))
    x = d.get("excluded_responses") or {}
    if x.get("responses"):
        why = ", ".join(f"{escape_md(k)} {escape_md(v)}" for k, v in (x.get("reasons") or {}).items())
        n = x["responses"]
        lines.append(f"- Excluded from every detector: {escape_md(n)} response{'' if n == 1 else 's'} "
                     f"({fmt_tokens(x.get('tokens'))} tokens)" + (f": {why}" if why else ""))
    return "\n".join(lines)


#: Badge of each pre-flight outcome (``passed``: True / False / None = could not be run).
CHECK_BADGES = {True: ":green-badge[pass]", False: ":red-badge[FAIL]", None: ":gray-badge[not run]"}


def preflight_md(checks: list[dict[str, Any]]) -> str:
    """Markdown for the run's parameter-compliance pre-flight (``run_detail``'s ``preflight_checks``,
    ``auditor.check.preflight``): one line naming the failed checks, then a table of every check (name,
    kind, outcome, p, what was seen); "" when the run has none (older runs, reference-free re-analyses)."""
    if not checks:
        return ""
    failed = [c for c in checks if c.get("passed") is False]
    head = (f"{sum(1 for c in checks if c.get('passed') is True)} of {len(checks)} checks passed"
            + (f"; **failed: {', '.join(escape_md(c.get('name')) for c in failed)}**" if failed else "; none failed"))
    rows = [[(f"**{escape_md(c.get('name'))}**" if c.get("passed") is False else escape_md(c.get("name"))),
             escape_md(c.get("kind") or "—"), CHECK_BADGES.get(c.get("passed"), CHECK_BADGES[None]),
             fmt_p(c.get("p_value")), escape_md(c.get("summary") or "", max_len=400)] for c in checks]
    return head + "\n\n" + md_table(["Check", "Kind", "Outcome", "p", "What was seen"], rows,
                                     align=["l", "l", "c", "r", "l"])


def status_md(d: dict[str, Any]) -> str:
    """The status line of a run without a verdict ("" for a completed run): ``Run status: **failed** — no
    verdict: <the stored failure reason>`` (escaped), or ``— no verdict.`` when none is stored."""
    if d.get("status") == "completed" or d.get("verdict_reason"):
        return ""
    line = f"Run status: **{escape_md(d.get('status') or '?')}** — no verdict"
    reason = d.get("failure_reason")
    return line + (f": {escape_md(reason, max_len=2000)}" if reason else ".")


def render(db_url: str, filters: Filters) -> None:
    """Draw the Run detail page."""
    st.header("Run detail")
    runs = data.query(db_url, "list_runs", limit=500)
    if not runs:
        st.info("No runs yet.")
        return
    labels = {
        r["run_id"]: f"{fmt_dt(r['started_at'])} · {r['provider_name']} · {r['verdict'] or r['status']} · {r['run_id']}"
        for r in runs
    }
    init_from_query("run", list(labels))
    run_id = st.selectbox("Run", list(labels), format_func=lambda k: labels[k], key="run")
    sync_query("run", run_id)
    d = data.query(db_url, "run_detail", run_id)
    if d is None:
        st.warning("This run no longer exists.")
        return

    st.markdown(f"### {verdict_badge(d['verdict'])} {escape_md(d['provider_name'])} · {escape_md(d['model'] or '—')}")
    questions = questions_table(d.get("questions") or [])
    if questions:
        st.markdown(questions)
    if d.get("headline"):
        st.markdown("**In plain words:** " + escape_md(d["headline"], max_len=600))
    if d.get("not_stored"):  # a verdict stored before its answers were (revision 0005): never computed here
        st.warning("The buyer's two answers and the headline: " + escape_md(d["not_stored"]))
    if d["verdict_reason"]:
        st.markdown(escape_md(d["verdict_reason"], max_len=2000))
    elif status := status_md(d):
        st.markdown(status)
    rules = rules_out_table(d.get("rules_out"))
    if rules:
        st.markdown("**What this audit rules out** (95% power against the effect sizes measured in calibration)")
        st.markdown(rules)
    facts = [
        ["Run", md_code(d["run_id"], in_table=True)],
        ["Status", escape_md(d["status"])],
        ["Started / finished", f"{fmt_dt(d['started_at'])} / {fmt_dt(d['finished_at'])}"],
        ["Suite", escape_md(f"{d['suite'] or '—'} v{d['suite_version'] or '?'}")],
        ["Reference", escape_md(f"{d['reference_model'] or '—'} @ {d['reference_revision'] or '?'} ({d['reference_dtype'] or '?'})")],
        ["Tokens (prompt + completion)", f"{fmt_tokens(d['prompt_tokens'])} + {fmt_tokens(d['completion_tokens'])}"],
        ["Budget", fmt_tokens(d["budget_tokens"]) + " tokens" if d["budget_tokens"] else "—"],
        ["Cost", escape_md(fmt_usd(d["cost_usd"]))],
        ["alpha", fmt_num(d["alpha"])],
        ["Throughput / TTFT p50 / TPOT p50", f"{fmt_num(d['tokens_per_s'], 4)} tokens/s / {fmt_ms(d['ttft_median_s'])} / {fmt_ms(d['tpot_median_s'])}"],
        ["KL × honest floor", f"{kl_floor_text(d['kl_floor_ratio'])}×" if d.get("kl_floor_ratio") is not None else "—"],
        ["Mean KL / noise floor (arithmetic means)", f"{fmt_num(d['mean_kl'])} / {fmt_num(d['noise_floor'])} nats"],
        ["Greedy clear-mismatch rate", fmt_pct(d["clear_mismatch_rate"])],
    ]  # fmt: skip
    causes = causes_md(d)
    if causes:
        st.subheader("Every cause found")
        st.markdown(causes)
    pre = preflight_md(d.get("preflight_checks") or [])
    if pre:
        st.subheader("Parameter-compliance pre-flight")
        st.markdown(pre)
    left, right = st.columns([2, 3])
    left.subheader("Run")
    left.markdown(md_table(["", "Value"], facts))
    _detectors_table(right, d)
    _evidence(db_url, d)
    _fingerprint(d)
    _probes(db_url, d)


def _detectors_table(where: Any, d: dict[str, Any]) -> None:
    where.subheader("Detectors")
    if not d["detectors"]:
        where.info("No detector results stored for this run.")
    else:
        rows = []
        for det in d["detectors"]:
            ci = (
                f" [{fmt_num(det['effect_ci_low'])}, {fmt_num(det['effect_ci_high'])}]"
                if det["effect_ci_low"] is not None and det["effect_ci_high"] is not None
                else ""
            )
            rows.append(
                [
                    f"**{escape_md(det['name'])}**" + (" ★" if det["name"] == d["strongest"] else ""),
                    "yes" if det["ran"] else "no",
                    fmt_num(det["statistic"], 4),
                    fmt_p(det["p_value"]),
                    fmt_p(det["p_adjusted"]),
                    fmt_num(det["effect"]) + ci,
                    fmt_tokens(det["n"]),
                    escape_md(det["reason"] or "", max_len=200),
                ]
            )
        where.markdown(
            md_table(
                ["Detector", "Ran", "Statistic", "p", "p (Holm)", "Effect [95% CI]", "n", "Note"],
                rows,
                align=["l", "c", "r", "r", "r", "r", "r", "l"],
            )
        )
        where.caption(
            "★ strongest evidence (smallest adjusted p among detectors with evidence). Effect units per detector."
        )


def _evidence(db_url: str, d: dict[str, Any]) -> None:
    st.subheader("Strongest evidence")
    strongest = next((det for det in d["detectors"] if det["name"] == d["strongest"]), None)
    if strongest is None:
        st.markdown("No detector recorded token-level evidence for this run.")
    else:
        st.markdown(
            f"From **{escape_md(strongest['name'])}** (p Holm-adjusted "
            f"{fmt_p(strongest['p_adjusted'] if strongest['p_adjusted'] is not None else strongest['p_value'])}), "
            f"{len(strongest['evidence'])} item(s):"
        )
        for i, item in enumerate(strongest["evidence"][:MAX_EVIDENCE]):
            with st.container(border=True):
                md = token_evidence_md(item) if isinstance(item, dict) else None
                st.markdown(md if md is not None else generic_evidence_md(item))
                view = item.get("_view") if isinstance(item, dict) else None
                if view and view.get("probe_id") is not None:
                    _raw_probe(db_url, view["probe_id"], str(view["probe_key"]), f"ev{i}")


def _fingerprint(d: dict[str, Any]) -> None:
    st.subheader("Speculation fingerprint")
    hist = d["tokens_per_chunk"]
    if not hist:
        st.markdown("No stream timing was recorded for this run (non-streamed probes), so there is no chunk histogram.")
    else:
        total = sum(hist.values())
        mean = sum(k * v for k, v in hist.items()) / total
        multi = sum(v for k, v in hist.items() if k > 1) / total
        st.markdown(
            f"{fmt_tokens(total)} stream chunks; mean **{mean:.2f} tokens per chunk**; "
            f"{fmt_pct(multi)} of chunks carry more than one token. Plain decoding sends one token "
            "per chunk; speculative decoding sends each round's accepted drafts at once."
        )
        st.altair_chart(chunk_histogram(hist), width="stretch")


def _probes(db_url: str, d: dict[str, Any]) -> None:
    st.subheader("Probes")
    probes = d["probes"]
    if not probes:
        st.markdown("No probes stored.")
        return
    st.markdown(
        f"{len(probes)} probes: "
        + ", ".join(
            f"{n} {escape_md(s)}"
            for s, n in sorted({p["status"]: sum(q["status"] == p["status"] for q in probes) for p in probes}.items())
        )
    )
    plabels = {
        p["id"]: f"{p['probe_key']} · {p['mode'] or '—'} · {p['status']}"
        + (f" · {', '.join(map(str, p['anomalies']))}" if p["anomalies"] else "")
        for p in probes
    }
    pid = st.selectbox("Probe", list(plabels), format_func=lambda k: plabels[k], key="probe_select")
    with st.expander("Raw request and response", expanded=False, key="exp_probe"):
        detail = data.query(db_url, "probe_detail", pid)
        if detail is not None:
            _probe_body(detail)
