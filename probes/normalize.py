"""Response normalizer: provider responses (chat or completions, plain or SSE) → per-token records.

Every provider answer is evidence, including the broken ones, so :func:`normalize_response`
never raises on a malformed body: it returns what it can and lists *anomalies* (vocabulary in
``../shared/cases/README.md``, plus the extra kinds below).

Per generated token it yields a :class:`TokenRecord` with

- ``bytes``: the authoritative bytes, recovered through the answer text. Candidates per token, in
  order of preference: the ``bytes`` field (chat), the UTF-8 of the token string, the GPT-2
  byte-to-unicode inverse (``Ġthat`` → `` that``), byte-fallback spellings (``<0xC3>``,
  ``bytes:\\xc3``, ``\\xc3``), SentencePiece ``▁`` → space, an empty string for special tokens
  (``<|im_end|>``), and, for bytes reported as U+FFFD, a wildcard of 1–3 non-ASCII bytes. A
  dynamic program over the text's bytes keeps exactly the token→span assignments that reproduce
  the whole text; a token gets bytes only when every such assignment agrees on its span,
  otherwise ``None`` (reported, never guessed);
- ``logprob``: the chosen token's logprob in nats as a finite number ≤ 0, or ``None`` when it is
  censored or untrustworthy: null/NaN/±inf (``nonfinite_logprob``), the ``-9999`` "not in top-k"
  sentinel or any value ≤ -9999 (``sentinel_logprob``), ≤ -1e30 (``masked_logit``), > 1e-6
  (``positive_logprob``), or exactly 0.0 while the other listed alternatives hold more than 1e-3
  of probability (``mass_exceeds_one``; two or more in a row → ``zero_logprob_run``);
- ``top_logprobs``: ``(token, bytes, logprob)`` alternatives, in the order given; logprobs obey the
  same rule (``None`` for masked, padded, sentinel or non-finite entries), so every float in a
  record is finite and JSON-safe.

Extra anomaly kinds (beyond the shared vocabulary): ``malformed_json`` (body or an SSE event is
not JSON), ``truncated_stream`` (no ``data: [DONE]``), ``provider_error`` (an ``error`` object),
``malformed_response`` (JSON without the expected structure), ``spm_token_strings`` (SentencePiece
``▁`` leaked into token strings). Byte spellings of partial characters (``<0xC3>``,
``bytes:\\xc3``, `` \\xc3``) are a legitimate convention and are decoded without an anomaly.

Source for the wire formats: OpenAI API reference (chat ``logprobs.content[]`` with ``token``,
``logprob``, ``bytes``, ``top_logprobs``; legacy completions ``tokens``, ``token_logprobs``,
``top_logprobs`` dicts, ``text_offset``, ``echo``), and the public bug reports cited by each case.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "TokenRecord",
    "NormalizedResponse",
    "normalize_response",
    "ANOMALY_KINDS",
    "SENTINEL_THRESHOLD",
    "MASKED_THRESHOLD",
    "gpt2_unicode_to_bytes",
]

#: A logprob at or below this is a placeholder, not a model number (OpenAI documents -9999.0).
SENTINEL_THRESHOLD = -9999.0
#: A logprob at or below this is a masked logit leaking as a number (float32 lowest ≈ -3.4e38).
MASKED_THRESHOLD = -1e30
#: Positive slack for rounding noise on logprobs (nats).
POSITIVE_TOL = 1e-6
#: Probability-mass slack for the listed alternatives.
MASS_TOL = 1e-3

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
    "malformed_json": "the body or an SSE event is not valid JSON",
    "truncated_stream": "an SSE stream ended without data: [DONE]",
    "provider_error": "the body carries an error object",
    "malformed_response": "valid JSON but not the expected response structure",
    "spm_token_strings": "SentencePiece '▁' word-boundary marks leaked into token strings",
}


class TokenRecord(BaseModel):
    """One generated (or, for echo, prompt) token after normalization.

    ``logprob`` is in nats, finite and ≤ 1e-6, or ``None`` when censored/untrustworthy (see the
    module docstring). ``raw_logprob`` keeps the reported value for evidence when it is a finite
    number (sentinels included); it is ``None`` for null/NaN/±inf and must not be used as a logprob.
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    index: int
    token: str
    """Token string exactly as reported."""
    bytes: bytes | None
    """Authoritative bytes after recovery; ``None`` when they cannot be recovered."""
    logprob: float | None
    top_logprobs: list[tuple[str, bytes | None, float | None]] = Field(default_factory=list)
    """Alternatives as ``(token, bytes, logprob)`` in the order given; logprob ``None`` = unusable."""
    anomalies: list[str] = Field(default_factory=list)
    raw_logprob: float | None = None


