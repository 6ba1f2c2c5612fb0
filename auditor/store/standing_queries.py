"""Read-only queries behind a provider's combined standing (:mod:`auditor.standing`).

Reads the completed audits of a provider (``audit_runs`` with their ``verdicts`` rows and
``detector_results``) and hands them to :func:`auditor.standing.combine_standing`, which holds the
rules (window, severity order, causes, never tested). Used by ``auditor report --provider NAME``
(through :func:`auditor.standing.load_standing`) and by the dashboard's provider row
(:func:`auditor.store.dashboard_queries.provider_overview`). Never writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from auditor.standing import DEFAULT_WINDOW_DAYS, AuditRecord, Standing, check_window_days, combine_standing
from auditor.store.models import AuditRun, DetectorResultRow, VerdictRow
from auditor.store.queries import list_runs

__all__ = ["audit_records", "provider_standing", "standing_of_runs"]


def audit_records(session: Session, runs: Sequence[AuditRun]) -> list[AuditRecord]:
    """:class:`~auditor.standing.AuditRecord` of each completed audit in ``runs`` that has a verdict
    (other runs are skipped), with its verdict details and detector results (two queries)."""
    done = [r for r in runs if r.kind == "audit" and r.status == "completed" and r.verdict]
    ids = [r.id for r in done]
    verdicts: dict[str, VerdictRow] = {}
    dets: dict[str, list[dict]] = {i: [] for i in ids}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for row in session.scalars(select(VerdictRow).where(VerdictRow.run_id.in_(chunk))):
            verdicts[row.run_id] = row
        for d in session.scalars(
            select(DetectorResultRow).where(DetectorResultRow.run_id.in_(chunk)).order_by(DetectorResultRow.id)
        ):
            dets[d.run_id].append({"name": d.name, "ran": bool(d.ran), "reason": d.reason, "p_adjusted": d.p_adjusted})
    out = []
    for r in done:
        v = verdicts.get(r.id)
        stored = dict((v.details if v is not None else None) or {})
        details = {k: val for k, val in stored.items() if k != "report"}
        rep = dict(stored.get("report") or {})
        if rep.get("not_tested") and "not_tested" not in details:  # causes the reference could not test
            details["not_tested"] = dict.fromkeys(rep["not_tested"], "no reference (reference = 'none')")
        out.append(AuditRecord(
            run_id=r.id, suite=r.suite, model=r.model, started_at=r.started_at,
            verdict=str(v.verdict if v is not None else r.verdict),
            reason=str((v.reason if v is not None else None) or r.verdict_reason or ""),
            alpha=r.alpha, details=details, detectors=dets.get(r.id, []),
        ))
    return out


def standing_of_runs(
    session: Session,
    provider: str,
    runs: Sequence[AuditRun],
    *,
    model: str | None = None,
    window_days: float = DEFAULT_WINDOW_DAYS,
    as_of: dt.datetime | None = None,
) -> Standing:
    """The standing of ``provider`` over the given runs (e.g. the dashboard's filtered runs)."""
    return combine_standing(provider, audit_records(session, runs), model=model, window_days=window_days, as_of=as_of)


def provider_standing(
    session: Session,
    provider: str,
    *,
    model: str | None = None,
    window_days: float = DEFAULT_WINDOW_DAYS,
    as_of: dt.datetime | None = None,
) -> Standing | None:
    """The standing of ``provider`` (its newest audit's model unless ``model`` is given) from its
    completed audits started within ``window_days`` before the anchor (``as_of``, else its newest
    completed audit); None when it has no completed audit (of ``model``).

    Raises:
        ValueError: ``window_days`` not a positive number of days.
    """
    check_window_days(window_days)
    q = select(AuditRun).where(AuditRun.provider_name == provider, AuditRun.kind == "audit",
                               AuditRun.status == "completed", AuditRun.verdict.is_not(None))
    if model is not None:
        q = q.where(AuditRun.model == model)
    if as_of is not None:
        as_of = as_of if as_of.tzinfo else as_of.replace(tzinfo=dt.UTC)
        q = q.where(AuditRun.started_at <= as_of)
    newest = session.scalars(q.order_by(AuditRun.started_at.desc(), AuditRun.id.desc()).limit(1)).first()
    if newest is None:
        return None
    anchor = as_of or newest.started_at
    since = anchor - dt.timedelta(days=window_days)
    runs = list_runs(session, provider=provider, kind="audit", status="completed", since=since, limit=None)
    return standing_of_runs(session, provider, runs, model=model or newest.model, window_days=window_days, as_of=as_of)
