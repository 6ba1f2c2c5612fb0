"""Margin-conditioned flip statistic (auditor.detectors.logprob.margin_flip_stats) and verdict rule 2.

Synthetic logits: a reference row l ~ N(0, s²) per position (s varies, so margins span many σ), a
"quantized" provider l + ε with ε iid N(0, σ²) (isotropic), and a "different model" provider
whose argmax is swapped with a random other token at a share of positions (confident ones too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from auditor.detectors import DetectorResult
from auditor.detectors.logprob import CONFIDENT_MARGIN_SIGMAS, logprob_divergence, margin_flip_stats
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind
from auditor.verdict.model_rules import SUBSTITUTION_MIN_FLIP_RATIO


def _lsm(x: np.ndarray) -> np.ndarray:
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def rows(n=3000, V=64, sigma=0.3, swap=0.0, seed=0):
    """Full log-prob rows [n, V]: (reference, provider)."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(0, 1, (n, V)) * rng.uniform(1, 6, (n, 1))
    prov = ref + rng.normal(0, sigma, (n, V))
    for i in np.flatnonzero(rng.random(n) < swap):
        order = np.argsort(-prov[i])
        j = order[rng.integers(1, V)]
        prov[i, [order[0], j]] = prov[i, [j, order[0]]]
    return _lsm(ref), _lsm(prov)


def synthetic(n=3000, V=64, sigma=0.3, swap=0.0, seed=0, top=5, k=20):
    """(ref_top_lp [n,k], ref_top1 [n], prov_top1 [n], prov_lp [n,top], ref_at_prov [n,top])."""
    R, P = rows(n, V, sigma, swap, seed)
    rt = np.argsort(-R, 1)[:, :k]
    pt = np.argsort(-P, 1)[:, :top]
    return (np.take_along_axis(R, rt, 1), rt[:, 0], pt[:, 0], np.take_along_axis(P, pt, 1),
            np.take_along_axis(R, pt, 1))


@pytest.mark.parametrize("sigma", [0.1, 0.3, 1.0])
def test_isotropic_noise_gives_ratio_near_one(sigma):
    ratios = []
    for seed in range(4):
        d = margin_flip_stats(*synthetic(sigma=sigma, seed=seed))
        assert d["sigma_hat"] == pytest.approx(sigma, rel=0.15)  # centring + MAD recovers σ
        assert d["n_confident"] > 300
        ratios.append(d["confident_flip_ratio"])
    assert max(ratios) < 2.5 and np.mean(ratios) < 1.6


@pytest.mark.parametrize("swap", [0.05, 0.2])
def test_confident_flips_give_large_ratio(swap):
    d = margin_flip_stats(*synthetic(sigma=0.3, swap=swap))
    assert d["confident_flip_ratio"] > 2 * SUBSTITUTION_MIN_FLIP_RATIO
    assert d["confident_flips"] > 10 * d["confident_flips_expected"]
    assert d["confident_flip_p"] < 1e-6


def test_margin_bins_partition_the_positions():
    args = synthetic(sigma=0.3, swap=0.05)
    d = margin_flip_stats(*args)
    bins = d["margin_bins"]
    assert sum(b["n"] for b in bins) == args[0].shape[0]
    assert sum(b["flips"] for b in bins) == int((args[1] != args[2]).sum())
    conf = [b for b in bins if b["lo_sigmas"] >= CONFIDENT_MARGIN_SIGMAS]
    assert sum(b["flips"] for b in conf) == d["confident_flips"]
    # under noise alone the small-margin bins hold most flips; the swaps fill the confident ones
    iso = margin_flip_stats(*synthetic(sigma=0.3))["margin_bins"]
    assert iso[0]["flips"] > iso[-1]["flips"]


def test_no_scale_without_two_known_alternatives():
    R, r1, p1, plp, rap = synthetic(n=50)
    d = margin_flip_stats(R, r1, p1, plp[:, :1], rap[:, :1])
    assert d["confident_flip_ratio"] is None and d["sigma_hat"] is None


