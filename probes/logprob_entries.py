"""The ``logprobs`` object of one choice, in either wire shape, read into raw per-token entries.

Shapes (OpenAI API reference): chat ``logprobs.content[]`` with ``token``, ``logprob``, ``bytes``,
``top_logprobs`` (a list of ``{token, logprob, bytes}``); legacy completions ``tokens``,
``token_logprobs``, ``top_logprobs`` (a list of ``{token: logprob}`` dicts), ``text_offset``. Either
shape is accepted on either API (some servers answer ``/v1/completions`` with the chat shape).
Values are kept as reported (:class:`RawToken`); :mod:`probes.token_checks` classifies them. A
token's alternatives are capped at the request's count + 1 while parsing (issue 37, item 11).
Never raises: structural problems are logged as ``malformed_response``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

from probes.anomalies import AnomalyLog, as_float
from probes.byte_recovery import valid_byte_list

__all__ = ["RawToken", "logprobs_entries"]


@dataclass
class RawToken:
    """One token's entry as the provider reported it: ``token`` string, ``given`` bytes (a valid
    ``bytes`` field, else None), ``lp`` the chosen logprob as sent (any JSON value), ``top`` the kept
    alternatives ``(token, bytes or None, logprob as sent)``, ``offset`` (legacy ``text_offset``)."""

    token: str
    given: bytes | None
    lp: Any
    top: list[tuple[str, bytes | None, Any]]
    offset: int | None = None
    excess: int = 0
    """Alternatives the provider listed beyond what was kept (:func:`_cap_alternatives`)."""


def logprobs_entries(lp: Any, acc: AnomalyLog) -> list[RawToken] | None:
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
        f = as_float(ia[1][1] if dict_items else ia[1].get("logprob"))
        return f if f is not None and not math.isnan(f) else -math.inf

    ci = next((i for i, a in enumerate(listed) if tok(a) == chosen), None) if keep > 0 else None
    rest = keep - 1  # the last place is the chosen token's, listed or not
    best = heapq.nlargest(rest, ((i, a) for i, a in enumerate(listed) if i != ci), key=score) if rest > 0 else []
    idx = sorted([i for i, _a in best] + ([ci] if ci is not None else []))
    return [listed[i] for i in idx]


def _chat_entries(content: Any, acc: AnomalyLog) -> list[RawToken] | None:
    if not isinstance(content, list):
        acc.add("malformed_response", None, "logprobs.content is not a list")
        return None
    out: list[RawToken] = []
    for e in content:
        if not isinstance(e, dict):
            acc.add("malformed_response", len(out), "logprobs entry is not an object")
            continue
        tok = e.get("token")
        tok = tok if isinstance(tok, str) else ("" if tok is None else str(tok))
        top, excess = _alternatives(e.get("top_logprobs"), acc.keep_alternatives, tok)
        out.append(RawToken(tok, valid_byte_list(e.get("bytes")), e.get("logprob"), top, excess=excess))
    return out


def _completion_entries(lp: dict[str, Any], acc: AnomalyLog) -> list[RawToken] | None:
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
    out: list[RawToken] = []
    for i, t in enumerate(toks):
        t = t if isinstance(t, str) else str(t)
        off = offs[i] if i < len(offs) and isinstance(offs[i], int) and not isinstance(offs[i], bool) else None
        top, excess = _alternatives(tops[i] if i < len(tops) else None, acc.keep_alternatives, t)
        out.append(RawToken(t, None, lps[i] if i < len(lps) else None, top, off, excess))
    return out
