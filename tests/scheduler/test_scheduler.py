"""Table-driven scheduler with a fake clock: timing, restarts, downtime, alerts."""

from __future__ import annotations

import datetime as dt
import sys
import types

import pytest
from sqlalchemy import func, select

from auditor.store.models import Alert, Schedule
from auditor.watch.scheduler import (
    AuditScheduler,
    add_schedule,
    format_interval,
    next_slot,
    parse_interval,
    remove_schedule,
)

from .conftest import T0, FakeRunner

H = dt.timedelta(hours=1)


def _add(store, clock, every="6h", **kw):
    with store.session() as s:
        return add_schedule(s, "sim-int4", parse_interval(every), now=clock(), **kw).id


def _scheduler(store, clock, runner, **kw):
    return AuditScheduler(store, runner=runner, clock=clock, echo=None, **kw)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6h", 21600), ("30m", 1800), ("1d", 86400), ("1h30m", 5400), ("90s", 90), ("3600", 3600), (" 2W ", 1209600)],
)
def test_parse_interval(text, seconds):
    assert parse_interval(text) == seconds
    assert parse_interval(format_interval(seconds)) == seconds


@pytest.mark.parametrize("bad", ["", "6x", "h", "-1h", "5s", "1h 5q"])
def test_parse_interval_rejects(bad):
    with pytest.raises(ValueError, match="--every"):
        parse_interval(bad)


def test_next_slot_coalesces_missed_slots():
    every = 6 * 3600
    assert next_slot(T0, every, T0) == T0 + 6 * H
    assert next_slot(T0, every, T0 + 20 * H) == T0 + 24 * H  # three missed slots -> one run
    assert next_slot(T0 + 6 * H, every, T0) == T0 + 6 * H  # not due yet: unchanged


def test_six_hour_job_fires_at_the_right_times(store, clock):
    runner = FakeRunner(clock)
    sid = _add(store, clock)
    sched = _scheduler(store, clock, runner)
    end = T0 + 25 * H
    while clock() <= end:
        sched.run_due()
        clock.advance(minutes=10)
    assert runner.times == [T0 + k * 6 * H for k in range(5)]
    assert all(c["provider"] == "sim-int4" for c in runner.calls)
    with store.session() as s:
        row = s.get(Schedule, sid)
        assert row.last_run_at == T0 + 24 * H and row.next_run_at == T0 + 30 * H


def test_restart_runs_nothing_twice(db_url, clock):
    from auditor.store.db import open_store

    runner = FakeRunner(clock)
    first = open_store(db_url)
    sid = _add(first, clock)
    assert len(_scheduler(first, clock, runner).run_due()) == 1
    first.close()  # "restart": a new process, new engine, same database
    clock.advance(minutes=1)
    second = open_store(db_url)
    again = _scheduler(second, clock, runner)
    assert again.run_due() == []
    clock.advance(hours=6)
    assert len(again.run_due()) == 1
    # Two schedulers racing for the same slot: the conditional UPDATE lets only one claim it.
    clock.advance(hours=6)
    with second.session() as s:
        due = s.get(Schedule, sid).next_run_at
    other = _scheduler(open_store(db_url), clock, runner)
    assert again._claim(sid, due, 6 * 3600, clock()) is not None
    assert other._claim(sid, due, 6 * 3600, clock()) is None
    assert other.run_due() == []  # the slot was taken
    assert runner.times == [T0, T0 + 6 * H + dt.timedelta(minutes=1)]
    second.close()
    other.store.close()


def test_missed_runs_after_downtime_run_once(store, clock):
    runner = FakeRunner(clock)
    sid = _add(store, clock)
    sched = _scheduler(store, clock, runner)
    sched.run_due()
    clock.advance(hours=20)  # down for 20 h: slots at +6, +12, +18 missed
    out = sched.run_due()
    assert len(out) == 1 and out[0].due_at == T0 + 6 * H and out[0].next_run_at == T0 + 24 * H
    assert sched.run_due() == []
    clock.advance(hours=4)  # +24 h: back on the original cadence
    assert len(sched.run_due()) == 1
    assert len(runner.calls) == 3
    with store.session() as s:
        assert s.get(Schedule, sid).next_run_at == T0 + 30 * H


