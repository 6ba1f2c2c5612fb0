"""Speculation fingerprint: does a provider speculate, and how many tokens does it accept per step?

Speculative decoding (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318) emits 1..k+1 tokens per target forward pass ("verification step"): the
accepted drafts plus one corrected/bonus token. A streaming server that flushes after each step
sends those tokens together, so the *stream structure* carries the step structure:

- **step chunks** (the vLLM/SGLang default: one SSE chunk per engine step) — tokens per chunk
  *are* the tokens per step;
- **token chunks** (a server that splits every step into one-token chunks) — the tokens of one
  step arrive back to back (near-zero gaps) and steps are separated by a forward pass; a
  two-component Gaussian mixture on log gaps separates the two and steps are counted as long gaps;
- **time-batched chunks** (a server that flushes whatever it has every N ms) — the gaps are the
  batching interval and the tokens per chunk measure throughput, not steps: the fingerprint says
  "cannot tell" (``detected = None``) rather than guess. Told apart from step chunks by what a
  step stream must look like: its first chunk is the prefill's single token, no chunk exceeds
  ``MAX_STEP_TOKENS``, and step sizes fall off below the largest size (a step stops at its first
  rejected draft), where sums of several steps spread around their mean.

Whether a drafter is at work shows most where a good drafter must win: on repetition prompts
(copy/rewrite a given passage) an n-gram or model drafter is accepted for long runs, on open chat
it is not. The estimate is reported overall and per workload, with a bootstrap 95% interval over
responses (Efron & Tibshirani 1993, percentile interval of the ratio estimator
sum(tokens) / sum(steps)). This is evidence, not a verdict: a provider whose step size does not
depend on predictability (e.g. an EAGLE drafter on a GPU) is still detected from its step size
alone, and a provider that paces its stream evenly hides its steps.

Inputs are per-response stream timings as the probe client records them
(``probes.client.AttemptRecord``: ``chunk_gaps_s``, ``tokens_per_chunk``; token-bearing chunks
only), plus the workload and the completion-token count from ``usage`` when known. Pure
numpy/scipy: no store, no HTTP, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from scipy import stats

__all__ = [
    "DETECT_THRESHOLD",
    "DETECT_THRESHOLD_TOKEN_CHUNKS",
    "FLAT_MAX_RATIO",
    "MAX_STEP_TOKENS",
    "PREDICTABLE_WORKLOADS",
    "SpeculationEstimate",
    "StreamTiming",
    "accepted_by_predictability",
    "estimate_speculation",
    "fit_log_gap_mixture",
    "predictability_text",
    "speculation_line",
    "timing_from_records",
]

#: Mean tokens per verification step above which a provider "speculates" (plain decoding is 1.0;
#: detokenizer merges and stop-string hold-back add a few percent at most).
DETECT_THRESHOLD = 1.1
#: Token-chunk mode: decision threshold. Event-loop and network jitter deliver separate one-token
#: chunks of plain decoding together now and then; on a loaded loopback that made plain decoding
#: look like 1.02-1.17 tokens per step, so one-token streams need a wider margin.
DETECT_THRESHOLD_TOKEN_CHUNKS = 1.25
#: Workloads where a good drafter must win (the prompts ask to copy or lightly rewrite a passage).
PREDICTABLE_WORKLOADS = ("repetition",)
#: The accepted length "does not move with predictability" when the bootstrap 95% interval of its ratio,
#: predictable over other prompts, lies within [1 / FLAT_MAX_RATIO, FLAT_MAX_RATIO] (under a tenth longer
#: or shorter on repetition than on chat; :func:`accepted_by_predictability`).
FLAT_MAX_RATIO = 1.1
#: Responses of each kind (predictable, other) from which :func:`accepted_by_predictability` gives the ratio's
#: interval: a short audit streams few repetition answers (2 of 15 at 500 tokens of the default suite, tiny model),
#: and a fixed accepted length shows in every response alike. The decisions above keep 3.
_MIN_CONTRAST_RESPONSES = 2
#: Gaps below this (s) are clamped before taking logs (timer resolution; loopback coalescing).
_GAP_FLOOR_S = 1e-6
#: Minimum responses / gaps to say anything.
_MIN_RESPONSES = 2
_MIN_GAPS = 8
#: Token-chunk mode: most chunks carry one token and the log gaps are bimodal with a short
#: component at least this many times faster than the long one.
_SPLIT_MIN_SINGLE = 0.9
_SPLIT_MIN_RATIO = 5.0
_SPLIT_MIN_WEIGHT = 0.05
_SPLIT_MIN_ASHMAN_D = 2.0
#: Time-batched mode: regular gaps (IQR / median at most this) while chunks on low-predictability
#: prompts carry this many tokens on average.
_BATCH_MAX_IQR_RATIO = 0.15
_BATCH_MIN_TOKENS = 1.5
_BATCH_MIN_BIG_FRACTION = 0.05
#: Step chunks pile up at 1 token (first draft rejected, probability 1 - a) or at the draft length
#: + 1 (all k accepted, a^k): max(1 - a, a^k) >= 0.19 for every a when k <= 8, so at least this
#: fraction of single-token chunks, or of chunks at the largest size; time-batched chunks, sums of
#: several steps, spread around their mean instead.
_STEP_MIN_SINGLE = 0.15
_STEP_MIN_AT_CAP = 0.15
#: A step stops at its first rejected draft, so below the largest size the step sizes fall off:
#: P(size = j) = E[a^(j-1) (1 - a)] is non-increasing in j for any mixture of per-step acceptance
#: rates a, and a size m below the largest is at most as common as each smaller size. Tree
#: drafters whose acceptance varies with depth (EAGLE-2/3) bend this (at most 1.8x the mean of the
#: smaller sizes for depth-wise rates 0.97, 0.95, ..., 0.75); a size more than ``_STEP_MAX_PEAK_RATIO`` times as
#: common as the mean of the smaller sizes (one-sided binomial test at ``_BATCH_PEAK_ALPHA``, last
#: chunk of each response left out: max_tokens truncates it) is a steady stream flushed by time.
_STEP_MAX_PEAK_RATIO = 4.0
_BATCH_PEAK_ALPHA = 0.01
#: The prefill forward pass emits exactly one token (drafts are proposed after it and verified from
#: the second step on: Leviathan et al. 2023 Alg. 1; vLLM, SGLang and llama.cpp stream it alone), so
#: a step-flushed stream's first token-bearing chunk holds one token. When more than this fraction
#: of responses (at least ``_FIRST_CHUNK_MIN_RESPONSES``) open with a bigger chunk, the server
#: gathered output before flushing: chunks are not steps. Detokenizer hold-back of an incomplete
#: UTF-8 first token merges two tokens now and then, hence a majority rule, not "any".
_FIRST_CHUNK_MAX_MULTI_FRACTION = 0.5
_FIRST_CHUNK_MIN_RESPONSES = 3
#: No verification step accepts more tokens than this (draft lengths and tree depths in
#: vLLM/SGLang/EAGLE configurations stay below it); bigger chunks are buffered output.
MAX_STEP_TOKENS = 16


@dataclass(frozen=True)
class StreamTiming:
    """The timing of one streamed response (token-bearing chunks only).

    Attributes:
        gaps_s: ``[n_chunks - 1]`` float seconds between successive chunk arrivals.
        tokens_per_chunk: ``[n_chunks]`` int tokens per chunk (exact when the response carried
            logprobs; otherwise 1 per non-empty chunk, a lower bound — see ``n_tokens``).
        workload: the probe's workload (``code``, ``math``, ``chat``, ``repetition``) or None.
        n_tokens: completion tokens from ``usage`` (exact total) or None.
        ttft_s: time to the first chunk (s), reported only.
        key: the probe key, for the evidence.
    """

    gaps_s: Sequence[float]
    tokens_per_chunk: Sequence[int]
    workload: str | None = None
    n_tokens: int | None = None
    ttft_s: float | None = None
    key: str = ""


@dataclass
class SpeculationEstimate:
    """The fingerprint, shaped like the JSON report's ``speculation`` object.

    Attributes:
        detected: True (speculates), False (no speculation), None (cannot tell).
        mean_accepted_tokens_per_step: mean tokens emitted per verification step (accepted drafts
            + 1; plain decoding = 1.0) over all usable responses, or None when not estimable.
        ci95: bootstrap 95% interval of that mean, or None.
        evidence: what was used: ``mode`` (``step-chunks``, ``token-chunks``, ``time-batched``,
            ``insufficient``), counts, per-workload means, gap statistics, mixture fit, reasons.
    """

    detected: bool | None
    mean_accepted_tokens_per_step: float | None
    ci95: tuple[float, float] | None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict ``{detected, mean_accepted_tokens_per_step, ci95, evidence}``."""
        return {
            "detected": self.detected,
            "mean_accepted_tokens_per_step": _r(self.mean_accepted_tokens_per_step),
            "ci95": None if self.ci95 is None else [_r(self.ci95[0]), _r(self.ci95[1])],
            "evidence": self.evidence,
        }


