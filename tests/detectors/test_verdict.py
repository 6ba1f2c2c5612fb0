"""Decision rules of auditor.verdict.decide on hand-made detector results (one test per rule)."""

from __future__ import annotations

import json

import pytest

from auditor.detectors import DetectorResult, not_run
from auditor.verdict.cause import SAMPLED_FLIP_MAX_SIGMA
from auditor.verdict.decide import apply_holm, decide_verdict
from auditor.verdict.kinds import EXIT_CODES, VerdictKind
from auditor.verdict.model_rules import SUBSTITUTION_MIN_FLIP_RATIO
from auditor.verdict.power import required_positions


def mk(name, p, *, effect=0.0, n=1000, statistic=0.0, **details):
    return DetectorResult(
        name, statistic, p, effect, (effect, effect), n, [], details=details
    )


def quiet(n=2000):
    """A full, clean audit: nothing rejects, large samples."""
    return [
        mk("greedy-match", 1.0, n=n, r0=1e-3, band=0.2),
        mk(
            "logprob-divergence",
            0.6,
            n=n,
            effect=1e-4,
            ratio_to_floor=1.0,
            top1_agreement=0.99,
            m=5,
            n_prompts=40,
        ),
        mk("sampling-gof", 0.5, n=n),
        mk(
            "sampling-argmax",
            0.4,
            n=n,
            expected_rate=0.6,
            excess_per_position=0.0,
            argmax_rate=0.6,
        ),
        mk(
            "sampling-tail",
            0.5,
            n=n,
            mean_tail_mass=0.05,
            tail_ratio=1.0,
            deficit_per_position=0.0,
        ),
        mk("self-greedy", 1.0, n=n, r0=1e-3, band=0.2),
    ]


def replace(results, new):
    return [new if r.name == new.name else r for r in results]


def test_pass_when_nothing_rejects_and_powered():
    v = decide_verdict(quiet())
    assert v.verdict == VerdictKind.PASS and v.exit_code == 0
    assert v.details["rule"] == "5-pass"
    assert v.details["power"]["greedy-match"]["adequate"]
    assert all(f["adequate"] for f in v.details["power_families"].values())


def test_pass_needs_every_tested_family_powered():
    # greedy family well powered, sampling family tiny: not a PASS
    res = [r for r in quiet() if not r.name.startswith("sampling")]
    res += [
        mk(
            "sampling-argmax",
            0.4,
            n=30,
            var_per_position=0.2,
            excess_per_position=0.0,
            argmax_rate=0.6,
        )
    ]
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.INCONCLUSIVE and "acceptance" in v.reason
    # without sampling at all, PASS says what was not tested
    v = decide_verdict([r for r in quiet() if not r.name.startswith("sampling")])
    assert (
        v.verdict == VerdictKind.PASS
        and "not tested: acceptance, truncation" in v.reason
    )
    assert all(r.p_adjusted is not None for r in v.results)
    json.dumps(v.details, allow_nan=False)


def test_inconclusive_when_underpowered_names_a_budget():
    v = decide_verdict(quiet(n=12))
    assert v.verdict == VerdictKind.INCONCLUSIVE and v.exit_code == 2
    budget = v.details["suggested_budget_tokens"]
    assert budget is not None and budget > 12
    assert str(budget) in v.reason
    # adding that many tokens makes every family adequate
    assert decide_verdict(quiet(n=12 + budget)).verdict == VerdictKind.PASS
    assert set(v.details["power_families"]) == {
        "model",
        "acceptance",
        "truncation",
        "decode-path",
    }


def test_inconclusive_when_nothing_ran():
    v = decide_verdict(
        [not_run("greedy-match", "too few"), not_run("sampling-argmax", "too few")]
    )
    assert (
        v.verdict == VerdictKind.INCONCLUSIVE and v.details["rule"] == "0-nothing-ran"
    )
    assert v.details["suggested_budget_tokens"] > 0
    assert v.details["not_run"]["greedy-match"] == "too few"


def test_rule1_self_greedy_is_decoding_noncompliant_never_relaxed():
    res = replace(
        quiet(), mk("self-greedy", 1e-8, statistic=9, effect=0.05, band=0.2, r0=1e-3)
    )
    res = replace(
        res,
        mk(
            "sampling-argmax",
            1e-6,
            excess_per_position=0.1,
            argmax_rate=0.7,
            expected_rate=0.6,
        ),
    )
    v = decide_verdict(res)
    assert (
        v.verdict == VerdictKind.DECODING_NONCOMPLIANT
        and v.details["rule"] == "1-self-greedy"
    )
    assert {f["detector"] for f in v.details["findings"]} == {
        "self-greedy",
        "sampling-argmax",
    }


