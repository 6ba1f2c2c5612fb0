"""Read-only query functions behind the dashboard, the Atom feed and verdict-change alerts.

Every function takes an open SQLAlchemy :class:`~sqlalchemy.orm.Session` (see
:func:`auditor.store.db.open_store`), never writes, and returns plain Python data (lists of
dicts of ``str``/``int``/``float``/``bool``/``None``/timezone-aware ``datetime``) so the
Streamlit app can cache results with ``st.cache_data`` (values must be picklable) and tests can
compare them directly.

Units follow the store: durations in seconds (``*_s``), money in USD, token counts in tokens,
KL divergences in nats. Figures that a run did not measure are ``None`` — never ``0`` — so a
missing measurement is never mistaken for a perfect one.

Run statistics come from ``audit_runs.summary`` (JSON written by the ``check`` pipeline). Keys
read here (all optional): ``tokens_per_s`` (tokens/s, completion tokens over wall time),
``ttft_median_s``, ``tpot_median_s`` (s), ``mean_kl`` (nats, mean per-token KL(reference ‖
provider) over logprob probes), ``noise_floor`` (nats, the same statistic between two honest
reference runs), ``clear_mismatch_rate`` (fraction of greedy positions where the provider token
differs from the reference top-1 while the reference margin exceeds the clear-mismatch
threshold) and ``tokens_per_chunk`` (histogram ``{"k": count}`` or list of per-chunk counts).

Evidence items (``detector_results.evidence``, a JSON list of dicts written by
``auditor.detectors``: ``prompt_id``, ``position``, ``token_id``, ``token``, ``ref_top5`` as
``[[reference token id, logprob], ...]``, ``ref_margin`` (nats, reference top-1 minus top-2),
``provider_top5``, ``kl``, ...) are returned by :func:`run_detail` with an added ``_view`` dict
resolving what the dashboard shows: the probe (``probe_id``, ``probe_key``), the text before
the position (``context``), the emitted token's text (``token_text``) and ``id_text`` — reference
token id → text, learned from the stored normalized tokens (``normalized_tokens.ref_token_id``)
of runs with the same reference model. Ids never emitted by any provider stay unresolved (the
dashboard then shows the id) unless the evidence carries ``ref_top5_tokens`` itself.

The buyer's two answers, the plain headline and the provider's standing are read as stored with each verdict
(``verdicts.questions`` / ``headline`` / ``standing``, written by ``auditor.check.stored_figures`` when the verdict is
stored, revision 0005): this module applies no verdict, question or standing rule, so importing the dashboard
loads none of them (docs/ARCHITECTURE.md, L8). A verdict row without them (written before revision 0005 and
not migrated) is shown as :data:`NOT_STORED`, never computed here.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session, defer

from auditor.store.models import (
    Alert,
    AuditRun,
    CalibrationResult,
    DetectorResultRow,
    NormalizedToken,
    Probe,
    ProbeAttempt,
    Schedule,
    VerdictRow,
)
from auditor.util import committed_calibration_path
from auditor.util import finite as _num

__all__ = [
    "NOT_STORED",
    "SUMMARY_KEYS",
    "calibration_table",
    "count_runs",
    "filter_options",
    "has_schema",
    "list_runs",
    "list_schedules",
    "probe_detail",
    "provider_history",
    "provider_overview",
    "recent_alerts",
    "run_detail",
    "speed_fidelity_points",
    "tokens_per_chunk_histogram",
    "verdict_changes",
]


#: Summary keys copied into overview/history/scatter rows (None when absent or not a number).
SUMMARY_KEYS = (
    "tokens_per_s",
    "ttft_median_s",
    "tpot_median_s",
    "mean_kl",
    "noise_floor",
    "kl_floor_ratio",
    "clear_mismatch_rate",
)

#: What the dashboard shows for a figure a verdict row predates (revision 0005 stores them; upgrading backfills).
NOT_STORED = "not stored — run `auditor db upgrade`"

#: Tables the dashboard needs before it can show anything.
_REQUIRED_TABLES = ("audit_runs", "detector_results", "verdicts", "probes")


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _as_utc_start(value: dt.date | dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.combine(value, dt.time.min, tzinfo=dt.UTC)


def _as_utc_end(value: dt.date | dt.datetime | None) -> dt.datetime | None:
    """Exclusive upper bound: a date means "through the end of that day"."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.combine(value + dt.timedelta(days=1), dt.time.min, tzinfo=dt.UTC)


