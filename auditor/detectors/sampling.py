"""Sampling goodness-of-fit detectors (temperature > 0, multi-token continuations).

Under H0 every emitted token is drawn from the reference distribution p at its prefix (requested
temperature applied, top_p = 1, no top-k). Three tests share one representation, a
:class:`SamplingView` (top-K probabilities sorted descending + the emitted token's rank):

- ``sampling-gof``: randomized PIT values U = F(x−) + V p(x), tokens ordered by p descending
  (``stats.randomized_pit``), are i.i.d. Uniform(0, 1) under H0; Cramér–von Mises test
  (scipy.stats.cramervonmises), derandomized: ``GOF_PIT_DRAWS`` independent randomizations, p-value
  2 × the median of theirs (:func:`gof_test`), so a verdict does not hinge on the auditor's seed.
  Over-emission of the top tokens shows as small U.
- ``sampling-argmax``: count of argmax emissions vs its null law, a Poisson-binomial with
  success probabilities p(argmax) (mean Σp, variance Σp(1−p)); one-sided (too many) — the
  signature of relaxed (lossy) speculative acceptance, where drafts (mostly the argmax) are
  accepted more often than p allows. The test counts the positions with p(argmax) ≥ t and scans t
  from ``ARGMAX_TEST_MIN_P`` over the acceptance thresholds (the excess lives above the unknown
  threshold; exact law of the scan, see :func:`argmax_test`); its effect is reported over all positions.
- ``sampling-tail``: count of tokens emitted outside the reference's top-p = TAIL_TOP_P nucleus
  (the low-probability tail) vs its expected Σ tail mass; one-sided (too few) — the signature
  of truncated sampling nobody asked for (engine-default top-k/top-p/min-p).
Which cause thinned the tail (truncation or lossy acceptance) is decided by the emission models of
:mod:`.emission`, fitted on the tail test's view and recorded in its ``details["emission"]`` (the
verdict's rule 4b); argmax over-emitted with the tail intact → relaxed verification.

Count tests report the exact tail probability as ``p_value`` (conservative for a discrete
statistic) and a randomized p-value in ``details['p_randomized']`` (exactly uniform under H0).

The first generated token is drawn before any speculation (there is no draft yet), so it carries
no relaxed-verification signal; it is kept because it is still a valid H0 trial (it dilutes the
relaxed signal slightly and still tests quantization/truncation).

Reference rows: with only the top-K list, positions at T = 1 are used (the tail trick in
``randomized_pit`` keeps U exact); with full rows, any T > 0 (the row is tempered and
renormalised here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from .base import MIN_POSITIONS, DetectorName, DetectorResult, EvidenceBatch, not_run
from .emission import SINGLE_THRESHOLD_GRID, emission_fit
from .logprob import margin_flip_stats
from .noise_floor import NoiseFloor
from .stats import (
    RngLike,
    as_rng,
    cauchy_combination,
    cramervonmises_uniform_statistics,
    garwood_ci,
    improbable_draws,
    pit_bounds,
    poisson_binomial_mid_p,
    poisson_binomial_scan_test,
    poisson_binomial_test,
)

__all__ = [
    "ARGMAX_TEST_MIN_P",
    "CAUSE_FEATURE_MAX_P",
    "FULL_ROW_TOP_K",
    "GOF_PIT_DRAWS",
    "TAIL_TOP_P",
    "SamplingView",
    "argmax_scan_thresholds",
    "argmax_test",
    "combined_sampling_test",
    "declared_law",
    "gof_test",
    "provider_view",
    "reference_view",
    "sampled_flip_stats",
    "sampled_self_stats",
    "sampling_argmax",
    "sampling_gof",
    "sampling_tail",
    "tail_test",
]

#: The tail is everything outside the smallest top set with cumulative probability >= TAIL_TOP_P.
TAIL_TOP_P = 0.9
#: ``sampling-argmax`` tests the argmax count only where the reference p(argmax) is at least this.
#: Relaxed acceptance rules accept a draft when its target probability clears a threshold
#: (SGLang ``threshold_single``/``threshold_acc``; typical acceptance's min(ε, δ·e^{−H})), so the
#: argmax excess sits at positions where p(argmax) is large enough to clear it, while positions
#: with a small p(argmax) add Poisson-binomial variance and almost no signal. Measured on the
#: simulator (issue 7, docs/calibration.md): relaxed-threshold (s = 0.5) with 500 sampled tokens
#: is caught in 99% of audits instead of 90% with every position counted, false accusations unchanged.
ARGMAX_TEST_MIN_P = 0.3
#: The sampling results record their cause features only when their own p-value is at most this: ``*-tail``
#: the emission-model fit (``details["emission"]``, :mod:`.emission`: truncation or acceptance, the verdict's rule
#: 4b), ``sampling-gof`` the sampled tokens against the provider's own reported distribution
#: (``details["sampled_self"]``, :func:`sampled_self_stats`, rule 4d). The verdict uses them only when that test
#: rejects at the family-wise α after Holm, so p <= α <= this; skipping them elsewhere keeps the calibration's
#: hundred thousand audits cheap. (At α > 0.1 rule 4b falls back to the shape ratio, rule 4d to the flip statistic.)
CAUSE_FEATURE_MAX_P = 0.1
#: Randomized PITs whose Cramér–von Mises p-values ``gof_test`` aggregates (2 × their median): odd, so
#: the median is one of them. 21 draws leave the aggregate's seed-to-seed spread small next to its data
#: spread (docs/detectors.md) at a cost of sorting a [21, n] array.
GOF_PIT_DRAWS = 21
#: How many top tokens a view keeps when built from full reference rows.
FULL_ROW_TOP_K = 64
_T1_TOL = 1e-6
_FULL_ROW_CHUNK = 256


@dataclass
class SamplingView:
    """Emitted tokens against a known (or reported) sampling distribution.

    Attributes:
        idx: [n] int64 indices into the source batch.
        top_probs: [n, K] float64 probabilities of the top-K tokens, sorted descending, 0 padding.
        token_rank: [n] int64 rank of the emitted token in that list, -1 if not listed.
        source: "reference" or "provider".
        unknown_law: positions left out because the law they were sampled from is not known from the
            list (:func:`declared_law`: its top-K does not reach the provider's enforced top_p).
    """

    idx: np.ndarray
    top_probs: np.ndarray
    token_rank: np.ndarray
    source: str
    unknown_law: int = 0

    def left_out(self) -> str:
        """``"; N positions left out: ..."`` when :attr:`unknown_law` > 0, else ``""`` (for not-run reasons)."""
        if not self.unknown_law:
            return ""
        return (f"; {self.unknown_law} positions left out: the {self.source}'s listed top-{self.top_probs.shape[1]} "
                "does not reach the provider's enforced top_p there, so the law they were sampled from is unknown")

    def __len__(self) -> int:
        return int(self.idx.size)


def _rank_of(top_ids: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    if top_ids.shape[1] == 0:
        return np.full(token_ids.shape[0], -1, np.int64)
    hit = (top_ids == token_ids[:, None]) & (top_ids >= 0)
    return np.where(hit.any(1), hit.argmax(1), -1).astype(np.int64)


def reference_view(batch: EvidenceBatch) -> SamplingView:
    """View of the batch's sampled positions (T > 0, aligned token) under the reference.

    Uses full rows when present (any T > 0, tempered); otherwise the top-K list at T = 1 only.
    """
    if not batch.has_reference:
        return SamplingView(
            np.zeros(0, np.int64), np.zeros((0, 0)), np.zeros(0, np.int64), "reference"
        )
    ref = batch.reference()
    base = (
        (batch.temperatures > _T1_TOL)
        & (batch.token_ids >= 0)
        & (ref.top_ids[:, 0] >= 0)
    )
    if batch.ref_full_logprobs is not None:
        idx = np.flatnonzero(base)
        k = min(FULL_ROW_TOP_K, batch.ref_full_logprobs.shape[1])
        ids = np.zeros((idx.size, k), np.int64)
        probs = np.zeros((idx.size, k))
        for s in range(0, idx.size, _FULL_ROW_CHUNK):  # bounded memory for V ~ 50k
            rows = idx[s : s + _FULL_ROW_CHUNK]
            full = (
                batch.ref_full_logprobs[rows].astype(np.float64)
                / batch.temperatures[rows][:, None]
            )
            full = full - logsumexp(full, axis=1, keepdims=True)
            top = np.argpartition(-full, k - 1, axis=1)[:, :k]
            lp = np.take_along_axis(full, top, 1)
            order = np.argsort(-lp, axis=1, kind="stable")
            ids[s : s + rows.size] = np.take_along_axis(top, order, 1)
            probs[s : s + rows.size] = np.exp(np.take_along_axis(lp, order, 1))
    else:
        idx = np.flatnonzero(base & (np.abs(batch.temperatures - 1.0) <= _T1_TOL))
        ids = ref.top_ids[idx]
        probs = np.exp(ref.top_logprobs[idx])
    return declared_law(
        batch, SamplingView(idx.astype(np.int64), probs, _rank_of(ids, batch.token_ids[idx]), "reference")
    )


def declared_law(batch: EvidenceBatch, view: SamplingView) -> SamplingView:
    """``view`` under the law each position was sampled from (issue 35 item 4): where the batch says
    the provider cut the distribution (``top_ks`` > 0, ``top_ps`` < 1, e.g. an API that enforces
    top_p = 0.95), the listed probabilities are cut as vLLM's and Hugging Face's samplers do — top-k
    first, then the smallest top set whose probability reaches top_p — and renormalised; an emitted
    token outside the kept set gets rank -1 with no mass left (U = 1: impossible under the law). A
    position whose listed top-K does not reach its top_p (the cut lies among unlisted tokens, so the
    law is not known) is dropped.

    Args:
        batch: the positions (``top_ps`` [N] float64 / ``top_ks`` [N] int64, None = no cut).
        view: a view of some of them (probabilities sorted descending, [n, K]).

    Returns:
        The view with every cut position's law truncated; unchanged when nothing is cut.
    """
    n, k = view.top_probs.shape
    tp = np.ones(n) if batch.top_ps is None else batch.top_ps[view.idx]
    tk = np.zeros(n, np.int64) if batch.top_ks is None else batch.top_ks[view.idx]
    cut = (tp < 1.0 - 1e-12) | (tk > 0)
    if n == 0 or k == 0 or not cut.any():
        return view
    col = np.arange(k)[None, :]
    has_k = tk > 0
    listed_k = has_k & (tk <= k)  # the whole top-k is listed: its law is known
    probs = np.where(has_k[:, None] & (col >= tk[:, None]), 0.0, view.top_probs)  # top-k first, renormalised
    probs = np.where(listed_k[:, None], probs / np.maximum(probs.sum(1, keepdims=True), 1e-300), probs)
    cum = np.cumsum(probs, axis=1)
    reached = (cum >= tp[:, None] - 1e-12) & (tp[:, None] < 1.0 - 1e-12)
    known = reached.any(1) | (listed_k & (tp >= 1.0 - 1e-12))
    known &= ~has_k | listed_k
    last = np.where(reached.any(1), reached.argmax(1), np.clip(tk, 1, k) - 1)
    mass = cum[np.arange(n), last]
    trunc = np.where(col <= last[:, None], probs, 0.0) / np.maximum(mass, 1e-300)[:, None]
    probs = np.where(cut[:, None], trunc, view.top_probs)
    ranks = np.where(cut & (view.token_rank > last), -1, view.token_rank)
    ok = ~cut | known
    return SamplingView(view.idx[ok], probs[ok], ranks[ok].astype(np.int64), view.source,
                        view.unknown_law + int((~ok).sum()))


def provider_view(batch: EvidenceBatch) -> SamplingView:
    """View of the batch's T = 1 positions under the provider's own reported top_logprobs (the ``self-*`` tests'
    law, :mod:`.consistency`, and rule 4d's cause feature :func:`sampled_self_stats`): the listed support plus the
    unlisted mass as one tail bucket; positions with untrusted or no listed logprobs are left out, listed masses
    above 1 renormalised, and an enforced top_p / top_k applied (:func:`declared_law`)."""
    mask = (
        (np.abs(batch.temperatures - 1.0) <= _T1_TOL)
        & batch.provider_trusted
        & (batch.provider_listed >= 1)
        & (batch.token_ids >= 0)
    )
    idx = np.flatnonzero(mask)
    probs = np.exp(batch.provider_top_logprobs[idx])  # -inf padding -> 0
    s = probs.sum(1, keepdims=True)
    probs = np.where(s > 1.0, probs / np.maximum(s, 1e-300), probs)
    ranks = _rank_of(batch.provider_top_ids[idx], batch.token_ids[idx])
    return declared_law(batch, SamplingView(idx.astype(np.int64), probs, ranks, "provider"))


# --------------------------------------------------------------------------- core tests
def gof_test(view: SamplingView, rng: RngLike = 0, draws: int = GOF_PIT_DRAWS) -> dict[str, Any]:
    """Derandomized randomized-PIT Cramér–von Mises test of a view.

    A single randomized PIT makes the verdict depend on the auditor's random numbers: with
    LLM sampling most of U's spread is the randomization V (a token with p = 0.9 fills 90% of
    [0, 1] by itself), so another seed can turn a rejection into a pass on the same responses. The
    test therefore draws ``draws`` (odd) independent randomizations, computes each one's W² and exact
    CvM p-value p_k (each exactly Uniform(0, 1) under H0), and reports the quantile aggregate
    p = min(1, 2 · median_k p_k) (Meinshausen, Meier & Bühlmann 2009, JASA 104:1671, Thm 3.1 with
    γ = ½: valid under any dependence among the p_k; by Markov, P(median ≤ α/2) ≤ α). The median
    is the p-value of the median W², so one scipy call gives it. The aggregate is conservative
    (on the simulator its Holm rejection share in honest `verification` audits fell from 2.4% to 0.3%,
    docs/calibration.md)
    and nearly seed-free: its p-value moves far less between seeds than a single draw's.

    The effect and evidence use the mid-PIT E_V[U] = F(x−) + p(x)/2 (deterministic); the fractions of U
    below 0.1 / above 0.9 are their expectations over V.

    Args:
        view: SamplingView ([n, K] float64 probabilities sorted descending, [n] int64 ranks).
        rng: seed or generator of the randomizations.
        draws: number of randomized PITs aggregated (odd, >= 1; 1 = the plain randomized test).

    Returns:
        dict with u [n] (mid-PITs), statistic (the median W²), p_value (the aggregate),
        p_single (the first draw's CvM p-value, exactly Uniform(0, 1) under H0), p_median (median p_k),
        effect (mean mid-PIT − 0.5) with ci (±1.96 sqrt(1/(12 n))), frac_low, frac_high, draws.

    Raises:
        ValueError: ``draws`` even or < 1.
    """
    if draws < 1 or draws % 2 == 0:
        raise ValueError(f"draws must be an odd number >= 1, got {draws}")
    low, width = pit_bounds(view.top_probs, view.token_rank)
    g = as_rng(rng)
    v = g.random((draws, low.size))
    u_k = np.clip(low[None, :] + v * width[None, :], 0.0, 1.0)  # [draws, n]
    w2 = cramervonmises_uniform_statistics(u_k)
    med = int(np.argsort(w2, kind="stable")[draws // 2])  # median W² = median p_k
    p_med = float(min(1.0, max(0.0, stats.cramervonmises(u_k[med], "uniform").pvalue)))
    p_first = p_med if med == 0 else float(min(1.0, max(0.0, stats.cramervonmises(u_k[0], "uniform").pvalue)))
    p_agg = min(1.0, 2.0 * p_med) if draws > 1 else p_med
    mid = np.clip(low + 0.5 * width, 0.0, 1.0)
    safe = np.where(width > 0, width, 1.0)
    below = np.where(width > 0, np.clip((0.1 - low) / safe, 0.0, 1.0), (low < 0.1).astype(float))
    above = np.where(width > 0, np.clip((low + width - 0.9) / safe, 0.0, 1.0), (low > 0.9).astype(float))
    n = low.size
    half = 1.96 * np.sqrt(1.0 / (12.0 * n))
    d = float(mid.mean() - 0.5)
    return {
        "u": mid,
        "statistic": float(w2[med]),
        "p_value": float(p_agg),
        "p_single": p_first,
        "p_median": p_med,
        "effect": d,
        "ci": (d - half, d + half),
        "frac_low": float(below.mean()),
        "frac_high": float(above.mean()),
        "draws": int(draws),
    }


def argmax_test(
    view: SamplingView, rng: RngLike = 0, min_p: float = ARGMAX_TEST_MIN_P
) -> dict[str, Any]:
    """Argmax over-emission: observed argmax count vs Poisson-binomial(p(argmax)), one-sided greater,
    scanned over the acceptance threshold.

    A relaxed acceptance rule with threshold s (SGLang ``threshold_single``; typical acceptance's
    min(ε, δ·e^{−H})) adds argmax emissions only where the reference p(argmax) clears s, and positions
    below it add Poisson-binomial variance but no signal. The test therefore counts the positions with
    p(argmax) >= t for every t in ``argmax_scan_thresholds(min_p)`` (``min_p`` and the emission models'
    :data:`~auditor.detectors.emission.SINGLE_THRESHOLD_GRID` above it) and takes the largest standardised
    excess; its p-value is exact (:func:`~auditor.detectors.stats.poisson_binomial_scan_test`: the sets
    depend on the reference only, so under H0 every count is Poisson-binomial and the multiplicity of the
    scan is in the null law). With fewer than ``MIN_POSITIONS`` positions at ``min_p``, the lowest set is
    every position. The effect (excess per position, its CI, argmax_rate) is over all positions, which
    the verdict's shape rule and the power model use (docs/detectors.md, rule 4b).

    Args:
        view: SamplingView ([n, K] float64 probabilities sorted descending, [n] int ranks).
        rng: seed/generator of the randomized p-value.
        min_p: lowest p(argmax) threshold of the scan (``ARGMAX_TEST_MIN_P``; 0 = all positions).

    Returns:
        dict with observed, expected (Σp over all positions), sd (sqrt Σp(1−p)), z (the scan's maximum),
        p_value (exact, conservative), p_randomized, p_mid (the scan's mid-p), excess (per position, (obs − exp)/n) with ci,
        argmax_rate, expected_rate, is_argmax [n] bool, n_tested (positions at the lowest threshold),
        min_p, scan_threshold (the p(argmax) threshold attaining z), scan_observed / scan_expected /
        scan_n (that set's count, its null mean and size), scan_thresholds.
    """
    p1 = view.top_probs[:, 0]
    is_arg = view.token_rank == 0
    obs = int(is_arg.sum())
    exp = float(p1.sum())
    var = float((p1 * (1 - p1)).sum())
    sd = float(np.sqrt(var))
    n = p1.size
    base = min_p if int((p1 >= min_p).sum()) >= MIN_POSITIONS else 0.0
    ts = argmax_scan_thresholds(base)
    t = poisson_binomial_scan_test(p1, is_arg, p1, ts, rng)
    exc = (obs - exp) / n
    half = 1.96 * sd / n if sd > 0 else 0.0
    return {
        "observed": obs,
        "expected": exp,
        "sd": sd,
        "z": float(t["z"]),
        "p_value": float(t["p_value"]),
        "p_randomized": float(t["p_randomized"]),
        "p_mid": float(t["p_mid"]),
        "effect": float(exc),
        "ci": (float(exc - half), float(exc + half)),
        "argmax_rate": obs / n,
        "expected_rate": exp / n,
        "is_argmax": is_arg,
        "n_tested": int((p1 >= base).sum()),
        "min_p": float(min_p),
        "scan_threshold": t["threshold"],
        "scan_observed": int(t["observed"]),
        "scan_expected": float(t["expected"]),
        "scan_n": int(t["n"]),
        "scan_thresholds": list(ts),
    }


def argmax_scan_thresholds(min_p: float) -> tuple[float, ...]:
    """The p(argmax) thresholds :func:`argmax_test` scans: ``min_p``, then every threshold of the emission
    models' single-threshold acceptance family (``SINGLE_THRESHOLD_GRID``, the relaxed-acceptance
    thresholds real engines expose) above it."""
    return (float(min_p), *(float(t) for t in SINGLE_THRESHOLD_GRID if t > min_p))


def tail_split(
    view: SamplingView, top_p: float = TAIL_TOP_P
) -> tuple[np.ndarray, np.ndarray]:
    """Per position: tail mass τ [n] (outside the top-p nucleus, or outside the listed top-K
    when the list does not reach top_p) and whether the emitted token fell in the tail [n] bool."""
    probs = view.top_probs
    n, k = probs.shape
    if k == 0:
        return np.ones(n), np.ones(n, bool)
    cum = np.cumsum(probs, axis=1)
    listed = (probs > 0).sum(1)
    reached = cum >= top_p - 1e-12
    k_nuc = np.where(reached.any(1), reached.argmax(1) + 1, np.maximum(listed, 1))
    k_nuc = np.minimum(k_nuc, np.maximum(listed, 1))
    tau = np.clip(1.0 - cum[np.arange(n), k_nuc - 1], 0.0, 1.0)
    in_tail = (view.token_rank < 0) | (view.token_rank >= k_nuc)
    return tau, in_tail


def tail_test(
    view: SamplingView,
    top_p: float = TAIL_TOP_P,
    rng: RngLike = 0,
) -> dict[str, Any]:
    """Tail-mass deficit: emitted-in-tail count vs Poisson-binomial(τ), one-sided less.

    Returns:
        dict with observed, expected (Στ), z, p_value (exact, conservative), p_randomized,
        ratio (obs/exp) with Garwood ci, deficit (per position, (exp − obs)/n), mean_tail_mass.
    """
    tau, in_tail = tail_split(view, top_p)
    obs = int(in_tail.sum())
    exp = float(tau.sum())
    sd = float(np.sqrt((tau * (1 - tau)).sum()))
    p_exact, p_rand = poisson_binomial_test(tau, obs, "less", rng)
    lo, hi = garwood_ci(obs)
    ratio = obs / exp if exp > 0 else float("nan")
    n = tau.size
    return {
        "observed": obs,
        "expected": exp,
        "z": float((obs - exp) / sd) if sd > 0 else 0.0,
        "p_value": p_exact,
        "p_randomized": p_rand,
        "effect": float(ratio),
        "ci": (lo / exp, hi / exp) if exp > 0 else (float("nan"), float("nan")),
        "deficit": float((exp - obs) / n),
        "mean_tail_mass": float(tau.mean()),
        "tau": tau,
        "in_tail": in_tail,
    }


# --------------------------------------------------------------------------- detectors
def _too_few(name: str, view: SamplingView, what: str) -> DetectorResult | None:
    if len(view) < MIN_POSITIONS:
        return not_run(
            name,
            f"too few sampled positions {what} ({len(view)} < {MIN_POSITIONS}){view.left_out()}",
            n=len(view),
        )
    return None


def _n_prompts(batch: EvidenceBatch, view: SamplingView) -> int:
    ids = batch.prompt_ids[view.idx]
    keys = ids.tolist()
    if set(map(type, keys)) <= {str}:  # np.unique's count, without sorting Python objects
        return len(set(keys))
    return int(np.unique(ids).size)


def gof_result(
    batch: EvidenceBatch, view: SamplingView, name: str, rng: RngLike, n_evidence: int
) -> DetectorResult:
    """The ``*-gof`` DetectorResult of a view (statistic W², effect mean(U) − 0.5)."""
    t = gof_test(view, rng)
    u = t["u"]
    order = np.argsort(-np.abs(u - 0.5), kind="stable")[:n_evidence]
    return _view_result(batch, view, name, t, t["statistic"], order, {"u": u, "rank": view.token_rank}, {
        "mean_u": float(u.mean()),
        "frac_u_below_0.1": t["frac_low"],
        "frac_u_above_0.9": t["frac_high"],
        "pit_draws": t["draws"],
        "p_single_draw": t["p_single"],
        "p_median_draw": t["p_median"],
    })


def _view_result(
    batch: EvidenceBatch,
    view: SamplingView,
    name: str,
    t: Mapping[str, Any],
    statistic: float,
    order: np.ndarray,
    columns: Mapping[str, np.ndarray],
    details: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> DetectorResult:
    """The DetectorResult of sampling test ``t`` (``gof_test``/``argmax_test``/``tail_test`` output) on
    ``view``: p_value, effect and ci from ``t``, n = the view's positions; the details are ``details``, then
    the view's ``source`` and ``n_prompts``, then ``extra``.

    Evidence: one row per view index in ``order`` (strongest first, already cut to ``n_evidence``), with
    each of ``columns`` ([len(view)] numeric arrays) at that index as a Python number, then the margin."""
    evidence = [
        batch.evidence_row(int(view.idx[j]), **{k: v[j].item() for k, v in columns.items()}, margin=_margin(view, j))
        for j in order
    ]
    return DetectorResult(
        name=name,
        statistic=statistic,
        p_value=t["p_value"],
        effect=t["effect"],
        effect_ci=t["ci"],
        n=len(view),
        evidence=evidence,
        details={**details, "source": view.source, "n_prompts": _n_prompts(batch, view), **(extra or {})},
    )


def argmax_result(
    batch: EvidenceBatch, view: SamplingView, name: str, rng: RngLike, n_evidence: int
) -> DetectorResult:
    """The ``*-argmax`` DetectorResult of a view (statistic z, effect excess argmax per position)."""
    t = argmax_test(view, rng)
    p1 = view.top_probs[:, 0]
    # strongest: argmax emitted where it was least likely
    cand = np.flatnonzero(t["is_argmax"])
    order = cand[np.argsort(p1[cand], kind="stable")][:n_evidence]
    return _view_result(batch, view, name, t, t["z"], order, {"p_argmax": p1}, {
        "observed": t["observed"],
        "expected": t["expected"],
        "argmax_rate": t["argmax_rate"],
        "expected_rate": t["expected_rate"],
        "excess_per_position": t["effect"],
        "var_per_position": t["sd"] ** 2 / max(1, len(view)),
        "n_tested": t["n_tested"],
        "min_p_argmax_tested": t["min_p"],
        "scan_threshold": t["scan_threshold"],
        "scan_observed": t["scan_observed"],
        "scan_expected": t["scan_expected"],
        "scan_n": t["scan_n"],
        "p_randomized": t["p_randomized"],
    })


def tail_result(
    batch: EvidenceBatch,
    view: SamplingView,
    name: str,
    rng: RngLike,
    n_evidence: int,
    top_p: float,
) -> DetectorResult:
    """The ``*-tail`` DetectorResult of a view (statistic z, effect observed/expected tail emissions)."""
    t = tail_test(view, top_p, rng)
    tau, in_tail = t["tau"], t["in_tail"]
    cand = np.flatnonzero(~in_tail)
    order = cand[np.argsort(-tau[cand], kind="stable")][:n_evidence]
    return _view_result(batch, view, name, t, t["z"], order, {"tail_mass": tau}, {
        "observed": t["observed"],
        "expected": t["expected"],
        "tail_ratio": t["effect"],
        "deficit_per_position": t["deficit"],
        "mean_tail_mass": t["mean_tail_mass"],
        "top_p": float(top_p),
        "p_randomized": t["p_randomized"],
    }, {"emission": emission_fit(view.top_probs, view.token_rank)} if t["p_value"] <= CAUSE_FEATURE_MAX_P else None)


def _margin(view: SamplingView, j: int) -> float:
    p = view.top_probs[j]
    if p.size > 1 and p[1] > 0:
        return float(np.log(p[0]) - np.log(p[1]))
    return float("inf")


def sampling_gof(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.SAMPLING_GOF,
) -> DetectorResult:
    """Randomized-PIT Cramér–von Mises test against the reference (see module doc).

    Returns: statistic = W², p_value, effect = mean(U) − 0.5 (negative = top tokens over-emitted).
    """
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    view = reference_view(batch)
    few = _too_few(name, view, "with a reference")
    if few is not None:
        return few
    r = gof_result(batch, view, name, rng, n_evidence)
    flips = sampled_flip_stats(batch, view.idx)
    if flips is not None:
        r.details["sampled_path"] = flips
    own = sampled_self_stats(batch, view.idx, rng) if r.p_value <= CAUSE_FEATURE_MAX_P else None
    if own is not None:
        r.details["sampled_self"] = own
    return r


def sampled_flip_stats(batch: EvidenceBatch, idx: np.ndarray) -> dict[str, Any] | None:
    """The margin-conditioned flip statistic (:func:`auditor.detectors.logprob.margin_flip_stats`) at sampled
    positions ``idx`` [n] where the provider listed >= 2 trusted top_logprobs: a cause feature of the
    verdict's rule 4d (quantized copy vs different model) for audits whose only evidence is sampled.

    The statistic scales itself (σ̂ from the audit's own provider − reference log-prob differences), so
    unlike the KL test it needs no floor measured at sampled prefixes. Returns the stats plus
    ``n_positions``, or None when no such position exists.
    """
    idx = np.asarray(idx, np.int64)
    if idx.size == 0 or batch.provider_top_ids.shape[1] < 2:
        return None
    ok = batch.provider_trusted[idx] & (batch.provider_listed[idx] >= 2)
    use = idx[ok]
    if use.size < MIN_POSITIONS:
        return None
    ref = batch.reference()
    out = margin_flip_stats(ref.top_logprobs[use], ref.top_ids[use, 0], batch.provider_top_ids[use, 0],
                            batch.provider_top_logprobs[use], ref.at_provider_top[use])
    out["n_positions"] = int(use.size)
    return out


def sampled_self_stats(batch: EvidenceBatch, idx: np.ndarray, rng: RngLike = 0) -> dict[str, Any] | None:
    """The sampled positions ``idx`` [n] tested against the provider's *own* reported top_logprobs
    (:func:`provider_view`: T = 1, a trusted list): the derandomized PIT test of ``self-gof`` (:func:`gof_test`),
    recorded by ``sampling-gof`` as a cause feature of the verdict's rule 4d, not as a test of the family.

    With a reference the ``self-*`` tests do not run (``auditor.check.run_detectors``), so an audit whose only
    evidence is sampled (the ``verification`` suite: no T = 0 logprob test either) has nothing else that tells a
    served model sampled faithfully from its own distribution (a quantized or another model: its tokens follow what
    it reports, p uniform) from a sampler that emits tokens that distribution did not pick (drafts emitted without
    verification, issue 35's synthetic acceptance: its tokens contradict the target's reported distribution).

    Returns:
        None when fewer than MIN_POSITIONS of ``idx`` have such a list; else ``n_positions``, ``p_value`` (the
        aggregate p of :func:`gof_test`, valid under H0 "the tokens were sampled from the reported distribution"),
        ``statistic`` (median W²), ``mean_u`` (mean mid-PIT; < 0.5: the reported top tokens over-emitted),
        ``frac_u_below_0.1``, ``frac_u_above_0.9``, and ``improbable`` (:func:`.stats.improbable_draws` of the
        tokens' own reported logprobs: drafts emitted unverified at -20 to -50 nats, vLLM 0.32's ngram path).
    """
    pv = provider_view(batch)
    keep = np.isin(pv.idx, np.asarray(idx, np.int64))
    if int(keep.sum()) < MIN_POSITIONS:
        return None
    t = gof_test(SamplingView(pv.idx[keep], pv.top_probs[keep], pv.token_rank[keep], pv.source), rng)
    return {"n_positions": int(keep.sum()), "p_value": float(t["p_value"]), "statistic": float(t["statistic"]),
            "mean_u": float(t["u"].mean()), "frac_u_below_0.1": float(t["frac_low"]),
            "frac_u_above_0.9": float(t["frac_high"]),
            "improbable": improbable_draws(batch.provider_token_logprobs[pv.idx[keep]])}


def sampling_argmax(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.SAMPLING_ARGMAX,
) -> DetectorResult:
    """Argmax over-emission test against the reference (see module doc).

    Returns: statistic = z, p_value (exact Poisson-binomial), effect = excess argmax emissions
    per position.
    """
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    view = reference_view(batch)
    return _too_few(name, view, "with a reference") or argmax_result(
        batch, view, name, rng, n_evidence
    )


def sampling_tail(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    top_p: float = TAIL_TOP_P,
    name: str = DetectorName.SAMPLING_TAIL,
) -> DetectorResult:
    """Tail-mass deficit test against the reference (see module doc).

    Returns: statistic = z, p_value (exact Poisson-binomial, too few), effect = observed/expected
    tail emissions (1 = intact, 0 = tail missing).
    """
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    view = reference_view(batch)
    return _too_few(name, view, "with a reference") or tail_result(
        batch, view, name, rng, n_evidence, top_p
    )


# --------------------------------------------------------------------------- combined (issue 14)
def combined_sampling_test(
    view: SamplingView,
    rng: RngLike = 0,
    *,
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
    discrete: str = "randomized",
    min_p: float = ARGMAX_TEST_MIN_P,
    top_p: float = TAIL_TOP_P,
) -> dict[str, Any]:
    """One p-value for the sampled positions: Cauchy combination of gof, argmax and tail tests.

    Combines the randomized-PIT Cramér–von Mises p-value (:func:`gof_test`), the argmax
    over-emission p-value (:func:`argmax_test`, "greater") and the tail-deficit p-value
    (:func:`tail_test`, "less") with :func:`cauchy_combination`, which stays valid under their
    dependence (issue 14, item 1). ``discrete="randomized"`` uses the count tests' randomized
    p-values (exactly Uniform(0, 1) under H0, so the combination is calibrated); ``"mid-p"`` uses
    Lancaster mid-p values (deterministic given the data, approximately calibrated; the argmax one is the
    threshold scan's own, so all three modes test one statistic); ``"exact"``
    the conservative tail probabilities. Independent uniforms for the three randomizations are
    drawn from one generator (``rng``).

    Not part of the verdict's Holm family: calibration on the simulator must decide (see
    docs/calibration.md) before it replaces the three separate tests.

    Args:
        view: SamplingView ([n, K] float64 top probabilities sorted descending, [n] int64 ranks).
        rng: seed or generator for the randomizations.
        weights: Cauchy weights of (gof, argmax, tail).
        discrete: "randomized" | "mid-p" | "exact".
        min_p, top_p: as in :func:`argmax_test` / :func:`tail_test`.

    Returns:
        dict with p_value (combined), statistic (Cauchy T), components {gof, argmax, tail} (the
        p-values combined), discrete, n (positions).

    Raises:
        ValueError: unknown ``discrete`` mode, or fewer than ``MIN_POSITIONS`` positions.
    """
    if discrete not in ("randomized", "mid-p", "exact"):
        raise ValueError(f"discrete={discrete!r}: use 'randomized', 'mid-p' or 'exact'")
    if len(view) < MIN_POSITIONS:
        raise ValueError(f"combined_sampling_test needs >= {MIN_POSITIONS} sampled positions, got {len(view)}")
    from .stats import as_rng

    g = as_rng(rng)
    gof = gof_test(view, g, draws=1)  # one exactly uniform p-value per component
    arg = argmax_test(view, g, min_p)
    tail = tail_test(view, top_p, g)
    if discrete == "randomized":
        pa, pt = arg["p_randomized"], tail["p_randomized"]
    elif discrete == "exact":
        pa, pt = arg["p_value"], tail["p_value"]
    else:  # the argmax scan's own mid-p: the three modes test one statistic
        pa = arg["p_mid"]
        pt = poisson_binomial_mid_p(tail["tau"], int(tail["in_tail"].sum()), "less")
    comps = {"gof": float(gof["p_value"]), "argmax": float(pa), "tail": float(pt)}
    t, p = cauchy_combination(list(comps.values()), list(weights))
    return {"p_value": p, "statistic": t, "components": comps, "discrete": discrete, "n": len(view)}
