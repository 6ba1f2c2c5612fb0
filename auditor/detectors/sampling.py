"""Sampling goodness-of-fit detectors (temperature > 0, multi-token continuations).

Under H0 every emitted token is drawn from the reference distribution p at its prefix (requested
temperature applied, top_p = 1, no top-k). Three tests share one representation, a
:class:`SamplingView` (top-K probabilities sorted descending + the emitted token's rank):

- ``sampling-gof``: randomized PIT values U = F(x−) + V p(x), tokens ordered by p descending
  (``stats.randomized_pit``), are i.i.d. Uniform(0, 1) under H0; Cramér–von Mises test
  (scipy.stats.cramervonmises). Over-emission of the top tokens shows as small U.
- ``sampling-argmax``: count of argmax emissions vs its null law, a Poisson-binomial with
  success probabilities p(argmax) (mean Σp, variance Σp(1−p)); one-sided (too many) — the
  signature of relaxed (lossy) speculative acceptance, where drafts (mostly the argmax) are
  accepted more often than p allows. The test counts only positions with p(argmax) ≥
  ``ARGMAX_TEST_MIN_P`` (the excess lives there; see :func:`argmax_test`); its effect is reported
  over all positions.
- ``sampling-tail``: count of tokens emitted outside the reference's top-p = TAIL_TOP_P nucleus
  (the low-probability tail) vs its expected Σ tail mass; one-sided (too few) — the signature
  of truncated sampling nobody asked for (engine-default top-k/top-p/min-p).
The shape tells the causes apart (see ``auditor.verdict``): argmax over-emitted with the tail
(mostly) intact → relaxed verification; tail missing → decoding noncompliant.

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

from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import logsumexp

from .base import MIN_POSITIONS, DetectorResult, EvidenceBatch, not_run
from .stats import garwood_ci, poisson_binomial_test, randomized_pit

__all__ = [
    "FULL_ROW_TOP_K",
    "TAIL_TOP_P",
    "SamplingView",
    "ARGMAX_TEST_MIN_P",
    "argmax_test",
    "gof_test",
    "reference_view",
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
    """

    idx: np.ndarray
    top_probs: np.ndarray
    token_rank: np.ndarray
    source: str

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
    base = (
        (batch.temperatures > _T1_TOL)
        & (batch.token_ids >= 0)
        & (batch.ref_top_ids[:, 0] >= 0)
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
        ids = batch.ref_top_ids[idx]
        probs = np.exp(batch.ref_top_logprobs[idx])
    return SamplingView(
        idx.astype(np.int64), probs, _rank_of(ids, batch.token_ids[idx]), "reference"
    )


# --------------------------------------------------------------------------- core tests
def gof_test(view: SamplingView, rng: np.random.Generator | int | None = 0) -> dict:
    """Randomized-PIT Cramér–von Mises test of a view.

    Returns:
        dict with u [n], statistic (W²), p_value, mean_u_minus_half, ci (±1.96 sqrt(1/(12 n))),
        frac_low (fraction of U < 0.1), frac_high (fraction of U > 0.9).
    """
    u = randomized_pit(view.top_probs, view.token_rank, rng)
    res = stats.cramervonmises(u, "uniform")
    n = u.size
    half = 1.96 * np.sqrt(1.0 / (12.0 * n))
    d = float(u.mean() - 0.5)
    return {
        "u": u,
        "statistic": float(res.statistic),
        "p_value": float(min(1.0, max(0.0, res.pvalue))),
        "effect": d,
        "ci": (d - half, d + half),
        "frac_low": float((u < 0.1).mean()),
        "frac_high": float((u > 0.9).mean()),
    }


def argmax_test(
    view: SamplingView, rng: np.random.Generator | int | None = 0, min_p: float = ARGMAX_TEST_MIN_P
) -> dict:
    """Argmax over-emission: observed argmax count vs Poisson-binomial(p(argmax)), one-sided greater.

    The test (z, p_value, p_randomized) counts the positions whose reference p(argmax) ≥ ``min_p``
    (all positions when fewer than ``MIN_POSITIONS`` qualify). The selection depends on the
    reference only, so under H0 the selected count is still Poisson-binomial and the test stays
    exact. The effect (excess per position, its CI, argmax_rate) is over all positions, which the
    verdict's shape rule compares with the tail deficit (docs/detectors.md, rule 4b).

    Args:
        view: SamplingView ([n, K] float64 probabilities sorted descending, [n] int ranks).
        rng: seed/generator of the randomized p-value.
        min_p: smallest p(argmax) a tested position has (``ARGMAX_TEST_MIN_P``; 0 = all).

    Returns:
        dict with observed, expected (Σp), sd (sqrt Σp(1−p)), z, p_value (exact, conservative),
        p_randomized, excess (per position, (obs − exp)/n) with ci, argmax_rate, expected_rate,
        n_tested, min_p.
    """
    p1 = view.top_probs[:, 0]
    is_arg = view.token_rank == 0
    obs = int(is_arg.sum())
    exp = float(p1.sum())
    var = float((p1 * (1 - p1)).sum())
    sd = float(np.sqrt(var))
    n = p1.size
    sel = p1 >= min_p
    if int(sel.sum()) < MIN_POSITIONS:
        sel = np.ones(n, bool)
    obs_t, exp_t = int(is_arg[sel].sum()), float(p1[sel].sum())
    sd_t = float(np.sqrt((p1[sel] * (1 - p1[sel])).sum()))
    p_exact, p_rand = poisson_binomial_test(p1[sel], obs_t, "greater", rng)
    z = (obs_t - exp_t) / sd_t if sd_t > 0 else (np.inf if obs_t > exp_t else 0.0)
    exc = (obs - exp) / n
    half = 1.96 * sd / n if sd > 0 else 0.0
    return {
        "observed": obs,
        "expected": exp,
        "sd": sd,
        "z": float(z),
        "p_value": p_exact,
        "p_randomized": p_rand,
        "effect": float(exc),
        "ci": (float(exc - half), float(exc + half)),
        "argmax_rate": obs / n,
        "expected_rate": exp / n,
        "is_argmax": is_arg,
        "n_tested": int(sel.sum()),
        "min_p": float(min_p),
    }


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
    rng: np.random.Generator | int | None = 0,
) -> dict:
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
            f"too few sampled positions {what} ({len(view)} < {MIN_POSITIONS})",
            n=len(view),
        )
    return None


