"""Read-only query functions behind the dashboard's runs across providers, the Atom feed and verdict-change alerts.

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
threshold); ``tokens_per_chunk`` (histogram ``{"k": count}`` or list of per-chunk counts) is read by
:mod:`auditor.store.run_detail_queries`.

The run-detail page's queries (one run with its detectors, evidence, probes, attempts and tokens) are
:mod:`auditor.store.run_detail_queries`; they build on this module's run rows (:func:`run_row`,
:func:`detectors_by_run`, :func:`figures_stored`).

The buyer's two answers, the plain headline and the provider's standing are read as stored with each verdict
(``verdicts.questions`` / ``headline`` / ``standing``, written by ``auditor.check.stored_figures`` when the verdict is
stored, revision 0005): this module applies no verdict, question or standing rule, so importing the dashboard
loads none of them (docs/ARCHITECTURE.md, L8). A verdict row without them (written before revision 0005 and
not migrated) is shown as :data:`NOT_STORED`, never computed here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from auditor.store.models import (
    Alert,
    AuditRun,
    CalibrationResult,
    DetectorResultRow,
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
    "detectors_by_run",
    "figures_stored",
    "filter_options",
    "has_schema",
    "list_runs",
    "list_schedules",
    "provider_history",
    "provider_overview",
    "recent_alerts",
    "run_row",
    "speed_fidelity_points",
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


def run_row(run: AuditRun) -> dict[str, Any]:
    """The row every run listing shows (see :func:`list_runs`): ids, provider, model, kind, suite, status,
    verdict, token counts (tokens), ``cost_usd`` (USD), start/finish (aware datetimes) and the
    :data:`SUMMARY_KEYS` figures (None when not measured)."""
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


def detectors_by_run(session: Session, run_ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The stored detector results of each of ``run_ids`` (run id → rows in storage order; [] for a run without
    any): ``name``, ``statistic``, ``p_value``, ``p_adjusted``, ``effect`` with ``effect_ci_low``/``effect_ci_high``,
    ``n``, ``ran``, ``reason`` and ``evidence`` (the stored list; numbers that are not finite are None)."""
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


def figures_stored(session: Session) -> bool:
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
    detectors = detectors_by_run(session, (r.id for r in chosen.values()))
    audits = {key: [r for r in rs if r.kind == "audit" and r.status == "completed" and r.verdict]
              for key, rs in groups.items()}
    standings = _stored_standings(session, [a[-1].id for a in audits.values() if a])
    for key, rs in groups.items():
        latest = chosen[key]
        row = run_row(latest)
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
    if not run_ids or not figures_stored(session):
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
    return [run_row(r) for r in runs]


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
        row = run_row(r)
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
    return [run_row(r) for r in session.scalars(stmt)]


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
