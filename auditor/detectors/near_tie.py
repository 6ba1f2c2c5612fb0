"""Greedy near-tie detector (temperature 0): runner-up picks at near-ties beyond honest numeric noise.

``greedy-match`` ignores every mismatch inside the noise floor's ``margin_band`` (nats) as numeric
noise. A speculative-decoding implementation whose greedy verification accepts a non-argmax draft
when the target's top-1/top-2 log-probability margin is small (the simulator's ``greedy-relaxed``
profile: the runner-up accepted when log p1 − log p2 <= 0.5 nats; public reports of speculation
changing greedy output show the same behaviour) changes *only* such near-ties, so it is invisible
to that test. This test asks whether the provider flips near-ties more often than honest numeric
noise can at each position's margin.

Method. Positions: those of ``greedy-match`` (:func:`auditor.detectors.greedy.greedy_gaps`: T = 0,
aligned token, reference row). At each, the reference's margin m = log p1 − log p2 (nats; rows
without a finite second value are skipped) and whether the provider made a *near-tie flip*: a
mismatch with the reference argmax whose gap (as ``greedy_gaps`` computes it) is <= the band.

Honest bound S(m) >= P_honest(flip at margin m), from the floor:

- **gain survival** (floors with ``NoiseFloor.margin_gain_survival``, noise method 3): an honest
  variant emits a competitor j instead of the reference top-1 only if j's log-prob gain over the
  top-1 under the variant exceeds j's reference gap, itself >= m; the floor measured the largest such
  gain D per position (every competitor inside the band) and stores (#{D > g} + 1) / (N + 1) on a
  grid g of GAIN_GRID_STEP nats. S(m) = that value at the largest grid point <= m (the survival is
  non-increasing, so this lies above P(D > m)). One-sided and competitor-complete, it is tighter
  than the quantile bound (about half of |Δ| exceedances are gains, and it is not a step at four
  levels) and never 0 (1 / (N + 1) beyond the largest gain measured).
- **quantile step** (older floors): quantiles of |Δ| (levels 0.5, 0.9, 0.99, 0.999, the maximum
  over honest variants: ``NoiseFloor.margin_delta_quantiles``); S(m) = 1 below q_0.5, 0.5 on
  [q_0.5, q_0.9), 0.1 on [q_0.9, q_0.99), 0.01 on [q_0.99, q_0.999) and MIN_HONEST_FLIP_BOUND at or
  above q_0.999.

Tested positions: m <= band (above it ``greedy-match`` is the test) and S(m) <= MAX_TESTED_BOUND
(below that margin a flip carries almost no information). Statistic (``method`` "weighted", the
default): the Neyman–Pearson log-likelihood ratio of "each tested position flips at the alternative's
rate r = NEAR_TIE_ALT_RATE" against "at its honest bound S_i", T = Σ_flipped w_i with
w_i = log(r (1 − S_i) / (S_i (1 − r))) rounded to a lattice of WEIGHT_STEP nats: a flip where honest
noise almost never flips (S ≈ 1/(N + 1)) weighs ~6 nats, one at a small margin (S ≈ 0.05) ~2.
p-value = P(T' >= T) for T' = Σ X_i w_i with independent X_i ~ Bernoulli(S_i), computed exactly on the
lattice (:func:`weighted_flip_sf`). The unweighted count, p = P(X >= k | X ~ Poisson(μ = Σ S_i)),
is kept as ``details["p_count"]`` (``method`` "count" uses it: the test before issue 14's last round).

Why conservative: each S(m_i) bounds the honest flip probability from above, the floor keeps the
most lenient variant, and T' grows with every X_i (positive weights), so its upper tail at the bounds
lies above the tail at the true flip probabilities (weights are fixed by the reference's margins, not
by the flips). For the count, a Poisson with mean μ is more dispersed than the Poisson-binomial.
Effect: the near-tie flip rate k / n (Wilson 95% CI); power model: ``auditor.verdict.power``
(exact Poisson count test at the audit's mean bound μ / n against a flip rate r1 per tested position:
the weighted test's power at that alternative is at least the count test's — it is the most powerful
test of it — so the model, and a PASS's "rules out greedy-relaxed", err on the low side).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from .base import DetectorName, DetectorResult, EvidenceBatch, not_run
from .greedy import greedy_gaps
from .noise_floor import _QUANTILES, GAIN_GRID_STEP, NoiseFloor, gain_grid_key
from .stats import RngLike, binom_pmf, binom_sf, wilson_ci

__all__ = [
    "MAX_TESTED_BOUND",
    "MIN_HONEST_FLIP_BOUND",
    "MIN_NEAR_TIE_POSITIONS",
    "NEAR_TIE_ALT_RATE",
    "NEAR_TIE_METHOD",
    "QUANTILE_LEVELS",
    "WEIGHT_STEP",
    "gain_flip_bound",
    "greedy_near_tie",
    "honest_flip_bound",
    "np_weights",
    "weighted_flip_sf",
]

#: The |Δ margin| quantile levels the floor stores (``noise_floor._QUANTILES``), as its dict keys.
QUANTILE_LEVELS = tuple(str(q) for q in _QUANTILES)
#: Quantile-step bound at or above the 0.999 quantile: a floor, not 1e-3 — that quantile of the floor's
#: few hundred positions (423 for SmolLM2) is its largest value or so, so the tail beyond it is not known
#: to be thinner; twice the nominal level leaves room for that. (The gain-survival bound needs no such
#: floor: it is never below 1 / (N + 1).)
MIN_HONEST_FLIP_BOUND = 2e-3
#: Positions whose honest bound S(m) exceeds this are not tested (the quantile step bound's q_0.9 cut).
MAX_TESTED_BOUND = 0.1
#: Fewer tested positions than this → not run.
MIN_NEAR_TIE_POSITIONS = 5

#: The alternative's flip rate per tested near-tie behind the Neyman–Pearson weights (a greedy verifier that
#: accepts the runner-up at near-ties; greedy-relaxed flips ~0.26 of them on SmolLM2, docs/calibration.md).
#: Any fixed r gives a valid test; r only sets the relative weights of positions with different bounds.
NEAR_TIE_ALT_RATE = 0.25
#: Lattice step of the weights (nats): the null law of T is then an exact discrete convolution.
WEIGHT_STEP = 0.05
#: The test statistic: "weighted" (Neyman–Pearson weights) or "count" (Poisson count, the earlier test).
NEAR_TIE_METHOD = "weighted"

# details["bins"]: tested positions grouped by their bound, (upper, lower] pairs
_BOUND_BINS = ((MAX_TESTED_BOUND, 0.03), (0.03, 0.01), (0.01, 0.0))
# S(m) on [q_level, next quantile): the exceedance probability of the quantile's level
_STEP = {"0.5": 0.5, "0.9": 0.1, "0.99": 0.01, "0.999": MIN_HONEST_FLIP_BOUND}


def honest_flip_bound(margin: np.ndarray, quantiles: dict[str, float]) -> np.ndarray:
    """The conservative step bound S(m) >= P_honest(|Δ| > m) for margins m [n] (nats).

    Args:
        margin: reference top-1/top-2 margins (nats).
        quantiles: |Δ margin| quantiles by level (every key of QUANTILE_LEVELS).

    Returns:
        [n] float64: 1 below q_0.5, then 0.5, 0.1, 0.01 and MIN_HONEST_FLIP_BOUND from q_0.999 on.
    """
    s = np.ones(margin.shape, dtype=np.float64)
    for level in QUANTILE_LEVELS:
        s = np.where(margin >= float(quantiles[level]), _STEP[level], s)
    return s


def gain_flip_bound(margin: np.ndarray, survival: dict[str, float]) -> np.ndarray:
    """The gain-survival bound S(m) >= P_honest(flip at margin m) for margins m [n] (nats).

    Args:
        margin: reference top-1/top-2 margins (nats), >= 0.
        survival: ``NoiseFloor.margin_gain_survival`` (grid key → conservative P(D > g)).

    Returns:
        [n] float64: the survival at the largest grid point <= m; 1 below the grid, the last grid
        value beyond it (the grid reaches the band, and only margins <= band are tested).
    """
    grid = np.array(sorted(float(k) for k in survival))
    vals = np.array([float(survival[gain_grid_key(g)]) for g in grid])
    j = np.searchsorted(grid, np.asarray(margin, np.float64), side="right") - 1
    return np.where(j >= 0, vals[np.clip(j, 0, grid.size - 1)], 1.0)


def np_weights(bound: np.ndarray, rate: float = NEAR_TIE_ALT_RATE) -> np.ndarray:
    """Lattice weights [n] int64 (units of WEIGHT_STEP nats) of flips at positions with honest bounds ``bound``
    [n] (each in (0, rate)): round(log(r (1 − S) / (S (1 − r))) / WEIGHT_STEP), at least 1."""
    s = np.clip(np.asarray(bound, np.float64), 1e-12, rate)
    w = np.log(rate * (1.0 - s) / (s * (1.0 - rate)))
    return np.maximum(np.rint(w / WEIGHT_STEP), 1).astype(np.int64)


def weighted_flip_sf(units: np.ndarray, probs: np.ndarray, observed: int) -> float:
    """P(Σ X_i u_i >= observed) for independent X_i ~ Bernoulli(probs_i) (exact, on the integer lattice).

    Positions are grouped by (u, p); each group's count is Binomial, and the convolution runs on
    [0, observed] with the last cell holding every total >= observed, so tiny tail probabilities keep their
    precision.

    Args:
        units: [n] int64 positive lattice weights; probs: [n] float64 in [0, 1]; observed: the statistic (>= 0).

    Returns:
        The upper-tail probability in [0, 1] (1 when observed <= 0).
    """
    obs = int(observed)
    if obs <= 0:
        return 1.0
    pmf = np.zeros(obs + 1)
    pmf[0] = 1.0
    pairs, counts = np.unique(np.column_stack([np.asarray(units, np.float64), np.asarray(probs, np.float64)]),
                              axis=0, return_counts=True)
    for (u, p), c in zip(pairs, counts, strict=True):
        u, kmax = int(u), min(int(c), obs // max(int(u), 1) + 1)
        bk = binom_pmf(np.arange(kmax + 1), int(c), float(p))
        bk[-1] += float(binom_sf(kmax, int(c), float(p)))  # more flips than needed: still >= observed
        new = np.zeros_like(pmf)
        for j in range(kmax + 1):
            shift = j * u
            if shift >= obs:
                new[obs] += bk[j] * pmf.sum()
            else:
                new[shift:obs] += bk[j] * pmf[:obs - shift]
                new[obs] += bk[j] * pmf[obs - shift:].sum()
        pmf = new
    return float(min(1.0, max(0.0, pmf[obs])))


def greedy_near_tie(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    n_evidence: int = 10,
    rng: RngLike = 0,
    name: str = DetectorName.GREEDY_NEAR_TIE,
) -> DetectorResult:
    """Near-tie flips at T = 0 against the honest bound (see the module docstring; needs a reference
    and a floor with ``margin_gain_survival`` or, for older floors, ``margin_delta_quantiles``).

    Args:
        batch: evidence; uses the greedy positions of ``greedy-match``.
        floor: noise floor (band, gain survival or |Δ margin| quantiles; nats).
        n_evidence: how many flipped positions to list (smallest bound first).
        rng: unused (the test is deterministic); accepted for the registry's call signature.

    Returns:
        DetectorResult: statistic = k near-tie flips, p_value = the weighted test's P(T' >= T) (``method`` count:
        the Poisson upper tail P(X >= k | μ)),
        effect = k / n (near-tie flip rate at the tested positions, Wilson CI), n = tested positions,
        details = {k, expected (μ), mean_bound (μ / n, the power model's null rate), n_positions,
        bins [{bound_lo, bound_hi, lo, hi (margins, nats), positions, flips, expected}], band, quantiles,
        method (``gain-survival`` | ``quantile-step``), min_tested_margin, grid_step, n_greedy, n_prompts,
        test, weighted_statistic (nats), p_weighted, p_count, alt_rate, flips_with_provider_list (flips where the
        provider listed trusted top_logprobs), flips_own_top1 (of those, where the emitted token is its own
        reported top-1: the verdict's rule 3n names a model difference, not lossy verification, when they are
        the majority)}.
    """
    del rng
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    if floor is None:
        return not_run(name, "no noise floor: the honest near-tie flip rate is unknown")
    q = {k: float(v) for k, v in (floor.margin_delta_quantiles or {}).items()}
    survival = dict(floor.margin_gain_survival or {})
    method = "gain-survival" if survival else "quantile-step"
    if not survival:
        missing = [lv for lv in QUANTILE_LEVELS if lv not in q or not np.isfinite(q[lv])]
        if missing:
            return not_run(name, f"the noise floor has no margin_gain_survival and no margin_delta_quantiles at "
                           f"levels {missing}")
    band = float(floor.margin_band)
    idx, mismatch, gap = greedy_gaps(batch)
    top = batch.reference().top_logprobs[idx]
    margin = top[:, 0] - top[:, 1] if top.shape[1] >= 2 else np.full(idx.size, np.nan)
    finite = np.isfinite(margin)
    bound = np.ones(margin.shape)
    bound[finite] = (gain_flip_bound(margin[finite], survival) if survival
                     else honest_flip_bound(margin[finite], q))
    tested = finite & (bound <= MAX_TESTED_BOUND) & (margin <= band)
    n = int(tested.sum())
    lo = float(margin[tested].min()) if n else float("nan")
    if n < MIN_NEAR_TIE_POSITIONS:
        return not_run(name, f"too few near-tie positions ({n} < {MIN_NEAR_TIE_POSITIONS} greedy positions with "
                       f"a reference margin <= the band {band:.3g} nats and an honest flip bound <= "
                       f"{MAX_TESTED_BOUND})", n=n, band=band, quantiles=q, method=method)
    m = margin[tested]
    flip = (mismatch & (gap <= band))[tested]
    s = bound[tested]
    k, mu = int(flip.sum()), float(s.sum())
    p_count = float(stats.poisson.sf(k - 1, mu)) if k > 0 else 1.0
    units = np_weights(s)
    t_obs = int(units[flip].sum())
    p_w = weighted_flip_sf(units, s, t_obs) if k > 0 else 1.0
    p = p_w if NEAR_TIE_METHOD == "weighted" else p_count
    bins = []
    for b_hi, b_lo in _BOUND_BINS:
        sel = (s <= b_hi) & (s > b_lo)
        bins.append({"bound_lo": b_lo, "bound_hi": b_hi, "lo": float(m[sel].min()) if sel.any() else None,
                     "hi": float(m[sel].max()) if sel.any() else None, "positions": int(sel.sum()),
                     "flips": int(flip[sel].sum()), "expected": float(s[sel].sum())})
    rows = idx[tested]
    # at each flip: does the provider's own reported top-1 agree with the emitted token? (a model whose logits
    # differ flips its own argmax; a lossy greedy verifier emits a token its own list ranks below the top-1)
    fr = rows[flip]
    listed = (batch.provider_top_ids.shape[1] > 0) & batch.provider_trusted[fr] & (batch.provider_listed[fr] >= 1)
    own = listed & (batch.provider_top_ids[fr, 0] == batch.token_ids[fr]) if batch.provider_top_ids.shape[1] else listed
    by_span = span_counts(batch.token_spans, rows, flip, s)
    evidence = [batch.evidence_row(int(rows[j]), margin=float(m[j]), gap=float(gap[tested][j]),
                                   honest_bound=float(s[j]))
                for j in np.flatnonzero(flip)[np.argsort(s[flip], kind="stable")][:n_evidence]]
    return DetectorResult(
        name=name,
        statistic=float(k),
        p_value=min(1.0, p),
        effect=k / n,
        effect_ci=wilson_ci(k, n),
        n=n,
        evidence=evidence,
        details={"k": k, "expected": mu, "mean_bound": mu / n, "n_positions": n, "bins": bins, "band": band,
                 "test": NEAR_TIE_METHOD, "weighted_statistic": t_obs * WEIGHT_STEP, "p_weighted": p_w,
                 "p_count": p_count, "alt_rate": NEAR_TIE_ALT_RATE,
                 "flips_with_provider_list": int(listed.sum()), "flips_own_top1": int(own.sum()),
                 "quantiles": q, "method": method, "min_tested_margin": lo, "grid_step": GAIN_GRID_STEP,
                 "n_greedy": int(idx.size), "n_prompts": int(np.unique(batch.prompt_ids[rows]).size),
                 **({"spans": by_span} if by_span else {})},
    )


def span_counts(token_spans: np.ndarray | None, rows: np.ndarray, flip: np.ndarray,
                bound: np.ndarray) -> dict[str, dict[str, float]]:
    """Near-tie figures per span of a reasoning model's answer (issue 35): for each span label
    (``reasoning`` / ``answer``) the tested ``positions``, their ``flips`` and the honest
    ``expected`` flips (sum of the bounds). {} when the batch carries no spans.

    Args:
        token_spans: [N] object labels of the batch (``EvidenceBatch.token_spans``) or None.
        rows: [n] int batch rows tested; flip: [n] bool flipped; bound: [n] float honest flip bounds.
    """
    if token_spans is None:
        return {}
    labels = token_spans[rows]
    out: dict[str, dict[str, float]] = {}
    for lab in ("reasoning", "answer"):
        sel = labels == lab
        if sel.any():
            out[lab] = {"positions": int(sel.sum()), "flips": int(flip[sel].sum()), "expected": float(bound[sel].sum())}
    return out