class NormalizedResponse(BaseModel):
    """A normalized response: the generated text, its tokens and every anomaly found.

    ``n_tokens`` is the number of generated tokens: ``len(tokens)`` when per-token data came
    back, else ``usage.completion_tokens``, else ``None``. ``anomalies`` lists distinct kinds in
    order of first occurrence; ``anomaly_details`` has one ``{"kind", "index", "detail"}`` per
    finding (``index`` = token index or ``None`` for response-level findings). ``prompt_tokens``
    holds echoed prompt tokens (legacy completions with ``echo``), not counted in ``n_tokens``.
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    text: str
    n_tokens: int | None
    tokens: list[TokenRecord]
    anomalies: list[str]
    finish_reason: str | None = None
    usage: dict | None = None
    prompt_tokens: list[TokenRecord] = Field(default_factory=list)
    anomaly_details: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def token_bytes(self) -> list[bytes | None]:
        """Bytes of each generated token (``None`` where unrecoverable)."""
        return [t.bytes for t in self.tokens]

    @property
    def logprobs(self) -> list[float | None]:
        """Chosen-token logprobs of each generated token (nats; ``None`` where unusable)."""
        return [t.logprob for t in self.tokens]


# -- GPT-2 byte-level alphabet ----------------------------------------------------------------

@lru_cache(maxsize=1)
def _gpt2_u2b() -> dict[str, int]:
    # The byte-to-unicode table of GPT-2's encoder (Radford et al. 2019; openai/gpt-2 encoder.py):
    # printable latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def gpt2_unicode_to_bytes(token: str) -> bytes | None:
    """Invert GPT-2's byte-to-unicode mapping (``"Ġthat"`` → ``b" that"``); ``None`` if not in that form."""
    table = _gpt2_u2b()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return None


_BYTE_TOKEN_RE = re.compile(r"^(?:<0x[0-9A-Fa-f]{2}>)+$")
_HEX_ESC_RE = re.compile(r"\\x([0-9A-Fa-f]{2})")
_SPECIAL_RE = re.compile(r"^(?:<\|[^|]{1,40}\|>|</s>|<s>|<eos>|<\|endoftext\|>)$")
_FFFD = "\ufffd".encode()
#: Internal candidate kind: bytes spelled out in the token string (not an anomaly).
_SPELLED = "~byte_spelling"


def _byte_spelling(token: str) -> bytes | None:
    """Bytes of a token spelled as byte escapes: SentencePiece ``<0xC3>``, vLLM ``bytes:\\xc3``,
    or OpenAI-style text with ``\\xNN`` escapes for a partial character (`` \\xc3``).
    ``None`` when the string contains no such spelling."""
    if _BYTE_TOKEN_RE.match(token):
        return bytes(int(token[i + 3 : i + 5], 16) for i in range(0, len(token), 6))
    body = token[6:] if token.startswith("bytes:") else token
    if not _HEX_ESC_RE.search(body):
        return None
    out = bytearray()
    pos = 0
    for m in _HEX_ESC_RE.finditer(body):
        out += body[pos : m.start()].encode("utf-8", errors="surrogatepass")
        out.append(int(m.group(1), 16))
        pos = m.end()
    out += body[pos:].encode("utf-8", errors="surrogatepass")
    return bytes(out)


# -- byte candidates and the text-guided assignment -------------------------------------------

@dataclass(frozen=True)
class _Cand:
    """A way to read a token's bytes: literal segments, with ``None`` = 1–3 non-ASCII wildcard bytes."""

    segments: tuple[bytes | None, ...]
    kind: str | None  # anomaly kind when this candidate is the one that fits; None = no anomaly

    @property
    def literal(self) -> bytes | None:
        if any(s is None for s in self.segments):
            return None
        return b"".join(self.segments)  # type: ignore[arg-type]


