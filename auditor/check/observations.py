"""Observations stage of ``auditor check``: each finished probe's stored tokens, aligned to the reference.

- :func:`load_observations` reads each finished probe's tokens as the runner stored them
  (``normalized_tokens``: bytes, logprob, alternatives with their bytes, anomalies — each response
  is normalized exactly once, at probe time, by ``auditor.check.attempt_writer``) and aligns them to the
  reference tokenizer through bytes (``probes.align``). It writes nothing.
- :func:`read_observations` is the stage as the pipeline runs it: the same observations, and the
  responses it excluded as a whole (:class:`ExcludedResponse`, with the reason): a response-level
  anomaly in ``auditor.detectors.UNTRUSTED_RESPONSE_ANOMALIES`` (e.g. ``bytes_text_mismatch``:
  tokens the text does not hold; ``reasoning_logprobs_inconsistent``: a reasoning response whose
  logprobs cover neither span) means its tokens are not what the model generated after its
  prompt, so none of its positions reaches any detector. A consistent reasoning response is
  evidence like any other: its reasoning tokens are observed, each with its span label;
  :func:`excluded_summary` is what the run summary stores of them (reports show it).
- :func:`aligned_ids` gives the plain ``(probe_id, ids)`` rows that the analysis' final transaction
  writes to ``normalized_tokens.ref_token_id`` (``auditor.store.queries.set_aligned_ref_token_ids``,
  called by ``auditor.check.pipeline``), so that the store stage needs nothing from this module.

Only positions that map 1:1 onto a reference token are compared later (a 1:n token has no single
reference distribution); alignment failures end a continuation and are counted. The shapes and
readers here are re-exported by :mod:`auditor.check.evidence`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from probes.align import AlignmentFailure, ByteVocab, align_to_reference
from probes.align import _byte_vocab as _bv
from probes.reasoning import think_tag_positions
from probes.records import TokenRecord

if TYPE_CHECKING:  # pragma: no cover
    from auditor.store import Store
    from auditor.store.models import NormalizedToken
    from probes.config import ProviderConfig

__all__ = [
    "REASONING_PREFIX_UNKNOWN",
    "ExcludedResponse",
    "Observation",
    "ObservationSet",
    "aligned_ids",
    "excluded_summary",
    "load_observations",
    "read_observations",
    "reference_prompt_ids",
    "stored_tokens",
    "untrusted_response_reasons",
]

#: Exclusion reason of a reasoning response whose reasoning span no token covers (logprobs over
#: the answer only, or no logprobs with a separate reasoning field): its answer follows tokens
#: the reference cannot know exactly (a re-tokenization of the reasoning text is a guess, and on a
#: tiny model it made an honest simulator look like another model), so it is not scored.
REASONING_PREFIX_UNKNOWN = "reasoning_prefix_unknown"

#: Probe keys an ``excluded_summary`` lists (the count covers them all).
EXCLUDED_KEYS_SHOWN = 8


@dataclass
class Observation:
    """One finished probe, read from the store and aligned to the reference tokenizer.

    Attributes:
        probe_id, probe_key, mode, workload: from the ``probes`` row.
        temperature: requested temperature; top_p: requested top_p (1.0 when not sent); top_k: requested
            top_k (0 when not sent or -1). A provider's enforced values are in the request as sent
            (``probes.config.EnforcedParams.apply``), so these are the law it samples from.
        request: the JSON body sent.
        prompt_ids: reference prompt token ids (chat template applied for ``api = chat``).
        tokens: ``probes.records.TokenRecord`` list, as stored (bytes of alternatives included).
        ref_ids: reference continuation ids (teacher-forced), covering ``aligned_prefix`` tokens.
        spans: per provider token, ``(start, end)`` into ``ref_ids`` or None.
        one_to_one: per provider token, the single reference id or None.
        failures: alignment failures (``probes.align.AlignmentFailure``).
        anomalies: response-level anomaly kinds.
        provider_prompt_tokens: the provider's ``usage.prompt_tokens`` (None when not reported).
        tag_positions: provider token positions that spell a think tag (``probes.reasoning.
            THINK_TAGS``) in a reasoning response: teacher-forced like every token, but no
            detector sees them, since an engine with a thinking budget forces the close tag
            (vLLM's ``thinking_token_budget``; the simulator's ``--reasoning`` mode) and a forced
            token is no sample of the model.
        step_final: per provider token, whether it is the last token of its streamed chunk (the
            last answered attempt's ``tokens_per_chunk``; a speculative engine streams one chunk per
            verification step, the step's last token being the target's own pick); None when the
            response was not streamed or its chunks do not add up to its tokens.

    Each token's ``span`` (``reasoning`` / ``answer``) is the normalizer's label, as stored.
    """

    probe_id: int
    probe_key: str
    mode: str | None
    workload: str | None
    temperature: float
    top_p: float
    request: dict[str, Any]
    prompt_ids: list[int]
    tokens: list[TokenRecord]
    ref_ids: list[int]
    spans: list[tuple[int, int] | None]
    one_to_one: list[int | None]
    failures: list[AlignmentFailure] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    provider_prompt_tokens: int | None = None
    tag_positions: frozenset[int] = frozenset()
    top_k: int = 0
    step_final: list[bool] | None = None


# ------------------------------------------------------------------------------------------ read
def _alt_bytes(hexes: Sequence[Any] | None, i: int, tok: str) -> bytes | None:
    """Alternative ``i``'s stored bytes (hex), or — for rows stored before revision 0002 — its UTF-8."""
    if hexes is None:
        return tok.encode("utf-8", errors="surrogatepass")
    h = hexes[i] if i < len(hexes) else None
    if h is None:
        return None
    try:
        return bytes.fromhex(str(h))
    except ValueError:
        return None