def _n_prompts(batch: EvidenceBatch, view: SamplingView) -> int:
    return int(np.unique(batch.prompt_ids[view.idx]).size)


def gof_result(batch, view, name, rng, n_evidence) -> DetectorResult:
    t = gof_test(view, rng)
    u = t["u"]
    order = np.argsort(-np.abs(u - 0.5), kind="stable")[:n_evidence]
    ev = [
        batch.evidence_row(
            int(view.idx[j]),
            u=float(u[j]),
            rank=int(view.token_rank[j]),
            margin=_margin(view, j),
        )
        for j in order
    ]
    return DetectorResult(
        name=name,
        statistic=t["statistic"],
        p_value=t["p_value"],
        effect=t["effect"],
        effect_ci=t["ci"],
        n=len(view),
        evidence=ev,
        details={
            "mean_u": float(u.mean()),
            "frac_u_below_0.1": t["frac_low"],
            "frac_u_above_0.9": t["frac_high"],
            "source": view.source,
            "n_prompts": _n_prompts(batch, view),
        },
    )


def argmax_result(batch, view, name, rng, n_evidence) -> DetectorResult:
    t = argmax_test(view, rng)
    p1 = view.top_probs[:, 0]
    # strongest: argmax emitted where it was least likely
    cand = np.flatnonzero(t["is_argmax"])
    order = cand[np.argsort(p1[cand], kind="stable")][:n_evidence]
    ev = [
        batch.evidence_row(
            int(view.idx[j]), p_argmax=float(p1[j]), margin=_margin(view, j)
        )
        for j in order
    ]
    return DetectorResult(
        name=name,
        statistic=t["z"],
        p_value=t["p_value"],
        effect=t["effect"],
        effect_ci=t["ci"],
        n=len(view),
        evidence=ev,
        details={
            "observed": t["observed"],
            "expected": t["expected"],
            "argmax_rate": t["argmax_rate"],
            "expected_rate": t["expected_rate"],
            "excess_per_position": t["effect"],
            "var_per_position": t["sd"] ** 2 / max(1, len(view)),
            "n_tested": t["n_tested"],
            "min_p_argmax_tested": t["min_p"],
            "p_randomized": t["p_randomized"],
            "source": view.source,
            "n_prompts": _n_prompts(batch, view),
        },
    )


def tail_result(batch, view, name, rng, n_evidence, top_p) -> DetectorResult:
    t = tail_test(view, top_p, rng)
    tau, in_tail = t["tau"], t["in_tail"]
    cand = np.flatnonzero(~in_tail)
    order = cand[np.argsort(-tau[cand], kind="stable")][:n_evidence]
    ev = [
        batch.evidence_row(
            int(view.idx[j]), tail_mass=float(tau[j]), margin=_margin(view, j)
        )
        for j in order
    ]
    return DetectorResult(
        name=name,
        statistic=t["z"],
        p_value=t["p_value"],
        effect=t["effect"],
        effect_ci=t["ci"],
        n=len(view),
        evidence=ev,
        details={
            "observed": t["observed"],
            "expected": t["expected"],
            "tail_ratio": t["effect"],
            "deficit_per_position": t["deficit"],
            "mean_tail_mass": t["mean_tail_mass"],
            "top_p": float(top_p),
            "p_randomized": t["p_randomized"],
            "source": view.source,
            "n_prompts": _n_prompts(batch, view),
        },
    )


def _margin(view: SamplingView, j: int) -> float:
    p = view.top_probs[j]
    if p.size > 1 and p[1] > 0:
        return float(np.log(p[0]) - np.log(p[1]))
    return float("inf")


def sampling_gof(
    batch: EvidenceBatch,
    floor=None,
    *,
    rng=0,
    n_evidence: int = 10,
    name="sampling-gof",
) -> DetectorResult:
    """Randomized-PIT Cramér–von Mises test against the reference (see module doc).

    Returns: statistic = W², p_value, effect = mean(U) − 0.5 (negative = top tokens over-emitted).
    """
    if not batch.has_reference:
        return not_run(name, "no reference distribution available")
    view = reference_view(batch)
    return _too_few(name, view, "with a reference") or gof_result(
        batch, view, name, rng, n_evidence
    )


def sampling_argmax(
    batch: EvidenceBatch,
    floor=None,
    *,
    rng=0,
    n_evidence: int = 10,
    name="sampling-argmax",
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
    floor=None,
    *,
    rng=0,
    n_evidence: int = 10,
    top_p: float = TAIL_TOP_P,
    name="sampling-tail",
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
