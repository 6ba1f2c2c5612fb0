"""The buyer's two questions (issue 14, item 2): the rules of auditor.verdict.questions on hand-built verdict
details for every verdict kind, on real ``decide_verdict`` outputs, and their place at the top of
every report, the provider standing and the dashboard's run-detail page."""

from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from auditor.detectors import DETECTORS, DetectorResult
from auditor.report.common import JSON_FIELDS, AuditReport
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.report.render import render_json, render_text
from auditor.store.standing_queries import AuditRecord
from auditor.verdict.decide import decide_verdict
from auditor.verdict.questions import (
    ACCEPTANCE_DETECTORS,
    MODEL_DETECTORS,
    PRECISION_QUESTION,
    VERIFICATION_QUESTION,
    QuestionAnswer,
    answer_questions,
    combine_answers,
)
from auditor.watch.standing import combine_standing, render_standing


# ------------------------------------------------------------------------------------------ builders
def det(p: float | None = 0.5, *, n: int = 2000, ran: bool = True, rejects: bool = False,
        reason: str | None = None) -> dict[str, Any]:
    return {"ran": ran, "p_value": p, "p_adjusted": p, "effect": 0.0, "n": n, "rejects": rejects, "reason": reason}


def pw(req: int, n: int = 2000, adequate: bool | None = None) -> dict[str, Any]:
    return {"required_positions": req, "n": n, "adequate": n >= req if adequate is None else adequate, "mode": "x"}


def details(*, sampling: bool = True, n: int = 2000, rule: str = "5-pass", power: bool = True,
            **extra: Any) -> dict[str, Any]:
    """Verdict details shaped like decide_verdict's for a clean audit (greedy + logprob [+ sampling])."""
    dets = {"greedy-match": det(0.8, n=n), "logprob-divergence": det(0.6, n=n), "self-greedy": det(1.0, n=n)}
    not_run = {}
    if sampling:
        dets |= {"sampling-gof": det(0.5, n=n), "sampling-argmax": det(0.4, n=n), "sampling-tail": det(0.5, n=n)}
    else:
        dets |= {k: det(None, n=0, ran=False, reason="no sampling probes") for k in
                 ("sampling-gof", "sampling-argmax", "sampling-tail")}
        not_run = dict.fromkeys(("sampling-gof", "sampling-argmax", "sampling-tail"), "no sampling probes")
    d: dict[str, Any] = {"alpha": 0.05, "rule": rule, "detectors": dets, "not_run": not_run, "findings": [],
                         "secondary_causes": [], "ran": [k for k, v in dets.items() if v["ran"]]}
    if power:
        d["power"] = {"greedy-match": pw(99, n), "sampling-argmax": pw(393, n if sampling else 0),
                      "self-greedy": pw(99, n)}
        d["power"]["sampling-argmax"]["adequate"] = sampling and n >= 393
        d["power_families"] = {
            "model": {"ran": True, "adequate": n >= 99, "missing_positions": max(0, 99 - n)},
            "acceptance": {"ran": sampling, "adequate": sampling and n >= 393,
                           "missing_positions": max(0, 393 - (n if sampling else 0))},
            "truncation": {"ran": sampling, "adequate": sampling, "missing_positions": None},
            "decode-path": {"ran": True, "adequate": n >= 99, "missing_positions": max(0, 99 - n)},
        }
    d.update(extra)
    return d


def reject(d: dict[str, Any], name: str, p: float) -> dict[str, Any]:
    """``d`` with ``name`` rejecting at Holm-adjusted ``p`` (and the power record dropped, as the verdict does)."""
    d["detectors"][name] = det(p, rejects=True)
    d["findings"].append({"detector": name, "p_adjusted": p, "implication": "x"})
    d.pop("power", None)
    d.pop("power_families", None)
    return d


def answers(verdict: str, d: Any) -> tuple[QuestionAnswer, QuestionAnswer]:
    got = answer_questions(verdict, d)
    assert [a.key for a in got] == ["precision", "verification"]
    assert [a.question for a in got] == [PRECISION_QUESTION, VERIFICATION_QUESTION]
    for a in got:
        assert a.answer in ("yes", "no", "undecided", "not tested", "not established") and a.evidence and "\n" not in a.evidence
    return got[0], got[1]