def _r(x: float | None, nd: int = 4) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


# -- inputs ---------------------------------------------------------------------------------------

def timing_from_records(records: Iterable[Mapping[str, object]]) -> list[StreamTiming]:
    """Build :class:`StreamTiming` items from dict-like records.

    Each record may carry ``chunk_gaps_s``, ``tokens_per_chunk``, ``workload``, ``n_tokens`` (or
    ``usage`` with ``completion_tokens``), ``ttft_s`` and ``key`` — e.g. ``AttemptRecord.to_dict()``
    plus the probe's workload, or a ``probe_attempts`` row joined with its probe. Records without
    chunks are skipped; malformed ones are kept and rejected (with a reason) by
    :func:`estimate_speculation`.
    """
    out = []
    for rec in records:
        tpc = rec.get("tokens_per_chunk")
        if not tpc:
            continue
        n_tok = rec.get("n_tokens")
        usage = rec.get("usage")
        if n_tok is None and isinstance(usage, Mapping):
            n_tok = usage.get("completion_tokens")
        out.append(StreamTiming(
            # unchecked here: estimate_speculation rejects malformed values with a reason
            gaps_s=list(cast(Iterable[float], rec.get("chunk_gaps_s") or [])),
            tokens_per_chunk=list(cast(Iterable[int], tpc)),
            workload=rec.get("workload"),  # type: ignore[arg-type]
            n_tokens=n_tok if isinstance(n_tok, int) else None,
            ttft_s=rec.get("ttft_s") if isinstance(rec.get("ttft_s"), (int, float)) else None,  # type: ignore[arg-type]
            key=str(rec.get("key") or rec.get("probe_key") or ""),
        ))
    return out


