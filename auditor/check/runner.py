"""Resumable probe runs: send a suite's probes to a provider and persist every attempt as it arrives.

Crash-safety contract (``kill -9`` at any instant neither loses nor duplicates a probe):

1. The run row and *all* planned probes (``status='pending'``, ``probe_key = "{probe.id}#{sample}"``,
   unique per run) are inserted in one transaction before any request is sent.
2. Every HTTP attempt (success, failure or retry) is committed as its own ``probe_attempts`` row
   from the client's ``on_attempt`` hook, before the next attempt (or backoff) starts;
   ``attempt_no`` continues across resumes (``probes.n_attempts`` is updated in the same
   transaction).
3. The *final* attempt of a probe (a success, a non-retryable failure, or the last allowed try)
   is committed in the same transaction as the probe's ``done``/``failed`` status, its
   normalized tokens and the run's token/cost totals.

A resumed run (``--resume RUN_ID``, or automatically the newest unfinished run of the same
provider + suite) sends only the probes still ``pending``; an attempt that was in flight when
the process died is simply absent and is retried. Requests are rebuilt with the pure
``probes.client.build_payload`` and must equal the stored ``request_json`` (a changed provider
config or suite refuses to resume rather than mixing two configurations in one run).

Units: seconds, tokens, USD (``ProviderConfig.pricing``). The API key is read from the env var
named by ``api_key_env``, sent only as a header by ``probes.client.ProbeClient``, and scrubbed
from every stored string; request headers are never stored.

Parts: this module opens (or reopens) the run and schedules the probes on the client's workers; every
attempt is stored by :class:`auditor.check.attempt_writer.AttemptWriter` on one writer thread, and the
session's progress is shown by :class:`auditor.check.run_progress.ProgressDisplay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from auditor.check.attempt_writer import AttemptWriter
from auditor.check.run_progress import ProgressDisplay, RunProgress
from auditor.store import queries as q
from auditor.store.db import Store
from auditor.util import json_safe

__all__ = [
    "PlanItem",
    "RunSummary",
    "RunnerError",
    "code_version",
    "describe_errors",
    "plan_suite",
    "render_summary",
    "run_probes",
    "run_probes_async",
    "summarize_run",
]


class RunnerError(RuntimeError):
    """A run cannot start or resume (unknown run id, config/suite mismatch, run owned by a live
    process); the message names the run and the fix."""


class _WorkerInterrupt(Exception):
    """A ``KeyboardInterrupt``/``SystemExit`` raised inside a probe worker (e.g. by the progress
    callback), carried as an ordinary exception.

    asyncio stops the event loop as soon as a task raises one of those two, before the run can
    cancel and await its other workers; the tasks left behind then end at ``asyncio.run``'s shutdown
    with an exception nobody retrieves ("Task exception was never retrieved"). Carried this way the
    interrupt travels through ``gather`` like any error: the run cancels and awaits every worker,
    marks itself ``interrupted``, and :func:`run_probes` re-raises the original exception (``exc``)
    once the loop has closed.
    """

    def __init__(self, exc: KeyboardInterrupt | SystemExit):
        super().__init__(f"{type(exc).__name__} in a probe worker")
        self.exc = exc


@dataclass(frozen=True)
class PlanItem:
    """One planned request: suite probe ``probe`` sample ``sample`` under key ``probe_key``."""

    probe_key: str
    probe: Any  # probes.suites.Probe
    sample: int


@dataclass
class RunSummary:
    """End-of-run figures (whole run, across resumes). Times in s, money in USD."""

    run_id: str
    provider: str
    suite: str | None
    suite_version: str | None
    status: str
    probes_total: int
    probes_ok: int
    probes_failed: int
    probes_pending: int
    attempts: int
    retries: int
    failed_attempts: int
    tokens: int  # normalized completion tokens stored
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    http_status_counts: dict[str, int] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)  # kind → its most frequent detail (the server's words)
    elapsed_s: float | None = None  # this session's wall time
    resumed: bool = False
    latency_median_s: float | None = None
    ttft_median_s: float | None = None
    usage_note: str | None = None  # token/cost figures estimated (auditor.report.common.usage_note), None = as billed
    concurrency: str | None = None  # the client narrowed its concurrency (auditor.report.common.concurrency_line)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def code_version() -> str:
    """``<package version>[+g<git short sha>]`` of spec-auditor (sha when run from a git checkout)."""
    try:
        from importlib.metadata import version

        ver = version("spec-auditor")
    except Exception:
        ver = "0+unknown"
    root = Path(__file__).resolve().parent.parent.parent
    if (root / ".git").exists():
        try:
            sha = subprocess.run(
                ["git", "rev-parse", "--short=12", "HEAD"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
            if sha:
                ver = f"{ver}+g{sha}"
        except (OSError, subprocess.SubprocessError):
            pass
    return ver


def plan_suite(suite: Any) -> list[PlanItem]:
    """Every request of ``suite`` in suite order: ``n_samples`` items per probe, keys
    ``{probe.id}#{sample}``. Deterministic.

    Raises:
        RunnerError: two items share a key.
    """
    items: list[PlanItem] = []
    seen: set[str] = set()
    for probe in suite.probes:
        for sample in range(int(getattr(probe, "n_samples", 1) or 1)):
            key = f"{probe.id}#{sample}"
            if key in seen:
                raise RunnerError(f"suite {suite.name!r}: duplicate probe key {key!r}; fix the suite's probe ids")
            seen.add(key)
            items.append(PlanItem(key, probe, sample))
    return items


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _owner_alive(owner: dict[str, Any] | None) -> bool:
    """True when ``owner`` names another live process on this host."""
    if not owner or owner.get("host") != socket.gethostname():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) is not alive for our purposes.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def describe_errors(error_kinds: dict[str, int], error_examples: dict[str, str] | None = None) -> str:
    """The failed attempts of a run for a message, most frequent kind first, each with the server's words:
    ``http_error=16 attempts: HTTP 401: Incorrect API key provided (code=invalid_api_key)``; ``"no response"``
    when there is none (:attr:`RunSummary.error_kinds` / :attr:`RunSummary.error_examples`)."""
    ex = error_examples or {}
    parts = [f"{k}={n} attempt{'s' if n != 1 else ''}" + (f": {ex[k]}" if ex.get(k) else "")
             for k, n in sorted(error_kinds.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "; ".join(parts) or "no response"


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def summarize_run(store: Store, run_id: str, *, elapsed_s: float | None = None, resumed: bool = False) -> RunSummary:
    """Figures of run ``run_id`` from the database (all sessions of the run).

    Raises:
        RunnerError: no such run.
    """
    from sqlalchemy import func, select

    from auditor.report.common import concurrency_line, usage_note
    from auditor.store.models import ProbeAttempt
    from probes.wire import describe_error

    with store.session() as s:
        det = q.run_detail(s, run_id)
        if det is None:
            raise RunnerError(f"no run {run_id!r} in {store.display_url}")
        kinds: dict[str, int] = {}
        examples: dict[str, tuple[int, str]] = {}
        for err, n in s.execute(
            select(ProbeAttempt.error, func.count())
            .where(ProbeAttempt.run_id == run_id, ProbeAttempt.error.is_not(None))
            .group_by(ProbeAttempt.error)
        ):
            kind, _, detail = str(err).partition(":")
            kinds[kind] = kinds.get(kind, 0) + int(n)
            if int(n) > examples.get(kind, (0, ""))[0]:
                examples[kind] = (int(n), detail.strip())
        # seconds, of the attempts that succeeded (error NULL) and recorded the figure
        lat, ttft = (
            [
                float(x)
                for x in s.scalars(
                    select(col).where(ProbeAttempt.run_id == run_id, ProbeAttempt.error.is_(None), col.is_not(None))
                )
                if x is not None  # always: selected IS NOT NULL
            ]
            for col in (ProbeAttempt.latency_s, ProbeAttempt.ttft_s)
        )
        run = det.run
        return RunSummary(
            run_id=run.id,
            provider=run.provider_name,
            suite=run.suite,
            suite_version=run.suite_version,
            status=run.status,
            probes_total=det.n_probes,
            probes_ok=det.probe_counts.get("done", 0),
            probes_failed=det.probe_counts.get("failed", 0),
            probes_pending=det.probe_counts.get("pending", 0),
            attempts=det.n_attempts,
            retries=det.n_retries,
            failed_attempts=det.n_failed_attempts,
            tokens=det.n_tokens,
            prompt_tokens=int(run.prompt_tokens or 0),
            completion_tokens=int(run.completion_tokens or 0),
            cost_usd=float(run.cost_usd or 0.0),
            http_status_counts=det.http_status_counts,
            error_kinds=kinds,
            error_examples={k: describe_error(v) for k, (_n, v) in examples.items()},
            elapsed_s=elapsed_s,
            resumed=resumed,
            latency_median_s=_median(lat),
            ttft_median_s=_median(ttft),
            usage_note=usage_note(run.summary),
            concurrency=concurrency_line(run.summary),
        )


def render_summary(summary: RunSummary, console: Any | None = None) -> None:
    """Print ``summary`` as a rich table (to ``console``, default stdout)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(
        title=f"probe run {summary.run_id} — {summary.provider} / {summary.suite} v{summary.suite_version}",
        show_header=False,
    )
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("status", summary.status + (" (resumed)" if summary.resumed else ""))
    t.add_row(
        "probes",
        f"{summary.probes_ok} ok, {summary.probes_failed} failed, {summary.probes_pending} pending / {summary.probes_total}",
    )
    t.add_row("attempts", f"{summary.attempts} ({summary.retries} retries, {summary.failed_attempts} failed attempts)")
    if summary.error_kinds:
        t.add_row("errors", describe_errors(summary.error_kinds, summary.error_examples))
    t.add_row("http status", ", ".join(f"{k}={v}" for k, v in sorted(summary.http_status_counts.items())) or "-")
    t.add_row(
        "tokens", f"{summary.tokens} normalized; usage {summary.prompt_tokens} in / {summary.completion_tokens} out"
    )
    t.add_row("cost", f"${summary.cost_usd:.6f}" + (f" ({summary.usage_note})" if summary.usage_note else ""))
    if summary.concurrency:
        t.add_row("concurrency", summary.concurrency)
    if summary.latency_median_s is not None:
        t.add_row("latency median", f"{summary.latency_median_s:.3f} s")
    if summary.ttft_median_s is not None:
        t.add_row("TTFT median", f"{summary.ttft_median_s:.3f} s")
    if summary.elapsed_s is not None:
        t.add_row("elapsed", f"{summary.elapsed_s:.1f} s")
    console.print(t)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _prepare_run(
    store: Store,
    config: Any,
    suite: Any,
    plan: list[PlanItem],
    payloads: dict[str, dict[str, Any]],
    run_id: str | None,
    resume: bool,
    kind: str,
    retry_failed: bool = False,
) -> tuple[str, bool]:
    """Create or reopen the run and insert every planned probe (one transaction). Returns
    ``(run_id, resumed)``."""
    snapshot = {
        "provider": config.safe_dump(),
        "suite": {"name": suite.name, "version": suite.version, "digest": getattr(suite, "digest", None)},
    }
    with store.session() as s:
        prov = q.upsert_provider_config(s, config)
        run = None
        resumed = False
        if run_id is not None:
            run = q.find_run(s, run_id)
            if run is None:
                raise RunnerError(
                    f"no run {run_id!r} in {store.display_url}. Fix: check the id with the dashboard or `auditor report`."
                )
            if run.provider_name != config.name:
                raise RunnerError(
                    f"run {run.id} belongs to provider {run.provider_name!r}, not {config.name!r}. Fix: pass --provider {run.provider_name}."
                )
            if run.suite not in (None, suite.name) or run.suite_version not in (None, suite.version):
                raise RunnerError(
                    f"run {run.id} used suite {run.suite} v{run.suite_version}, not {suite.name} v{suite.version}. "
                    f"Fix: pass --suite {run.suite} (same version) or start a new run."
                )
            if run.status == "running" and _owner_alive((run.summary or {}).get("runner")):
                raise RunnerError(
                    f"run {run.id} is being run by live process {run.summary['runner']}. Fix: stop that process first."
                )
            resumed = bool(q.probe_counts(s, run.id))
        elif resume:
            for cand in q.list_runs(
                s, provider=config.name, kind=kind, status=("running", "interrupted"), suite=suite.name, limit=20
            ):
                if cand.suite_version != suite.version:
                    continue
                if cand.status == "running" and _owner_alive((cand.summary or {}).get("runner")):
                    continue
                if q.probe_counts(s, cand.id).get("pending", 0) > 0:
                    run, resumed = cand, True
                    break
        if run is None:
            run = q.create_run(
                s,
                provider_name=config.name,
                provider_id=prov.id,
                kind=kind,
                model=config.model,
                suite=suite.name,
                suite_version=suite.version,
                code_version=code_version(),
                reference_model=getattr(config, "reference", None),
                config_snapshot=snapshot,
            )
        else:
            if run.provider_id is None:
                run.provider_id = prov.id
            if run.suite is None:
                run.suite, run.suite_version = suite.name, suite.version
            if not run.config_snapshot:
                run.config_snapshot = json_safe(q.redact_secrets(snapshot))
        if retry_failed and resumed:
            q.reset_failed_probes(s, run.id)
        # Refuse to mix configurations: stored requests must equal the rebuilt ones.
        stored = {p.probe_key: p.request_json for p in q.list_probes(s, run.id)}
        for key, req in stored.items():
            if key not in payloads:
                raise RunnerError(
                    f"run {run.id} has probe {key!r} that suite {suite.name} v{suite.version} does not plan. Fix: start a new run."
                )
            if req != json_safe(q.redact_secrets(payloads[key])):
                raise RunnerError(
                    f"run {run.id}: the request for {key!r} differs from the stored one (provider config or suite changed). "
                    "Fix: restore the old config, or start a new run (--new)."
                )
        q.add_planned_probes(
            s,
            run.id,
            (
                q.PlannedProbe(
                    it.probe_key,
                    payloads[it.probe_key],
                    getattr(it.probe, "workload", None),
                    getattr(it.probe, "mode", None),
                )
                for it in plan
            ),
        )
        summary = dict(run.summary or {})
        summary["runner"] = _owner()
        run.summary = json_safe(summary)
        run.status = "running"
        run.finished_at = None
        return run.id, resumed