# ------------------------------------------------------------------------------------------ rules
def test_the_questions_are_the_issue_s_sentences_and_read_the_registry() -> None:
    assert PRECISION_QUESTION == "Is the model served at its original precision?"
    assert VERIFICATION_QUESTION == "Is speculative verification strict (lossless)?"
    assert set(MODEL_DETECTORS) == {"greedy-match", "logprob-divergence"}
    assert set(ACCEPTANCE_DETECTORS) == {"sampling-argmax", "self-argmax"}
    from auditor.detectors import PREFLIGHT_CHECKS
    from auditor.verdict.questions import _NONCOMPLIANCE, _target_meaning

    assert _target_meaning("greedy-match") == DETECTORS["greedy-match"].power_target.meaning  # type: ignore[union-attr]
    assert {s.rule for s in PREFLIGHT_CHECKS.values()} <= set(_NONCOMPLIANCE)


def test_pass_with_sampling_answers_yes_twice_with_power_and_target() -> None:
    p, v = answers("PASS", details())
    assert p.answer == "yes" and "greedy-match on 2,000 positions (99 needed" in p.evidence
    assert DETECTORS["greedy-match"].power_target.meaning in p.evidence  # type: ignore[union-attr]
    assert v.answer == "yes" and "sampling-argmax on 2,000 positions (393 needed" in v.evidence
    assert "0.08 extra argmax emissions per sampled position" in v.evidence
    assert "temperature 0" not in v.evidence


def test_pass_greedy_only_verification_holds_at_temperature_zero_only() -> None:
    p, v = answers("PASS", details(sampling=False))
    assert p.answer == "yes"
    assert v.answer == "yes"
    assert v.evidence.startswith("at temperature 0 only") and "non-argmax drafts at clear margins" in v.evidence
    assert "sampled verification was not tested" in v.evidence
    # the greedy-relaxed class (near-ties only) is stated through greedy-near-tie's rules-out record, which
    # reports show once, in their rules-out part, not in the answer (issue 38, item 3)
    d = details(sampling=False)
    d["rules_out"] = [{"key": "greedy-relaxed", "label": "greedy acceptance of near-tie runner-ups",
                       "question": "verification", "status": "ruled out", "ruled_out": True, "power": 0.99,
                       "detector": "greedy-near-tie", "n": 120}]
    _, v2 = answers("PASS", d)
    assert v2.answer == "yes" and "rules out" not in v2.evidence


def test_greedy_only_with_too_few_greedy_positions_is_undecided_not_untested() -> None:
    """Issue 38 item 2: tests that ran and found nothing on too few positions are "undecided" (with
    the positions had and needed); "not tested" stays for the sampled tests that did not run."""
    p, v = answers("INCONCLUSIVE", details(sampling=False, n=40, rule="5-underpowered"))
    assert p.answer == "undecided" and "ran and found nothing" in p.evidence
    assert "greedy-match 40 of 99 needed" in p.evidence and "59 more" in p.evidence
    assert v.answer == "not tested" and "no sampled tokens were tested" in v.evidence
    assert "no sampling probes" in v.evidence


def test_underpowered_sampling_names_the_missing_positions() -> None:
    p, v = answers("INCONCLUSIVE", details(n=200, rule="5-underpowered"))
    assert p.answer == "yes"
    assert v.answer == "undecided" and "sampling-argmax 200 of 393 needed" in v.evidence and "193 more" in v.evidence


@pytest.mark.parametrize(("verdict", "rule", "name"), [
    ("QUANTIZATION", "2-logprob-quantization", "logprob-divergence"),
    ("SUBSTITUTION", "2-logprob-substitution", "logprob-divergence"),
    ("QUANTIZATION", "3-greedy-quantization", "greedy-match"),
    ("QUANTIZATION_OR_SUBSTITUTION", "2-logprob-model-deviation", "logprob-divergence"),
    ("QUANTIZATION_OR_SUBSTITUTION", "3-greedy-model-deviation", "greedy-match"),
])
def test_model_difference_answers_precision_no_with_the_deciding_p(verdict: str, rule: str, name: str) -> None:
    d = reject(details(rule=rule), name, 3e-9)
    d["findings"].append({"detector": "sampling-argmax", "p_adjusted": 0.01, "implication": "confounded"})
    p, v = answers(verdict, d)
    assert p.answer == "no" and p.evidence.startswith(verdict) and f"{name} (Holm-adjusted p = 3.0e-09)" in p.evidence
    assert f"rule {rule}" in p.evidence and "sampling-argmax" not in p.evidence  # the rule's detector only
    assert v.answer == "not tested" and "served model differs" in v.evidence


