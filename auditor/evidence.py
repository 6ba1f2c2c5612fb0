"""Evidence stage of ``auditor check``: stored tokens → observations → ``EvidenceBatch``.

- :func:`load_observations` reads each finished probe's tokens as the runner stored them
  (``normalized_tokens``: bytes, logprob, alternatives with their bytes, anomalies — each response
  is normalized exactly once, at probe time, by ``auditor.runner``) and aligns them to the
  reference tokenizer through bytes (``probes.align``). It writes nothing: the aligned ids go to
  ``normalized_tokens.ref_token_id`` in the analysis' final transaction
  (:func:`store_aligned_ids`, called by ``auditor.audit.analyze_run``).
- :func:`build_evidence` turns observations (+ the reference scores of one precision) into one
  ``auditor.detectors.EvidenceBatch`` over the comparable positions.
- :func:`enrich_evidence` adds token texts and context to the detectors' evidence rows.

Only positions that map 1:1 onto a reference token are compared (a 1:n token has no single
reference distribution); alignment failures end a continuation and are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from probes.align import AlignmentFailure, ByteVocab, align_to_reference
from probes.align import _byte_vocab as _bv
from probes.records import TokenRecord

if TYPE_CHECKING:  # pragma: no cover
    from auditor.detectors import DetectorResult, EvidenceBatch
    from auditor.store import Store
    from auditor.store.models import NormalizedToken
    from probes.config import ProviderConfig
    from reference.scoring import ScoredContinuation

__all__ = [
    "EVIDENCE_CONTEXT_CHARS",
    "EvidenceIndex",
    "Observation",
    "build_evidence",
    "enrich_evidence",
    "load_observations",
    "store_aligned_ids",
    "tokenizer_mismatch",
]

#: Characters of provider text kept before an evidence position (``context``).
EVIDENCE_CONTEXT_CHARS = 60


@dataclass
class Observation:
    """One finished probe, read from the store and aligned to the reference tokenizer.

    Attributes:
        probe_id, probe_key, mode, workload: from the ``probes`` row.
        temperature: requested temperature; top_p: requested top_p (1.0 when not sent).
        request: the JSON body sent.
        prompt_ids: reference prompt token ids (chat template applied for ``api = chat``).
        tokens: ``probes.records.TokenRecord`` list, as stored (bytes of alternatives included).
        ref_ids: reference continuation ids (teacher-forced), covering ``aligned_prefix`` tokens.
        spans: per provider token, ``(start, end)`` into ``ref_ids`` or None.
        one_to_one: per provider token, the single reference id or None.
        failures: alignment failures (``probes.align.AlignmentFailure``).
        anomalies: response-level anomaly kinds.
        provider_prompt_tokens: the provider's ``usage.prompt_tokens`` (None when not reported).
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
                                               logprob=r.logprob, top_logprobs=tops, anomalies=list(r.anomalies or [])))
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
                    anomalies=["retokenized"])
        for i, tid in enumerate(tokenizer.encode(text, add_special_tokens=False))
    ]


def _prompt_ids(req: dict[str, Any], tokenizer: Any) -> list[int]:
    from reference.scoring import encode_prompt

    if "messages" in req:
        return list(encode_prompt(tokenizer, req["messages"], chat=True))
    prompt = req.get("prompt")
    return list(encode_prompt(tokenizer, prompt[0] if isinstance(prompt, list) else str(prompt or ""), chat=False))


def load_observations(store: Store, run_id: str, config: ProviderConfig, tokenizer: Any) -> list[Observation]:
    """Read and align every ``done`` probe of a run (read only; see :func:`store_aligned_ids`).

    Args:
        store: open ``auditor.store.Store``; run_id: the audit run.
        config: the provider's ``ProviderConfig`` (kept for the backends' signature; tokens were
            normalized with its api and ``max_top_logprobs`` at probe time).
        tokenizer: the reference tokenizer.

    Returns:
        Observations in plan order (probes without tokens are skipped). A probe stored without
        per-token data but with text is re-tokenized (anomaly ``retokenized_text``).
    """
    from auditor.store import queries as q

    bv = _bv(tokenizer)
    obs: list[Observation] = []
    with store.session() as s:
        for p in q.list_probes(s, run_id, status="done"):
            req = dict(p.request_json or {})
            anomalies: list[str] = list(p.anomalies or [])
            tokens = stored_tokens(q.tokens_for_probe(s, p.id))
            if not tokens and p.text:
                tokens = _retokenize(p.text, bv, tokenizer)
                anomalies.append("retokenized_text")
            if not tokens:
                continue
            al = align_to_reference(tokens, bv)
            temp, top_p = req.get("temperature"), req.get("top_p")
            obs.append(
                Observation(
                    probe_id=p.id, probe_key=p.probe_key, mode=p.mode, workload=p.workload,
                    temperature=float(1.0 if temp is None else temp), top_p=float(1.0 if top_p is None else top_p),
                    request=req, prompt_ids=_prompt_ids(req, tokenizer), tokens=tokens,
                    ref_ids=list(al.ref_ids), spans=list(al.spans), one_to_one=list(al.ref_token_ids),
                    failures=list(al.failures), anomalies=anomalies,
                    provider_prompt_tokens=_usage_prompt_tokens(p.usage),
                )
            )
    return obs