def test_rule1_yields_to_logprob_divergence():
    res = replace(quiet(), mk("self-greedy", 1e-8, statistic=9))
    res = replace(
        res,
        mk(
            "logprob-divergence",
            1e-9,
            effect=0.05,
            ratio_to_floor=40,
            top1_agreement=0.9,
            m=5,
        ),
    )
    v = decide_verdict(res)
    assert (
        v.verdict == VerdictKind.QUANTIZATION
        and v.details["rule"] == "2-logprob-quantization"
    )


#: details of a different model's logprob-divergence: confident positions flip far beyond the noise scale
FLIPS = {"confident_flip_ratio": SUBSTITUTION_MIN_FLIP_RATIO * 5, "confident_flips": 60,
         "confident_flips_expected": 1.2, "n_confident": 500, "sigma_hat": 0.9}


@pytest.mark.parametrize(
    "kl, top1, flips, want",
    [
        (0.05, 0.9, {}, VerdictKind.QUANTIZATION),
        (0.5, 0.35, FLIPS, VerdictKind.SUBSTITUTION),
        # far outside production quantization with noise-like flips: 3-bit weights or another model, undetermined
        (0.5, 0.35, {**FLIPS, "confident_flip_ratio": 1.3}, VerdictKind.QUANTIZATION_OR_SUBSTITUTION),
        (0.2, 0.75, {**FLIPS, "confident_flip_ratio": 1.3}, VerdictKind.QUANTIZATION),  # int4-like: noise-like flips
        (0.37, 0.76, FLIPS, VerdictKind.SUBSTITUTION),  # gemma's substitute: KL and top-1 like int4
    ],
)
def test_rule2_logprob_quantization_vs_substitution(kl, top1, flips, want):
    res = replace(
        quiet(),
        mk(
            "logprob-divergence",
            1e-12,
            effect=kl,
            ratio_to_floor=kl / 1e-4,
            top1_agreement=top1,
            m=5,
            **flips,
        ),
    )
    v = decide_verdict(res)
    assert v.verdict == want and v.exit_code == 1


def test_rule3_greedy_with_consistent_logprobs_is_decode_path():
    res = replace(quiet(), mk("greedy-match", 1e-10, effect=0.06, band=0.2, r0=1e-3))
    v = decide_verdict(res)
    assert (
        v.verdict == VerdictKind.DECODING_NONCOMPLIANT
        and v.details["rule"] == "3-greedy-decode-path"
    )
    assert v.details["logprobs_consistent"]


@pytest.mark.parametrize(
    "rate, want", [(0.08, VerdictKind.QUANTIZATION), (0.6, VerdictKind.QUANTIZATION_OR_SUBSTITUTION)]
)
def test_rule3_greedy_only_audit_by_effect_size(rate, want):
    res = [
        mk("greedy-match", 1e-10, effect=rate, band=0.2, r0=1e-3),
        not_run("logprob-divergence", "no logprobs"),
    ]
    v = decide_verdict(res)
    assert v.verdict == want and v.exit_code == 1
    if want == VerdictKind.QUANTIZATION_OR_SUBSTITUTION:
        assert v.details["rule"] == "3-greedy-model-deviation" and "cannot tell" in v.reason


def test_rule4a_greedy_served_sampling():
    res = replace(
        quiet(), mk("sampling-argmax", 1e-30, excess_per_position=0.4, argmax_rate=1.0)
    )
    res = replace(
        res,
        mk(
            "sampling-tail",
            1e-9,
            tail_ratio=0.0,
            deficit_per_position=0.05,
            mean_tail_mass=0.05,
        ),
    )
    v = decide_verdict(res)
    assert (
        v.verdict == VerdictKind.DECODING_NONCOMPLIANT
        and v.details["rule"] == "4a-greedy-served"
    )


def test_rule4b_truncated_tail():
    res = replace(
        quiet(),
        mk(
            "sampling-tail",
            1e-6,
            tail_ratio=0.1,
            deficit_per_position=0.045,
            mean_tail_mass=0.05,
        ),
    )
    v = decide_verdict(res)
    assert (
        v.verdict == VerdictKind.DECODING_NONCOMPLIANT
        and v.details["rule"] == "4b-truncated"
    )
    # partial tail deficit but deficit >= shape ratio x argmax excess: still truncation
    res = replace(
        res,
        mk(
            "sampling-tail",
            1e-6,
            tail_ratio=0.5,
            deficit_per_position=0.03,
            mean_tail_mass=0.06,
        ),
    )
    res = replace(
        res, mk("sampling-argmax", 1e-3, excess_per_position=0.02, argmax_rate=0.62)
    )
    assert decide_verdict(res).details["rule"] == "4b-truncated"


