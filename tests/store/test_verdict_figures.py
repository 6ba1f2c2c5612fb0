"""The figures the dashboard shows are stored with each verdict (issue 34, item 2; ``auditor.check.stored_figures``).

The buyer's two answers and the plain headline stored with a verdict are the ones the report renders for the
same run (text report and dashboard agree); the provider's standing stored with an audit is its standing as
of that audit's start, also when an earlier-started audit completes later; a verdict row without them makes
the dashboard say "not stored" instead of computing; revision 0005 backfills the rows of an older database
(SQLite and PostgreSQL).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from rich.console import Console
from sqlalchemy.orm import Session

from auditor.report.render import render, report_from_store
from auditor.store import dashboard_queries as dq
from auditor.store import db as sdb
from auditor.store import models as orm
from auditor.store import run_detail_queries as rdq
from auditor.store.db import open_store
from auditor.watch.standing import provider_standing
from tests.fixtures_store import seed_demo

from .test_standing import MODEL, T0, add_audit, llama_like

SEED_NOW = dt.datetime(2026, 3, 20, 12, 0, tzinfo=dt.UTC)


def _text(rep: Any) -> str:
    console = Console(record=True, width=2000, color_system=None)
    render(rep, "text", console=console)
    return console.export_text()


def test_stored_answers_and_headline_are_what_the_report_renders(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        seed_demo(s, now=SEED_NOW)
        llama_like(s)
    with store.session() as s:
        run_ids = list(s.scalars(sa.select(orm.VerdictRow.run_id)))
        verdicts = set()
        for rid in run_ids:
            rep = report_from_store(s, rid)
            d = rdq.run_detail(s, rid)
            assert d is not None and d["not_stored"] is None
            assert d["questions"] == [q.to_dict() for q in rep.questions]
            assert d["headline"] == rep.headline
            text = _text(rep)
            for q in d["questions"]:  # the text report prints the same answer in plain words, and why below
                assert f"{q['question']} {q['answer']} — {q['plain']}" in text and q["evidence"] in text
            assert f"In plain words: {d['headline']}" in text
            verdicts.add(rep.verdict)
    store.close()
    assert len(run_ids) >= 12 and {"PASS", "QUANTIZATION", "RELAXED_VERIFICATION", "DECODING_NONCOMPLIANT"} <= verdicts


def test_standing_is_stored_as_of_each_audit_and_refreshed_by_a_late_finisher(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        # the verification audit (started an hour later) is stored first; the default audit, started earlier,
        # completes afterwards and must still count in the later audit's stored standing
        later = add_audit(s, "llama", "verification", "DECODING_NONCOMPLIANT", T0 + dt.timedelta(hours=1),
                          findings=[{"detector": "sampling-tail", "p_adjusted": 4e-15}])
        with s.no_autoflush:
            before = dict(s.get(orm.VerdictRow, _vid(s, later)).standing or {})
        earlier = add_audit(s, "llama", "default", "QUANTIZATION", T0, rule="2-logprob-quantization",
                            findings=[{"detector": "logprob-divergence", "p_adjusted": 3e-9}])
    assert before["standing"] == "DECODING_NONCOMPLIANT"
    with store.session() as s:
        for rid in (earlier, later):
            run = s.get(orm.AuditRun, rid)
            want = provider_standing(s, "llama", model=MODEL, as_of=run.started_at)
            assert want is not None
            assert s.get(orm.VerdictRow, _vid(s, rid)).standing == want.to_dict()
        (row,) = dq.provider_overview(s)
        old_only = dq.provider_overview(s, until=T0 + dt.timedelta(minutes=30))  # the standing as of the first
    store.close()
    assert row["standing"] == "QUANTIZATION" and row["run_id"] == later
    assert {c["verdict"] for c in row["causes"]} == {"QUANTIZATION", "DECODING_NONCOMPLIANT"}
    assert [r["standing"] for r in old_only] == ["QUANTIZATION"] and old_only[0]["standing_suites"] == ["default"]


def _vid(s: Session, run_id: str) -> int:
    return int(s.scalar(sa.select(orm.VerdictRow.id).where(orm.VerdictRow.run_id == run_id)))


def test_dashboard_says_not_stored_instead_of_computing(tmp_path) -> None:
    from dashboard.views.overview import overview_table

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        ids = llama_like(s)
        s.execute(sa.update(orm.VerdictRow).values(questions=None, headline=None, standing=None))
    with store.session() as s:
        d = rdq.run_detail(s, ids["default"])
        (row,) = dq.provider_overview(s)
    store.close()
    assert d is not None and d["verdict"] == "QUANTIZATION"
    assert d["not_stored"] == dq.NOT_STORED and d["questions"] == [] and d["headline"] is None
    assert row["standing"] is None and row["standing_reason"] == dq.NOT_STORED and row["causes"] == []
    _, cells = overview_table([row])
    assert "auditor db upgrade" in cells[0][3].replace("\\", "")


# ------------------------------------------------------------------------------------------ migration 0005
def _old_tables() -> dict[str, sa.Table]:
    """The tables as revision 0004 has them (only the columns these rows fill; no figure columns)."""
    md = sa.MetaData()
    dtype = orm.UTCDateTime()
    runs = sa.Table("audit_runs", md, sa.Column("id", sa.String), sa.Column("provider_name", sa.String),
                    sa.Column("model", sa.String), sa.Column("kind", sa.String), sa.Column("suite", sa.String),
                    sa.Column("config_snapshot", sa.JSON), sa.Column("status", sa.String),
                    sa.Column("verdict", sa.String), sa.Column("verdict_reason", sa.Text), sa.Column("alpha", sa.Float),
                    sa.Column("prompt_tokens", sa.Integer), sa.Column("completion_tokens", sa.Integer),
                    sa.Column("cost_usd", sa.Float), sa.Column("started_at", dtype), sa.Column("finished_at", dtype),
                    sa.Column("summary", sa.JSON))
    verdicts = sa.Table("verdicts", md, sa.Column("run_id", sa.String), sa.Column("verdict", sa.String),
                        sa.Column("reason", sa.Text), sa.Column("details", sa.JSON), sa.Column("created_at", dtype))
    dets = sa.Table("detector_results", md, sa.Column("run_id", sa.String), sa.Column("name", sa.String),
                    sa.Column("p_value", sa.Float), sa.Column("p_adjusted", sa.Float), sa.Column("effect", sa.Float),
                    sa.Column("n", sa.Integer), sa.Column("ran", sa.Boolean), sa.Column("reason", sa.Text),
                    sa.Column("evidence", sa.JSON), sa.Column("details", sa.JSON))
    return {"runs": runs, "verdicts": verdicts, "dets": dets}


def _insert_old_audit(conn: sa.Connection, t: dict[str, sa.Table], run_id: str, suite: str, verdict: str,
                      started: dt.datetime, details: dict[str, Any], dets: list[tuple[str, float, float | None]]) -> None:
    reason = f"{verdict} by {details['rule']}"
    conn.execute(t["runs"].insert().values(
        id=run_id, provider_name="old", model=MODEL, kind="audit", suite=suite, config_snapshot={}, status="completed",
        verdict=verdict, verdict_reason=reason, alpha=0.05, prompt_tokens=10, completion_tokens=20, cost_usd=0.0,
        started_at=started, finished_at=started + dt.timedelta(minutes=5), summary={}))
    conn.execute(t["verdicts"].insert().values(run_id=run_id, verdict=verdict, reason=reason, details=details,
                                               created_at=started + dt.timedelta(minutes=5)))
    for name, p, effect in dets:
        conn.execute(t["dets"].insert().values(run_id=run_id, name=name, p_value=p, p_adjusted=p, effect=effect, n=400,
                                               ran=True, reason=None, evidence=[], details={}))


def _migration_backfills(url: str) -> None:
    engine = sdb.make_engine(url)
    try:
        sdb.upgrade(engine, "0004")
        t = _old_tables()
        with engine.begin() as c:
            _insert_old_audit(c, t, "oldquant0001", "default", "QUANTIZATION", T0,
                              {"rule": "2-logprob-quantization", "alpha": 0.05,
                               "findings": [{"detector": "logprob-divergence", "p_adjusted": 3e-9}]},
                              [("logprob-divergence", 3e-9, 0.4), ("greedy-match", 0.2, 0.01)])
            _insert_old_audit(c, t, "oldpass00002", "verification", "PASS", T0 + dt.timedelta(hours=2),
                              {"rule": "5-pass", "alpha": 0.05, "findings": []}, [("sampling-argmax", 0.6, 0.0)])
        with Session(engine) as s:  # the dashboard on a database not upgraded yet: "not stored", no error
            old = rdq.run_detail(s, "oldquant0001")
            (stale,) = dq.provider_overview(s)
        assert old is not None and old["not_stored"] == dq.NOT_STORED and old["questions"] == []
        assert stale["standing"] is None and stale["standing_reason"] == dq.NOT_STORED
        sdb.upgrade(engine, "head")
        assert sdb.current_revision(engine) == sdb.head_revision()
        with Session(engine) as s:
            for rid in ("oldquant0001", "oldpass00002"):
                v = s.scalar(sa.select(orm.VerdictRow).where(orm.VerdictRow.run_id == rid))
                rep = report_from_store(s, rid)
                st = provider_standing(s, "old", model=MODEL, as_of=s.get(orm.AuditRun, rid).started_at)
                assert v is not None and st is not None
                assert v.questions == [q.to_dict() for q in rep.questions] and v.headline == rep.headline
                assert v.standing == st.to_dict()
            assert s.get(orm.VerdictRow, _vid(s, "oldquant0001")).questions[0]["answer"] == "no"
            (row,) = dq.provider_overview(s)
            d = rdq.run_detail(s, "oldquant0001")
        assert row["standing"] == "QUANTIZATION" and row["run_id"] == "oldpass00002"  # the older cause counts
        assert d is not None and d["not_stored"] is None and d["headline"].startswith("Not at its original precision")
        # down and up again: the columns go, then come back filled
        sdb.downgrade(engine, "0004")
        assert "headline" not in {c["name"] for c in sa.inspect(engine).get_columns("verdicts")}
        sdb.upgrade(engine, "head")
        with Session(engine) as s:
            assert all(v.questions and v.headline and v.standing for v in s.scalars(sa.select(orm.VerdictRow)))
    finally:
        engine.dispose()


def test_migration_0005_backfills_an_old_sqlite_database(sqlite_url) -> None:
    _migration_backfills(sqlite_url)


def test_migration_0005_backfills_an_old_postgres_database(pg_url) -> None:
    _migration_backfills(pg_url)


@pytest.mark.parametrize("missing", ["verdict", "run"])
def test_store_figures_needs_a_stored_verdict(tmp_path, missing) -> None:
    from auditor.check.stored_figures import store_figures
    from auditor.report.render import ReportError
    from auditor.store.result_queries import store_verdict_figures

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        run = orm.AuditRun(provider_name="p", model=MODEL, kind="audit", status="running", started_at=T0, summary={})
        s.add(run)
        s.flush()
        rid = run.id if missing == "verdict" else "nosuchrun"
        with pytest.raises(ValueError, match="no stored verdict"):
            store_verdict_figures(s, rid, headline="x")
        with pytest.raises(ReportError):
            store_figures(s, rid)
    store.close()


def test_a_replaced_verdict_clears_its_figures_until_they_are_stored_again(tmp_path) -> None:
    from auditor.check.stored_figures import store_figures
    from auditor.store.result_queries import store_verdict

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        ids = llama_like(s)
        assert rdq.run_detail(s, ids["default"])["questions"][0]["answer"] == "no"  # type: ignore[index]
        store_verdict(s, ids["default"], "PASS", "re-decided", {"rule": "5-pass", "alpha": 0.05})
        cleared = rdq.run_detail(s, ids["default"])
        store_figures(s, ids["default"])
        again = rdq.run_detail(s, ids["default"])
        rep = report_from_store(s, ids["default"])
    store.close()
    assert cleared is not None and cleared["not_stored"] == dq.NOT_STORED and cleared["questions"] == []
    assert again is not None and again["not_stored"] is None and again["headline"] == rep.headline
    assert again["questions"] == [q.to_dict() for q in rep.questions] and again["questions"][0]["answer"] != "no"