def stored_tokens(rows: Sequence[NormalizedToken]) -> list[TokenRecord]:
    """The ``TokenRecord`` list the runner stored, read back from ``normalized_tokens`` rows (by position).

    The rows were written from validated records (``auditor.store.queries.token_row_values``), so
    they are rebuilt without validating again (``model_construct``: no cost, and a row the store
    holds never raises here).
    """
    out = []
    for r in rows:
        tops = []
        hexes = r.top_logprobs_bytes
        for i, alt in enumerate(r.top_logprobs or []):
            tok = str(alt[0]) if alt and alt[0] is not None else ""
            lp = alt[1] if len(alt) > 1 else None
            tops.append((tok, _alt_bytes(hexes, i, tok), None if lp is None else float(lp)))
        out.append(TokenRecord.model_construct(index=r.position, token=r.token, bytes=r.token_bytes,
                                               logprob=r.logprob, top_logprobs=tops, anomalies=list(r.anomalies or []),
                                               span=r.span, raw_logprob=None))
    return out


def _retokenize(text: str, bv: ByteVocab, tokenizer: Any) -> list[TokenRecord]:
    """Token records of ``text`` tokenized by the reference tokenizer (no logprobs, no alternatives).

    Fallback for responses without per-token data (the provider returned no logprobs): it assumes
    the provider emitted the canonical tokenization of its text, which holds for almost every
    position of a model with the same tokenizer (a sampler can emit a non-canonical split; such a
    position is then scored as its canonical merge). Each record carries ``retokenized``.
    """
    return [
        TokenRecord(index=i, token=_token_text(bv, int(tid)), bytes=bv.id_bytes.get(int(tid)), logprob=None,
                    anomalies=["retokenized"], span="answer")
        for i, tid in enumerate(tokenizer.encode(text, add_special_tokens=False))
    ]


def reference_prompt_ids(req: dict[str, Any], tokenizer: Any, opener: str | None = None) -> list[int]:
    """Reference prompt ids of a request; a chat prompt ends with the template's reasoning
    ``opener`` when the provider config names one (``ProviderConfig.reasoning_opener``)."""
    from reference.scoring import encode_prompt

    if "messages" in req:
        ids = list(encode_prompt(tokenizer, req["messages"], chat=True))
        return ids + list(tokenizer.encode(opener, add_special_tokens=False)) if opener else ids
    prompt = req.get("prompt")
    return list(encode_prompt(tokenizer, prompt[0] if isinstance(prompt, list) else str(prompt or ""), chat=False))