def test_rule4c_relaxed_argmax_over_emission_with_tail_thinned():
    res = replace(
        quiet(), mk("sampling-argmax", 1e-8, excess_per_position=0.09, argmax_rate=0.69)
    )
    res = replace(
        res,
        mk(
            "sampling-tail",
            1e-3,
            tail_ratio=0.7,
            deficit_per_position=0.015,
            mean_tail_mass=0.05,
        ),
    )
    v = decide_verdict(res)
    assert (
        v.verdict == VerdictKind.RELAXED_VERIFICATION
        and v.details["rule"] == "4c-relaxed"
    )
    assert v.details["shape"]["argmax_excess_per_position"] == pytest.approx(0.09)


def test_rule4d_pit_only():
    res = replace(quiet(), mk("sampling-gof", 1e-6))
    v = decide_verdict(
        res
    )  # logprobs consistent -> samples do not follow the reported distribution
    assert (
        v.verdict == VerdictKind.RELAXED_VERIFICATION
        and v.details["rule"] == "4d-relaxed"
    )
    no_lp = [r for r in res if r.name != "logprob-divergence"]
    no_lp = replace(
        no_lp,
        mk(
            "sampling-argmax",
            0.9,
            excess_per_position=-0.02,
            argmax_rate=0.58,
            expected_rate=0.6,
        ),
    )
    v = decide_verdict(no_lp)
    assert (
        v.verdict == VerdictKind.QUANTIZATION and v.details["rule"] == "4d-quantization"
    )


def _sampled_path(obs, expected, n_conf=120):
    return {"confident_flip_ratio": (obs + 1) / (expected + 1), "confident_flips": obs,
            "confident_flips_expected": expected, "n_confident": n_conf, "sigma_hat": 0.3,
            "confident_margin_sigmas": 3.0, "confident_flip_p": 1e-9, "margin_bins": [], "n_positions": 400}


def test_rule4d_sampled_flip_statistic_names_a_different_model():
    """A sampling-only audit (no logprob test: it runs at T = 0 only): rule 4d decides quantized copy vs different
    model by rule 2's flip statistic on the sampled positions' top_logprobs, when it is informative."""
    base = [r for r in quiet() if r.name not in ("logprob-divergence", "greedy-match")]
    arg = mk("sampling-argmax", 0.9, excess_per_position=-0.2, argmax_rate=0.4, expected_rate=0.6)
    sub = decide_verdict(replace(replace(base, arg), mk("sampling-gof", 1e-8, sampled_path=_sampled_path(40, 2.0))))
    assert sub.verdict == VerdictKind.SUBSTITUTION and sub.details["rule"] == "4d-substitution", sub.reason
    assert sub.details["cause_confidence"]["path"] == "sampled" and "sampled continuations" in sub.reason
    q = decide_verdict(replace(replace(base, arg), mk("sampling-gof", 1e-8, sampled_path=_sampled_path(3, 2.5))))
    assert q.verdict == VerdictKind.QUANTIZATION and q.details["rule"] == "4d-quantization"
    assert q.details["cause_confidence"]["value"] < SUBSTITUTION_MIN_FLIP_RATIO
    # a ratio above the threshold on a handful of flips (int4 at sampled prefixes: 5 where 1.04 are predicted) is
    # not enough: the flips must significantly exceed threshold x the prediction
    few = decide_verdict(replace(replace(base, arg), mk("sampling-gof", 1e-8, sampled_path=_sampled_path(6, 0.6))))
    assert few.details["cause_confidence"]["value"] > SUBSTITUTION_MIN_FLIP_RATIO
    assert few.verdict == VerdictKind.QUANTIZATION and few.details["cause_confidence"]["substitution_p"] > 0.01
    # rule 4d says how firmly: 6 flips where 0.6 are predicted do not rule out another model (the milder cause)
    assert few.details["cause_established"] is False and "the milder cause" in few.reason
    assert sub.details["cause_established"] is True



@pytest.mark.parametrize("flips", [40, 3])
def test_rule4d_beyond_the_calibrated_noise_scale_the_cause_is_undetermined(flips):
    """σ̂ above SAMPLED_FLIP_MAX_SIGMA (3-bit weights, a layer-pruned model): whatever the flips say, the verdict is
    QUANTIZATION_OR_SUBSTITUTION — the flip test's isotropic-noise model is not calibrated that far."""
    base = [r for r in quiet() if r.name not in ("logprob-divergence", "greedy-match")]
    arg = mk("sampling-argmax", 0.9, excess_per_position=-0.2, argmax_rate=0.4, expected_rate=0.6)
    sp = dict(_sampled_path(flips, 2.0), sigma_hat=SAMPLED_FLIP_MAX_SIGMA + 0.2)
    v = decide_verdict(replace(replace(base, arg), mk("sampling-gof", 1e-8, sampled_path=sp)))
    assert v.verdict == VerdictKind.QUANTIZATION_OR_SUBSTITUTION and v.details["rule"] == "4d-model-deviation"
    assert v.exit_code == 1 and f"{SAMPLED_FLIP_MAX_SIGMA:g} nats" in v.reason
    # at the calibrated scale the flip test decides again
    sp["sigma_hat"] = SAMPLED_FLIP_MAX_SIGMA
    v = decide_verdict(replace(replace(base, arg), mk("sampling-gof", 1e-8, sampled_path=sp)))
    assert v.verdict == (VerdictKind.SUBSTITUTION if flips == 40 else VerdictKind.QUANTIZATION)
    # too few confident positions for the ratio to exceed the threshold: not informative, the milder cause
    thin_path = _sampled_path(2, 0.1, n_conf=2)
    thin = decide_verdict(replace(replace(base, arg), mk("sampling-gof", 1e-8, sampled_path=thin_path)))
    assert thin.verdict == VerdictKind.QUANTIZATION and not thin.details["cause_confidence"]["informative"]


