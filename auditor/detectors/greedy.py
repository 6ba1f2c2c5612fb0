"""Greedy-match detector (temperature 0): the provider's token vs the reference argmax.

With teacher forcing at the provider's own prefixes every greedy position is a trial, not only
the positions before the first divergence. A mismatch is classified by its *gap*
g = log p_ref(argmax) − log p_ref(provider token) (nats; equal to the top-1 margin
logp1 − logp2 when the provider emitted the runner-up):
- g <= band (the noise floor's numeric-noise band): a near-tie, expected from honest GPUs
  (reduction order, bf16) — counted, reported, not evidence;
- g > band: a clear mismatch — evidence that the served model differs.
Test: one-sided exact binomial test (scipy.stats.binomtest) of the clear-mismatch count against
the honest clear-mismatch rate r0 = max(floor.clear_mismatch_rate, MIN_HONEST_CLEAR_RATE).
Effect: clear-mismatch rate with a Wilson 95% CI. References: DiFR (Karvonen et al. 2025) for
token matching against a trusted reference; vLLM docs on batch non-invariance for near-ties.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

from .base import MIN_POSITIONS, DetectorName, DetectorResult, EvidenceBatch, not_run
from .noise_floor import DEFAULT_MARGIN_BAND, NoiseFloor
from .stats import RngLike, as_rng

__all__ = [
    "GREEDY_TEMPERATURE_MAX",
    "MIN_HONEST_CLEAR_RATE",
    "clear_mismatch_test",
    "greedy_gaps",
    "greedy_match",
    "honest_band_and_rate",
]

#: Floor on the honest clear-mismatch rate used as the binomial null (calibrations often say ~0).
MIN_HONEST_CLEAR_RATE = 1e-3
#: Positions with a requested temperature at or below this count as greedy.
GREEDY_TEMPERATURE_MAX = 1e-6


def clear_mismatch_test(
    mismatch: np.ndarray,
    gap: np.ndarray,
    band: float,
    r0: float,
    rng: RngLike = 0,
) -> dict[str, Any]:
    """Count clear mismatches and test them against the honest rate r0.

    Args:
        mismatch: [n] bool, token differs from the argmax.
        gap: [n] float nats, log p(argmax) − log p(token) (0 where matching).
        band: near-tie band (nats).
        r0: honest clear-mismatch rate under H0, in (0, 1).
        rng: generator/seed for the randomized p-value (calibration only).

    Returns:
        dict with k (clear count), n, near (near-tie count), p_value (exact binomial, one-sided
        greater; conservative), p_randomized (exactly uniform under H0), rate, ci (Wilson 95%).
    """
    n = int(mismatch.size)
    clear = mismatch & (gap > band)
    k = int(clear.sum())
    res = stats.binomtest(k, n, r0, alternative="greater")
    ci = res.proportion_ci(confidence_level=0.95, method="wilson")
    v = float(as_rng(rng).random())
    p_rand = float(stats.binom.sf(k, n, r0) + v * stats.binom.pmf(k, n, r0))
    return {
        "k": k,
        "n": n,
        "near": int((mismatch & ~clear).sum()),
        "p_value": float(res.pvalue),
        "p_randomized": min(1.0, p_rand),
        "rate": k / n if n else float("nan"),
        "ci": (float(ci.low), float(ci.high)),
        "clear": clear,
    }


def greedy_gaps(batch: EvidenceBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's greedy positions against the reference argmax (the batch must have a reference).

    Returns:
        (idx [n] int64 positions with temperature <= GREEDY_TEMPERATURE_MAX, an aligned token and a
        reference row; mismatch [n] bool, token != reference argmax; gap [n] float64 nats,
        log p(argmax) − log p(token), 0 where matching — an unknown token logprob (outside the top-K,
        no full row) is bounded by the K-th listed value).
    """
    ref = batch.reference()
    mask = (batch.temperatures <= GREEDY_TEMPERATURE_MAX) & (batch.token_ids >= 0) & (ref.top_ids[:, 0] >= 0)
    idx = np.flatnonzero(mask)
    top_lp = ref.top_logprobs[idx]
    lp_tok = ref.token_logprobs[idx].copy()
    last = np.where(np.isfinite(top_lp), top_lp, np.inf).min(1)
    lp_tok = np.where(np.isnan(lp_tok), last, lp_tok)
    mismatch = batch.token_ids[idx] != ref.top_ids[idx, 0]
    gap = np.where(mismatch, np.maximum(top_lp[:, 0] - lp_tok, 0.0), 0.0)
    return idx, mismatch, gap


