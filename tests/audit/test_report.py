"""Report rendering: JSON fields, Markdown evidence, JUnit XML, exit codes (no model needed)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from auditor.report.common import JSON_FIELDS, AuditReport, exit_code_for
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.report.render import FORMATS, render, render_json


def make_report(verdict: str = "QUANTIZATION") -> AuditReport:
    ev = {
        "prompt_id": "math-logprob-01#0",
        "position": 7,
        "token_id": 42,
        "token": " 12|x",
        "ref_top5": [[11, -0.1], [42, -2.5], [9, -3.0]],
        "ref_top5_tokens": [" 13", " 12|x", "\n"],
        "ref_margin": 2.4,
        "kl": 0.31,
        "margin": 2.4,
        "context": "the answer is",
    }
    dets = [
        {"name": "greedy-match", "ran": True, "statistic": 3.0, "p_value": 0.2, "p_adjusted": 0.4, "effect": 0.01,
         "effect_ci": [0.002, 0.03], "n": 300, "reason": None, "rejects": False, "evidence": [], "details": {}},
        {"name": "logprob-divergence", "ran": True, "statistic": 6.1, "p_value": 1e-9, "p_adjusted": 3e-9,
         "effect": 0.21, "effect_ci": [0.1, 0.3], "n": 280, "reason": None, "rejects": True, "evidence": [ev] * 3,
         "details": {"ratio_to_floor": 270.0, "geometric_ratio": 210.0, "top1_agreement": 0.86}},
        {"name": "sampling-gof", "ran": False, "statistic": None, "p_value": None, "p_adjusted": None, "effect": None,
         "effect_ci": [None, None], "n": 4, "reason": "too few sampled positions with a reference (4 < 10)",
         "rejects": False, "evidence": [], "details": {}},
    ]
    return AuditReport(
        run_id="abc123def456", provider="acme", model="smollm2", verdict=verdict,
        verdict_reason="reported logprobs diverge from the reference", alpha=0.05, detectors=dets,
        tokens={"prompt": 1000, "completion": 600, "total": 1600, "budget": 600, "scored_positions": 580},
        cost_usd=0.0012, suite="default", suite_version="1.1", suite_digest="0123456789abcdef",
        reference={"model": "smollm2-135m-instruct", "revision": "b57fa76ce205feb7", "dtype": "float32"},
        started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:01:00+00:00",
        summary={"ttft_median_s": 0.2, "tpot_median_s": 0.03, "tokens_per_s": 30.0, "mean_tokens_per_chunk": 2.1,
                 "mean_kl": 0.21, "noise_floor": 0.0005, "clear_mismatch_rate": 0.01, "tokens_per_chunk": {"1": 3, "3": 2}},
        verdict_details={"rule": "2-logprob-quantization", "n_tests": 2,
                         "findings": [{"detector": "logprob-divergence", "p_adjusted": 3e-9, "implication": "x"}]},
        probes={"total": 20, "ok": 20, "failed": 0, "attempts": 21, "retries": 1},
        prompts={"math-logprob-01#0": "What is 7 + 5?"}, wall_s=12.5,
    )


def test_json_report_has_the_required_fields_and_is_strict_json() -> None:
    rep = make_report()
    rep.detectors[0]["effect"] = math.nan  # NaN must become null, never invalid JSON
    d = json.loads(render_json(rep))
    for k in ("run_id", "provider", "model", "verdict", "alpha", "detectors", "tokens", "cost_usd", "suite",
              "suite_version", "reference", "started_at", "finished_at"):
        assert k in d, k
    assert set(JSON_FIELDS) <= set(d)
    assert d["detectors"][0]["effect"] is None
    for det in d["detectors"]:
        assert {"name", "statistic", "p_value", "p_adjusted", "effect", "n", "evidence"} <= set(det)
    assert set(d["reference"]) >= {"model", "revision", "dtype"}
    assert d["exit_code"] == 1
    assert AuditReport.from_dict(d).to_dict() == d


@pytest.mark.parametrize(("verdict", "code"), [("PASS", 0), ("QUANTIZATION", 1), ("RELAXED_VERIFICATION", 1),
                                                ("SUBSTITUTION", 1), ("QUANTIZATION_OR_SUBSTITUTION", 1),
                                                ("DECODING_NONCOMPLIANT", 1), ("INCONCLUSIVE", 2)])
def test_exit_codes(verdict: str, code: int) -> None:
    assert exit_code_for(verdict) == code
    assert make_report(verdict).exit_code == code


def test_markdown_has_token_level_evidence() -> None:
    md = render_markdown(make_report())
    assert md.startswith("# Inference audit: acme — **QUANTIZATION**")
    assert "## Token-level evidence" in md and "### logprob-divergence (rejects)" in md
    row = next(line for line in md.splitlines() if line.startswith("| `math-logprob-01#0`"))
    assert "What is 7 + 5?" in row  # the prompt
    assert "| 7 |" in row  # the position
    assert "12\\|x" in row  # provider token, pipe escaped
    assert "` 13` 0.905" in row  # reference top-5 with probabilities
    assert "| 2.4 |" in row  # margin (nats)
    assert "sampling-gof | | | | | 4 | not run: too few sampled positions" in md
    # every table row has the header's number of cells (no unescaped pipes)
    for line in md.splitlines():
        if line.startswith("| `math"):
            assert line.replace("\\|", "").count("|") == 7


def test_junit_parses_and_counts() -> None:
    root = ET.fromstring(render_junit(make_report()).split("\n", 1)[1])
    ts = root.find("testsuite")
    assert ts is not None and ts.get("tests") == "4"
    assert ts.get("failures") == "2" and ts.get("skipped") == "1" and ts.get("errors") == "0"
    cases = {c.get("name"): c for c in ts.findall("testcase")}
    assert cases["logprob-divergence"].find("failure") is not None
    assert cases["sampling-gof"].find("skipped") is not None
    assert cases["greedy-match"].find("failure") is None
    assert cases["verdict"].find("failure").get("type") == "QUANTIZATION"
    props = {p.get("name"): p.get("value") for p in ts.find("properties")}
    assert props["run_id"] == "abc123def456" and props["verdict"] == "QUANTIZATION"
    inc = ET.fromstring(render_junit(make_report("INCONCLUSIVE")).split("\n", 1)[1]).find("testsuite")
    assert inc.get("errors") == "1"
    ok = ET.fromstring(render_junit(make_report("PASS")).split("\n", 1)[1]).find("testsuite")
    assert ok.get("failures") == "1"  # the rejecting detector only; the verdict case passes


def test_render_dispatch_and_text(capsys) -> None:
    from rich.console import Console

    rep = make_report()
    for fmt in FORMATS[1:]:
        assert render(rep, fmt)
    with pytest.raises(ValueError, match="--format"):
        render(rep, "pdf")
    con = Console(width=160, record=True)
    assert render(rep, "text", con) is None
    out = con.export_text()
    assert "verdict: QUANTIZATION" in out and "logprob-divergence" in out and "REJECTS" in out
    assert "1600 tokens" in out and "$0.001200" in out


def _rules_out_report() -> AuditReport:
    """A PASS whose verdict details carry the rules-out record of a real decide_verdict."""
    from auditor.detectors import DetectorResult
    from auditor.verdict.decide import decide_verdict
    from tests.effect_table import effect_table

    res = [DetectorResult(k, 0.0, 1.0, 0.0, (0.0, 0.0), 1000, [], details={"r0": 1e-3, "band": 0.2})
           for k in ("greedy-match", "self-greedy")]
    v = decide_verdict(res, effect_sizes=effect_table())
    assert v.verdict == "PASS"
    rep = make_report("PASS")
    rep.verdict_reason = v.reason
    rep.verdict_details = v.details
    return rep


def test_every_format_shows_what_the_audit_rules_out() -> None:
    from io import StringIO

    from rich.console import Console

    from auditor.verdict.questions import answer_questions
    from dashboard.views.run_detail import rules_out_table

    rep = _rules_out_report()
    recs = {r["key"]: r for r in rep.rules_out}
    assert recs["int4"]["status"] == "ruled out" and recs["kv-fp8"]["status"] == "not ruled out"
    d = json.loads(render_json(rep))
    assert [r["key"] for r in d["rules_out"]] == list(recs) and AuditReport.from_dict(d).to_dict() == d
    md = render_markdown(rep)
    assert "## What this audit rules out" in md and "| int4 weights | precision | ruled out |" in md
    assert "| fp8 KV cache | precision | not ruled out |" in md and "| truncated sampling | decoding | not tested |" in md
    buf = StringIO()
    render(rep, "text", console=Console(file=buf, width=300))
    text = buf.getvalue()
    assert "rules out int4 weights" in text and "does not rule out fp8 KV cache (power" in text
    root = ET.fromstring(render_junit(rep))
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert "rules out int4 weights" in props["rules_out"] and "not tested: " in props["rules_out"]
    assert "rules out int4 weights" in root.find("testsuite").findall("system-out")[-1].text
    # one home (issue 38, item 3): the precision answer does not repeat it; the dashboard table shows it; an
    # old run without it shows nothing
    prec = answer_questions(rep.verdict, rep.verdict_details)[0]
    assert prec.answer == "yes" and "rules out" not in prec.evidence
    table = rules_out_table(rep.rules_out)
    assert "int4 weights" in table and "green-badge[ruled out]" in table
    assert rules_out_table(None) == "" and rules_out_table([{"bogus": 1}]).count("\n") >= 2
    old = make_report("PASS")
    assert old.rules_out == [] and "## What this audit rules out" not in render_markdown(old)
    assert "rules_out" not in {p.get("name") for p in ET.fromstring(render_junit(old)).iter("property")}


def test_text_report_written_to_a_file_or_pipe_keeps_every_name_and_number_whole(tmp_path, monkeypatch) -> None:
    """Issue 38 item 3: rich assumes 80 columns off a terminal and cut ``logprob-dive…``; the CLI's
    console is wide there, so a report piped to a file keeps every detector name and number."""
    from auditor.cli.common import PIPE_WIDTH, console

    monkeypatch.delenv("COLUMNS", raising=False)
    rep = make_report()
    rep.detectors.append({"name": "sampling-argmax-excess-in-the-reasoning-span", "ran": True, "statistic": 123456.789,
                          "p_value": 1.23e-45, "p_adjusted": 9.87e-44, "effect": 0.123456, "effect_ci": [0.1, 0.2],
                          "n": 987654, "reason": None, "rejects": True, "evidence": [], "details": {}})
    path = tmp_path / "report.txt"
    with path.open("w", encoding="utf-8") as f:
        con = console(f)
        assert con.width == PIPE_WIDTH and not con.is_terminal
        render(rep, "text", con)
    text = path.read_text(encoding="utf-8")
    assert "…" not in text
    for d in rep.detectors:
        assert d["name"] in text
    for number in ("987654", "9.9e-44", "1.23e+05", "280"):
        assert number in text, number
    # the default rich console (80 columns) is what cut the names: the test can fail
    from rich.console import Console

    narrow = tmp_path / "narrow.txt"
    with narrow.open("w", encoding="utf-8") as f:
        render(rep, "text", Console(file=f, width=80))
    assert "sampling-argmax-excess-in-the-reasoning-span" not in narrow.read_text(encoding="utf-8")


def test_every_format_leads_with_one_plain_sentence_and_the_deciding_figure() -> None:
    """Issue 38 item 1: after the two questions, one plain sentence with the one deciding figure (the
    KL ratio to the honest floor here), before the statistics; the same sentence in every format."""
    from auditor.verdict.questions import plain_headline

    rep = make_report()
    h = rep.headline
    assert h.startswith("Not at its original precision: ") and "210 times as much as honest serving varies" in h
    assert len(h) < 200
    md = render_markdown(rep).splitlines()
    i = md.index(f"**In plain words:** {h}")
    assert md.index("> reported logprobs diverge from the reference") > i > 4
    assert json.loads(render_json(rep))["headline"] == h
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_junit(rep).split("\n", 1)[1]).iter("property")}
    assert props["headline"] == h
    # the greedy figure when the KL test did not decide; the reason's first clause for INCONCLUSIVE
    dets = [dict(rep.detectors[0], rejects=True, effect=0.05, p_adjusted=1e-6), dict(rep.detectors[1], rejects=False)]
    assert "at 5.0% of 300 positions" in plain_headline("QUANTIZATION", dets)
    assert plain_headline("INCONCLUSIVE", [], "too few positions; more text") == "No decision: too few positions."
    assert plain_headline("PASS", rep.detectors).startswith("Served as declared")
    assert plain_headline("RELAXED_VERIFICATION", [{"name": "x", "ran": True, "rejects": True, "p_adjusted": 1e-9}]) \
        == "Speculative verification is not strict: x found it (Holm-adjusted p = 1.0e-09)."
    for junk in ([None, 3, {"ran": True, "rejects": True, "details": "x", "effect": "nan"}], []):
        assert plain_headline("SUBSTITUTION", junk).startswith("Not the declared model")  # never raises
