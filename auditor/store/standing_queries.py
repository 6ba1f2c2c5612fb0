"""Read-only queries behind a provider's combined standing (:mod:`auditor.watch.standing`).

Reads the completed audits of a provider (``audit_runs`` with their ``verdicts`` rows and
``detector_results``) as :class:`AuditRecord` data; the rules (window, severity order, causes,
never tested) stay in :mod:`auditor.watch.standing`, which calls these (``provider_standing``,
``standing_of_runs``). The store imports no rule module: it is a leaf below them. Never writes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from auditor.store.models import AuditRun, DetectorResultRow, VerdictRow
from auditor.store.queries import list_runs

__all__ = ["AuditRecord", "audit_records", "recent_audit_runs"]


@dataclass
class AuditRecord:
    """One stored, completed audit as :func:`auditor.watch.standing.combine_standing` reads it.

    Attributes:
        run_id: ``audit_runs.id``. suite: suite name (None when not recorded). model: model id.
        started_at: start (aware UTC datetime). verdict: the run's verdict (``auditor.watch.standing.SEVERITY``).
        reason: the verdict's sentence. alpha: family-wise level of the audit.
        details: the verdict details (``rule``, ``findings``, ``detectors``, ``secondary_causes``,
            ``not_tested`` ... see ``auditor.verdict.decide``).
        detectors: stored detector results as ``{"name", "ran", "reason", "p_adjusted"}``.
    """

    run_id: str
    suite: str | None
    model: str | None
    started_at: dt.datetime
    verdict: str
    reason: str = ""
    alpha: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    detectors: list[dict[str, Any]] = field(default_factory=list)



def audit_records(session: Session, runs: Sequence[AuditRun]) -> list[AuditRecord]:
    """:class:`AuditRecord` of each completed audit in ``runs`` that has a verdict
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


def recent_audit_runs(
    session: Session,
    provider: str,
    *,
    model: str | None,
    window_days: float,
    as_of: dt.datetime | None = None,
) -> tuple[list[AuditRun], str | None] | None:
    """The completed audits of ``provider`` started within ``window_days`` (> 0, days) before the
    anchor (``as_of``, else its newest completed audit of ``model``, any model when None), and that
    newest audit's model; None when it has no completed audit (of ``model``)."""
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
    return list_runs(session, provider=provider, kind="audit", status="completed", since=since, limit=None), newest.model
