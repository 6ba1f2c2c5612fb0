"""Issue 37, item 10: a scheduled audit stopped by SIGTERM is checkpointed, not lost.

The run is stored ``interrupted`` with the reason (run summary ``interrupted``), its slot is given
back (not counted as done) and the next ``schedule run`` resumes that same run. In-process with a
runner that is interrupted, and end to end: ``auditor schedule run --once`` in a subprocess, sent
SIGTERM while it probes a slow provider (``reference = "none"``: no model needed), then run again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from auditor.check.errors import AuditInterrupted
from auditor.store import queries as q
from auditor.store.models import AuditRun, Schedule
from auditor.watch.scheduler import AuditScheduler, add_schedule

from .conftest import T0

REPO = Path(__file__).resolve().parents[2]


class InterruptOnce:
    """First call: creates a running run and raises AuditInterrupted (as run_check does on SIGTERM);
    later calls: record their ``resume`` and complete that run."""

    def __init__(self, store) -> None:
        self.store = store
        self.calls: list[dict] = []

    def __call__(self, provider_name, *, suite, budget_tokens, db_url, **kw):
        self.calls.append(dict(kw))
        with self.store.session() as s:
            if len(self.calls) == 1:
                run = AuditRun(provider_name=provider_name, kind="audit", status="running", started_at=T0)
                s.add(run)
                s.flush()
                rid = run.id
            else:
                rid = kw["resume"]
                q.set_run_status(s, rid, "completed")
        if len(self.calls) == 1:
            raise AuditInterrupted(rid)
        return {"run_id": rid, "verdict": "PASS"}


def test_interrupted_audit_gives_its_slot_back_and_is_resumed(store, clock) -> None:
    with store.session() as s:
        sid = add_schedule(s, "prov", 3600, now=T0).id
    said: list[str] = []
    runner = InterruptOnce(store)
    sched = AuditScheduler(store, runner=runner, clock=clock, echo=said.append)
    with pytest.raises(KeyboardInterrupt):
        sched.run_due()
    with store.session() as s:
        sch = s.get(Schedule, sid)
        assert sch is not None and sch.next_run_at.replace(tzinfo=None) == T0.replace(tzinfo=None)  # slot not done
        (run,) = q.list_runs(s, provider="prov")
        assert run.status == "interrupted"
        mark = run.summary["interrupted"]
        assert mark["schedule_id"] == sid and "SIGTERM" in mark["reason"] and "resumes it" in mark["reason"]
        rid = run.id
    assert sched.interrupted == rid
    assert any("the slot is not counted as done" in m for m in said)
    clock.advance(minutes=1)
    (out,) = sched.run_due()  # the same slot again, resuming the same run
    assert runner.calls[1] == {"resume": rid}
    assert out.run_id == rid and out.error is None and out.due_at.replace(tzinfo=None) == T0.replace(tzinfo=None)
    with store.session() as s:
        assert q.get_run(s, rid).status == "completed"
        assert len(q.list_runs(s, provider="prov")) == 1
    assert sched.run_due() == []  # done: the next slot is an hour later


def test_a_failed_resume_is_not_tried_again(store, clock) -> None:
    with store.session() as s:
        add_schedule(s, "prov", 3600, now=T0)
    runner = InterruptOnce(store)
    sched = AuditScheduler(store, runner=runner, clock=clock, echo=None)
    with pytest.raises(KeyboardInterrupt):
        sched.run_due()

    def broken(provider_name, *, suite, budget_tokens, db_url, **kw):
        runner.calls.append(dict(kw))
        raise ValueError("config changed")

    sched.runner = broken
    (out,) = sched.run_due()
    assert out.error and "config changed" in out.error and "resume" in runner.calls[-1]
    clock.advance(hours=1, minutes=1)
    sched.run_due()
    assert "resume" not in runner.calls[-1]  # abandoned: a fresh audit


# -- end to end: SIGTERM to `auditor schedule run --once` -------------------------------------------

def _slow_plain_app(delay_s: float):
    from tests.audit._plain_server import create_plain_app

    app = create_plain_app("plain")

    @app.middleware("http")
    async def slow(request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path.endswith("/chat/completions"):
            await asyncio.sleep(delay_s)
        return await call_next(request)

    return app


def _cli(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "auditor", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_during_schedule_run_is_resumed_by_the_next(tmp_path: Path, db_url: str) -> None:
    from auditor.store.db import open_store
    from simulator.server import ServerThread

    srv = ServerThread(_slow_plain_app(0.4)).start()
    try:
        (tmp_path / "providers.toml").write_text(
            f'[providers.plain]\nbase_url = "{srv.base_url}"\nmodel = "plain"\napi = "chat"\nreference = "none"\n'
            "timeout_s = 30\n\n[providers.plain.capabilities]\nmax_top_logprobs = 5\nlogprobs = true\n"
            "streaming = false\n\n[providers.plain.rate_limits]\nconcurrency = 1\n")
        env = {**os.environ, "PYTHONPATH": str(REPO), "SPEC_AUDITOR_PREFLIGHT": "0"}
        st = open_store(db_url)
        with st.session() as s:
            sid = add_schedule(s, "plain", 3600, suite="smoke").id
            due = s.get(Schedule, sid).next_run_at
        proc = _cli(["schedule", "run", "--once", "--db", db_url], tmp_path, env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until some probes are stored, then SIGTERM
            with st.session() as s:
                runs = q.list_runs(s, provider="plain")
                if runs and q.probe_counts(s, runs[0].id).get("done", 0) >= 3:
                    break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
        assert "resumes it" in out and "Traceback" not in out
        with st.session() as s:
            (run,) = q.list_runs(s, provider="plain")
            counts = q.probe_counts(s, run.id)
            assert run.status == "interrupted", out
            assert run.summary["interrupted"]["schedule_id"] == sid
            sch = s.get(Schedule, sid)
            assert sch.next_run_at == due  # the slot is not counted as done
            rid, total = run.id, sum(counts.values())
        assert counts.get("done", 0) >= 3 and counts.get("pending", 0) > 0
        # the next `schedule run` resumes the same run and finishes it
        proc = _cli(["schedule", "run", "--once", "--db", db_url], tmp_path, env)
        out, _ = proc.communicate(timeout=300)
        assert f"resuming interrupted run {rid}" in out, out
        with st.session() as s:
            runs = q.list_runs(s, provider="plain")
            assert [r.id for r in runs] == [rid]
            assert runs[0].status == "completed", out
            assert q.probe_counts(s, rid) == {"done": total}
            assert s.get(Schedule, sid).next_run_at > due
        st.close()
    finally:
        srv.stop()