@dataclass
class _Clean:
    gaps: np.ndarray      # [n_chunks - 1] float64 s
    tpc: np.ndarray       # [n_chunks] int64
    tokens: int           # exact total tokens
    exact: bool           # tokens_per_chunk sums to tokens
    workload: str | None
    key: str


def _clean(s: StreamTiming) -> tuple[_Clean | None, str | None]:
    """Validate one response; returns (clean, None) or (None, reason)."""
    try:
        g = np.asarray(list(s.gaps_s), dtype=np.float64)
        c = np.asarray(list(s.tokens_per_chunk), dtype=np.float64)
    except (TypeError, ValueError):
        return None, "non-numeric gaps_s or tokens_per_chunk"
    if c.ndim != 1 or c.size == 0:
        return None, "no token-bearing chunks"
    if g.ndim != 1 or g.size != c.size - 1:
        return None, f"gaps_s has {g.size} entries for {c.size} chunks (expected {c.size - 1})"
    if not np.all(np.isfinite(g)) or np.any(g < 0):
        return None, "negative or non-finite gap"
    if not np.all(np.isfinite(c)) or np.any(c < 1) or np.any(c != np.round(c)):
        return None, "tokens_per_chunk must be integers >= 1"
    total = int(c.sum())
    n = s.n_tokens
    exact = True
    if n is not None:
        if not isinstance(n, (int, np.integer)) or n < c.size:
            return None, f"n_tokens={n!r} is fewer than the {c.size} token-bearing chunks"
        # usage may count a final EOS/stop token the stream never showed: allow one extra
        exact = int(n) - total in (0, 1)
        if not exact:
            total = int(n)
    return _Clean(g, c.astype(np.int64), total, exact, s.workload, s.key), None


# -- mixture on log gaps --------------------------------------------------------------------------

def fit_log_gap_mixture(gaps_s: np.ndarray, *, iters: int = 300, tol: float = 1e-8) -> dict[str, Any]:
    """Fit one and two Gaussian components to ``log(gaps)`` by EM (maximum likelihood).

    Args:
        gaps_s: ``[n]`` float gaps in seconds (clamped below at 1 µs), n >= 4.

    Returns:
        dict with ``weights`` [2], ``means_log`` [2] (natural log s, ascending), ``sds_log`` [2],
        ``median_gap_s`` [2] (= exp(mean)), ``threshold_s`` (gap where both posteriors are 0.5,
        or None), ``ashman_d`` (separation; > 2 means cleanly separated modes), ``bic_1``,
        ``bic_2`` (lower is better) and ``n``.

    Raises:
        ValueError: fewer than 4 gaps.
    """
    x = np.log(np.maximum(np.asarray(gaps_s, dtype=np.float64), _GAP_FLOOR_S))
    n = x.size
    if n < 4:
        raise ValueError(f"fit_log_gap_mixture needs at least 4 gaps, got {n}")
    var_floor = 1e-4  # (log units)^2: ~1% relative spread
    mu1, s1 = float(x.mean()), max(float(x.std()), math.sqrt(var_floor))
    ll1 = float(stats.norm.logpdf(x, mu1, s1).sum())
    lo, hi = np.quantile(x, [0.1, 0.9])
    w = np.array([0.5, 0.5])
    mu = np.array([lo, hi], dtype=np.float64)
    var = np.full(2, max(float(x.var()) / 4.0, var_floor))
    ll_old = -np.inf
    ll2 = ll1
    for _ in range(iters):
        logp = np.stack([np.log(max(w[j], 1e-12)) + stats.norm.logpdf(x, mu[j], math.sqrt(var[j]))
                         for j in range(2)])  # [2, n]
        lse = np.logaddexp(logp[0], logp[1])
        ll2 = float(lse.sum())
        r = np.exp(logp - lse)  # [2, n] responsibilities
        nk = r.sum(axis=1) + 1e-12
        w = nk / n
        mu = (r @ x) / nk
        var = np.maximum((r * (x[None, :] - mu[:, None]) ** 2).sum(axis=1) / nk, var_floor)
        if ll2 - ll_old < tol * max(1.0, abs(ll2)):
            break
        ll_old = ll2
    order = np.argsort(mu)
    w, mu, var = w[order], mu[order], var[order]
    sd = np.sqrt(var)
    d = float(abs(mu[1] - mu[0]) / math.sqrt((var[0] + var[1]) / 2.0))
    thr = None
    grid = np.linspace(mu[0], mu[1], 512)
    post = np.log(w[1]) + stats.norm.logpdf(grid, mu[1], sd[1]) - (np.log(w[0]) + stats.norm.logpdf(grid, mu[0], sd[0]))
    cross = np.nonzero(np.diff(np.sign(post)) > 0)[0]
    if cross.size:
        thr = float(math.exp(grid[cross[0]]))
    return {
        "weights": [float(v) for v in w],
        "means_log": [float(v) for v in mu],
        "sds_log": [float(v) for v in sd],
        "median_gap_s": [float(math.exp(v)) for v in mu],
        "threshold_s": thr,
        "ashman_d": d,
        "bic_1": -2 * ll1 + 2 * math.log(n),
        "bic_2": -2 * ll2 + 5 * math.log(n),
        "n": int(n),
    }


# -- estimation -----------------------------------------------------------------------------------

