"""Suffix drafter: prompt lookup plus a cache of the model's own earlier outputs.

SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications"; vLLM's ``method = "suffix"`` through Arctic Inference) drafts from two sources: the
current request (prompt + tokens so far, as prompt lookup does) and a global store of the outputs
the server generated before. A model repeats its own idioms across requests -- SmolLM2 answers
HumanEval with "This Python function uses the built-in `...` function to ..." -- which no
prompt-lookup drafter can see, because the phrase is not in the prompt. Drafting is a lookup
(no model runs), so ``cost_per_token`` is 0 and the strict verifier keeps every output exactly the
target's (greedy: token-identical to plain decoding).

Lookup: the context's suffix is matched against both sources; the source with the longer match
(``min_n..max_n`` tokens) proposes, the current request on a tie. In the cache every occurrence of
the longest matched suffix votes: the proposal follows the most frequent next token, then the most
frequent among the occurrences that agree so far (SuffixDecoding's frequency-scored path through its
suffix tree; ties go to the most recent occurrence), until k tokens or the end of every agreeing
output. The store is one flat int32 buffer (4 bytes a token, sequences separated by -1) scanned with
numpy: ``max_tokens`` = 262,144 costs ~1 MiB and well under a millisecond a lookup; when it is full
the oldest half is dropped.

Determinism: a proposal depends on the requests served before, never on a clock. With the strict
verifier greedy output is identical to plain decoding whatever the cache holds (a lossy simulator
verifier's output does depend on the drafts, hence on the history); seeded *sampled* output is distributed exactly
as the target's, but which seeded sample comes out depends on the drafts, so it can differ with the
request history (the ``ngram`` drafter has no history; the simulator's profiles default to it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from reference.drafters import Drafter, NgramDrafter, Proposal
from reference.sampling import SamplingParams

_SEP = -1
_NO_TOKEN = -2  # stands in for a context id the buffer cannot hold: matches nothing, not even a separator
_MAX_ID = int(np.iinfo(np.int32).max)


class OutputCache:
    """Earlier outputs, searchable by suffix match.

    Args:
        min_n: shortest suffix that may match (>= 1 tokens).
        max_n: longest suffix compared (>= min_n tokens).
        max_tokens: capacity in tokens (separators included); the oldest half is dropped when full.
        max_votes: at most this many (most recent) occurrences vote on a continuation.

    Raises:
        ValueError: ``min_n < 1``, ``max_n < min_n``, ``max_tokens < 2 * max_n + 2`` or ``max_votes < 1``.
    """

    def __init__(self, min_n: int = 2, max_n: int = 8, max_tokens: int = 262_144, max_votes: int = 256):
        if min_n < 1 or max_n < min_n or max_tokens < 2 * max_n + 2 or max_votes < 1:
            raise ValueError(
                f"OutputCache needs 1 <= min_n <= max_n, max_tokens >= 2 * max_n + 2 and max_votes >= 1; "
                f"got min_n={min_n}, max_n={max_n}, max_tokens={max_tokens}, max_votes={max_votes}"
            )
        self.min_n, self.max_n = int(min_n), int(max_n)
        self.max_tokens, self.max_votes = int(max_tokens), int(max_votes)
        self._buf = np.full(self.max_tokens, _SEP, dtype=np.int32)
        self._len = 1  # buf[0] is a separator, so every stored token has a separator before its output
        self.n_outputs = 0  # outputs ever added (evicted ones included)

    def __len__(self) -> int:
        """Tokens stored (separators included)."""
        return self._len

    def copy(self) -> OutputCache:
        """An independent cache with the same contents (a frozen warm cache per benchmark run)."""
        other = OutputCache(self.min_n, self.max_n, self.max_tokens, self.max_votes)
        other._buf[:] = self._buf
        other._len, other.n_outputs = self._len, self.n_outputs
        return other

    def clear(self) -> None:
        """Forget every stored output."""
        self._buf[:] = _SEP
        self._len, self.n_outputs = 1, 0

    def add(self, tokens: Sequence[int]) -> None:
        """Store one output (token ids >= 0; an output longer than half the capacity keeps its tail).

        Raises:
            ValueError: a token id outside 0 .. 2**31 - 1 (the buffer is int32).
        """
        arr = np.asarray(list(tokens), dtype=np.int64)
        if arr.size == 0:
            return
        if int(arr.min()) < 0 or int(arr.max()) > _MAX_ID:
            raise ValueError(f"OutputCache.add: token ids must be in 0..{_MAX_ID}")
        arr = arr[-(self.max_tokens // 2 - 1):].astype(np.int32)
        need = arr.size + 1  # the output and its trailing separator
        if self._len + need > self.max_tokens:  # keep the newest half, cut at a separator
            keep_from = self._len - self.max_tokens // 2
            seps = np.flatnonzero(self._buf[keep_from : self._len] == _SEP)
            start = keep_from + (int(seps[0]) if seps.size else 0)
            kept = self._buf[start : self._len].copy()
            self._buf[:] = _SEP
            self._buf[: kept.size] = kept
            self._len = max(int(kept.size), 1)
        self._buf[self._len : self._len + arr.size] = arr
        self._buf[self._len + arr.size] = _SEP
        self._len += need
        self.n_outputs += 1

    def match(self, context_ids: Sequence[int], k: int) -> tuple[int, list[int]]:
        """``(n, continuation)``: the longest suffix of the context found in the cache (n tokens,
        ``min_n <= n <= max_n``; 0 = none) and the most frequent continuation, up to k ids."""
        if k <= 0 or len(context_ids) < self.min_n or self._len <= self.min_n:
            return 0, []
        tail = np.asarray(list(context_ids[-self.max_n :]), dtype=np.int64)
        tail[(tail < 0) | (tail > _MAX_ID)] = _NO_TOKEN  # ids no output holds (and never a separator)
        tail = tail.astype(np.int32)
        buf = self._buf[: self._len]
        m = min(self.min_n, tail.size)
        # hits: end positions e (exclusive) with buf[e - m : e] == the context's last m tokens
        ok = buf[m - 1 :] == tail[-1]
        for j in range(2, m + 1):
            ok &= buf[m - j : self._len - j + 1] == tail[-j]
        ends = np.flatnonzero(ok) + m
        ends = ends[ends < self._len]
        ends = ends[buf[ends] != _SEP]  # a continuation must exist (not the end of an earlier output)
        if ends.size == 0:
            return 0, []
        # extend each hit's match backwards up to max_n tokens (separators never match a token id)
        length = np.full(ends.size, m, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for j in range(m + 1, tail.size + 1):
            pos = ends - j
            same = (pos >= 0) & (buf[np.maximum(pos, 0)] == tail[-j])
            alive &= same
            length += alive
            if not alive.any():
                break
        n = int(length.max())
        voters = ends[length == n][-self.max_votes :]
        out: list[int] = []
        while len(out) < k and voters.size:
            nxt = buf[voters]
            valid = nxt != _SEP
            voters, nxt = voters[valid], nxt[valid]
            if voters.size == 0:
                break
            vals, first_rev, counts = np.unique(nxt[::-1], return_index=True, return_counts=True)
            # most votes; on a tie the most recent occurrence (smallest index in the reversed order)
            best = int(vals[np.lexsort((first_rev, -counts))[0]])
            out.append(best)
            voters = voters[nxt == best] + 1
        return (n, out) if out else (0, [])


class SuffixDrafter(Drafter):
    """Prompt lookup over the current request plus :class:`OutputCache` over earlier outputs.

    Args:
        min_n: shortest suffix match, both sources (>= 1 tokens).
        max_n: longest suffix compared (>= min_n tokens).
        max_cache_tokens: the output cache's capacity in tokens (about 4 bytes each).
        cache: use an existing cache (its own min_n / max_n apply to it; a frozen warm cache's
            ``copy()`` in the benchmark); None = a new one. Not thread-safe: one generation at a time
            (the simulator holds its engine lock around generation).

    Raises:
        ValueError: invalid n range or capacity (from :class:`NgramDrafter` / :class:`OutputCache`).
    """

    name = "suffix"
    cost_per_token = 0.0  # numpy lookups (well under a millisecond) next to a target forward

    def __init__(self, min_n: int = 2, max_n: int = 8, max_cache_tokens: int = 262_144, cache: OutputCache | None = None):
        self.lookup = NgramDrafter(min_n, max_n)
        self.cache = cache if cache is not None else OutputCache(min_n, max_n, max_cache_tokens)
        self.n_from_cache = 0  # proposals taken from the cache / from the current request
        self.n_from_context = 0

    def observe_output(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Store a finished output in the cache (prompts are not stored: prompt lookup sees them)."""
        self.cache.add([int(t) for t in output_ids])

    def _draft(
        self, context_ids: Sequence[int], k: int, sampling: SamplingParams | None, generator: torch.Generator | None
    ) -> Proposal:
        """The longer of the two matches proposes (the current request on a tie); q is None (one-hot)."""
        n_ctx, ids_ctx = self.lookup.match(context_ids, k)
        n_cache, ids_cache = self.cache.match(context_ids, k)
        if ids_cache and n_cache > n_ctx:
            self.n_from_cache += 1
            return Proposal(torch.tensor(ids_cache, dtype=torch.long), None)
        if ids_ctx:
            self.n_from_context += 1
            return Proposal(torch.tensor(ids_ctx, dtype=torch.long), None)
        return Proposal(torch.zeros(0, dtype=torch.long), None)