@pytest.mark.parametrize(("swap", "substitute"), [(0.0, False), (0.25, True)])
def test_logprob_divergence_records_the_statistic(synth, swap, substitute):
    rng = np.random.default_rng(3)
    floor = synth.make_floor(rng, top_m=(5,))
    g, L = 30, 20
    ref, prov = rows(n=g * L, V=synth.V, sigma=0.3, swap=swap, seed=4)
    b = synth.make_batch(rng, ref, prov, prov.argmax(1), 0.0, synth.prompt_labels(g, L), m_provider=5)
    r = logprob_divergence(b, floor, n_boot=10)
    d = r.details
    assert r.ran and r.p_value < 1e-6
    if not substitute:  # swapped argmaxes inflate the centred residuals too
        assert d["sigma_hat"] == pytest.approx(0.3, rel=0.25)
    assert (d["confident_flip_ratio"] > SUBSTITUTION_MIN_FLIP_RATIO) is substitute
    assert decide_verdict([r]).verdict == (VerdictKind.SUBSTITUTION if substitute else VerdictKind.QUANTIZATION)


# ----------------------------------------------------------------------------------- rule 2
def _lp(flip_ratio, *, obs=40, expected=1.0, kl=0.35, top1=0.76, ratio_to_floor=300.0):
    details = {"ratio_to_floor": ratio_to_floor, "top1_agreement": top1, "m": 5, "n_prompts": 40}
    if flip_ratio is not None:
        details.update(confident_flip_ratio=flip_ratio, confident_flips=obs, confident_flips_expected=expected,
                       n_confident=400, sigma_hat=0.8, confident_margin_sigmas=3.0, confident_flip_p=1e-9)
    return DetectorResult("logprob-divergence", 9.0, 1e-30, kl, (kl, kl), 2000, [], details=details)


@pytest.mark.parametrize(
    ("flip_ratio", "want"),
    [
        (SUBSTITUTION_MIN_FLIP_RATIO * 3, VerdictKind.SUBSTITUTION),
        (SUBSTITUTION_MIN_FLIP_RATIO * 1.01, VerdictKind.SUBSTITUTION),
        (SUBSTITUTION_MIN_FLIP_RATIO, VerdictKind.QUANTIZATION),  # strictly above the calibrated maximum
        (1.2, VerdictKind.QUANTIZATION),
        (None, VerdictKind.QUANTIZATION),  # no noise scale: never accuse of another model
    ],
)
def test_rule2_names_substitution_by_the_flip_ratio(flip_ratio, want):
    v = decide_verdict([_lp(flip_ratio)])
    assert v.verdict == want
    assert v.details["rule"] == ("2-logprob-substitution" if want == VerdictKind.SUBSTITUTION
                                 else "2-logprob-quantization")
    cc = v.details.get("cause_confidence")
    if flip_ratio is None:
        assert cc is None and "could not be computed" in v.reason
    else:
        assert cc["threshold"] == SUBSTITUTION_MIN_FLIP_RATIO
        assert cc["log_ratio_to_threshold"] == pytest.approx(math.log(flip_ratio / SUBSTITUTION_MIN_FLIP_RATIO))
        assert "flip ratio" in v.reason


def test_rule2_far_divergence_without_confident_flips_is_undetermined_between_the_two():
    # almost no confident position left (the flip test cannot tell): 3-bit weights and another model both
    # diverge this far, so the verdict says the model is not the declared one at its precision, not which
    v = decide_verdict([_lp(1.5, obs=2, expected=0.7, kl=0.9, top1=0.5)])
    assert v.verdict == VerdictKind.QUANTIZATION_OR_SUBSTITUTION and v.exit_code == 1
    assert v.details["rule"] == "2-logprob-model-deviation" and "far beyond production quantization" in v.reason
    # significant confident flips still single out another model at that divergence
    v = decide_verdict([_lp(SUBSTITUTION_MIN_FLIP_RATIO * 3, kl=0.9, top1=0.5)])
    assert v.verdict == VerdictKind.SUBSTITUTION and v.details["rule"] == "2-logprob-substitution"
    # a large KL with high top-1 agreement and noise-like flips stays QUANTIZATION
    v = decide_verdict([_lp(1.5, obs=2, expected=0.7, kl=0.9, top1=0.8)])
    assert v.verdict == VerdictKind.QUANTIZATION