def test_tokenizer_substitution_is_a_proof_without_p_value() -> None:
    d = reject(details(rule="2t-tokenizer"), "logprob-divergence", 1e-5)
    d["tokenizer_mismatch"] = {"established": ["foreign_tokens"], "n_foreign_distinct": 7}
    p, _ = answers("SUBSTITUTION", d)
    assert p.answer == "no" and "another tokenizer" in p.evidence and "7 distinct token strings" in p.evidence


def test_relaxed_verification_answers_no_and_precision_lacks_a_power_record() -> None:
    d = reject(details(rule="4c-relaxed"), "sampling-argmax", 6e-8)
    p, v = answers("RELAXED_VERIFICATION", d)
    assert v.answer == "no" and "sampling-argmax (Holm-adjusted p = 6.0e-08)" in v.evidence and "4c-relaxed" in v.evidence
    assert p.answer == "undecided" and "no power calculation" in p.evidence


@pytest.mark.parametrize(("rule", "name", "what"), [
    ("4a-greedy-served", "sampling-argmax", "served greedily"),
    ("4b-truncated", "sampling-tail", "truncated distribution"),
    ("6-preflight-sampling", "preflight-top-p", "top-k / top-p / min-p"),
])
def test_decoding_noncompliance_leaves_verification_not_tested_and_names_it(rule: str, name: str, what: str) -> None:
    d = reject(details(rule=rule), name, 1e-6)
    p, v = answers("DECODING_NONCOMPLIANT", d)
    assert v.answer == "not tested" and what in v.evidence and f"{name} (Holm-adjusted p = 1.0e-06)" in v.evidence
    assert p.answer == "undecided"  # the model tests ran; no power record on a rejecting audit


def test_decoding_noncompliance_with_adequate_acceptance_family_answers_yes() -> None:
    d = details(rule="1-self-greedy")  # power record kept: the acceptance family is adequate
    d["detectors"]["self-greedy"] = det(1e-5, rejects=True)
    p, v = answers("DECODING_NONCOMPLIANT", d)
    assert v.answer == "yes" and "sampling-argmax on 2,000 positions" in v.evidence
    assert p.answer == "yes"


def test_secondary_causes_answer_no() -> None:
    d = reject(details(rule="1-self-greedy"), "self-greedy", 1e-5)
    d["secondary_causes"] = [
        {"verdict": "QUANTIZATION", "rule": "4d-quantization", "reason": "r",
         "evidence": [{"detector": "sampling-gof", "p_adjusted": 2e-4}]},
        {"kind": "RELAXED_VERIFICATION", "rule": "4c-relaxed", "reason": "r",
         "evidence": [{"detector": "self-argmax", "p_adjusted": 3e-5}]},
    ]
    p, v = answers("DECODING_NONCOMPLIANT", d)
    assert p.answer == "no" and "secondary cause" in p.evidence and "sampling-gof (Holm-adjusted p = 0.0002)" in p.evidence
    assert v.answer == "no" and "self-argmax (Holm-adjusted p = 3.0e-05)" in v.evidence


def test_provider_failures_leave_both_untested_unless_a_secondary_cause_says_no() -> None:
    fail = {"failed": 5, "total": 20, "share": 0.25, "kinds": {"timeout": 5}}
    p, v = answers("INCONCLUSIVE", details(rule="0-provider-failures", provider_failures=fail))
    assert p.answer == v.answer == "not tested"  # the power record says adequate, but the sample is not fair
    assert "5 of 20 probes failed (25%)" in p.evidence and "timeout 5" in v.evidence
    d = details(rule="0-provider-failures", provider_failures=fail, secondary_causes=[
        {"verdict": "QUANTIZATION", "rule": "2-logprob-quantization", "reason": "r",
         "evidence": [{"detector": "logprob-divergence", "p_adjusted": 3e-9}]}])
    p, v = answers("INCONCLUSIVE", d)
    assert p.answer == "no" and "in the probes that succeeded" in p.evidence
    assert v.answer == "not tested" and "probes failed" in v.evidence


