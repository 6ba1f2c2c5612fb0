"""logprob-heterogeneity (issue 37 item 4): the per-request scan of the reported logprobs is calibrated under
seeded nulls and sees a 10% mixture that the pooled logprob-divergence test (a mean of log KL) misses."""

from __future__ import annotations

import numpy as np

from auditor.detectors import DETECTORS, DetectorName, run_detectors
from auditor.detectors.heterogeneity import logprob_heterogeneity
from auditor.detectors.logprob import logprob_divergence
from auditor.detectors.noise_floor import compute_noise_floor
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind

G, L = 30, 16


def _floor(synth, rng, sigma=0.02):
    """A fresh floor: reference vs an honest variant with N(0, sigma) logit noise, on independent prompts."""
    fref = synth.dirichlet_logprobs(rng, 40, L)
    fhon = synth.normalise(fref + rng.normal(0, sigma, fref.shape))
    return compute_noise_floor(fref, fhon, prompt_ids=synth.prompt_labels(40, L, "f"),
                               positions=np.tile(np.arange(L), 40), top_m=(5,))


def _audit(synth, rng, degraded: np.ndarray, *, honest_sigma: float = 0.02, sigma_q: float = 0.3):
    """A greedy audit of G requests: the degraded ones from a quantized copy (N(0, sigma_q) logit noise), the
    others from an honest variant (honest_sigma; 0 = the reference exactly, KL ≈ 0 below the floor)."""
    ref = synth.dirichlet_logprobs(rng, G, L)
    deg = np.repeat(degraded, L)[:, None]
    noise = np.where(deg, rng.normal(0, sigma_q, ref.shape), rng.normal(0, honest_sigma, ref.shape))
    served = synth.normalise(ref + noise)
    return synth.make_batch(rng, ref, served, served.argmax(1), 0.0, synth.prompt_labels(G, L), m_provider=5)


def test_registered_as_a_logprob_test_without_a_power_family() -> None:
    s = DETECTORS[DetectorName.LOGPROB_HETEROGENEITY]
    assert s.needs_top_logprobs and s.needs_reference and s.power_family is None
    assert list(DETECTORS)[-1] == DetectorName.LOGPROB_HETEROGENEITY  # appended: earlier seeds do not move


def test_p_values_are_valid_under_seeded_honest_audits(synth) -> None:
    """H0: every request from the honest variant the floor measured, a fresh floor per audit (its own error is
    part of H0): P(p <= a) <= a within binomial slack over 300 seeded audits, at a = 0.01, 0.05, 0.2."""
    rng = np.random.default_rng(3701)
    ps = []
    for _ in range(300):
        r = logprob_heterogeneity(_audit(synth, rng, np.zeros(G, bool)), _floor(synth, rng), n_evidence=0)
        assert r.ran, r.reason
        ps.append(r.p_value)
    p = np.asarray(ps)
    for a in (0.01, 0.05, 0.2):
        assert (p <= a).mean() <= a + 2.5 * np.sqrt(a * (1 - a) / p.size), (a, (p <= a).mean())


def test_a_ten_percent_mixture_is_seen_where_the_pooled_test_is_blind(synth) -> None:
    """The issue's shape: 3 of 30 requests (10%) from a quantized copy, the others matching the reference exactly
    (below the honest floor). The pooled mean-of-log-KL test says p ~ 1 while the mean KL is many times the floor;
    the scan rejects in >= 95% of 60 seeded audits and names a degraded request."""
    rng = np.random.default_rng(3702)
    scan = pooled = 0
    ratios = []
    for _ in range(60):
        deg = np.zeros(G, bool)
        deg[rng.choice(G, 3, replace=False)] = True
        fl = _floor(synth, rng)
        b = _audit(synth, rng, deg, honest_sigma=0.0)
        r = logprob_heterogeneity(b, fl, n_evidence=3)
        lp = logprob_divergence(b, fl, n_evidence=0)
        scan += r.p_value <= 0.05
        pooled += lp.p_value <= 0.05
        ratios.append(lp.details["ratio_to_floor"])
        if r.p_value <= 0.05:
            assert r.details["worst_request"] in set(synth.prompt_labels(G, 1)[deg])
            assert r.details["outlier_requests"] >= 1 and r.evidence
    assert scan >= 57, scan
    assert pooled <= 3 and float(np.median(ratios)) > 3.0, (pooled, np.median(ratios))


def test_the_audit_names_the_mixture_and_an_honest_family_stays_at_alpha(synth) -> None:
    """Through every detector, Holm and the verdict: the mixture is QUANTIZATION by rule 3h-logprob-mixture; 200
    seeded honest audits (the scan is one more test in the Holm family) are accused at most 7% of the time."""
    rng = np.random.default_rng(3703)
    deg = np.zeros(G, bool)
    deg[:3] = True
    fl = _floor(synth, rng)
    # a milder replica (0.12-nat logit noise): its greedy tokens still match, only its logprobs tell
    v = decide_verdict(run_detectors(_audit(synth, rng, deg, honest_sigma=0.0, sigma_q=0.12), fl, seed=1), floor=fl)
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["rule"] == "3h-logprob-mixture-quantization", v.reason
    assert "of 30 requests report logprobs" in v.reason
    accused = 0
    for a in range(200):
        b = _audit(synth, rng, np.zeros(G, bool))
        v = decide_verdict(run_detectors(b, fl, seed=a), floor=fl)
        accused += v.verdict not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE)
    assert accused / 200 <= 0.07, accused
