"""Per-request heterogeneity tests: exact nulls, calibration on honest draws, power on mixtures.

Synthetic per-request mean KL (nats), modelled on the honest floor: each request is the mean of
L = 31 per-position KLs, log-normal with median 0.0015 nats and log-sd 1 (bf16-vs-fp32 scale);
a request routed to an int4 replica has per-position median 0.15 nats (int4 ~0.26 mean). R = 32
requests of 31 tokens ≈ 1,000 tokens (issue 14's budget for mix-int4:0.1).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from auditor.detectors.heterogeneity import exceedance_test, heterogeneity_test, max_power_bound, max_rank_test

L, R, M = 31, 32, 2000


def _honest(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.lognormal(np.log(0.0015), 1.0, (n, L)).mean(1)


def _degraded(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.lognormal(np.log(0.15), 1.0, (n, L)).mean(1)


def _upper_ok(k: int, n: int, alpha: float) -> bool:
    """Not significantly above alpha (one-sided binomial test at 0.001)."""
    return stats.binomtest(k, n, alpha, alternative="greater").pvalue > 1e-3


def test_max_rank_p_value_equals_enumeration_of_rank_subsets():
    m, r = 7, 3
    y = np.arange(m, dtype=float) + 0.5  # floor draws 0.5..6.5
    # every way the r observed values can interleave with the floor (uniform under H0)
    positions = list(itertools.combinations(range(m + r), r))
    for t_obs in range(1, m + 2):
        x = np.array([m - t_obs + 1.0, -1.0, -2.0])  # max has t_obs - 1 floor draws above it
        got = max_rank_test(x, y)
        assert got["top_position"] == t_obs
        # P(top-ranked observed value among the top t_obs of m + r)
        want = sum(1 for s in positions if min(s) < t_obs) / len(positions)
        assert got["p_value"] == pytest.approx(want, abs=1e-12)


def test_exceedance_null_is_beta_binomial():
    rng = np.random.default_rng(0)
    m, r, q, n_sim = 40, 15, 0.9, 20000
    j = int(np.ceil(q * m))
    counts = np.array([exceedance_test(rng.random(r), rng.random(m), q)["count"] for _ in range(n_sim)])
    pmf = stats.betabinom(r, m - j + 1, j).pmf(np.arange(r + 1))
    emp = np.bincount(counts, minlength=r + 1) / n_sim
    assert np.abs(emp - pmf).max() < 0.01


@pytest.mark.parametrize("test", ["max", "exceedance", "combined"])
def test_calibration_under_honest_draws(test):
    rng = np.random.default_rng(1)
    fn = {"max": max_rank_test, "exceedance": exceedance_test, "combined": heterogeneity_test}[test]
    n_sim = 1000
    ps = np.array([fn(_honest(rng, R), _honest(rng, M))["p_value"] for _ in range(n_sim)])
    for alpha in (0.01, 0.05, 0.10):
        k = int((ps <= alpha).sum())
        print(f"{test}: rejection at alpha={alpha}: {k / n_sim:.3f}")
        assert _upper_ok(k, n_sim, alpha), (test, alpha, k / n_sim)
    if test == "max":  # continuous statistic: its p-value is uniform on its lattice {t·R/(M+R)...}
        assert 0.4 < ps.mean() < 0.6


@pytest.mark.parametrize(("fraction", "min_power"), [(0.10, 0.93), (0.05, 0.72)])
def test_power_against_degraded_mixture(fraction, min_power):
    rng = np.random.default_rng(2)
    n_sim = 500
    rej = 0
    for _ in range(n_sim):
        k = rng.binomial(R, fraction)
        x = np.concatenate([_honest(rng, R - k), _degraded(rng, k)])
        rej += heterogeneity_test(x, _honest(rng, M))["p_value"] <= 0.05
    power = rej / n_sim
    bound = max_power_bound(R, fraction)
    print(f"mix-int4:{fraction} R={R} ({R * L} tokens): power {power:.3f} (bound 1-(1-F)^R = {bound:.3f})")
    assert power >= min_power
    ceiling = bound + (1 - bound) * 0.05  # no routed request: rejects at <= alpha
    assert power <= ceiling + 3 * np.sqrt(ceiling * (1 - ceiling) / n_sim)


def test_exceedance_count_has_power_against_many_mild_requests():
    """Half the requests mildly degraded (1.5x the floor): the max alone is weak, the count is not."""
    rng = np.random.default_rng(3)
    n_sim, rej_ex, rej_max = 300, 0, 0
    for _ in range(n_sim):
        x = np.concatenate([_honest(rng, R // 2), _honest(rng, R // 2) * 1.5])
        y = _honest(rng, M)
        rej_ex += exceedance_test(x, y, 0.9)["p_value"] <= 0.05
        rej_max += max_rank_test(x, y)["p_value"] <= 0.05
    assert rej_ex / n_sim > rej_max / n_sim + 0.2


def test_bad_input_raises_with_field_name():
    with pytest.raises(ValueError, match="x must hold"):
        max_rank_test([], [1.0])
    with pytest.raises(ValueError, match="y must hold"):
        exceedance_test([1.0], [np.nan, 1.0])
    with pytest.raises(ValueError, match="quantile"):
        exceedance_test([1.0], [1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match="fraction"):
        max_power_bound(10, 2.0)
    assert max_power_bound(29, 0.1) > 0.95 > max_power_bound(28, 0.1)
