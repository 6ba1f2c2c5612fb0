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

The rank tests above need M >= 608 honest draws of the per-request statistic, more requests than
a noise floor measures, so they are not in the verdict's Holm family. What is:
:func:`greedy_heterogeneity` (registry key ``greedy-heterogeneity``), a per-request scan of the
greedy clear mismatches against the floor's honest rate (an exact binomial per request, Šidák over
requests), whose false-accusation rate the calibration measures on the honest profiles; and
:func:`logprob_heterogeneity` (``logprob-heterogeneity``, issue 37 item 4), the same scan of the reported
logprobs' divergence per request against the floor's random-effects model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats
from scipy.special import gammaln

from .base import MIN_POSITIONS, DetectorName, DetectorResult, EvidenceBatch, not_run
from .greedy import greedy_gaps, honest_band_and_rate
from .noise_floor import DEFAULT_MARGIN_BAND, NoiseFloor
from .stats import RngLike, cauchy_combination

__all__ = [
    "MIN_REQUESTS",
    "exceedance_test",
    "greedy_heterogeneity",
    "heterogeneity_test",
    "logprob_heterogeneity",
    "max_power_bound",
    "max_rank_test",
]


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


# --------------------------------------------------------------------------- the registry's detector
#: Requests (prompt groups) a per-request scan needs before it runs.
MIN_REQUESTS = 2


def greedy_heterogeneity(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.GREEDY_HETEROGENEITY,
) -> DetectorResult:
    """Per-request scan of the greedy clear mismatches: is a minority of requests served differently?

    ``greedy-match`` pools every greedy position, so a provider that answers a fraction F of its
    requests from a degraded replica (``mix-PROFILE:F``) moves its rate by only F times the
    replica's rate. Here each greedy request g (one prompt: temperature 0 is deterministic) is
    tested on its own: with n_g positions and k_g clear mismatches (gap above the floor's
    near-tie band, exactly as ``greedy-match`` classifies them), p_g = P(Bin(n_g, r0) ≥ k_g) with
    the honest clear-mismatch rate r0 = max(floor rate, MIN_HONEST_CLEAR_RATE). The statistic is
    the smallest p_g; its p-value is the Šidák bound 1 − (1 − min p_g)^G over the G requests,
    valid for independent requests and conservative for the discrete p_g (P(p_g ≤ t) ≤ t).

    Args:
        batch: evidence; uses positions with temperature <= GREEDY_TEMPERATURE_MAX, an aligned
            token and a reference row, grouped by ``prompt_ids``.
        floor: noise floor (band and honest rate); defaults as in ``greedy_match``.
        rng: unused (the test is not randomized); accepted for the registry's call signature.
        n_evidence: how many positions of the most extreme request to list.

    Returns:
        DetectorResult: statistic = −log10(min p_g), p_value = Šidák bound, effect = clear-mismatch
        rate of the most extreme request, n = greedy positions, details = {n_requests,
        worst_request (prompt id), worst_clear, worst_positions, outlier_requests (p_g <= 0.05/G),
        outlier_clear_rate (their pooled clear-mismatch rate), band, r0}.
    """
    del rng
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    idx, mismatch, gap = greedy_gaps(batch)
    groups, inv = np.unique(batch.prompt_ids[idx], return_inverse=True)
    if idx.size < MIN_POSITIONS or groups.size < MIN_REQUESTS:
        return not_run(name, f"too few greedy requests ({groups.size} < {MIN_REQUESTS}) or positions "
                             f"({idx.size} < {MIN_POSITIONS})", n=int(idx.size))
    band, r0 = honest_band_and_rate(floor)
    clear = mismatch & (gap > band)
    n_g = np.bincount(inv).astype(np.int64)
    k_g = np.bincount(inv, weights=clear.astype(np.float64)).astype(np.int64)
    p_g = np.where(k_g > 0, stats.binom.sf(k_g - 1, n_g, r0), 1.0)
    g = int(np.argmin(p_g))
    pmin = float(p_g[g])
    n_req = int(groups.size)
    p = float(-np.expm1(n_req * np.log1p(-pmin))) if pmin < 1.0 else 1.0
    out = p_g <= 0.05 / n_req
    sel = np.flatnonzero((inv == g) & clear)
    order = sel[np.argsort(-gap[sel], kind="stable")][:n_evidence]
    evidence = [batch.evidence_row(int(idx[j]), gap=float(gap[j]), margin=float(gap[j]), clear=True) for j in order]
    return DetectorResult(
        name=name,
        statistic=float(-np.log10(max(pmin, 1e-300))),
        p_value=min(1.0, max(0.0, p)),
        effect=float(k_g[g] / n_g[g]),
        effect_ci=(float("nan"), float("nan")),
        n=int(idx.size),
        evidence=evidence,
        reason=None if floor is not None else f"no noise floor: default band {DEFAULT_MARGIN_BAND} nats",
        details={
            "n_requests": n_req,
            "worst_request": str(groups[g]),
            "worst_clear": int(k_g[g]),
            "worst_positions": int(n_g[g]),
            "outlier_requests": int(out.sum()),
            "outlier_clear_rate": float(k_g[out].sum() / n_g[out].sum()) if out.any() else None,
            "band": float(band),
            "r0": float(r0),
        },
    )