async def _send_pending(client: Any, keys: list[str], payloads: dict[str, dict[str, Any]], writer: ThreadPoolExecutor,
                        attempts: AttemptWriter, display: ProgressDisplay, n_max: int, n_workers: int,
                        deadline_s: float | None) -> bool:
    """Send the pending probes ``keys`` on ``n_workers`` workers, storing every attempt in order on
    ``writer``; stop at the first connection refused (``client.unreachable``). Returns True when the
    deadline cut the session (the requests in flight were cancelled; their probes stay pending).

    Raises:
        _WorkerInterrupt: a ``KeyboardInterrupt``/``SystemExit`` inside a worker (the progress callback),
            after every worker was cancelled and awaited; other exceptions likewise.
    """
    finalized: set[str] = set()
    state = display.state
    loop = asyncio.get_running_loop()

    async def on_attempt(key: str, rec: Any) -> None:
        final = rec.error is None or not rec.retryable or rec.attempt_no >= n_max
        outcome = await loop.run_in_executor(writer, attempts.persist, key, rec, final)
        state.attempts += 1
        if rec.attempt_no > 1:
            state.retries += 1
        if outcome is not None:
            finalized.add(key)
        display.count(outcome)

    queue: asyncio.Queue[str] = asyncio.Queue()
    for key in keys:
        queue.put_nowait(key)

    async def work() -> None:
        while client.unreachable is None:  # a first connection refused: the rest would fail the same way
            try:
                key = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result = await client.send(payloads[key], key=key, on_attempt=on_attempt)
            if key not in finalized and result.attempts:  # safety net: the client stopped early
                outcome = await loop.run_in_executor(writer, attempts.finalize_only, key, result.attempts[-1])
                if outcome is not None:
                    finalized.add(key)
                display.count(outcome)
            display.report()

    async def worker() -> None:
        try:
            await work()
        except (KeyboardInterrupt, SystemExit) as exc:  # see _WorkerInterrupt
            raise _WorkerInterrupt(exc) from None

    workers = [asyncio.create_task(worker()) for _ in range(n_workers)]
    deadline = asyncio.timeout(deadline_s)  # None: no deadline
    try:
        async with deadline:
            await asyncio.gather(*workers)
    except BaseException as exc:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if not (isinstance(exc, TimeoutError) and deadline.expired()):
            raise
        return True
    return False