def honest_band_and_rate(floor: NoiseFloor | None) -> tuple[float, float]:
    """(near-tie band in nats, honest clear-mismatch rate r0) from the floor, or the defaults
    (DEFAULT_MARGIN_BAND, MIN_HONEST_CLEAR_RATE) without one; r0 is never below MIN_HONEST_CLEAR_RATE."""
    band = floor.margin_band if floor is not None else DEFAULT_MARGIN_BAND
    r0 = max(floor.clear_mismatch_rate if floor is not None else 0.0, MIN_HONEST_CLEAR_RATE)
    return float(band), float(r0)


def greedy_match(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    n_evidence: int = 10,
    rng: RngLike = 0,
    name: str = DetectorName.GREEDY_MATCH,
) -> DetectorResult:
    """Greedy-match detector on the batch's temperature-0 positions (needs a reference).

    Args:
        batch: evidence; uses positions with temperature <= GREEDY_TEMPERATURE_MAX, an aligned
            token and a reference row.
        floor: noise floor (band and honest rate); without one DEFAULT_MARGIN_BAND and
            MIN_HONEST_CLEAR_RATE are used (stated in ``reason``).
        n_evidence: how many strongest positions to list.
        rng: seed/generator for the randomized p-value in ``details``.

    Returns:
        DetectorResult: statistic = clear-mismatch count, p_value = exact one-sided binomial,
        effect = clear-mismatch rate (Wilson CI), details = {match_rate (top-1 agreement),
        n_mismatch, n_near_tie, band, r0, p_randomized}.
    """
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    idx, mismatch, gap = greedy_gaps(batch)
    n = int(idx.size)
    if n < MIN_POSITIONS:
        return not_run(
            name,
            f"too few greedy positions with a reference ({n} < {MIN_POSITIONS})",
            n=n,
        )
    band, r0 = honest_band_and_rate(floor)
    t = clear_mismatch_test(mismatch, gap, band, r0, rng)
    return clear_mismatch_result(batch, name, idx, mismatch, gap, t, floor, n_evidence,
                                 agreement=("match_rate", "n_mismatch"))


def clear_mismatch_result(
    batch: EvidenceBatch,
    name: str,
    idx: np.ndarray,
    mismatch: np.ndarray,
    gap: np.ndarray,
    t: dict[str, Any],
    floor: NoiseFloor | None,
    n_evidence: int,
    *,
    agreement: tuple[str, str],
    row_ints: dict[str, np.ndarray] | None = None,
    details: dict[str, Any] | None = None,
) -> DetectorResult:
    """The DetectorResult of a clear-mismatch test (``greedy-match`` against the reference argmax,
    ``self-greedy`` against the provider's own reported top-1).

    Args:
        idx: [n] int batch positions tested; mismatch: [n] bool; gap: [n] float nats (0 where matching).
        t: :func:`clear_mismatch_test`'s output on them (``clear`` [n] bool still in it).
        agreement: the details keys for the agreement rate (1 − mismatch share) and the mismatch count.
        row_ints: extra int columns ([n] arrays) written first in each evidence row.
        details: extra details, after the common ones (agreement, counts, band, r0, p_randomized, n_prompts).

    Returns: statistic = clear-mismatch count, p_value = the exact one-sided binomial, effect = the
    clear-mismatch rate (Wilson CI); evidence = the mismatching positions, clear ones first, then by gap.
    """
    band, r0 = honest_band_and_rate(floor)
    clear = t["clear"]
    order = np.lexsort((-gap, ~clear))  # clear first, then by gap descending
    evidence = []
    for j in order[:n_evidence]:
        if not mismatch[j]:
            break
        extra = {k: int(v[j]) for k, v in (row_ints or {}).items()}
        evidence.append(
            batch.evidence_row(int(idx[j]), **extra, gap=float(gap[j]), margin=float(gap[j]), clear=bool(clear[j]))
        )
    return DetectorResult(
        name=name,
        statistic=float(t["k"]),
        p_value=t["p_value"],
        effect=t["rate"],
        effect_ci=t["ci"],
        n=int(idx.size),
        evidence=evidence,
        reason=None
        if floor is not None
        else f"no noise floor: default band {DEFAULT_MARGIN_BAND} nats",
        details={
            agreement[0]: float(1.0 - mismatch.mean()),
            agreement[1]: int(mismatch.sum()),
            "n_near_tie": t["near"],
            "n_clear": t["k"],
            "band": float(band),
            "r0": float(r0),
            "p_randomized": t["p_randomized"],
            "n_prompts": int(np.unique(batch.prompt_ids[idx]).size),
            **(details or {}),
        },
    )