def test_no_reference_and_set_aside_reference_leave_precision_untested() -> None:
    d = details()
    for k in MODEL_DETECTORS + ("sampling-argmax",):
        d["detectors"][k] = det(None, n=0, ran=False, reason="no reference")
    d["detectors"]["self-argmax"] = det(0.3)
    d["power"]["self-argmax"] = pw(393)
    d["power_families"]["model"] = {"ran": False, "adequate": False, "missing_positions": 99}
    d["not_tested"] = {"QUANTIZATION": "no reference (reference = 'none')", "SUBSTITUTION": "no reference"}
    p, v = answers("PASS", d)
    assert p.answer == "not tested" and "no reference" in p.evidence
    assert v.answer == "yes" and "self-argmax on 2,000 positions" in v.evidence
    d = details(sampling=False, template_mismatch={"provider_prompt_tokens": 31, "reference_prompt_tokens": 20})
    for k in MODEL_DETECTORS:
        d["detectors"][k] = det(None, ran=False, reason="set aside")
    p, v = answers("PASS", d)
    assert p.answer == "not tested" and "set aside" in p.evidence and "31" in p.evidence
    assert v.answer == "not tested"  # greedy-match set aside: no temperature-0 argument either


def test_nothing_ran_names_the_reasons() -> None:
    d = {"rule": "0-nothing-ran", "detectors": {"greedy-match": det(None, ran=False, reason="too few")},
         "not_run": {"greedy-match": "too few"}}
    p, v = answers("INCONCLUSIVE", d)
    assert p.answer == "not tested" and "greedy-match: too few" in p.evidence
    assert v.answer == "not tested" and "not part of this audit" in v.evidence


def test_old_details_without_power_families_never_raise() -> None:
    d = details()
    del d["power_families"]  # older stored audits: per-detector power only → derived
    p, v = answers("PASS", d)
    assert p.answer == "yes" and v.answer == "yes"
    del d["power"]  # older still: no power record at all
    p, v = answers("PASS", d)
    assert p.answer == v.answer == "undecided" and "no power calculation" in p.evidence
    for junk in (None, {}, {"detectors": "x", "power_families": [1], "secondary_causes": "y", "findings": 3},
                 {"detectors": {"greedy-match": 5}, "power": {"greedy-match": None}, "alpha": "nan"}):
        p, v = answers("PASS", junk)
        assert p.answer == v.answer == "not tested"
    p, _ = answers("QUANTIZATION", {"rule": "2-logprob-quantization"})
    assert p.answer == "no" and "QUANTIZATION established" in p.evidence  # no p recorded: still named


def test_real_decide_verdict_outputs() -> None:
    def mk(name: str, p: float, **kw: Any) -> DetectorResult:
        return DetectorResult(name, 0.0, p, kw.pop("effect", 0.0), (0.0, 0.0), 2000, [], details=kw)

    clean = [mk("greedy-match", 1.0, r0=1e-3, band=0.2),
             mk("sampling-argmax", 0.4, expected_rate=0.6, excess_per_position=0.0, argmax_rate=0.6)]
    v = decide_verdict(clean)
    assert v.verdict == "PASS"
    assert [a.answer for a in answer_questions(v.verdict, v.details)] == ["yes", "yes"]
    relaxed = [clean[0], mk("sampling-argmax", 1e-9, expected_rate=0.6, excess_per_position=0.1, argmax_rate=0.7)]
    v = decide_verdict(relaxed)
    assert v.verdict == "RELAXED_VERIFICATION"
    # the verdict records each family's power on a rejection too: greedy-match had enough positions
    assert v.details["power_families"]["model"]["adequate"] and "suggested_budget_tokens" not in v.details
    assert [a.answer for a in answer_questions(v.verdict, v.details)] == ["yes", "no"]
    v = decide_verdict(clean[:1])
    assert v.verdict == "PASS"
    p, ver = answer_questions(v.verdict, v.details)
    assert (p.answer, ver.answer) == ("yes", "yes") and "temperature 0 only" in ver.evidence


