"""dashboard_queries and run_detail_queries against the seeded database: figures agree with what was stored."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from auditor.store import dashboard_queries as q
from auditor.store import run_detail_queries as rdq
from auditor.store.db import make_engine
from auditor.store.models import AuditRun, ProbeAttempt


@pytest.fixture(scope="module")
def session(seeded):
    url, _ = seeded
    engine = make_engine(url)
    with Session(engine) as s:
        yield s
    engine.dispose()


def test_overview_latest_verdicts_and_sums(session, seeded):
    _, summary = seeded
    rows = q.provider_overview(session)
    assert [r["provider_name"] for r in rows] == sorted(summary["latest_verdicts"])
    for r in rows:
        assert r["verdict"] == summary["latest_verdicts"][r["provider_name"]]
        assert r["run_id"] == [
            rid for rid in summary["runs"][r["provider_name"]]
            if session.get(AuditRun, rid).verdict is not None
        ][-1]  # fmt: skip
        runs = session.scalars(select(AuditRun).where(AuditRun.provider_name == r["provider_name"])).all()
        assert r["n_runs"] == len(runs) == 4
        assert r["tokens"] == sum(x.prompt_tokens + x.completion_tokens for x in runs)
        assert r["cost_usd"] == pytest.approx(sum(x.cost_usd for x in runs))
        assert {d["name"] for d in r["detectors"]} == {"greedy-match", "logprob-kl", "sampling-gof", "self-consistency"}
    relaxed = next(r for r in rows if r["provider_name"] == "sim-relaxed")
    assert relaxed["clear_mismatch_rate"] > 0.05
    assert min(d["p_adjusted"] for d in relaxed["detectors"]) < 1e-6


def test_overview_date_filter(session):
    first = q.filter_options(session)["first"].date()
    rows = q.provider_overview(session, until=first)
    assert {r["provider_name"]: r["verdict"] for r in rows}["sim-int4"] == "PASS"
    assert all(r["n_runs"] == 1 for r in rows)
    assert q.provider_overview(session, models=["no-such-model"]) == []
    assert q.provider_overview(session, suites=["core"]) == q.provider_overview(session)


def test_verdict_changes_and_history(session, seeded):
    _, summary = seeded
    changes = q.verdict_changes(session)
    assert [(c["provider_name"], c["previous_verdict"], c["verdict"], c["run_id"]) for c in changes] == summary[
        "changes"
    ]
    hist = q.provider_history(session, "sim-int4")
    assert [h["changed_from"] for h in hist] == [None, None, "PASS", None]
    # a failed run without verdict neither changes nor resets the previous verdict
    relaxed = q.provider_history(session, "sim-relaxed")
    assert [h["status"] for h in relaxed][1] == "failed"
    assert all(h["changed_from"] is None for h in relaxed)


def test_speed_points(session):
    latest = q.speed_fidelity_points(session)
    assert len(latest) == 3 and all(p["tokens_per_s"] > 0 for p in latest)
    every = q.speed_fidelity_points(session, latest_only=False)
    assert len(every) == 11  # 12 runs, one failed without a verdict
    fast = max(latest, key=lambda p: p["tokens_per_s"])
    assert fast["verdict"] == "RELAXED_VERIFICATION"


def test_run_detail_resolves_evidence(session, seeded):
    from tests.fixtures_store import HOSTILE_TOKEN

    _, summary = seeded
    d = rdq.run_detail(session, summary["runs"]["sim-relaxed"][-1])
    assert d["strongest"] == "greedy-match"
    greedy = next(x for x in d["detectors"] if x["name"] == "greedy-match")
    ev = greedy["evidence"][0]
    view = ev["_view"]
    assert view["probe_key"] == ev["prompt_id"] and view["probe_id"] is not None
    assert view["token_text"] == HOSTILE_TOKEN == ev["token"]
    assert view["context"].endswith(" is")  # the tokens before the swapped one
    # reference ids resolved to text through stored normalized tokens
    assert view["id_text"][ev["ref_top5"][0][0]] == " 42."
    hist = d["tokens_per_chunk"]
    n_chunks = sum(
        len(x or [])
        for x in session.scalars(select(ProbeAttempt.tokens_per_chunk).where(ProbeAttempt.run_id == d["run_id"]))
    )
    assert sum(hist.values()) == n_chunks > 0
    assert rdq.run_detail(session, "no-such-run") is None


def test_probe_detail(session, seeded):
    _, summary = seeded
    run_id = summary["runs"]["sim-honest"][0]
    d = rdq.run_detail(session, run_id)
    p = rdq.probe_detail(session, d["probes"][0]["id"])
    assert p["attempts"][0]["http_status"] == 200 and "chat.completion" in p["attempts"][0]["response_text"]
    assert [t["position"] for t in p["tokens"]] == list(range(len(p["tokens"])))
    same = rdq.probe_detail(session, run_id=run_id, probe_key=p["probe_key"])
    assert same["id"] == p["id"]
    with pytest.raises(ValueError, match="probe_id"):
        rdq.probe_detail(session)


def test_calibration_and_counts(session, empty_url):
    assert len(q.calibration_table(session)) == 4
    assert q.count_runs(session) == 12
    engine = make_engine(empty_url)
    with Session(engine) as s:
        assert q.has_schema(s) and q.count_runs(s) == 0 and q.provider_overview(s) == []
        assert q.filter_options(s)["first"] is None
    engine.dispose()
    bare = make_engine("sqlite://")
    with Session(bare) as s:
        assert not q.has_schema(s) and q.count_runs(s) == 0 and q.calibration_table(s) == []
    bare.dispose()


def test_tokens_per_chunk_falls_back_to_summary(tmp_path):
    from auditor.store.db import open_store

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        s.add(AuditRun(id="r1", provider_name="p", summary={"tokens_per_chunk": {"1": 3, "4": 2}}))
        s.add(AuditRun(id="r2", provider_name="p", summary={"tokens_per_chunk": [1, 1, 2]}))
        s.add(AuditRun(id="r3", provider_name="p", summary={}))
    with store.session() as s:
        assert rdq.tokens_per_chunk_histogram(s, "r1") == {1: 3, 4: 2}
        assert rdq.tokens_per_chunk_histogram(s, "r2") == {1: 2, 2: 1}
        assert rdq.tokens_per_chunk_histogram(s, "r3") == {}
        assert s.scalar(select(func.count()).select_from(AuditRun)) == 3
    store.close()


def test_timestamps_are_aware_utc(session):
    for r in q.list_runs(session):
        assert r["started_at"].tzinfo is not None and r["started_at"].utcoffset() == dt.timedelta(0)


def test_shipped_calibration_reads_the_committed_records_and_survives_bad_files(tmp_path):
    """Issue 38 item 6: the Calibration page's shipped table comes from docs/calibration.json (what
    ``auditor plan`` reads); a missing or malformed file gives no rows, never an exception."""
    import json

    from auditor.store.dashboard_queries import shipped_calibration_table
    from auditor.util import committed_calibration_path

    rows = shipped_calibration_table()
    recs = json.loads(committed_calibration_path().read_text(encoding="utf-8"))
    assert len(rows) == len(recs) > 0
    assert {"honest-fp32", "int4"} <= {r["profile"] for r in rows}
    assert all(r["created_at"] is not None and 0.0 <= (r["rejection_rate"] or 0.0) <= 1.0 for r in rows)
    assert any(r["profile"].endswith(" (sequential)") for r in rows) == any(
        r.get("design") == "sequential" for r in recs)
    assert shipped_calibration_table(tmp_path / "absent.json") == []
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert shipped_calibration_table(bad) == []
    bad.write_text(json.dumps([{"profile": "p", "budget_tokens": 100, "rejection_rate": "nan"}, 3, {"x": 1}]))
    assert [(r["profile"], r["rejection_rate"]) for r in shipped_calibration_table(bad)] == [("p", None)]
