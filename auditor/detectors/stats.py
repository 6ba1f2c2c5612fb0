"""Pure statistical helpers shared by the detectors (numpy/scipy only, no I/O).

Everything here works on plain numpy arrays so that it can be unit-tested in closed form and
vectorised over many simulated audits. Units: probabilities in [0, 1], log-probabilities and KL in
nats.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special, stats

__all__ = [
    "RngLike",
    "VarianceComponents",
    "as_rng",
    "binom_isf",
    "binom_pmf",
    "binom_sf",
    "bucketed_kl",
    "cauchy_combination",
    "chi2_ppf",
    "cramervonmises_uniform_statistics",
    "garwood_ci",
    "holm",
    "improbable_draws",
    "mean_variance_under",
    "norm_sf",
    "pit_bounds",
    "poisson_binomial_mid_p",
    "poisson_binomial_pmf",
    "poisson_binomial_scan_test",
    "poisson_binomial_test",
    "poisson_isf",
    "randomized_pit",
    "variance_components",
    "wilson_ci",
]

#: A numpy Generator, or a seed for one (None: fresh entropy). Default seeds make audits reproducible.
RngLike = np.random.Generator | int | None

#: Above this many trials the Poisson-binomial tail uses the refined normal approximation
#: (Volkova 1996) instead of the exact O(n^2) recursion.
EXACT_POISSON_BINOMIAL_MAX_N = 5000

#: Probability given to an empty bucket of the provider's distribution in :func:`bucketed_kl`
#: (a reported tail of exactly 0 would otherwise make KL infinite). Bounds one bucket's
#: contribution to r * log(r / 1e-8) <= 18.4 r nats.
KL_PROB_FLOOR = 1e-8


# Distribution tails without scipy.stats' generic argument handling, which costs far more than the tail
# itself on the small arrays and scalars that the power searches and exact tests evaluate thousands of
# times per audit. Each returns what the scipy.stats call named in its docstring returns, bit for bit
# (same dtype, a scalar for 0-d input): on ordinary arguments (q in (0, 1), integer n >= 0, p in [0, 1],
# k without NaN, finite mu >= 0) it applies the distribution's own elementwise method exactly where the
# generic wrapper would, and the wrapper's constants elsewhere; any other argument goes to the wrapper.


#: the elementwise methods the fast paths call are scipy's private API (1.17); without them every call
#: takes the public wrapper
_FAST_TAILS = all(callable(getattr(d, m, None)) for d, m in (
    (stats.binom, "_isf"), (stats.binom, "_sf"), (stats.binom, "_pmf"), (stats.poisson, "_isf")))


def _plain_p(p: object) -> bool:
    return _FAST_TAILS and type(p) in (float, int, np.float64) and 0 <= p <= 1  # type: ignore[operator]


def binom_isf(q: float, n: np.ndarray | int, p: float) -> np.ndarray:
    """``stats.binom.isf(q, n, p)`` (see above)."""
    n = np.asarray(n)
    if np.ndim(q) or not (0 < q < 1 and _plain_p(p)) or n.dtype.kind not in "iu" or bool((n < 0).any()):
        return stats.binom.isf(q, n, p)  # type: ignore[no-any-return]
    return stats.binom._isf(q, n, p) + 0  # type: ignore[no-any-return]  # + loc, as the wrapper adds it


def binom_sf(k: np.ndarray | float, n: np.ndarray | int, p: float) -> np.ndarray:
    """``stats.binom.sf(k, n, p)`` (see above)."""
    k, n = np.asarray(k), np.asarray(n)
    if (not _plain_p(p) or n.dtype.kind not in "iu" or k.dtype.kind not in "iuf" or bool((n < 0).any())
            or bool(np.isnan(k).any())):
        return stats.binom.sf(k, n, p)  # type: ignore[no-any-return]
    k, n = np.broadcast_arrays(k, n)
    out = np.where(k < 0, 1.0, 0.0)  # below the support 1, at or above n 0
    cond = (k >= 0) & (k < n) & np.isfinite(k)
    if cond.any():
        out[cond] = np.clip(stats.binom._sf(k[cond], n[cond], p), 0, 1)
    return out[()] if out.ndim == 0 else out


def binom_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    """``stats.binom.pmf(k, n, p)`` for integer k (see above)."""
    k, n_ = np.asarray(k), np.asarray(n)
    if not _plain_p(p) or n_.dtype.kind not in "iu" or k.dtype.kind not in "iu" or bool((n_ < 0).any()):
        return stats.binom.pmf(k, n, p)  # type: ignore[no-any-return]
    k, n_ = np.broadcast_arrays(k, n_)
    out = np.zeros(k.shape)
    cond = (k >= 0) & (k <= n_)
    if cond.any():
        out[cond] = np.clip(stats.binom._pmf(k[cond], n_[cond], p), 0, 1)
    return out[()] if out.ndim == 0 else out


def poisson_isf(q: float, mu: np.ndarray) -> np.ndarray:
    """``stats.poisson.isf(q, mu)`` (see above)."""
    mu = np.asarray(mu)
    if not _FAST_TAILS or np.ndim(q) or not 0 < q < 1 or mu.dtype != np.float64 or not bool(np.isfinite(mu).all() and (mu >= 0).all()):
        return stats.poisson.isf(q, mu)  # type: ignore[no-any-return]
    return stats.poisson._isf(q, mu) + 0  # type: ignore[no-any-return]  # + loc, as the wrapper adds it


def chi2_ppf(q: float, df: int) -> float:
    """``stats.chi2.ppf(q, df)`` for one q and integer df (see above): 2 gammaincinv(df / 2, q), times the
    scale 1 plus the location 0 as the wrapper applies them."""
    if not (type(q) is float and 0 < q < 1 and type(df) is int and df > 0):
        return stats.chi2.ppf(q, df)  # type: ignore[no-any-return]
    return 2 * special.gammaincinv(df / 2, q) * 1 + 0  # type: ignore[no-any-return]


def norm_sf(x: np.ndarray) -> np.ndarray:
    """``stats.norm.sf(x)`` for float64 x: ndtr(−x) (the wrapper's 1 at −inf, 0 at +inf and NaN at NaN are
    ndtr's own values there)."""
    x = np.asarray(x)
    if x.dtype != np.float64:
        return stats.norm.sf(x)  # type: ignore[no-any-return]
    return special.ndtr(-x)  # type: ignore[no-any-return]


def as_rng(rng: RngLike) -> np.random.Generator:
    """Return a numpy Generator; ints seed it (default seeds make audits reproducible)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values.

    Args:
        p_values: [m] float p-values; NaN entries (detectors that did not run) are ignored and
            stay NaN, and do not count towards the family size m.

    Returns:
        [m] float64 adjusted p-values, monotone in the order of the raw p-values, capped at 1.
        Reject H_i at family-wise level alpha iff adjusted_i <= alpha.

    Raises:
        ValueError: if a p-value lies outside [0, 1].
    """
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    if np.any((p[ok] < 0) | (p[ok] > 1)):
        raise ValueError(f"p_values must lie in [0, 1]; got {p[ok].tolist()}")
    idx = np.flatnonzero(ok)
    m = idx.size
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = (m - np.arange(m)) * p[order]
    adj = np.minimum(np.maximum.accumulate(scaled), 1.0)
    out[order] = adj
    return out


#: :func:`improbable_draws`: a drawn token is *improbable* when the distribution it was drawn from gives it at most
#: this log-probability (nats; e^-20 ≈ 2.1e-9).
IMPROBABLE_LOGPROB = -20.0
#: :func:`improbable_draws`'s vocabulary bound: at least the vocabulary of any model the product audits (Gemma 3:
#: 262,144 tokens; Llama 3: 128,256; Qwen: 151,936; DeepSeek-V3: 129,280; gpt-oss: 201,088; Kimi K2: 163,840).
MAX_VOCAB = 262_144


def improbable_draws(token_logprobs: np.ndarray, *, threshold: float = IMPROBABLE_LOGPROB,
                     vocab: int = MAX_VOCAB) -> dict[str, float | int]:
    """How many drawn tokens the reported distribution gives at most ``threshold`` nats, and how unlikely that
    many is if each token was drawn from the distribution its logprob was reported from.

    A token x drawn from a distribution p has p(x) <= ε with probability Σ_{y: p(y) <= ε} p(y) <= V·ε (at most V
    tokens each with at most ε), whatever p is: a quantized or another model that samples from what it reports is
    bound by it exactly as the declared model is, and a truncating sampler (top-k / top-p) only lowers it. Given
    the past, each position is such a Bernoulli with probability at most q = V·ε, so the count K is stochastically
    dominated by Binomial(n, q): p = P(Binomial(n, q) >= K) is a valid p-value without a reference or a floor.

    Args:
        token_logprobs: [n] float64, the reported logprob (nats) of each drawn token at temperature 1; NaN
            entries (not reported) are dropped.
        threshold: ε in nats (default :data:`IMPROBABLE_LOGPROB`). vocab: V (default :data:`MAX_VOCAB`).

    Returns:
        {"count": K, "positions": n, "bound_per_position": q, "p_value": p} (p = 1 when K = 0).
    """
    lp = np.asarray(token_logprobs, np.float64)
    lp = lp[~np.isnan(lp)]
    k, n = int(np.count_nonzero(lp <= threshold)), int(lp.size)
    q = min(1.0, float(vocab) * math.exp(threshold))
    p = float(binom_sf(k - 1, n, q)) if k > 0 else 1.0
    return {"count": k, "positions": n, "bound_per_position": q, "p_value": p}


def wilson_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n (nan, nan when n == 0)."""
    if n <= 0:
        return (float("nan"), float("nan"))
    z = stats.norm.ppf(0.5 + confidence / 2)
    ph = k / n
    den = 1 + z * z / n
    centre = (ph + z * z / (2 * n)) / den
    half = z * np.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return (float(max(0.0, centre - half)), float(min(1.0, centre + half)))


def garwood_ci(count: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) confidence interval for a Poisson mean given an observed count."""
    a = 1 - confidence
    lo = 0.0 if count == 0 else chi2_ppf(a / 2, 2 * count) / 2
    hi = chi2_ppf(1 - a / 2, 2 * count + 2) / 2
    return (float(lo), float(hi))


def poisson_binomial_pmf(p: np.ndarray) -> np.ndarray:
    """Exact pmf of S = sum of independent Bernoulli(p_i).

    Args:
        p: [n] float success probabilities in [0, 1].

    Returns:
        [n+1] float64, pmf[s] = P(S = s). Built as a balanced tree of convolutions: the trials'
        pmfs ``[1 - p_i, p_i]`` are convolved pairwise, level by level (vectorized over the pairs
        while they are short, ``np.convolve`` once they are long). O(n^2) multiply-adds in C and
        numerically stable like the textbook recursion (sums of non-negative terms, no FFT).
    """
    p = np.clip(np.asarray(p, dtype=np.float64).reshape(-1), 0.0, 1.0)
    arr = np.stack([1.0 - p, p], axis=1) if p.size else np.ones((1, 1))  # [m, L]: m partial pmfs of length L
    while arr.shape[0] > 1:
        m, L = arr.shape
        if m % 2:
            one = np.zeros((1, L))
            one[0, 0] = 1.0  # the pmf of zero trials
            arr = np.vstack([arr, one])
        a, b = arr[0::2], arr[1::2]
        if 2 < L <= 64 and a.shape[0] * L <= 272:  # few pairs: one accumulation instead of L slice updates
            # out[:, s] = sum_j a[:, j] b[:, s - j] added in the order j = 0, 1, ..., L - 1 as below: the
            # products skewed (row j shifted by j, zeros around) and accumulated along j; the final + 0.0
            # turns an all-zero sum's sign to the +0.0 of a sum started at 0.0 (the same floats)
            z = np.zeros((a.shape[0], L, 2 * L))
            z[:, :, :L] = a[:, :, None] * b[:, None, :]
            skew = z.reshape(a.shape[0], -1)[:, : L * (2 * L - 1)].reshape(a.shape[0], L, 2 * L - 1)
            out = np.add.accumulate(skew, axis=1)[:, -1] + 0.0
        elif L <= 64:
            out = np.zeros((a.shape[0], 2 * L - 1))
            for j in range(L):
                out[:, j : j + L] += a[:, j : j + 1] * b
        else:
            out = np.stack([np.convolve(x, y) for x, y in zip(a, b, strict=True)])
        arr = out
    return np.asarray(arr[0][: p.size + 1], dtype=np.float64).copy()


def _refined_normal_cdf(x: np.ndarray | float, mu: float, sigma: float, gamma: float) -> np.ndarray:
    """Refined normal approximation to a Poisson-binomial CDF at (continuity-corrected) x."""
    z = (np.asarray(x, dtype=np.float64) - mu) / sigma
    val = stats.norm.cdf(z) + gamma * (1 - z * z) * stats.norm.pdf(z) / 6
    return np.asarray(np.clip(val, 0.0, 1.0), dtype=np.float64)


def poisson_binomial_test(
    p: np.ndarray,
    observed: int,
    alternative: str,
    rng: RngLike = None,
) -> tuple[float, float]:
    """One-sided test of an observed count of successes against independent Bernoulli(p_i).

    Args:
        p: [n] float per-trial success probabilities under H0.
        observed: the observed number of successes S.
        alternative: "greater" (too many successes) or "less" (too few).
        rng: generator or seed for the randomized p-value.

    Returns:
        (p_exact, p_randomized): p_exact = P(S' >= s) (or <= s) — conservative, used for
        decisions; p_randomized = P(S' > s) + V P(S' = s), V ~ U(0,1) — exactly Uniform(0,1)
        under H0 (used for calibration checks). Exact recursion up to
        ``EXACT_POISSON_BINOMIAL_MAX_N`` trials, refined normal approximation beyond.

    Raises:
        ValueError: on an unknown ``alternative``.
    """
    if alternative not in ("greater", "less"):
        raise ValueError(
            f"alternative must be 'greater' or 'less', got {alternative!r}"
        )
    p = np.clip(np.asarray(p, dtype=np.float64).reshape(-1), 0.0, 1.0)
    n = p.size
    s = int(observed)
    v = float(as_rng(rng).random())
    if n == 0:
        return (1.0, v)
    if n <= EXACT_POISSON_BINOMIAL_MAX_N:
        pmf = poisson_binomial_pmf(p)
        cdf = np.cumsum(pmf)
        s_c = min(max(s, 0), n)
        at = pmf[s_c] if 0 <= s <= n else 0.0
        if alternative == "greater":
            above = float(max(0.0, 1.0 - cdf[s_c])) if s >= 0 else 1.0
            if s > n:
                above = 0.0
        else:
            above = float(cdf[s_c - 1]) if s_c >= 1 else 0.0  # P(S < s)
            if s > n:
                above, at = 1.0, 0.0
    else:
        mu = p.sum()
        var = (p * (1 - p)).sum()
        sigma = max(np.sqrt(var), 1e-12)
        gamma = float((p * (1 - p) * (1 - 2 * p)).sum() / sigma**3)
        cdf_s = float(_refined_normal_cdf(s + 0.5, mu, sigma, gamma))
        cdf_sm1 = float(_refined_normal_cdf(s - 0.5, mu, sigma, gamma))
        at = max(0.0, cdf_s - cdf_sm1)
        above = 1.0 - cdf_s if alternative == "greater" else cdf_sm1
    p_exact = float(min(1.0, above + at))
    p_rand = float(min(1.0, above + v * at))
    return (p_exact, p_rand)


def poisson_binomial_scan_test(
    p: np.ndarray,
    success: np.ndarray,
    key: np.ndarray,
    thresholds: tuple[float, ...],
    rng: RngLike = None,
) -> dict[str, Any]:
    """Scan of a one-sided (too many successes) Poisson-binomial count over nested position sets.

    For each threshold t_k (ascending) the set A_k = {i : key_i >= t_k} gives a standardised count
    z_k = (S_k − E_k) / sd_k, S_k = Σ_{A_k} success, E_k = Σ_{A_k} p, sd_k² = Σ_{A_k} p(1 − p); the statistic
    is Z = max_k z_k (sets with sd_k = 0 are skipped). Because the keys depend on H0's probabilities
    only, the sets are fixed under H0 and A_k is the disjoint union of the blocks {t_j <= key < t_{j+1}},
    j >= k, whose counts are independent Poisson-binomials; P(Z >= z) is computed exactly by one pass over
    the blocks from the top, convolving each block's pmf into the running count and removing the mass
    whose partial count already reaches its boundary (the removed masses are disjoint events, so the
    p-value is their sum, without cancellation). The cost is O(n²) like :func:`poisson_binomial_pmf`.
    Beyond ``EXACT_POISSON_BINOMIAL_MAX_N`` positions the p-value is the Bonferroni bound K · min_k p_k
    of the separate tests (valid, conservative).

    Used by the argmax over-emission test (``auditor.detectors.sampling.argmax_test``): a relaxed
    acceptance rule with threshold s adds argmax emissions only where p(argmax) >= s, so the count
    restricted to those positions has far less null variance; the scan adapts to the unknown s at the
    cost of a multiplicity the exact law accounts for (a likelihood-ratio scan in the spirit of Kulldorff's
    scan statistics, Kulldorff 1997, Commun. Stat. Theory Methods 26:1481).

    Args:
        p: [n] float success probabilities under H0 (in [0, 1]).
        success: [n] bool observed successes.
        key: [n] float the ordering key (positions with key < thresholds[0] are not tested).
        thresholds: ascending key thresholds t_1 < ... < t_K.
        rng: generator or seed for the randomized p-value.

    Returns:
        dict: ``p_value`` (P(Z' >= Z), conservative), ``p_randomized`` (P(Z' > Z) + V P(Z' = Z), V ~ U(0, 1);
        exactly uniform under H0 on the exact path), ``p_mid`` (Lancaster's mid-p P(Z' > Z) + P(Z' = Z)/2,
        deterministic; the Bonferroni bound on that path), ``z`` (Z; 0.0 when no set has variance), ``threshold``
        (the t_k attaining Z, None when none), ``observed``/``expected``/``n`` of that set.

    Raises:
        ValueError: mismatched shapes or thresholds not strictly ascending.
    """
    p = np.clip(np.asarray(p, dtype=np.float64).reshape(-1), 0.0, 1.0)
    x = np.asarray(success, dtype=bool).reshape(-1)
    k_ = np.asarray(key, dtype=np.float64).reshape(-1)
    ts = tuple(float(t) for t in thresholds)
    if not (p.size == x.size == k_.size):
        raise ValueError(f"p, success and key must have one length, got {p.size}, {x.size}, {k_.size}")
    if not ts or any(b <= a for a, b in itertools.pairwise(ts)):
        raise ValueError(f"thresholds must be non-empty and strictly ascending, got {ts}")
    v = float(as_rng(rng).random())
    sets = []
    for t in ts:
        m = k_ >= t
        e, var = float(p[m].sum()), float((p[m] * (1 - p[m])).sum())
        if var > 0:
            sets.append((t, m, int(x[m].sum()), e, math.sqrt(var)))
    if not sets:
        return {"p_value": 1.0, "p_randomized": v, "p_mid": 0.5, "z": 0.0, "threshold": None, "observed": 0, "expected": 0.0,
                "n": 0}
    zs = [(s - e) / sd for _, _, s, e, sd in sets]
    best = int(np.argmax(zs))
    z = float(zs[best])
    t_b, m_b, s_b, e_b, _ = sets[best]
    out: dict[str, Any] = {"z": z, "threshold": t_b, "observed": s_b, "expected": e_b, "n": int(m_b.sum())}
    n = int((k_ >= sets[0][0]).sum())
    if n > EXACT_POISSON_BINOMIAL_MAX_N:
        ps = [poisson_binomial_test(p[m], s, "greater", 0) for _, m, s, _, _ in sets]
        lo = min(q[0] for q in ps)
        bound = float(min(1.0, len(sets) * lo))
        out.update(p_value=bound, p_randomized=bound, p_mid=bound)
        return out
    tol = 1e-9
    # blocks between consecutive kept thresholds, from the top; each block's boundary applies after it
    edges = [t for t, *_ in sets] + [math.inf]
    blocks = [poisson_binomial_pmf(p[(k_ >= edges[j]) & (k_ < edges[j + 1])]) for j in range(len(sets))]

    def tail(strict: bool) -> float:
        dist = np.ones(1)
        removed = 0.0
        for j in range(len(sets) - 1, -1, -1):
            dist = np.convolve(dist, blocks[j])
            _, _, _, e, sd = sets[j]
            c = (math.floor(e + (z + tol) * sd) + 1) if strict else math.ceil(e + (z - tol) * sd)
            c = max(c, 0)
            if c < dist.size:  # np.convolve returned a new array: zero the violating tail in place
                removed += float(dist[c:].sum())
                dist[c:] = 0.0
        return min(1.0, removed)

    ge, gt = tail(False), tail(True)
    out.update(p_value=float(ge), p_randomized=float(min(1.0, gt + v * max(0.0, ge - gt))),
               p_mid=float(min(1.0, gt + 0.5 * max(0.0, ge - gt))))
    return out


class VarianceComponents:
    """One-way random-effects summary of a per-position statistic grouped by prompt.

    y_ij = mu + b_i + e_ij, Var(b) = sigma_b2 (between prompts), Var(e) = sigma_w2 (within).
    Estimated with the unbalanced ANOVA (method-of-moments) estimator, sigma_b2 clipped at 0.
    """

    __slots__ = ("mean", "n", "n_groups", "sigma_b2", "sigma_w2", "sum_ng2")

    def __init__(
        self,
        mean: float,
        sigma_w2: float,
        sigma_b2: float,
        n: int,
        n_groups: int,
        sum_ng2: float,
    ):
        self.mean = float(mean)
        self.sigma_w2 = float(sigma_w2)
        self.sigma_b2 = float(sigma_b2)
        self.n = int(n)
        self.n_groups = int(n_groups)
        self.sum_ng2 = float(sum_ng2)

    def var_of_mean(self) -> float:
        """Variance of this sample's position-weighted mean under the fitted model."""
        return mean_variance_under(self.sigma_w2, self.sigma_b2, self.n, self.sum_ng2)

    def to_dict(self) -> dict[str, float]:
        """The fitted numbers by name (JSON-able; inverse: :meth:`from_dict`)."""
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_dict(cls, d: Mapping[str, float]) -> VarianceComponents:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError: naming the missing field.
        """
        return cls(
            mean=d["mean"],
            sigma_w2=d["sigma_w2"],
            sigma_b2=d["sigma_b2"],
            n=int(d["n"]),
            n_groups=int(d["n_groups"]),
            sum_ng2=d["sum_ng2"],
        )


def mean_variance_under(
    sigma_w2: float, sigma_b2: float, n: int, sum_ng2: float
) -> float:
    """Var of the position-weighted mean of n positions in groups with sum of squared sizes sum_ng2.

    Var(ȳ) = (sigma_b2 * Σ n_g² + sigma_w2 * n) / n².
    """
    if n <= 0:
        return float("nan")
    return float((sigma_b2 * sum_ng2 + sigma_w2 * n) / (n * n))


def variance_components(y: np.ndarray, groups: np.ndarray) -> VarianceComponents:
    """Fit :class:`VarianceComponents` to y [n] float grouped by groups [n] (any hashable labels).

    Raises:
        ValueError: if y and groups differ in length or y is empty.
    """
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    groups = np.asarray(groups).reshape(-1)
    if y.size != groups.size:
        raise ValueError(
            f"y ({y.size}) and groups ({groups.size}) must have the same length"
        )
    if y.size == 0:
        raise ValueError("variance_components needs at least one value")
    _, inv = np.unique(groups, return_inverse=True)
    ng = np.bincount(inv).astype(np.float64)
    sums = np.bincount(inv, weights=y)
    gmeans = sums / ng
    n = y.size
    g = ng.size
    mean = y.mean()
    ssw = float(((y - gmeans[inv]) ** 2).sum())
    ssb = float((ng * (gmeans - mean) ** 2).sum())
    msw = ssw / (n - g) if n > g else float(np.var(y, ddof=1) if n > 1 else 0.0)
    if g > 1:
        msb = ssb / (g - 1)
        n0 = (n - (ng**2).sum() / n) / (g - 1)
        sb2 = max(0.0, (msb - msw) / n0) if n0 > 0 else 0.0
    else:
        sb2 = 0.0
    return VarianceComponents(mean, msw, sb2, n, g, float((ng**2).sum()))


def bucketed_kl(
    ref_lp: np.ndarray,
    prov_lp: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """KL(reference || provider) on the provider's listed support plus one tail bucket.

    The vocabulary is partitioned into the tokens the provider listed (and whose reference
    log-probability is known) and one "everything else" bucket; both distributions are mapped
    onto that partition, so the result is a proper KL between coarse-grained distributions and,
    by the data-processing inequality, a lower bound on the full-vocabulary KL(p_ref || p_prov).
    Listed tokens with an unknown reference log-probability (NaN) are merged into the tail on
    both sides. Empty provider buckets get ``KL_PROB_FLOOR`` (then renormalised).

    Args:
        ref_lp: [N, M] float reference log-probabilities (nats) at the provider's listed token ids;
            NaN where unknown (e.g. outside the reference top-K without a full row).
        prov_lp: [N, M] float provider-reported log-probabilities, -inf for padding.

    Returns:
        (kl [N] float64 nats, mean_abs_dlogprob [N] float64 nats — mean |Δlogprob| over listed
        tokens with both values known (NaN if none), n_known [N] int64).
    """
    ref_lp = np.asarray(ref_lp, dtype=np.float64)
    prov_lp = np.asarray(prov_lp, dtype=np.float64)
    if ref_lp.shape != prov_lp.shape or ref_lp.ndim != 2:
        raise ValueError(
            f"ref_lp {ref_lp.shape} and prov_lp {prov_lp.shape} must both be [N, M]"
        )
    known = np.isfinite(prov_lp) & ~np.isnan(ref_lp)
    r = np.where(known, np.exp(np.where(known, ref_lp, -np.inf)), 0.0)
    q = np.where(known, np.exp(np.where(known, prov_lp, -np.inf)), 0.0)
    r_tail = np.clip(1.0 - r.sum(1), 0.0, 1.0)
    q_tail = np.clip(1.0 - q.sum(1), 0.0, 1.0)
    R = np.concatenate([r, r_tail[:, None]], axis=1)
    Q = np.concatenate([q, q_tail[:, None]], axis=1)
    R = R / np.maximum(R.sum(1, keepdims=True), 1e-300)
    Q = np.maximum(Q, KL_PROB_FLOOR)
    Q = Q / Q.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(R > 0, R * (np.log(np.where(R > 0, R, 1.0)) - np.log(Q)), 0.0)
    kl = np.maximum(terms.sum(1), 0.0)
    n_known = known.sum(1)
    dl = np.where(known, np.abs(np.where(known, prov_lp - ref_lp, 0.0)), 0.0).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mad = np.where(n_known > 0, dl / np.maximum(n_known, 1), np.nan)
    return kl, mad, n_known.astype(np.int64)


def pit_bounds(top_probs: np.ndarray, token_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The interval [F(x−), F(x−) + p(x)] that the randomized PIT of each emitted token fills.

    Tokens are ordered by p descending; a token outside the listed top-K gets the unlisted tail
    [S_K, 1] (S_K = listed mass), see :func:`randomized_pit`.

    Args:
        top_probs: [N, K] float probabilities of the top-K tokens, sorted descending (0 padding).
        token_rank: [N] int rank of the emitted token in that list, -1 when not listed.

    Returns:
        (low [N] float64, width [N] float64): U = low + V · width with V ~ Uniform(0, 1).
    """
    top_probs = np.asarray(top_probs, dtype=np.float64)
    token_rank = np.asarray(token_rank).astype(np.int64).reshape(-1)
    n, k = top_probs.shape
    cum = np.concatenate(
        [np.zeros((n, 1)), np.cumsum(top_probs, axis=1)], axis=1
    )  # [N, K+1]
    s_k = np.minimum(cum[:, -1], 1.0)
    listed = token_rank >= 0
    r = np.clip(token_rank, 0, max(k - 1, 0))
    rows = np.arange(n)
    f_below = cum[rows, r]
    px = top_probs[rows, r] if k > 0 else np.zeros(n)
    return np.where(listed, f_below, s_k), np.where(listed, px, 1.0 - s_k)


def randomized_pit(
    top_probs: np.ndarray,
    token_rank: np.ndarray,
    rng: RngLike = None,
) -> np.ndarray:
    """Randomized probability integral transform of emitted tokens, tokens ordered by p descending.

    U = F(x-) + V p(x), V ~ U(0,1), where F(x-) is the total probability of the tokens ranked
    above x. Small U = one of the most probable tokens was emitted. Only the top-K list is needed:
    when x is outside the list, U = S_K + V (1 - S_K) with S_K the listed mass — given that the
    token fell in the unlisted tail, the exact U is uniform on [S_K, 1], so this substitute keeps
    U exactly Uniform(0, 1) under H0 (it only loses resolution inside the tail). Under H0 the
    U's of a sequentially sampled continuation are i.i.d. Uniform(0, 1) (Rosenblatt 1952;
    Diebold, Gunther & Tay 1998; Czado, Gneiting & Held 2009 for the randomized discrete PIT).

    Args:
        top_probs: [N, K] float probabilities of the top-K tokens, sorted descending (0 padding).
        token_rank: [N] int rank of the emitted token in that list, -1 when not listed.
        rng: generator or seed for V.

    Returns:
        [N] float64 U values in [0, 1].
    """
    low, width = pit_bounds(top_probs, token_rank)
    v = as_rng(rng).random(low.size)
    u: np.ndarray = np.clip(low + v * width, 0.0, 1.0)
    return u


def cramervonmises_uniform_statistics(u: np.ndarray) -> np.ndarray:
    """Cramér–von Mises W² of each row of ``u`` against Uniform(0, 1), vectorised over rows.

    W² = 1/(12 n) + Σ_i ((2i − 1)/(2n) − u_(i))², the statistic ``scipy.stats.cramervonmises(row,
    "uniform")`` computes (Anderson 1962; its p-value is a decreasing function of W² for a given n).

    Args:
        u: [R, n] float values in [0, 1] (n >= 1).

    Returns:
        [R] float64 W² statistics.
    """
    us = np.sort(np.asarray(u, dtype=np.float64), axis=1)
    n = us.shape[1]
    grid = (2.0 * np.arange(1, n + 1) - 1.0) / (2.0 * n)
    w2: np.ndarray = 1.0 / (12.0 * n) + ((grid - us) ** 2).sum(axis=1)
    return w2


def cauchy_combination(p_values: np.ndarray | list[float], weights: np.ndarray | list[float] | None = None) -> tuple[float, float]:
    """Cauchy combination test (Liu & Xie 2020, JASA 115:393, "Cauchy combination test: a powerful
    test with analytic p-value calculation under arbitrary dependency structures").

    T = Σ w_i tan((0.5 − p_i) π) with Σ w_i = 1; p = 0.5 − arctan(T) / π. Under H0 with each p_i
    Uniform(0, 1), the tail of T is standard Cauchy whatever the dependence among the p_i
    (exactly for independent p_i, asymptotically in the tail — small α — for dependent ones).

    Args:
        p_values: [m] p-values in [0, 1] (m >= 1); 0 and 1 are clipped to [1e-300, 1 − 1e-16].
        weights: [m] non-negative weights (None = equal); normalised to sum 1.

    Returns:
        (statistic T, combined p-value in [0, 1]).

    Raises:
        ValueError: empty input, p-values outside [0, 1], or weights of another length / all zero.
    """
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    if p.size == 0 or np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p_values must be a non-empty array of numbers in [0, 1], got {p.tolist()}")
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != p.shape or np.any(w < 0) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be {p.size} non-negative numbers, not all zero (got {w.tolist()})")
    w = w / w.sum()
    p = np.clip(p, 1e-300, 1.0 - 1e-16)
    # for tiny p, tan((0.5 − p)π) = 1/tan(pπ) ≈ 1/(pπ) keeps precision
    t_i = np.where(p < 1e-15, 1.0 / (p * np.pi), np.tan((0.5 - p) * np.pi))
    t = float((w * t_i).sum())
    pc = float(stats.cauchy.sf(t))
    return t, min(1.0, max(0.0, pc))


def poisson_binomial_mid_p(p: np.ndarray, observed: int, alternative: str) -> float:
    """Lancaster's mid-p of a Poisson-binomial count: P(S' > s) + ½ P(S' = s) ("greater"), or
    P(S' < s) + ½ P(S' = s) ("less"). Mean ½ and variance slightly under 1/12 under H0 — less
    conservative than the exact tail, not exactly uniform (Lancaster 1961; Agresti 2002 §1.4.5).

    Args:
        p: [n] per-trial success probabilities under H0; observed: the count S; alternative:
            "greater" | "less".

    Raises:
        ValueError: unknown alternative.
    """
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    pmf = poisson_binomial_pmf(np.clip(np.asarray(p, dtype=np.float64).reshape(-1), 0.0, 1.0))
    s = int(observed)
    at = float(pmf[s]) if 0 <= s < pmf.size else 0.0
    above = float(pmf[s + 1:].sum()) if s >= 0 else 1.0
    below = float(pmf[:max(s, 0)].sum()) if s <= pmf.size else 1.0
    return min(1.0, (above if alternative == "greater" else below) + 0.5 * at)