def _ratio_ci(tokens: np.ndarray, steps: np.ndarray, rng: np.random.Generator, n_boot: int) -> tuple[float, float, float]:
    """sum(tokens)/sum(steps) with a percentile bootstrap 95% interval over responses."""
    m = float(tokens.sum() / steps.sum())
    n = tokens.size
    if n < 2:
        return m, math.nan, math.nan
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)  # [B, n]
    bt = counts @ tokens
    bs = counts @ steps
    ratios = bt / np.maximum(bs, 1)
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    return m, float(lo), float(hi)


def _insufficient(reason: str, **ev: object) -> SpeculationEstimate:
    return SpeculationEstimate(None, None, None, {"mode": "insufficient", "reason": reason, **ev})


def estimate_speculation(
    streams: Sequence[StreamTiming],
    *,
    threshold: float = DETECT_THRESHOLD,
    predictable_workloads: Sequence[str] = PREDICTABLE_WORKLOADS,
    n_boot: int = 2000,
    seed: int = 0,
) -> SpeculationEstimate:
    """Estimate whether the provider speculates and its mean accepted tokens per step.

    Steps per response: the chunks (step-chunk mode) or 1 + the long gaps (token-chunk mode, a
    two-component mixture on log gaps; see the module doc). The mean is sum(tokens)/sum(steps)
    over responses with a percentile bootstrap 95% interval (resampling responses). The decision
    uses the predictable workloads when at least 3 such responses exist (else all responses):
    ``detected = True`` when the interval's lower end exceeds ``threshold``, ``False`` when its
    upper end is below it, ``None`` otherwise or when the stream is time-batched or too short.

    Args:
        streams: one :class:`StreamTiming` per streamed response (malformed ones are rejected and
            listed in ``evidence["rejected"]``, never raised).
        threshold: tokens per step separating speculation from plain decoding (default 1.1).
        predictable_workloads: workloads where a good drafter must win.
        n_boot: bootstrap resamples (>= 100).
        seed: bootstrap RNG seed (results are deterministic given the inputs).

    Returns:
        SpeculationEstimate (``.to_dict()`` is the report's ``speculation`` object).

    Raises:
        ValueError: ``threshold`` <= 1 or ``n_boot`` < 100 (caller errors, not provider data).
    """
    if not threshold > 1.0:
        raise ValueError(f"threshold={threshold} must be > 1 (plain decoding emits 1 token per step)")
    if n_boot < 100:
        raise ValueError(f"n_boot={n_boot} must be >= 100")
    rng = np.random.default_rng(seed)
    clean: list[_Clean] = []
    rejected: list[dict[str, Any]] = []
    for s in streams:
        c, reject_reason = _clean(s)
        if c is None:
            rejected.append({"key": s.key, "reason": reject_reason})
        else:
            clean.append(c)
    rej_ev = {"rejected": rejected[:20], "n_rejected": len(rejected)}
    if len(clean) < _MIN_RESPONSES:
        return _insufficient(f"{len(clean)} usable streamed responses (need {_MIN_RESPONSES})", **rej_ev)
    all_gaps = np.concatenate([c.gaps for c in clean])
    if all_gaps.size < _MIN_GAPS:
        return _insufficient(f"{all_gaps.size} chunk gaps (need {_MIN_GAPS}); ask for longer completions", **rej_ev)
    all_tpc = np.concatenate([c.tpc for c in clean])
    exact = all(c.exact for c in clean)
    single = float(np.mean(all_tpc == 1)) if exact else float(
        sum(c.tpc.size for c in clean if c.tokens == c.tpc.size) / max(1, all_tpc.size))
    med = float(np.median(all_gaps))
    q25, q75 = np.quantile(all_gaps, [0.25, 0.75])
    iqr_ratio = float((q75 - q25) / med) if med > 0 else math.inf
    ev: dict[str, Any] = {
        "n_responses": len(clean),
        "n_chunks": int(all_tpc.size),
        "n_tokens": int(sum(c.tokens for c in clean)),
        "tokens_per_chunk_exact": exact,
        "single_token_chunk_fraction": _r(single),
        "mean_tokens_per_chunk": _r(sum(c.tokens for c in clean) / all_tpc.size),
        "gap_median_s": _r(med, 6),
        "gap_iqr_over_median": _r(iqr_ratio),
        "threshold": threshold,
        **rej_ev,
    }

    # 1. token chunks split from steps? (near-zero gaps inside a step, forward-pass gaps between)
    mode = "step-chunks"
    step_threshold_s: float | None = None
    if single >= _SPLIT_MIN_SINGLE:
        fit = fit_log_gap_mixture(all_gaps)
        ev["gap_mixture"] = {k: (_r(v, 6) if isinstance(v, float) else
                                 [_r(u, 6) for u in v] if isinstance(v, list) else v) for k, v in fit.items()}
        ratio = fit["median_gap_s"][1] / max(fit["median_gap_s"][0], _GAP_FLOOR_S)
        if (fit["threshold_s"] is not None and fit["ashman_d"] >= _SPLIT_MIN_ASHMAN_D and ratio >= _SPLIT_MIN_RATIO
                and min(fit["weights"]) >= _SPLIT_MIN_WEIGHT and fit["bic_2"] < fit["bic_1"] - 10):
            mode = "token-chunks"
            # between the modes: the posterior crossing hugs a tight short mode, so take at least
            # the geometric midpoint of the two component medians
            step_threshold_s = max(fit["threshold_s"], math.sqrt(fit["median_gap_s"][0] * fit["median_gap_s"][1]))
    # 2. time-batched? (chunks hold what accumulated in an interval, not one verification step)
    if mode == "step-chunks":
        low = [c for c in clean if c.workload not in predictable_workloads] or clean
        low_tpc = sum(c.tokens for c in low) / sum(c.tpc.size for c in low)
        big = float(np.mean(all_tpc > MAX_STEP_TOKENS)) if exact else 0.0
        ev["mean_tokens_per_chunk_unpredictable"] = _r(low_tpc)
        ev["chunks_over_max_step_fraction"] = _r(big)
        why = []
        if big >= _BATCH_MIN_BIG_FRACTION:
            why.append(f"{big:.0%} of chunks carry more than {MAX_STEP_TOKENS} tokens, more than one "
                       "verification step can accept")
        frac1 = float(np.mean(all_tpc == 1))
        frac_cap = float(np.mean(all_tpc == all_tpc.max()))
        ev["chunks_at_max_fraction"] = _r(frac_cap)
        step_like = frac1 >= _STEP_MIN_SINGLE or frac_cap >= _STEP_MIN_AT_CAP
        multi_first = sum(int(c.tpc[0]) > 1 for c in clean)
        ev["first_chunk_multi_token_responses"] = multi_first
        if (exact and len(clean) >= _FIRST_CHUNK_MIN_RESPONSES
                and multi_first > _FIRST_CHUNK_MAX_MULTI_FRACTION * len(clean)):
            why.append(f"the first chunk of {multi_first} of {len(clean)} responses carries more than one token "
                       f"(median {float(np.median([c.tpc[0] for c in clean])):.0f}): a prefill emits exactly one "
                       "token, so the server gathered output before flushing")
        peak = _interior_peak(clean) if exact else None
        if peak is not None:
            ev["interior_peak"] = {"size": peak[0], "chunks": peak[1], "smaller_chunks": peak[2],
                                   "p_value": _r(peak[3], 6)}
            if peak[3] < _BATCH_PEAK_ALPHA:
                why.append(f"below the largest chunk size, {peak[0]}-token chunks are too common ({peak[1]} chunks "
                           f"against {peak[2]} smaller ones; p={peak[3]:.1e}): a verification step stops at its "
                           "first rejected draft, so step sizes fall off from 1")
        if low_tpc >= _BATCH_MIN_TOKENS and exact and not step_like:
            why.append(f"chunk sizes spread around {low_tpc:.1f} tokens ({frac1:.0%} single-token, {frac_cap:.0%} at "
                       f"the largest size {int(all_tpc.max())}): verification steps pile up at 1 (rejected draft) "
                       "or at the draft length (all accepted)")
        elif low_tpc >= _BATCH_MIN_TOKENS and not exact and iqr_ratio <= _BATCH_MAX_IQR_RATIO:
            why.append(f"chunks arrive at a regular interval (~{med * 1e3:.0f} ms, IQR/median "
                       f"{iqr_ratio:.2f}) with {low_tpc:.1f} tokens each even on unpredictable prompts")
        contrast = _contrast(clean, predictable_workloads, rng, n_boot)
        if contrast is not None:
            ev["predictable_over_other_ci95"] = [_r(contrast[1]), _r(contrast[2])]
            if low_tpc >= _BATCH_MIN_TOKENS and contrast[1] <= 1.0:
                why.append(f"{low_tpc:.1f} tokens per chunk on unpredictable prompts and no more on "
                           "predictable ones: chunk size does not follow predictability")
        if why:
            mode = "time-batched"
            ev["reason"] = "; ".join(why) + ": chunks are not verification steps; cannot tell"
    ev["mode"] = mode
    if mode == "time-batched":
        ev["batching_interval_s"] = _r(med, 6)
        ev["tokens_per_s_by_workload"] = _throughput_by_workload(clean)
        ev["by_predictability"] = _by_predictability(clean, predictable_workloads, "chunk", None, None, seed, n_boot)
        return SpeculationEstimate(None, None, None, ev)

    tau, tau_fit = _step_time(clean, step_threshold_s)
    ev["by_predictability"] = _by_predictability(clean, predictable_workloads, "step", step_threshold_s, tau, seed,
                                               n_boot)
    if step_threshold_s is not None:
        ev["step_gap_threshold_s"] = _r(step_threshold_s, 6)
        ev["gap_vs_group_size"] = tau_fit
        n_groups = sum(_groups(c, step_threshold_s)[0].size for c in clean)
        ev["groups_split_as_bunched_steps"] = int(sum(_steps(c, step_threshold_s, tau) for c in clean) - n_groups)
    tokens = np.array([c.tokens for c in clean], dtype=np.float64)
    steps = np.array([_steps(c, step_threshold_s, tau) for c in clean], dtype=np.float64)
    m, lo, hi = _ratio_ci(tokens, steps, rng, n_boot)
    by_wl: dict[str, dict[str, Any]] = {}
    for wl in sorted({c.workload or "unknown" for c in clean}):
        idx = np.array([(c.workload or "unknown") == wl for c in clean])
        mw, lw, hw = _ratio_ci(tokens[idx], steps[idx], rng, n_boot)
        by_wl[wl] = {"mean": _r(mw), "ci95": [_r(lw), _r(hw)], "n_responses": int(idx.sum())}
    ev["by_workload"] = by_wl
    pred = np.array([c.workload in predictable_workloads for c in clean])
    contrast = _contrast(clean, predictable_workloads, rng, n_boot, step_threshold_s, tau)
    if contrast is not None:
        ev["predictable_over_other"] = _r(contrast[0])
        ev["predictable_over_other_ci95"] = [_r(contrast[1]), _r(contrast[2])]
    ev["position_spearman"] = _position_trend(clean, step_threshold_s, tau)
    if pred.sum() >= 3:
        basis, (_, dlo, dhi) = "predictable", _ratio_ci(tokens[pred], steps[pred], rng, n_boot)
    else:
        basis, dlo, dhi = "all", lo, hi
    ev["decision_basis"] = basis
    if mode == "token-chunks":
        threshold = max(threshold, DETECT_THRESHOLD_TOKEN_CHUNKS)
        ev["threshold"] = threshold
    if not math.isfinite(dlo):
        detected = None
        ev["reason"] = "one response only: no interval"
    elif dlo > threshold:
        detected = True
        ev["reason"] = f"{basis} prompts: 95% interval [{dlo:.2f}, {dhi:.2f}] tokens/step above {threshold}"
    elif dhi < threshold:
        detected = False
        ev["reason"] = f"{basis} prompts: 95% interval [{dlo:.2f}, {dhi:.2f}] tokens/step below {threshold}"
    else:
        detected = None
        ev["reason"] = f"{basis} prompts: 95% interval [{dlo:.2f}, {dhi:.2f}] tokens/step straddles {threshold}"
    ci = (lo, hi) if math.isfinite(lo) else None
    return SpeculationEstimate(detected, m, ci, ev)