def test_combine_answers_any_no_wins_else_newest_yes() -> None:
    yes = answer_questions("PASS", details())
    q = answer_questions("QUANTIZATION", reject(details(rule="2-logprob-quantization"), "logprob-divergence", 1e-9))
    untested = answer_questions("PASS", {})
    (p, ip), (v, iv) = combine_answers([("new", yes), ("old", q)])
    assert (p.answer, ip) == ("no", 1) and p.evidence.startswith("old: QUANTIZATION")
    assert (v.answer, iv) == ("yes", 0) and v.evidence.startswith("new: ")
    (p, ip), _ = combine_answers([("new", untested), ("old", yes)])
    assert (p.answer, ip) == ("yes", 1)
    (p, ip), _ = combine_answers([("new", untested)])
    assert (p.answer, ip) == ("not tested", 0) and "no recent audit answers it; newest (new)" in p.evidence
    (p, ip), _ = combine_answers([])
    assert (p.answer, ip) == ("not tested", None)


# ------------------------------------------------------------------------------------------ renderers
def make_report(verdict: str = "QUANTIZATION") -> AuditReport:
    vd = reject(details(rule="2-logprob-quantization"), "logprob-divergence", 3e-9)
    return AuditReport(
        run_id="abc123", provider="acme", model="m", verdict=verdict, verdict_reason="REASON-SENTENCE",
        alpha=0.05, detectors=[{"name": "logprob-divergence", "ran": True, "statistic": 6.0, "p_value": 1e-9,
                                "p_adjusted": 3e-9, "effect": 0.2, "effect_ci": [0.1, 0.3], "n": 280,
                                "rejects": True, "reason": None, "evidence": [], "details": {}}],
        tokens={"prompt": 10, "completion": 20, "total": 30}, suite="default", suite_version="1",
        reference={"model": "ref", "revision": "r", "dtype": "float32"}, verdict_details=vd,
    )


def test_markdown_json_text_and_junit_open_with_the_two_questions() -> None:
    rep = make_report()
    md = render_markdown(rep).splitlines()
    assert md[0].startswith("# Inference audit: acme")
    assert md[2] == "| Question | Answer | In plain words |"
    assert md[4] == f"| {PRECISION_QUESTION} | **no** | it serves the model at reduced precision (quantized). |"
    assert md[5].startswith(f"| {VERIFICATION_QUESTION} | **not tested** |")
    assert md.index("> REASON-SENTENCE") > 5

    d = json.loads(render_json(rep))
    assert next(iter(d)) == "questions" and "questions" in JSON_FIELDS
    assert [(q["key"], q["question"], q["answer"]) for q in d["questions"]] == [
        ("precision", PRECISION_QUESTION, "no"), ("verification", VERIFICATION_QUESTION, "not tested")]
    assert set(d["questions"][0]) == {"key", "question", "answer", "plain", "evidence"}
    assert AuditReport.from_dict(d).to_dict() == d

    from rich.console import Console

    con = Console(width=400, record=True)
    render_text(rep, con)
    out = con.export_text()
    assert out.index(PRECISION_QUESTION) < out.index(VERIFICATION_QUESTION) < out.index("detectors (Holm")
    assert out.index(VERIFICATION_QUESTION) < out.index("verdict: QUANTIZATION")

    root = ET.fromstring(render_junit(rep).split("\n", 1)[1])
    ts = root.find("testsuite")
    assert ts is not None
    props = {p.get("name"): p.get("value") for p in ts.iter("property")}
    assert props["question.precision"] == "no" and props["question.verification"] == "not tested"
    assert "logprob-divergence" in str(props["question.precision.evidence"])
    children = [c.tag for c in ts]
    assert children[0] == "properties" and children[-1] == "system-out"  # schema order
    so = ts.find("system-out")
    assert so is not None and str(so.text).startswith(f"{PRECISION_QUESTION} no — ")


