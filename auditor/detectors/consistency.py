"""Self-consistency detectors: the provider's samples vs the provider's *own* reported logprobs.

No reference model is needed. They catch relaxed verification where no reference can be run, and
flag providers whose logprobs contradict their samples.

Sampling (``self-gof``, ``self-argmax``, ``self-tail``): the sampling tests of ``sampling.py``
with the reported distribution in place of the reference. Only top_logprobs are known, so the
distribution is the listed support plus one tail bucket holding the unlisted mass 1 − Σ listed.
This is conservative, not biased: the randomized PIT treats the tail bucket as a block (exactly
uniform under H0 when the list is the provider's top-M), the argmax is the top listed token, and
the tail of ``self-tail`` is the unlisted mass when the listed tokens do not reach top-p. Used
only at T = 1 (reported logprobs are raw in most engines, e.g. vLLM's default ``logprobs-mode``;
at T = 1 raw and processed coincide), at positions whose list is trusted (see
``UNTRUSTED_LOGPROB_ANOMALIES``); listed masses slightly above 1 (≤ 1e-3, rounding) are
renormalised.

Greedy (``self-greedy``): at T = 0 the emitted token should be the provider's own reported top-1.
A contradiction with gap g = logp_top1 − logp_emitted (reported; when the emitted token is not
listed and its logprob not reported, bounded below by the smaller of the last listed logprob and
log(1 − Σ listed)) above the noise band is clear evidence that the decode path differs from the
path that reports logprobs → DECODING_NONCOMPLIANT (relaxed acceptance is a sampling-time
behaviour and cannot cause it). Same exact binomial test as ``greedy-match``.

Unverified tokens (issue 40, item 3): a contradiction whose emitted token lies UNVERIFIED_GAP_NATS or
more below the provider's own top-1 — and below the reference's top-1 by as much, when the batch has a
reference — is no decoding parameter's doing (a repetition penalty or a 2nd-ranked pick moves tokens
by a few nats; a real vLLM with ngram speculation and greedy requests batched with sampled ones
emitted ``<|endoftext|>`` at −16.0 where its own top-1 was −0.52, and ' TType' at −38.8): it is a draft
that was never verified. ``details["n_unverified"]`` counts them, ``details["unverified_positions"]``
names up to UNVERIFIED_EVIDENCE of them (``prompt_id``, ``position``, both gaps); the verdict
(``auditor.verdict.decide`` rule 1u) answers "strict verification? no" when they are most of the clear
contradictions.

Where the contradictions sit in the streamed steps (issue 35, synthetic acceptance): a speculative
engine streams one chunk per verification step (vLLM, SGLang), whose last token is the target's own
pick (the correction or bonus token) and the tokens before it accepted drafts. A decoding parameter
(a penalty, another pick) acts on every pick alike — and under verification its departures end the step
(the draft is rejected there), so they fall on chunk-final tokens at least as often as those are
among the positions. Drafts emitted without verification (vLLM ``rejection_sample_method: synthetic``,
SGLang ``SGLANG_SIMULATE_ACC_LEN``, TensorRT-LLM ``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS``, ATOM
``--spec-decode-acceptance-length``) depart inside the step and never at its last token.
``details["steps"]`` (:func:`step_counts`) holds the streamed positions, the chunk-final ones, the clear
contradictions among them, those at a chunk's last token, and the exact one-sided binomial p-value
of that few (null share: the chunk-final positions' share); the verdict (rule 1d) reads it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy import stats

from .base import MIN_POSITIONS, DetectorName, DetectorResult, EvidenceBatch, not_run
from .greedy import GREEDY_TEMPERATURE_MAX, clear_mismatch_result, clear_mismatch_test, honest_band_and_rate
from .near_tie import span_counts
from .noise_floor import NoiseFloor
from .sampling import (
    TAIL_TOP_P,
    SamplingView,
    argmax_result,
    gof_result,
    provider_view,
    tail_result,
)
from .stats import RngLike

__all__ = ["UNVERIFIED_GAP_NATS", "at_or_after", "first_unverified", "self_argmax", "self_gof", "self_greedy", "self_tail", "step_counts"]

#: Nats below the top-1 (the provider's own, and the reference's when known) from which a greedy
#: contradiction is an unverified token (a ratio of e^8 ≈ 3000: no penalty or near-tie moves a token so far).
UNVERIFIED_GAP_NATS = 8.0
#: Unverified positions kept in ``details["unverified_positions"]``.
UNVERIFIED_EVIDENCE = 20


def _view_or_not_run(batch: EvidenceBatch, name: str) -> SamplingView | DetectorResult:
    """The provider view, or the not-run result when it has fewer than MIN_POSITIONS positions."""
    view = provider_view(batch)
    if len(view) < MIN_POSITIONS:
        return not_run(
            name,
            f"too few T=1 positions with trusted provider top_logprobs ({len(view)} < {MIN_POSITIONS}){view.left_out()}",
            n=len(view),
        )
    return view


def self_gof(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.SELF_GOF,
) -> DetectorResult:
    """Randomized-PIT Cramér–von Mises test against the provider's own logprobs."""
    view = _view_or_not_run(batch, name)
    if isinstance(view, DetectorResult):
        return view
    return gof_result(batch, view, name, rng, n_evidence)


