"""Reference-scoring stage of ``auditor check``: the reference teacher-forced at the provider's prefixes.

One seam: a :class:`Scorer` is anything with ``revision`` (pins the weights), ``dtype`` (precision
name) and ``score(prompts, continuations, *, top_k)`` returning, per continuation,
``reference.scoring.ScoredContinuation`` — per position the chosen token's logprob ``[T]``, the
top-k ids ``[T, K]`` int64 and logprobs ``[T, K]`` float64 (nats, temperature 1) and the mass
outside the top-k ``tail_mass`` ``[T]`` (= 1 − Σ top-k probabilities; the log-sum-exp of the raw
logits is already divided out of every logprob). Today :class:`LocalScorer` wraps a
``reference.models.LoadedModel`` and calls ``reference.scoring.score_continuations``; a
``reference.backends`` backend (local / vllm / none) has the same three members and plugs in as is.
The reference itself is set up earlier, before any probe (:mod:`auditor.check.reference_setup`).

:func:`score_observations` puts the scorer behind the store's ``reference_cache`` (key: revision +
dtype + prompt ids + continuation ids + top-k, ``auditor.store.queries.reference_cache_key``) and
batches what is not cached, shortest first.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from auditor.check.memory import StageNeed
    from auditor.check.observations import Observation
    from auditor.store import Store
    from reference.models import LoadedModel
    from reference.scoring import ScoredContinuation

__all__ = [
    "REFERENCE_TOP_K",
    "SCORE_BATCH_SIZE",
    "LocalScorer",
    "Scorer",
    "local_scorers",
    "score_observations",
    "scoring_memory_need",
]

#: Reference alternatives kept per position (top-K, with the emitted token's own logprob).
REFERENCE_TOP_K = 20
#: Default teacher-forcing batch size (sequences per forward).
SCORE_BATCH_SIZE = 8


class Scorer(Protocol):
    """The reference as the scoring stage needs it (see the module docstring)."""

    @property
    def revision(self) -> str:
        """Pins the weights (part of every cache key)."""
        ...

    @property
    def dtype(self) -> str:
        """Precision name (``float32``, ``bfloat16``, ``server``); part of every cache key."""
        ...

    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, top_k: int
    ) -> list[ScoredContinuation]:
        """Teacher-force each continuation after its prompt (one ScoredContinuation each, in order)."""
        ...


@dataclass
class LocalScorer:
    """A ``LoadedModel`` in one precision as a :class:`Scorer` (``reference.scoring.score_continuations``).

    Attributes:
        lm: the reference model; dtype: its precision name (``float32``, ``bfloat16``);
        batch_size: sequences per forward.
    """

    lm: LoadedModel
    dtype: str
    batch_size: int = SCORE_BATCH_SIZE

    @property
    def revision(self) -> str:
        """The weights revision (sha256 prefix) of ``lm``."""
        return str(self.lm.revision)

    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, top_k: int
    ) -> list[ScoredContinuation]:
        """See :class:`Scorer`; raises ``ValueError`` on ids outside the vocabulary or empty prompts."""
        from reference.scoring import score_continuations

        return score_continuations(self.lm, prompts, continuations, top_k=top_k, batch_size=self.batch_size)


def local_scorers(models: Mapping[str, LoadedModel], batch_size: int = SCORE_BATCH_SIZE) -> dict[str, Scorer]:
    """reference dtype → :class:`LocalScorer` of that model."""
    return {dt: LocalScorer(lm, dt, batch_size) for dt, lm in models.items()}


def scoring_memory_need(lm: LoadedModel, items: Sequence[tuple[Sequence[int], Sequence[int]]],
                        batch_size: int = SCORE_BATCH_SIZE) -> StageNeed:
    """Upper bound of the extra memory :func:`score_observations` needs with a local reference
    (``auditor.check.memory.scoring_need``): one ``logit_rows`` chunk of ``[rows, V]`` float32 logits, one
    forward of at most ``reference.scoring.DEFAULT_TOKEN_BUDGET`` padded tokens, and ~400 bytes kept
    per position (top-20 ids and logprobs, never a full row).

    Args:
        lm: the reference; items: per observation (prompt ids, continuation ids); batch_size: sequences per forward.
    """
    from auditor.check.memory import model_shape, scoring_need
    from reference.scoring import DEFAULT_TOKEN_BUDGET

    return scoring_need(model_shape(lm), n_positions=sum(len(c) for _, c in items), token_budget=DEFAULT_TOKEN_BUDGET,
                        batch_size=batch_size, longest=max((len(p) + len(c) for p, c in items), default=0))


# ------------------------------------------------------------------------------------------ cache
def _pack(sc: ScoredContinuation) -> bytes:
    buf = io.BytesIO()
    arrays = {
        "logprobs": np.asarray(sc.logprobs, np.float64),
        "top_ids": np.asarray(sc.top_ids, np.int64),
        "top_logprobs": np.asarray(sc.top_logprobs, np.float64),
    }
    if sc.tail_mass is not None:
        arrays["tail_mass"] = np.asarray(sc.tail_mass, np.float64)
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
    return buf.getvalue()


def _unpack(payload: bytes, token_ids: list[int]) -> ScoredContinuation:
    from reference.scoring import ScoredContinuation

    with np.load(io.BytesIO(payload)) as z:
        tail = z["tail_mass"] if "tail_mass" in z.files else None
        return ScoredContinuation(list(token_ids), z["logprobs"], z["top_ids"], z["top_logprobs"], None, tail)


def _empty(top_k: int) -> ScoredContinuation:
    from reference.scoring import ScoredContinuation

    return ScoredContinuation([], np.zeros(0), np.zeros((0, top_k), np.int64), np.zeros((0, top_k)), None, np.zeros(0))


# ------------------------------------------------------------------------------------------ stage
def score_observations(
    store: Store,
    scorer: Scorer,
    observations: Sequence[Observation],
    *,
    top_k: int = REFERENCE_TOP_K,
    batch_size: int = SCORE_BATCH_SIZE,
    progress: Callable[[int, int], None] | None = None,
) -> list[ScoredContinuation]:
    """Teacher-force the reference at every observation's own prefix, through the cache.

    Args:
        store: open store (``reference_cache`` table).
        scorer: the reference in one precision (:class:`Scorer`; ``scorer.revision`` and
            ``scorer.dtype`` key the cache).
        observations: their ``prompt_ids`` and ``ref_ids`` are scored.
        top_k: alternatives per position; batch_size: observations sent to the scorer at once.
        progress: ``progress(done, total)`` after each batch (sequences).

    Returns:
        ``reference.scoring.ScoredContinuation`` per observation (``token_ids == ref_ids``).

    Raises:
        ValueError: from the scorer (ids outside the vocabulary, empty prompt).
    """
    from auditor.store import queries as q

    keys = [q.reference_cache_key(scorer.revision, scorer.dtype, o.prompt_ids, o.ref_ids, top_k) for o in observations]
    with store.session() as s:
        cached = q.reference_cache_get_many(s, keys)
    out: list[ScoredContinuation | None] = [None] * len(observations)
    todo = []
    for i, (o, k) in enumerate(zip(observations, keys, strict=True)):
        if not o.ref_ids:
            out[i] = _empty(top_k)
        elif k in cached:
            try:
                out[i] = _unpack(cached[k], o.ref_ids)
            except (ValueError, KeyError, OSError):
                todo.append(i)
        else:
            todo.append(i)
    todo.sort(key=lambda i: len(observations[i].prompt_ids) + len(observations[i].ref_ids))
    done = len(observations) - len(todo)
    if progress is not None:
        progress(done, len(observations))
    for b in range(0, len(todo), batch_size):
        idx = todo[b : b + batch_size]
        res = scorer.score([observations[i].prompt_ids for i in idx], [observations[i].ref_ids for i in idx], top_k=top_k)
        with store.session() as s:
            for i, sc in zip(idx, res, strict=True):
                out[i] = sc
                q.reference_cache_put(s, keys[i], scorer.revision, _pack(sc))
        done += len(idx)
        if progress is not None:
            progress(done, len(observations))
    missing = [i for i, sc in enumerate(out) if sc is None]
    if missing:  # pragma: no cover - a scorer returned fewer results than asked
        raise ValueError(f"the reference scorer returned no result for observations {missing[:5]}")
    return [sc for sc in out if sc is not None]
