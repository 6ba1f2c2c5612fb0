"""A provider's combined standing over its recent audits (issue 13, item 4): the store query, the
``auditor report --provider`` command and the dashboard's provider row."""

from __future__ import annotations

import datetime as dt
import json
import math
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from auditor.check.stored_figures import store_figures
from auditor.cli import app
from auditor.store import dashboard_queries as dq
from auditor.store import models as orm
from auditor.store.db import open_store
from auditor.store.standing_queries import AuditRecord
from auditor.watch.standing import SEVERITY, combine_standing, provider_standing, render_standing

T0 = dt.datetime(2026, 5, 4, 12, 0, tzinfo=dt.UTC)
MODEL = "smollm2-135m-instruct"
P_KL, P_GREEDY, P_TAIL = 3e-9, 1.2e-57, 4e-15


def _det(name: str, p: float | None, *, ran: bool = True, reason: str | None = None) -> dict[str, Any]:
    return {"name": name, "ran": ran, "p_value": p, "p_adjusted": p, "reason": reason}


def add_audit(s: Session, provider: str, suite: str, verdict: str, started: dt.datetime, *,
              rule: str = "x", secondary: list[dict] | None = None, dets: list[dict] | None = None,
              findings: list[dict] | None = None, not_tested: dict | None = None, model: str = MODEL,
              status: str = "completed") -> str:
    """One stored audit shaped like the check pipeline's: run, verdict row (details), detector rows."""
    run = orm.AuditRun(provider_name=provider, model=model, kind="audit", suite=suite, suite_version="1.1",
                       status=status, verdict=verdict, verdict_reason=f"{verdict} by {rule}", alpha=0.05,
                       started_at=started, finished_at=started + dt.timedelta(minutes=5), summary={})
    s.add(run)
    s.flush()
    details: dict[str, Any] = {"rule": rule, "alpha": 0.05, "secondary_causes": secondary or [],
                               "findings": findings or []}
    if not_tested:
        details["not_tested"] = not_tested
    s.add(orm.VerdictRow(run_id=run.id, verdict=verdict, reason=run.verdict_reason, details=details))
    for d in dets or []:
        s.add(orm.DetectorResultRow(run_id=run.id, name=d["name"], p_value=d["p_value"], p_adjusted=d["p_adjusted"],
                                    n=100, ran=d["ran"], reason=d["reason"], evidence=[], details={}))
    s.flush()
    store_figures(s, run.id)  # as the check pipeline does when it stores a verdict
    return run.id


def llama_like(s: Session, provider: str = "llama") -> dict[str, str]:
    """The issue's llama.cpp story: default → QUANTIZATION (decode path as a secondary cause), an
    hour later verification → DECODING_NONCOMPLIANT (truncated tail)."""
    default = add_audit(
        s, provider, "default", "QUANTIZATION", T0, rule="2-logprob-quantization",
        secondary=[{"verdict": "DECODING_NONCOMPLIANT", "rule": "4d-decode-path", "reason": "greedy not own top-1",
                    "evidence": [{"detector": "self-greedy", "p_adjusted": P_GREEDY}]}],
        findings=[{"detector": "logprob-divergence", "p_adjusted": P_KL}, {"detector": "self-greedy", "p_adjusted": P_GREEDY}],
        dets=[_det("logprob-divergence", P_KL), _det("self-greedy", P_GREEDY), _det("sampling-tail", 0.3)])
    verification = add_audit(
        s, provider, "verification", "DECODING_NONCOMPLIANT", T0 + dt.timedelta(hours=1), rule="4-truncation",
        findings=[{"detector": "sampling-tail", "p_adjusted": P_TAIL}],
        dets=[_det("logprob-divergence", None, ran=False, reason="no logprob probes"), _det("sampling-tail", P_TAIL)])
    return {"default": default, "verification": verification}


@pytest.fixture
def db(tmp_path):
    """``(url, store)`` of an empty migrated SQLite database."""
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    store = open_store(url)
    yield url, store
    store.close()


