"""Read-only queries behind the dashboard's run-detail page: one run with its detector results and
their evidence, its probes, each probe's attempts and normalized tokens, and its streamed-chunk histogram.

Same conventions as :mod:`auditor.store.dashboard_queries` (whose run rows these build on): every function
takes an open SQLAlchemy :class:`~sqlalchemy.orm.Session`, never writes, and returns plain Python data
(picklable for ``st.cache_data``); durations in seconds, KL divergences in nats; a figure a run did not
measure is ``None``. The buyer's two answers and the headline are read as stored with the verdict
(revision 0005), never computed here: this module imports no rule module (docs/ARCHITECTURE.md, L8).

Evidence items (``detector_results.evidence``, a JSON list of dicts written by
``auditor.detectors``: ``prompt_id``, ``position``, ``token_id``, ``token``, ``ref_top5`` as
``[[reference token id, logprob], ...]``, ``ref_margin`` (nats, reference top-1 minus top-2),
``provider_top5``, ``kl``, ...) are returned by :func:`run_detail` with an added ``_view`` dict
resolving what the dashboard shows: the probe (``probe_id``, ``probe_key``), the text before
the position (``context``), the emitted token's text (``token_text``) and ``id_text`` — reference
token id → text, learned from the stored normalized tokens (``normalized_tokens.ref_token_id``)
of runs with the same reference model. Ids never emitted by any provider stay unresolved (the
dashboard then shows the id) unless the evidence carries ``ref_top5_tokens`` itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from auditor.store.dashboard_queries import NOT_STORED, detectors_by_run, figures_stored, run_row
from auditor.store.models import AuditRun, NormalizedToken, Probe, ProbeAttempt, VerdictRow
from auditor.util import finite as _num

__all__ = [
    "CONTEXT_TOKENS",
    "MAX_RESOLVED_EVIDENCE",
    "probe_detail",
    "run_detail",
    "tokens_per_chunk_histogram",
]


def tokens_per_chunk_histogram(session: Session, run_id: str) -> dict[int, int]:
    """Histogram of tokens per streamed chunk over a run's attempts (speculation fingerprint).

    A server that emits whole accepted drafts per SSE chunk shows mass at 2..k+1; plain
    decoding shows (almost) only 1. Read from ``probe_attempts.tokens_per_chunk``; falls back to
    ``audit_runs.summary["tokens_per_chunk"]`` (a ``{"k": count}`` histogram or a list of
    per-chunk counts). Returns ``{tokens_in_chunk: number_of_chunks}``, empty when the run has no
    stream timing.
    """
    counts: Counter[int] = Counter()
    for lst in session.scalars(
        select(ProbeAttempt.tokens_per_chunk).where(
            ProbeAttempt.run_id == run_id, ProbeAttempt.tokens_per_chunk.is_not(None)
        )
    ):
        for v in lst or []:
            n = _num(v)
            if n is not None and n >= 0:
                counts[int(n)] += 1
    if not counts:
        summary = session.scalar(select(AuditRun.summary).where(AuditRun.id == run_id)) or {}
        hist = summary.get("tokens_per_chunk") if isinstance(summary, dict) else None
        if isinstance(hist, dict):
            for k, v in hist.items():
                kk, vv = _num(k), _num(v)
                if kk is not None and vv is not None and vv > 0:
                    counts[int(kk)] += int(vv)
        elif isinstance(hist, list):
            for v in hist:
                n = _num(v)
                if n is not None and n >= 0:
                    counts[int(n)] += 1
    return dict(sorted(counts.items()))


def run_detail(session: Session, run_id: str) -> dict[str, Any] | None:
    """Everything the run-detail page shows, or None when ``run_id`` is unknown.

    Returns the run row (:func:`auditor.store.dashboard_queries.run_row`) plus ``config_snapshot``, ``reference_model``,
    ``reference_revision``, ``reference_dtype``, ``code_version``, ``summary`` (raw JSON),
    ``failure_reason`` (why a ``failed`` run failed, None otherwise or for runs stored before reasons were kept),
    ``detectors`` (every stored detector result with ``statistic``, ``p_value``, ``p_adjusted``,
    ``effect`` and CI, ``n``, ``ran``, ``reason`` and ``evidence``), ``verdict_details`` (the
    ``verdicts.details`` JSON), ``questions`` (the buyer's two questions as the report answers them, stored
    with the verdict: ``{"key", "question", "answer", "evidence"}``; [] without a verdict), ``headline``
    (the report's plain sentence with its deciding figure, stored with the verdict; None without a verdict),
    ``not_stored`` (:data:`NOT_STORED` when the verdict row predates the stored questions and headline,
    else None),
    ``rules_out`` (the verdict's ``details["rules_out"]``, ``auditor.verdict.rules_out``: per deviation class
    ``label``, ``question``, ``status``, ``power``, ``detector``, ``n``; [] for rejections and older runs),
    ``strongest`` (name of the detector with the smallest adjusted p-value among those that ran and
    have evidence, else None), ``probes`` (``id``,
    ``probe_key``, ``mode``, ``workload``, ``status``, ``n_attempts``, ``anomalies``),
    ``tokens_per_chunk`` (see :func:`tokens_per_chunk_histogram`), and every cause and check the
    reports show (issue 13; each [] or None for runs stored before them): ``secondary_causes``
    (the verdict's other established causes: ``verdict``, ``rule``, ``reason``, ``evidence``),
    ``preflight_checks`` (every parameter-compliance check stored with the run, ``auditor.check.preflight``:
    ``name``, ``kind``, ``passed``, ``summary``, ``p_value``, ...; the raw exchanges stay out),
    ``provider_failures`` (``failed``, ``total``, ``share``, ``kinds``) and ``excluded_responses``
    (responses kept from every detector, ``auditor.check.observations.excluded_summary``).
    """
    run = session.get(AuditRun, run_id)
    if run is None:
        return None
    row = run_row(run)
    row.update(
        {
            "config_snapshot": run.config_snapshot or {},
            "reference_model": run.reference_model,
            "reference_revision": run.reference_revision,
            "reference_dtype": run.reference_dtype,
            "code_version": run.code_version,
            "summary": run.summary or {},
            "failure_reason": run.failure_reason,
        }
    )
    detectors = detectors_by_run(session, [run_id])[run_id]
    row["detectors"] = detectors
    figures = figures_stored(session)
    unstored = () if figures else (defer(VerdictRow.questions, raiseload=True), defer(VerdictRow.headline, raiseload=True),
                                   defer(VerdictRow.standing, raiseload=True))
    vrow = session.scalar(select(VerdictRow).where(VerdictRow.run_id == run_id).options(*unstored))
    row["verdict_details"] = (vrow.details or {}) if vrow else {}
    stored = figures and vrow is not None and vrow.questions is not None and vrow.headline is not None
    row["questions"] = [dict(q) for q in vrow.questions or [] if isinstance(q, dict)] if vrow and stored else []
    row["headline"] = vrow.headline if vrow and stored else None
    row["not_stored"] = NOT_STORED if vrow is not None and not stored else None
    ro = row["verdict_details"].get("rules_out") if isinstance(row["verdict_details"], dict) else None
    row["rules_out"] = [x for x in ro if isinstance(x, dict)] if isinstance(ro, list) else []
    if vrow and not row["verdict_reason"]:
        row["verdict_reason"] = vrow.reason
    summary = run.summary if isinstance(run.summary, dict) else {}
    pre = summary.get("preflight")
    checks = pre.get("checks") if isinstance(pre, dict) else None
    vd = row["verdict_details"] if isinstance(row["verdict_details"], dict) else {}
    row["preflight_checks"] = [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []
    row["secondary_causes"] = [c for c in vd.get("secondary_causes") or [] if isinstance(c, dict)]
    row["provider_failures"] = vd.get("provider_failures") if isinstance(vd.get("provider_failures"), dict) else None
    row["excluded_responses"] = summary.get("excluded_responses") or None

    def p_key(d: dict[str, Any]) -> float:
        p = d["p_adjusted"] if d["p_adjusted"] is not None else d["p_value"]
        return p if p is not None else 2.0

    _resolve_evidence(session, run, detectors)
    candidates = [d for d in detectors if d["ran"] and d["evidence"]]
    row["strongest"] = min(candidates, key=p_key)["name"] if candidates else None
    row["probes"] = [
        {
            "id": p.id,
            "probe_key": p.probe_key,
            "mode": p.mode,
            "workload": p.workload,
            "status": p.status,
            "n_attempts": p.n_attempts,
            "anomalies": list(p.anomalies or []),
        }
        for p in session.scalars(select(Probe).where(Probe.run_id == run_id).order_by(Probe.id))
    ]
    row["tokens_per_chunk"] = tokens_per_chunk_histogram(session, run_id)
    return row


#: Evidence items per detector that get a ``_view`` (the dashboard shows the first few).
MAX_RESOLVED_EVIDENCE = 10
#: Tokens of context shown before an evidence position.
CONTEXT_TOKENS = 24


def _find_probe(probes: dict[str, int], prompt_id: Any) -> tuple[int | None, str | None]:
    if prompt_id is None:
        return None, None
    key = str(prompt_id)
    if key in probes:
        return probes[key], key
    for k, pid in probes.items():
        if k.startswith(key + "#"):
            return pid, k
    return None, None


def _ids_of(entries: Any) -> list[int]:
    out = []
    for e in entries or []:
        if isinstance(e, list | tuple) and e and isinstance(e[0], int) and not isinstance(e[0], bool):
            out.append(e[0])
    return out


def _resolve_evidence(session: Session, run: AuditRun, detectors: list[dict[str, Any]]) -> None:
    """Add ``_view`` (probe, context text, token text, id→text map) to the first evidence items."""
    items = [ev for d in detectors for ev in d["evidence"][:MAX_RESOLVED_EVIDENCE] if isinstance(ev, dict)]
    if not items:
        return
    probes = {k: i for i, k in session.execute(select(Probe.id, Probe.probe_key).where(Probe.run_id == run.id))}
    ids: set[int] = set()
    for ev in items:
        ids.update(_ids_of(ev.get("ref_top5")))
        ids.update(_ids_of(ev.get("provider_top5")))
        if isinstance(ev.get("token_id"), int):
            ids.add(ev["token_id"])
    id_text: dict[int, str] = {}
    if ids:
        stmt = (
            select(NormalizedToken.ref_token_id, NormalizedToken.token)
            .join(Probe, Probe.id == NormalizedToken.probe_id)
            .join(AuditRun, AuditRun.id == Probe.run_id)
            .where(NormalizedToken.ref_token_id.in_(sorted(ids)))
        )
        if run.reference_model is not None:
            stmt = stmt.where(AuditRun.reference_model == run.reference_model)
        for tid, text in session.execute(stmt):
            if tid is not None:  # always: `IN (...)` matches no NULL
                id_text.setdefault(int(tid), text)
    for ev in items:
        probe_id, probe_key = _find_probe(probes, ev.get("prompt_id", ev.get("probe_key")))
        view: dict[str, Any] = {"probe_id": probe_id, "probe_key": probe_key, "context": None, "token_text": None}
        pos = ev.get("position")
        if probe_id is not None and isinstance(pos, int) and not isinstance(pos, bool):
            toks = dict(
                session.execute(
                    select(NormalizedToken.position, NormalizedToken.token).where(
                        NormalizedToken.probe_id == probe_id,
                        NormalizedToken.position >= pos - CONTEXT_TOKENS,
                        NormalizedToken.position <= pos,
                    )
                ).all()
            )
            view["context"] = "".join(toks[p] for p in sorted(toks) if p < pos)
            view["token_text"] = toks.get(pos)
        view["id_text"] = {
            i: id_text[i]
            for i in _ids_of(ev.get("ref_top5")) + _ids_of(ev.get("provider_top5")) + [ev.get("token_id")]
            if isinstance(i, int) and i in id_text
        }
        ev["_view"] = view


def probe_detail(
    session: Session,
    probe_id: int | None = None,
    *,
    run_id: str | None = None,
    probe_key: str | None = None,
    max_tokens: int = 2000,
) -> dict[str, Any] | None:
    """One probe with its raw request, every attempt's raw response and normalized tokens.

    Address it by ``probe_id`` or by ``(run_id, probe_key)``. Returns None when not found, else
    ``{"id", "run_id", "probe_key", "mode", "workload", "status", "text", "finish_reason",
    "anomalies", "usage", "request_json", "attempts": [{"attempt_no", "http_status", "error",
    "latency_s", "ttft_s", "response_text", "tokens_per_chunk"}], "tokens": [{"position",
    "token", "logprob", "top_logprobs", "ref_token_id", "anomalies"}]}`` (at most
    ``max_tokens`` tokens).
    """
    if probe_id is not None:
        probe = session.get(Probe, probe_id)
    elif run_id is not None and probe_key is not None:
        probe = session.scalar(select(Probe).where(Probe.run_id == run_id, Probe.probe_key == probe_key))
    else:
        raise ValueError("probe_detail needs probe_id, or run_id and probe_key")
    if probe is None:
        return None
    attempts = session.scalars(
        select(ProbeAttempt).where(ProbeAttempt.probe_id == probe.id).order_by(ProbeAttempt.attempt_no)
    )
    tokens = session.scalars(
        select(NormalizedToken)
        .where(NormalizedToken.probe_id == probe.id)
        .order_by(NormalizedToken.position)
        .limit(max_tokens)
    )
    return {
        "id": probe.id,
        "run_id": probe.run_id,
        "probe_key": probe.probe_key,
        "mode": probe.mode,
        "workload": probe.workload,
        "status": probe.status,
        "text": probe.text,
        "finish_reason": probe.finish_reason,
        "anomalies": list(probe.anomalies or []),
        "usage": probe.usage,
        "request_json": probe.request_json or {},
        "attempts": [
            {
                "attempt_no": a.attempt_no,
                "http_status": a.http_status,
                "error": a.error,
                "latency_s": _num(a.latency_s),
                "ttft_s": _num(a.ttft_s),
                "response_text": a.response_text,
                "tokens_per_chunk": list(a.tokens_per_chunk or []),
            }
            for a in attempts
        ],
        "tokens": [
            {
                "position": t.position,
                "token": t.token,
                "logprob": _num(t.logprob),
                "top_logprobs": list(t.top_logprobs or []),
                "ref_token_id": t.ref_token_id,
                "anomalies": list(t.anomalies or []),
            }
            for t in tokens
        ],
    }