def test_rule2_mild_wording_kept():
    v = decide_verdict([_lp(1.0, obs=0, expected=0.1, kl=0.004, top1=0.97, ratio_to_floor=3.5)])
    assert v.verdict == VerdictKind.QUANTIZATION
    assert "mild divergence" in v.reason


def test_rule2_says_it_names_the_milder_cause_without_confident_positions():
    # σ̂ so large that only 3 positions are confident: even 3 flips cannot reach the threshold
    lp = _lp(4.0 / 1.0 - 0.5, obs=3, expected=0.14)
    lp.details["n_confident"] = 3
    v = decide_verdict([lp])
    assert v.verdict == VerdictKind.QUANTIZATION
    cc = v.details["cause_confidence"]
    assert cc["informative"] is False and cc["separates"] != "quantization"
    assert "too few confident positions for this test to tell" in v.reason
    assert "does not rule out a different model" in v.reason and "the milder cause" in v.reason
    assert "undetermined" not in v.reason  # the verdict names a cause; it says how firmly


def test_flip_rate_interval_is_exact_and_says_what_it_separates():
    from auditor.verdict.cause import flip_rate_interval, milder_cause_clause

    lo, hi = flip_rate_interval(6, 1.57)  # int4 at 3,000 precision tokens on SmolLM2
    assert lo == pytest.approx(2.2018 / 1.57, rel=1e-3) and hi == pytest.approx(13.059 / 1.57, rel=1e-3)
    assert flip_rate_interval(0, 2.0) == (0.0, pytest.approx(3.6889 / 2.0, rel=1e-3))
    assert flip_rate_interval(3, 0.0) is None and flip_rate_interval(None, 1.0) is None
    # coverage: the interval holds the true multiple in >= 95% of Poisson draws
    rng = np.random.default_rng(3)
    for mult, e in ((3.0, 1.5), (0.5, 4.0), (6.0, 0.3)):
        ks = rng.poisson(mult * e, 4000)
        cover = np.mean([a <= mult <= b for a, b in (flip_rate_interval(int(k), e) for k in ks)])
        assert cover >= 0.95
    # many confident positions and noise-like flips: the interval rules a substitute out, no clause
    v = decide_verdict([_lp(1.2, obs=2, expected=3.0)])
    cc = v.details["cause_confidence"]
    assert v.verdict == VerdictKind.QUANTIZATION and cc["separates"] == "quantization" and cc["flip_rate_ci"][1] < 4
    assert milder_cause_clause(cc) == "" and "milder cause" not in v.reason
    assert v.details["cause_established"] is True
    # few predicted flips: the same verdict says it is the milder cause, with the interval
    v = decide_verdict([_lp(1.2, obs=0, expected=0.3)])
    assert v.details["cause_confidence"]["separates"] == "neither"
    assert "the flip rate is 0x the noise prediction (95% CI 0-12x)" in v.reason and "milder cause" in v.reason
    assert v.details["cause_established"] is False  # what `auto --resolve-cause` probes on for
    assert decide_verdict([_lp(SUBSTITUTION_MIN_FLIP_RATIO * 3)]).details["cause_established"] is True
    assert decide_verdict([_lp(1.5, obs=2, expected=0.7, kl=0.9, top1=0.5)]).details["cause_established"] is False
    mild = decide_verdict([_lp(1.0, obs=0, expected=0.1, kl=0.004, top1=0.97, ratio_to_floor=3.5)])
    assert mild.details["cause_established"] is True and "milder cause" not in mild.reason
    assert milder_cause_clause(None).startswith("; the flip evidence does not rule out a different model")


# ----------------------------------------------------------------------------- rule 2, reference path
def _with_ref_path(lp, ratio, *, obs=30, expected=2.0, n_conf=200, available=True, reason=None):
    lp.details.update(reference_path_available=available, reference_path_reason=reason,
                      reference_path_flip_ratio=ratio, reference_path_flips=obs,
                      reference_path_flips_expected=expected, reference_path_n_confident=n_conf,
                      reference_path_sigma_hat=1.1, reference_path_flip_p=1e-6, reference_path_n_positions=600)
    return lp


