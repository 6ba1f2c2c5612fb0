"""Closed-form checks of the statistical helpers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from auditor.detectors.stats import (
    binom_isf,
    binom_pmf,
    binom_sf,
    bucketed_kl,
    chi2_ppf,
    garwood_ci,
    holm,
    norm_sf,
    poisson_binomial_pmf,
    poisson_binomial_test,
    poisson_isf,
    randomized_pit,
    variance_components,
    wilson_ci,
)


def test_holm_matches_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> monotone 0.06
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02])


def test_holm_ignores_nan_and_caps_at_one():
    out = holm([0.5, np.nan, 0.4])
    assert np.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [0.8, 0.8])
    assert holm([0.9, 0.8])[0] == 1.0
    assert holm([]).size == 0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([1.2])


def test_wilson_and_garwood_known_values():
    lo, hi = wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-3)
    lo, hi = wilson_ci(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-3)
    assert np.isnan(wilson_ci(0, 0)[0])
    assert garwood_ci(0) == pytest.approx((0.0, 3.689), abs=1e-3)
    assert garwood_ci(10) == pytest.approx((4.795, 18.39), abs=1e-2)


def test_poisson_binomial_pmf_equals_binomial_and_enumeration():
    pmf = poisson_binomial_pmf(np.full(30, 0.3))
    np.testing.assert_allclose(pmf, stats.binom.pmf(np.arange(31), 30, 0.3), atol=1e-12)
    p = np.array([0.1, 0.5, 0.9, 0.33, 0.0, 1.0])
    brute = np.zeros(p.size + 1)
    for bits in itertools.product([0, 1], repeat=p.size):
        b = np.array(bits)
        brute[b.sum()] += np.prod(np.where(b == 1, p, 1 - p))
    np.testing.assert_allclose(poisson_binomial_pmf(p), brute, atol=1e-12)
    # the tree of convolutions (long rows go through np.convolve) against the textbook recursion,
    # relative to each term deep in the tails, at sizes that are not powers of two
    rng = np.random.default_rng(3)
    for n in (0, 1, 65, 129, 1001):
        q = rng.beta(0.3, 3.0, size=n)
        rec = np.zeros(n + 1)
        rec[0] = 1.0
        for i, qi in enumerate(q):
            rec[1 : i + 2] = rec[1 : i + 2] * (1 - qi) + rec[0 : i + 1] * qi
            rec[0] *= 1 - qi
        got = poisson_binomial_pmf(q)
        assert got.shape == (n + 1,) and (got >= 0).all()
        big = rec > 1e-250
        np.testing.assert_allclose(got[big], rec[big], rtol=1e-12)


def test_poisson_binomial_test_tails_exact_and_randomized():
    p = np.full(50, 0.2)
    pe, pr = poisson_binomial_test(p, 15, "greater", rng=0)
    assert pe == pytest.approx(stats.binom.sf(14, 50, 0.2))
    assert stats.binom.sf(15, 50, 0.2) <= pr <= pe
    pe, pr = poisson_binomial_test(p, 4, "less", rng=0)
    assert pe == pytest.approx(stats.binom.cdf(4, 50, 0.2))
    assert stats.binom.cdf(3, 50, 0.2) <= pr <= pe
    assert poisson_binomial_test(p, 51, "greater")[0] == 0.0
    with pytest.raises(ValueError, match="alternative"):
        poisson_binomial_test(p, 3, "two-sided")


def test_poisson_binomial_normal_branch_close_to_exact(monkeypatch):
    import auditor.detectors.stats as st

    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 400)
    exact = poisson_binomial_test(p, int(p.sum() + 25), "greater", rng=1)[0]
    monkeypatch.setattr(st, "EXACT_POISSON_BINOMIAL_MAX_N", 10)
    approx = poisson_binomial_test(p, int(p.sum() + 25), "greater", rng=1)[0]
    assert approx == pytest.approx(exact, rel=0.1)


def test_variance_components_recovers_known_components():
    rng = np.random.default_rng(3)
    g, m = 400, 25
    b = rng.normal(0, np.sqrt(0.5), g)
    y = 2.0 + np.repeat(b, m) + rng.normal(0, np.sqrt(2.0), g * m)
    vc = variance_components(y, np.repeat(np.arange(g), m))
    assert vc.mean == pytest.approx(2.0, abs=0.1)
    assert vc.sigma_w2 == pytest.approx(2.0, rel=0.05)
    assert vc.sigma_b2 == pytest.approx(0.5, rel=0.2)
    # variance of the mean: (sb2 * sum ng^2 + sw2 * n) / n^2
    assert vc.var_of_mean() == pytest.approx(
        (vc.sigma_b2 * g * m * m + vc.sigma_w2 * g * m) / (g * m) ** 2
    )
    with pytest.raises(ValueError):
        variance_components(np.ones(3), np.ones(2))


def test_bucketed_kl_closed_form_and_bounds():
    # provider lists two tokens; reference known on both
    ref = np.log(np.array([[0.6, 0.3]]))  # tail 0.1
    prov = np.log(np.array([[0.5, 0.3]]))  # tail 0.2
    kl, mad, nk = bucketed_kl(ref, prov)
    want = 0.6 * np.log(0.6 / 0.5) + 0.3 * np.log(1.0) + 0.1 * np.log(0.1 / 0.2)
    assert kl[0] == pytest.approx(want)
    assert mad[0] == pytest.approx(abs(np.log(0.5) - np.log(0.6)) / 2)
    assert nk[0] == 2
    # identical distributions -> 0; unknown reference value merges into the tail on both sides
    kl0, _, _ = bucketed_kl(prov, prov)
    assert kl0[0] == pytest.approx(0.0, abs=1e-12)
    kl_u, _, nk_u = bucketed_kl(np.array([[np.log(0.6), np.nan]]), prov)
    want_u = 0.6 * np.log(0.6 / 0.5) + 0.4 * np.log(0.4 / 0.5)
    assert kl_u[0] == pytest.approx(want_u) and nk_u[0] == 1
    # coarse-graining never exceeds the full KL
    rng = np.random.default_rng(0)
    for _ in range(20):
        r = rng.dirichlet(np.ones(12) * 0.3)
        q = rng.dirichlet(np.ones(12) * 0.3)
        full = float(np.sum(r * np.log(r / q)))
        top = np.argsort(-q)[:4]
        kb, _, _ = bucketed_kl(np.log(r[top])[None], np.log(q[top])[None])
        assert kb[0] <= full + 1e-9
    # a provider tail of exactly 0 stays finite
    kz, _, _ = bucketed_kl(np.log(np.array([[0.9]])), np.array([[0.0]]))
    assert np.isfinite(kz[0]) and kz[0] > 1.0


def test_randomized_pit_ranges_and_exact_uniformity():
    probs = np.array([[0.5, 0.3, 0.2]] * 3)
    u = randomized_pit(probs, np.array([0, 1, 2]), rng=0)
    assert 0 <= u[0] <= 0.5 and 0.5 <= u[1] <= 0.8 and 0.8 <= u[2] <= 1.0
    # tail trick: listed top-2 of a 4-token distribution; exact law of U under H0 is uniform
    p = np.array([0.4, 0.3, 0.2, 0.1])
    rng = np.random.default_rng(1)
    n = 40000
    tok = rng.choice(4, size=n, p=p)
    rank = np.where(tok < 2, tok, -1)
    u = randomized_pit(np.tile(p[:2], (n, 1)), rank, rng=2)
    assert stats.kstest(u, "uniform").pvalue > 0.01
    assert u[rank == -1].min() >= 0.7 - 1e-12


def _bits(x: object) -> tuple[type, str, bytes]:
    a = np.asarray(x)
    return type(x), str(a.dtype), a.tobytes()


def test_fast_tails_return_scipy_stats_values_bit_for_bit():
    """binom_isf / binom_sf / binom_pmf / poisson_isf / norm_sf / chi2_ppf are scipy.stats' calls without the
    generic wrapper: the same values (dtype, scalar or array) on ordinary and edge arguments alike."""
    rng = np.random.default_rng(0)
    ns = [np.arange(0, 30), np.unique(np.geomspace(1, 1e6, 60).astype(np.int64)), np.asarray(np.int64(7))]
    qs = [1e-9, 0.001, 0.0125, 0.05, 0.5, 0.99, 0.0, 1.0]
    ps = [0.0, 1.0, 1e-6, 0.001, 0.02, 0.3, 0.9, float("nan"), 1.5]
    for n, q, p in itertools.product(ns, qs, ps):
        assert _bits(binom_isf(q, n, p)) == _bits(stats.binom.isf(q, n, p))
        assert _bits(poisson_isf(q, n * 0.01)) == _bits(stats.poisson.isf(q, n * 0.01))
        k = np.asarray(stats.binom.isf(0.05, n, 0.01), np.float64)
        shifted = (k + rng.integers(-3, 3, k.shape)).astype(np.float64)
        for kk in (k, shifted, np.full(k.shape, np.inf), np.full(k.shape, -np.inf)):
            assert _bits(binom_sf(kk, n, p)) == _bits(stats.binom.sf(kk, n, p))
    for c, p in itertools.product([0, 1, 2, 5, 40, 1000], ps):
        ks = np.arange(-2, min(c, 50) + 3)
        assert _bits(binom_pmf(ks, c, p)) == _bits(stats.binom.pmf(ks, c, p))
        assert _bits(binom_sf(3, c, p)) == _bits(stats.binom.sf(3, c, p))
    x = np.concatenate([rng.normal(0, 6, 500), [np.inf, -np.inf, np.nan, 0.0, -0.0, 40.0, -40.0]])
    assert _bits(norm_sf(x)) == _bits(stats.norm.sf(x))
    for df, q in itertools.product([1, 2, 3, 10, 99, 4000], [1e-9, 0.025, 0.5, 0.975, 0.0, 1.0]):
        assert _bits(chi2_ppf(q, df)) == _bits(stats.chi2.ppf(q, df))


def _pmf_by_slices(p: np.ndarray) -> np.ndarray:
    """poisson_binomial_pmf's tree with every short level added slice by slice (its general path)."""
    arr = np.stack([1.0 - p, p], axis=1) if p.size else np.ones((1, 1))
    while arr.shape[0] > 1:
        m, L = arr.shape
        if m % 2:
            one = np.zeros((1, L))
            one[0, 0] = 1.0
            arr = np.vstack([arr, one])
        a, b = arr[0::2], arr[1::2]
        if L <= 64:
            out = np.zeros((a.shape[0], 2 * L - 1))
            for j in range(L):
                out[:, j : j + L] += a[:, j : j + 1] * b
        else:
            out = np.stack([np.convolve(x, y) for x, y in zip(a, b, strict=True)])
        arr = out
    return np.asarray(arr[0][: p.size + 1], dtype=np.float64).copy()


def test_poisson_binomial_pmf_accumulated_levels_are_the_sliced_sums_bit_for_bit():
    rng = np.random.default_rng(4)
    for n in [0, 1, 2, 3, 5, 8, 17, 33, 64, 65, 100, 130, 300, 700]:
        for p in (rng.uniform(0, 1, n), rng.uniform(0, 1, n) ** 6, rng.choice([0.0, -0.0, 1.0, 0.5], n)):
            p = np.clip(p, 0.0, 1.0)
            assert poisson_binomial_pmf(p).tobytes() == _pmf_by_slices(p).tobytes()
