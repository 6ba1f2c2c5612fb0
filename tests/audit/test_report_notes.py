"""Report lines that must never be silent (issue 13): estimated usage marks the cost line, and a
concurrency reduction during the run is one line — in the text and Markdown reports and in the
probe run's summary; absent when neither happened."""

from __future__ import annotations

from rich.console import Console

from auditor.check.runner import RunSummary, render_summary
from auditor.report.common import concurrency_line, usage_note
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.report.render import render_text
from tests.audit.test_report import make_report

ESTIMATED = {"usage_estimated": True, "usage_missing_responses": 52, "usage_prompt_tokens_method": "tokenizer"}
#: ``probes.concurrency.AdaptiveConcurrency.stats()`` as the runner stores it after 4 truncations.
CONCURRENCY = {
    "configured": 8, "current": 1, "min": 1, "adaptive": True,
    "changes": [{"old": 8, "new": 1, "reason": "pressure", "failures": 4, "kinds": ["truncated_stream"]}],
    "pressure_failures": {"truncated_stream": 4},
    "summary": "concurrency reduced 8→1 after 4 truncated_stream failures",
}


def _text(rep) -> str:
    con = Console(width=200, record=True)
    render_text(rep, con)
    return con.export_text()


def test_estimated_usage_and_concurrency_are_reported():
    rep = make_report()
    rep.summary = {**rep.summary, **ESTIMATED, "concurrency": CONCURRENCY}
    text = _text(rep)
    cost = next(line for line in text.splitlines() if line.startswith("cost:"))
    assert "(estimated: 52 responses came without usage, counted with the reference tokenizer)" in cost
    assert "concurrency reduced 8→1 after 4 truncated_stream failures" in text
    md = render_markdown(rep)
    assert "| Cost | $0.001200 (estimated: 52 responses" in md
    assert "1600 (estimated)" in md
    assert "| Concurrency | concurrency reduced 8→1 after 4 truncated_stream failures |" in md
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(render_junit(rep).split("\n", 1)[1]).find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["usage_estimated"].startswith("estimated: 52 responses")
    assert props["concurrency"] == "concurrency reduced 8→1 after 4 truncated_stream failures"
    assert "reduced 8→1" in (suite.findall("system-out")[-1].text or "")


def test_no_note_when_usage_was_billed_and_concurrency_constant():
    rep = make_report()
    rep.summary = {**rep.summary, "concurrency": {**CONCURRENCY, "changes": []}}
    text, md = _text(rep), render_markdown(rep)
    assert "estimated" not in text and "estimated" not in md
    assert "concurrency" not in text.lower() and "| Concurrency |" not in md
    junit = render_junit(rep)
    assert 'name="usage_estimated"' not in junit and 'name="concurrency"' not in junit
    assert usage_note({"usage_estimated": False}) is None and concurrency_line({}) is None


def test_probe_run_summary_says_so_too():
    base = dict(run_id="r1", provider="llama", suite="smoke", suite_version="1.1", status="completed",
                probes_total=52, probes_ok=52, probes_failed=0, probes_pending=0, attempts=60, retries=8,
                failed_attempts=8, tokens=400, prompt_tokens=900, completion_tokens=400, cost_usd=0.0)
    outs = []
    for extra in ({}, {"usage_note": usage_note(ESTIMATED), "concurrency": concurrency_line({"concurrency": CONCURRENCY})}):
        con = Console(width=200, record=True)
        render_summary(RunSummary(**base, **extra), con)  # type: ignore[arg-type]
        outs.append(con.export_text())
    assert "estimated" not in outs[0] and "concurrency" not in outs[0]
    assert "$0.000000 (estimated: 52 responses" in outs[1] and "reduced 8→1" in outs[1]


def test_summarize_run_reads_the_stored_marks(tmp_path):
    from auditor.check.runner import summarize_run
    from auditor.store import models as orm
    from auditor.store.db import open_store

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        with store.session() as s:
            for rid, summary in (("plain", {}), ("marked", {**ESTIMATED, "concurrency": CONCURRENCY})):
                s.add(orm.AuditRun(id=rid, provider_name="llama", kind="probe", suite="smoke", status="completed",
                                   summary=summary))
        plain, marked = summarize_run(store, "plain"), summarize_run(store, "marked")
    finally:
        store.close()
    assert plain.usage_note is None and plain.concurrency is None
    assert marked.usage_note is not None and "52 responses" in marked.usage_note
    assert marked.concurrency == CONCURRENCY["summary"]