@dataclass(frozen=True)
class ExcludedResponse:
    """A finished probe whose whole response was kept away from the detectors.

    Attributes:
        probe_id, probe_key: from the ``probes`` row.
        reasons: the response-level anomaly kinds that excluded it (keys of
            ``auditor.detectors.UNTRUSTED_RESPONSE_ANOMALIES``), in stored order.
        n_tokens: provider tokens the response carried (positions withheld from the detectors).
    """

    probe_id: int
    probe_key: str
    reasons: tuple[str, ...]
    n_tokens: int


@dataclass(frozen=True)
class ObservationSet:
    """What :func:`read_observations` returns: the observations the detectors see, and the
    responses excluded as a whole (:class:`ExcludedResponse`)."""

    observations: list[Observation]
    excluded: list[ExcludedResponse]


def untrusted_response_reasons(anomalies: Sequence[Any] | None) -> tuple[str, ...]:
    """The kinds among a response's stored ``anomalies`` that exclude it (``normalize_error: ...``
    strings count by their kind, the text before the first colon); () for a usable response."""
    from auditor.detectors import UNTRUSTED_RESPONSE_ANOMALIES

    kinds = (str(a).split(":", 1)[0].strip() for a in anomalies or ())
    return tuple(dict.fromkeys(k for k in kinds if k in UNTRUSTED_RESPONSE_ANOMALIES))


def read_observations(store: Store, run_id: str, config: ProviderConfig, tokenizer: Any) -> ObservationSet:
    """Read and align every ``done`` probe of a run (read only; see :func:`aligned_ids`), keeping
    apart the responses whose token/text correspondence cannot be trusted.

    Args:
        store: open ``auditor.store.Store``; run_id: the audit run.
        config: the provider's ``ProviderConfig`` (kept for the backends' signature; tokens were
            normalized with its api and ``max_top_logprobs`` at probe time).
        tokenizer: the reference tokenizer.

    Returns:
        ObservationSet: ``observations`` in plan order (probes without tokens are skipped; a probe
        stored without per-token data but with text is re-tokenized, anomaly ``retokenized_text``),
        and ``excluded``: each response with an ``UNTRUSTED_RESPONSE_ANOMALIES`` kind, none of whose
        positions is observed (neither its tokens nor its text: the text may be sound, but the
        tokens that came with it are not the model's, so nothing of it is scored).
    """
    from auditor.store import queries as q

    bv = _bv(tokenizer)
    obs: list[Observation] = []
    excluded: list[ExcludedResponse] = []
    with store.session() as s:
        for p in q.list_probes(s, run_id, status="done"):
            req = dict(p.request_json or {})
            anomalies: list[str] = list(p.anomalies or [])
            tokens = stored_tokens(q.tokens_for_probe(s, p.id))
            if why := untrusted_response_reasons(anomalies):
                excluded.append(ExcludedResponse(p.id, p.probe_key, why, len(tokens)))
                continue
            if p.reasoning and (p.reasoning_coverage == "answer" or (not tokens and p.reasoning not in (p.text or ""))):
                # the model wrote a reasoning span before these tokens that no token covers: the
                # reference's prefix would be a re-tokenized guess of it (see REASONING_PREFIX_UNKNOWN)
                excluded.append(ExcludedResponse(p.id, p.probe_key, (REASONING_PREFIX_UNKNOWN,), len(tokens)))
                continue
            retokenized = not tokens and bool(p.text)
            if retokenized:
                tokens = _retokenize(p.text or "", bv, tokenizer)
                anomalies.append("retokenized_text")
                if p.reasoning:  # inline think tags: where the span ends in the re-tokenized text is not labelled
                    for t in tokens:
                        t.span = None
            if not tokens:
                continue
            al = align_to_reference(tokens, bv)
            temp, top_p = req.get("temperature"), req.get("top_p")
            prompt_ids = reference_prompt_ids(req, tokenizer, getattr(config, "reasoning_opener", None))
            obs.append(
                Observation(
                    probe_id=p.id, probe_key=p.probe_key, mode=p.mode, workload=p.workload,
                    temperature=float(1.0 if temp is None else temp), top_p=float(1.0 if top_p is None else top_p),
                    request=req, prompt_ids=prompt_ids, tokens=tokens,
                    ref_ids=list(al.ref_ids), spans=list(al.spans), one_to_one=list(al.ref_token_ids),
                    failures=list(al.failures), anomalies=anomalies,
                    provider_prompt_tokens=_usage_prompt_tokens(p.usage),
                    tag_positions=think_tag_positions(tokens),
                    top_k=max(0, int(req["top_k"])) if isinstance(req.get("top_k"), int) else 0,
                    step_final=None if retokenized else _step_final(q.attempts_for_probe(s, p.id), len(tokens)),
                )
            )
    return ObservationSet(obs, excluded)