def _close_session(store: Store, rid: str, status: str, *, unreachable: str | None, deadline_s: float | None,
                   deadline_budget_s: float | None, deadline_hit: bool, t_start: float, usage_est: Any,
                   conc: Any) -> None:
    """The session's last write: the run's status from its probe counts (``completed`` with probes
    pending is ``interrupted``; with none done, ``failed``), the failure reason of an unreachable
    endpoint, and the summary (deadline, session time, estimated usage, concurrency changes). A
    failure here is suppressed: the attempts are stored already."""
    with contextlib.suppress(Exception), store.session() as s:
        counts = q.probe_counts(s, rid)
        if status == "completed" and counts.get("pending", 0):
            status = "interrupted"
        elif status == "completed" and counts.get("failed", 0) and not counts.get("done", 0):
            status = "failed"  # nothing succeeded: wrong URL, key or model; fix and --retry-failed
        run = q.get_run(s, rid)
        assert run is not None  # _prepare_run made it (a failure is suppressed like any other here)
        if unreachable is not None:  # stopped at the first connection refused: the pending probes can resume
            run.failure_reason = unreachable
        summary = dict(run.summary or {})
        summary.pop("runner", None)
        if deadline_s is not None:
            summary["deadline"] = {
                "deadline_s": float(deadline_budget_s if deadline_budget_s is not None else deadline_s),
                "reached": deadline_hit,
                "elapsed_s": round(time.perf_counter() - t_start, 3),
                "done": counts.get("done", 0), "failed": counts.get("failed", 0),
                "pending": counts.get("pending", 0)}
        summary["last_session_s"] = time.perf_counter() - t_start
        usage_est.record(summary)
        if conc is not None and conc.changes:
            summary["concurrency"] = conc.stats()
        run.summary = json_safe(summary)
        q.set_run_status(s, rid, status)