def _valid_byte_list(v: Any) -> bytes | None:
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 255 for x in v):
        return bytes(v)
    return None


def _candidates(token: str, given: bytes | None, text_has_fffd: bool) -> list[_Cand]:
    out: list[_Cand] = []
    seen: set[bytes] = set()

    def add(b: bytes | None, kind: str | None) -> None:
        if b is None or b in seen:
            return
        seen.add(b)
        out.append(_Cand((b,), kind))

    add(given, None)
    add(token.encode("utf-8", errors="surrogatepass"), None)
    bs = _byte_spelling(token)
    add(bs, _SPELLED)
    g = gpt2_unicode_to_bytes(token)
    add(g, "surrogate_token_strings")
    if "▁" in token:
        add(token.replace("▁", " ").encode("utf-8"), "spm_token_strings")
    if _SPECIAL_RE.match(token):
        add(b"", None)
    if not text_has_fffd:
        for src in (given, token.encode("utf-8", errors="surrogatepass")):
            if src is not None and _FFFD in src:
                parts = src.split(_FFFD)
                segs: list[bytes | None] = []
                for i, part in enumerate(parts):
                    if part:
                        segs.append(part)
                    if i < len(parts) - 1:
                        segs.append(None)
                out.append(_Cand(tuple(segs), "replacement_char_bytes"))
                break
    return out


def _match_ends(cand: _Cand, text: bytes, p: int) -> list[int]:
    """End positions where ``cand`` matches ``text`` starting at ``p``."""
    ends = [p]
    for seg in cand.segments:
        nxt: list[int] = []
        for e in ends:
            if seg is None:
                for n in (1, 2, 3):
                    chunk = text[e : e + n]
                    if len(chunk) == n and all(b >= 0x80 for b in chunk):
                        nxt.append(e + n)
            elif text.startswith(seg, e):
                nxt.append(e + len(seg))
        ends = sorted(set(nxt))
        if not ends:
            return []
    return ends


def _assign_bytes(cands: list[list[_Cand]], text: bytes) -> tuple[list[bytes | None], list[str | None]] | None:
    """Text-guided byte assignment. Returns per-token bytes and the anomaly kind of the candidate
    that fits (``None`` kind = plain), or ``None`` when no assignment reproduces ``text``."""
    n = len(cands)
    # forward: reach[i] = positions where token i may start
    reach: list[set[int]] = [set() for _ in range(n + 1)]
    reach[0].add(0)
    edges: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (p, q, cand idx)
    for i in range(n):
        for p in reach[i]:
            for ci, c in enumerate(cands[i]):
                for q in _match_ends(c, text, p):
                    edges[i].append((p, q, ci))
                    reach[i + 1].add(q)
        if not reach[i + 1]:
            return None
        if len(reach[i + 1]) > 64:  # pathological ambiguity; give up rather than explode
            return None
    end = len(text)
    if end not in reach[n]:
        return None
    # backward: alive[i] = positions from which tokens i.. can finish exactly at the end
    alive: list[set[int]] = [set() for _ in range(n + 1)]
    alive[n].add(end)
    for i in range(n - 1, -1, -1):
        for p, q, _ in edges[i]:
            if q in alive[i + 1]:
                alive[i].add(p)
    out_b: list[bytes | None] = []
    out_k: list[str | None] = []
    for i in range(n):
        valid = [(p, q, ci) for p, q, ci in edges[i] if p in reach[i] and q in alive[i + 1] and p in alive[i]]
        spans = {(p, q) for p, q, _ in valid}
        kinds = [cands[i][ci].kind for _, _, ci in valid]
        kind = None if any(k is None for k in kinds) else (kinds[0] if kinds else None)
        if len(spans) == 1:
            p, q = next(iter(spans))
            out_b.append(text[p:q])
        else:
            out_b.append(None)
        out_k.append(kind)
    return out_b, out_k


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


@dataclass
class _Acc:
    anomalies: dict[str, None] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, index: int | None = None, detail: str = "") -> None:
        self.anomalies.setdefault(kind, None)
        self.details.append({"kind": kind, "index": index, "detail": detail})


def _loads(text: str) -> Any:
    return json.loads(text)  # accepts NaN / Infinity / -Infinity


