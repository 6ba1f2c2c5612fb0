"""Issue 37 item 6: one account of the evidence in every section and format.

The same verdict rendered as text, JSON, Markdown and JUnit must not contradict itself: a finding the
established cause explains (greedy near-tie flips of a quantized model; the pre-flight top-p check beside lossy
acceptance the emission models establish) carries ``explained_by``, says so wherever it is shown, and is never
listed as a cause of its own; the buyer's questions read the same in every format. And a pre-flight whose
requests were all answered, but with unusable logprobs, says "could not run: logprobs unusable"."""

from __future__ import annotations

import io
import json
import math
import xml.etree.ElementTree as ET

from rich.console import Console

from auditor.check.preflight import evaluate_preflight, plan_preflight
from auditor.report.common import AuditReport
from auditor.report.render import render
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import Verdict, VerdictKind
from probes.config import ProviderConfig
from tests.verdict_results import mk, quiet, with_

RELAXED_IMPLICATION = "greedy verification accepts non-argmax drafts"


def int4_with_logprobs() -> Verdict:
    """The issue's int4 audit: logprob divergence (QUANTIZATION) and greedy near-tie flips (p = 6.6e-08) whose
    flips are mostly not the provider's own top-1 (read alone, rule 3n would say RELAXED_VERIFICATION)."""
    lp = mk("logprob-divergence", 1e-30, effect=0.05, ratio_to_floor=40.0, top1_agreement=0.9, m=5, n_prompts=40,
            confident_flip_ratio=1.5, confident_flips=2, confident_flips_expected=1.0, n_confident=600)
    nt = mk("greedy-near-tie", 6.6e-8, n=40, statistic=11, effect=11 / 40, k=11, expected=1.2, n_positions=40,
            band=0.44, flips_with_provider_list=11, flips_own_top1=3)
    return decide_verdict([*with_(quiet(), lp), nt])


def relaxed_with_preflight() -> Verdict:
    """The independent relaxed server: argmax over-emitted, acceptance beats truncation by 24 nats in the emission
    models, and the pre-flight top-p check (the same missing tail) rejects too."""
    tail = mk("sampling-tail", 1e-8, tail_ratio=0.5, deficit_per_position=0.02, mean_tail_mass=0.05,
              emission={"log_lik_ratio": -24.0, "n": 800, "truncation": {"cut": "top-p", "parameter": 0.95, "leak": 0.1},
                        "acceptance": {"cut": "pro-rata", "parameter": 0.3, "leak": 0.7}})
    arg = mk("sampling-argmax", 1e-12, excess_per_position=0.08, argmax_rate=0.7, expected_rate=0.62)
    pre = mk("preflight-top-p", 1e-7, n=180, statistic=1.0, expected=11.2, observed=1)
    return decide_verdict([*with_(quiet(), tail, arg), pre])


def report_of(v: Verdict) -> AuditReport:
    dets = [{"name": r.name, **v.details["detectors"][r.name], "evidence": [], "details": r.details} for r in v.results]
    return AuditReport(
        run_id="r37", provider="acme", model="smollm2", verdict=v.verdict, verdict_reason=v.reason, alpha=0.05,
        detectors=dets, tokens={"prompt": 1000, "completion": 2000, "total": 3000, "budget": 2000},
        cost_usd=0.0, suite="default", suite_version="1", suite_digest="0" * 16,
        reference={"model": "smollm2-135m-instruct", "revision": "r", "dtype": "float32"},
        started_at="2026-12-05T00:00:00+00:00", finished_at="2026-12-05T00:01:00+00:00", summary={},
        verdict_details=v.details, probes={"total": 20, "ok": 20, "failed": 0}, prompts={}, wall_s=1.0)


def renderings(rep: AuditReport) -> dict[str, str]:
    buf = io.StringIO()
    render(rep, "text", Console(file=buf, width=1000))
    return {"text": buf.getvalue(), **{fmt: render(rep, fmt) or "" for fmt in ("json", "markdown", "junit")}}


def junit_causes(xml: str) -> list[str]:
    return [tc.get("name", "") for tc in ET.fromstring(xml).iter("testcase") if tc.get("name", "").startswith("cause:")]


def questions_in(fmt: str, out: str) -> dict[str, str]:
    """The two answers as each format states them."""
    if fmt == "json":
        return {q["key"]: q["answer"] for q in json.loads(out)["questions"]}
    if fmt == "junit":
        props = {p.get("name"): p.get("value") for p in ET.fromstring(out).iter("property")}
        return {k: str(props[f"question.{k}"]) for k in ("precision", "verification")}
    found = {}
    for key, q in (("precision", "original precision?"), ("verification", "strict (lossless)?")):
        line = next(ln for ln in out.splitlines() if q in ln)
        found[key] = next(a for a in ("not established", "not tested", "undecided", "yes", "no")
                          if f"{q} {a} —" in line or f"| **{a}** |" in line)
    return found


