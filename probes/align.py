"""Token alignment: provider tokens → reference-tokenizer token ids, through bytes.

Detectors compare the provider and the reference at the *same positions*; positions are only the
same when they cover the same bytes. :func:`align_to_reference` maps each provider token (its
authoritative bytes from :mod:`probes.normalize`) onto reference token ids:

1. bytes equal to one reference vocabulary entry → that id (**1:1**; with identical tokenizers
   every provider token maps 1:1, even in non-canonical tokenizations a sampler can emit);
2. otherwise the token's bytes are segmented into several reference tokens (**1:n**): the
   reference tokenizer's own encoding of the token's text when it reproduces the bytes exactly,
   else the fewest-pieces segmentation over the reference byte vocabulary (dynamic programming);
3. an empty-bytes token (an end-of-turn marker the text omits) maps to the reference special
   token with the same string, if there is one; so do bytes that spell a special token's string
   exactly (a reasoning model's think tags, where its tokenizer marks them special);
4. vLLM's partial-character convention (issue 40; ``probes.conventions``): ``n`` empty tokens (``""``,
   no bytes, no special token) followed by a token carrying a whole multi-byte character are the
   ``n + 1`` pieces of that character. The empty tokens map to no reference id (span of length 0)
   and the whole-character token to the ``n + 1`` ids of the reference tokenizer's encoding when it
   has that many pieces (else the alignment stops there: the split is unknown). A whole-character
   token holding U+FFFD stands for bytes the server lost (an orphan partial character):
   ``unknown_bytes``.

Failures are reported, never guessed: unknown bytes (``None``), bytes the reference vocabulary
cannot spell, or empty bytes without a matching special token. The reference sequence
``ref_ids`` (the continuation for teacher forcing) stops at the first failure, because every
position after an unknown span has an unknown prefix; ``aligned_prefix`` says how many provider
tokens it covers.

The tokenizer is any object with ``get_vocab() -> dict[str, int]`` and
``encode(text, add_special_tokens=False) -> list[int]`` (a Hugging Face tokenizer); token strings
in GPT-2 byte-level form (``Ġ``), SentencePiece form (``▁``, ``<0x0A>``) or plain text are
recognised. This module never imports torch or ``reference``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from probes.byte_recovery import gpt2_unicode_to_bytes
from probes.conventions import whole_character_follows
from probes.records import TokenRecord

__all__ = ["AlignmentFailure", "AlignmentResult", "ByteVocab", "TokenizerLike", "align_to_reference"]


class TokenizerLike(Protocol):
    def get_vocab(self) -> dict[str, int]: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class ByteVocab:
    """The reference vocabulary as bytes: ``bytes → id`` (normal tokens) and ``str → id`` (special).

    ``mode`` is ``gpt2`` (byte-level BPE), ``spm`` (SentencePiece ``▁``/``<0xNN>``) or ``text``.
    """

    by_bytes: dict[bytes, int]
    special: dict[str, int]
    id_bytes: dict[int, bytes]
    max_len: int
    mode: str

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ByteVocab:
        """Build from a tokenizer-like object (see the module docstring). Pure apart from calls on it."""
        vocab: dict[str, int] = dict(tokenizer.get_vocab())
        special_strs = set(getattr(tokenizer, "all_special_tokens", []) or [])
        plain_added: set[str] = set()  # non-special added tokens (gemma's whitespace runs): raw text bytes
        added = getattr(tokenizer, "added_tokens_decoder", None)
        if isinstance(added, dict) and added:
            for at in added.values():
                content = str(getattr(at, "content", at))
                (special_strs if getattr(at, "special", True) else plain_added).add(content)
        else:
            enc = getattr(tokenizer, "added_tokens_encoder", None)
            if isinstance(enc, dict):
                special_strs |= set(enc)
        special_strs -= plain_added
        mode = "text"
        try:
            ids = tokenizer.encode(" a\n", add_special_tokens=False)
            inv = {i: s for s, i in vocab.items()}
            pieces = "".join(inv.get(i, "") for i in ids)
            if "Ġ" in pieces or "Ċ" in pieces:
                mode = "gpt2"
            elif "▁" in pieces or "<0x0A>" in pieces:
                mode = "spm"
        except Exception:
            mode = "text"
        by_bytes: dict[bytes, int] = {}
        id_bytes: dict[int, bytes] = {}
        special: dict[str, int] = {}
        fallback: list[tuple[bytes, int]] = []
        for s, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            if s in special_strs:
                special[s] = i
                continue
            b: bytes | None
            if s in plain_added:
                b = s.encode("utf-8")
            elif mode == "gpt2":
                b = gpt2_unicode_to_bytes(s)
            elif mode == "spm":
                if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                    try:
                        b = bytes([int(s[3:5], 16)])
                    except ValueError:
                        b = s.encode("utf-8")
                else:
                    b = s.replace("▁", " ").encode("utf-8")
            else:
                b = s.encode("utf-8")
            if b is None or b == b"":
                continue
            if s in plain_added:
                by_bytes[b] = i  # the tokenizer splits added tokens out first: their id is the one emitted
            elif mode == "spm" and s.startswith("<0x"):
                fallback.append((b, i))  # byte fallback: emitted only where no piece spells the byte
            else:
                by_bytes.setdefault(b, i)
            id_bytes[i] = b
        for b, i in fallback:  # after every piece: "(" is the piece id, not <0x28> (Gemma: 236769, not 278)
            by_bytes.setdefault(b, i)
        return cls(by_bytes, special, id_bytes, max((len(b) for b in by_bytes), default=1), mode)

    def segment(self, data: bytes) -> list[int] | None:
        """Fewest-pieces segmentation of ``data`` into vocabulary entries; ``None`` if impossible."""
        n = len(data)
        best: list[tuple[int, int] | None] = [None] * (n + 1)  # (pieces, id) ending at position
        best[0] = (0, -1)
        for end in range(1, n + 1):
            for ln in range(1, min(self.max_len, end) + 1):
                prev = best[end - ln]
                if prev is None:
                    continue
                tid = self.by_bytes.get(data[end - ln : end])
                if tid is None:
                    continue
                cand = (prev[0] + 1, tid)
                cur = best[end]
                if cur is None or cand[0] < cur[0]:
                    best[end] = cand
        if best[n] is None:
            return None
        return self._backtrack(best, n)

    def whole_character_ids(self, data: bytes) -> list[int] | None:
        """Ids spelling ``data`` as pieces of a split character followed by one vocabulary entry, or None.

        vLLM returns a character the tokenizer splits over several tokens as one string holding the
        whole character (issue 40); its alternatives are the pending partial bytes + each alternative
        token. Such a string is producible by this vocabulary when it splits, inside a UTF-8 character
        (the cut byte is a continuation byte 0x80-0xBF), into a prefix this vocabulary spells and a
        suffix that is one entry. Returns the ids (prefix segmentation + the entry), None otherwise.
        """
        for k in range(len(data) - 1, 0, -1):
            if not 0x80 <= data[k] <= 0xBF:
                continue
            tid = self.by_bytes.get(data[k:])
            if tid is None:
                continue
            head = self.segment(data[:k])
            if head is not None:
                return [*head, tid]
        return None

    def _backtrack(self, best: list[tuple[int, int] | None], n: int) -> list[int]:
        out: list[int] = []
        pos = n
        while pos > 0:
            _, tid = best[pos]  # type: ignore[misc]
            out.append(tid)
            pos -= len(self.id_bytes[tid])
        return out[::-1]


@dataclass(frozen=True)
class AlignmentFailure:
    """A provider position that could not be aligned, and why."""

    index: int
    """Provider token index."""
    reason: str
    """``unknown_bytes`` | ``not_representable`` | ``empty_bytes`` | ``partial_character_split``."""
    detail: str = ""


@dataclass(frozen=True)
class AlignmentResult:
    """Provider tokens mapped onto reference token ids.

    - ``ref_ids``: reference ids spelling the bytes of ``tokens[:aligned_prefix]`` (the
      continuation to teacher-force);
    - ``spans[i]``: ``(start, end)`` into ``ref_ids`` for provider token ``i`` (``None`` when not
      aligned, i.e. at or after the first failure);
    - ``ref_token_ids[i]``: the single reference id when token ``i`` maps 1:1, else ``None``;
    - ``failures``: the positions that failed directly (positions after the first failure are
      not aligned but not listed again).
    """

    ref_ids: list[int]
    spans: list[tuple[int, int] | None]
    ref_token_ids: list[int | None]
    failures: list[AlignmentFailure]
    aligned_prefix: int
    mode: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.spans)

    @property
    def one_to_one(self) -> list[int]:
        """Provider positions that map to exactly one reference token (comparable position by position)."""
        return [i for i, r in enumerate(self.ref_token_ids) if r is not None]

    @property
    def exact(self) -> bool:
        """Every provider token maps 1:1 (identical tokenization)."""
        return bool(self.spans) and all(r is not None for r in self.ref_token_ids)


_CACHE: weakref.WeakKeyDictionary[Any, ByteVocab] = weakref.WeakKeyDictionary()


def _byte_vocab(tokenizer: Any) -> ByteVocab:
    if isinstance(tokenizer, ByteVocab):
        return tokenizer
    try:
        bv = _CACHE.get(tokenizer)
    except TypeError:
        return ByteVocab.from_tokenizer(tokenizer)
    if bv is None:
        bv = ByteVocab.from_tokenizer(tokenizer)
        _CACHE[tokenizer] = bv
    return bv


def align_to_reference(tokens: Sequence[TokenRecord], tokenizer: Any) -> AlignmentResult:
    """Map provider ``tokens`` onto the reference tokenizer's ids through their bytes.

    Args:
        tokens: normalized provider tokens (``TokenRecord.bytes`` authoritative, ``None`` = unknown).
        tokenizer: a Hugging Face tokenizer (or any :class:`TokenizerLike`), or a prebuilt
            :class:`ByteVocab`.

    Returns:
        :class:`AlignmentResult` (see its docstring). Never raises for bad token data.
    """
    bv = _byte_vocab(tokenizer)
    ref_ids: list[int] = []
    spans: list[tuple[int, int] | None] = []
    one: list[int | None] = []
    failures: list[AlignmentFailure] = []
    broken = False
    prefix = 0
    pending = 0  # empty partial-character tokens waiting for their whole character (rule 4)
    for i, t in enumerate(tokens):
        if broken:
            spans.append(None)
            one.append(None)
            continue
        b = t.bytes
        ids: list[int] | None
        if b is None:
            failures.append(AlignmentFailure(i, "unknown_bytes", f"token {t.token!r}"))
            ids = None
        elif b == b"" and t.token == "" and t.token not in bv.special and whole_character_follows(tokens, i):
            ids = []  # a piece of the character the next non-empty token carries whole (rule 4)
            pending += 1
        elif b == b"":
            sid = bv.special.get(t.token)
            ids = [sid] if sid is not None else None
            if ids is None:
                failures.append(AlignmentFailure(i, "empty_bytes", f"token {t.token!r} has no bytes and is no reference special token"))
        elif pending:
            ids = _split_character(b, pending + 1, bv, tokenizer)
            if ids is None:
                failures.append(AlignmentFailure(
                    i, "unknown_bytes" if _FFFD in b else "partial_character_split",
                    f"token {t.token!r} carries a character split over {pending + 1} tokens"))
            pending = 0
        elif b in bv.by_bytes:
            ids = [bv.by_bytes[b]]
        elif (sid := bv.special.get(b.decode("utf-8", errors="replace"))) is not None:
            ids = [sid]  # a special token the provider spelled out (a reasoning model's <think> where it is special)
        else:
            ids = None
            if not isinstance(tokenizer, ByteVocab):
                try:
                    enc = list(tokenizer.encode(b.decode("utf-8"), add_special_tokens=False))
                    if b"".join(bv.id_bytes.get(x, b"\x00\xff") for x in enc) == b:
                        ids = enc
                except (UnicodeDecodeError, Exception):
                    ids = None
            if ids is None:
                ids = bv.segment(b)
            if ids is None:
                failures.append(AlignmentFailure(i, "not_representable", f"bytes {b[:40]!r} not spellable in the reference vocabulary"))
        if ids is None:
            broken = True
            spans.append(None)
            one.append(None)
            continue
        start = len(ref_ids)
        ref_ids.extend(ids)
        spans.append((start, len(ref_ids)))
        one.append(ids[0] if len(ids) == 1 else None)
        if not pending:
            prefix = i + 1
    return AlignmentResult(ref_ids=ref_ids, spans=spans, ref_token_ids=one, failures=failures, aligned_prefix=prefix, mode=bv.mode)


_FFFD = "\ufffd".encode()


def _split_character(b: bytes, pieces: int, bv: ByteVocab, tokenizer: Any) -> list[int] | None:
    """The ``pieces`` reference ids of a whole-character token after ``pieces - 1`` empty ones, or None
    (U+FFFD: lost bytes; no encoding with that many pieces: the split is unknown)."""
    if _FFFD in b:
        return None
    cands: list[list[int] | None] = []
    if not isinstance(tokenizer, ByteVocab):
        try:
            enc = list(tokenizer.encode(b.decode("utf-8"), add_special_tokens=False))
            cands.append(enc if b"".join(bv.id_bytes.get(x, b"\x00\xff") for x in enc) == b else None)
        except Exception:
            cands.append(None)
    cands += [bv.whole_character_ids(b), bv.segment(b)]
    return next((c for c in cands if c is not None and len(c) == pieces), None)
