"""CALIBRATION: under simulated nulls each detector's p-values are uniform and its rejection rate
at alpha = 0.05 is at most 0.07 (500 seeded audits per detector).

Count detectors (greedy, argmax, tail) have discrete statistics: their reported exact p-value is
conservative by construction, so uniformity is checked on the randomized p-value they also report
(``details['p_randomized']``, exactly uniform under H0), the rejection rate on the reported one,
and p_value >= p_randomized everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from auditor.detectors import run_detectors
from auditor.detectors.consistency import self_argmax, self_gof, self_greedy, self_tail
from auditor.detectors.greedy import greedy_match
from auditor.detectors.logprob import logprob_divergence
from auditor.detectors.noise_floor import compute_noise_floor
from auditor.detectors.sampling import sampling_argmax, sampling_gof, sampling_tail
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind

N_AUDITS = 500
ALPHA = 0.05
MAX_REJECTION = 0.07
KS_MIN_P = 0.01


def check_calibrated(name, p, p_rand):
    p, p_rand = np.asarray(p), np.asarray(p_rand)
    assert np.all(np.isfinite(p)), name
    rate = float(np.mean(p <= ALPHA))
    ks = stats.kstest(p_rand, "uniform").pvalue
    assert rate <= MAX_REJECTION, f"{name}: rejection rate {rate:.3f} under H0"
    assert ks > KS_MIN_P, f"{name}: p-values not uniform (KS p={ks:.3g})"
    if name.endswith("gof"):
        # the derandomized gof reports 2 x the median of 21 single-draw p-values: valid, not uniform —
        # P(p <= t) <= t at every level (binomial slack of 500 audits), and no worse than one draw
        for t in (0.01, 0.05, 0.1, 0.2):
            assert np.mean(p <= t) <= t + 2.5 * np.sqrt(t * (1 - t) / p.size), f"{name}: P(p <= {t}) too high"
        assert rate <= np.mean(p_rand <= ALPHA) + 0.01, f"{name}: aggregate rejects more than one draw"
    else:
        assert np.all(p >= p_rand - 1e-12), f"{name}: reported p below the randomized one"
    return rate, ks


def run_null(fn, batch, slices, floor_for=None, seed=0):
    p, pr = [], []
    for a, sl in enumerate(slices):
        r = fn(
            batch.subset(sl),
            None if floor_for is None else floor_for(a),
            rng=np.random.default_rng(seed + a),
            n_evidence=0,
        )
        assert r.ran, r.reason
        p.append(r.p_value)
        pr.append(r.details.get("p_randomized", r.details.get("p_single_draw", r.p_value)))
    return p, pr


@pytest.fixture(scope="module")
def sampled_null(synth):
    """Provider samples exactly from the reference at T=1 and reports its own top-5."""
    rng = np.random.default_rng(20240601)
    g, L = 8, 25
    b, *_ = synth.bulk_batch(
        rng, N_AUDITS, g, L, profile="honest-exact", temperature=1.0
    )
    return synth, b, synth.audit_slices(N_AUDITS, g, L)


@pytest.mark.parametrize(
    "fn", [sampling_gof, sampling_argmax, sampling_tail], ids=lambda f: f.__name__
)
def test_reference_sampling_tests_calibrated(sampled_null, fn):
    _, b, slices = sampled_null
    check_calibrated(fn.__name__, *run_null(fn, b, slices, seed=1))


@pytest.mark.parametrize(
    "fn", [self_gof, self_argmax, self_tail], ids=lambda f: f.__name__
)
def test_self_sampling_tests_calibrated(synth, fn):
    # the provider's own distribution is far from the reference (sigma 0.3 logit noise) but it
    # samples from what it reports: the self tests must stay calibrated
    rng = np.random.default_rng(7)
    g, L = 8, 25
    b, *_ = synth.bulk_batch(
        rng, N_AUDITS, g, L, profile="quantized", sigma_q=0.3, temperature=1.0
    )
    check_calibrated(
        fn.__name__, *run_null(fn, b, synth.audit_slices(N_AUDITS, g, L), seed=2)
    )


def test_logprob_divergence_calibrated_with_fresh_floors(synth):
    """Honest provider = reference + N(0, 0.02) logit noise; each audit gets its own floor measured
    on independent prompts with the same honest variant (so the floor's own error is part of H0)."""
    rng = np.random.default_rng(11)
    g, L, gf = 10, 20, 30
    b, *_ = synth.bulk_batch(
        rng, N_AUDITS, g, L, profile="honest-noisy", sigma_honest=0.02, temperature=0.0
    )
    fpid = synth.prompt_labels(gf, L, "f")

    def floor_for(a):
        fref = synth.dirichlet_logprobs(rng, gf, L)
        fhon = synth.normalise(fref + rng.normal(0, 0.02, fref.shape))
        return compute_noise_floor(fref, fhon, prompt_ids=fpid, top_m=(5,))

    check_calibrated(
        "logprob-divergence",
        *run_null(
            logprob_divergence, b, synth.audit_slices(N_AUDITS, g, L), floor_for, seed=3
        ),
    )


def _boundary_greedy_batch(synth, rng, r0, g, L):
    """Greedy world at the boundary of H0: a clear mismatch (least likely token) with prob. r0."""
    ref = synth.dirichlet_logprobs(rng, N_AUDITS * g, L)
    tok = ref.argmax(1)
    hit = rng.random(tok.size) < r0
    tok = np.where(hit, ref.argmin(1), tok)
    return synth.make_batch(
        rng, ref, ref, tok, 0.0, synth.prompt_labels(N_AUDITS * g, L), m_provider=5
    )


@pytest.mark.parametrize("fn", [greedy_match, self_greedy], ids=lambda f: f.__name__)
def test_greedy_tests_calibrated_at_the_honest_rate(synth, fn):
    rng = np.random.default_rng(13)
    g, L, r0 = 4, 25, 0.02
    b = _boundary_greedy_batch(synth, rng, r0, g, L)
    fl = synth.make_floor(rng, n_prompts=10, length=10, top_m=(5,))
    fl.clear_mismatch_rate = r0  # the honest clear rate this world has
    check_calibrated(
        fn.__name__,
        *run_null(fn, b, synth.audit_slices(N_AUDITS, g, L), lambda a: fl, seed=4),
    )


def test_greedy_match_rarely_rejects_honest_noise(synth):
    rng = np.random.default_rng(17)
    g, L = 4, 25
    b, *_ = synth.bulk_batch(
        rng, N_AUDITS, g, L, profile="honest-noisy", sigma_honest=0.02, temperature=0.0
    )
    fl = synth.make_floor(rng, n_prompts=60, length=20, sigma_honest=0.02, top_m=(5,))
    p, _ = run_null(
        greedy_match, b, synth.audit_slices(N_AUDITS, g, L), lambda a: fl, seed=5
    )
    assert np.mean(np.asarray(p) <= ALPHA) <= MAX_REJECTION


def test_whole_audit_false_accusation_rate(synth):
    """Honest (bf16-like) provider, every detector + Holm + verdict: deviations named <= 7%."""
    rng = np.random.default_rng(19)
    fl = synth.make_floor(rng, n_prompts=80, length=24, sigma_honest=0.02, top_m=(5,))
    n = 200
    accused = 0
    for a in range(n):
        b = synth.audit(
            rng, "honest-noisy", sigma_honest=0.02, n_greedy=3, n_sampling=6
        )
        v = decide_verdict(run_detectors(b, fl, seed=a), floor=fl)
        accused += v.verdict not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE)
    assert accused / n <= MAX_REJECTION, f"false-accusation rate {accused / n:.3f}"