def test_two_suites_give_one_standing_with_both_causes(db):
    _, store = db
    with store.session() as s:
        ids = llama_like(s)
    with store.session() as s:
        st = provider_standing(s, "llama")
    assert st is not None
    assert st.standing == "QUANTIZATION" and st.exit_code == 1  # the worse of the two suites' verdicts
    assert sorted(st.suites) == ["default", "verification"]
    found = {(c.verdict, c.suite, c.run_id, c.primary) for c in st.causes}
    assert found == {("QUANTIZATION", "default", ids["default"], True),
                     ("DECODING_NONCOMPLIANT", "default", ids["default"], False),
                     ("DECODING_NONCOMPLIANT", "verification", ids["verification"], True)}
    assert st.causes[0].verdict == "QUANTIZATION"  # worst first
    quant = st.causes[0]
    # the primary's deciding evidence: the finding no secondary cause claims, with its p-value
    assert [e["detector"] for e in quant.evidence] == ["logprob-divergence"]
    assert quant.evidence[0]["p_adjusted"] == pytest.approx(P_KL)
    assert quant.rule == "2-logprob-quantization" and quant.started_at.startswith("2026-05-04T12:00")
    tail = next(c for c in st.causes if c.suite == "verification")
    assert tail.evidence[0]["detector"] == "sampling-tail" and tail.evidence[0]["p_adjusted"] == pytest.approx(P_TAIL)
    assert "QUANTIZATION" in st.reason and "DECODING_NONCOMPLIANT" in st.reason
    assert st.not_tested == []  # logprob-divergence ran in the default audit
    d = json.loads(render_standing(st, "json"))
    assert d["standing"] == "QUANTIZATION" and len(d["causes"]) == 3 and d["exit_code"] == 1


@pytest.mark.parametrize(("precision", "verification", "expected"), [
    ("PASS", "PASS", "PASS"),
    ("PASS", "INCONCLUSIVE", "INCONCLUSIVE"),
    ("INCONCLUSIVE", "PASS", "INCONCLUSIVE"),
    ("PASS", "DECODING_NONCOMPLIANT", "DECODING_NONCOMPLIANT"),
    ("INCONCLUSIVE", "RELAXED_VERIFICATION", "RELAXED_VERIFICATION"),
    ("SUBSTITUTION", "QUANTIZATION", "SUBSTITUTION"),
    ("QUANTIZATION_OR_SUBSTITUTION", "QUANTIZATION", "QUANTIZATION_OR_SUBSTITUTION"),
    ("QUANTIZATION_OR_SUBSTITUTION", "SUBSTITUTION", "SUBSTITUTION"),
])
def test_pass_only_when_every_recent_suite_passed(db, precision, verification, expected):
    _, store = db
    with store.session() as s:
        add_audit(s, "p", "precision", precision, T0)
        add_audit(s, "p", "verification", verification, T0 + dt.timedelta(hours=2))
    with store.session() as s:
        st = provider_standing(s, "p")
    assert st is not None and st.standing == expected
    assert st.exit_code == {"PASS": 0, "INCONCLUSIVE": 2}.get(expected, 1)


def test_old_and_superseded_audits_are_left_out(db):
    _, store = db
    with store.session() as s:
        old = add_audit(s, "p", "precision", "SUBSTITUTION", T0 - dt.timedelta(days=10), rule="2-substitution")
        earlier = add_audit(s, "p", "default", "QUANTIZATION", T0 - dt.timedelta(days=1))
        add_audit(s, "p", "default", "PASS", T0)
        add_audit(s, "p", "verification", "PASS", T0 + dt.timedelta(hours=1))
        add_audit(s, "p", "default", "QUANTIZATION", T0 + dt.timedelta(hours=3), status="failed")  # not completed
        add_audit(s, "p", "default", "QUANTIZATION", T0 + dt.timedelta(hours=4), model="other-model")
    with store.session() as s:
        st = provider_standing(s, "p", model=MODEL)
        wide = provider_standing(s, "p", model=MODEL, window_days=30)
        latest_model = provider_standing(s, "p")
        assert provider_standing(s, "nobody") is None
    assert st is not None and wide is not None and latest_model is not None
    assert st.standing == "PASS" and st.causes == []  # a cause older than the window, or superseded, does not count
    assert sorted(st.suites) == ["default", "verification"]
    why = {i["run_id"]: i["why"] for i in st.ignored}
    assert old not in {a["run_id"] for a in st.audits}
    assert "superseded" in why[earlier]
    assert wide.standing == "SUBSTITUTION" and old in {c.run_id for c in wide.causes}
    assert latest_model.model == "other-model" and latest_model.standing == "QUANTIZATION"  # newest audit's model