def _interior_peak(clean: list[_Clean]) -> tuple[int, int, int, float] | None:
    """The chunk size below the largest that is most over-represented against the smaller sizes.

    Chunks: every response's chunks but its last (max_tokens or a stop truncates it). For each
    size m with 1 < m < largest, the one-sided binomial p-value of ``count(m)`` among
    ``count(m) + count(< m)`` under P(m) <= ``_STEP_MAX_PEAK_RATIO`` x the mean of P(j) over j < m
    (success probability R / (R + m - 1)); the smallest, Bonferroni-adjusted over the sizes tested.

    Returns:
        ``(m, count(m), count(< m), p_adjusted)`` for that size, or None when there is no size
        strictly between 1 and the largest.
    """
    body = np.concatenate([c.tpc[:-1] for c in clean])
    if body.size == 0:
        return None
    cap = int(body.max())
    sizes, counts = np.unique(body[(body > 1) & (body < cap)], return_counts=True)
    best: tuple[int, int, int, float] | None = None
    for m, n_m in zip(sizes.tolist(), counts.tolist(), strict=True):
        n_below = int(np.sum(body < m))
        p0 = _STEP_MAX_PEAK_RATIO / (_STEP_MAX_PEAK_RATIO + m - 1)
        p = float(stats.binomtest(int(n_m), int(n_m) + n_below, p0, alternative="greater").pvalue)
        if best is None or p < best[3]:
            best = (int(m), int(n_m), n_below, p)
    if best is None:
        return None
    return best[0], best[1], best[2], min(1.0, best[3] * len(sizes))


