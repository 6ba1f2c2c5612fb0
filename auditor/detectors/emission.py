"""Emission models of the sampled positions: which lossy mechanism explains the samples best (rule 4b/4c).

When the sampled tokens do not follow the reference distribution p, two causes thin the
low-probability tail, and the verdict has to tell them apart (issue 14, item 5):

- **truncation** (DECODING_NONCOMPLIANT): the engine applies a top-p / min-p nobody asked for. The
  tokens kept are renormalised *pro rata*: every surviving token, the argmax and the runners-up alike,
  gains the factor 1 / P(kept);
- **acceptance** (RELAXED_VERIFICATION): lossy speculative verification moves mass from rejected
  tokens *to the draft*, which for any good drafter is mostly the argmax (typical acceptance: tokens
  below a threshold are replaced by the argmax; relaxed thresholds: drafts accepted that the strict
  rule would resample). The runners-up do not gain.

Instead of cut-offs on two aggregate counts (the tail deficit vs the argmax excess), each cause is a
family of emission laws q(x) fitted by maximum likelihood to the emitted tokens, position by position,
and the cause whose best law explains the tokens better is named; the log-likelihood ratio (nats) is
the cause's confidence. Both sides have the same number of free parameters (a shape and a leak), so
the maxima compare directly (equal-dimension AIC). Families (``leak`` w: share of tokens drawn from p
itself, e.g. bonus tokens of a speculative chain, the first token of a request, or references that
differ slightly near a cut):

- truncation, top-p θ: q = (1 − w) p 1[x ∈ N_θ] / P(N_θ) + w p, N_θ the smallest top set with mass ≥ θ;
- truncation, min-p m: the same with N = {x : p(x) ≥ m p(argmax)};
- acceptance, pro rata λ: q = (1 − λ) p + λ 1[x = argmax] (the leak is λ's complement);
- acceptance, single threshold s: q = (1 − w) 1[x = argmax] + w p where p(argmax) >= s, else p (SGLang's
  ``threshold_single`` with an argmax draft);
- truncation, top-k k: the same with N = the k most likely tokens;
- acceptance, threshold τ_i = min(ε, δ e^{−H_i}): q = (1 − w) (p 1[p(x) > τ_i or x = argmax] + 1[x = argmax]
  Σ_{p(y) ≤ τ_i} p(y)) + w p (Medusa / vLLM-V0 typical acceptance with an ideal draft: rejected drafts become
  the argmax; δ = ∞ is a fixed threshold ε).

Only the reference's top-K list is known; the unlisted tokens form one bucket of mass 1 − Σ listed,
treated as a block of tokens no more likely than the last listed one. Only the ratio q(x) / p(x)
enters the likelihood ratio (log p(x) is common to every law). Grid search over the parameters
(:data:`TOP_P_GRID`, :data:`MIN_P_GRID`, :data:`TOP_K_GRID`, :data:`SINGLE_THRESHOLD_GRID`,
:data:`TYPICAL_EPSILON_GRID` × :data:`TYPICAL_DELTA_GRID`, :data:`PRO_RATA_GRID`, :data:`LEAK_GRID`); cost
O(n K × grid), 10–70 ms for a 3,000-token audit (so the tail test records it only when it may be used).

Sources: top-p — Holtzman et al. 2020 (ICLR, "The curious case of neural text degeneration"); min-p —
Nguyen et al. 2024 (arXiv:2407.01082); typical acceptance — Cai et al. 2024 (Medusa, arXiv:2401.10774,
§2.3.1); relaxed thresholds — SGLang ``--speculative-accept-threshold-single/acc``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "LEAK_GRID",
    "MIN_P_GRID",
    "PRO_RATA_GRID",
    "SINGLE_THRESHOLD_GRID",
    "TOP_K_GRID",
    "TOP_P_GRID",
    "TYPICAL_DELTA_GRID",
    "TYPICAL_EPSILON_GRID",
    "emission_fit",
]

#: top-p values θ of the truncation family.
TOP_P_GRID = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98)
#: min-p values m of the truncation family.
MIN_P_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
#: pro-rata shares λ of the acceptance family (λ → 1 is greedy serving, which rule 4a names first).
PRO_RATA_GRID = tuple(float(x) for x in np.round(np.linspace(0.0, 0.98, 50), 4))
#: top-k values of the truncation family (larger k than the listed K are invisible but for the unlisted bucket).
TOP_K_GRID = (2, 3, 5, 10, 20)
#: typical acceptance's hard threshold ε (Medusa / vLLM-V0 default 0.09) ...
TYPICAL_EPSILON_GRID = (0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.09, 0.12, 0.15, 0.2, 0.3)
#: ... and entropy factor δ (default 0.3); inf = a fixed threshold ε whatever the entropy.
TYPICAL_DELTA_GRID = (0.1, 0.3, 1.0, float("inf"))
#: SGLang-style single thresholds s: an argmax draft whose target probability is >= s is always accepted.
SINGLE_THRESHOLD_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: leak shares w (tokens drawn from p itself).
LEAK_GRID = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7)


def _best(ll: np.ndarray) -> tuple[float, int, int]:
    """Maximum of ll [W, S] and its (shape, leak) indices."""
    wi, si = np.unravel_index(int(np.argmax(ll)), ll.shape)
    return float(ll[wi, si]), int(si), int(wi)


def _prefix_mass(p: np.ndarray) -> np.ndarray | None:
    """[K + 1, n] listed mass kept by each prefix, row j = ``(p * (arange(K) < j)).sum(1)``; None unless every
    row of ``p`` [n, K] is sorted descending (no NaN)."""
    if not bool((p[:, 1:] <= p[:, :-1]).all()):
        return None
    n, k = p.shape
    table = np.empty((k + 1, n))
    for j in range(k + 1):
        table[j] = (p * (np.arange(k) < j)).sum(1)
    return table


def _cuts(p: np.ndarray, rank: np.ndarray, family: str, prefix: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, float]]]:
    """Every cut of one family: whether the emitted token survives it and the surviving mass.

    Args:
        p: [n, K] float64 sorted top-K probabilities; rank: [n] int64 (−1 = unlisted bucket, whose tokens are
            taken to be no more likely than the last listed one).
        family: "truncation" (top-p θ, min-p m, top-k k: an engine's sampling defaults) or "acceptance"
            (SGLang's single threshold s: everything to the argmax where p(argmax) >= s; typical acceptance's
            threshold min(ε, δ e^{−H}), δ = inf a fixed threshold ε: every token below it to the argmax).
        prefix: :func:`_prefix_mass` of ``p`` (given when the rows are sorted; then every cut keeps a prefix of
            each row and its mass is read from the table, the same sum of the same row; None: summed per cut).

    Returns:
        kept [S, n] bool, mass [S, n] float64 (> 0), and the S (cut name, parameter) pairs.
    """
    n, k = p.shape
    rows = np.arange(n)
    last = p[rows, np.maximum((p > 0).sum(1) - 1, 0)]
    pos = np.arange(k)
    bucket = np.clip(1.0 - p.sum(1), 0.0, 1.0)
    # keep [S, n, K]: the listed tokens each cut keeps; keep_bucket [S, n]: whether it keeps the unlisted ones
    if family == "truncation":
        # top-p θ: the smallest top set with mass >= θ; never reached → everything (the bucket too)
        reached = np.cumsum(p, 1)[None] >= (np.asarray(TOP_P_GRID) - 1e-12)[:, None, None]
        kn = np.where(reached.any(2), reached.argmax(2) + 1, k + 1)
        cut = np.asarray(MIN_P_GRID)[:, None] * p[None, :, 0]  # min-p m: p >= m p(argmax)
        top_k = np.asarray(TOP_K_GRID)[:, None]
        keep = np.concatenate([pos < kn[:, :, None], p[None] >= cut[:, :, None],
                               np.broadcast_to((pos < top_k)[:, None, :], (top_k.size, n, k))])
        keep_bucket = np.concatenate([kn > k, last[None] >= cut, np.broadcast_to(top_k > k, (top_k.size, n))])
        names = ([("top-p", th) for th in TOP_P_GRID] + [("min-p", m) for m in MIN_P_GRID]
                 + [("top-k", float(kk)) for kk in TOP_K_GRID])
    else:
        # single threshold s: where p(argmax) >= s the argmax draft takes everything
        conf = p[None, :, 0] >= np.asarray(SINGLE_THRESHOLD_GRID)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -(np.where(p > 0, p * np.log(p), 0.0)).sum(1) - bucket * np.log(np.maximum(last, 1e-300))
        e_h = np.exp(-h)
        eps = np.asarray(TYPICAL_EPSILON_GRID)[:, None]
        tau = np.concatenate([np.minimum(eps, delta * e_h[None]) if np.isfinite(delta) else np.broadcast_to(eps, (eps.size, n))
                              for delta in TYPICAL_DELTA_GRID])  # typical: min(ε, δ e^{−H}), δ outer, ε inner
        keep = np.concatenate([np.broadcast_to(~conf[:, :, None], (conf.shape[0], n, k)), p[None] > tau[:, :, None]])
        keep_bucket = np.concatenate([~conf, last[None] > tau])
        names = [("single-threshold", s) for s in SINGLE_THRESHOLD_GRID] + [
            (f"typical δ={delta:g}" if np.isfinite(delta) else "threshold", e)
            for delta in TYPICAL_DELTA_GRID for e in TYPICAL_EPSILON_GRID]
    extra = np.where(keep_bucket, bucket, 0.0)
    if prefix is not None:  # keep = the first L tokens: L = the first dropped one, K when none (argmax kept)
        length = np.maximum(np.where(keep[:, :, -1], k, np.argmin(keep, 2)), 1)
        kept = np.where(rank >= 0, np.clip(rank, 0, k - 1) < length, keep_bucket)
        mass = prefix[length, rows] + extra
    else:
        keep = keep.copy()
        keep[:, :, 0] = True  # the argmax always survives
        kept = np.where(rank >= 0, keep[:, rows, np.clip(rank, 0, k - 1)], keep_bucket)
        mass = (p[None] * keep).sum(2) + extra
    return kept, np.maximum(mass, 1e-12), names


def emission_fit(top_probs: np.ndarray, token_rank: np.ndarray) -> dict[str, Any] | None:
    """Maximum-likelihood fits of the truncation and acceptance families to sampled tokens.

    Args:
        top_probs: [n, K] float64 reference probabilities of the top-K tokens, sorted descending, 0
            padding (``SamplingView.top_probs``); rows sum to at most 1.
        token_rank: [n] int64 rank of the emitted token in that list, −1 when it is not listed.

    Returns:
        None when there is no position or K = 0; else a JSON-able dict: ``log_lik_truncation`` and
        ``log_lik_acceptance`` (nats, each relative to p itself: the best law's Σ log q(x)/p(x)),
        ``log_lik_ratio`` (truncation − acceptance, nats; > 0 favours truncation), ``truncation`` /
        ``acceptance`` (the best law: cut or family, parameter, leak, log_lik), ``n`` (positions).
    """
    p = np.asarray(top_probs, np.float64)
    rank = np.asarray(token_rank, np.int64)
    if p.ndim != 2 or p.shape[0] == 0 or p.shape[1] == 0:
        return None
    is_arg = (rank == 0)[None, None]
    w = np.asarray(LEAK_GRID)[:, None, None]
    p1 = np.maximum(p[:, 0], 1e-12)
    # truncation: survivors renormalised pro rata; acceptance: the cut mass goes to the argmax
    prefix = _prefix_mass(p)
    kept, mass, names_t = _cuts(p, rank, "truncation", prefix)  # [S, n]
    q_t = np.empty((w.shape[0], *mass.shape))  # (1 − w) kept / mass + w [W, S, n], one leak at a time
    for i in range(w.shape[0]):
        q_t[i] = (1.0 - w[i]) * kept / mass + w[i]
    lt, st, wt = _best(np.log(q_t).sum(-1))  # over [W, S]
    kept, mass, names_a = _cuts(p, rank, "acceptance", prefix)
    # where(is_arg, 1 + (1 − w) (1 − mass) / p1, where(kept, 1, w)) [W, S, n], one leak at a time (cache-sized)
    to_arg = np.empty((w.shape[0], *mass.shape))
    gain = 1.0 - mass
    for i in range(w.shape[0]):
        to_arg[i] = np.where(is_arg[0], 1.0 + (1.0 - w[i]) * gain / p1, np.where(kept, 1.0, w[i]))
    la, sa, wa = _best(np.log(to_arg).sum(-1))
    # acceptance, pro rata: every token gives the share λ of its mass to the argmax (relaxed thresholds)
    lam = np.asarray(PRO_RATA_GRID)[:, None]
    ll_pr = np.where(is_arg[0], np.log((1.0 - lam) + lam / p1[None]), np.log(1.0 - lam)).sum(1)
    li = int(np.argmax(ll_pr))
    lp = float(ll_pr[li])
    trunc: dict[str, Any] = {"cut": names_t[st][0], "parameter": names_t[st][1], "leak": LEAK_GRID[wt], "log_lik": lt}
    acc: dict[str, Any] = (
        {"cut": names_a[sa][0], "parameter": names_a[sa][1], "leak": LEAK_GRID[wa], "log_lik": la} if la >= lp else
        {"cut": "pro-rata", "parameter": PRO_RATA_GRID[li], "leak": round(1.0 - PRO_RATA_GRID[li], 4), "log_lik": lp})
    la = max(la, lp)
    return {
        "log_lik_truncation": lt,
        "log_lik_acceptance": la,
        "log_lik_ratio": lt - la,
        "truncation": trunc,
        "acceptance": acc,
        "n": int(p.shape[0]),
    }