async def run_probes_async(
    store: Store,
    config: Any,
    suite: Any,
    run_id: str | None = None,
    resume: bool = True,
    progress: bool | Callable[[RunProgress], None] | None = True,
    *,
    kind: str = "probe",
    transport: Any | None = None,
    api_key: str | None = None,
    concurrency: int | None = None,
    max_attempts: int | None = None,
    stream: bool | None = None,
    sleep: Callable[[float], Any] | None = None,
    console: Any | None = None,
    on_start: Callable[[str, bool], None] | None = None,
    retry_failed: bool = False,
    deadline_s: float | None = None,
    deadline_budget_s: float | None = None,
) -> str:
    """Async core of :func:`run_probes` (same arguments); returns the run id.

    Cancellation (Ctrl-C, SIGTERM via the CLI) marks the run ``interrupted`` and re-raises; a
    ``KeyboardInterrupt``/``SystemExit`` raised inside a worker (the progress callback) does too,
    after every worker has been cancelled and awaited, raised as ``_WorkerInterrupt`` (which
    :func:`run_probes` unwraps).
    """
    from probes.client import ProbeClient
    from probes.wire import build_payload

    t_start = time.perf_counter()
    if api_key is None:
        api_key = config.resolve_api_key()  # ConfigError early, before any row is written
    plan = plan_suite(suite)
    payloads = {
        it.probe_key: build_payload(config.api, it.probe, config, sample=it.sample, stream=stream) for it in plan
    }
    rid, resumed = _prepare_run(store, config, suite, plan, payloads, run_id, resume, kind, retry_failed)
    if on_start is not None:
        on_start(rid, resumed)

    with store.session() as s:
        pending = [(p.id, p.probe_key, p.n_attempts) for p in q.pending_probes(s, rid)]
        counts = q.probe_counts(s, rid)
    total = sum(counts.values())
    state = RunProgress(rid, total, counts.get("done", 0) + counts.get("failed", 0), counts.get("done", 0),
                        counts.get("failed", 0), 0, 0)
    if concurrency is not None:
        config = config.model_copy(
            update={"rate_limits": config.rate_limits.model_copy(update={"concurrency": int(concurrency)})}
        )
    n_max = int(max_attempts or config.retry.max_attempts)
    attempts = AttemptWriter(store, rid, config, payloads, pending, [api_key] if api_key else [])
    # All database writes happen on one writer thread, so the event loop keeps reading other
    # responses (TTFT and chunk timing stay accurate) and SQLite sees a single writer. The client
    # awaits on_attempt before its next try or backoff, so attempts are stored in order.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="auditor-db-writer")
    display = ProgressDisplay(progress, state, config.name, console)

    status = "failed"
    unreachable: str | None = None
    conc: Any = None  # the client's adaptive concurrency limit (its width changes go in the summary)
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    sigterm = False
    deadline_hit = False
    prev_sigterm: Any = None
    if me is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            prev_sigterm = signal.getsignal(signal.SIGTERM)
            loop.add_signal_handler(signal.SIGTERM, me.cancel)  # SIGTERM = Ctrl-C: mark interrupted
            sigterm = True
    try:
        async with ProbeClient(config, transport=transport, api_key=api_key, max_attempts=n_max, sleep=sleep) as client:
            conc = client.concurrency
            n_workers = max(1, min(config.rate_limits.concurrency, len(pending) or 1))
            deadline_hit = await _send_pending(client, [key for _pid, key, _n in pending], payloads, writer, attempts,
                                               display, n_max, n_workers, deadline_s)
            unreachable = client.unreachable
        status = "completed" if unreachable is None else "failed"
    except (asyncio.CancelledError, KeyboardInterrupt, _WorkerInterrupt):
        status = "interrupted"
        raise
    finally:
        writer.shutdown(wait=True)  # a write in progress completes (or fails) as one transaction
        if sigterm:
            loop.remove_signal_handler(signal.SIGTERM)  # leaves SIG_DFL: put the caller's handler back
            with contextlib.suppress(TypeError, ValueError):  # (auditor schedule run's checkpoint, issue 37 item 10)
                signal.signal(signal.SIGTERM, prev_sigterm if prev_sigterm is not None else signal.SIG_DFL)
        display.stop()
        _close_session(store, rid, status, unreachable=unreachable, deadline_s=deadline_s,
                       deadline_budget_s=deadline_budget_s, deadline_hit=deadline_hit, t_start=t_start,
                       usage_est=attempts.usage_est, conc=conc)
    return rid


