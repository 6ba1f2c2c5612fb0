"""Query functions on a migrated SQLite file (and PostgreSQL for the JSON/NaN/timezone paths)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

from auditor.store import open_store
from auditor.store import queries as q


@pytest.fixture
def store(sqlite_url):
    st = open_store(sqlite_url)
    yield st
    st.close()


@dataclass
class FakeDetectorResult:  # same fields as auditor.detectors.DetectorResult
    name: str
    statistic: float
    p_value: float
    effect: float
    effect_ci: tuple[float, float]
    n: int
    evidence: list[dict] = field(default_factory=list)
    ran: bool = True
    reason: str | None = None
    p_adjusted: float | None = None


def _seed_run(s, name="prov", suite="default", kind="probe", **kw):
    q.upsert_provider(s, name, base_url="http://x/v1", model="m", api="chat", config={"name": name})
    return q.create_run(s, provider_name=name, kind=kind, suite=suite, suite_version="1", **kw)


def test_provider_upsert_and_secret_redaction(store):
    with store.session() as s:
        p = q.upsert_provider(
            s,
            "acme",
            base_url="http://a/v1",
            model="m1",
            api="chat",
            config={
                "api_key_env": "ACME_KEY",
                "headers": {"X-Api-Key": "sk-secret-1"},
                "api_key": "sk-secret-2",
                "timeout_s": 3,
            },
        )
        first_id = p.id
    with store.session() as s:
        p = q.upsert_provider(s, "acme", base_url="http://b/v1", model="m2", config={"password": "pw"})
        assert p.id == first_id and p.base_url == "http://b/v1" and p.model == "m2"
        assert p.config_json == {"password": "[REDACTED]"}
        assert len(q.list_providers(s)) == 1
    red = q.redact_secrets(
        {
            "api_key_env": "ACME_KEY",
            "headers": {"Authorization": "Bearer sk-1"},
            "nested": [{"secret": "x"}],
            "max_tokens": 5,
        }
    )
    assert red == {
        "api_key_env": "ACME_KEY",
        "headers": {"Authorization": "[REDACTED]"},
        "nested": [{"secret": "[REDACTED]"}],
        "max_tokens": 5,
    }
    assert q.scrub("key sk-abc in text sk-abc", ["sk-abc", None, ""]) == "key [REDACTED] in text [REDACTED]"


def test_runs_probes_attempts_tokens_detail(store):
    with store.session() as s:
        run = _seed_run(s, config_snapshot={"provider": {"headers": {"Authorization": "Bearer sk-zzz"}}})
        rid = run.id
        assert len(rid) == 12 and run.provider_id is not None
        assert run.config_snapshot["provider"]["headers"]["Authorization"] == "[REDACTED]"
        n = q.add_planned_probes(s, rid, [q.PlannedProbe(f"p{i}#0", {"i": i}, "chat", "greedy") for i in range(3)])
        assert n == 3
        # idempotent: replanning inserts nothing, a duplicate key inside one plan is an error
        assert (
            q.add_planned_probes(s, rid, [q.PlannedProbe("p0#0", {"i": 0}), {"probe_key": "p9#0", "request_json": {}}])
            == 1
        )
        with pytest.raises(ValueError, match="duplicate"):
            q.add_planned_probes(s, rid, [q.PlannedProbe("z#0", {}), q.PlannedProbe("z#0", {})])
    with store.session() as s:
        p0 = q.get_probe(s, rid, "p0#0")
        q.add_probe_attempt(s, probe_id=p0.id, run_id=rid, http_status=429, error="rate_limited: x", latency_s=0.1)
        q.add_probe_attempt(
            s,
            probe_id=p0.id,
            run_id=rid,
            http_status=200,
            latency_s=0.2,
            response_text="{}",
            ttft_s=float("nan"),
            chunk_gaps_s=[0.01, 0.02],
            tokens_per_chunk=[1, 1],
        )
        toks = [
            {
                "index": 0,
                "token": "Hi",
                "bytes": b"Hi",
                "logprob": -0.5,
                "top_logprobs": [("Hi", b"Hi", -0.5), ("Yo", None, -1.5)],
                "anomalies": [],
            },
            {
                "index": 1,
                "token": "!",
                "bytes": None,
                "logprob": None,
                "top_logprobs": [],
                "anomalies": ["nonfinite_logprob"],
            },
        ]
        q.mark_probe_done(
            s, p0.id, text="Hi!", finish_reason="stop", anomalies=["x"], usage={"prompt_tokens": 3}, tokens=toks
        )
        q.add_run_usage(s, rid, 3, 2, 0.5)
        q.add_run_usage(s, rid, 1, 1, 0.25)
        with pytest.raises(ValueError):
            q.mark_probe_done(s, p0.id, status="pending")
        p1 = q.get_probe(s, rid, "p1#0")
        q.add_probe_attempt(s, probe_id=p1.id, run_id=rid, http_status=500, error="server_error: boom")
        q.mark_probe_done(s, p1.id, status="failed", anomalies=["server_error"])
    with store.session() as s:
        assert q.next_attempt_no(s, p0.id) == 3
        assert [a.attempt_no for a in q.attempts_for_probe(s, p0.id)] == [1, 2]
        atts = q.attempts_for_probe(s, p0.id)
        assert atts[1].ttft_s is None and atts[1].chunk_gaps_s == [0.01, 0.02]
        assert atts[0].started_at.tzinfo is not None
        probe = q.get_probe(s, rid, "p0#0")
        assert probe.status == "done" and probe.n_attempts == 2 and probe.text == "Hi!"
        tk = q.tokens_for_probe(s, p0.id)
        assert [t.position for t in tk] == [0, 1]
        assert tk[0].token_bytes == b"Hi" and tk[0].top_logprobs == [["Hi", -0.5], ["Yo", -1.5]]
        assert tk[1].logprob is None and tk[1].anomalies == ["nonfinite_logprob"]
        assert list(q.tokens_per_probe(s, rid)) == ["p0#0"]
        assert q.probe_counts(s, rid) == {"done": 1, "failed": 1, "pending": 2}
        assert [p.probe_key for p in q.pending_probes(s, rid)] == ["p2#0", "p9#0"]
        det = q.run_detail(s, rid)
        assert det.n_probes == 4 and det.n_attempts == 3 and det.n_retries == 1 and det.n_failed_attempts == 2
        assert det.n_tokens == 2 and det.http_status_counts == {"200": 1, "429": 1, "500": 1}
        run = q.get_run(s, rid)
        assert (run.prompt_tokens, run.completion_tokens, run.cost_usd) == (4, 3, 0.75)
    # a unique violation on (probe_id, attempt_no) rolls the whole transaction back
    with pytest.raises(sa.exc.IntegrityError), store.session() as s:
        q.add_probe_attempt(s, probe_id=p0.id, run_id=rid, attempt_no=1)
    with store.session() as s:
        assert q.get_probe(s, rid, "p0#0").n_attempts == 2


def test_list_runs_filters_latest_and_resumable(store):
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    with store.session() as s:
        ids = []
        for i, (prov, kind, status) in enumerate(
            [
                ("a", "audit", "completed"),
                ("a", "audit", "completed"),
                ("b", "audit", "failed"),
                ("b", "probe", "interrupted"),
            ]
        ):
            r = _seed_run(s, prov, kind=kind)
            r.status = status
            r.started_at = t0 + dt.timedelta(hours=i)
            ids.append(r.id)
        q.add_planned_probes(s, ids[3], [q.PlannedProbe("x#0", {})])
    with store.session() as s:
        assert [r.id for r in q.list_runs(s, provider="a")] == [ids[1], ids[0]]
        assert [r.id for r in q.list_runs(s, kind="audit", status=["completed", "failed"], newest_first=False)] == ids[
            :3
        ]
        assert [r.id for r in q.list_runs(s, since=t0 + dt.timedelta(minutes=90))] == [ids[3], ids[2]]
        assert [r.id for r in q.list_runs(s, limit=1, offset=1)] == [ids[2]]
        latest = q.latest_run_per_provider(s)
        assert {k: v.id for k, v in latest.items()} == {"a": ids[1]}
        assert {k: v.id for k, v in q.latest_run_per_provider(s, status=None).items()} == {"a": ids[1], "b": ids[2]}
        assert q.find_resumable_run(s, provider_name="b", suite="default").id == ids[3]
        assert q.find_resumable_run(s, provider_name="a", suite="default") is None
        assert q.find_run(s, ids[0][:8]).id == ids[0]
        assert q.get_run(s, ids[0]).started_at == t0
        q.set_run_status(s, ids[3], "completed")
        assert q.get_run(s, ids[3]).finished_at is not None
        with pytest.raises(ValueError):
            q.create_run(s, provider_name="a", kind="bogus")
        assert q.delete_run(s, ids[3]) and q.get_run(s, ids[3]) is None


def _detector_and_verdict(store):
    with store.session() as s:
        rid = _seed_run(s, kind="audit").id
        rows = q.store_detector_results(
            s,
            rid,
            [
                FakeDetectorResult(
                    "greedy-match", 3.0, 0.01, 0.2, (0.1, float("inf")), 50, evidence=[{"pos": 3, "kl": float("nan")}]
                ),
                {
                    "name": "logprob-kl",
                    "statistic": float("nan"),
                    "p_value": 1.0,
                    "effect": 0.0,
                    "effect_ci": (0.0, 0.0),
                    "n": 0,
                    "ran": False,
                    "reason": "no logprobs",
                },
            ],
        )
        assert len(rows) == 2
        q.store_verdict(s, rid, "INCONCLUSIVE", "too few tokens", {"alpha": 0.01})
        q.store_verdict(s, rid, "PASS", "all fine", {"alpha": 0.01})
    with store.session() as s:
        dets = q.detector_results_for_run(s, rid)
        assert dets[0].effect_ci_high is None and dets[0].evidence == [{"pos": 3, "kl": None}]
        assert dets[1].statistic is None and dets[1].ran is False
        assert q.get_verdict(s, rid).verdict == "PASS"
        run = q.get_run(s, rid)
        assert (run.verdict, run.verdict_reason) == ("PASS", "all fine")
        q.store_detector_results(s, rid, [FakeDetectorResult("x", 1, 0.5, 0, (0, 1), 3)])
        assert [d.name for d in q.detector_results_for_run(s, rid)] == ["x"]
        det = q.run_detail(s, rid)
        assert det.verdict.verdict == "PASS" and len(det.detector_results) == 1


def test_detector_results_and_verdict_sqlite(store):
    _detector_and_verdict(store)


@pytest.mark.postgres
def test_detector_results_and_verdict_postgres(pg_url):
    st = open_store(pg_url)
    try:
        _detector_and_verdict(st)
        with st.session() as s:
            run = q.list_runs(s)[0]
            assert run.started_at.tzinfo is not None and run.started_at.utcoffset() == dt.timedelta(0)
    finally:
        st.close()


def test_reference_cache(store):
    k1 = q.reference_cache_key("abc", "float32", [1, 2], [3], 20)
    assert k1 == q.reference_cache_key("abc", "float32", [1, 2], [3], 20)
    assert (
        len(
            {
                k1,
                q.reference_cache_key("abc", "bfloat16", [1, 2], [3], 20),
                q.reference_cache_key("abc", "float32", [1], [2, 3], 20),
                q.reference_cache_key("abd", "float32", [1, 2], [3], 20),
                q.reference_cache_key("abc", "float32", [1, 2], [3], 5),
            }
        )
        == 5
    )
    with store.session() as s:
        assert q.reference_cache_get(s, k1) is None
        q.reference_cache_put(s, k1, "abc", b"\x00npz")
        q.reference_cache_put(s, k1, "abc", b"\x01npz")
    with store.session() as s:
        assert q.reference_cache_get(s, k1) == b"\x01npz"
        assert q.reference_cache_get_many(s, [k1, "nope"]) == {k1: b"\x01npz"}


def test_schedules_alerts_calibration(store):
    # schedules and alerts have one write path each: auditor.watch.scheduler and auditor.watch.alerts
    # (record_verdict_change, tested in tests/scheduler); the CLI and dashboard read them here
    from auditor.store.dashboard_queries import list_schedules, recent_alerts
    from auditor.watch.scheduler import MIN_INTERVAL_S, add_schedule, remove_schedule

    now = dt.datetime.now(dt.UTC)
    with store.session() as s:
        a = add_schedule(s, "p", 3600, now=now)
        add_schedule(s, "p", MIN_INTERVAL_S, first_run_at=now + dt.timedelta(hours=1), now=now)
        with pytest.raises(ValueError, match="--every"):
            add_schedule(s, "p", MIN_INTERVAL_S - 1)
        rows = list_schedules(s)
        assert [r["every_seconds"] for r in rows] == [3600, MIN_INTERVAL_S] and all(r["enabled"] for r in rows)
        assert remove_schedule(s, a.id) and not remove_schedule(s, a.id)
        assert [r["id"] for r in list_schedules(s)] == [rows[1]["id"]]
        assert recent_alerts(s) == []
        q.add_calibration_result(
            s,
            model="m",
            profile="honest-fp32",
            budget_tokens=1000,
            audits=20,
            rejection_rate=0.05,
            ci_low=0.0,
            ci_high=float("nan"),
            details={"x": (1, 2)},
        )
        row = q.list_calibration_results(s, profile="honest-fp32")[0]
        assert row.ci_high is None and row.details == {"x": [1, 2]} and row.created_at.tzinfo is not None


def test_json_safe():
    import numpy as np

    from auditor.util import json_safe

    assert json_safe({"a": (1.0, float("nan")), "b": np.float32(2.5), "c": np.arange(2), "d": b"\xff"}) == {
        "a": [1.0, None],
        "b": 2.5,
        "c": [0, 1],
        "d": "\xff",
    }
    assert math.isnan(float("nan"))
