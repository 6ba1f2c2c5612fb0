"""Evidence stage of ``auditor check``: observations (+ reference scores) → ``EvidenceBatch``.

- :func:`evidence_stage` is the stage as the pipeline runs it: one batch per reference precision
  (or the self batch without a reference), the position count, and the tokenizer evidence.
- :func:`build_evidence` turns observations (+ the reference scores of one precision) into one
  ``auditor.detectors.EvidenceBatch`` over the comparable positions.
- :func:`tokenizer_mismatch`: evidence that the provider uses another tokenizer (rule 2t).
- :func:`enrich_evidence` adds token texts and context to the detectors' evidence rows (called by
  the detection stage, ``auditor.check.run_detectors.detect``).

The observations themselves (``Observation``, ``load_observations``, ``stored_tokens``) live in
:mod:`auditor.check.observations` and are re-exported here. Only positions that map 1:1 onto a reference
token are compared (a 1:n token has no single reference distribution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from auditor.check.observations import Observation, _token_text, load_observations, stored_tokens
from probes.align import ByteVocab
from probes.align import _byte_vocab as _bv
from probes.conventions import LogprobConvention, certified_top, learn_convention, requested_top_logprobs

if TYPE_CHECKING:  # pragma: no cover
    from auditor.detectors import DetectorResult, EvidenceBatch
    from reference.scoring import ScoredContinuation

__all__ = [
    "EVIDENCE_CONTEXT_CHARS",
    "EvidenceIndex",
    "EvidenceStage",
    "Observation",
    "build_evidence",
    "enrich_evidence",
    "evidence_stage",
    "learn_observed_convention",
    "load_observations",
    "stored_tokens",
    "tokenizer_mismatch",
]

#: Characters of provider text kept before an evidence position (``context``).
EVIDENCE_CONTEXT_CHARS = 60


# ------------------------------------------------------------------------------------------ batch
def _alt_id(bv: ByteVocab, tok: str, b: bytes | None) -> int | None:
    if b is None:
        return None
    if b == b"":
        return bv.special.get(tok)
    return bv.by_bytes.get(b)


@dataclass
class EvidenceIndex:
    """Where each evidence position came from: ``(observation index, provider token index)``."""

    rows: list[tuple[int, int]]


def learn_observed_convention(observations: Sequence[Observation]) -> LogprobConvention:
    """The provider's logprob convention (:mod:`probes.conventions`) learned from the audit's own answers."""
    requested = next((k for o in observations if (k := requested_top_logprobs(o.request))), None)
    return learn_convention([o.tokens for o in observations], requested)


def build_evidence(
    observations: Sequence[Observation],
    scored: Sequence[ScoredContinuation] | None,
    tokenizer: Any,
    convention: LogprobConvention | None = None,
) -> tuple[EvidenceBatch, EvidenceIndex]:
    """One ``EvidenceBatch`` over every comparable position (provider token mapping 1:1 onto a
    reference token, inside the aligned prefix).

    Args:
        observations: from :func:`load_observations`.
        scored: per observation the reference's ScoredContinuation over ``ref_ids`` (None = no
            reference: only the self-consistency detectors can run).
        tokenizer: the reference tokenizer (maps the provider's alternatives to reference ids).
        convention: the provider's logprob convention (None: learned from ``observations``). Each
            position's alternatives are its certified top-m (``probes.conventions.certified_top``):
            vLLM's sampled-first lists lose the sampled token's extra entry, which would otherwise
            put every sampled token inside the listed support and bias the self-consistency tests.

    Returns:
        (EvidenceBatch, EvidenceIndex). Shapes: N positions; reference top-K = scored top_k;
        provider width M = the most alternatives any position listed.
    """
    from auditor.check.reference_scoring import REFERENCE_TOP_K
    from auditor.detectors import UNTRUSTED_LOGPROB_ANOMALIES, EvidenceBatch

    bv = _bv(tokenizer)
    conv = convention if convention is not None else learn_observed_convention(observations)
    rows: list[tuple[int, int]] = []
    ref_rows: list[int] = []
    for oi, o in enumerate(observations):
        for ti, tid in enumerate(o.one_to_one):
            span = o.spans[ti]
            if tid is None or span is None or ti in o.tag_positions:  # think tags: possibly forced, no sample
                continue
            rows.append((oi, ti))
            ref_rows.append(span[0])
    n = len(rows)
    tops = [certified_top(observations[oi].tokens[ti].top_logprobs, conv) for oi, ti in rows]
    m = max((len(tp) for tp in tops), default=0)
    p_ids = np.full((n, m), -1, np.int64)
    p_lp = np.full((n, m), -np.inf)
    p_tok = np.empty(n, dtype=object)
    trusted = np.ones(n, bool)
    prompt_ids, positions, token_ids, temps, texts = [], [], [], [], []
    spans: list[str | None] = []
    finals: list[float | None] = []  # last token of its streamed chunk (Observation.step_final)
    top_ps, top_ks = [], []  # the law each position was sampled from (a provider's enforced top_p / top_k)
    for j, (oi, ti) in enumerate(rows):
        o = observations[oi]
        t = o.tokens[ti]
        spans.append(t.span)
        finals.append(None if o.step_final is None else float(o.step_final[ti]))
        top_ps.append(o.top_p if o.temperature > 0 else 1.0)
        top_ks.append(o.top_k if o.temperature > 0 else 0)
        prompt_ids.append(o.probe_key)
        positions.append(ti)
        token_ids.append(int(o.one_to_one[ti]))  # type: ignore[arg-type]  # rows hold 1:1 positions only
        temps.append(o.temperature)
        texts.append(t.token)
        p_tok[j] = t.logprob
        if set(t.anomalies or ()) & UNTRUSTED_LOGPROB_ANOMALIES:
            trusted[j] = False
        c = 0
        for tok, b, lp in tops[j]:
            aid = _alt_id(bv, tok, b)
            if aid is None:
                continue
            p_ids[j, c] = aid
            p_lp[j, c] = float(lp)
            c += 1
    kw: dict[str, np.ndarray] = {}
    if scored is not None:
        k = max((s.top_ids.shape[1] for s in scored if s is not None and len(s.token_ids)), default=REFERENCE_TOP_K)
        rt_ids = np.full((n, k), -1, np.int64)
        rt_lp = np.full((n, k), -np.inf)
        rt_tok = np.full(n, np.nan)
        for j, ((oi, _ti), s_idx) in enumerate(zip(rows, ref_rows, strict=True)):
            sc = scored[oi]
            kk = sc.top_ids.shape[1]
            rt_ids[j, :kk] = sc.top_ids[s_idx]
            rt_lp[j, :kk] = sc.top_logprobs[s_idx]
            rt_tok[j] = sc.logprobs[s_idx]
        kw = {"ref_top_ids": rt_ids, "ref_top_logprobs": rt_lp, "ref_token_logprobs": rt_tok}
    batch = EvidenceBatch.from_arrays(
        prompt_ids=prompt_ids or np.zeros(0, object),
        positions=np.asarray(positions, np.int64),
        token_ids=np.asarray(token_ids, np.int64),
        temperatures=np.asarray(temps, np.float64),
        provider_top_ids=p_ids,
        provider_top_logprobs=p_lp,
        provider_token_logprobs=p_tok,
        provider_trusted=trusted,
        token_texts=texts if texts else None,
        token_spans=spans if any(sp == "reasoning" for sp in spans) else None,
        top_ps=top_ps if any(v < 1.0 for v in top_ps) else None,
        top_ks=top_ks if any(top_ks) else None,
        step_final=finals if any(f is not None for f in finals) else None,
        **kw,
    )
    return batch, EvidenceIndex(rows)


# ------------------------------------------------------------------------------------------ texts
def enrich_evidence(
    results: list[DetectorResult], observations: Sequence[Observation], tokenizer: Any
) -> list[DetectorResult]:
    """Add token texts (``token``, ``ref_top5_tokens``, ``provider_top5_tokens``), the preceding
    provider text (``context``) and the token's span (``span``: ``reasoning`` / ``answer``, where
    known) to every evidence row, so reports need no tokenizer."""
    bv = _bv(tokenizer)
    by_key = {o.probe_key: o for o in observations}
    out = []
    for r in results:
        ev = []
        for e in r.evidence or []:
            e = dict(e)
            o = by_key.get(str(e.get("prompt_id")))
            pos = e.get("position")
            if o is not None and isinstance(pos, int) and 0 <= pos < len(o.tokens):
                e.setdefault("token", o.tokens[pos].token)
                if o.tokens[pos].span is not None:
                    e["span"] = o.tokens[pos].span  # reasoning / answer (issue 35)
                prev = b"".join((t.bytes or t.token.encode("utf-8", "replace")) for t in o.tokens[max(0, pos - 24) : pos])
                e["context"] = prev.decode("utf-8", errors="replace")[-EVIDENCE_CONTEXT_CHARS:]
            if e.get("ref_top5"):
                e["ref_top5_tokens"] = [_token_text(bv, int(x[0])) for x in e["ref_top5"]]
            if e.get("provider_top5"):
                e["provider_top5_tokens"] = [_token_text(bv, int(x[0])) for x in e["provider_top5"]]
            if isinstance(e.get("provider_top1"), int):
                e["provider_top1_token"] = _token_text(bv, e["provider_top1"])
            ev.append(e)
        out.append(replace(r, evidence=ev))
    return out


# ------------------------------------------------------------------------------------------ tokenizer
_FFFD = "\ufffd".encode()
#: Distinct provider token strings outside the claimed vocabulary that establish another tokenizer.
MIN_FOREIGN_TOKENS = 3
#: Completions prompts whose ``usage.prompt_tokens`` disagrees with the claimed tokenizer's count
#: (with at least two different offsets: a BOS policy or a fixed prefix shifts every count equally).
MIN_PROMPT_COUNT_DISAGREEMENTS = 3


def tokenizer_mismatch(observations: Sequence[Observation], tokenizer: Any, api: str) -> dict[str, Any] | None:
    """Evidence that the provider does not use the claimed model's tokenizer (cross-family substitution).

    An honest server of the claimed model can only emit tokens of that model's vocabulary, and for
    ``api = "completions"`` (no chat template) it counts exactly the prompt tokens the claimed
    tokenizer produces. Two independent facts are collected:

    - **foreign tokens**: provider tokens and ``top_logprobs`` alternatives whose bytes are known and
      are no single entry of the claimed vocabulary (``probes.align.ByteVocab``), or whose empty-bytes
      string is no special token of it (e.g. gemma's ``<eos>`` under a SmolLM2 claim). Records with any
      anomaly (malformed, untrusted) are skipped, so a hostile response never counts as evidence.
      Strings the claimed tokenizer's own ids produce under vLLM's partial-character convention (issue
      40: a character split over several ids returned whole, ``ByteVocab.whole_character_ids``) and
      strings holding U+FFFD (bytes the server lost, e.g. an orphan partial character of garbage ids)
      are never foreign: garbage ids of the declared model are not another model. They are counted in
      ``n_whole_or_lost``.
    - **prompt counts** (completions only): probes where ``usage.prompt_tokens`` differs from
      ``len(prompt_ids)`` of the claimed tokenizer, and the set of offsets.

    Args:
        observations: from :func:`load_observations` (reference tokenizer = the claimed model's).
        tokenizer: the claimed model's tokenizer. api: the provider's API (``chat`` | ``completions``).

    Returns:
        None when neither fact is established (< MIN_FOREIGN_TOKENS distinct foreign strings and
        < MIN_PROMPT_COUNT_DISAGREEMENTS count disagreements with >= 2 offsets); else a JSON-able dict:
        ``foreign_tokens`` (distinct strings, up to 12), ``n_foreign`` (occurrences), ``n_checked``
        (token records with usable bytes), ``prompt_counts`` (up to 8 ``[provider, claimed]`` pairs),
        ``n_prompt_disagree``, ``n_prompt_checked``, ``offsets`` and ``established`` (which facts).
    """
    bv = _bv(tokenizer)
    foreign: dict[str, int] = {}
    n_checked = lost_or_whole = 0

    def check(tok: str, b: bytes | None) -> None:
        nonlocal n_checked, lost_or_whole
        if b is None:
            return
        n_checked += 1
        # added tokens (gemma's whitespace/HTML runs) live in ``special`` under their text, not in ``by_bytes``
        known = tok in bv.special or b in bv.by_bytes or b.decode("utf-8", errors="replace") in bv.special
        # vLLM's whole characters (issue 40): pieces of a split character + one entry of the claimed
        # vocabulary; a U+FFFD stands for bytes the server lost, so the string proves nothing
        if not known and (_FFFD in b or bv.whole_character_ids(b) is not None):
            lost_or_whole += 1
            return
        if not known and (b != b"" or tok):
            foreign[tok] = foreign.get(tok, 0) + 1

    for o in observations:
        if o.anomalies and set(o.anomalies) - {"retokenized_text"}:
            continue
        for t in o.tokens:
            if t.anomalies:
                continue
            check(t.token, t.bytes)
            for tok, b, _lp in t.top_logprobs:
                check(tok, b)
    pairs = [(o.provider_prompt_tokens, len(o.prompt_ids)) for o in observations
             if o.provider_prompt_tokens is not None and o.prompt_ids]
    dis = [(a, b) for a, b in pairs if a != b] if api == "completions" else []
    offsets = sorted({a - b for a, b in dis})
    established = []
    if len(foreign) >= MIN_FOREIGN_TOKENS:
        established.append("foreign_tokens")
    if len(dis) >= MIN_PROMPT_COUNT_DISAGREEMENTS and len(offsets) >= 2:
        established.append("prompt_counts")
    if not established:
        return None
    top = sorted(foreign, key=lambda k: (-foreign[k], k))
    return {
        "established": established,
        "foreign_tokens": top[:12],
        "n_foreign_distinct": len(foreign),
        "n_foreign": sum(foreign.values()),
        "n_checked": n_checked,
        "n_whole_or_lost": lost_or_whole,
        "prompt_counts": [[a, b] for a, b in dis[:8]],
        "n_prompt_disagree": len(dis),
        "n_prompt_checked": len(pairs) if api == "completions" else 0,
        "offsets": offsets[:8],
    }


# ------------------------------------------------------------------------------------------ stage
@dataclass(frozen=True)
class EvidenceStage:
    """What the evidence stage hands to the detection, verdict and summary stages.

    Attributes:
        batches: reference dtype → EvidenceBatch (same positions, each precision's reference rows;
            empty without a reference).
        self_batch: the batch without reference rows when ``batches`` is empty (reference-free
            tests only), else None.
        n_positions: positions in the evidence (the first batch's, else the self batch's; 0 if none).
        tokenizer_mismatch: :func:`tokenizer_mismatch` (None when not established or not collected).
        convention: the provider's logprob convention learned from the observations
            (``probes.conventions.LogprobConvention.to_dict``; stored as the run summary's
            ``logprob_convention``).
    """

    batches: dict[str, EvidenceBatch]
    self_batch: EvidenceBatch | None
    n_positions: int
    tokenizer_mismatch: dict[str, Any] | None
    convention: dict[str, Any] | None = None


def evidence_stage(
    observations: Sequence[Observation],
    scored: Mapping[str, Sequence[ScoredContinuation]],
    tokenizer: Any,
    *,
    api: str,
    tokenizer_is_claimed: bool = True,
) -> EvidenceStage:
    """The evidence stage: one batch per scored reference precision, and the tokenizer evidence.

    Args:
        observations: from :func:`load_observations`.
        scored: reference dtype → per observation its ScoredContinuation (empty: no reference).
        tokenizer: the reference tokenizer. api: the provider's API (``chat`` | ``completions``).
        tokenizer_is_claimed: False when ``tokenizer`` is a stand-in for the claimed model's: the
            tokenizer evidence (cross-family substitution) is then not collected.
    """
    conv = learn_observed_convention(observations)
    batches = {dt: build_evidence(observations, sc, tokenizer, conv)[0] for dt, sc in scored.items()}
    self_batch = None if batches else build_evidence(observations, None, tokenizer, conv)[0]
    first = next(iter(batches.values()), self_batch)
    # cross-family substitution (rule 2t) is only provable against the claimed model's own tokenizer
    tm = tokenizer_mismatch(observations, tokenizer, api) if tokenizer_is_claimed else None
    return EvidenceStage(batches, self_batch, len(first) if first is not None else 0, tm,
                         conv.to_dict() if conv.n_positions else None)