def _contrast(clean: list[_Clean], predictable: Sequence[str], rng: np.random.Generator, n_boot: int,
              thr_s: float | None = None, tau_s: float | None = None, *,
              min_each: int = 3) -> tuple[float, float, float] | None:
    """Ratio of mean tokens per step, predictable over other prompts, with a bootstrap 95% interval
    (>= ``min_each`` responses in each group, else None)."""
    pred = [c for c in clean if c.workload in predictable]
    other = [c for c in clean if c.workload not in predictable]
    if len(pred) < min_each or len(other) < min_each:
        return None
    tp = np.array([c.tokens for c in pred], float)
    sp = np.array([_steps(c, thr_s, tau_s) for c in pred], float)
    to = np.array([c.tokens for c in other], float)
    so = np.array([_steps(c, thr_s, tau_s) for c in other], float)
    cp = rng.multinomial(len(pred), np.full(len(pred), 1 / len(pred)), size=n_boot)
    co = rng.multinomial(len(other), np.full(len(other), 1 / len(other)), size=n_boot)
    r = ((cp @ tp) / (cp @ sp)) / ((co @ to) / (co @ so))
    lo, hi = np.quantile(r, [0.025, 0.975])
    return float((tp.sum() / sp.sum()) / (to.sum() / so.sum())), float(lo), float(hi)


