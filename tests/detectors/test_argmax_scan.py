"""The argmax test's scan over the acceptance threshold (``stats.poisson_binomial_scan_test``; issue 14)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from auditor.detectors.emission import SINGLE_THRESHOLD_GRID
from auditor.detectors.sampling import ARGMAX_TEST_MIN_P, argmax_scan_thresholds
from auditor.detectors.stats import poisson_binomial_mid_p, poisson_binomial_scan_test, poisson_binomial_test

TS = argmax_scan_thresholds(ARGMAX_TEST_MIN_P)


def _null(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    p = rng.beta(2.0, 1.0, size=n)  # p(argmax) spread over (0, 1), most mass high, like sampled text
    return p, rng.random(n) < p


def test_thresholds_are_min_p_then_the_acceptance_grid() -> None:
    assert TS[0] == ARGMAX_TEST_MIN_P
    assert TS[1:] == tuple(t for t in SINGLE_THRESHOLD_GRID if t > ARGMAX_TEST_MIN_P)
    assert argmax_scan_thresholds(0.0)[0] == 0.0


def test_one_threshold_is_the_plain_poisson_binomial_test() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        p, x = _null(rng, 150)
        m = p >= 0.3
        got = poisson_binomial_scan_test(p, x, p, (0.3,), 0)["p_value"]
        want = poisson_binomial_test(p[m], int(x[m].sum()), "greater", 0)[0]
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_mid_p_is_the_plain_mid_p_with_one_threshold_and_between_the_strict_and_weak_tails() -> None:
    rng = np.random.default_rng(4)
    for _ in range(20):
        p, x = _null(rng, 150)
        m = p >= 0.3
        one = poisson_binomial_scan_test(p, x, p, (0.3,), 0)
        assert one["p_mid"] == pytest.approx(poisson_binomial_mid_p(p[m], int(x[m].sum()), "greater"), rel=1e-9,
                                             abs=1e-12)
        o = poisson_binomial_scan_test(p, x, p, TS, 0)
        assert o["p_mid"] <= o["p_value"] + 1e-12
        assert o["p_mid"] >= o["p_value"] / 2 - 1e-12  # mid-p = P(>) + P(=)/2 >= P(>=)/2


def test_randomized_p_uniform_and_exact_p_valid_under_h0() -> None:
    rng = np.random.default_rng(11)
    pr, pe = [], []
    for _ in range(1500):
        p, x = _null(rng, 200)
        o = poisson_binomial_scan_test(p, x, p, TS, rng)
        pr.append(o["p_randomized"])
        pe.append(o["p_value"])
    assert stats.kstest(pr, "uniform").pvalue > 0.01
    for a in (0.01, 0.05, 0.1):
        # conservative p: rejection rate at most a plus 3 binomial standard errors
        assert np.mean(np.asarray(pe) <= a) <= a + 3 * np.sqrt(a * (1 - a) / len(pe))


def test_scan_beats_the_lowest_threshold_when_the_excess_sits_above_a_high_threshold() -> None:
    # relaxed acceptance at s = 0.7 (argmax draft): where p(argmax) >= s a share of the non-argmax mass
    # goes to the argmax; below s the law is exact
    rng = np.random.default_rng(5)
    scan, single = [], []
    for _ in range(200):
        p = rng.beta(2.0, 1.0, size=600)
        q = np.where(p >= 0.7, p + 0.5 * (1 - p), p)
        x = rng.random(p.size) < q
        scan.append(poisson_binomial_scan_test(p, x, p, TS, rng)["p_value"] <= 0.01)
        m = p >= TS[0]
        single.append(poisson_binomial_test(p[m], int(x[m].sum()), "greater", 0)[0] <= 0.01)
    assert np.mean(scan) >= 0.85  # measured 0.915 against 0.42 for the single lowest threshold
    assert np.mean(scan) > np.mean(single) + 0.3


def test_reports_the_threshold_that_attains_the_maximum() -> None:
    p = np.array([0.4] * 50 + [0.95] * 50)
    x = np.array([False] * 30 + [True] * 20 + [True] * 50)  # low set under-emits, high set over-emits
    o = poisson_binomial_scan_test(p, x, p, (0.3, 0.9), 0)
    assert o["threshold"] == 0.9 and o["observed"] == 50 and o["n"] == 50
    assert o["z"] == pytest.approx((50 - 47.5) / np.sqrt(50 * 0.95 * 0.05))
    single = 0.95**50  # P(all 50 argmax) at the 0.9 set alone
    assert single < o["p_value"] < 2 * single  # the scan pays for its second threshold, at most Bonferroni


def test_no_variance_and_bad_arguments() -> None:
    o = poisson_binomial_scan_test(np.ones(5), np.ones(5, bool), np.ones(5), (0.3,), 0)
    assert o["p_value"] == 1.0 and o["threshold"] is None
    with pytest.raises(ValueError, match="ascending"):
        poisson_binomial_scan_test(np.ones(3) * 0.5, np.ones(3, bool), np.ones(3), (0.5, 0.3), 0)
    with pytest.raises(ValueError, match="one length"):
        poisson_binomial_scan_test(np.ones(3) * 0.5, np.ones(2, bool), np.ones(3), (0.3,), 0)