def _position_dependent_honest(synth, rng, g, L, early=0.04, late=0.02, first=2):
    """Reference rows and an honest variant whose logit noise is `early` at the first `first`
    positions of each continuation and `late` after (y depends on the position, as on real models)."""
    ref = synth.dirichlet_logprobs(rng, g, L)
    sig = np.where(np.tile(np.arange(L), g) < first, early, late)[:, None]
    return ref, synth.normalise(ref + rng.normal(size=ref.shape) * sig)


def test_logprob_divergence_calibrated_on_short_requests_when_y_depends_on_position(synth):
    """Audits of 2-token requests against floors measured on 16-token continuations: with the floor's
    position record the null is the floor's mean at the audit's positions (uniform p-values, fresh
    floor per audit); a floor without it compares the noisier first tokens with the whole
    continuation's mean and accuses the honest provider."""
    rng = np.random.default_rng(17)
    g, gf, L, n_a = 30, 40, 16, 300
    fpid, fpos = synth.prompt_labels(gf, L, "f"), np.tile(np.arange(L), gf)
    ref, hon = _position_dependent_honest(synth, rng, n_a * g, 2)
    b = synth.make_batch(rng, ref, hon, hon.argmax(1), 0.0, synth.prompt_labels(n_a * g, 2), m_provider=5)
    slices = synth.audit_slices(n_a, g, 2)
    p, p_blind = [], []
    for a, sl in enumerate(slices):
        fref, fhon = _position_dependent_honest(synth, rng, gf, L)
        fl = compute_noise_floor(fref, fhon, prompt_ids=fpid, positions=fpos, top_m=(5,))
        r = logprob_divergence(b.subset(sl), fl, rng=a, n_evidence=0)
        assert r.details["position_adjustment"] > 0.5  # the first tokens sit above the floor's mean
        p.append(r.p_value)
        if a < 50:
            blind = compute_noise_floor(fref, fhon, prompt_ids=fpid, top_m=(5,))
            p_blind.append(logprob_divergence(b.subset(sl), blind, rng=a, n_evidence=0).p_value)
    check_calibrated("logprob-divergence (position-matched)", p, p)
    assert np.mean(np.asarray(p_blind) <= ALPHA) > 0.5