def self_argmax(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.SELF_ARGMAX,
) -> DetectorResult:
    """Over-emission of the provider's own reported top-1 token."""
    view = _view_or_not_run(batch, name)
    if isinstance(view, DetectorResult):
        return view
    return argmax_result(batch, view, name, rng, n_evidence)


def self_tail(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    top_p: float = TAIL_TOP_P,
    name: str = DetectorName.SELF_TAIL,
) -> DetectorResult:
    """Deficit of emissions outside the provider's own reported top-p nucleus."""
    view = _view_or_not_run(batch, name)
    if isinstance(view, DetectorResult):
        return view
    return tail_result(batch, view, name, rng, n_evidence, top_p)


def step_counts(step_final: np.ndarray | None, rows: np.ndarray, clear: np.ndarray) -> dict[str, float]:
    """Where clear greedy contradictions sit in the streamed steps (see the module docstring).

    Args:
        step_final: [N] float64 of the batch (``EvidenceBatch.step_final``: 1 chunk-final, 0 inside, NaN
            unknown) or None; rows: [n] int batch rows tested; clear: [n] bool clear contradiction.

    Returns:
        {} when no tested position has a known chunk; else ``positions`` (streamed, tested),
        ``final_positions`` (the last token of their chunk), ``clear`` and ``clear_final`` (contradictions
        among them / at a chunk's last token) and ``p_value``: P(X <= clear_final), X ~ Binomial(clear,
        final_positions / positions) — small when the contradictions avoid the chunks' last tokens
        (1.0 without contradictions, or when every chunk holds one token).
    """
    if step_final is None:
        return {}
    f = step_final[rows]
    known = np.isfinite(f)
    n = int(known.sum())
    if n == 0:
        return {}
    final = known & (f == 1.0)
    k, k_final = int((clear & known).sum()), int((clear & final).sum())
    p = float(stats.binom.cdf(k_final, k, final.sum() / n)) if k else 1.0
    return {"positions": n, "final_positions": int(final.sum()), "clear": k, "clear_final": k_final,
            "p_value": min(p, 1.0)}