def run_probes(
    store: Store,
    provider_config: Any,
    suite: Any,
    run_id: str | None = None,
    resume: bool = True,
    progress: bool | Callable[[RunProgress], None] | None = True,
    **kwargs: Any,
) -> str:
    """Run (or resume) a probes-only run of ``suite`` against ``provider_config``; return its run id.

    Args:
        store: an open store (:func:`auditor.store.open_store`).
        provider_config: a ``probes.config.ProviderConfig``.
        suite: a ``probes.suites.Suite`` (name, version, probes with ``n_samples``).
        run_id: resume this run (a unique prefix is enough) instead of starting one.
        resume: with ``run_id=None``, continue the newest unfinished run of the same provider,
            suite and suite version if there is one (its owner process must be dead);
            ``False`` always starts a new run.
        progress: ``True`` for a rich progress bar on stderr, a callable receiving
            :class:`RunProgress` after each probe, or ``None``/``False``.
        **kwargs: ``kind`` ('probe'|'audit'), ``transport`` (httpx transport, tests),
            ``api_key``, ``concurrency``, ``max_attempts``, ``stream``, ``sleep``, ``console``,
            ``on_start(run_id, resumed)`` (called once the run and its probes are stored),
            ``retry_failed`` (when resuming, put ``failed`` probes back to ``pending``),
            ``deadline_s`` (wall-clock seconds for this session's sending: past it the requests in
            flight are cancelled, their probes stay ``pending``, the run ends ``interrupted`` and
            its summary's ``deadline`` says so — ``{deadline_s, reached, elapsed_s, done, failed,
            pending}``; recorded whenever given; issue 37, item 9), ``deadline_budget_s`` (the whole
            audit's deadline to record instead, when ``deadline_s`` is what remains of it).

    Run status at the end: ``completed`` (no probe pending), ``failed`` (every probe failed,
    e.g. a wrong URL or key; or the endpoint refused the first connection before ever answering: the run
    stops at once, its other probes stay pending for a resume), ``interrupted`` (cancelled; resumable).

    Raises:
        probes.config.ConfigError: the API key env var is missing.
        RunnerError: the run cannot be resumed (see message).
        KeyboardInterrupt: on Ctrl-C or SIGTERM, after marking the run ``interrupted``.
    """
    try:
        return asyncio.run(run_probes_async(store, provider_config, suite, run_id, resume, progress, **kwargs))
    except asyncio.CancelledError:  # SIGTERM cancelled the run (already marked interrupted)
        raise KeyboardInterrupt("run cancelled") from None
    except _WorkerInterrupt as e:  # raised in a worker (the progress callback); the run is marked interrupted
        raise e.exc from None
