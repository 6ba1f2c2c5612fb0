"""Response normalizer: provider responses (chat or completions, plain or SSE) → per-token records.

Every provider answer is evidence, including the broken ones, so :func:`normalize_response`
never raises on a malformed body: it returns what it can and lists *anomalies* (vocabulary in
``../shared/cases/README.md``, plus the extra kinds below).

Per generated token it yields a :class:`TokenRecord` with

- ``bytes``: the authoritative bytes, recovered through the answer text (every reading of a
  token and the text-guided choice: :mod:`probes.byte_recovery`). A token's correct ``bytes``
  field is never overwritten by a U+FFFD of the text or token string; a token gets bytes only
  when every assignment that reproduces the text agrees on its span, otherwise ``None``
  (reported, never guessed);
- ``logprob``: the chosen token's logprob in nats as a finite number ≤ 0, or ``None`` when it is
  censored or untrustworthy: null/NaN/±inf (``nonfinite_logprob``), the ``-9999`` "not in top-k"
  sentinel or any value ≤ -9999 (``sentinel_logprob``), ≤ -1e30 (``masked_logit``), > 1e-6
  (``positive_logprob``), or exactly 0.0 while the other listed alternatives hold more than 1e-3
  of probability (``mass_exceeds_one``; two or more in a row → ``zero_logprob_run``);
- ``top_logprobs``: ``(token, bytes, logprob)`` alternatives, in the order given; logprobs obey the
  same rule (``None`` for masked, padded, sentinel or non-finite entries), so every float in a
  record is finite and JSON-safe. At most the asked count + 1 are kept while parsing (the
  chosen token's entry and the highest others; ``top_logprobs_excess`` counts the rest), so
  memory and storage follow the request, not the provider (issue 37, item 11).

Extra anomaly kinds (beyond the shared vocabulary): ``malformed_json`` (body or an SSE event is
not JSON), ``truncated_stream`` (no ``data: [DONE]``), ``provider_error`` (an ``error`` object),
``malformed_response`` (JSON without the expected structure), ``spm_token_strings`` (SentencePiece
``▁`` leaked into token strings), ``replacement_char_text`` (the text and token strings carry
U+FFFD where the tokens' ``bytes`` hold a valid character: per-token decoding by the runtime;
the bytes are kept). Byte spellings of partial characters (``<0xC3>``,
``bytes:\\xc3``, `` \\xc3``) are a legitimate convention and are decoded without an anomaly.

Source for the wire formats: OpenAI API reference (chat ``logprobs.content[]`` with ``token``,
``logprob``, ``bytes``, ``top_logprobs``; legacy completions ``tokens``, ``token_logprobs``,
``top_logprobs`` dicts, ``text_offset``, ``echo``), and the public bug reports cited by each case.
Either logprobs shape is accepted on either API (some servers answer ``/v1/completions`` with
the chat shape). SSE and in-band error objects are read by :mod:`probes.sse`, the parser the
client uses too. ``text_offset`` is used only when it is monotonic and agrees with the tokens'
lengths.

Reasoning models (issue 35): the reasoning text arrives in ``message.reasoning_content`` /
``message.reasoning``, streamed as ``delta.reasoning_content`` / ``delta.reasoning``
(``probes.reasoning.REASONING_FIELDS``), or inline between think tags in ``content`` where no parser runs
(``probes.reasoning.THINK_TAGS``); ``logprobs.content`` covers the reasoning tokens (think tags included, as
the parser consumed them from the text) and then the answer, or the answer only. Each token gets
a span label (``TokenRecord.span``: ``reasoning`` / ``answer``); the tokens' bytes are recovered
against reasoning + answer where they cover both, against the answer where they cover only it,
and a reasoning response that fits neither is reported ``reasoning_logprobs_inconsistent``
(never ``bytes_text_mismatch``). Formats followed: vLLM v0.11 ``vllm/reasoning/basic_parsers.py``
(``BaseThinkingReasoningParser``: the text before ``</think>`` is reasoning, ``<think>``
optional because DeepSeek-R1's template opens it in the prompt; the streamed delta that holds
the close tag sends its tag-less text, the tag tokens keep their logprob entries) and
``deepseek_r1_reasoning_parser.py`` / ``qwen3_reasoning_parser.py``, with the field renamed
``reasoning_content`` → ``reasoning`` in ``entrypoints/openai/protocol.py`` (v0.11); SGLang
v0.5 ``python/sglang/srt/parser/reasoning_parser.py`` (``reasoning_content``; ``deepseek-r1``,
``qwen3``, ``kimi_k2`` with ``◁think▷``…``◁/think▷``); DeepSeek's API ``reasoning_content``.

Usage: :attr:`NormalizedResponse.usage` keeps the provider's ``usage`` object with its token
counts checked (non-negative integers); :attr:`NormalizedResponse.usage_missing` is True when
the provider reported no usable ``prompt_tokens``/``completion_tokens`` (e.g. a stream without
``stream_options.include_usage``): the caller then counts with the reference tokenizer and marks
the figure estimated.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from probes.byte_recovery import (
    FFFD as _FFFD,
)
from probes.byte_recovery import (
    SPELLED as _SPELLED,
)
from probes.byte_recovery import (
    alt_bytes,
    assign_bytes,
    byte_spelling,
    candidates,
    gpt2_unicode_to_bytes,
    lossy_text_consistent,
    valid_byte_list,
)
from probes.reasoning import REASONING_FIELDS, THINK_TAGS
from probes.records import NormalizedResponse, TokenRecord
from probes.sse import BODY_ANOMALIES, find_error, loads_json, looks_like_plain_json, parse_sse

__all__ = [
    "ANOMALY_KINDS",
    "MASKED_THRESHOLD",
    "SENTINEL_THRESHOLD",
    "NormalizedResponse",
    "TokenRecord",
    "gpt2_unicode_to_bytes",
    "normalize_response",
]

#: A logprob at or below this is a placeholder, not a model number (OpenAI documents -9999.0).
SENTINEL_THRESHOLD = -9999.0
#: A logprob at or below this is a masked logit leaking as a number (float32 lowest ≈ -3.4e38).
MASKED_THRESHOLD = -1e30
#: Positive slack for rounding noise on logprobs (nats).
POSITIVE_TOL = 1e-6
#: Probability-mass slack for the listed alternatives.
MASS_TOL = 1e-3
#: Alternatives kept per token when the request did not say how many it asked for (no logprobs
#: asked, or no request known): a provider's unasked list is bounded too.
MAX_UNASKED_ALTERNATIVES = 20

_TAG_STRINGS = frozenset(x for pair in THINK_TAGS for x in pair)

#: Every anomaly kind this module can report, with its meaning.
ANOMALY_KINDS: dict[str, str] = {
    "sentinel_logprob": "a placeholder (e.g. -9999.0) in a chosen or alternative logprob",
    "masked_logit": "a logprob at or below -1e30 (masked logit leaking as a number); treated as -inf",
    "nonfinite_logprob": "NaN, null or ±inf where a chosen token's logprob should be",
    "positive_logprob": "a logprob above +1e-6",
    "mass_exceeds_one": "the listed alternatives' probabilities sum above 1 + 1e-3",
    "chosen_not_in_top": "top_logprobs returned but the chosen token, which belongs there, is not among them",
    "greedy_not_argmax": "temperature 0, and the chosen token is not the top-1 alternative",
    "top_logprobs_short": "fewer finite alternatives than requested (and than the provider's cap)",
    "top_logprobs_padded": "alternatives padded with -inf to reach the requested count",
    "zero_logprob_run": "two or more consecutive chosen tokens at exactly 0.0 while finite alternatives hold mass",
    "duplicate_stream_top_logprobs": "streamed tokens repeating an earlier token's alternatives with a different chosen token",
    "replacement_char_bytes": "token bytes are U+FFFD although the text has no U+FFFD",
    "surrogate_token_strings": "token strings in GPT-2 byte-to-unicode form (Ġ, Ċ, …) instead of text",
    "bytes_text_mismatch": "after every recovery, the tokens' bytes still do not reproduce the text",
    "echo_ignored": "echo with logprobs was asked, but no prompt-token logprobs came back",
    "missing_logprobs": "logprobs were asked, none (or not for every token) came back",
    "spm_token_strings": "SentencePiece '▁' word-boundary marks leaked into token strings",
    "replacement_char_text": "text/token strings carry U+FFFD where the tokens' bytes hold a valid character; bytes kept",
    "top_logprobs_excess": "more alternatives than asked (+1 for the chosen token); only the asked number are kept",
    "malformed_usage": "the usage object's token counts are not non-negative integers (dropped)",
    "reasoning_logprobs_inconsistent": "a reasoning response whose logprobs spell neither the answer alone nor the reasoning then the answer",
    **BODY_ANOMALIES,  # malformed_json, malformed_response, truncated_stream, empty_stream, provider_error: shared with the client
}


# -- logprob values -------------------------------------------------------------------------

def _as_float(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _classify(v: Any) -> tuple[float | None, str | None, float | None]:
    """Reported value → (usable logprob or None, anomaly kind or None, raw finite value or None)."""
    f = _as_float(v)
    if f is None or math.isnan(f):
        return None, "nonfinite_logprob", None
    if math.isinf(f):
        return None, ("padded_inf" if f < 0 else "nonfinite_logprob"), None
    if f <= MASKED_THRESHOLD:
        return None, "masked_logit", f
    if f <= SENTINEL_THRESHOLD:
        return None, "sentinel_logprob", f
    if f > POSITIVE_TOL:
        return None, "positive_logprob", f
    return f, None, f


# -- raw extraction -------------------------------------------------------------------------

@dataclass
class _RawTok:
    token: str
    given: bytes | None
    lp: Any
    top: list[tuple[str, bytes | None, Any]]
    offset: int | None = None
    excess: int = 0
    """Alternatives the provider listed beyond what was kept (:func:`_cap_alternatives`)."""


@dataclass
class _Acc:
    anomalies: dict[str, None] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)
    keep_alternatives: int = MAX_UNASKED_ALTERNATIVES
    """Alternatives kept per token while parsing (the request's count + 1, :func:`_cap_alternatives`)."""

    def add(self, kind: str, index: int | None = None, detail: str = "") -> None:
        self.anomalies.setdefault(kind, None)
        self.details.append({"kind": kind, "index": index, "detail": detail})


def _entries(lp: Any, acc: _Acc) -> list[_RawTok] | None:
    """Per-token entries of a ``logprobs`` object in either shape, whatever the API: chat
    (``content: [{token, logprob, bytes, top_logprobs}]``) or legacy completions (``tokens``,
    ``token_logprobs``, ``top_logprobs``, ``text_offset``). ``None`` when none came back."""
    if lp is None:
        return None
    if not isinstance(lp, dict):
        acc.add("malformed_response", None, "logprobs is not an object")
        return None
    if lp.get("content") is not None:
        return _chat_entries(lp.get("content"), acc)
    if lp.get("tokens") is not None:
        return _completion_entries(lp, acc)
    return None


def _alternatives(tl: Any, keep: int, chosen: str) -> tuple[list[tuple[str, bytes | None, Any]], int]:
    """``top_logprobs`` of one token (a list of ``{token, logprob, bytes}`` or a ``{token: logprob}``
    dict) → (at most ``keep`` alternatives, number dropped); see :func:`_cap_alternatives`."""
    if isinstance(tl, dict):
        pairs = _cap_alternatives(list(tl.items()), keep, chosen, dict_items=True)
        return [(str(k), None, v) for k, v in pairs], len(tl) - len(pairs)
    if not isinstance(tl, list):
        return [], 0
    listed = [a for a in tl if isinstance(a, dict)]
    kept = _cap_alternatives(listed, keep, chosen)
    top: list[tuple[str, bytes | None, Any]] = []
    for a in kept:
        at = a.get("token")
        top.append((at if isinstance(at, str) else str(at), valid_byte_list(a.get("bytes")), a.get("logprob")))
    return top, len(listed) - len(kept)


def _cap_alternatives(listed: list[Any], keep: int, chosen: str, *, dict_items: bool = False) -> list[Any]:
    """At most ``keep`` of one token's listed alternatives (issue 37, item 11: memory and storage
    follow the request, not the provider): unchanged when within ``keep``; otherwise the chosen
    token's entry (when listed) and the highest-logprob others (NaN, non-numbers and -inf last), in
    the order given (``keep - 1`` others: the last place is the chosen token's). O(len(listed)) time, O(keep) extra memory (``heapq.nlargest``); never raises.

    ``listed``: alternative dicts (``{token, logprob, bytes}``), or ``(token, logprob)`` pairs when
    ``dict_items``."""
    if len(listed) <= keep:
        return listed

    def tok(a: Any) -> Any:
        return a[0] if dict_items else a.get("token")

    def score(ia: tuple[int, Any]) -> float:
        f = _as_float(ia[1][1] if dict_items else ia[1].get("logprob"))
        return f if f is not None and not math.isnan(f) else -math.inf

    ci = next((i for i, a in enumerate(listed) if tok(a) == chosen), None) if keep > 0 else None
    rest = keep - 1  # the last place is the chosen token's, listed or not
    best = heapq.nlargest(rest, ((i, a) for i, a in enumerate(listed) if i != ci), key=score) if rest > 0 else []
    idx = sorted([i for i, _a in best] + ([ci] if ci is not None else []))
    return [listed[i] for i in idx]


def _chat_entries(content: Any, acc: _Acc) -> list[_RawTok] | None:
    if not isinstance(content, list):
        acc.add("malformed_response", None, "logprobs.content is not a list")
        return None
    out: list[_RawTok] = []
    for e in content:
        if not isinstance(e, dict):
            acc.add("malformed_response", len(out), "logprobs entry is not an object")
            continue
        tok = e.get("token")
        tok = tok if isinstance(tok, str) else ("" if tok is None else str(tok))
        top, excess = _alternatives(e.get("top_logprobs"), acc.keep_alternatives, tok)
        out.append(_RawTok(tok, valid_byte_list(e.get("bytes")), e.get("logprob"), top, excess=excess))
    return out


def _completion_entries(lp: dict[str, Any], acc: _Acc) -> list[_RawTok] | None:
    toks = lp.get("tokens")
    if not isinstance(toks, list):
        acc.add("malformed_response", None, "logprobs.tokens is not a list")
        return None
    lps = lp.get("token_logprobs")
    tops = lp.get("top_logprobs")
    offs = lp.get("text_offset")
    lps = lps if isinstance(lps, list) else []
    tops = tops if isinstance(tops, list) else []
    offs = offs if isinstance(offs, list) else []
    if lp.get("token_logprobs") is not None and len(lps) != len(toks):
        acc.add("malformed_response", None, f"{len(toks)} tokens but {len(lps)} token_logprobs")
    out: list[_RawTok] = []
    for i, t in enumerate(toks):
        t = t if isinstance(t, str) else str(t)
        off = offs[i] if i < len(offs) and isinstance(offs[i], int) and not isinstance(offs[i], bool) else None
        top, excess = _alternatives(tops[i] if i < len(tops) else None, acc.keep_alternatives, t)
        out.append(_RawTok(t, None, lps[i] if i < len(lps) else None, top, off, excess))
    return out


def _reasoning_field(obj: dict[str, Any]) -> tuple[str, str] | None:
    """``(field name, text)`` of the reasoning field in a ``message`` or ``delta`` object: the first
    (``REASONING_FIELDS`` order) holding a non-empty string, else the first holding a string (a
    server sending both names, one of them empty), else ``None``."""
    found = [(name, v) for name in REASONING_FIELDS if isinstance(v := obj.get(name), str)]
    return next((f for f in found if f[1]), found[0] if found else None)


def _assemble_stream(
    api: str, events: list[Any], choice: int, acc: _Acc, logprobs_asked: bool
) -> tuple[str, list[_RawTok] | None, Any, Any, int, tuple[str, str] | None]:
    """Merge SSE chunks of one choice → (text, raw tokens or None, finish_reason, usage,
    number of content events, i.e. events that carry this choice, and ``(field, reasoning
    text)`` when any delta carried a reasoning field, else ``None``)."""
    texts: list[str] = []
    reasoning: list[str] = []
    reasoning_name: str | None = None
    toks: list[_RawTok] | None = None
    finish = None
    usage = None
    chunks_without_lp = 0
    n_content = 0
    for ev in events:
        if not isinstance(ev, dict):
            acc.add("malformed_response", None, "stream event is not an object")
            continue
        if isinstance(ev.get("usage"), dict):
            usage = ev["usage"]
        chs = ev.get("choices")
        if not isinstance(chs, list):
            continue
        for ch in chs:
            if not isinstance(ch, dict) or ch.get("index", 0) != choice:
                continue
            n_content += 1
            if api == "chat":
                d = ch.get("delta")
                delta = d if isinstance(d, dict) else {}
                piece = delta.get("content")
                rf = _reasoning_field(delta)
                if rf is not None:
                    reasoning_name = reasoning_name or rf[0]
                    reasoning.append(rf[1])
            else:
                piece = ch.get("text")
            entries = _entries(ch.get("logprobs"), acc)
            piece = piece if isinstance(piece, str) else ""
            texts.append(piece)
            if entries is not None:
                if toks is None:
                    toks = []
                toks.extend(entries)
            elif piece:
                chunks_without_lp += 1
            finish = ch.get("finish_reason") or finish
    if logprobs_asked and toks is not None and chunks_without_lp:
        acc.add("missing_logprobs", None, f"{chunks_without_lp} text chunk(s) without logprobs")
    found = (reasoning_name, "".join(reasoning)) if reasoning_name is not None else None
    return "".join(texts), toks, finish, usage, n_content, found


def _clean_usage(usage: Any, acc: _Acc) -> tuple[dict[str, Any] | None, bool]:
    """(usage with checked counts, usage_missing). Counts that are not non-negative ints are
    dropped (``malformed_usage``) so no caller can trip on a hostile value."""
    if not isinstance(usage, dict):
        return None, True
    out = dict(usage)
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if k in out:
            v = out[k]
            if v is None:
                del out[k]
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 10**12:
                acc.add("malformed_usage", None, f"usage.{k} = {str(v)[:40]!r}")
                del out[k]
    missing = not ("prompt_tokens" in out and "completion_tokens" in out)
    return out, missing


# -- reasoning spans ------------------------------------------------------------------------

@dataclass
class _Layout:
    """Where a response's tokens stand against its reasoning and answer.

    ``target``: the text the tokens' bytes are recovered against (``None``: no text guides them);
    ``boundary``: byte offset in ``target`` where the reasoning span ends (0: every token is
    answer; ``None``: unknown); ``reasoning``/``source``/``coverage``: as in
    :class:`NormalizedResponse` (``reasoning``, ``reasoning_source``, ``reasoning_coverage``).
    """

    target: str | None
    boundary: int | None
    reasoning: str | None = None
    source: str | None = None
    coverage: str | None = None
    n_reasoning: int | None = None
    """When set, the number of leading tokens in the reasoning span (used instead of ``boundary``)."""


def _inline_reasoning(text: str) -> tuple[str, int] | None:
    """``(reasoning, end)`` of an inline think block in ``text`` (``end``: the character index
    just past the close tag, or ``len(text)`` when the block is never closed), else ``None``.

    A close tag without an open tag counts (DeepSeek-R1's template puts ``<think>\\n`` in the
    prompt, so the model's output starts inside the reasoning); an open tag counts only at the
    start of the text."""
    for o, c in THINK_TAGS:
        ci = text.find(c)
        if ci >= 0:
            oi = text.find(o, 0, ci)
            start = oi + len(o) if oi >= 0 else 0
            return text[start:ci], ci + len(c)
        st = text.lstrip()
        if st.startswith(o):
            return st[len(o):], len(text)
    return None


def _split_reasoning(s: str, reasoning: str, answer: str) -> int | None:
    """Character index in ``s`` (the tokens' own text) where the reasoning span ends, when ``s``
    spells ``[open tag] reasoning close-tag answer`` — up to the whitespace at the span
    boundaries, which parsers strip or move between the two fields (vLLM streams the blank line
    after ``</think>`` as reasoning; non-streaming it is the answer's) — else ``None``.

    The close tag must be among the tokens when there is an answer: the model generated it, and
    tokens that skip it leave a gap before the answer (its positions would be scored after a
    prefix the model never saw). Without an answer (cut inside the reasoning) it may be absent."""
    a = answer.strip()
    body = s.rstrip()
    if a:
        if not body.endswith(a):
            return None
        head = body[: len(body) - len(a)]
    else:
        head = body
    end = len(head.rstrip())
    core = head.strip()
    pair = next(((o, c) for o, c in THINK_TAGS if core.endswith(c)), None)
    if pair is not None:
        core = core[: -len(pair[1])].strip()
    elif a:
        return None  # an answer after a reasoning span never closed: the token(s) that closed it are missing
    else:
        end = len(s)  # never closed, no answer: cut inside the reasoning, trailing whitespace included
    for o, _ in (pair,) if pair is not None else THINK_TAGS:
        if core.startswith(o):
            core = core[len(o):]
            break
    return end if core.strip() == reasoning.strip() else None


def _tokens_before(raw: list[_RawTok], s: str, end: int) -> int:
    """How many of ``raw`` start before character ``end`` of ``s``, under the reading (see
    :func:`_readings`) that spells ``s``, decoded prefix by prefix."""
    for f in _READERS:
        parts = [f(t) for t in raw]
        if b"".join(parts).decode("utf-8", errors="replace") != s:
            continue
        n, acc = 0, b""
        for b in parts:
            if len(acc.decode("utf-8", errors="replace")) >= end:
                break
            n += 1
            acc += b
        return n
    return 0


def _read_one(t: _RawTok) -> bytes:
    if t.given is None or (t.given == b"" and t.token in _TAG_STRINGS):  # a tag given with empty bytes
        return t.token.encode("utf-8", errors="surrogatepass")
    return t.given


def _read_gpt2(t: _RawTok) -> bytes:
    g = gpt2_unicode_to_bytes(t.token) if t.given is None else None
    return g if g is not None else _read_one(t)


def _read_spm(t: _RawTok) -> bytes:
    return t.token.replace("\u2581", " ").encode("utf-8", errors="surrogatepass") if t.given is None else _read_one(t)


_READERS = (_read_one, _read_gpt2, _read_spm)


def _readings(raw: list[_RawTok]) -> list[str]:
    """The tokens' own text under each plain reading (the ``bytes`` fields, else the strings as
    UTF-8; the GPT-2 and SentencePiece forms), decoded (invalid sequences as U+FFFD): distinct strings."""
    out: list[str] = []
    for f in _READERS:
        # invalid sequences (a model that emits a partial character) read as U+FFFD, as the
        # engine's detokenizer writes them into the reasoning and answer texts
        s = b"".join(f(t) for t in raw).decode("utf-8", errors="replace")
        if s not in out:
            out.append(s)
    return out


def _reasoning_layout(raw: list[_RawTok], found: tuple[str, str] | None, text: str | None, acc: _Acc) -> _Layout:
    """Decide what the per-token logprobs cover in a reasoning response, and against which text
    their bytes are recovered.

    ``found``: ``(field, reasoning text)`` from ``message``/``delta`` (``None``: no reasoning
    field; inline think tags in ``text`` are then looked for). Tried in order: the tokens spell
    the answer only (``coverage = "answer"``); they spell reasoning then answer
    (``"both"``; for a field, the think tags the parser consumed are expected among the tokens
    and the whitespace at the span boundaries is taken from the tokens); else, when there is
    reasoning text, anomaly ``reasoning_logprobs_inconsistent`` (``"inconsistent"``: no text
    guides the bytes, no span is labelled, and the audit excludes the response with that reason).
    A response without reasoning keeps ``text`` as its target with every token in the answer.
    """
    if found is None:
        inline = _inline_reasoning(text) if text else None
        if inline is None or text is None:
            return _Layout(text, 0)
        reasoning, cut = inline
        source, answer = "inline", text[cut:]
    else:
        source, reasoning = found
        answer, cut = text or "", -1
    if not raw:
        return _Layout(text, 0, reasoning, source)
    has_fffd = "\ufffd" in (text or "") or "\ufffd" in reasoning
    cands = [candidates(t.token, t.given, has_fffd) for t in raw]

    def spells(target: str) -> bool:
        return assign_bytes(cands, target.encode("utf-8", errors="surrogatepass")) is not None

    if spells(answer):
        return _Layout(answer, 0, reasoning, source, "answer")
    if source == "inline" and text is not None:
        if spells(text):
            return _Layout(text, len(text[:cut].encode("utf-8", errors="surrogatepass")), reasoning, source, "both")
    else:
        for s in _readings(raw):
            end = _split_reasoning(s, reasoning, answer)
            if end is not None and spells(s):
                return _Layout(s, None, reasoning, source, "both", n_reasoning=_tokens_before(raw, s, end))
    if reasoning.strip():
        acc.add(
            "reasoning_logprobs_inconsistent",
            None,
            f"{len(raw)} tokens spell neither the answer ({len(answer)} chars) nor reasoning "
            f"({len(reasoning)} chars, {source}) then answer",
        )
        return _Layout(None, None, reasoning, source, "inconsistent")
    return _Layout(text, 0, reasoning, source)


def _label_spans(toks: list[TokenRecord], layout: _Layout) -> None:
    """Set each token's ``span``: the first ``layout.n_reasoning`` tokens ``"reasoning"`` when it
    is set, else from ``layout.boundary``: ``"reasoning"`` when the token starts
    before it, else ``"answer"``; ``None`` for every token from the first one whose bytes are
    unknown (its position in the text is then unknown), and for all when the boundary is."""
    if layout.n_reasoning is not None:
        for k, t in enumerate(toks):
            t.span = "reasoning" if k < layout.n_reasoning else "answer"
        return
    pos: int | None = 0 if layout.boundary is not None else None
    for t in toks:
        if pos is None or layout.boundary is None:
            t.span = None
            continue
        t.span = "reasoning" if pos < layout.boundary else "answer"
        pos = pos + len(t.bytes) if t.bytes is not None else None


# -- main entry point -----------------------------------------------------------------------

def _requested(api: str, request: dict[str, Any]) -> tuple[bool, int]:
    """(logprobs asked?, alternatives asked per token)."""
    if api == "chat":
        asked = bool(request.get("logprobs"))
        k = request.get("top_logprobs") if asked else 0
    else:
        lp = request.get("logprobs")
        asked = lp is not None and lp is not False
        k = lp if asked else 0
    k = k if isinstance(k, int) and not isinstance(k, bool) else 0
    return asked, max(0, k)


def _tok_key(tok: str, b: bytes | None) -> bytes:
    return b if b is not None else tok.encode("utf-8", errors="surrogatepass")


def normalize_response(
    api: str,
    request: dict[str, Any] | None,
    response: dict[str, Any] | list[Any] | None = None,
    response_text: str | None = None,
    stream: bool = False,
    *,
    choice: int = 0,
    max_top_logprobs: int | None = None,
) -> NormalizedResponse:
    """Normalize one provider response into per-token records plus anomalies. Never raises.

    Args:
        api: ``"chat"`` (``/v1/chat/completions``) or ``"completions"`` (``/v1/completions``).
        request: the JSON body that was sent (temperature, logprobs/top_logprobs, echo, prompt).
        response: the decoded JSON body (a list of chunk dicts when ``stream``), or ``None``.
        response_text: the raw body when ``response`` is ``None`` (non-strict JSON such as
            ``-Infinity`` is accepted; for ``stream`` the SSE text).
        stream: whether the body is a server-sent-events stream.
        choice: which choice to normalize (``n > 1``).
        max_top_logprobs: the provider's cap on alternatives, if known (``top_logprobs_short``
            is not reported when the provider returned its cap).

    Returns:
        :class:`NormalizedResponse`; the text is ``""`` and ``tokens`` empty when nothing usable
        came back (the anomalies say why).
    """
    acc = _Acc()
    request = request if isinstance(request, dict) else {}
    if api not in ("chat", "completions"):
        acc.add("malformed_response", None, f"unknown api {api!r}")
        return NormalizedResponse(text="", n_tokens=None, tokens=[], anomalies=list(acc.anomalies), anomaly_details=acc.details)
    asked, k_req = _requested(api, request)
    acc.keep_alternatives = k_req + 1 if asked else MAX_UNASKED_ALTERNATIVES + 1  # +1: the chosen token (vLLM lists it)
    temperature = _as_float(request.get("temperature"))
    greedy = temperature is not None and temperature == 0.0

    body: Any = response
    events: list[Any] | None = None
    if body is None and response_text is not None:
        if stream and looks_like_plain_json(response_text):
            stream = False  # the server ignored stream=true and answered with a plain JSON body
        if stream:
            sse = parse_sse(response_text)
            events = list(sse.events)
            for detail in sse.malformed:
                acc.add("malformed_json", None, f"SSE {detail}")
            for idx, sse_err in sse.errors:
                acc.add("provider_error", None, f"SSE event {idx}: {sse_err.describe()}")
            if not sse.done:
                acc.add("truncated_stream", None, f"{len(events)} events, no data: [DONE]")
        else:
            try:
                body = loads_json(response_text)
            except ValueError as exc:
                acc.add("malformed_json", None, str(exc)[:200])
                body = None
    elif stream and isinstance(body, list):
        events = body
        for idx, ev in enumerate(events):
            ev_err = find_error(ev)
            if ev_err is not None:
                acc.add("provider_error", None, f"SSE event {idx}: {ev_err.describe()}")
    elif stream and isinstance(body, dict):
        chs0 = body.get("choices")
        is_chunk = str(body.get("object", "")).endswith("chunk") or (
            isinstance(chs0, list) and any(isinstance(c, dict) and "delta" in c for c in chs0)
        )
        if is_chunk:
            events = [body]  # one decoded stream chunk
        else:
            stream = False  # a decoded plain body passed for a streamed request

    text: str | None = None
    raw: list[_RawTok] | None = None
    finish = None
    usage = None
    reasoning_found: tuple[str, str] | None = None
    if events is not None:
        text, raw, finish, usage, n_content, reasoning_found = _assemble_stream(api, events, choice, acc, asked)
        if n_content == 0 and "provider_error" not in acc.anomalies:
            acc.add("malformed_response", None, f"stream has no content events for choice {choice} ({len(events)} events)")
        elif not text and not raw and finish is None and not {"provider_error", "truncated_stream"} & set(acc.anomalies):
            acc.add("empty_stream", None, f"choice {choice}: {n_content} events without content or finish_reason")
    elif isinstance(body, dict):
        err = find_error(body)
        if err is not None:
            acc.add("provider_error", None, err.describe())
        chs = body.get("choices")
        usage = body.get("usage")
        ch = None
        if isinstance(chs, list):
            ch = next((c for c in chs if isinstance(c, dict) and c.get("index", 0) == choice), None)
            if ch is None and len(chs) > choice and isinstance(chs[choice], dict):
                ch = chs[choice]
        if ch is None:
            if err is None:
                acc.add("malformed_response", None, "no choices")
        else:
            finish = ch.get("finish_reason")
            if api == "chat":
                m = ch.get("message")
                msg = m if isinstance(m, dict) else {}
                text = msg.get("content") if isinstance(msg.get("content"), str) else None
                reasoning_found = _reasoning_field(msg)
            else:
                text = ch.get("text") if isinstance(ch.get("text"), str) else None
            raw = _entries(ch.get("logprobs"), acc)
            if not text and not raw and finish is None:
                acc.add("empty_answer", None, f"choice {choice}: no content and no finish_reason")
    elif body is not None:
        acc.add("malformed_response", None, f"body is a {type(body).__name__}, not an object")
    usage, usage_missing = _clean_usage(usage, acc)

    # -- echo: split prompt tokens off (legacy completions) --
    prompt_raw: list[_RawTok] = []
    if api == "completions" and request.get("echo") and asked:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            if raw and text is not None:
                raw = _drop_zero_width_lead(raw, text)
            split = _echo_split(raw, text, prompt) if text is not None and text.startswith(prompt) and raw else None
            if split:
                prompt_raw, raw = raw[:split], raw[split:]  # type: ignore[index]
                text = text[len(prompt):]  # type: ignore[index]
            else:
                acc.add("echo_ignored", None, "echo=true but no prompt tokens came back")
                if text is not None and text.startswith(prompt):
                    text = text[len(prompt):]

    if not raw and asked and (text or (reasoning_found is not None and reasoning_found[1])):
        acc.add("missing_logprobs", None, "logprobs asked, none returned")
        raw = None  # no per-token data: n_tokens falls back to usage

    if reasoning_found is not None and text is None:
        text = ""  # a reasoning model cut off inside its reasoning: content null, the answer is empty
    text_known = text is not None
    if text is None:
        text = ""
    layout = _reasoning_layout(raw or [], reasoning_found, text if text_known else None, acc)
    toks = _build_tokens(raw or [], layout.target, acc, k_req, max_top_logprobs, greedy, stream, 0)
    _label_spans(toks, layout)
    ptoks = _build_tokens(prompt_raw, None, _Acc(), 0, None, False, False, 0, prompt=True) if prompt_raw else []

    if not text_known and toks:
        text = b"".join(t.bytes or b"" for t in toks).decode("utf-8", errors="replace")

    if raw is not None:
        n_tokens: int | None = len(toks)
    else:
        ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
        n_tokens = ct if isinstance(ct, int) and not isinstance(ct, bool) else None
    return NormalizedResponse(
        text=text,
        n_tokens=n_tokens,
        tokens=toks,
        anomalies=list(acc.anomalies),
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage,
        prompt_tokens=ptoks,
        anomaly_details=acc.details,
        usage_missing=usage_missing,
        reasoning=layout.reasoning,
        reasoning_source=layout.source,
        reasoning_coverage=layout.coverage if toks else None,
    )


def _offsets_usable(raw: list[_RawTok]) -> bool:
    """``text_offset`` values can be trusted: all present, monotonic, starting at 0 (echo), and
    each step equal to the previous token's length in characters (a token spelled as partial
    bytes may advance by 0 or 1 character)."""
    offs = [t.offset for t in raw]
    if not offs or any(o is None for o in offs) or offs[0] != 0:
        return False
    for t, a, b in zip(raw, offs, offs[1:], strict=False):
        step = b - a  # type: ignore[operator]
        if step < 0:
            return False
        lengths = {len(t.token)}
        for rec in (byte_spelling(t.token), gpt2_unicode_to_bytes(t.token)):
            if rec is not None:
                lengths.add(len(rec.decode("utf-8", errors="ignore")))
                if rec.decode("utf-8", errors="ignore").encode() != rec:
                    lengths.update((0, 1))  # a partial character
        if step not in lengths:
            return False
    return True


def _drop_zero_width_lead(raw: list[_RawTok], text: str) -> list[_RawTok]:
    """``raw`` without leading special tokens that spell no text of an echoed answer.

    Engines that prepend a BOS token to a completions prompt (gemma's ``<bos>``, Llama's ``<s>``)
    echo it as the first prompt token with logprob null and ``text_offset`` 0, while the answer's
    ``text`` starts with the prompt itself (vLLM, the simulator). Such a token occupies no
    characters: its string is not where ``text`` starts, and the next token's offset is still 0
    (or, without offsets, the next token's string is where ``text`` starts).
    Counted as text it would shift every echoed token by its length (a false split or an echo
    reported as ignored); it carries no evidence (no logprob), so it is dropped here."""
    i = 0
    while (i + 1 < len(raw) and raw[i].lp is None and raw[i].token and not text.startswith(raw[i].token)
           and ((raw[i].offset == 0 and raw[i + 1].offset == 0)
                or (raw[i].offset is None and raw[i + 1].token != "" and text.startswith(raw[i + 1].token)))):
        i += 1
    return raw[i:] if i else raw


def _echo_split(raw: list[_RawTok], text: str, prompt: str) -> int | None:
    """Number of leading tokens that spell ``prompt`` in an echoed answer ``text``, or ``None``.

    First the text-guided byte assignment over the whole echoed text (exact when it is
    unambiguous), then ``text_offset`` when usable (:func:`_offsets_usable`), then a plain
    count of the tokens' given bytes."""
    target = len(prompt.encode("utf-8"))
    tb = text.encode("utf-8", errors="surrogatepass")
    assigned = assign_bytes([candidates(t.token, t.given, "\ufffd" in text) for t in raw], tb)
    if assigned is not None and all(b is not None for b in assigned[0]):
        pos = 0
        for i, b in enumerate(assigned[0]):
            if pos == target:
                return i
            pos += len(b)  # type: ignore[arg-type]
        if pos == target:
            return len(raw)
    if _offsets_usable(raw):
        return sum(1 for t in raw if t.offset is not None and t.offset < len(prompt))  # all set when usable
    pos = 0
    for i, t in enumerate(raw):
        if pos == target:
            return i
        pos += len(t.given if t.given is not None else t.token.encode("utf-8", errors="surrogatepass"))
    return len(raw) if pos == target else None


def _build_tokens(
    raw: list[_RawTok],
    text: str | None,
    acc: _Acc,
    k_req: int,
    cap: int | None,
    greedy: bool,
    stream: bool,
    start_index: int,
    prompt: bool = False,
) -> list[TokenRecord]:
    if not raw:
        return []
    n = len(raw)
    per_tok: list[dict[str, None]] = [dict() for _ in range(n)]

    def flag(i: int, kind: str, detail: str = "") -> None:
        per_tok[i].setdefault(kind, None)
        acc.add(kind, start_index + i, detail)

    # ---- bytes ----
    text_bytes = text.encode("utf-8", errors="surrogatepass") if text is not None else None
    has_fffd = text is not None and "\ufffd" in text
    cands = [candidates(t.token, t.given, has_fffd or text is None) for t in raw]
    assigned = assign_bytes(cands, text_bytes) if text_bytes is not None else None
    token_bytes: list[bytes | None]
    recovery_kind: str | None = None
    spelled = False  # the server spells partial characters as byte escapes (a convention, no anomaly)
    if assigned is not None:
        token_bytes, kinds = assigned
        for i, kd in enumerate(kinds):
            if kd == _SPELLED:
                spelled = True
            elif kd is not None:
                flag(i, kd, f"token {raw[i].token!r}")
                if kd in ("surrogate_token_strings", "spm_token_strings"):
                    recovery_kind = recovery_kind or kd
        if any(b is None for b in token_bytes):
            acc.add("bytes_text_mismatch", None, "token bytes ambiguous or unrecoverable")
    elif has_fffd and all(t.given is not None and _FFFD not in t.given for t in raw) and lossy_text_consistent(
        b"".join(t.given for t in raw if t.given is not None), text or ""
    ):
        # the runtime's text lost split characters to U+FFFD in its own grouping; every token's
        # bytes field is valid and agrees with the text everywhere else: keep the bytes
        token_bytes = [t.given for t in raw]
        acc.add("replacement_char_text", None, "text carries U+FFFD where the tokens' bytes hold valid characters")
    else:
        token_bytes = []
        for i, t in enumerate(raw):
            tb = t.given if t.given is not None else t.token.encode("utf-8", errors="surrogatepass")
            if _FFFD in tb and not has_fffd and text is not None:
                flag(i, "replacement_char_bytes", f"token {t.token!r}")
                token_bytes.append(None)
            else:
                token_bytes.append(tb)
        if text_bytes is not None:
            known = b"".join(b for b in token_bytes if b is not None)
            detail = "" if known == text_bytes else f"tokens give {known[:60]!r}, text is {text_bytes[:60]!r}"
            acc.add("bytes_text_mismatch", None, detail or "unrecoverable token bytes")

    # ---- logprobs ----
    records: list[TokenRecord] = []
    zero_with_mass: list[bool] = []
    for i, t in enumerate(raw):
        lp, kind, rawf = _classify(t.lp)
        if prompt and i == 0 and t.lp is None:
            kind = None  # the first echoed prompt token has no logprob by definition
        elif kind == "padded_inf":
            kind = "nonfinite_logprob"
        if kind is not None:
            flag(i, kind, f"chosen logprob {t.lp!r}")
        alts: list[tuple[str, bytes | None, float | None]] = []
        padded = 0
        for atok, abytes, alp in t.top:
            v, akind, _ = _classify(alp)
            if akind == "padded_inf":
                padded += 1
            elif akind in ("sentinel_logprob", "masked_logit", "positive_logprob"):
                flag(i, akind, f"alternative {atok!r} logprob {alp!r}")
            ab = alt_bytes(atok, abytes, recovery_kind, spelled)
            keep = not (_FFFD in ab and text is not None and "\ufffd" not in text)
            alts.append((atok, ab if keep else None, v))
        if padded:
            flag(i, "top_logprobs_padded", f"{padded} alternative(s) at -inf")
        if t.excess:
            flag(i, "top_logprobs_excess", f"{len(t.top) + t.excess} alternatives listed, {k_req} asked: {t.excess} dropped")
        finite = [a for a in alts if a[2] is not None]
        if not prompt and k_req > 0:
            # listed with a finite number (a positive or sentinel value is listed but unusable;
            # masked logits count as -inf)
            n_listed = sum(1 for _, _, v in t.top if (f := _as_float(v)) is not None and math.isfinite(f) and f > MASKED_THRESHOLD)
            want = k_req if cap is None else min(k_req, cap)
            if n_listed < want:
                flag(i, "top_logprobs_short", f"{n_listed} finite of {k_req} asked")
        # chosen vs alternatives
        ckey = _tok_key(t.token, token_bytes[i])
        ckey_raw = t.token
        in_top = [a for a in alts if a[0] == ckey_raw or (a[1] is not None and a[1] == ckey)]
        others = [a for a in finite if not (a[0] == ckey_raw or (a[1] is not None and a[1] == ckey))]
        mass = sum(math.exp(v) for _, _, v in finite if v is not None)  # `finite` holds no None
        if finite and mass > 1.0 + MASS_TOL:
            flag(i, "mass_exceeds_one", f"listed mass {mass:.4f}")
        other_mass = sum(math.exp(v) for _, _, v in others if v is not None)
        zwm = rawf == 0.0 and other_mass > MASS_TOL
        zero_with_mass.append(zwm)
        if not prompt and alts and not in_top:
            min_alt = min((v for _, _, v in finite if v is not None), default=None)
            belongs = greedy or (lp is not None and min_alt is not None and lp > min_alt + POSITIVE_TOL)
            if belongs:
                flag(i, "chosen_not_in_top", f"chosen {t.token!r} not among {len(alts)} alternatives")
        if not prompt and greedy and finite:
            top1 = max(finite, key=lambda a: a[2])  # type: ignore[arg-type, return-value]
            is_top1 = top1[0] == ckey_raw or (top1[1] is not None and top1[1] == ckey)
            chosen_v = in_top[0][2] if in_top and in_top[0][2] is not None else lp
            tie = chosen_v is not None and abs(chosen_v - top1[2]) <= POSITIVE_TOL  # type: ignore[operator]
            if not is_top1 and not tie:
                flag(i, "greedy_not_argmax", f"chosen {t.token!r}, top-1 {top1[0]!r} at {top1[2]}")
        if zwm:
            lp = None
        records.append(
            TokenRecord(index=start_index + i, token=t.token, bytes=token_bytes[i], logprob=lp, top_logprobs=alts, anomalies=[], raw_logprob=rawf)
        )
    # ---- runs and streams ----
    i = 0
    while i < n:
        if zero_with_mass[i]:
            j = i
            while j < n and zero_with_mass[j]:
                j += 1
            if j - i >= 2:
                for m in range(i, j):
                    flag(m, "zero_logprob_run", f"{j - i} consecutive 0.0 logprobs from token {i}")
            i = j
        else:
            i += 1
    if stream and not prompt:
        seen: list[tuple[tuple[tuple[str, float | None], ...], bytes]] = []
        for i, t in enumerate(raw):
            if not t.top:
                continue
            sig = tuple((a, _as_float(v)) for a, _, v in t.top)
            ck = _tok_key(t.token, token_bytes[i])
            if any(s == sig and c != ck for s, c in seen):
                flag(i, "duplicate_stream_top_logprobs", f"token {t.token!r} repeats an earlier token's alternatives")
            seen.append((sig, ck))
    for i, r in enumerate(records):
        r.anomalies = list(per_tok[i])
    return records
