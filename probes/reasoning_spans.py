"""Reasoning spans (issue 35): what a reasoning response's per-token logprobs cover (the answer only, or
the reasoning then the answer), against which text their bytes are recovered, and each token's span
label (``TokenRecord.span``: ``reasoning`` / ``answer``).

A response that fits neither is reported ``reasoning_logprobs_inconsistent`` (never
``bytes_text_mismatch``). Formats followed: vLLM v0.11 ``vllm/reasoning/basic_parsers.py``
(``BaseThinkingReasoningParser``: the text before ``</think>`` is reasoning, ``<think>``
optional because DeepSeek-R1's template opens it in the prompt; the streamed delta that holds
the close tag sends its tag-less text, the tag tokens keep their logprob entries) and
``deepseek_r1_reasoning_parser.py`` / ``qwen3_reasoning_parser.py``, with the field renamed
``reasoning_content`` → ``reasoning`` in ``entrypoints/openai/protocol.py`` (v0.11); SGLang
v0.5 ``python/sglang/srt/parser/reasoning_parser.py`` (``reasoning_content``; ``deepseek-r1``,
``qwen3``, ``kimi_k2`` with ``◁think▷``…``◁/think▷``); DeepSeek's API ``reasoning_content``.
The fields and tags: :mod:`probes.reasoning`.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.anomalies import AnomalyLog
from probes.byte_recovery import assign_bytes, candidates, gpt2_unicode_to_bytes
from probes.logprob_entries import RawToken
from probes.reasoning import THINK_TAGS
from probes.records import TokenRecord

__all__ = ["SpanLayout", "label_spans", "reasoning_layout"]

_TAG_STRINGS = frozenset(x for pair in THINK_TAGS for x in pair)


@dataclass
class SpanLayout:
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


def _tokens_before(raw: list[RawToken], s: str, end: int) -> int:
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


def _read_one(t: RawToken) -> bytes:
    if t.given is None or (t.given == b"" and t.token in _TAG_STRINGS):  # a tag given with empty bytes
        return t.token.encode("utf-8", errors="surrogatepass")
    return t.given


def _read_gpt2(t: RawToken) -> bytes:
    g = gpt2_unicode_to_bytes(t.token) if t.given is None else None
    return g if g is not None else _read_one(t)


def _read_spm(t: RawToken) -> bytes:
    return t.token.replace("\u2581", " ").encode("utf-8", errors="surrogatepass") if t.given is None else _read_one(t)


_READERS = (_read_one, _read_gpt2, _read_spm)


def _readings(raw: list[RawToken]) -> list[str]:
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


def reasoning_layout(raw: list[RawToken], found: tuple[str, str] | None, text: str | None, acc: AnomalyLog) -> SpanLayout:
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
            return SpanLayout(text, 0)
        reasoning, cut = inline
        source, answer = "inline", text[cut:]
    else:
        source, reasoning = found
        answer, cut = text or "", -1
    if not raw:
        return SpanLayout(text, 0, reasoning, source)
    has_fffd = "\ufffd" in (text or "") or "\ufffd" in reasoning
    cands = [candidates(t.token, t.given, has_fffd) for t in raw]

    def spells(target: str) -> bool:
        return assign_bytes(cands, target.encode("utf-8", errors="surrogatepass")) is not None

    if spells(answer):
        return SpanLayout(answer, 0, reasoning, source, "answer")
    if source == "inline" and text is not None:
        if spells(text):
            return SpanLayout(text, len(text[:cut].encode("utf-8", errors="surrogatepass")), reasoning, source, "both")
    else:
        for s in _readings(raw):
            end = _split_reasoning(s, reasoning, answer)
            if end is not None and spells(s):
                return SpanLayout(s, None, reasoning, source, "both", n_reasoning=_tokens_before(raw, s, end))
    if reasoning.strip():
        acc.add(
            "reasoning_logprobs_inconsistent",
            None,
            f"{len(raw)} tokens spell neither the answer ({len(answer)} chars) nor reasoning "
            f"({len(reasoning)} chars, {source}) then answer",
        )
        return SpanLayout(None, None, reasoning, source, "inconsistent")
    return SpanLayout(text, 0, reasoning, source)


def label_spans(toks: list[TokenRecord], layout: SpanLayout) -> None:
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
