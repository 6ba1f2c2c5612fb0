"""Logprob-divergence detector: the provider's reported top_logprobs vs the reference.

Per position (where the provider returned trusted top_logprobs and the reference is known at the
same prefix): KL(p_ref || p_prov) on the provider's listed support plus one tail bucket
(``stats.bucketed_kl``: a coarse-graining, so a lower bound on the full KL, with the unlisted
tail mass bounded by construction), and the mean |Δlogprob| of the listed tokens.

Test: the per-position statistic y = log(KL + eps) is compared with the noise floor's null
distribution — the same statistic measured between the reference and honest variants
(``NoiseFloor.kl[M]``). Positions within a prompt are dependent, so the null variance of the
audit's mean ȳ comes from the floor's variance components (between-prompt sigma_b² and
within-prompt sigma_w²) at the audit's own prompt sizes:
    Var0(ȳ) = (sigma_b² Σ n_g² + sigma_w² n) / n²  (+ the floor mean's own sampling variance),
    z = (ȳ − μ_floor) / sqrt(Var0), p = 1 − Φ(z)   (one-sided: more divergent than honest).
The log scale makes the per-position statistic nearly symmetric (KL is heavy-tailed), so the
normal approximation holds at small budgets, and a multiplicative change of KL is a shift of y.
Effect: mean KL (nats) with a prompt-level bootstrap 95% CI; details carry the ratio to the
floor's mean KL, the geometric-mean ratio exp(ȳ − μ), the top-1 agreement (provider top-1 ==
reference argmax), mean |Δlogprob| and the width M used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from .base import MIN_POSITIONS, DetectorName, DetectorResult, EvidenceBatch, not_run
from .noise_floor import NoiseFloor
from .stats import RngLike, as_rng, bucketed_kl, mean_variance_under

__all__ = [
    "LOGPROB_TEMPERATURES",
    "bootstrap_mean_ci",
    "logprob_divergence",
    "logprob_positions",
]

#: Requested temperatures at which reported logprobs are compared with raw reference logprobs.
#: (Engines differ on raw vs temperature-processed logprobs; at T in {0, 1} both agree.)
LOGPROB_TEMPERATURES = (0.0, 1.0)


def logprob_positions(
    batch: EvidenceBatch, temperatures: Sequence[float] = LOGPROB_TEMPERATURES
) -> np.ndarray:
    """[N] bool: positions usable for logprob comparison (reference, trusted list, T allowed)."""
    if not batch.has_reference:
        return np.zeros(len(batch), bool)
    t_ok = np.zeros(len(batch), bool)
    for t in temperatures:
        t_ok |= np.abs(batch.temperatures - t) <= 1e-6
    ok = (
        t_ok
        & batch.provider_trusted
        & (batch.provider_listed >= 1)
        & (batch.reference().top_ids[:, 0] >= 0)
    )
    return np.asarray(ok, dtype=bool)


def bootstrap_mean_ci(
    values: np.ndarray,
    groups: np.ndarray,
    n_boot: int = 1000,
    rng: RngLike = 0,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the position-weighted mean, resampling prompts (clusters).

    Falls back to resampling positions when there are fewer than 3 prompts.

    Args:
        values: [n] float per-position values; groups: [n] prompt labels.

    Returns:
        (low, high).
    """
    rng = as_rng(rng)
    values = np.asarray(values, np.float64)
    _, inv = np.unique(groups, return_inverse=True)
    g = inv.max() + 1 if inv.size else 0
    a = (1 - confidence) / 2
    if g >= 3:
        sums = np.bincount(inv, weights=values)
        cnt = np.bincount(inv).astype(np.float64)
        w = rng.multinomial(g, np.full(g, 1.0 / g), size=n_boot).astype(
            np.float64
        )  # [B, G]
        means = (w @ sums) / np.maximum(w @ cnt, 1e-12)
    else:
        n = values.size
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)
        means = (w @ values) / n
    return (float(np.quantile(means, a)), float(np.quantile(means, 1 - a)))