def test_self_tests_stand_in_without_reference():
    res = [
        mk("self-gof", 1e-5),
        mk(
            "self-argmax",
            1e-7,
            excess_per_position=0.1,
            argmax_rate=0.7,
            expected_rate=0.6,
        ),
        mk(
            "self-tail",
            0.3,
            tail_ratio=0.9,
            deficit_per_position=0.004,
            mean_tail_mass=0.05,
        ),
        mk("self-greedy", 1.0, r0=1e-3),
    ]
    assert decide_verdict(res).verdict == VerdictKind.RELAXED_VERIFICATION


def test_holm_decides_significance():
    base = [
        mk("greedy-match", 0.02, effect=0.05, r0=1e-3, band=0.2),
        mk("sampling-gof", 0.03),
    ]
    v = decide_verdict(base)  # Holm: 0.04, 0.04
    assert v.verdict != VerdictKind.PASS
    assert [r.p_adjusted for r in v.results] == pytest.approx([0.04, 0.04])
    more = base + [mk(f"self-{k}", 0.9) for k in ("gof", "argmax", "tail", "greedy")]
    v = decide_verdict(more)  # 6 tests: 0.02 * 6 = 0.12
    assert v.verdict in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE)
    adj = apply_holm([mk("a", 0.01), not_run("b", "x"), mk("c", 0.04)])
    assert adj[1].p_adjusted is None and adj[0].p_adjusted == pytest.approx(0.02)


def test_errors_and_exit_codes():
    with pytest.raises(ValueError, match="alpha"):
        decide_verdict(quiet(), alpha=0)
    with pytest.raises(ValueError, match="power"):
        decide_verdict(quiet(), power=1.0)
    with pytest.raises(ValueError, match="duplicate"):
        decide_verdict([mk("a", 0.5), mk("a", 0.5)])
    assert {EXIT_CODES[k] for k in VerdictKind} == {0, 1, 2}


def test_required_positions_shrink_with_alpha_and_grow_with_power():
    g = mk("greedy-match", 0.5, r0=1e-3)
    a = required_positions(g, alpha_test=0.05, power=0.8)
    b = required_positions(g, alpha_test=0.001, power=0.8)
    c = required_positions(g, alpha_test=0.05, power=0.95)
    assert a < b and a < c
    t = mk("sampling-tail", 0.5, mean_tail_mass=0.05)
    assert required_positions(t, alpha_test=0.01) == pytest.approx(
        -__import__("math").log(0.01) / 0.05, abs=1
    )
    assert required_positions(mk("sampling-gof", 0.5), alpha_test=0.01) is None


# --------------------------------------------------------------------------- issue 13: every cause
def llama_like(ratio=3.8):
    """A weight-faithful engine with 8-bit activations (logprobs ~3.8x the floor), a repetition
    penalty on its greedy path and server-side sampler defaults (tail missing)."""
    res = quiet()
    res = replace(res, mk("logprob-divergence", 1e-30, n=2000, effect=0.004, ratio_to_floor=ratio,
                          top1_agreement=0.97, m=5, n_prompts=40))
    res = replace(res, mk("self-greedy", 1e-57, n=2000, statistic=60, r0=1e-3, band=0.2))
    res += [mk("self-tail", 1e-15, n=2000, tail_ratio=0.26, deficit_per_position=0.05, mean_tail_mass=0.07),
            mk("self-argmax", 0.3, n=2000, excess_per_position=0.01, argmax_rate=0.6, expected_rate=0.6)]
    return res


def test_primary_quantization_mild_wording_and_decoding_faults_listed():
    v = decide_verdict(llama_like())
    assert v.verdict == VerdictKind.QUANTIZATION
    assert "reduced-precision computation of the declared weights" in v.reason
    assert "other weights" in v.reason  # says what it is not
    sec = v.details["secondary_causes"]
    rules = [c["rule"] for c in sec]
    assert rules == ["1-self-greedy", "4b-truncated"]
    assert all(c["verdict"] == "DECODING_NONCOMPLIANT" for c in sec)
    ev = sec[0]["evidence"][0]
    assert ev["detector"] == "self-greedy" and ev["p_adjusted"] <= 0.05
    assert sec[1]["evidence"][0]["detector"] == "self-tail"
    assert "also DECODING_NONCOMPLIANT" in v.reason
    assert v.exit_code == 1
    json.dumps(v.details)