def _run_filters(
    stmt: Any,
    *,
    providers: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    suites: Sequence[str] | None = None,
    since: dt.date | dt.datetime | None = None,
    until: dt.date | dt.datetime | None = None,
) -> Any:
    stmt = stmt.where(AuditRun.kind != "calibration")
    if providers:
        stmt = stmt.where(AuditRun.provider_name.in_(list(providers)))
    if models:
        stmt = stmt.where(AuditRun.model.in_(list(models)))
    if suites:
        stmt = stmt.where(AuditRun.suite.in_(list(suites)))
    lo, hi = _as_utc_start(since), _as_utc_end(until)
    if lo is not None:
        stmt = stmt.where(AuditRun.started_at >= lo)
    if hi is not None:
        stmt = stmt.where(AuditRun.started_at < hi)
    return stmt


def _summary_figures(summary: Any) -> dict[str, float | None]:
    s = summary if isinstance(summary, dict) else {}
    return {k: _num(s.get(k)) for k in SUMMARY_KEYS}


def _run_row(run: AuditRun) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": run.id,
        "provider_name": run.provider_name,
        "model": run.model,
        "kind": run.kind,
        "suite": run.suite,
        "suite_version": run.suite_version,
        "status": run.status,
        "verdict": run.verdict,
        "verdict_reason": run.verdict_reason,
        "alpha": run.alpha,
        "budget_tokens": run.budget_tokens,
        "prompt_tokens": run.prompt_tokens or 0,
        "completion_tokens": run.completion_tokens or 0,
        "tokens": (run.prompt_tokens or 0) + (run.completion_tokens or 0),
        "cost_usd": float(run.cost_usd or 0.0),
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }
    row.update(_summary_figures(run.summary))
    return row


def _detector_row(d: DetectorResultRow) -> dict[str, Any]:
    return {
        "name": d.name,
        "statistic": _num(d.statistic),
        "p_value": _num(d.p_value),
        "p_adjusted": _num(d.p_adjusted),
        "effect": _num(d.effect),
        "effect_ci_low": _num(d.effect_ci_low),
        "effect_ci_high": _num(d.effect_ci_high),
        "n": d.n,
        "ran": bool(d.ran),
        "reason": d.reason,
        "evidence": list(d.evidence or []),
    }


