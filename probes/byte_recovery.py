"""Token-byte recovery: every way a provider spells a token's bytes, and the text-guided choice.

A provider reports, per token, a string and (chat API) a ``bytes`` list. Either can be wrong in
known ways; this module lists the readings of a token (:func:`candidates`) and keeps the one
reading per token that, together with the other tokens, reproduces the answer text exactly
(:func:`assign_bytes`, a dynamic program over the text's bytes). Used by
:mod:`probes.normalize`; no network and no torch.

Readings, in order of preference (the first one that fits the text wins):

1. the ``bytes`` field as given;
2. the ``bytes`` field read through a *lossy* text: when the answer text itself carries U+FFFD
   (a runtime that decodes each token on its own turns a split character into U+FFFD in the
   text and token strings), correct bytes match the text through their per-token lossy decoding
   (``bytes.decode("utf-8", "replace")``). The given bytes are kept — never overwritten by the
   U+FFFD of the text (anomaly ``replacement_char_text``);
3. the UTF-8 of the token string;
4. for the token string and for the ``bytes`` field read as UTF-8: byte-fallback spellings
   (``<0xC3>``, ``bytes:\\xc3``, ``\\xc3``; a convention, no anomaly), the GPT-2 byte-to-unicode
   inverse (``Ġthat`` → `` that``; ``surrogate_token_strings``), SentencePiece ``▁`` → space
   (``spm_token_strings``);
5. the empty string for special tokens (``<|im_end|>``);
6. when the text has no U+FFFD but a token's bytes (or, without a bytes field, its string) do: a wildcard of 1–3 non-ASCII bytes per
   U+FFFD (``replacement_char_bytes``), filled from the text.

A token gets bytes only when every assignment that reproduces the text agrees on its span;
otherwise ``None`` (reported by the caller, never guessed).

Sources: GPT-2's byte-to-unicode table (Radford et al. 2019, openai/gpt-2 ``encoder.py``);
SentencePiece byte fallback (Kudo & Richardson 2018); OpenAI's chat ``logprobs.content[].bytes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "FFFD",
    "SPELLED",
    "Cand",
    "alt_bytes",
    "assign_bytes",
    "byte_spelling",
    "candidates",
    "gpt2_unicode_to_bytes",
    "lossy_text_consistent",
    "valid_byte_list",
]

FFFD = "\ufffd".encode()
#: Internal candidate kind: bytes spelled out in the token string (a convention, not an anomaly).
SPELLED = "~byte_spelling"
#: Most distinct start positions the assignment tracks per token before giving up (ambiguity bound).
_MAX_FRONTIER = 64


@lru_cache(maxsize=1)
def _gpt2_u2b() -> dict[str, int]:
    # printable latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


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


def byte_spelling(token: str) -> bytes | None:
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


def valid_byte_list(v: object) -> bytes | None:
    """A JSON ``bytes`` field as bytes: a list of ints 0..255 (booleans refused), else ``None``."""
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 255 for x in v):
        return bytes(v)
    return None


def _strings(token: str, given: bytes | None) -> list[str]:
    """The token string, plus the ``bytes`` field read as UTF-8 when it is valid and differs."""
    out = [token]
    if given is not None:
        try:
            s = given.decode("utf-8")
        except UnicodeDecodeError:
            return out
        if s != token:
            out.append(s)
    return out


@dataclass(frozen=True)
class Cand:
    """One reading of a token: the text ``segments`` it must match (``None`` = 1–3 non-ASCII
    wildcard bytes), the bytes it assigns (``out``; ``None`` = the matched text span) and the
    anomaly kind reported when it is the reading that fits (``None`` = no anomaly)."""

    segments: tuple[bytes | None, ...]
    kind: str | None
    out: bytes | None = None


def candidates(token: str, given: bytes | None, text_has_fffd: bool) -> list[Cand]:
    """Every reading of one token, most preferred first (see the module docstring)."""
    out: list[Cand] = []
    seen: set[bytes] = set()

    def add(b: bytes | None, kind: str | None, keep: bytes | None = None) -> None:
        if b is None or b in seen:
            return
        seen.add(b)
        out.append(Cand((b,), kind, keep))

    add(given, None)
    if text_has_fffd and given is not None and FFFD not in given:
        lossy = given.decode("utf-8", errors="replace").encode("utf-8")
        if lossy != given:
            add(lossy, "replacement_char_text", given)
    if token or not given:  # an empty string says nothing about a token whose bytes were given
        add(token.encode("utf-8", errors="surrogatepass"), None)
    for s in _strings(token, given):
        if not s:
            continue
        add(byte_spelling(s), SPELLED)
        add(gpt2_unicode_to_bytes(s), "surrogate_token_strings")
        if "▁" in s:
            add(s.replace("▁", " ").encode("utf-8"), "spm_token_strings")
    if _SPECIAL_RE.match(token):
        add(b"", None)
    if not text_has_fffd:
        # U+FFFD in the given bytes, or (no bytes given) in the token string; a U+FFFD-free
        # bytes field is never replaced by a wildcard read from its token string
        for src in (given,) if given is not None else (token.encode("utf-8", errors="surrogatepass"),):
            if FFFD in src:
                parts = src.split(FFFD)
                segs: list[bytes | None] = []
                for i, part in enumerate(parts):
                    if part:
                        segs.append(part)
                    if i < len(parts) - 1:
                        segs.append(None)
                out.append(Cand(tuple(segs), "replacement_char_bytes"))
                break
    return out


def alt_bytes(atok: str, abytes: bytes | None, recovery: str | None, spelled: bool) -> bytes:
    """Bytes of an alternative (top-logprob entry), read the way its chosen token was.

    ``recovery`` is the leaked spelling the chosen tokens needed (``surrogate_token_strings`` or
    ``spm_token_strings``, else ``None``); ``spelled``: the server spells partial characters as
    byte escapes. Tries the alternative's string, then its ``bytes`` field read as UTF-8.
    """
    strs = [s for s in _strings(atok, abytes) if s]
    if recovery == "surrogate_token_strings":
        for s in strs:
            g = gpt2_unicode_to_bytes(s)
            if g is not None:
                return g
    elif recovery == "spm_token_strings":
        return next((s for s in strs if "▁" in s), atok).replace("▁", " ").encode("utf-8", errors="surrogatepass")
    if abytes is not None:
        return abytes
    if spelled:
        b = byte_spelling(atok)
        if b is not None:
            return b
    return atok.encode("utf-8", errors="surrogatepass")


def _match_ends(cand: Cand, text: bytes, p: int) -> list[int]:
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


def assign_bytes(cands: list[list[Cand]], text: bytes) -> tuple[list[bytes | None], list[str | None]] | None:
    """Text-guided byte assignment.

    Args:
        cands: per token, its readings (:func:`candidates`).
        text: the answer text as UTF-8 bytes.

    Returns:
        per-token bytes (``None`` where the assignments that reproduce ``text`` disagree on the
        token's span) and the anomaly kind of the reading used (``None`` = plain), or ``None``
        when no assignment reproduces ``text`` (or the ambiguity exceeds a fixed bound).
    """
    n = len(cands)
    reach: list[set[int]] = [set() for _ in range(n + 1)]
    reach[0].add(0)
    edges: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (start, end, reading index)
    for i in range(n):
        for p in reach[i]:
            for ci, c in enumerate(cands[i]):
                for q in _match_ends(c, text, p):
                    edges[i].append((p, q, ci))
                    reach[i + 1].add(q)
        if not reach[i + 1] or len(reach[i + 1]) > _MAX_FRONTIER:
            return None
    end = len(text)
    if end not in reach[n]:
        return None
    alive: list[set[int]] = [set() for _ in range(n + 1)]
    alive[n].add(end)
    for i in range(n - 1, -1, -1):
        for p, q, _ in edges[i]:
            if q in alive[i + 1]:
                alive[i].add(p)
    out_b: list[bytes | None] = []
    out_k: list[str | None] = []
    for i in range(n):
        valid = [(p, q, ci) for p, q, ci in edges[i] if p in alive[i] and q in alive[i + 1]]
        spans = {(p, q) for p, q, _ in valid}
        if not valid:
            out_b.append(None)
            out_k.append(None)
            continue
        p, q, ci = min(valid, key=lambda e: e[2])  # the most preferred reading that fits
        c = cands[i][ci]
        out_b.append((c.out if c.out is not None else text[p:q]) if len(spans) == 1 else None)
        out_k.append(c.kind)
    return out_b, out_k


def lossy_text_consistent(real: bytes, text: str) -> bool:
    """Whether ``text`` is ``real`` (valid UTF-8) with some non-ASCII characters lost to U+FFFD,
    in any grouping: each run of U+FFFD in ``text`` stands for one or more non-ASCII characters
    of ``real``, and everything else matches exactly. ``False`` when ``real`` is not valid UTF-8
    or ``text`` has no U+FFFD."""
    if "\ufffd" not in text:
        return False
    try:
        r = real.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if "\ufffd" in r:
        return False
    parts = re.split("\ufffd+", text)
    pattern = "[^\\x00-\\x7f]+".join(re.escape(p) for p in parts)
    return re.fullmatch(pattern, r, flags=re.DOTALL) is not None