def _groups(c: _Clean, thr_s: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Token-chunk mode: (tokens per group of chunks joined by short gaps, gap before each group;
    NaN for the first group). Step-chunk mode: the chunks themselves."""
    if thr_s is None:
        return c.tpc.astype(np.float64), np.concatenate([[np.nan], c.gaps])
    starts = np.concatenate([[0], np.nonzero(c.gaps > thr_s)[0] + 1])
    bounds = np.concatenate([starts, [c.tpc.size]])
    cs = np.concatenate([[0], np.cumsum(c.tpc)])
    sizes = (cs[bounds[1:]] - cs[bounds[:-1]]).astype(np.float64)
    before = np.concatenate([[np.nan], c.gaps[starts[1:] - 1]])
    return sizes, before


def _step_time(clean: list[_Clean], thr_s: float | None) -> tuple[float | None, dict[str, Any]]:
    """Token-chunk mode: is a group of back-to-back chunks one step, or several steps bunched?

    Regress the gap before each group on its size (Theil-Sen, robust): gap = a + b (size - 1).
    Bunched single-token steps take one step time per token (b ~ a); a speculative step takes one
    forward pass whatever it emits (b << a; verification of longer drafts costs a little more).
    Returns (a, fit) when b >= a / 2 — then groups are split into ``floor(gap / a)`` steps — else
    (None, fit): groups are steps.
    """
    if thr_s is None:
        return None, {}
    xs, ys = [], []
    for c in clean:
        sizes, before = _groups(c, thr_s)
        xs.extend((sizes[1:] - 1).tolist())
        ys.extend(before[1:].tolist())
    x, y = np.asarray(xs), np.asarray(ys)
    if x.size < 5 or np.all(x == x[0]):
        return None, {}
    res = stats.theilslopes(y, x)
    a, b = float(res.intercept), float(res.slope)
    fit = {"gap_at_one_token_s": _r(a, 6), "gap_per_extra_token_s": _r(b, 6)}
    if a > 0 and b >= 0.5 * a:
        return a, {**fit, "groups_look": "bunched single-token steps"}
    return None, {**fit, "groups_look": "one step each"}


def _step_sizes(c: _Clean, thr_s: float | None, tau_s: float | None = None) -> np.ndarray:
    """Tokens per verification step, in order.

    Token-chunk mode: a group of chunks joined by near-zero gaps is one step unless the gap before
    it spans several step times ``tau_s`` (the median gap between groups) — then several steps were delivered together (event-loop
    or network bunching), and the group counts ``floor(gap / tau)`` steps (at most one per
    token), spread evenly.
    """
    sizes, before = _groups(c, thr_s)
    if thr_s is None or tau_s is None or tau_s <= 0:
        return sizes
    out: list[float] = []
    for n, g in zip(sizes, before, strict=True):
        k = 1 if not np.isfinite(g) else int(min(n, max(1, math.floor(g / tau_s))))
        out.extend([n / k] * k)
    return np.asarray(out, dtype=np.float64)


def _steps(c: _Clean, thr_s: float | None, tau_s: float | None = None) -> int:
    """Verification steps in one response (see :func:`_step_sizes`)."""
    if thr_s is None:
        return int(c.tpc.size)
    return int(_step_sizes(c, thr_s, tau_s).size)


def _position_trend(clean: list[_Clean], thr_s: float | None, tau_s: float | None = None) -> float | None:
    """Spearman correlation of step size with relative position in the response (pooled)."""
    xs, ys = [], []
    for c in clean:
        if not c.exact:
            continue
        sz = _step_sizes(c, thr_s, tau_s)
        if sz.size < 2:
            continue
        xs.append(np.linspace(0.0, 1.0, sz.size))
        ys.append(sz)
    if not xs:
        return None
    x, y = np.concatenate(xs), np.concatenate(ys)
    if np.all(y == y[0]):
        return None
    rho = stats.spearmanr(x, y).statistic
    return _r(float(rho))


def _by_predictability(clean: list[_Clean], predictable: Sequence[str], per: str, thr_s: float | None,
                       tau_s: float | None, seed: int, n_boot: int) -> dict[str, Any] | None:
    """The accepted length per workload and its ratio, predictable over other prompts, for
    :func:`accepted_by_predictability`: ``{"per", "by_workload": {workload: {"mean", "n_responses"}},
    "predictable_over_other", "ci95", "n_predictable", "n_other"}`` — tokens per step (``per`` "step") or, in
    time-batched mode, per chunk (``per`` "chunk"; ``thr_s`` and ``tau_s`` None); the interval a percentile
    bootstrap over responses from ``_MIN_CONTRAST_RESPONSES`` of each kind (its own RNG, ``seed + 1``, so that
    the other figures do not move), None below that; the whole None without responses of both kinds."""
    n_pred = sum(c.workload in predictable for c in clean)
    if n_pred == 0 or n_pred == len(clean):
        return None
    per_wl: dict[str, dict[str, Any]] = {}
    for wl in sorted({c.workload or "unknown" for c in clean}):
        group = [c for c in clean if (c.workload or "unknown") == wl]
        per_wl[wl] = {"mean": _r(sum(c.tokens for c in group) / sum(_steps(c, thr_s, tau_s) for c in group)),
                      "n_responses": len(group)}
    con = _contrast(clean, predictable, np.random.default_rng(seed + 1), n_boot, thr_s, tau_s,
                    min_each=_MIN_CONTRAST_RESPONSES)
    return {"per": per, "by_workload": per_wl, "predictable_over_other": None if con is None else _r(con[0]),
            "ci95": None if con is None else [_r(con[1]), _r(con[2])], "n_predictable": n_pred,
            "n_other": len(clean) - n_pred}


def _throughput_by_workload(clean: list[_Clean]) -> dict[str, float | None]:
    """Tokens per second of streaming (first to last chunk) per workload."""
    out: dict[str, float | None] = {}
    for wl in sorted({c.workload or "unknown" for c in clean}):
        tok = sum(c.tokens - int(c.tpc[0]) for c in clean if (c.workload or "unknown") == wl)
        t = sum(float(c.gaps.sum()) for c in clean if (c.workload or "unknown") == wl)
        out[wl] = _r(tok / t, 2) if t > 0 else None
    return out


def accepted_by_predictability(spec: Mapping[str, object] | None) -> dict[str, Any] | None:
    """The accepted length on predictable against unpredictable prompts, from a ``speculation`` object.

    A verifier accepts a draft when the target agrees with it, so its accepted length per step grows where the
    text is predictable (repetition prompts: copy a passage) over open chat; an engine that emits a fixed number
    of drafts per step without verifying them (synthetic acceptance) shows the same length on both. Read from the
    fingerprint's ``evidence["by_predictability"]``: tokens per verification step per workload (``per`` "step"),
    or, where the fingerprint could not tell chunks from steps (time-batched), tokens per stream chunk (``per``
    "chunk": steps only where other evidence shows the chunks end at verification steps, e.g. verdict rule 1d).

    Args:
        spec: ``SpeculationEstimate.to_dict()`` (or the stored summary's ``speculation``); None or malformed → None.

    Returns:
        ``{"per": "step" | "chunk", "by_workload": {workload: mean tokens}, "predictable_over_other": ratio | None,
        "ci95": [lo, hi] | None, "n_predictable", "n_other", "trend": "grows" | "flat" | "undetermined"}`` —
        ``trend`` "grows" when the ratio's bootstrap 95% interval lies above 1, "flat" when it lies within
        [1 / FLAT_MAX_RATIO, FLAT_MAX_RATIO], else (or without an interval: fewer than 2 responses of a kind)
        "undetermined"; None when the fingerprint has no responses of both kinds.
    """
    ev = spec.get("evidence") if isinstance(spec, Mapping) else None
    fig = ev.get("by_predictability") if isinstance(ev, Mapping) else None
    if not isinstance(fig, Mapping) or not isinstance(fig.get("by_workload"), Mapping):
        return None
    means = {str(k): float(v["mean"]) for k, v in fig["by_workload"].items()
             if isinstance(v, Mapping) and isinstance(v.get("mean"), int | float)}
    ci, ratio = fig.get("ci95"), fig.get("predictable_over_other")
    ok = (isinstance(ci, list | tuple) and len(ci) == 2 and all(isinstance(v, int | float) for v in ci)
          and isinstance(ratio, int | float))
    lo, hi = (float(ci[0]), float(ci[1])) if ok and isinstance(ci, list | tuple) else (math.nan, math.nan)
    trend = ("grows" if lo > 1.0 else "flat" if lo >= 1 / FLAT_MAX_RATIO and hi <= FLAT_MAX_RATIO
             else "undetermined")
    return {"per": str(fig.get("per") or "step"), "by_workload": means,
            "predictable_over_other": float(ratio) if ok and isinstance(ratio, int | float) else None,
            "ci95": [lo, hi] if ok else None, "n_predictable": fig.get("n_predictable"),
            "n_other": fig.get("n_other"), "trend": trend}


def predictability_text(fig: Mapping[str, Any], predictable_workloads: Sequence[str] = PREDICTABLE_WORKLOADS, *,
                        unit: str | None = None) -> str:
    """The figures of :func:`accepted_by_predictability` in words, predictable workloads first, e.g. "4.00
    tokens per step on repetition prompts, 3.98 on chat, 4.01 on code (repetition / other 1.00, 95% CI [0.98,
    1.02], 3 and 12 responses)"; ``unit`` replaces the figures' own (``fig["per"]``) where the caller knows more
    (a chunk that other evidence shows to be one verification step)."""
    means = dict(fig["by_workload"])
    order = sorted(means, key=lambda w: (w not in predictable_workloads, w))
    per = unit or fig["per"]
    parts = [f"{means[w]:.2f} tokens per {per} on {w} prompts" if i == 0 else f"{means[w]:.2f} on {w}"
             for i, w in enumerate(order)]
    pred = "+".join(w for w in order if w in predictable_workloads) or "predictable"
    counts = f"{fig.get('n_predictable')} and {fig.get('n_other')} responses"
    ci, ratio = fig.get("ci95"), fig.get("predictable_over_other")
    ratio_text = (f"{pred} / other {float(ratio):.2f}, 95% CI [{float(ci[0]):.2f}, {float(ci[1]):.2f}], {counts}"
                  if ci is not None and ratio is not None else f"no interval from {counts}")
    return f"{', '.join(parts)} ({ratio_text})"


def speculation_line(spec: Mapping[str, object] | None) -> str | None:
    """One human-readable line for a ``speculation`` object (text/Markdown reports), with the accepted length
    on predictable against other prompts where known (:func:`predictability_text`), or None."""
    if not isinstance(spec, Mapping) or "detected" not in spec:
        return None
    det = spec.get("detected")
    m, ci = spec.get("mean_accepted_tokens_per_step"), spec.get("ci95")
    evidence = spec.get("evidence")
    ev: Mapping[str, object] = evidence if isinstance(evidence, Mapping) else {}
    mode = ev.get("mode", "?")
    fig = accepted_by_predictability(spec)
    by_text = f"; {predictability_text(fig)}" if fig is not None else ""
    if det is None:
        return f"speculation: cannot tell ({mode}){by_text}"
    est = (f"{float(m):.2f} tokens/step [95% CI {float(ci[0]):.2f}, {float(ci[1]):.2f}]"
           if isinstance(m, (int, float)) and isinstance(ci, (list, tuple)) and len(ci) == 2
           and all(isinstance(v, (int, float)) for v in ci) else "no estimate")
    return f"speculation: {'detected' if det else 'not detected'}, {est} ({mode}; evidence, not a verdict){by_text}"
