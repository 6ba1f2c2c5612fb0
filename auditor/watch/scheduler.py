"""Scheduled audits: a table-driven scheduler over the ``schedules`` table of the audit database.

Why not APScheduler's job store: the ``schedules`` table (docs/ARCHITECTURE.md) is already the
persisted, user-visible list of jobs (``auditor schedule list``), it works on SQLite and
PostgreSQL alike without pickled callables, and a plain loop over it can be driven by a fake
clock in tests. The semantics match APScheduler's ``coalesce=True`` with no misfire grace limit:

- Each schedule has ``next_run_at``. A pass (:meth:`AuditScheduler.run_due`) takes every enabled
  schedule with ``next_run_at <= now``.
- **Claim before run**: ``UPDATE schedules SET next_run_at = <next slot>, last_run_at = now
  WHERE id = :id AND next_run_at = <the value read>`` and commit. Only the process whose update
  hit the row runs the audit, so two schedulers (or a restarted one) never run the same slot
  twice; a crash during the audit skips that slot rather than repeating it (at most once).
- **Missed runs coalesce**: after downtime the next slot is the first
  ``next_run_at + k * every`` strictly after now, so N missed slots produce one run now and the
  cadence stays aligned to the original times.

The audit itself is a callable (``runner``) so tests inject a fake; the default imports
``auditor.check.pipeline.run_check`` lazily (the ``check`` pipeline) and calls
``run_check(provider_name, suite=..., budget_tokens=..., db_url=...)``, which returns an object or
dict with ``run_id`` and ``verdict``. After each run :func:`auditor.watch.alerts.record_verdict_change`
writes at most one alert for it.

For cron/systemd/CI, ``auditor schedule run --once`` performs one pass and exits.

**Interrupted audits resume** (issue 37, item 10): a ``KeyboardInterrupt`` during an audit (Ctrl-C,
or SIGTERM, which ``auditor schedule run`` turns into one) checkpoints it — every finished probe is
already stored — marks its run ``interrupted`` with the reason in the run summary (``interrupted``:
``reason``, ``schedule_id``, ``due_at``, ``at``), gives the slot back (``next_run_at`` returns to the
claimed value, so the slot does not count as done) and re-raises. The next pass claims that slot
again and calls the runner with ``resume=RUN_ID`` (pending probes only, then the analysis). A run
whose resume fails for another reason is marked ``abandoned`` in that summary entry and not
resumed again (the slot then ran, with its error).
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from auditor.store.db import Store
from auditor.store.models import Schedule, utcnow

__all__ = [
    "MIN_INTERVAL_S",
    "AuditScheduler",
    "JobOutcome",
    "JobRunner",
    "add_schedule",
    "default_runner",
    "format_interval",
    "next_slot",
    "parse_interval",
    "remove_schedule",
]

#: Shortest allowed interval, seconds (an audit costs tokens and money).
MIN_INTERVAL_S = 60

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


class JobRunner(Protocol):
    """Runs one audit; same signature as ``auditor.check.pipeline.run_check``.

    Returns an object or mapping with ``run_id`` (str) and ``verdict`` (str | None).
    """

    def __call__(self, provider_name: str, *, suite: str | None, budget_tokens: int | None, db_url: str) -> Any: ...
    # a runner that resumes also accepts ``resume=RUN_ID`` (passed only when resuming an interrupted audit)


def default_runner(provider_name: str, *, suite: str | None, budget_tokens: int | None, db_url: str,
                   resume: str | None = None) -> Any:
    """Run a real audit through ``auditor.check.pipeline.run_check`` (imported lazily); ``resume``
    continues that interrupted run.

    Raises:
        RuntimeError: the check pipeline is not available in this installation.
    """
    try:
        from auditor.check.pipeline import run_check
    except ImportError as exc:  # pragma: no cover - depends on the pipeline being installed
        raise RuntimeError(f"the audit pipeline (auditor.check.pipeline.run_check) is not available: {exc}") from exc
    kwargs: dict[str, Any] = {"db_url": db_url}
    if suite is not None:
        kwargs["suite"] = suite
    if budget_tokens is not None:
        kwargs["budget_tokens"] = budget_tokens
    if resume is not None:
        kwargs["resume"] = resume
    return run_check(provider_name, **kwargs)


def parse_interval(text: str | float) -> int:
    """Parse an interval such as ``6h``, ``30m``, ``1d``, ``1h30m``, ``90s`` or ``3600`` into seconds.

    Units: s, m, h, d, w. A bare number is seconds.

    Raises:
        ValueError: unparsable, or shorter than :data:`MIN_INTERVAL_S` seconds (message names
            ``--every`` and shows valid examples).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        s = str(text).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", s):
            seconds = float(s)
        elif s and _PART.sub("", s) == "":
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _PART.findall(s))
        else:
            raise ValueError(
                f"--every: cannot parse interval {text!r}; use a number with a unit, "
                "e.g. 6h, 30m, 1d, 1h30m (s, m, h, d, w) or plain seconds"
            )
    if seconds < MIN_INTERVAL_S:
        raise ValueError(f"--every: interval {text!r} is {seconds:g} s; the minimum is {MIN_INTERVAL_S} s (e.g. 1m)")
    return round(seconds)