def _chat_entries(lp: Any, acc: _Acc) -> list[_RawTok] | None:
    if lp is None:
        return None
    if not isinstance(lp, dict):
        acc.add("malformed_response", None, "logprobs is not an object")
        return None
    content = lp.get("content")
    if content is None:
        return None
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
        top: list[tuple[str, bytes | None, Any]] = []
        tl = e.get("top_logprobs")
        if isinstance(tl, list):
            for a in tl:
                if isinstance(a, dict):
                    at = a.get("token")
                    top.append((at if isinstance(at, str) else str(at), _valid_byte_list(a.get("bytes")), a.get("logprob")))
        elif isinstance(tl, dict):
            top = [(k, None, v) for k, v in tl.items()]
        out.append(_RawTok(tok, _valid_byte_list(e.get("bytes")), e.get("logprob"), top))
    return out


def _completion_entries(lp: Any, acc: _Acc) -> list[_RawTok] | None:
    if lp is None:
        return None
    if not isinstance(lp, dict):
        acc.add("malformed_response", None, "logprobs is not an object")
        return None
    toks = lp.get("tokens")
    if toks is None:
        return None
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
        top_raw = tops[i] if i < len(tops) else None
        top: list[tuple[str, bytes | None, Any]] = []
        if isinstance(top_raw, dict):
            top = [(k, None, v) for k, v in top_raw.items()]
        elif isinstance(top_raw, list):  # some servers send a list of {token, logprob}
            for a in top_raw:
                if isinstance(a, dict):
                    top.append((str(a.get("token")), _valid_byte_list(a.get("bytes")), a.get("logprob")))
        off = offs[i] if i < len(offs) and isinstance(offs[i], int) else None
        out.append(_RawTok(t, None, lps[i] if i < len(lps) else None, top, off))
    return out