def test_rule2_reference_path_ratio_decides_substitution_when_the_provider_path_is_low():
    # provider path 0.6 (a different model walks where the reference is rarely confident), reference path 7
    v = decide_verdict([_with_ref_path(_lp(0.6), 7.0)])
    assert v.verdict == VerdictKind.SUBSTITUTION and v.details["rule"] == "2-logprob-substitution"
    cc = v.details["cause_confidence"]
    assert cc["path"] == "reference" and cc["statistic"] == "reference_path_flip_ratio" and cc["value"] == 7.0
    assert cc["provider_path"]["value"] == 0.6
    assert "teacher-forcing the provider on the reference's own greedy continuations (echo)" in v.reason


def test_rule2_reference_path_ratio_below_threshold_is_quantization_even_when_the_provider_path_is_high():
    v = decide_verdict([_with_ref_path(_lp(SUBSTITUTION_MIN_FLIP_RATIO * 2), 2.0)])
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["cause_confidence"]["path"] == "reference"
    # ... and at a far divergence it is undetermined (the flip test does not single out another model)
    v = decide_verdict([_with_ref_path(_lp(1.5, kl=0.9, top1=0.5), 2.0)])
    assert v.verdict == VerdictKind.QUANTIZATION_OR_SUBSTITUTION and "far beyond production quantization" in v.reason


def test_rule2_uninformative_reference_path_leaves_the_provider_path_in_charge():
    # 2 confident positions on the reference path: the ratio could not reach the threshold
    v = decide_verdict([_with_ref_path(_lp(SUBSTITUTION_MIN_FLIP_RATIO * 2), 3.0, obs=2, expected=0.1, n_conf=2)])
    assert v.verdict == VerdictKind.SUBSTITUTION and v.details["cause_confidence"]["path"] == "provider"


def test_rule2_without_reference_path_keeps_the_old_behaviour_and_says_why_undetermined():
    for want, ratio in ((VerdictKind.SUBSTITUTION, SUBSTITUTION_MIN_FLIP_RATIO * 2), (VerdictKind.QUANTIZATION, 1.2)):
        v = decide_verdict([_lp(ratio)])
        assert v.verdict == want and v.details["cause_confidence"]["path"] == "provider"
        assert "reference_path" not in v.details["cause_confidence"]
    lp = _with_ref_path(_lp(3.5, obs=3, expected=0.14), None, available=False,
                        reason="the provider does not return echo logprobs (capabilities.echo = false)")
    lp.details["n_confident"] = 3
    v = decide_verdict([lp])
    assert v.verdict == VerdictKind.QUANTIZATION
    assert ("too few confident positions for this test to tell a heavily quantized copy from a different model "
            "(the provider does not return echo logprobs") in v.reason and "the milder cause" in v.reason


@pytest.mark.parametrize(("swap", "substitute"), [(0.0, False), (0.25, True)])
def test_sampling_gof_records_the_statistic_on_sampled_positions(synth, swap, substitute):
    """Rule 4d's cause feature: at T = 1 the logprob test does not run (its floor is measured at greedy
    prefixes), so sampling-gof carries the self-scaled flip statistic of the sampled positions."""
    from auditor.detectors.sampling import sampling_gof

    rng = np.random.default_rng(5)
    g, L = 30, 20
    ref, prov = rows(n=g * L, V=synth.V, sigma=0.3, swap=swap, seed=6)
    tokens = np.array([rng.choice(synth.V, p=np.exp(row)) for row in prov])
    b = synth.make_batch(rng, ref, prov, tokens, 1.0, synth.prompt_labels(g, L), m_provider=5)
    r = sampling_gof(b)
    sp = r.details["sampled_path"]
    assert r.ran and sp["n_positions"] == g * L
    assert (sp["confident_flip_ratio"] > SUBSTITUTION_MIN_FLIP_RATIO) is substitute
    # without provider top_logprobs there is nothing to record
    bare = synth.make_batch(rng, ref, prov, tokens, 1.0, synth.prompt_labels(g, L), m_provider=0)
    assert "sampled_path" not in sampling_gof(bare).details