def test_near_tie_flips_of_a_quantized_model_are_explained_not_a_second_cause_in_every_format() -> None:
    v = int4_with_logprobs()
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["secondary_causes"] == []
    f = {x["detector"]: x for x in v.details["findings"]}
    assert f["greedy-near-tie"]["explained_by"] == "QUANTIZATION"
    assert "explained by the established cause" in f["greedy-near-tie"]["implication"]
    rep = report_of(v)
    outs = renderings(rep)
    answers = {fmt: questions_in(fmt, out) for fmt, out in outs.items()}
    assert len({tuple(sorted(a.items())) for a in answers.values()}) == 1, answers
    assert answers["json"]["precision"] == "no" and answers["json"]["verification"] != "no"
    for fmt, out in outs.items():
        assert "explained by" in out and "QUANTIZATION" in out, fmt
        assert "also RELAXED_VERIFICATION" not in out and "RELAXED_VERIFICATION (" not in out, fmt
        # the registry's relaxed reading of near-tie flips appears only together with its explanation
        for line in out.splitlines():
            if RELAXED_IMPLICATION in line:
                assert "explained by" in line, (fmt, line)
    assert junit_causes(outs["junit"]) == []
    assert json.loads(outs["json"])["secondary_causes"] == []
    assert "REJECTS (explained by QUANTIZATION)" in outs["text"] and "REJECTS (explained by QUANTIZATION)" in outs["markdown"]


def test_preflight_top_p_adds_no_decoding_noncompliant_beside_decisive_acceptance() -> None:
    v = relaxed_with_preflight()
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION and v.details["rule"] == "4c-relaxed"
    assert [c["verdict"] for c in v.details["secondary_causes"]] == []
    f = {x["detector"]: x for x in v.details["findings"]}
    assert f["preflight-top-p"]["explained_by"] == "RELAXED_VERIFICATION"
    outs = renderings(report_of(v))
    for fmt, out in outs.items():
        assert "DECODING_NONCOMPLIANT" not in out, fmt
    assert junit_causes(outs["junit"]) == []
    assert {fmt: questions_in(fmt, out)["verification"] for fmt, out in outs.items()} == dict.fromkeys(outs, "no")


def test_preflight_top_p_stays_a_cause_beside_a_model_deviation() -> None:
    """Quantized weights do not thin the provider's own tail: there the pre-flight is its own cause."""
    v = decide_verdict([*with_(
        quiet(), mk("logprob-divergence", 1e-30, effect=0.05, ratio_to_floor=40.0, top1_agreement=0.9, m=5,
                    n_prompts=40, confident_flip_ratio=1.5, confident_flips=2, confident_flips_expected=1.0,
                    n_confident=600)), mk("preflight-top-p", 1e-7, n=180, statistic=1.0, expected=11.2)])
    assert v.verdict == VerdictKind.QUANTIZATION
    assert [c["verdict"] for c in v.details["secondary_causes"]] == ["DECODING_NONCOMPLIANT"]


def _answered(body: dict, logprob: float) -> dict:
    toks = ["The", " answer", " is", " 4", "."][: min(5, int(body.get("max_tokens", 5)))]
    content = [{"token": t, "logprob": logprob, "bytes": list(t.encode()),
                "top_logprobs": [{"token": t, "logprob": logprob, "bytes": list(t.encode())},
                                 {"token": "x", "logprob": logprob, "bytes": [120]}]} for t in toks]
    js = {"id": "a", "object": "chat.completion", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "".join(toks)}, "logprobs": {"content": content},
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": len(toks)}}
    return {"request": body, "ok": True, "json": js, "text": "".join(toks), "finish_reason": "stop",
            "usage": js["usage"], "http_status": 200}


def test_preflight_with_unusable_logprobs_says_so_not_a_request_failed() -> None:
    cfg = ProviderConfig(name="nan", base_url="http://127.0.0.1:9/v1", model="m")
    ex = [{"key": k, **_answered(b, math.nan)} for k, b in plan_preflight(cfg)]
    rep = evaluate_preflight("chat", ex)
    for name in ("greedy-top1", "top-p"):
        c = rep.check(name)
        assert c is not None and c.passed is None
        assert c.summary.startswith("could not run: logprobs unusable") and "NaN or infinite" in c.summary, c.summary
        assert "request failed" not in c.summary
    assert all("request failed" not in c.summary for c in rep.checks)
    # a provider that sent no logprobs at all is not called unusable
    plain = []
    for k, body in plan_preflight(cfg):
        ex1 = {"key": k, **_answered(body, -0.5)}
        ex1["json"]["choices"][0]["logprobs"] = None
        plain.append(ex1)
    g = evaluate_preflight("chat", plain).check("greedy-top1")
    assert g is not None and g.passed is None and "unusable" not in g.summary