def test_strong_divergence_not_worded_mild():
    v = decide_verdict(llama_like(ratio=20.0))
    assert v.verdict == VerdictKind.QUANTIZATION
    assert "reduced-precision computation of the declared weights" not in v.reason
    assert "not a different model" in v.reason


def test_model_difference_ignores_reference_sampling_tests_for_secondary():
    # quantized model: the reference sampling tail test rejects because the model differs, the
    # provider's own samples follow its own distribution → no sampling cause is added
    res = replace(quiet(), mk("logprob-divergence", 1e-12, n=2000, effect=0.1, ratio_to_floor=30.0,
                              top1_agreement=0.85, m=5, n_prompts=40))
    res = replace(res, mk("sampling-tail", 1e-9, n=2000, tail_ratio=0.5, deficit_per_position=0.05,
                          mean_tail_mass=0.05))
    res += [mk("self-tail", 0.5, n=2000, tail_ratio=1.0)]
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.QUANTIZATION
    assert v.details["secondary_causes"] == []


def test_weight_faithful_decoding_faults_never_pass_nor_quantization():
    res = replace(llama_like(), mk("logprob-divergence", 0.4, n=2000, effect=1e-4, ratio_to_floor=1.2,
                                   top1_agreement=0.99, m=5, n_prompts=40))
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.DECODING_NONCOMPLIANT and v.details["rule"] == "1-self-greedy"
    assert [c["rule"] for c in v.details["secondary_causes"]] == ["4b-truncated"]


def test_secondary_cause_needs_same_family_wise_alpha():
    # self-greedy raw p=0.02 is significant alone but not after Holm over 8 tests → not listed
    res = replace(llama_like(), mk("self-greedy", 0.02, n=2000, statistic=3, r0=1e-3, band=0.2))
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.QUANTIZATION
    assert "1-self-greedy" not in [c["rule"] for c in v.details["secondary_causes"]]


def test_pass_has_no_secondary_causes():
    v = decide_verdict(quiet())
    assert v.details["secondary_causes"] == [] and "also" not in v.reason


@pytest.mark.parametrize("failed,expect_inconclusive", [(48, True), (5, False)])
def test_provider_failures_make_inconclusive(failed, expect_inconclusive):
    fails = {"failed": failed, "total": 52, "kinds": {"truncated_stream": failed}}
    v = decide_verdict(llama_like(), provider_failures=fails)
    assert v.details["provider_failures"]["share"] == pytest.approx(failed / 52)
    if expect_inconclusive:
        assert v.verdict == VerdictKind.INCONCLUSIVE and v.exit_code == 2
        assert v.reason.startswith("provider failures") and "truncated_stream 48" in v.reason
        assert "would suffice" not in v.reason
        assert v.details["rule"] == "0-provider-failures"
        assert v.details["secondary_causes"][0]["verdict"] == "QUANTIZATION"
        assert v.details["suggested_budget_tokens"] is None
    else:
        assert v.verdict == VerdictKind.QUANTIZATION


def test_provider_failures_replace_underpowered_budget_hint():
    res = [mk("greedy-match", 1.0, n=30, r0=1e-3, band=0.2)]
    assert "would suffice" in decide_verdict(res).reason
    v = decide_verdict(res, provider_failures={"failed": 10, "total": 20, "kinds": {"rate_limited": 10}})
    assert v.verdict == VerdictKind.INCONCLUSIVE and "would suffice" not in v.reason
    assert "rate_limited 10" in v.reason


def test_template_mismatch_sets_reference_tests_aside():
    # an injected system prompt: the reference comparisons diverge, the self tests do not
    res = replace(quiet(), mk("logprob-divergence", 1e-40, n=2000, effect=0.5, ratio_to_floor=80.0,
                              top1_agreement=0.6, m=5, n_prompts=40, **FLIPS))
    res = replace(res, mk("greedy-match", 1e-20, n=2000, effect=0.4, r0=1e-3, band=0.2))
    assert decide_verdict(res).verdict == VerdictKind.SUBSTITUTION
    tm = {"provider_prompt_tokens": 61, "reference_prompt_tokens": 31}
    v = decide_verdict(res, template_mismatch=tm)
    assert v.verdict in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE)
    assert "61" in v.reason and "31" in v.reason and "chat template" in v.reason
    assert not v.details["detectors"]["logprob-divergence"]["ran"]
    assert "set aside" in v.details["not_run"]["greedy-match"]
    assert v.details["template_mismatch"] == tm