def test_standing_answers_from_its_audits_and_opens_with_them() -> None:
    t0 = dt.datetime(2026, 5, 4, 12, tzinfo=dt.UTC)
    q = reject(details(rule="2-logprob-quantization"), "logprob-divergence", 3e-9)
    recs = [AuditRecord("run-old", "precision", "m", t0, "QUANTIZATION", "q", 0.05, q),
            AuditRecord("run-new", "verification", "m", t0 + dt.timedelta(hours=1), "PASS", "ok", 0.05, details())]
    st = combine_standing("acme", recs)
    by = {x["key"]: x for x in st.questions}
    assert by["precision"]["answer"] == "no" and by["precision"]["run_id"] == "run-old"  # the cause wins
    assert by["verification"]["answer"] == "yes" and by["verification"]["suite"] == "verification"
    assert "suite verification, run run-new" in by["verification"]["evidence"]
    md = render_standing(st, "markdown").splitlines()
    assert md[2] == "| Question | Answer | In plain words |" and md[4].startswith(f"| {PRECISION_QUESTION} | **no** |")
    text = render_standing(st, "text").splitlines()
    assert text[1].startswith(f"  {PRECISION_QUESTION} no") and text[2].startswith(f"  {VERIFICATION_QUESTION} yes")
    assert json.loads(render_standing(st, "json"))["questions"][0]["answer"] == "no"
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_standing(st, "junit")).iter("property")}
    assert props["question.precision"] == "no" and props["question.verification"] == "yes"
    empty = combine_standing("nobody", [])
    assert [x["answer"] for x in empty.questions] == ["not tested", "not tested"]


def test_dashboard_run_detail_and_provider_row_show_the_questions(tmp_path) -> None:
    pytest.importorskip("streamlit")
    from auditor.check.stored_figures import store_figures
    from auditor.store import dashboard_queries as dq
    from auditor.store import models as orm
    from auditor.store import run_detail_queries as rdq
    from auditor.store.db import open_store
    from dashboard.views.overview import why_markdown
    from dashboard.views.run_detail import questions_table

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        with store.session() as s:
            run = orm.AuditRun(provider_name="acme", model="m", kind="audit", suite="default", status="completed",
                               verdict="PASS", verdict_reason="ok", alpha=0.05,
                               started_at=dt.datetime(2026, 5, 4, tzinfo=dt.UTC), summary={})
            s.add(run)
            s.flush()
            s.add(orm.VerdictRow(run_id=run.id, verdict="PASS", reason="ok", details=details(sampling=False)))
            s.flush()
            store_figures(s, run.id)  # as the pipeline does with each verdict: the dashboard reads them (issue 34)
            run_id = run.id
        with store.session() as s:
            d = rdq.run_detail(s, run_id)
            (row,) = dq.provider_overview(s)
    finally:
        store.close()
    assert d is not None and [q["answer"] for q in d["questions"]] == ["yes", "yes"]
    table = questions_table(d["questions"])
    assert table.index("original precision") < table.index("strict \\(lossless\\)")
    assert ":green-badge[yes]" in table and "temperature 0 only" in table
    assert questions_table([]) == ""
    why = why_markdown(row)
    assert "original precision" in why and "temperature 0 only" in why


def test_quantized_audit_answers_verification_only_from_the_provider_s_own_distribution() -> None:
    """With the power now recorded on a rejection, a QUANTIZATION audit has an adequate acceptance
    family; sampling-argmax compares with the reference, which is not the served distribution, so
    only self-argmax may answer "yes"."""
    d = details(rule="2-logprob-quantization")
    d["detectors"]["logprob-divergence"] = det(1e-9, rejects=True)
    p, v = answers("QUANTIZATION", d)
    assert p.answer == "no"
    assert v.answer == "not tested" and "differs from the reference" in v.evidence
    d["detectors"]["self-argmax"] = det(0.7)
    d["power"]["self-argmax"] = pw(393)
    p, v = answers("QUANTIZATION", d)
    assert v.answer == "yes" and "self-argmax on 2,000 positions" in v.evidence
    d["detectors"]["self-argmax"] = det(1e-6, rejects=True)
    assert answers("QUANTIZATION", d)[1].answer == "not tested"


# ------------------------------------------------------------------------------------------ issue 37 item 2
def _blind_near_tie() -> list[DetectorResult]:
    def mk(name: str, p: float, n: int = 2000, **kw: Any) -> DetectorResult:
        return DetectorResult(name, float(kw.get("k", 0)), p, kw.pop("effect", 0.0), (0.0, 0.0), n, [], details=kw)

    return [mk("greedy-match", 0.7, n=60, r0=1e-3, band=0.44),
            mk("greedy-near-tie", 1e-6, n=5, k=3, effect=0.6, expected=0.1, n_positions=5, band=0.44,
               flips_with_provider_list=0, flips_own_top1=0),
            mk("sampling-argmax", 0.5, n=40, expected_rate=0.6, excess_per_position=0.0, argmax_rate=0.6)]


