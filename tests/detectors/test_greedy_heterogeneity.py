"""greedy-heterogeneity: the per-request scan is calibrated under H0 and sees a minority of degraded requests
that the pooled greedy-match test misses."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.detectors import DetectorName, run_detectors
from auditor.detectors.greedy import greedy_match
from auditor.detectors.heterogeneity import greedy_heterogeneity

from .conftest import dirichlet_logprobs, make_batch, normalise, prompt_labels

N_PROMPTS, LENGTH = 40, 24


def _batch(rng, degraded: np.ndarray, sigma_q: float = 1.5, honest_flip: float = 0.0):
    """Greedy batch: degraded prompts argmax noisy logits (sigma_q); honest prompts the reference argmax
    (with probability honest_flip per position a clear runner-up pick, the honest clear-mismatch rate)."""
    ref = dirichlet_logprobs(rng, N_PROMPTS, LENGTH, alpha_range=(0.05, 0.5))
    pid = prompt_labels(N_PROMPTS, LENGTH)
    deg = np.repeat(degraded, LENGTH)
    served = np.where(deg[:, None], normalise(ref + rng.normal(0, sigma_q, ref.shape)), ref)
    tok = served.argmax(1)
    if honest_flip:
        flip = (rng.random(tok.size) < honest_flip) & ~deg
        tok = np.where(flip, np.argsort(-ref, 1)[:, 1], tok)
    return make_batch(rng, ref, served, tok, 0.0, pid, m_provider=0)


def test_p_values_are_conservative_when_every_request_is_honest():
    """H0 with clear mismatches at the honest rate r0 = 1e-3 (the default floor): P(p <= a) <= a."""
    rng = np.random.default_rng(1)
    ps = np.array([greedy_heterogeneity(_batch(rng, np.zeros(N_PROMPTS, bool), honest_flip=1e-3)).p_value
                   for _ in range(300)])
    for a in (0.01, 0.05, 0.2):
        assert (ps <= a).mean() <= a + 2.5 * np.sqrt(a * (1 - a) / ps.size), a


def test_a_tenth_of_degraded_requests_is_seen_and_names_them():
    rng = np.random.default_rng(2)
    deg = np.zeros(N_PROMPTS, bool)
    deg[rng.choice(N_PROMPTS, 4, replace=False)] = True
    b = _batch(rng, deg)
    r = greedy_heterogeneity(b)
    assert r.ran and r.p_value < 1e-6
    assert r.details["outlier_requests"] >= 1 and r.details["n_requests"] == N_PROMPTS
    assert r.details["worst_request"] in set(prompt_labels(N_PROMPTS, 1)[deg])
    assert r.evidence and all(e.get("clear") for e in r.evidence)


def test_scan_beats_the_pooled_test_on_a_mixture():
    """One degraded request in 40 with a mild replica: the scan rejects more often than the pooled binomial."""
    rng = np.random.default_rng(3)
    scan = pooled = 0
    for _ in range(60):
        deg = np.zeros(N_PROMPTS, bool)
        deg[rng.integers(N_PROMPTS)] = True
        b = _batch(rng, deg, sigma_q=0.6)
        scan += greedy_heterogeneity(b).p_value <= 0.05
        pooled += greedy_match(b).p_value <= 0.05
    assert scan > pooled and scan >= 30, (scan, pooled)


def test_needs_a_reference_and_two_requests():
    rng = np.random.default_rng(4)
    b = _batch(rng, np.zeros(N_PROMPTS, bool))
    one = b.subset(b.prompt_ids == "p0")
    r = greedy_heterogeneity(one)
    assert not r.ran and "requests" in (r.reason or "")
    res = {x.name: x for x in run_detectors(b)}
    assert res[DetectorName.GREEDY_HETEROGENEITY].ran


@pytest.mark.parametrize("mixed", [False, True])
def test_verdict_names_a_mixture_as_quantization(mixed):
    from auditor.verdict.decide import decide_verdict

    rng = np.random.default_rng(5)
    deg = np.zeros(N_PROMPTS, bool)
    if mixed:
        deg[:2] = True
    results = run_detectors(_batch(rng, deg, sigma_q=1.0))
    v = decide_verdict(results)
    if mixed:
        assert v.verdict in ("QUANTIZATION", "QUANTIZATION_OR_SUBSTITUTION")
        assert v.details["rule"].startswith(("3-greedy", "3h-mixture"))
    else:
        assert v.verdict in ("PASS", "INCONCLUSIVE")