def format_interval(seconds: int) -> str:
    """Inverse of :func:`parse_interval` for display: ``21600`` → ``"6h"``, ``5400`` → ``"1h30m"``."""
    parts = []
    rest = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            n, rest = divmod(rest, size)
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def next_slot(due: dt.datetime, every_seconds: int, now: dt.datetime) -> dt.datetime:
    """The first ``due + k * every_seconds`` (k ≥ 1) strictly after ``now``.

    With ``due <= now`` this coalesces every missed slot into the run happening now.
    """
    step = dt.timedelta(seconds=every_seconds)
    if due > now:
        return due
    k = int((now - due) // step) + 1
    return due + k * step


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def add_schedule(
    session: Session,
    provider_name: str,
    every_seconds: int,
    *,
    suite: str | None = None,
    budget_tokens: int | None = None,
    first_run_at: dt.datetime | None = None,
    now: dt.datetime | None = None,
) -> Schedule:
    """Insert a schedule (flushes; the caller commits). The first run is due at ``first_run_at``
    (default: now, i.e. on the scheduler's next pass).

    Raises:
        ValueError: empty provider name, interval below :data:`MIN_INTERVAL_S` s, or a
            non-positive token budget.
    """
    if not provider_name or not provider_name.strip():
        raise ValueError("--provider: a provider name is required (see `auditor providers`)")
    if every_seconds < MIN_INTERVAL_S:
        raise ValueError(f"--every: minimum interval is {MIN_INTERVAL_S} s, got {every_seconds} s")
    if budget_tokens is not None and budget_tokens <= 0:
        raise ValueError(f"--budget-tokens: must be a positive number of tokens, got {budget_tokens}")
    now = _aware(now or utcnow())
    sched = Schedule(
        provider_name=provider_name.strip(),
        every_seconds=int(every_seconds),
        suite=suite,
        budget_tokens=budget_tokens,
        enabled=True,
        created_at=now,
        last_run_at=None,
        next_run_at=_aware(first_run_at) if first_run_at else now,
    )
    session.add(sched)
    session.flush()
    return sched


def remove_schedule(session: Session, schedule_id: int) -> bool:
    """Delete schedule ``schedule_id``; False when it does not exist."""
    sched = session.get(Schedule, schedule_id)
    if sched is None:
        return False
    session.delete(sched)
    session.flush()
    return True


@dataclass(frozen=True)
class JobOutcome:
    """What one scheduled run did (``error`` set when the runner raised; ``internal`` when that was an
    unexpected error, a bug, whose traceback is in the log file ``log``, :func:`auditor.check.errors.write_error_log`)."""

    schedule_id: int
    provider_name: str
    due_at: dt.datetime
    started_at: dt.datetime
    run_id: str | None
    verdict: str | None
    error: str | None
    alert_id: int | None
    next_run_at: dt.datetime
    internal: bool = False
    log: str | None = None


def _field(result: Any, name: str) -> Any:
    if result is None:
        return None
    if isinstance(result, dict):
        return result.get(name)
    return getattr(result, name, None)


class AuditScheduler:
    """Runs due schedules from the ``schedules`` table (see the module docstring).

    Args:
        store: the open audit database (``auditor.store.db.open_store``).
        runner: the audit callable (default :func:`default_runner`).
        clock: returns the current aware UTC time (tests pass a fake).
        webhook_url: POST verdict-change alerts here (optional).
        echo: where status lines and alerts are printed (None: silent).
        http_client: ``httpx.Client`` for the webhook (tests pass a mocked one).
    """

    def __init__(
        self,
        store: Store,
        *,
        runner: JobRunner | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        webhook_url: str | None = None,
        echo: Callable[[str], Any] | None = print,
        http_client: Any = None,
        webhook_backoff_s: float = 0.5,
    ) -> None:
        self.store = store
        self.runner: JobRunner = runner or default_runner
        self.clock = clock
        self.webhook_url = webhook_url
        self.echo = echo
        self.http_client = http_client
        self.webhook_backoff_s = webhook_backoff_s
        #: set when an audit was interrupted (its run id, "" when none was created yet); None otherwise
        self.interrupted: str | None = None

    def _say(self, text: str) -> None:
        if self.echo is not None:
            self.echo(text)

    def _now(self) -> dt.datetime:
        return _aware(self.clock()).astimezone(dt.UTC)

    def _claim(self, sched_id: int, due: dt.datetime, every: int, now: dt.datetime) -> dt.datetime | None:
        """Advance ``next_run_at`` from ``due`` atomically; the new value, or None if another
        process claimed this slot first (or the schedule was disabled/removed)."""
        nxt = next_slot(due, every, now)
        with self.store.session() as s:
            # an UPDATE returns a CursorResult (which has ``rowcount``); Session.execute is typed as Result
            res = cast(CursorResult[Any], s.execute(
                update(Schedule)
                .where(Schedule.id == sched_id, Schedule.next_run_at == due, Schedule.enabled.is_(True))
                .values(next_run_at=nxt, last_run_at=now)
                .execution_options(synchronize_session=False)
            ))
            if res.rowcount != 1:
                return None
        return nxt

    def next_due_at(self) -> dt.datetime | None:
        """Earliest ``next_run_at`` over enabled schedules (None when there are none)."""
        with self.store.session() as s:
            values = [
                v for v in s.scalars(select(Schedule.next_run_at).where(Schedule.enabled.is_(True))) if v is not None
            ]
        return min(values) if values else None

    def run_due(self) -> list[JobOutcome]:
        """One pass: claim and run every schedule due now; returns what ran (oldest due first)."""
        now = self._now()
        with self.store.session() as s:
            due = [
                (sch.id, sch.provider_name, sch.every_seconds, sch.suite, sch.budget_tokens, sch.next_run_at)
                for sch in s.scalars(
                    select(Schedule)
                    .where(Schedule.enabled.is_(True), Schedule.next_run_at.is_not(None), Schedule.next_run_at <= now)
                    .order_by(Schedule.next_run_at, Schedule.id)
                )
            ]
        outcomes = []
        for sched_id, provider, every, suite, budget, due_at in due:
            assert due_at is not None  # selected with next_run_at IS NOT NULL
            nxt = self._claim(sched_id, due_at, every, now)
            if nxt is None:
                continue
            outcomes.append(self._run_one(sched_id, provider, suite, budget, due_at, nxt))
        return outcomes

    def _run_one(
        self,
        sched_id: int,
        provider: str,
        suite: str | None,
        budget: int | None,
        due_at: dt.datetime,
        nxt: dt.datetime,
    ) -> JobOutcome:
        started = self._now()
        resume = self._interrupted_run(sched_id, provider)
        self._say(f"schedule {sched_id}: auditing {provider} (due {due_at:%Y-%m-%d %H:%M} UTC)"
                  + (f", resuming interrupted run {resume}" if resume else ""))
        run_id = verdict = error = log = None
        alert_id = None
        internal = False
        extra: dict[str, Any] = {"resume": resume} if resume else {}
        try:
            self.interrupted = None
            result = self.runner(provider, suite=suite, budget_tokens=budget, db_url=self.store.url, **extra)
            run_id = _field(result, "run_id")
            verdict = _field(result, "verdict")
        except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM: checkpoint, give the slot back, stop
            self.interrupted = getattr(exc, "run_id", None) or resume or ""
            self._checkpoint(sched_id, due_at, self.interrupted or None)
            raise
        except Exception as exc:
            if resume:
                self._abandon(resume, f"{type(exc).__name__}: {exc}")
            from auditor.check.errors import AuditError, write_error_log

            error = f"{type(exc).__name__}: {exc}"
            internal = not isinstance(exc, AuditError)
            where = ""
            if internal:  # a bug, not a finding: keep the traceback, say where (the run is stored failed)
                path = write_error_log(exc, f"auditor schedule run (schedule {sched_id}, provider {provider})")
                log = str(path) if path is not None else None
                where = f" (internal error; traceback in {log})" if log else " (internal error; traceback not saved)"
            failed = getattr(exc, "run_id", None)
            self._say(f"schedule {sched_id}: audit of {provider} failed: {error}{where}"
                      + (f"; run {failed} is stored as failed with this reason" if failed else ""))
        if run_id:
            from auditor.watch.alerts import record_verdict_change

            with self.store.session() as s:
                alert = record_verdict_change(
                    s,
                    str(run_id),
                    webhook_url=self.webhook_url,
                    echo=self.echo,
                    client=self.http_client,
                    now=self.clock,
                    backoff_s=self.webhook_backoff_s,
                )
                alert_id = alert.id if alert else None
            self._say(
                f"schedule {sched_id}: {provider} run {run_id} verdict {verdict or '-'}; "
                f"next at {nxt:%Y-%m-%d %H:%M} UTC"
            )
        return JobOutcome(
            schedule_id=sched_id,
            provider_name=provider,
            due_at=due_at,
            started_at=started,
            run_id=str(run_id) if run_id else None,
            verdict=verdict,
            error=error,
            alert_id=alert_id,
            next_run_at=nxt,
            internal=internal,
            log=log,
        )

    def _interrupted_run(self, sched_id: int, provider: str) -> str | None:
        """The newest run of ``provider`` this schedule left ``interrupted`` and not abandoned, if any."""
        from auditor.store import queries as q

        with self.store.session() as s:
            for run in q.list_runs(s, provider=provider, status="interrupted", limit=50):
                mark = (run.summary or {}).get("interrupted") or {}
                if mark.get("schedule_id") == sched_id and not mark.get("abandoned"):
                    return str(run.id)
        return None

    def _checkpoint(self, sched_id: int, due_at: dt.datetime, run_id: str | None) -> None:
        """After an interrupt: the run ``interrupted`` with the reason in its summary, the slot given back
        (``next_run_at`` = ``due_at``), a line said. Never raises (it runs while the process stops)."""
        from auditor.store import queries as q

        reason = (f"interrupted (SIGTERM or Ctrl-C) during `auditor schedule run`, schedule {sched_id}; "
                  "the next `auditor schedule run` resumes it")
        try:
            with self.store.session() as s:
                s.execute(update(Schedule).where(Schedule.id == sched_id).values(next_run_at=due_at)
                          .execution_options(synchronize_session=False))
                run = q.get_run(s, run_id) if run_id else None
                if run is not None and run.status in ("running", "interrupted", "pending"):
                    summary = dict(run.summary or {})
                    summary.pop("runner", None)
                    summary["interrupted"] = {"reason": reason, "schedule_id": sched_id,
                                              "due_at": _aware(due_at).isoformat(), "at": self._now().isoformat()}
                    run.summary = q.json_safe(summary)
                    q.set_run_status(s, run.id, "interrupted")
        except Exception as exc:  # the database went away as the process stops: say so, nothing more
            self._say(f"schedule {sched_id}: could not checkpoint the interrupted audit: {exc}")
            return
        self._say(f"schedule {sched_id}: audit interrupted; " + (f"run {run_id} stored as interrupted; " if run_id else "")
                  + "the slot is not counted as done: the next `auditor schedule run` resumes it")

    def _abandon(self, run_id: str, why: str) -> None:
        """A resume of ``run_id`` failed: it is not resumed again (summary ``interrupted.abandoned``)."""
        from auditor.store import queries as q

        with self.store.session() as s:
            run = q.get_run(s, run_id)
            if run is not None:
                summary = dict(run.summary or {})
                summary["interrupted"] = {**(summary.get("interrupted") or {}), "abandoned": why[:300]}
                run.summary = q.json_safe(summary)

    def run_forever(
        self,
        *,
        stop: threading.Event | None = None,
        poll_s: float = 60.0,
        sleep: Callable[[float], Any] | None = None,
        max_passes: int | None = None,
    ) -> list[JobOutcome]:
        """Loop: run due schedules, then sleep until the next is due (at most ``poll_s`` s, so
        schedules added meanwhile are picked up) until ``stop`` is set or ``max_passes`` passes.

        Args:
            stop: set it (e.g. from a signal handler) to end the loop after the current pass.
            poll_s: longest sleep between passes, seconds.
            sleep: ``sleep(seconds)``; default waits on ``stop`` (tests pass one that advances a
                fake clock).
            max_passes: stop after this many passes (None: forever).

        Returns:
            Every outcome, in order.
        """
        stop = stop or threading.Event()
        sleeper = sleep or (lambda s: stop.wait(s))
        done: list[JobOutcome] = []
        passes = 0
        while not stop.is_set():
            done.extend(self.run_due())
            passes += 1
            if max_passes is not None and passes >= max_passes:
                break
            nxt = self.next_due_at()
            wait = poll_s
            if nxt is not None:
                wait = min(poll_s, max(0.0, (nxt - self._now()).total_seconds()))
            sleeper(max(wait, 0.5))
        return done