def test_template_mismatch_keeps_reference_free_causes():
    res = replace(llama_like(), mk("greedy-match", 1e-20, n=2000, effect=0.4, r0=1e-3, band=0.2))
    v = decide_verdict(res, template_mismatch={"provider_prompt_tokens": 61, "reference_prompt_tokens": 31})
    assert v.verdict == VerdictKind.DECODING_NONCOMPLIANT and v.details["rule"] == "1-self-greedy"


def test_preflight_rejection_names_decoding_noncompliant():
    res = quiet() + [mk("preflight-top-p", 1e-9, n=128, statistic=2, expected=30.0)]
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.DECODING_NONCOMPLIANT and v.details["rule"] == "6-preflight-sampling"
    assert "min-p" in v.reason
    # a pre-flight that does not reject changes nothing
    v2 = decide_verdict(quiet() + [mk("preflight-top-p", 0.7, n=128, statistic=30, expected=30.0)])
    assert v2.verdict == VerdictKind.PASS


def test_preflight_listed_behind_quantization():
    res = llama_like() + [mk("preflight-greedy-top1", 1e-8, n=96, statistic=5)]
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.QUANTIZATION
    assert "6-preflight-greedy" in [c["rule"] for c in v.details["secondary_causes"]]


def test_mild_divergence_lets_reference_sampling_tests_name_the_sampler():
    """The llama.cpp default-suite audit: logprobs 3.95x the floor, the reference tail test rejects
    with 24% of the expected tail, no self-tail test: the truncation is still named."""
    res = replace(llama_like(ratio=3.95), mk("sampling-tail", 1e-16, n=721, tail_ratio=0.24,
                                              deficit_per_position=0.06, mean_tail_mass=0.08))
    res = [r for r in res if r.name not in ("self-tail", "self-argmax")]
    v = decide_verdict(res)
    assert v.verdict == VerdictKind.QUANTIZATION
    sec = {c["rule"]: c for c in v.details["secondary_causes"]}
    assert set(sec) == {"1-self-greedy", "4b-truncated"}
    assert "sampling-tail" in [e["detector"] for e in sec["4b-truncated"]["evidence"]]
    # a strong divergence: the same reference tail rejection is not a separate cause
    strong = replace(res, mk("logprob-divergence", 1e-30, n=2000, effect=0.05, ratio_to_floor=40.0,
                             top1_agreement=0.85, m=5, n_prompts=40))
    assert "4b-truncated" not in [c["rule"] for c in decide_verdict(strong).details["secondary_causes"]]


# ------------------------------------------------------------------ rule 2t: another tokenizer
def foreign_tokens(**over):
    """``auditor.check.evidence.tokenizer_mismatch`` output: foreign token strings established."""
    tm = {"established": ["foreign_tokens"], "foreign_tokens": ["<eos>", "▁the", "▁cat", "▁key"],
          "n_foreign": 17, "n_foreign_distinct": 4, "n_checked": 300, "prompt_counts": [],
          "n_prompt_disagree": 0, "n_prompt_checked": 0, "offsets": []}
    return {**tm, **over}


def test_rule2t_tokenizer_overrides_pass_with_the_evidence():
    before = decide_verdict(quiet())
    assert before.verdict == VerdictKind.PASS
    v = decide_verdict(quiet(), tokenizer_mismatch=foreign_tokens())
    assert v.verdict == VerdictKind.SUBSTITUTION and v.exit_code == 1
    assert v.reason == (
        "the provider uses another tokenizer than the claimed model's, so it serves another model: 4 distinct token "
        "strings (17 of 300 tokens and alternatives) do not exist in the claimed model's vocabulary, e.g. '<eos>', "
        "'▁the', '▁cat', '▁key'")
    assert v.details["rule"] == "2t-tokenizer"
    assert v.details["tokenizer_mismatch"] == foreign_tokens()
    assert v.details["previous_verdict"] == {"verdict": "PASS", "reason": before.reason}
    assert v.details["secondary_causes"] == []  # a PASS is no cause
    # everything else the rules computed stays (detectors, power, findings)
    assert v.details["detectors"] == before.details["detectors"] and v.details["power"] == before.details["power"]


def test_rule2t_keeps_the_statistical_cause_as_first_secondary():
    before = decide_verdict(llama_like())
    tm = foreign_tokens(established=["prompt_counts"], prompt_counts=[[12, 11], [30, 28], [7, 6], [9, 8], [5, 4]],
                        n_prompt_disagree=5, n_prompt_checked=6)
    v = decide_verdict(llama_like(), tokenizer_mismatch=tm)
    assert v.verdict == VerdictKind.SUBSTITUTION and v.details["rule"] == "2t-tokenizer"
    assert v.reason.endswith("the provider counts the prompt tokens differently on 5 of 6 completions prompts "
                             "(provider vs claimed tokenizer: 12 vs 11, 30 vs 28, 7 vs 6, 9 vs 8)")
    assert "distinct token strings" not in v.reason
    sec = v.details["secondary_causes"]
    assert sec[0] == {"verdict": "QUANTIZATION", "rule": before.details["rule"], "reason": before.reason,
                      "evidence": []}
    assert sec[1:] == before.details["secondary_causes"]
    assert v.details["previous_verdict"] == {"verdict": "QUANTIZATION", "reason": before.reason}


