"""Per-request heterogeneity: is a minority of requests served differently? (issue 14, item 4)

A provider that routes a fraction F of requests to a degraded replica barely moves a per-position
average, but the degraded requests stand out one by one. These tests compare R per-request
statistics ``x`` (e.g. a request's mean KL to the reference in nats, or its greedy mismatch rate)
with M draws ``y`` of the same statistic from the honest floor (same request length and prompt
class, so that under H0 the R + M values are exchangeable). Both are distribution-free: they use
only ranks, so no model of the floor's shape is needed.

- :func:`max_rank_test` — the largest request against the floor. Under H0 the ranks of the R
  observed values among all R + M are a uniformly random R-subset; with ``t`` = 1 + #{y ≥ max x}
  (the max's position from the top, ties counted against the provider), the p-value
  P(some observed value in the top t) = 1 − C(M + R − t, R) / C(M + R, R) is exact (conservative
  with ties). Most powerful when few requests are strongly degraded (mix-int4:0.1). Its smallest
  p-value is R / (M + R), so the floor needs M >= R (1 − α) / α draws to reject at level α
  (M >= 608 for R = 32 at α = 0.05; 3,168 at α = 0.01).
- :func:`exceedance_test` — the number C of requests above the floor's j-th order statistic
  (the ``quantile`` of y). Under H0 its law is the distribution of exceedances of Gumbel & von
  Schelling (1950, "The distribution of the number of exceedances", Ann. Math. Stat. 21:247):
  the exceedance probability of a fixed order statistic is Beta(M − j + 1, j), so
  C ~ BetaBinomial(R, M − j + 1, j) exactly (``scipy.stats.betabinom``); p = P(C' ≥ c).
  More powerful when many requests are mildly degraded.
- :func:`heterogeneity_test` — both, combined with the Cauchy combination (Liu & Xie 2020;
  valid under their dependence), which is what a caller should use.

Power is bounded by the chance that a degraded request is in the sample at all: with R requests
and fraction F, at most 1 − (1 − F)^R (R = 29 for 95% at F = 0.1, R = 59 at F = 0.05). Budgets for
this test are therefore set in requests (short ones), not tokens.

Not wired into the verdict's Holm family: calibration decides (see docs/calibration.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats
from scipy.special import gammaln

from .sampling import cauchy_combination

__all__ = ["exceedance_test", "heterogeneity_test", "max_power_bound", "max_rank_test"]


def _as_1d(name: str, x: np.ndarray | list[float], min_n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size < min_n or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must hold at least {min_n} finite numbers (got {a.size}); "
                         "pass one value per request / per honest floor draw")
    return a


def _log_comb(n: float, k: float) -> float:
    return float(gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))


def max_rank_test(x: np.ndarray | list[float], y: np.ndarray | list[float]) -> dict[str, Any]:
    """Exact rank test of the largest per-request statistic against the honest floor draws.

    Args:
        x: [R] per-request statistics of the audited provider (R >= 1; larger = more divergent).
        y: [M] the same statistic on honest requests (M >= 1), exchangeable with ``x`` under H0.

    Returns:
        dict with p_value, statistic (max x), top_position t (1 = above every floor draw), R, M.

    Raises:
        ValueError: empty or non-finite input.
    """
    xa, ya = _as_1d("x", x, 1), _as_1d("y", y, 1)
    r, m = xa.size, ya.size
    xmax = float(xa.max())
    t = 1 + int((ya >= xmax).sum())
    # P(no observed value among the top t) = C(M + R - t, R) / C(M + R, R)   (t <= M + 1)
    log_none = _log_comb(m + r - t, r) - _log_comb(m + r, r) if m + r - t >= r else -np.inf
    p = float(-np.expm1(log_none)) if np.isfinite(log_none) else 1.0
    return {"p_value": min(1.0, max(0.0, p)), "statistic": xmax, "top_position": t, "R": r, "M": m}


def exceedance_test(
    x: np.ndarray | list[float], y: np.ndarray | list[float], quantile: float = 0.95
) -> dict[str, Any]:
    """Count of requests above the floor's ``quantile`` order statistic; exact beta-binomial null.

    The threshold is the j-th smallest floor draw, j = ceil(quantile · M) (Gumbel & von Schelling
    1950; see module doc). Ties with the threshold do not count as exceedances (conservative).

    Args:
        x: [R] per-request statistics (larger = more divergent).
        y: [M] honest floor draws of the same statistic (M >= 2).
        quantile: in (0, 1); the threshold's level.

    Returns:
        dict with p_value = P(C' >= c), count c, expected (R · (M − j + 1)/(M + 1)), threshold, j.

    Raises:
        ValueError: bad inputs or quantile outside (0, 1).
    """
    if not (0.0 < quantile < 1.0):
        raise ValueError(f"quantile={quantile} must be in (0, 1), e.g. 0.95")
    xa, ya = _as_1d("x", x, 1), _as_1d("y", y, 2)
    r, m = xa.size, ya.size
    j = min(m, max(1, int(np.ceil(quantile * m))))
    thr = float(np.sort(ya)[j - 1])
    c = int((xa > thr).sum())
    law = stats.betabinom(r, m - j + 1, j)
    p = float(law.sf(c - 1)) if c > 0 else 1.0
    return {"p_value": min(1.0, max(0.0, p)), "count": c, "expected": float(law.mean()), "threshold": thr,
            "j": j, "R": r, "M": m}


def heterogeneity_test(
    x: np.ndarray | list[float], y: np.ndarray | list[float], quantile: float = 0.95
) -> dict[str, Any]:
    """Cauchy combination of :func:`max_rank_test` and :func:`exceedance_test` (module doc).

    Args:
        x: [R] per-request statistics of the audited provider, e.g. mean KL per request (nats).
        y: [M] honest floor draws of the same statistic.
        quantile: the exceedance test's threshold level.

    Returns:
        dict with p_value (combined), max (max_rank_test dict), exceedance (exceedance_test dict).

    Raises:
        ValueError: bad inputs (see the two tests).
    """
    mx = max_rank_test(x, y)
    ex = exceedance_test(x, y, quantile)
    _, p = cauchy_combination([mx["p_value"], ex["p_value"]])
    return {"p_value": p, "max": mx, "exceedance": ex}


def max_power_bound(n_requests: int, fraction: float) -> float:
    """Upper bound on any per-request test's power: P(at least one routed request) = 1 − (1 − F)^R."""
    if n_requests < 0 or not (0.0 <= fraction <= 1.0):
        raise ValueError(f"n_requests={n_requests} must be >= 0 and fraction={fraction} in [0, 1]")
    return float(1.0 - (1.0 - fraction) ** n_requests)