def logprob_divergence(
    batch: EvidenceBatch,
    floor: NoiseFloor | None,
    *,
    temperatures: Sequence[float] = LOGPROB_TEMPERATURES,
    n_evidence: int = 10,
    n_boot: int = 1000,
    rng: RngLike = 0,
    name: str = DetectorName.LOGPROB_DIVERGENCE,
) -> DetectorResult:
    """Logprob-divergence detector (needs a reference and a noise floor).

    Args:
        batch: evidence; uses positions selected by :func:`logprob_positions`.
        floor: the model's noise floor; its width M is the largest computed width not above the
            median number of alternatives the provider listed. Positions listing fewer than M are
            dropped, the others truncated to their top M.
        temperatures: requested temperatures whose logprobs are comparable with raw reference ones.
        n_evidence: positions to list (largest KL first).
        n_boot: bootstrap resamples for the effect CI.
        rng: seed/generator for the bootstrap.

    Returns:
        DetectorResult: statistic = z, p_value = 1 − Φ(z), effect = mean KL (nats, bucketed),
        effect_ci = prompt-bootstrap 95% CI, details = {ratio_to_floor, geometric_ratio,
        top1_agreement, mean_abs_dlogprob, m, floor_mean_kl, n_prompts}.
    """
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    mask = logprob_positions(batch, temperatures)
    n_all = int(mask.sum())
    if n_all < MIN_POSITIONS:
        return not_run(
            name,
            f"too few positions with provider top_logprobs ({n_all} < {MIN_POSITIONS})",
            n=n_all,
        )
    if floor is None:
        return not_run(
            name,
            "no noise floor computed for this model; run the calibration first",
            n=n_all,
        )
    listed = batch.provider_listed[mask]
    m = floor.choose_m(int(np.median(listed)))
    if m is None:
        return not_run(
            name,
            f"noise floor has no width <= {int(np.median(listed))} alternatives",
            n=n_all,
        )
    mask &= batch.provider_listed >= m
    idx = np.flatnonzero(mask)
    n = idx.size
    if n < MIN_POSITIONS:
        return not_run(
            name,
            f"too few positions listing >= {m} alternatives ({n} < {MIN_POSITIONS})",
            n=n,
        )
    fl = floor.kl_floor(m)
    prov_lp = batch.provider_top_logprobs[idx, :m]
    ref = batch.reference()
    ref_lp = ref.at_provider_top[idx, :m]
    kl, mad, _ = bucketed_kl(ref_lp, prov_lp)
    y = np.log(kl + floor.eps)
    groups = batch.prompt_ids[idx]
    _, inv = np.unique(groups, return_inverse=True)
    ng = np.bincount(inv).astype(np.float64)
    vc = fl.components
    var0 = mean_variance_under(vc.sigma_w2, vc.sigma_b2, n, float((ng**2).sum()))
    var_floor = vc.var_of_mean()
    se = float(np.sqrt(var0 + var_floor))
    ybar = float(y.mean())
    z = (ybar - vc.mean) / se if se > 0 else (np.inf if ybar > vc.mean else 0.0)
    p = float(stats.norm.sf(z))
    mean_kl = float(kl.mean())
    ci = bootstrap_mean_ci(kl, groups, n_boot=n_boot, rng=rng)
    top1 = batch.provider_top_ids[idx, 0] == ref.top_ids[idx, 0]
    order = np.argsort(-kl, kind="stable")[:n_evidence]
    evidence = [
        batch.evidence_row(
            int(idx[j]), kl=float(kl[j]), margin=_margin(batch, int(idx[j]))
        )
        for j in order
    ]
    ratio = mean_kl / fl.mean_kl if fl.mean_kl > 0 else float("inf")
    return DetectorResult(
        name=name,
        statistic=float(z),
        p_value=p,
        effect=mean_kl,
        effect_ci=ci,
        n=int(n),
        evidence=evidence,
        details={
            "ratio_to_floor": float(ratio),
            "ratio_ci": [ci[0] / fl.mean_kl, ci[1] / fl.mean_kl]
            if fl.mean_kl > 0
            else [None, None],
            "geometric_ratio": float(np.exp(ybar - vc.mean)),
            "top1_agreement": float(top1.mean()),
            "mean_abs_dlogprob": float(np.nanmean(mad))
            if np.any(~np.isnan(mad))
            else None,
            "m": int(m),
            "floor_mean_kl": fl.mean_kl,
            "floor_variant": fl.variant,
            "mean_log_kl": ybar,
            "floor_mean_log_kl": vc.mean,
            "n_prompts": int(ng.size),
            "n_dropped_short_lists": int(n_all - n),
        },
    )


def _margin(batch: EvidenceBatch, i: int) -> float:
    lp = batch.reference().top_logprobs[i]
    return float(lp[0] - lp[1]) if lp.size > 1 and np.isfinite(lp[1]) else float("inf")