def _usage_prompt_tokens(usage: Any) -> int | None:
    v = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def store_aligned_ids(session: Any, observations: Sequence[Observation]) -> None:
    """Write each observation's aligned reference ids to ``normalized_tokens.ref_token_id``, in the
    caller's transaction (the analysis' final one). Re-tokenized observations have no stored rows."""
    from auditor.store import queries as q

    for o in observations:
        if "retokenized_text" not in o.anomalies:
            q.set_ref_token_ids(session, o.probe_id, o.one_to_one)


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


def build_evidence(
    observations: Sequence[Observation],
    scored: Sequence[ScoredContinuation] | None,
    tokenizer: Any,
) -> tuple[EvidenceBatch, EvidenceIndex]:
    """One ``EvidenceBatch`` over every comparable position (provider token mapping 1:1 onto a
    reference token, inside the aligned prefix).

    Args:
        observations: from :func:`load_observations`.
        scored: per observation the reference's ScoredContinuation over ``ref_ids`` (None = no
            reference: only the self-consistency detectors can run).
        tokenizer: the reference tokenizer (maps the provider's alternatives to reference ids).

    Returns:
        (EvidenceBatch, EvidenceIndex). Shapes: N positions; reference top-K = scored top_k;
        provider width M = the most alternatives any position listed.
    """
    from auditor.detectors import UNTRUSTED_LOGPROB_ANOMALIES, EvidenceBatch
    from auditor.scoring import REFERENCE_TOP_K

    bv = _bv(tokenizer)
    rows: list[tuple[int, int]] = []
    ref_rows: list[int] = []
    for oi, o in enumerate(observations):
        if o.temperature > 0 and o.top_p < 1.0:
            continue  # sampling tests assume the full distribution (top_p = 1)
        for ti, tid in enumerate(o.one_to_one):
            span = o.spans[ti]
            if tid is None or span is None:
                continue
            rows.append((oi, ti))
            ref_rows.append(span[0])
    n = len(rows)
    m = max((len(observations[oi].tokens[ti].top_logprobs) for oi, ti in rows), default=0)
    p_ids = np.full((n, m), -1, np.int64)
    p_lp = np.full((n, m), -np.inf)
    p_tok = np.empty(n, dtype=object)
    trusted = np.ones(n, bool)
    prompt_ids, positions, token_ids, temps, texts = [], [], [], [], []
    for j, (oi, ti) in enumerate(rows):
        o = observations[oi]
        t = o.tokens[ti]
        prompt_ids.append(o.probe_key)
        positions.append(ti)
        token_ids.append(int(o.one_to_one[ti]))  # type: ignore[arg-type]  # rows hold 1:1 positions only
        temps.append(o.temperature)
        texts.append(t.token)
        p_tok[j] = t.logprob
        if set(t.anomalies or ()) & UNTRUSTED_LOGPROB_ANOMALIES:
            trusted[j] = False
        c = 0
        for tok, b, lp in t.top_logprobs:
            aid = _alt_id(bv, tok, b)
            if aid is None or lp is None:
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
        **kw,
    )
    return batch, EvidenceIndex(rows)


# ------------------------------------------------------------------------------------------ texts
def _token_text(bv: ByteVocab, tid: int) -> str:
    b = bv.id_bytes.get(int(tid))
    if b is None:
        for s, i in bv.special.items():
            if i == tid:
                return s
        return f"#{tid}"
    return b.decode("utf-8", errors="replace")


def enrich_evidence(
    results: list[DetectorResult], observations: Sequence[Observation], tokenizer: Any
) -> list[DetectorResult]:
    """Add token texts (``token``, ``ref_top5_tokens``, ``provider_top5_tokens``) and the
    preceding provider text (``context``) to every evidence row, so reports need no tokenizer."""
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
    n_checked = 0

    def check(tok: str, b: bytes | None) -> None:
        nonlocal n_checked
        if b is None:
            return
        n_checked += 1
        # added tokens (gemma's whitespace/HTML runs) live in ``special`` under their text, not in ``by_bytes``
        known = tok in bv.special or b in bv.by_bytes or b.decode("utf-8", errors="replace") in bv.special
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
        "prompt_counts": [[a, b] for a, b in dis[:8]],
        "n_prompt_disagree": len(dis),
        "n_prompt_checked": len(pairs) if api == "completions" else 0,
        "offsets": offsets[:8],
    }