def logprob_heterogeneity(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.LOGPROB_HETEROGENEITY,
) -> DetectorResult:
    """Per-request scan of the logprob divergence: do a minority of requests report another distribution?

    ``logprob-divergence`` averages y = log(KL + eps) over every position (module ``auditor.detectors.logprob``),
    so a provider that serves a fraction F of its requests from a degraded replica moves ȳ by about F times the
    replica's shift — and not at all when the other requests sit *below* the honest floor (a server that matches
    the fp32 reference exactly: KL ≈ 0, y ≈ log eps). Issue 37 item 4: a 10% int4 mixture had a mean KL 6-60x the
    floor and p = 1.0. Here each request g (one prompt: its positions share a prefix) is tested on its own, on the
    same positions and statistic as the pooled test (:func:`auditor.detectors.logprob.select_logprob_test`): with
    n_g positions and mean ȳ_g, under the floor's one-way random-effects model (between-prompt σ_b², within σ_w²)

        z_g = (ȳ_g − μ0_g) / sqrt(σ_b² + σ_w² / n_g + Var(μ̂0_g)),  p_g = 1 − Φ(z_g),

    μ0_g the floor's mean at the request's own positions (``KLFloor.null_mean``, with its estimate's variance).
    The statistic is the smallest p_g; its p-value the Šidák bound 1 − (1 − min p_g)^G over the G requests (valid
    for independent requests; the shared floor estimate makes the z_g positively dependent, where Šidák stays
    conservative). It joins the verdict's Holm family (rule 3h-logprob-mixture), so honest audits stay at α.

    Args:
        batch: evidence; the positions :func:`auditor.detectors.logprob.select_logprob_test` selects (reference,
            trusted provider top_logprobs, T in {0, 1}), grouped by ``prompt_ids``.
        floor: the model's noise floor (required, as for ``logprob-divergence``).
        rng: unused (the test is not randomized); accepted for the registry's call signature.
        n_evidence: positions of the most divergent request to list (largest KL first).

    Returns:
        DetectorResult: statistic = −log10(min p_g), p_value = Šidák bound, effect = mean KL (nats) of the most
        divergent request, n = positions, details = {n_requests, worst_request, worst_positions, worst_z,
        worst_ratio_to_floor (its mean KL over the floor's), outlier_requests (p_g <= 0.05 / G), outlier_mean_kl,
        outlier_ratio_to_floor, floor_mean_kl, m}.
    """
    del rng
    from .logprob import LOGPROB_TEMPERATURES, select_logprob_test

    sel = select_logprob_test(batch, floor, LOGPROB_TEMPERATURES, name)
    if isinstance(sel, DetectorResult):
        return sel
    idx = sel.idx
    groups, inv = np.unique(batch.prompt_ids[idx], return_inverse=True)
    if groups.size < MIN_REQUESTS:
        return not_run(name, f"too few requests with provider top_logprobs ({groups.size} < {MIN_REQUESTS})",
                       n=int(idx.size))
    vc = sel.test_floor.components
    n_g = np.bincount(inv).astype(np.float64)
    ybar = np.bincount(inv, weights=sel.y) / n_g
    klbar = np.bincount(inv, weights=sel.kl) / n_g
    pos = batch.positions[idx]
    z = np.empty(groups.size)
    for g in range(groups.size):
        mu0, var_mu = sel.test_floor.null_mean(pos[inv == g])
        sd = float(np.sqrt(vc.sigma_b2 + vc.sigma_w2 / n_g[g] + var_mu))
        z[g] = (ybar[g] - mu0) / sd if sd > 0 else (np.inf if ybar[g] > mu0 else 0.0)
    p_g = stats.norm.sf(z)
    g = int(np.argmin(p_g))
    pmin = float(p_g[g])
    n_req = int(groups.size)
    p = float(-np.expm1(n_req * np.log1p(-pmin))) if pmin < 1.0 else 1.0
    out = p_g <= 0.05 / n_req
    fkl = float(sel.floor.mean_kl)
    sel_g = np.flatnonzero(inv == g)
    order = sel_g[np.argsort(-sel.kl[sel_g], kind="stable")][:n_evidence]
    evidence = [batch.evidence_row(int(idx[j]), kl=float(sel.kl[j])) for j in order]
    out_kl = float(np.sum(klbar[out] * n_g[out]) / n_g[out].sum()) if out.any() else None
    return DetectorResult(
        name=name,
        statistic=float(-np.log10(max(pmin, 1e-300))),
        p_value=min(1.0, max(0.0, p)),
        effect=float(klbar[g]),
        effect_ci=(float("nan"), float("nan")),
        n=int(idx.size),
        evidence=evidence,
        details={
            "n_requests": n_req,
            "worst_request": str(groups[g]),
            "worst_positions": int(n_g[g]),
            "worst_z": float(z[g]),
            "worst_ratio_to_floor": float(klbar[g] / fkl) if fkl > 0 else None,
            "outlier_requests": int(out.sum()),
            "outlier_mean_kl": out_kl,
            "outlier_ratio_to_floor": out_kl / fkl if out_kl is not None and fkl > 0 else None,
            "floor_mean_kl": fkl,
            "m": sel.m,
        },
    )
