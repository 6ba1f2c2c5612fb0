"""Engine logprob conventions, learned from the responses (issue 40, item 2).

Two engines can answer the same ``top_logprobs = k`` request with differently built lists:

- **ranked** (OpenAI, llama.cpp, the simulator by default): the k most likely tokens, best first;
  the sampled token appears only when it is one of them.
- **sampled-first** (vLLM; ``vllm/entrypoints/openai/serving_chat.py`` ``_get_top_logprobs`` over the
  position's logprob dict, whose first key is the sampled token, vLLM 0.6 – 0.11 and the CPU build
  0.32 measured in issue 40): the sampled token is the first entry at every position, even at
  logprob −9.9 where the best has −1.2, followed by the best remaining tokens. Depending on the
  version the list then holds k + 1 entries when the sampled token is not among the top k
  (*uncapped*), or is cut at k entries (*capped*: sampled + the k − 1 best others).

A test that counts "the sampled token fell outside the listed set" must use a set fixed before the
draw, the same under every outcome. :meth:`LogprobConvention.certified_m` is the size m of the set
every position's list is guaranteed to contain whatever was sampled: the true top-m is the best m
entries of the list (by logprob) — ranked: m = k; sampled-first uncapped: m = k (the list is the
top-k plus the sampled token); sampled-first capped: m = k − 1. :func:`certified_top` applies it.

Partial characters: a character the tokenizer splits over several tokens comes back either as raw
partial bytes per token (OpenAI's ``bytes`` field, llama.cpp) or, in vLLM, as empty tokens (``""``,
``bytes: []``) followed by one token carrying the whole character's bytes, whose alternatives are
whole characters too (the pending bytes + each alternative's). ``partial_chars`` records which was
seen. Pure functions over :class:`probes.records.TokenRecord` lists (no I/O, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from probes.records import TokenRecord

__all__ = [
    "RANKED",
    "LogprobConvention",
    "certified_top",
    "learn_convention",
    "requested_top_logprobs",
    "whole_character_follows",
]

#: Nats by which the first entry may trail a later one before the list counts as not ranked
#: (rounding of reported logprobs, exact ties).
_ORDER_TOL = 1e-4


@dataclass(frozen=True)
class LogprobConvention:
    """How a provider builds ``top_logprobs`` and spells partial characters.

    Attributes:
        sampled_first: the emitted token is the first entry of every list that has one, and at least
            one list's first entry is not its best (so the order is not a ranking).
        sampled_always_listed: the emitted token was among the entries at every position with a list.
        max_entries: the most entries any position listed (0: no lists seen).
        requested: ``top_logprobs`` asked (None: unknown).
        partial_chars: ``empty_then_whole`` (vLLM), ``raw_bytes`` (partial bytes per token) or
            ``none_seen``.
        n_positions: positions with a list that the convention was learned from.
    """

    sampled_first: bool = False
    sampled_always_listed: bool = False
    max_entries: int = 0
    requested: int | None = None
    partial_chars: str = "none_seen"
    n_positions: int = 0

    @property
    def name(self) -> str:
        """``sampled-first`` or ``ranked``."""
        return "sampled-first" if self.sampled_first else "ranked"

    @property
    def certified_m(self) -> int | None:
        """Entries of each list that are the true top-m whatever was sampled (None: no cut, use the whole list)."""
        if not self.sampled_first:
            return None
        k = self.requested if self.requested else max(self.max_entries - 1, 0)
        return k if self.max_entries > k else max(k - 1, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (with ``name`` and ``certified_m``), as stored in run summaries and probe reports."""
        return {**asdict(self), "name": self.name, "certified_m": self.certified_m}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> LogprobConvention:
        """Inverse of :meth:`to_dict` (unknown keys ignored; None → the ranked default)."""
        if not d:
            return RANKED
        keys = {"sampled_first", "sampled_always_listed", "max_entries", "requested", "partial_chars", "n_positions"}
        return cls(**{k: v for k, v in d.items() if k in keys})


