"""Combined sampling statistic (Cauchy combination of gof/argmax/tail) and mid-p: calibration, power.

Synthetic sampled positions: next-token distributions over 200 tokens with logits N(0, 1) x a
per-position scale in [0.5, 4] (flat to peaked), top-20 listed (the rest is the unlisted tail);
tokens drawn from p (H0) or through SGLang's relaxed rule with an ideal draft d ~ p: emit d if
p(d) >= s, else with probability p(d), else y != d ~ p (the simulator's relaxed-threshold).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from auditor.detectors.sampling import (
    SamplingView,
    argmax_test,
    combined_sampling_test,
    gof_test,
    tail_test,
)
from auditor.detectors.stats import cauchy_combination, holm, poisson_binomial_mid_p

K, V = 20, 200


def _dists(rng: np.random.Generator, n: int) -> np.ndarray:
    lg = rng.normal(0, 1, (n, V)) * rng.uniform(0.5, 4, (n, 1))
    p = np.exp(lg - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return -np.sort(-p, 1)


def _emit(rng: np.random.Generator, p: np.ndarray, s: float | None = None) -> np.ndarray:
    cum = np.cumsum(p, 1)
    d = (cum < rng.random((p.shape[0], 1))).sum(1).clip(max=V - 1)
    if s is None:
        return d
    out = d.copy()
    pd = p[np.arange(p.shape[0]), d]
    reject = rng.random(p.shape[0]) >= np.where(pd >= s, 1.0, pd)
    for i in np.flatnonzero(reject):
        r = p[i].copy()
        r[d[i]] = 0
        out[i] = rng.choice(V, p=r / r.sum())
    return out


def _view(p: np.ndarray, tok: np.ndarray) -> SamplingView:
    return SamplingView(np.arange(p.shape[0]), p[:, :K], np.where(tok < K, tok, -1), "reference")


def test_cauchy_combination_is_uniform_for_independent_uniforms():
    rng = np.random.default_rng(0)
    ps = np.array([cauchy_combination(rng.random(3))[1] for _ in range(20000)])
    assert stats.kstest(ps, "uniform").pvalue > 1e-3
    # perfectly dependent copies: T is one standard Cauchy, so exact too
    u = rng.random(5000)
    assert np.allclose([cauchy_combination([x, x, x])[1] for x in u[:50]], u[:50], atol=1e-9)


def test_cauchy_combination_extremes_and_errors():
    t, p = cauchy_combination([1e-30, 0.5, 0.9])
    assert t > 0 and 0 < p < 1e-29
    assert cauchy_combination([0.0, 1.0])[1] < 1e-200
    assert cauchy_combination([0.2, 0.9], [1.0, 0.0])[1] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="p_values"):
        cauchy_combination([])
    with pytest.raises(ValueError, match="p_values"):
        cauchy_combination([1.2])
    with pytest.raises(ValueError, match="weights"):
        cauchy_combination([0.1, 0.2], [1.0])


def test_mid_p_matches_binomial_when_probabilities_are_equal():
    p = np.full(30, 0.3)
    for s in (0, 5, 9, 20, 30):
        b = stats.binom(30, 0.3)
        assert poisson_binomial_mid_p(p, s, "greater") == pytest.approx(b.sf(s) + 0.5 * b.pmf(s), abs=1e-12)
        assert poisson_binomial_mid_p(p, s, "less") == pytest.approx(b.cdf(s) - 0.5 * b.pmf(s), abs=1e-12)
    with pytest.raises(ValueError, match="alternative"):
        poisson_binomial_mid_p(p, 3, "two-sided")


@pytest.mark.parametrize("mode", ["randomized", "mid-p"])
def test_combined_is_calibrated_under_h0(mode):
    rng = np.random.default_rng(1)
    n_sim, n_pos = 400, 300
    ps, comps = [], []
    for _ in range(n_sim):
        p = _dists(rng, n_pos)
        r = combined_sampling_test(_view(p, _emit(rng, p)), rng, discrete=mode)
        ps.append(r["p_value"])
        comps.append(list(r["components"].values()))
    ps, comps = np.array(ps), np.array(comps)
    for alpha in (0.01, 0.05, 0.10):
        k = int((ps <= alpha).sum())
        print(f"combined[{mode}] H0 rejection at alpha={alpha}: {k / n_sim:.4f}")
        assert stats.binomtest(k, n_sim, alpha, alternative="greater").pvalue > 1e-3
    if mode == "randomized":  # each component p-value is exactly uniform
        for j, name in enumerate(("gof", "argmax", "tail")):
            assert stats.kstest(comps[:, j], "uniform").pvalue > 1e-3, name


def test_combined_power_against_relaxed_acceptance_beats_nothing_and_is_reported():
    rng = np.random.default_rng(2)
    n_sim, n_pos = 150, 600
    rej_c = rej_h = 0
    for _ in range(n_sim):
        p = _dists(rng, n_pos)
        v = _view(p, _emit(rng, p, s=0.5))
        rej_c += combined_sampling_test(v, rng)["p_value"] <= 0.05
        three = [gof_test(v, rng)["p_value"], argmax_test(v, rng)["p_value"], tail_test(v, rng=rng)["p_value"]]
        rej_h += bool((holm(three) <= 0.05).any())
    print(f"relaxed s=0.5, {n_pos} positions: combined power {rej_c / n_sim:.3f}, Holm(3 exact) {rej_h / n_sim:.3f}")
    assert rej_c / n_sim > 0.5


def test_combined_detects_greedy_verification_and_rejects_tiny_views():
    rng = np.random.default_rng(3)
    p = _dists(rng, 200)
    r = combined_sampling_test(_view(p, np.zeros(200, np.int64)), rng)  # argmax always emitted
    assert r["p_value"] < 1e-6 and r["components"]["argmax"] < 1e-6
    with pytest.raises(ValueError, match="discrete"):
        combined_sampling_test(_view(p, np.zeros(200, np.int64)), rng, discrete="nope")
    with pytest.raises(ValueError, match="sampled positions"):
        combined_sampling_test(_view(p[:3], np.zeros(3, np.int64)), rng)