def _detectors_by_run(session: Session, run_ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    ids = list(run_ids)
    out: dict[str, list[dict[str, Any]]] = {rid: [] for rid in ids}
    if not ids:
        return out
    rows = session.scalars(
        select(DetectorResultRow)
        .where(DetectorResultRow.run_id.in_(ids))
        .order_by(DetectorResultRow.run_id, DetectorResultRow.id)
    )
    for d in rows:
        out[d.run_id].append(_detector_row(d))
    return out


# ---------------------------------------------------------------------------------------------
# public queries
# ---------------------------------------------------------------------------------------------


def _figures_stored(session: Session) -> bool:
    """Whether ``verdicts`` has the figure columns (revision 0005): False on a database the code was upgraded
    past but ``auditor db upgrade`` was not run on (the dashboard never migrates); then every figure is
    :data:`NOT_STORED` and no query selects the missing columns."""
    cols = {c["name"] for c in inspect(session.get_bind()).get_columns("verdicts")}
    return {"questions", "headline", "standing"} <= cols


def has_schema(session: Session) -> bool:
    """True when the audit tables exist (False for a fresh, never-migrated database)."""
    insp = inspect(session.get_bind())
    return all(insp.has_table(t) for t in _REQUIRED_TABLES)


def count_runs(session: Session) -> int:
    """Number of non-calibration runs (0 for an empty or unmigrated database)."""
    if not has_schema(session):
        return 0
    return int(session.scalar(select(func.count()).select_from(AuditRun).where(AuditRun.kind != "calibration")) or 0)


def filter_options(session: Session) -> dict[str, Any]:
    """Values for the dashboard filters.

    Returns:
        ``{"providers": [str], "models": [str], "suites": [str], "first": datetime | None,
        "last": datetime | None}`` over non-calibration runs (sorted, ``None`` values dropped).
    """
    base = select(AuditRun).where(AuditRun.kind != "calibration")

    def distinct(col: Any) -> list[str]:
        sub = base.with_only_columns(col).distinct()
        return sorted(v for v in session.scalars(sub) if v is not None)

    row = session.execute(
        select(func.min(AuditRun.started_at), func.max(AuditRun.started_at)).where(AuditRun.kind != "calibration")
    ).one()
    # min/max bypass the column type on some backends: normalise to aware UTC.
    first = _coerce_dt(row[0])
    last = _coerce_dt(row[1])
    return {
        "providers": distinct(AuditRun.provider_name),
        "models": distinct(AuditRun.model),
        "suites": distinct(AuditRun.suite),
        "first": first,
        "last": last,
    }


def _coerce_dt(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def provider_overview(
    session: Session,
    *,
    models: Sequence[str] | None = None,
    suites: Sequence[str] | None = None,
    since: dt.date | dt.datetime | None = None,
    until: dt.date | dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """One row per (provider, model) over the runs matching the filters.

    Each row: ``provider_name``, ``model``, ``n_runs``, ``tokens`` and ``cost_usd`` (sums over all
    matching runs: what watching this provider cost), ``last_status``/``last_started_at`` (the
    newest run of any status), and, from the newest run that has a verdict: ``run_id``,
    ``verdict``, ``verdict_reason``, ``started_at``, ``suite``, the :data:`SUMMARY_KEYS` figures
    and ``detectors`` (list of ``{"name", "p_value", "p_adjusted", "ran", ...}``). Providers
    without any verdict yet have ``verdict=None`` and the figures of their newest run.

    The combined standing over the provider's recent audits (every suite, ``auditor.watch.standing``) as stored
    with the newest completed audit among the matching runs (its standing as of that audit's start,
    ``verdicts.standing``): ``standing`` (verdict or None), ``standing_reason``, ``standing_suites``,
    ``causes`` (every cause found, worst first: ``verdict``, ``suite``, ``run_id``, ``started_at``, ``rule``,
    ``reason``, ``primary``, ``evidence``), ``not_tested`` and ``standing_detail`` (the whole stored
    ``Standing.to_dict()``, with the buyer's two answers in ``questions``). Without a completed audit:
    ``standing`` None, ``standing_detail`` {}. When that audit's standing was not stored (a row older than
    revision 0005, not migrated): ``standing`` None and ``standing_reason`` :data:`NOT_STORED`.

    Rows are sorted by provider name, then model.
    """
    runs = list(
        session.scalars(
            _run_filters(select(AuditRun), models=models, suites=suites, since=since, until=until).order_by(
                AuditRun.started_at, AuditRun.id
            )
        )
    )
    groups: dict[tuple[str, str | None], list[AuditRun]] = {}
    for r in runs:
        groups.setdefault((r.provider_name, r.model), []).append(r)

    rows: list[dict[str, Any]] = []
    chosen: dict[tuple[str, str | None], AuditRun] = {}
    for key, rs in groups.items():
        with_verdict = [r for r in rs if r.verdict]
        chosen[key] = with_verdict[-1] if with_verdict else rs[-1]
    detectors = _detectors_by_run(session, (r.id for r in chosen.values()))
    audits = {key: [r for r in rs if r.kind == "audit" and r.status == "completed" and r.verdict]
              for key, rs in groups.items()}
    standings = _stored_standings(session, [a[-1].id for a in audits.values() if a])
    for key, rs in groups.items():
        latest = chosen[key]
        row = _run_row(latest)
        newest = rs[-1]
        row.update(
            {
                "n_runs": len(rs),
                "tokens": sum((r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in rs),
                "cost_usd": float(sum(r.cost_usd or 0.0 for r in rs)),
                "last_status": newest.status,
                "last_started_at": newest.started_at,
                "detectors": [
                    {k: d[k] for k in ("name", "p_value", "p_adjusted", "ran", "n")}
                    for d in detectors.get(latest.id, [])
                ],
            }
        )
        newest_audit = audits[key][-1] if audits[key] else None
        st = standings.get(newest_audit.id) if newest_audit is not None else {}
        if st is None:
            row.update(standing=None, standing_reason=NOT_STORED, standing_suites=[], causes=[], not_tested=[],
                       standing_detail={})
        else:
            row.update(standing=st.get("standing"), standing_reason=st.get("reason"),
                       standing_suites=list(st.get("suites") or []), causes=list(st.get("causes") or []),
                       not_tested=list(st.get("not_tested") or []), standing_detail=st)
        rows.append(row)
    rows.sort(key=lambda r: (r["provider_name"], r["model"] or ""))
    return rows


def _stored_standings(session: Session, run_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
    """The stored standing (``verdicts.standing``) of each of ``run_ids``: run id → dict, or None when not stored."""
    out: dict[str, dict[str, Any] | None] = dict.fromkeys(run_ids)
    if not run_ids or not _figures_stored(session):
        return out
    for i in range(0, len(run_ids), 500):
        for rid, st in session.execute(
            select(VerdictRow.run_id, VerdictRow.standing).where(VerdictRow.run_id.in_(run_ids[i : i + 500]))
        ):
            out[rid] = st if isinstance(st, dict) else None
    return out


def speed_fidelity_points(
    session: Session,
    *,
    models: Sequence[str] | None = None,
    suites: Sequence[str] | None = None,
    since: dt.date | dt.datetime | None = None,
    until: dt.date | dt.datetime | None = None,
    latest_only: bool = True,
) -> list[dict[str, Any]]:
    """Points for the speed-vs-fidelity scatter: one per run with a verdict.

    Each point has ``provider_name``, ``model``, ``run_id``, ``verdict``, ``started_at`` and the
    :data:`SUMMARY_KEYS` figures (``tokens_per_s`` against ``mean_kl``/``clear_mismatch_rate``).
    With ``latest_only`` only the newest verdict run of each (provider, model) is returned.
    Runs without ``tokens_per_s`` are kept (the caller decides what it can plot).
    """
    stmt = _run_filters(
        select(AuditRun).where(AuditRun.verdict.is_not(None)),
        models=models,
        suites=suites,
        since=since,
        until=until,
    ).order_by(AuditRun.started_at, AuditRun.id)
    runs = list(session.scalars(stmt))
    if latest_only:
        newest: dict[tuple[str, str | None], AuditRun] = {}
        for r in runs:
            newest[(r.provider_name, r.model)] = r
        runs = sorted(newest.values(), key=lambda r: (r.provider_name, r.model or ""))
    return [_run_row(r) for r in runs]


def provider_history(session: Session, provider_name: str, *, limit: int = 500) -> list[dict[str, Any]]:
    """Runs of one provider, oldest first, with verdict changes marked.

    Each row is a run row (see :func:`list_runs`) plus ``changed_from``: the previous verdict when
    this run's verdict differs from the last earlier run that had one, else ``None`` (the first
    verdict is not a change). At most the newest ``limit`` runs are returned.
    """
    stmt = (
        select(AuditRun)
        .where(AuditRun.provider_name == provider_name, AuditRun.kind != "calibration")
        .order_by(AuditRun.started_at.desc(), AuditRun.id.desc())
        .limit(limit)
    )
    runs = list(reversed(list(session.scalars(stmt))))
    rows: list[dict[str, Any]] = []
    previous: str | None = None
    for r in runs:
        row = _run_row(r)
        row["changed_from"] = None
        if r.verdict:
            if previous is not None and r.verdict != previous:
                row["changed_from"] = previous
            previous = r.verdict
        rows.append(row)
    return rows


def verdict_changes(
    session: Session, *, provider_name: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Every verdict change (a run whose verdict differs from the provider's previous verdict).

    Returns newest first: ``{"provider_name", "model", "run_id", "previous_verdict", "verdict",
    "verdict_reason", "started_at", "finished_at"}``. Runs without a verdict (running, failed)
    are skipped: they neither change nor reset the previous verdict.
    """
    stmt = select(AuditRun).where(AuditRun.verdict.is_not(None), AuditRun.kind != "calibration")
    if provider_name:
        stmt = stmt.where(AuditRun.provider_name == provider_name)
    stmt = stmt.order_by(AuditRun.provider_name, AuditRun.started_at, AuditRun.id)
    changes: list[dict[str, Any]] = []
    previous: dict[str, str] = {}
    for r in session.scalars(stmt):
        prev = previous.get(r.provider_name)
        if prev is not None and prev != r.verdict:
            changes.append(
                {
                    "provider_name": r.provider_name,
                    "model": r.model,
                    "run_id": r.id,
                    "previous_verdict": prev,
                    "verdict": r.verdict,
                    "verdict_reason": r.verdict_reason,
                    "started_at": r.started_at,
                    "finished_at": r.finished_at,
                }
            )
        previous[r.provider_name] = r.verdict  # type: ignore[assignment]
    changes.sort(key=lambda c: (c["started_at"], c["run_id"]), reverse=True)
    return changes[:limit] if limit else changes


def list_runs(
    session: Session,
    *,
    provider_name: str | None = None,
    include_calibration: bool = False,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """Runs, newest first: ``run_id``, ``provider_name``, ``model``, ``kind``, ``suite``,
    ``status``, ``verdict``, ``verdict_reason``, token counts, ``cost_usd`` (USD),
    ``started_at``/``finished_at`` and the :data:`SUMMARY_KEYS` figures."""
    stmt = select(AuditRun)
    if not include_calibration:
        stmt = stmt.where(AuditRun.kind != "calibration")
    if provider_name:
        stmt = stmt.where(AuditRun.provider_name == provider_name)
    stmt = stmt.order_by(AuditRun.started_at.desc(), AuditRun.id.desc()).limit(limit)
    return [_run_row(r) for r in session.scalars(stmt)]


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

    Returns the run row (see :func:`list_runs`) plus ``config_snapshot``, ``reference_model``,
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
    row = _run_row(run)
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
    detectors = _detectors_by_run(session, [run_id])[run_id]
    row["detectors"] = detectors
    figures = _figures_stored(session)
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


def calibration_table(session: Session) -> list[dict[str, Any]]:
    """Rows of ``calibration_results``: ``model``, ``profile``, ``budget_tokens``, ``audits``,
    ``rejection_rate`` with ``ci_low``/``ci_high``, ``cause_correct_rate``, ``created_at`` and
    ``suite`` (the probe mix the audits used, from ``details``); sorted by model, profile, budget."""
    if not inspect(session.get_bind()).has_table("calibration_results"):
        return []
    rows = session.scalars(
        select(CalibrationResult).order_by(
            CalibrationResult.model, CalibrationResult.profile, CalibrationResult.budget_tokens
        )
    )
    return [
        {
            "model": c.model,
            "profile": c.profile,
            "budget_tokens": c.budget_tokens,
            "audits": c.audits,
            "rejection_rate": _num(c.rejection_rate),
            "ci_low": _num(c.ci_low),
            "ci_high": _num(c.ci_high),
            "cause_correct_rate": _num(c.cause_correct_rate),
            "created_at": c.created_at,
            "suite": str((c.details or {}).get("mix") or "default"),
        }
        for c in rows
    ]


def shipped_calibration_table(path: Path | None = None) -> list[dict[str, Any]]:
    """The calibration shipped with this release (``docs/calibration.json``, the records ``auditor plan``
    reads), as rows shaped like :func:`calibration_table`'s; sequential records are named
    ``"<profile> (sequential)"`` as in the database. ``created_at`` is the file's modification time.

    Args:
        path: the JSON file (default :func:`auditor.util.committed_calibration_path`).

    Returns:
        Rows sorted by model, profile, budget; [] when the file is absent or not a list of records
        (a malformed file never breaks the page).
    """
    import json

    p = path or committed_calibration_path()
    try:
        records = json.loads(p.read_text(encoding="utf-8"))
        mtime = dt.datetime.fromtimestamp(p.stat().st_mtime, tz=dt.UTC)
    except (OSError, ValueError):
        return []
    if not isinstance(records, list):
        return []
    rows = []
    for r in records:
        if not isinstance(r, dict) or "profile" not in r or "budget_tokens" not in r:
            continue
        seq = r.get("design") == "sequential"
        rows.append({
            "model": str(r.get("model")),
            "profile": f"{r['profile']} (sequential)" if seq else str(r["profile"]),
            "budget_tokens": r.get("budget_tokens"),
            "audits": r.get("audits"),
            "rejection_rate": _num(r.get("rejection_rate")),
            "ci_low": _num(r.get("ci_low")),
            "ci_high": _num(r.get("ci_high")),
            "cause_correct_rate": _num(r.get("cause_correct_rate")),
            "created_at": mtime,
            "suite": str(r.get("mix") or "default"),
        })
    return sorted(rows, key=lambda r: (r["model"], r["profile"], r["suite"], _num(r["budget_tokens"]) or 0.0))


def recent_alerts(session: Session, *, limit: int = 50) -> list[dict[str, Any]]:
    """Newest alerts first: ``id``, ``provider_name``, ``run_id``, ``previous_verdict``,
    ``verdict``, ``message``, ``created_at``, ``delivered``, ``webhook_status``."""
    if not inspect(session.get_bind()).has_table("alerts"):
        return []
    rows = session.scalars(select(Alert).order_by(Alert.created_at.desc(), Alert.id.desc()).limit(limit))
    return [
        {
            "id": a.id,
            "provider_name": a.provider_name,
            "run_id": a.run_id,
            "previous_verdict": a.previous_verdict,
            "verdict": a.verdict,
            "message": a.message,
            "created_at": a.created_at,
            "delivered": bool(a.delivered),
            "webhook_status": a.webhook_status,
        }
        for a in rows
    ]


def list_schedules(session: Session) -> list[dict[str, Any]]:
    """Rows of ``schedules`` ordered by id: ``id``, ``provider_name``, ``every_seconds`` (s),
    ``suite``, ``budget_tokens``, ``enabled``, ``created_at``, ``last_run_at``, ``next_run_at``."""
    if not inspect(session.get_bind()).has_table("schedules"):
        return []
    return [
        {
            "id": s.id,
            "provider_name": s.provider_name,
            "every_seconds": s.every_seconds,
            "suite": s.suite,
            "budget_tokens": s.budget_tokens,
            "enabled": bool(s.enabled),
            "created_at": s.created_at,
            "last_run_at": s.last_run_at,
            "next_run_at": s.next_run_at,
        }
        for s in session.scalars(select(Schedule).order_by(Schedule.id))
    ]
