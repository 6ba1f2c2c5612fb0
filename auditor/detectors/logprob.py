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
    z = (ȳ − μ_floor) / sqrt(Var0), p = 1 − Φ(z)   (one-sided: more divergent than honest),
where μ_floor is the floor's mean at the audit's own mix of positions in the continuation
(``KLFloor.null_mean``: y is higher at the first tokens of an answer) and Var0 includes that
estimate's own sampling variance.
The log scale makes the per-position statistic nearly symmetric (KL is heavy-tailed), so the
normal approximation holds at small budgets, and a multiplicative change of KL is a shift of y.
Effect: mean KL (nats) with a prompt-level bootstrap 95% CI; details carry the ratio to the
floor's mean KL, the geometric-mean ratio exp(ȳ − μ), the top-1 agreement (provider top-1 ==
reference argmax), mean |Δlogprob| and the width M used.

Cause feature (verdict rule 2, quantized copy vs different model): margin-conditioned top-1
disagreement (:func:`margin_flip_stats`). Quantization is a small, roughly isotropic perturbation ε
of the logits, so the provider's top-1 leaves the reference argmax mainly where the reference
top-1/top-2 margin m (nats) is small relative to the perturbation scale σ:
P(flip | m) ≈ Φ(−m / (σ√2)). σ̂ is estimated from the audit itself: per position the differences
Δ_j = provider − reference log-prob over the provider's listed tokens are centred (removing the
normaliser, a constant per position), and σ̂ is the MAD scale of the pooled residuals (corrected
for centring). At positions where the reference is confident (m > CONFIDENT_MARGIN_SIGMAS · σ̂),
quantization predicts few flips; a different model flips there far more often.
``details["confident_flip_ratio"]`` = (observed + 1) / (expected + 1) is ~1 for isotropic noise.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from auditor.util import finite

from .base import MIN_POSITIONS, DetectorName, DetectorResult, EvidenceBatch, not_run
from .noise_floor import NoiseFloor
from .stats import RngLike, as_rng, bucketed_kl, mean_variance_under, norm_sf

__all__ = [
    "CONFIDENT_MARGIN_SIGMAS",
    "LOGPROB_POSITIONS",
    "LOGPROB_TEMPERATURES",
    "MARGIN_BIN_EDGES",
    "LogprobTestRows",
    "bootstrap_mean_ci",
    "kl_floor_ratio",
    "logprob_divergence",
    "logprob_positions",
    "margin_flip_stats",
    "select_logprob_test",
]

#: Requested temperatures at which reported logprobs are compared with raw reference logprobs.
#: (Engines differ on raw vs temperature-processed logprobs; at T in {0, 1} both agree.)
LOGPROB_TEMPERATURES = (0.0, 1.0)
#: A position is "confident" when the reference's top-1/top-2 margin exceeds this many σ̂
#: (there a flip has probability <= Φ(−3/√2) ≈ 1.7% per competitor under isotropic noise).
#: Measured alternative c = 2 (docs/detectors.md, rule 2): quantized ratios are tighter there, but a
#: different model's ratio shrinks more (the 2–3σ̂ bin is dominated by expected flips), e.g.
#: SmolLM2 substituted 2.25 at c = 2 vs 5.6 at c = 3 over 671 positions, int4 0.9 vs 1.0.
CONFIDENT_MARGIN_SIGMAS = 3.0
#: Margin bins (in units of σ̂) of the flip counts reported in ``details["margin_bins"]``.
MARGIN_BIN_EDGES = (0.0, 1.0, 2.0, 3.0, 5.0, 10.0, float("inf"))
_MAD_TO_SD = 1.482602218505602  # 1 / Φ^{-1}(3/4)
#: Width of the KL the test statistic y is computed on (None: the width M the provider listed; the
#: effect, the ratios and the flip statistics always use M). docs/detectors.md: the top-1 width.
TEST_WIDTH: int | None = None


#: What the positions behind the KL-vs-floor figure are, named the same wherever the figure is shown (issue 38,
#: item 1: "334 positions" beside "633 positions scored" read as two counts of one thing).
LOGPROB_POSITIONS = "positions with reported probabilities"


