"""Parameter-compliance pre-flight (auditor.check.preflight) against the simulator's compliance faults
(issue 13): each fault is caught by its own check; honest-fp32 passes every check."""

from __future__ import annotations

import math

import pytest

from auditor.check.preflight import (
    PreflightReport,
    evaluate_preflight,
    plan_preflight,
    poisson_binomial_cdf,
    run_preflight,
    stop_string,
)
from auditor.verdict.decide import decide_verdict
from probes.config import Capabilities, ProviderConfig
from simulator.profiles import get_profile
from simulator.server import ServerThread, create_app

ALL = ("t0-determinism", "seed", "max-tokens", "stop", "greedy-top1", "top-p", "prompt-tokens")


def _cfg_model(app):
    import fastapi.testclient as tc

    with tc.TestClient(app) as c:
        return c.get("/v1/models").json()["data"][0]["id"]


def run_sim(lm, max_tokens=64, **overrides) -> PreflightReport:
    app = create_app(get_profile("honest-fp32", **overrides), lm, seed=0)
    model = _cfg_model(app)
    with ServerThread(app) as srv:
        cfg = ProviderConfig(name="sim", base_url=srv.base_url, model=model,
                             capabilities=Capabilities(max_top_logprobs=5, seed=True))
        return run_preflight(cfg, lm.tokenizer, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def honest(peaked_lm):
    return run_sim(peaked_lm)


def test_honest_fp32_passes_every_check(honest):
    got = {c.name: c.passed for c in honest.checks}
    assert got == dict.fromkeys(ALL, True), [c.summary for c in honest.checks]
    assert honest.template_mismatch() is None
    tp = honest.check("top-p")
    assert tp.n >= 50 and tp.evidence["expected"] > 5  # the test had something to see
    res = honest.detector_results()
    assert [r.name for r in res] == ["preflight-greedy-top1", "preflight-top-p"]
    assert all(r.ran and r.p_value > 1e-3 for r in res)


def test_ignore_seed_is_caught(peaked_lm):
    rep = run_sim(peaked_lm, max_tokens=16, ignore_seed=True)
    assert rep.check("seed").passed is False
    assert "differ" in rep.check("seed").summary
    assert rep.check("t0-determinism").passed is True  # greedy does not depend on the seed


def test_server_top_k_is_caught(peaked_lm):
    rep = run_sim(peaked_lm, forced_top_k=3)
    c = rep.check("top-p")
    assert c.passed is False and c.p_value < 1e-4
    assert c.evidence["observed_unlisted"] == 0 and c.evidence["expected_unlisted"] > 5
    v = decide_verdict(rep.detector_results())
    assert v.verdict == "DECODING_NONCOMPLIANT" and v.details["rule"] == "6-preflight-sampling"


def test_injected_system_prompt_is_caught(peaked_lm):
    rep = run_sim(peaked_lm, max_tokens=8, inject_system_prompt="You are a terse assistant. Never mention prices.")
    c = rep.check("prompt-tokens")
    assert c.passed is False
    # SmolLM2's template puts its own default system prompt in when none is given, so an injected
    # one changes the count in either direction; what matters is that it differs
    assert c.evidence["provider_prompt_tokens"] != c.evidence["reference_prompt_tokens"]
    tm = rep.template_mismatch()
    assert tm is not None and tm["reference_prompt_tokens"] == c.evidence["reference_prompt_tokens"]


def test_report_round_trips(honest):
    again = PreflightReport.from_dict(honest.to_dict())
    assert [c.passed for c in again.checks] == [c.passed for c in honest.checks]
    # the stored exchanges alone reproduce the checks (re-analysis of a stored run)
    re = evaluate_preflight("chat", honest.to_dict()["exchanges"])
    assert {c.name: c.passed for c in re.checks if c.name != "prompt-tokens"} == {
        n: True for n in ALL if n != "prompt-tokens"}
    assert re.check("prompt-tokens").passed is None  # no tokenizer given


def test_failed_requests_leave_checks_not_run():
    cfg = ProviderConfig(name="dead", base_url="http://127.0.0.1:9/v1", model="m", timeout_s=2)
    rep = run_preflight(cfg, None)
    assert all(c.passed is None for c in rep.checks)
    assert all(not r.ran for r in rep.detector_results())


def test_plan_respects_capabilities():
    cfg = ProviderConfig(name="x", base_url="http://x/v1", model="m", capabilities=Capabilities(max_top_logprobs=3))
    plan = dict(plan_preflight(cfg))
    assert plan["seed-a"]["seed"] == plan["seed-b"]["seed"] and plan["seed-a"]["top_p"] == 1.0
    assert "top_k" not in plan["seed-a"] and plan["seed-a"]["top_logprobs"] == 3
    assert plan["max-tokens"]["max_tokens"] == 4
    assert stop_string("Once upon a time there was a little kitten named Tom") is not None


def test_poisson_binomial_cdf_matches_binomial():
    from scipy import stats

    for k in (0, 3, 10):
        assert math.isclose(poisson_binomial_cdf(k, [0.2] * 30), stats.binom.cdf(k, 30, 0.2), rel_tol=1e-9)
    assert poisson_binomial_cdf(-1, [0.5]) == 0.0


def _synthetic(rng, top_k=None, n_pos=60):
    """One answer drawn from random peaked distributions, the provider reporting its top-5 raw logprobs."""
    import numpy as np

    from probes.records import NormalizedResponse, TokenRecord

    toks = []
    for i in range(n_pos):
        p = rng.dirichlet(np.full(30, 0.3))
        order = np.argsort(-p)
        q = p.copy()
        if top_k is not None:
            q[order[top_k:]] = 0
            q /= q.sum()
        tok = int(rng.choice(30, p=q))
        tops = [(f"t{j}", None, float(math.log(p[j]))) for j in order[:5]]
        toks.append(TokenRecord(index=i, token=f"t{tok}", bytes=None, logprob=float(math.log(p[tok])),
                                top_logprobs=tops))
    return NormalizedResponse(text="", n_tokens=n_pos, tokens=toks, anomalies=[])


def test_top_p_check_calibrated_and_powered():
    """Under the null (tokens drawn from the reported distribution) the test rejects at most at its
    level; a server-side top-4 over the same 120 positions is rejected nearly always."""
    import numpy as np

    from auditor.check.preflight import _top_p_check

    rng = np.random.default_rng(0)
    null = np.array([_top_p_check([_synthetic(rng), _synthetic(rng)]).p_value for _ in range(300)])
    assert (null <= 0.05).mean() <= 0.08
    assert (null <= 0.2).mean() > 0.02  # not degenerate (p-values are not all 1)
    alt = np.array([_top_p_check([_synthetic(rng, top_k=4), _synthetic(rng, top_k=4)]).p_value for _ in range(50)])
    assert (alt <= 1e-3).mean() >= 0.9