def test_verdict_change_produces_exactly_one_alert(store, clock):
    lines: list[str] = []
    runner = FakeRunner(clock, verdicts=["PASS", "PASS", "QUANTIZATION", "QUANTIZATION"])
    _add(store, clock)
    sched = AuditScheduler(store, runner=runner, clock=clock, echo=lines.append)
    outcomes = []
    for _ in range(4):
        outcomes += sched.run_due()
        clock.advance(hours=6)
    assert [o.verdict for o in outcomes] == ["PASS", "PASS", "QUANTIZATION", "QUANTIZATION"]
    assert [o.alert_id is not None for o in outcomes] == [False, False, True, False]
    with store.session() as s:
        alerts = s.scalars(select(Alert)).all()
        assert len(alerts) == 1
        a = alerts[0]
        assert (a.previous_verdict, a.verdict, a.run_id) == ("PASS", "QUANTIZATION", outcomes[2].run_id)
        assert a.delivered and a.webhook_status is None
    assert sum(line.startswith("ALERT sim-int4: verdict changed PASS -> QUANTIZATION") for line in lines) == 1
    # Re-recording the same run (a retry) adds nothing.
    from auditor.watch.alerts import record_verdict_change

    with store.session() as s:
        assert record_verdict_change(s, outcomes[2].run_id, echo=None) is None
        assert s.scalar(select(func.count()).select_from(Alert)) == 1


def test_failed_audit_is_reported_and_schedule_advances(store, clock):
    lines: list[str] = []
    runner = FakeRunner(clock, fail_on={0})
    _add(store, clock)
    sched = AuditScheduler(store, runner=runner, clock=clock, echo=lines.append)
    [out] = sched.run_due()
    assert out.error and "ConnectionError" in out.error and out.run_id is None
    assert out.next_run_at == T0 + 6 * H
    assert any("failed" in line for line in lines)
    clock.advance(hours=6)
    [ok] = sched.run_due()
    assert ok.error is None and ok.verdict == "PASS"


def test_run_forever_with_fake_sleep(store, clock):
    runner = FakeRunner(clock)
    _add(store, clock, every="1h")
    sched = _scheduler(store, clock, runner)
    sleeps: list[float] = []

    def sleep(seconds):
        sleeps.append(seconds)
        clock.sleep(seconds)

    sched.run_forever(sleep=sleep, poll_s=600, max_passes=20)
    # 20 passes, sleeping at most 10 min each: 19 sleeps x 600 s = 3 h 10 min -> runs at 0, 1 h, 2 h, 3 h
    assert runner.times == [T0 + k * H for k in range(4)]
    assert max(sleeps) <= 600


def test_disabled_and_removed_schedules_do_not_run(store, clock):
    runner = FakeRunner(clock)
    a = _add(store, clock)
    b = _add(store, clock)
    with store.session() as s:
        s.get(Schedule, a).enabled = False
        assert remove_schedule(s, b) and not remove_schedule(s, b)
    assert _scheduler(store, clock, runner).run_due() == []
    assert runner.calls == []


def test_add_schedule_validates(store, clock):
    with store.session() as s:
        with pytest.raises(ValueError, match="--provider"):
            add_schedule(s, " ", 3600)
        with pytest.raises(ValueError, match="--every"):
            add_schedule(s, "p", 10)
        with pytest.raises(ValueError, match="--budget-tokens"):
            add_schedule(s, "p", 3600, budget_tokens=0)
        sch = add_schedule(s, "p", 3600, suite="core", budget_tokens=5000, now=T0, first_run_at=T0 + H)
        assert sch.next_run_at == T0 + H and sch.suite == "core"


def test_default_runner_imports_pipeline_lazily(store, clock, monkeypatch):
    calls = []
    fake = types.ModuleType("auditor.check.pipeline")

    def run_check(provider_name, **kwargs):
        calls.append((provider_name, kwargs))
        return types.SimpleNamespace(run_id=None, verdict="PASS")

    fake.run_check = run_check
    monkeypatch.setitem(sys.modules, "auditor.check.pipeline", fake)
    with store.session() as s:
        add_schedule(s, "sim-honest", 3600, suite="core", budget_tokens=1234, now=clock())
    [out] = AuditScheduler(store, clock=clock, echo=None).run_due()
    assert calls == [("sim-honest", {"db_url": store.url, "suite": "core", "budget_tokens": 1234})]
    assert out.verdict == "PASS" and out.error is None