def test_undetermined_pair_answers_both_questions_not_established() -> None:
    """An int4 provider without logprobs whose near-tie flips reject: neither question is answered "no" (that
    would accuse the wrong mechanism half the time) nor "yes": both say a deviation was found, not which."""
    v = decide_verdict(_blind_near_tie())
    assert v.verdict == "QUANTIZATION_OR_RELAXED_VERIFICATION"
    p, ver = answer_questions(v.verdict, v.details)
    for a, other in ((p, "relaxed"), (ver, "quantiz")):
        assert a.answer == "not established", a
        assert "not established which" in a.evidence and other in a.evidence and "greedy-near-tie" in a.evidence
        assert "logprobs" in a.evidence and "\n" not in a.evidence
    # a "no" of a secondary cause still wins; the standing keeps "not established" over a newer "yes"
    yes = answer_questions("PASS", details())
    (cp, ip), (cv, iv) = combine_answers([("new", yes), ("old", [p, ver])])
    assert (cp.answer, ip) == ("not established", 1) and (cv.answer, iv) == ("not established", 1)
    q = answer_questions("QUANTIZATION", reject(details(rule="2-logprob-quantization"), "logprob-divergence", 1e-9))
    (cp, ip), _ = combine_answers([("new", [p, ver]), ("old", q)])
    assert (cp.answer, ip) == ("no", 1)


def test_undetermined_pair_in_every_format_and_the_standing() -> None:
    v = decide_verdict(_blind_near_tie())
    rep = AuditReport(
        run_id="abc123", provider="acme", model="m", verdict=v.verdict, verdict_reason=v.reason, alpha=0.05,
        detectors=[], tokens={"prompt": 10, "completion": 20, "total": 30}, suite="smoke", suite_version="1",
        reference={"model": "ref", "revision": "r", "dtype": "float32"}, verdict_details=v.details)
    assert rep.exit_code == 1
    md = render_markdown(rep)
    assert f"| {PRECISION_QUESTION} | **not established** |" in md
    assert f"| {VERIFICATION_QUESTION} | **not established** |" in md
    assert [q["answer"] for q in json.loads(render_json(rep))["questions"]] == ["not established"] * 2
    from rich.console import Console

    con = Console(width=400, record=True)
    render_text(rep, con)
    out = con.export_text()
    assert f"{PRECISION_QUESTION} not established" in out and "QUANTIZATION_OR_RELAXED_VERIFICATION" in out
    root = ET.fromstring(render_junit(rep).split("\n", 1)[1])
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["question.precision"] == props["question.verification"] == "not established"
    assert root.find(".//failure") is not None  # a deviation was found: CI fails
    t0 = dt.datetime(2026, 5, 4, 12, tzinfo=dt.UTC)
    from auditor.watch.standing import SEVERITY

    assert SEVERITY.index("QUANTIZATION") < SEVERITY.index("QUANTIZATION_OR_RELAXED_VERIFICATION") \
        < SEVERITY.index("RELAXED_VERIFICATION")
    st = combine_standing("acme", [
        AuditRecord("run-a", "smoke", "m", t0, v.verdict, v.reason, 0.05, v.details),
        AuditRecord("run-b", "verification", "m", t0 + dt.timedelta(hours=1), "RELAXED_VERIFICATION", "r", 0.05,
                    reject(details(rule="4c-relaxed"), "sampling-argmax", 1e-6))])
    assert st.standing == "QUANTIZATION_OR_RELAXED_VERIFICATION" and st.exit_code == 1
    assert {x["key"]: x["answer"] for x in st.questions} == {"precision": "not established", "verification": "no"}


def test_standing_not_tested_section_never_reads_as_all_clear_beside_open_answers() -> None:
    """Issue 38 item 2: "Every detector ran in some recent audit" stood on a page whose answers were
    "not tested"; the section now says which question is still open."""
    from auditor.watch.standing import combine_standing, render_standing

    md = render_standing(combine_standing("nobody", []), "markdown")
    section = md.split("## Not tested", 1)[1]
    assert f"{PRECISION_QUESTION} is still **not tested**" in section
