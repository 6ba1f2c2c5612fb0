"""The figures the dashboard shows, computed when a verdict is stored (issue 34, item 2).

The dashboard may read the store's query modules and :mod:`auditor.util` only (docs/ARCHITECTURE.md, L8),
so it cannot apply the buyer's-questions rules (:mod:`auditor.verdict.questions`), the headline or the standing rules
(:mod:`auditor.watch.standing`), which import the verdict rules and every detector. Instead, whoever stores a
verdict calls :func:`store_figures` in the same transaction, and the figures land in the ``verdicts`` row
(``questions``, ``headline``, ``standing``; revision 0005), where ``auditor.store.dashboard_queries`` reads them:

- ``questions`` and ``headline``: :attr:`auditor.report.common.AuditReport.questions` and ``.headline`` of the
  report re-read from the store (:func:`auditor.report.render.report_from_store`, what ``auditor report RUN_ID``
  renders), so the dashboard and every report show the same answer and sentence (one home: the report).
- ``standing``: the provider's combined standing (:func:`auditor.watch.standing.provider_standing`, its
  ``to_dict()``) over the completed audits of the run's provider and model, anchored at the run's start
  (``as_of``). Stored per run, not per provider, because the dashboard's provider row is filtered (model,
  suite, dates): it shows the standing stored with the newest completed audit among the matching runs,
  which is the standing as of that audit — a per-provider value would only ever show today's. A run that
  completes after later-started runs of the same provider (concurrent audits) also refreshes the
  standing of those within the window (:data:`auditor.watch.standing.DEFAULT_WINDOW_DAYS`), so each stored
  standing equals what :func:`auditor.watch.standing.provider_standing` gives with ``as_of`` = that run's start.

Runs stored before revision 0005 are backfilled by that migration (:func:`backfill`). The figures are
the rules' at write time: a later change of a rule changes the figures of new audits only, as the stored
verdict itself does.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import select

from auditor.report.render import report_from_store
from auditor.store.models import AuditRun, VerdictRow
from auditor.store.result_queries import store_verdict_figures
from auditor.watch.standing import DEFAULT_WINDOW_DAYS, provider_standing

if TYPE_CHECKING:  # pragma: no cover
    from sqlalchemy.orm import Session

__all__ = ["backfill", "store_figures"]


def _completed_audit(run: AuditRun) -> bool:
    """Whether ``run`` counts in a standing (``auditor.store.standing_queries.audit_records``' filter)."""
    return run.kind == "audit" and run.status == "completed" and bool(run.verdict)


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _store_report_figures(session: Session, run_id: str) -> None:
    rep = report_from_store(session, run_id)
    store_verdict_figures(session, run_id, questions=[q.to_dict() for q in rep.questions], headline=rep.headline)


def _store_standing(session: Session, run: AuditRun) -> None:
    st = provider_standing(session, run.provider_name, model=run.model, as_of=_aware(run.started_at))
    if st is not None:  # never None: the run itself is a completed audit of that model started at as_of
        store_verdict_figures(session, run.id, standing=st.to_dict())


def store_figures(session: Session, run_id: str) -> None:
    """Compute and store the dashboard's figures of ``run_id`` (module docstring), after its verdict,
    detector results, alpha and status are stored (the figures read them). Flushes; the caller commits.

    Raises:
        auditor.report.render.ReportError: the run is unknown or has no stored verdict.
    """
    _store_report_figures(session, run_id)
    run = session.get(AuditRun, run_id)
    if run is None or not _completed_audit(run):
        return
    start = _aware(run.started_at)
    later = session.scalars(
        select(AuditRun).where(
            AuditRun.provider_name == run.provider_name, AuditRun.model == run.model, AuditRun.kind == "audit",
            AuditRun.status == "completed", AuditRun.verdict.is_not(None), AuditRun.started_at >= start,
            AuditRun.started_at <= start + dt.timedelta(days=DEFAULT_WINDOW_DAYS),
        )
    )
    for r in sorted({run, *later}, key=lambda x: (_aware(x.started_at), x.id)):
        _store_standing(session, r)


def backfill(session: Session) -> int:
    """Store the figures of every verdict row that lacks them (runs stored before revision 0005).

    Each run's standing is computed as of its own start, so the result is what :func:`store_figures`
    would have stored had every run been written after 0005. Flushes; returns the number of verdict
    rows filled.
    """
    rows = list(session.scalars(select(VerdictRow).where(VerdictRow.questions.is_(None) | VerdictRow.headline.is_(None)
                                                          | VerdictRow.standing.is_(None))))
    n = 0
    for row in rows:
        run = session.get(AuditRun, row.run_id)
        if run is None:
            continue
        if row.questions is None or row.headline is None:
            _store_report_figures(session, run.id)
        if row.standing is None and _completed_audit(run):
            _store_standing(session, run)
        n += 1
    return n