def kl_floor_ratio(details: Any) -> float | None:
    """The KL-vs-floor figure every report, reason and headline shows (issue 38: one home, one number):
    the geometric-mean KL / honest floor ratio ``R = exp(ȳ − μ0)`` of a logprob-divergence result's
    ``details`` (``details["geometric_ratio"]``: the test statistic's own effect, the unit of the
    registry's power target and of the calibrated effect sizes, what ``auditor.verdict.precision_estimate``
    places among the precision classes). ``details["ratio_to_floor"]`` (arithmetic mean KL / floor mean KL)
    stays a decision input of ``auditor.verdict.decide`` and is never shown beside it.

    Returns:
        R (> 0, dimensionless), or None when ``details`` is not a mapping or holds no finite positive ratio.
    """
    if not isinstance(details, Mapping):
        return None
    r = finite(details.get("geometric_ratio"))
    return r if r is not None and r > 0 else None


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
        top1_agreement, mean_abs_dlogprob, m, test_m (the width y was computed on: m unless
        :data:`TEST_WIDTH` narrows it), floor_mean_kl, n_prompts}.
    """
    sel = select_logprob_test(batch, floor, temperatures, name)
    if isinstance(sel, DetectorResult):
        return sel
    idx, m, fl, fl_test, kl, y, prov_lp, ref_lp, m_test, n_all = (
        sel.idx, sel.m, sel.floor, sel.test_floor, sel.kl, sel.y, sel.prov_lp, sel.ref_lp, sel.m_test, sel.n_all)
    n = idx.size
    ref = batch.reference()
    groups = batch.prompt_ids[idx]
    _, inv = np.unique(groups, return_inverse=True)
    ng = np.bincount(inv).astype(np.float64)
    vc = fl_test.components
    var0 = mean_variance_under(vc.sigma_w2, vc.sigma_b2, n, float((ng**2).sum()))
    mu0, var_floor = fl_test.null_mean(batch.positions[idx])
    se = float(np.sqrt(var0 + var_floor))
    ybar = float(y.mean())
    z = (ybar - mu0) / se if se > 0 else (np.inf if ybar > mu0 else 0.0)
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
    flips = margin_flip_stats(
        ref.top_logprobs[idx], ref.top_ids[idx, 0], batch.provider_top_ids[idx, 0], prov_lp, ref_lp
    )
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
            "geometric_ratio": float(np.exp(ybar - mu0)),
            "null_mean_y": mu0,
            "position_adjustment": mu0 - vc.mean,
            "top1_agreement": float(top1.mean()),
            "mean_abs_dlogprob": float(np.nanmean(sel.mad))
            if np.any(~np.isnan(sel.mad))
            else None,
            "m": int(m),
            "test_m": int(m_test),
            "floor_mean_kl": fl.mean_kl,
            "floor_variant": fl.variant,
            "mean_log_kl": ybar,
            "floor_mean_log_kl": vc.mean,
            "n_prompts": int(ng.size),
            "n_dropped_short_lists": int(n_all - n),
            **flips,
        },
    )


@dataclass(frozen=True)
class LogprobTestRows:
    """The positions a logprob test compares and their per-position statistic (:func:`select_logprob_test`).

    Attributes:
        idx: [n] int64 batch rows used. m: the floor width (alternatives compared); m_test: the width of ``y``.
        floor / test_floor: the floor's ``KLFloor`` at m and at m_test.
        kl: [n] float64 bucketed KL at width m (nats); mad: [n] mean |Δlogprob| of the listed tokens.
        y: [n] float64 log(KL + eps) at width m_test — the test statistic per position.
        prov_lp / ref_lp: [n, m] provider and reference log-probs of the provider's listed tokens.
        n_all: positions usable before dropping short lists.
    """

    idx: np.ndarray
    m: int
    m_test: int
    floor: Any
    test_floor: Any
    kl: np.ndarray
    mad: np.ndarray
    y: np.ndarray
    prov_lp: np.ndarray
    ref_lp: np.ndarray
    n_all: int


def select_logprob_test(batch: EvidenceBatch, floor: NoiseFloor | None, temperatures: Sequence[float],
                        name: str) -> LogprobTestRows | DetectorResult:
    """The rows and per-position statistic y = log(KL + eps) that ``logprob-divergence`` (pooled) and
    ``logprob-heterogeneity`` (per request) test, or the not-run result (named ``name``) saying why none."""
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
    ref_lp = batch.reference().at_provider_top[idx, :m]
    kl, mad, _ = bucketed_kl(ref_lp, prov_lp)
    m_test = m if TEST_WIDTH is None else floor.choose_m(min(m, TEST_WIDTH)) or m
    fl_test = fl if m_test == m else floor.kl_floor(m_test)
    kl_test = kl if m_test == m else bucketed_kl(ref_lp[:, :m_test], prov_lp[:, :m_test])[0]
    y = np.log(kl_test + floor.eps)
    return LogprobTestRows(idx, int(m), int(m_test), fl, fl_test, kl, mad, y, prov_lp, ref_lp, n_all)


def margin_flip_stats(
    ref_top_lp: np.ndarray,
    ref_top1: np.ndarray,
    prov_top1: np.ndarray,
    prov_lp: np.ndarray,
    ref_at_prov: np.ndarray,
    *,
    c: float = CONFIDENT_MARGIN_SIGMAS,
) -> dict[str, Any]:
    """Margin-conditioned top-1 disagreement: observed vs isotropic-noise-expected flips.

    Args:
        ref_top_lp: [n, K] reference top-K log-probs (nats, descending, -inf padding), K >= 2.
        ref_top1: [n] reference argmax ids; prov_top1: [n] provider's reported top-1 ids.
        prov_lp: [n, M] provider log-probs of its listed tokens (nats, -inf padding).
        ref_at_prov: [n, M] reference log-probs at the same ids (nats, NaN where unknown).
        c: confident positions have margin m > c · σ̂.

    Method: Δ_ij = prov_lp − ref_at_prov over the k_i >= 2 known entries of row i, centred per row;
    residuals scaled by sqrt(k_i / (k_i − 1)) (centring shrinks an iid variance by (k−1)/k);
    σ̂ = 1.4826 · median |residual| (nats, one logit's perturbation scale). Per position, the
    probability that the reference argmax loses its place is approximated by the union over the
    reference's other top-K tokens, min(1, Σ_{j>=2} Φ(−(l_1 − l_j) / (σ̂√2))). Over the confident
    positions: observed = #(provider top-1 ≠ reference argmax), expected = Σ of those probabilities.

    Returns:
        JSON-able dict: ``confident_flip_ratio`` ((observed + 1) / (expected + 1); None when σ̂
        cannot be estimated), ``confident_flips`` (observed), ``confident_flips_expected``,
        ``n_confident``, ``sigma_hat`` (nats), ``confident_margin_sigmas`` (c),
        ``confident_flip_p`` (Poisson upper tail P(X >= observed | expected), a guide only: the
        model is approximate), ``margin_bins`` (per bin of m/σ̂ in MARGIN_BIN_EDGES: lower edge,
        positions, observed and expected flips).
    """
    ref_top_lp = np.asarray(ref_top_lp, np.float64)
    prov_lp = np.asarray(prov_lp, np.float64)
    ref_at_prov = np.asarray(ref_at_prov, np.float64)
    known = np.isfinite(prov_lp) & np.isfinite(ref_at_prov)
    k = known.sum(1)
    use = k >= 2
    d = np.where(known, prov_lp - np.where(known, ref_at_prov, 0.0), 0.0)
    centre = d.sum(1) / np.maximum(k, 1)
    resid = (d - centre[:, None]) * np.sqrt(k / np.maximum(k - 1, 1))[:, None]
    r = np.abs(resid[known & use[:, None]])
    sigma = float(_MAD_TO_SD * np.median(r)) if r.size else float("nan")
    out: dict[str, Any] = {"confident_margin_sigmas": float(c), "sigma_hat": sigma if np.isfinite(sigma) else None}
    if not (np.isfinite(sigma) and sigma > 0) or ref_top_lp.ndim != 2 or ref_top_lp.shape[1] < 2:
        out.update(confident_flip_ratio=None, confident_flips=None, confident_flips_expected=None,
                   n_confident=0, confident_flip_p=None, margin_bins=[])
        return out
    gaps = ref_top_lp[:, :1] - ref_top_lp[:, 1:]  # [n, K-1] >= 0, +inf for padding
    gaps = np.where(np.isfinite(gaps), gaps, np.inf)
    p_flip = np.minimum(norm_sf(gaps / (sigma * np.sqrt(2.0))).sum(1), 1.0)
    margin = gaps[:, 0]
    flip = np.asarray(prov_top1) != np.asarray(ref_top1)
    conf = margin > c * sigma
    obs, exp_ = int(flip[conf].sum()), float(p_flip[conf].sum())
    bins = []
    z = margin / sigma
    for lo, hi in itertools.pairwise(MARGIN_BIN_EDGES):
        b = (z >= lo) & (z < hi)
        bins.append({"lo_sigmas": lo, "n": int(b.sum()), "flips": int(flip[b].sum()),
                     "expected": float(p_flip[b].sum())})
    out.update(
        confident_flip_ratio=float((obs + 1.0) / (exp_ + 1.0)),
        confident_flips=obs,
        confident_flips_expected=exp_,
        n_confident=int(conf.sum()),
        confident_flip_p=float(stats.poisson.sf(obs - 1, exp_)) if obs > 0 else 1.0,
        margin_bins=bins,
    )
    return out


def _margin(batch: EvidenceBatch, i: int) -> float:
    lp = batch.reference().top_logprobs[i]
    return float(lp[0] - lp[1]) if lp.size > 1 and np.isfinite(lp[1]) else float("inf")