@pytest.mark.parametrize("previous", ["SUBSTITUTION", "INCONCLUSIVE"])
def test_rule2t_never_lists_substitution_or_inconclusive_as_secondary(previous):
    if previous == "SUBSTITUTION":
        res = replace(quiet(), mk("logprob-divergence", 1e-40, n=2000, effect=0.5, ratio_to_floor=80.0,
                                  top1_agreement=0.6, m=5, n_prompts=40, **FLIPS))
        kw: dict = {}
    else:
        res = llama_like()
        kw = {"provider_failures": {"failed": 48, "total": 52, "kinds": {"truncated_stream": 48}}}
    before = decide_verdict(res, **kw)
    assert before.verdict == previous
    v = decide_verdict(res, tokenizer_mismatch=foreign_tokens(), **kw)
    assert v.verdict == VerdictKind.SUBSTITUTION and v.details["rule"] == "2t-tokenizer"
    assert v.details["secondary_causes"] == before.details["secondary_causes"]
    assert v.details["previous_verdict"]["verdict"] == previous


@pytest.mark.parametrize("tm", [None, {}])
def test_rule2t_needs_evidence(tm):
    a, b = decide_verdict(llama_like()), decide_verdict(llama_like(), tokenizer_mismatch=tm)
    assert (a.verdict, a.reason, a.details) == (b.verdict, b.reason, b.details)
    assert "tokenizer_mismatch" not in b.details and "previous_verdict" not in b.details


@pytest.mark.parametrize("self_greedy_rejects", [True, False])
def test_greedy_findings_say_when_the_decode_path_explains_them(self_greedy_rejects):
    """llama.cpp (docs/real-engines.md): its repetition penalty bends some requests' greedy paths, so
    greedy-match and greedy-heterogeneity reject; self-greedy shows the same positions against the
    provider's own top-1, and the findings must say so instead of reading as "mixed serving"."""
    res = replace(llama_like(), mk("greedy-match", 1e-50, n=2000, statistic=40, effect=0.06, r0=1e-3, band=0.2))
    res += [mk("greedy-heterogeneity", 1e-12, n=2000, effect=0.15)]
    if not self_greedy_rejects:
        res = replace(res, mk("self-greedy", 1.0, n=2000, r0=1e-3, band=0.2))
    f = {x["detector"]: x["implication"] for x in decide_verdict(res).details["findings"]}
    assert "greedy-match" in f and "greedy-heterogeneity" in f
    for name in ("greedy-match", "greedy-heterogeneity"):
        assert ("explained by the provider's decode path" in f[name]) is self_greedy_rejects, f[name]
    assert "explained by" not in f["logprob-divergence"]


def near_tie(p=1e-9, k=9, expected=0.8, n=30):
    return mk("greedy-near-tie", p, n=n, statistic=k, effect=k / n, k=k, expected=expected, n_positions=n, band=0.44)


def test_rule3n_near_tie_flips_alone_are_relaxed_verification():
    v = decide_verdict([*quiet(), near_tie()])
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION and v.details["rule"] == "3n-greedy-near-tie"
    assert "runner-up at near-ties 9 times" in v.reason and "at most 0.8" in v.reason
    assert "0.44-nat band" in v.reason and "greedy-near-tie p_adj=" in v.reason
    assert v.details["secondary_causes"] == []
    # not significant after Holm → no 3n
    assert decide_verdict([*quiet(), near_tie(p=0.02)]).details["rule"] != "3n-greedy-near-tie"


def test_rule3n_names_the_model_when_the_flips_are_the_providers_own_top1():
    """A quantized model flips its own argmax at near-ties (its reported top-1 is the emitted token); a lossy
    greedy verifier emits a token its own list ranks second."""
    own = mk("greedy-near-tie", 1e-9, n=30, statistic=9, effect=0.3, k=9, expected=0.8, n_positions=30, band=0.44,
             flips_with_provider_list=9, flips_own_top1=8)
    v = decide_verdict([*quiet(), own])
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["rule"] == "3n-model"
    assert "8 of the 9 flips" in v.reason
    lossy = replace([own], mk("greedy-near-tie", 1e-9, n=30, statistic=9, effect=0.3, k=9, expected=0.8,
                              n_positions=30, band=0.44, flips_with_provider_list=9, flips_own_top1=1))
    assert decide_verdict([*quiet(), *lossy]).details["rule"] == "3n-greedy-near-tie"