def _self_greedy_rows(batch: EvidenceBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The greedy positions self-greedy tests and their gaps to the provider's own top-1.

    Returns:
        (idx [n] int64 batch rows: T = 0, trusted provider list of >= 1 entry, aligned token; own_top1 [n] int64
        the provider's reported top-1 id; contra [n] bool emitted != own top-1; gap [n] float64 nats
        logp_top1 − logp_emitted where contra, else 0 — the emitted logprob, when not reported and not listed,
        bounded below by the smaller of the last listed logprob and log(1 − Σ listed)).
    """
    mask = (
        (batch.temperatures <= GREEDY_TEMPERATURE_MAX)
        & batch.provider_trusted
        & (batch.provider_listed >= 1)
        & (batch.token_ids >= 0)
    )
    idx = np.flatnonzero(mask)
    if idx.size == 0:  # e.g. no provider top_logprobs at all (a list width of 0)
        return idx, np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0)
    ids = batch.provider_top_ids[idx]
    lps = batch.provider_top_logprobs[idx]
    tok = batch.token_ids[idx]
    lp1 = lps[:, 0]
    lp_tok = batch.provider_token_logprobs[idx].copy()
    # unknown emitted logprob and not listed: p(tok) <= min(p_last_listed, 1 - Σ listed)
    last = np.where(np.isfinite(lps), lps, np.inf).min(1)
    rest = np.clip(1.0 - np.exp(lps).sum(1), 1e-300, 1.0)
    bound = np.minimum(last, np.log(rest))
    lp_tok = np.where(np.isnan(lp_tok), bound, lp_tok)
    contra = tok != ids[:, 0]
    gap = np.where(contra, np.maximum(lp1 - lp_tok, 0.0), 0.0)
    return idx, ids[:, 0], contra, gap


def _unverified(batch: EvidenceBatch, idx: np.ndarray, clear: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unverified [n] bool, ref_gap [n] float64 nats) at rows ``idx``: a clear contradiction UNVERIFIED_GAP_NATS or more
    below the provider's own top-1 and not less below the reference's top-1 (module docstring; the one home of this
    rule). A NaN reference gap (no reference, or the token outside its top-K with no logprob) leaves the provider's own
    gap to decide."""
    ref_gap = np.full(idx.size, np.nan)
    if batch.has_reference:
        ref = batch.reference()
        ref_gap = ref.top_logprobs[idx, 0] - ref.token_logprobs[idx]
    return clear & (gap >= UNVERIFIED_GAP_NATS) & ~(ref_gap < UNVERIFIED_GAP_NATS), ref_gap


def first_unverified(batch: EvidenceBatch, floor: NoiseFloor | None) -> dict[str, int]:
    """Per response (``prompt_id``) the position of its first unverified greedy token; responses without one are
    absent.

    The unverified tokens are self-greedy's (:func:`self_greedy` ``details["n_unverified"]``: same positions, band
    and rule, found in ``batch`` with ``floor``). After such a token a response goes on from a context the honest
    engine would not have produced, so comparisons there see a degenerate context (issue 40; :func:`at_or_after`).

    Args:
        batch: the batch self-greedy reads (provider top_logprobs; its reference, when present, for the reference gap).
        floor: the floor self-greedy uses (its near-tie band), or None.
    """
    idx, _, contra, gap = _self_greedy_rows(batch)
    if idx.size == 0:  # no greedy position with the provider's own top_logprobs (e.g. a sampling-only audit)
        return {}
    band, r0 = honest_band_and_rate(floor)
    unverified, _ = _unverified(batch, idx, clear_mismatch_test(contra, gap, band, r0)["clear"], gap)
    first: dict[str, int] = {}
    for j in np.flatnonzero(unverified):
        pid, pos = str(batch.prompt_ids[idx[j]]), int(batch.positions[idx[j]])
        first[pid] = min(pos, first.get(pid, pos))
    return first


def at_or_after(first: Mapping[str, int], of: EvidenceBatch) -> np.ndarray:
    """[N] bool over ``of``'s rows: True where the position is >= its response's first unverified token
    (``first``, :func:`first_unverified`; matched by ``prompt_id`` and ``position``); all False when there is none."""
    if not first:
        return np.zeros(len(of.token_ids), dtype=bool)
    start = np.array([first.get(str(p), np.iinfo(np.int64).max) for p in of.prompt_ids], dtype=np.int64)
    return np.asarray(of.positions, dtype=np.int64) >= start


def self_greedy(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    rng: RngLike = 0,
    n_evidence: int = 10,
    name: str = DetectorName.SELF_GREEDY,
) -> DetectorResult:
    """Greedy consistency: T = 0 emitted token vs the provider's own reported top-1.

    Returns:
        DetectorResult: statistic = clear-contradiction count, p_value = exact one-sided binomial
        against max(floor.clear_mismatch_rate, MIN_HONEST_CLEAR_RATE), effect = clear-contradiction
        rate (Wilson CI), details = {agreement, n_contradiction, n_near_tie, band, r0, p_randomized, n_unverified,
        and for a reasoning model ``spans``: per span its positions, clear contradictions and honest expectation}.
    """
    idx, own_top1, contra, gap = _self_greedy_rows(batch)
    n = int(idx.size)
    if n < MIN_POSITIONS:
        return not_run(
            name,
            f"too few greedy positions with trusted provider top_logprobs ({n} < {MIN_POSITIONS})",
            n=n,
        )
    band, r0 = honest_band_and_rate(floor)
    t = clear_mismatch_test(contra, gap, band, r0, rng)
    clear = t["clear"]
    unverified, ref_gap = _unverified(batch, idx, clear, gap)
    unv_rows = [
        {"prompt_id": str(batch.prompt_ids[idx[j]]), "position": int(batch.positions[idx[j]]),
         "gap": float(gap[j]), "reference_gap": None if np.isnan(ref_gap[j]) else float(ref_gap[j])}
        for j in np.flatnonzero(unverified)[np.argsort(-gap[unverified], kind="stable")][:UNVERIFIED_EVIDENCE]
    ]
    return clear_mismatch_result(
        batch, name, idx, contra, gap, t, floor, n_evidence,
        agreement=("agreement", "n_contradiction"),
        row_ints={"provider_top1": own_top1},
        details={
            "n_unverified": int(unverified.sum()),
            "unverified_gap_nats": UNVERIFIED_GAP_NATS,
            "unverified_positions": unv_rows,
            # per span of a reasoning model's answer: positions, clear contradictions ("flips") and the
            # honest expectation n * r0 (issue 35: a rule that relaxes only inside <think>)
            **({"spans": by_span} if (by_span := span_counts(batch.token_spans, idx, clear, np.full(idx.size, r0)))
               else {}),
            **({"steps": by_step} if (by_step := step_counts(batch.step_final, idx, clear)) else {}),
        },
    )