def _step_final(attempts: Sequence[Any], n_tokens: int) -> list[bool] | None:
    """Per token of a response, whether it closes its streamed chunk: from the last attempt that
    recorded ``tokens_per_chunk`` (the one that answered); None when none did or its chunk sizes
    (non-negative ints) do not add up to ``n_tokens``."""
    tpc = next((a.tokens_per_chunk for a in reversed(attempts) if a.tokens_per_chunk), None)
    if not tpc or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in tpc) \
            or sum(tpc) != n_tokens:
        return None
    out: list[bool] = []
    for c in tpc:
        out.extend([False] * (c - 1) + [True] if c else [])
    return out


def load_observations(store: Store, run_id: str, config: ProviderConfig, tokenizer: Any) -> list[Observation]:
    """The observations of :func:`read_observations` (untrustworthy responses already excluded)."""
    return read_observations(store, run_id, config, tokenizer).observations


def excluded_summary(excluded: Sequence[ExcludedResponse]) -> dict[str, Any] | None:
    """What the run summary stores of the excluded responses (key ``excluded_responses``), None if none.

    Returns:
        ``{"responses": n, "tokens": provider tokens withheld, "reasons": {kind: responses},
        "explanations": {kind: meaning}, "probe_keys": [first EXCLUDED_KEYS_SHOWN keys]}``.
    """
    from auditor.detectors import UNTRUSTED_RESPONSE_ANOMALIES

    if not excluded:
        return None
    reasons: dict[str, int] = {}
    for e in excluded:
        for k in e.reasons:
            reasons[k] = reasons.get(k, 0) + 1
    return {
        "responses": len(excluded),
        "tokens": sum(e.n_tokens for e in excluded),
        "reasons": reasons,
        "explanations": {k: UNTRUSTED_RESPONSE_ANOMALIES[k] for k in reasons},
        "probe_keys": [e.probe_key for e in excluded[:EXCLUDED_KEYS_SHOWN]],
    }


def _usage_prompt_tokens(usage: Any) -> int | None:
    v = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def aligned_ids(observations: Sequence[Observation]) -> list[tuple[int, list[int | None]]]:
    """``(probe_id, one_to_one)`` per observation with stored token rows: the aligned reference ids
    (``ids[position]``, None where the token does not map 1:1) that the analysis' final transaction
    writes to ``normalized_tokens.ref_token_id``. Re-tokenized observations have no stored rows."""
    return [(o.probe_id, o.one_to_one) for o in observations if "retokenized_text" not in o.anomalies]


# ------------------------------------------------------------------------------------------ texts
def _token_text(bv: ByteVocab, tid: int) -> str:
    b = bv.id_bytes.get(int(tid))
    if b is None:
        for s, i in bv.special.items():
            if i == tid:
                return s
        return f"#{tid}"
    return b.decode("utf-8", errors="replace")