def test_rule3n_yields_to_logprob_divergence_and_self_greedy():
    lp = mk("logprob-divergence", 1e-20, n=2000, effect=0.01, ratio_to_floor=6.0, top1_agreement=0.95, m=5,
            n_prompts=40, confident_flip_ratio=1.0, confident_flips=1, confident_flips_expected=1.0, n_confident=500)
    v = decide_verdict([*replace(quiet(), lp), near_tie()])
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["rule"].startswith("2-")
    assert "3n-greedy-near-tie" not in [c["rule"] for c in v.details["secondary_causes"]]
    sg = mk("self-greedy", 1e-30, n=2000, statistic=50, r0=1e-3, band=0.2)
    v = decide_verdict([*replace(quiet(), sg), near_tie()])
    assert v.details["rule"] == "1-self-greedy"
    f = {x["detector"]: x["implication"] for x in v.details["findings"]}
    assert "explained by the provider's decode path" in f["greedy-near-tie"]
    # greedy-match rejecting decides by rule 3
    gm = mk("greedy-match", 1e-20, n=2000, statistic=80, effect=0.04, r0=1e-3, band=0.2)
    assert decide_verdict([*replace(quiet(), gm), near_tie()]).details["rule"].startswith("3-greedy")


def test_rule3n_becomes_a_secondary_cause_under_provider_failures():
    v = decide_verdict([*quiet(), near_tie()], provider_failures={"failed": 10, "total": 20, "kinds": {"timeout": 10}})
    assert v.verdict == VerdictKind.INCONCLUSIVE
    assert [c["rule"] for c in v.details["secondary_causes"]] == ["3n-greedy-near-tie"]
    assert v.details["secondary_causes"][0]["evidence"][0]["detector"] == "greedy-near-tie"


def test_rule3n_without_the_provider_s_top_logprobs_names_the_undetermined_pair():
    """Issue 37 item 2: an int4 provider audited with logprobs = false was accused of RELAXED_VERIFICATION by
    greedy-near-tie (3 flips in 5 near-tie positions). Without the provider's own top_logprobs the flips cannot
    tell a quantized model (its own argmax moved) from a lossy greedy verifier: the verdict names the pair."""
    blind = mk("greedy-near-tie", 1e-6, n=5, statistic=3, effect=0.6, k=3, expected=0.1, n_positions=5, band=0.44,
               flips_with_provider_list=0, flips_own_top1=0)
    v = decide_verdict([*quiet(), blind])
    assert v.verdict == VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION, (v.verdict, v.reason)
    assert v.exit_code == 1 and v.details["rule"] == "3n-model-or-verification"
    assert v.details["cause_established"] is False
    assert "not established which" in v.reason and "top_logprobs" in v.reason
    assert "logprobs" in v.reason and "--suite verification" in v.reason  # what a decisive audit needs
    f = {x["detector"]: x["implication"] for x in v.details["findings"]}
    assert "cannot tell" in f["greedy-near-tie"]  # the finding does not claim lossy verification alone
    # with the provider's list the rule is unchanged: lossy verification, or the served model's own argmax
    seen = replace([blind], mk("greedy-near-tie", 1e-6, n=5, statistic=3, effect=0.6, k=3, expected=0.1,
                               n_positions=5, band=0.44, flips_with_provider_list=3, flips_own_top1=0))
    assert decide_verdict([*quiet(), *seen]).verdict == VerdictKind.RELAXED_VERIFICATION
    # the pair's exit code and its place among the undetermined answers
    from auditor.verdict.kinds import EXIT_CODES, UNDETERMINED_CAUSES

    assert EXIT_CODES[VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION] == 1
    assert UNDETERMINED_CAUSES[VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION] == (
        VerdictKind.QUANTIZATION, VerdictKind.RELAXED_VERIFICATION)
    assert UNDETERMINED_CAUSES[VerdictKind.QUANTIZATION_OR_SUBSTITUTION] == (
        VerdictKind.QUANTIZATION, VerdictKind.SUBSTITUTION)


def test_undetermined_pair_stays_a_secondary_cause_under_provider_failures():
    blind = mk("greedy-near-tie", 1e-9, n=30, statistic=9, effect=0.3, k=9, expected=0.8, n_positions=30, band=0.44,
               flips_with_provider_list=0, flips_own_top1=0)
    v = decide_verdict([*quiet(), blind], provider_failures={"failed": 10, "total": 20, "kinds": {"timeout": 10}})
    assert v.verdict == VerdictKind.INCONCLUSIVE
    assert [c["verdict"] for c in v.details["secondary_causes"]] == ["QUANTIZATION_OR_RELAXED_VERIFICATION"]