def _assemble_stream(api: str, events: list[Any], choice: int, acc: _Acc, logprobs_asked: bool):
    """Merge SSE chunks of one choice → (text, raw tokens or None, finish_reason, usage)."""
    texts: list[str] = []
    toks: list[_RawTok] | None = None
    finish = None
    usage = None
    chunks_without_lp = 0
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
            if api == "chat":
                delta = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
                piece = delta.get("content")
                entries = _chat_entries(ch.get("logprobs"), acc)
            else:
                piece = ch.get("text")
                entries = _completion_entries(ch.get("logprobs"), acc)
            piece = piece if isinstance(piece, str) else ""
            texts.append(piece)
            if entries is not None:
                toks = (toks or []) + entries
            elif piece:
                chunks_without_lp += 1
            finish = ch.get("finish_reason") or finish
    if logprobs_asked and toks is not None and chunks_without_lp:
        acc.add("missing_logprobs", None, f"{chunks_without_lp} text chunk(s) without logprobs")
    return "".join(texts), toks, finish, usage


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
    temperature = _as_float(request.get("temperature"))
    greedy = temperature is not None and temperature == 0.0

    body: Any = response
    events: list[Any] | None = None
    if body is None and response_text is not None:
        if stream and response_text.lstrip().startswith("{") and "data:" not in response_text[:64]:
            stream = False  # the server ignored stream=true and answered with a plain JSON body
        if stream:
            events = []
            done = False
            for raw in response_text.splitlines():
                line = raw.strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                elif data:
                    try:
                        events.append(_loads(data))
                    except ValueError as exc:
                        acc.add("malformed_json", None, f"SSE event {len(events)}: {exc}")
            if not done:
                acc.add("truncated_stream", None, f"{len(events)} events, no data: [DONE]")
        else:
            try:
                body = _loads(response_text)
            except ValueError as exc:
                acc.add("malformed_json", None, str(exc))
                body = None
    elif stream and isinstance(body, list):
        events = body
    elif stream and isinstance(body, dict):
        events = [body]

    text: str | None = None
    raw: list[_RawTok] | None = None
    finish = None
    usage = None
    if events is not None:
        for ev in events:
            if isinstance(ev, dict) and ev.get("error"):
                acc.add("provider_error", None, str(ev.get("error"))[:200])
        if not any(isinstance(ev, dict) and isinstance(ev.get("choices"), list) and ev["choices"] for ev in events):
            if events:
                acc.add("malformed_response", None, "stream has no choices")
        text, raw, finish, usage = _assemble_stream(api, events, choice, acc, asked)
    elif isinstance(body, dict):
        if body.get("error"):
            acc.add("provider_error", None, str(body.get("error"))[:200])
        chs = body.get("choices")
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        ch = None
        if isinstance(chs, list):
            ch = next((c for c in chs if isinstance(c, dict) and c.get("index", 0) == choice), None)
            if ch is None and len(chs) > choice and isinstance(chs[choice], dict):
                ch = chs[choice]
        if ch is None:
            if not body.get("error"):
                acc.add("malformed_response", None, "no choices")
        else:
            finish = ch.get("finish_reason")
            if api == "chat":
                msg = ch.get("message") if isinstance(ch.get("message"), dict) else {}
                text = msg.get("content") if isinstance(msg.get("content"), str) else None
                raw = _chat_entries(ch.get("logprobs"), acc)
            else:
                text = ch.get("text") if isinstance(ch.get("text"), str) else None
                raw = _completion_entries(ch.get("logprobs"), acc)
    elif body is not None:
        acc.add("malformed_response", None, f"body is a {type(body).__name__}, not an object")

    # -- echo: split prompt tokens off (legacy completions) --
    prompt_raw: list[_RawTok] = []
    if api == "completions" and request.get("echo") and asked:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            split = None
            if text is not None and text.startswith(prompt) and raw:
                if all(t.offset is not None for t in raw):
                    split = sum(1 for t in raw if t.offset < len(prompt))  # type: ignore[operator]
                else:
                    target = len(prompt.encode("utf-8"))
                    acc_b = 0
                    for i, t in enumerate(raw):
                        if acc_b == target:
                            split = i
                            break
                        acc_b += len(t.given if t.given is not None else t.token.encode("utf-8"))
                    else:
                        if acc_b == target:
                            split = len(raw)
            if split:
                prompt_raw, raw = raw[:split], raw[split:]  # type: ignore[index]
                text = text[len(prompt):]  # type: ignore[index]
            else:
                acc.add("echo_ignored", None, "echo=true but no prompt tokens came back")
                if text is not None and text.startswith(prompt):
                    text = text[len(prompt):]

    if not raw and asked and text:
        acc.add("missing_logprobs", None, "logprobs asked, none returned")
        raw = None  # no per-token data: n_tokens falls back to usage

    text_known = text is not None
    if text is None:
        text = ""
    toks = _build_tokens(raw or [], text if text_known else None, acc, k_req, max_top_logprobs, greedy, stream, 0)
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
    )


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
    cands = [_candidates(t.token, t.given, has_fffd or text is None) for t in raw]
    assigned = _assign_bytes(cands, text_bytes) if text_bytes is not None else None
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
    else:
        token_bytes = []
        for i, t in enumerate(raw):
            b = t.given if t.given is not None else t.token.encode("utf-8", errors="surrogatepass")
            if _FFFD in b and not has_fffd and text is not None:
                flag(i, "replacement_char_bytes", f"token {t.token!r}")
                b = None
            token_bytes.append(b)
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
            ab = abytes
            if recovery_kind == "surrogate_token_strings":
                ab = gpt2_unicode_to_bytes(atok) or ab
            elif recovery_kind == "spm_token_strings":
                ab = atok.replace("▁", " ").encode("utf-8")
            elif ab is None and spelled:
                ab = _byte_spelling(atok)
            if ab is None:
                ab = atok.encode("utf-8", errors="surrogatepass")
            if _FFFD in ab and text is not None and "\ufffd" not in text:
                ab = None
            alts.append((atok, ab, v))
        if padded:
            flag(i, "top_logprobs_padded", f"{padded} alternative(s) at -inf")
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
        mass = sum(math.exp(a[2]) for a in finite)  # type: ignore[arg-type]
        if finite and mass > 1.0 + MASS_TOL:
            flag(i, "mass_exceeds_one", f"listed mass {mass:.4f}")
        other_mass = sum(math.exp(a[2]) for a in others)  # type: ignore[arg-type]
        zwm = rawf == 0.0 and other_mass > MASS_TOL
        zero_with_mass.append(zwm)
        if not prompt and alts and not in_top:
            min_alt = min((a[2] for a in finite), default=None)
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
        seen: list[tuple[tuple, bytes]] = []
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