#: The default convention (OpenAI's): lists are ranked, nothing is cut.
RANKED = LogprobConvention()


def _same(t: TokenRecord, alt: tuple[str, bytes | None, float | None]) -> bool:
    return alt[0] == t.token or (alt[1] is not None and t.bytes is not None and alt[1] == t.bytes)


def whole_character_follows(tokens: Sequence[TokenRecord], i: int) -> bool:
    """True when the first non-empty token after ``i`` holds a multi-byte UTF-8 character (U+FFFD included;
    the pieces may start with a space): token ``i``, if empty (``""``, no bytes), is then a piece of that
    character under vLLM's partial-character convention."""
    for t in tokens[i + 1 :]:
        b = t.bytes
        if b is None:
            return False
        if b == b"" and t.token == "":
            continue
        return any(x >= 0xC2 for x in b)
    return False


def _is_partial(b: bytes | None) -> bool:
    """True when ``b`` is non-empty and not valid UTF-8 on its own (a piece of a character)."""
    if not b:
        return False
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def learn_convention(responses: Sequence[Sequence[TokenRecord]], requested: int | None) -> LogprobConvention:
    """Learn the convention from the generated tokens of one provider's answers.

    Args:
        responses: per answer its generated tokens (``NormalizedResponse.tokens`` or stored tokens; any
            temperature, sampled ones carry the signal).
        requested: the ``top_logprobs`` the requests asked (None: unknown; chat ``top_logprobs`` or
            legacy ``logprobs``).

    Returns:
        The :class:`LogprobConvention`; ``RANKED``-like (``sampled_first`` False) when no list was seen.
    """
    n = first = listed = out_of_order = 0
    max_entries = 0
    empty_then_whole = raw = False
    for toks in responses:
        for i, t in enumerate(toks):
            if t.token == "" and t.bytes == b"" and whole_character_follows(toks, i):
                empty_then_whole = True
            if _is_partial(t.bytes):
                raw = True
            alts = [a for a in t.top_logprobs if a[2] is not None and math.isfinite(a[2])]
            if not alts:
                continue
            n += 1
            max_entries = max(max_entries, len(t.top_logprobs))
            if _same(t, alts[0]):
                first += 1
                if len(alts) > 1 and alts[0][2] < max(a[2] for a in alts[1:]) - _ORDER_TOL:  # type: ignore[operator, type-var]
                    out_of_order += 1
            if any(_same(t, a) for a in alts):
                listed += 1
    return LogprobConvention(
        sampled_first=n > 0 and first == n and out_of_order > 0,
        sampled_always_listed=n > 0 and listed == n,
        max_entries=max_entries,
        requested=requested,
        partial_chars="empty_then_whole" if empty_then_whole else "raw_bytes" if raw else "none_seen",
        n_positions=n,
    )


def requested_top_logprobs(request: dict[str, Any] | None) -> int | None:
    """The alternatives a request asked: chat ``top_logprobs`` (with ``logprobs`` true) or legacy
    completions ``logprobs`` (an int); None when it asked none."""
    req = request or {}
    v = req.get("top_logprobs") if "messages" in req or "top_logprobs" in req else req.get("logprobs")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def certified_top(
    alts: Sequence[tuple[str, bytes | None, float | None]], convention: LogprobConvention
) -> list[tuple[str, bytes | None, float]]:
    """The entries of one position's list that are the provider's true top-m (module docstring).

    Args:
        alts: ``TokenRecord.top_logprobs`` of one position (entries with logprob None are dropped).
        convention: the provider's convention.

    Returns:
        ``(token, bytes, logprob)`` entries, best first: all usable entries for a ranked list, the best
        ``certified_m`` for a sampled-first one.
    """
    usable = [(s, b, float(lp)) for s, b, lp in alts if lp is not None and math.isfinite(lp)]
    usable.sort(key=lambda a: -a[2])
    m = convention.certified_m
    return usable if m is None else usable[:m]