def test_what_no_recent_audit_tested_is_named(db):
    _, store = db
    with store.session() as s:
        add_audit(s, "p", "precision", "PASS", T0,
                  dets=[_det("logprob-divergence", 0.4), _det("sampling-tail", None, ran=False, reason="no sampling probes")],
                  not_tested={"QUANTIZATION": "no reference (reference = 'none')"})
    with store.session() as s:
        st = provider_standing(s, "p")
    assert st is not None
    what = {n["what"]: n["why"] for n in st.not_tested}
    assert "no sampling probes" in what["sampling-tail"] and "logprob-divergence" not in what
    assert "no reference" in what["QUANTIZATION"]
    md = render_standing(st, "markdown")
    assert "sampling-tail" in md and "## Not tested" in md


def test_window_is_validated():
    rec = AuditRecord("r1", "default", MODEL, T0, "PASS")
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="window_days"):
            combine_standing("p", [rec], window_days=bad)
    st = combine_standing("p", [])
    assert st.standing is None and st.exit_code == 2
    assert SEVERITY[-1] == "PASS" and SEVERITY[-2] == "INCONCLUSIVE"


def test_cli_report_provider_names_every_cause(db):
    url, store = db
    with store.session() as s:
        ids = llama_like(s)
    runner = CliRunner()
    for fmt in ("text", "markdown"):
        r = runner.invoke(app, ["report", "--provider", "llama", "--db", url, "--format", fmt])
        assert r.exit_code == 0, r.output
        assert "QUANTIZATION" in r.output and "DECODING_NONCOMPLIANT" in r.output
        assert ids["default"] in r.output and ids["verification"] in r.output
        assert "verification" in r.output and "logprob-divergence" in r.output
    r = runner.invoke(app, ["report", "--provider", "llama", "--db", url, "--format", "json"])
    d = json.loads(r.output)
    assert d["standing"] == "QUANTIZATION"
    assert {c["verdict"] for c in d["causes"]} == {"QUANTIZATION", "DECODING_NONCOMPLIANT"}
    r = runner.invoke(app, ["report", "--provider", "llama", "--db", url, "--format", "junit"])
    cases = ET.fromstring(r.output.split("?>", 1)[1]).findall(".//testcase")
    assert sorted(c.get("name") for c in cases) == ["suite default", "suite verification"]
    assert all(c.find("failure") is not None for c in cases)
    # the single-run report is unchanged
    r = runner.invoke(app, ["report", ids["default"], "--db", url, "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.output)["verdict"] == "QUANTIZATION"


def test_cli_report_needs_exactly_one_of_run_id_and_provider(db):
    url, store = db
    with store.session() as s:
        ids = llama_like(s)
    runner = CliRunner()
    for args in (["report"], ["report", ids["default"], "--provider", "llama"]):
        r = runner.invoke(app, [*args, "--db", url])
        assert r.exit_code == 3 and "exactly one of RUN_ID" in r.output
    r = runner.invoke(app, ["report", "--provider", "nobody", "--db", url])
    assert r.exit_code == 3 and "no completed audit of provider 'nobody'" in r.output
    r = runner.invoke(app, ["report", "--provider", "llama", "--window-days", "0", "--db", url])
    assert r.exit_code == 3 and "--window-days" in r.output


def test_dashboard_row_has_the_standing_and_every_cause(db):
    _, store = db
    with store.session() as s:
        ids = llama_like(s)
    with store.session() as s:
        (row,) = dq.provider_overview(s)
    assert row["verdict"] == "DECODING_NONCOMPLIANT" and row["run_id"] == ids["verification"]  # latest run kept
    assert row["standing"] == "QUANTIZATION"
    assert {(c["verdict"], c["suite"]) for c in row["causes"]} == {
        ("QUANTIZATION", "default"), ("DECODING_NONCOMPLIANT", "default"), ("DECODING_NONCOMPLIANT", "verification")}
    assert sorted(row["standing_suites"]) == ["default", "verification"]
    from dashboard.views.overview import overview_table, why_markdown

    _, cells = overview_table([row])
    assert "QUANTIZATION" in cells[0][3] and "DECODING\\_NONCOMPLIANT" in cells[0][3]  # standing cell: both
    assert "DECODING\\_NONCOMPLIANT" in cells[0][5]  # latest run's verdict still shown
    assert cells[0][1] == ":red-badge[no]"  # precision: QUANTIZATION is established in the standing
    why = why_markdown(row)
    assert ids["default"] in why and ids["verification"] in why and "logprob\\-divergence" in why
