"""The reference side of a calibration pool, shared by every way a pool is collected.

:func:`score_reference` teacher-forces every honest reference precision at the provider's prefixes and
:func:`assemble_pool` packs provider and reference rows into a :class:`~auditor.calibration.pool.Pool`; the
simulator's pools (:mod:`auditor.calibration.collect`) and the recorded ones
(:mod:`auditor.calibration.recorded`) both end here, so neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from auditor.calibration.decoding import score_prompt_groups
from auditor.calibration.pool import PROVIDER_TOP_N, REF_TOP_K, SCORE_BATCH_SIZE, Pool, PoolRequest

if TYPE_CHECKING:
    from reference.models import LoadedModel

    #: The reference: one float32 ``LoadedModel``, or reference dtype → ``LoadedModel``.
    RefModels = LoadedModel | Mapping[str, LoadedModel]

__all__ = ["RefModels", "as_refs", "assemble_pool", "score_reference"]


def score_reference(
    profile_name: str,
    reqs: list[PoolRequest],
    results: Mapping[str, dict],
    ref_lms: RefModels,
    *,
    reuse: Callable[[PoolRequest], bool] = lambda _r: False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, dict]]:
    """The reference side of a pool: every honest reference precision teacher-forced at the provider's prefixes.

    Temperature-0 items go through the pipeline's own scorer and batching
    (``reference.scoring.score_continuations``, batch ``SCORE_BATCH_SIZE``, as ``auditor check`` scores them), so
    low-precision references see the same numerics as in an audit; sampled items share their prompt's prefill
    (``decoding.score_prompt_groups``).

    Args:
        profile_name: for progress messages.
        reqs: the pool's requests.
        results: request key → provider outputs {token_ids [T] int64, logprob [T] float64, top_ids [T, 20],
            top_lp [T, 20]}.
        ref_lms: reference dtype → LoadedModel (``float32`` required).
        reuse: requests whose float32 reference rows ARE the provider's rows (the served model is the float32
            reference, decoded in batches): their top-20 is copied instead of recomputed.
        progress: optional one-line status callback.

    Returns:
        reference dtype → request key → {top_ids [T, 20] int64, top_lp [T, 20] float64 (nats), token_lp [T]}.
    """
    say = progress or (lambda _m: None)
    by_prompt: dict[tuple[int, ...], list[PoolRequest]] = {}
    for r in reqs:
        by_prompt.setdefault(r.prompt_ids, []).append(r)
    ref: dict[str, dict[str, dict]] = {}
    for dt, lm in as_refs(ref_lms).items():
        rd: dict[str, dict] = {}
        todo: list[tuple[tuple[int, ...], list[PoolRequest]]] = []
        for prompt, group in by_prompt.items():
            need = []
            for r in group:
                if dt == "float32" and reuse(r):
                    o = results[r.key]
                    rd[r.key] = {"top_ids": o["top_ids"][:, :REF_TOP_K], "top_lp": o["top_lp"][:, :REF_TOP_K],
                                 "token_lp": o["logprob"]}
                else:
                    need.append(r)
            if need:
                todo.append((prompt, need))
        t0_need = [r for _, need in todo for r in need if r.temperature == 0]
        if t0_need:
            from reference.scoring import score_continuations

            sc0 = score_continuations(lm, [list(r.prompt_ids) for r in t0_need],
                                      [results[r.key]["token_ids"].tolist() for r in t0_need],
                                      top_k=REF_TOP_K, batch_size=SCORE_BATCH_SIZE)
            for r, x in zip(t0_need, sc0, strict=True):
                rd[r.key] = {"top_ids": x.top_ids, "top_lp": x.top_logprobs, "token_lp": x.logprobs}
        groups1 = [(pr, [r for r in need if r.temperature > 0]) for pr, need in todo]
        groups1 = [(pr, need) for pr, need in groups1 if need]
        scored = score_prompt_groups(
            lm, [(list(pr), [results[r.key]["token_ids"].tolist() for r in need]) for pr, need in groups1]
        )
        for (_, need), sc in zip(groups1, scored, strict=True):
            for r, row in zip(need, sc, strict=True):
                rd[r.key] = row
        ref[dt] = rd
        say(f"{profile_name}: reference {dt} scored")
    return ref


def as_refs(ref_lms: RefModels) -> dict[str, LoadedModel]:
    """Normalise ``ref_lms`` to {dtype: LoadedModel} with ``float32`` present.

    Raises:
        ValueError: no float32 reference.
    """
    if not isinstance(ref_lms, Mapping):
        return {"float32": ref_lms}
    if "float32" not in ref_lms:
        raise ValueError(f"ref_lms needs a 'float32' reference (got {sorted(ref_lms)})")
    return dict(ref_lms)


def assemble_pool(profile_name: str, ref_lm: LoadedModel, reqs: list[PoolRequest], results: dict, ref: dict) -> Pool:
    """The :class:`~auditor.calibration.pool.Pool` of ``reqs``: the provider outputs ``results`` (request key →
    {token_ids [T], logprob [T], top_ids [T, 20], top_lp [T, 20]}, plus span [T] str and step_final [T] float64 in
    a reasoning-mode pool, :mod:`auditor.calibration.reasoning`) concatenated in request order, with the
    reference side ``ref`` (dtype → request key → {top_ids, top_lp, token_lp}, :func:`score_reference`)."""
    lens = [len(results[r.key]["token_ids"]) for r in reqs]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    def cat(src: dict, k: str, shape_tail: tuple, dtype: type) -> np.ndarray:
        parts = [np.asarray(src[r.key][k], dtype).reshape((-1, *shape_tail)) for r in reqs]
        return np.concatenate(parts) if parts else np.zeros((0, *shape_tail), dtype)

    spans = all("span" in results[r.key] for r in reqs) and bool(reqs)  # a reasoning-mode pool (think:PROFILE)
    return Pool(
        token_span=cat(results, "span", (), str) if spans else None,
        step_final=cat(results, "step_final", (), np.float64) if spans else None,
        profile=profile_name,
        model=str(ref_lm.name),
        revision=str(ref_lm.revision),
        meta={},
        item_keys=np.asarray([r.key for r in reqs], dtype=str),
        item_prompt=np.asarray([r.prompt_id for r in reqs], dtype=str),
        item_workload=np.asarray([r.workload for r in reqs], dtype=str),
        item_temperature=np.asarray([r.temperature for r in reqs], np.float64),
        item_offsets=offsets,
        item_prompt_tokens=np.asarray([len(r.prompt_ids) for r in reqs], np.int64),
        token_ids=cat(results, "token_ids", (), np.int64),
        prov_logprob=cat(results, "logprob", (), np.float64),
        prov_top_ids=cat(results, "top_ids", (PROVIDER_TOP_N,), np.int64),
        prov_top_lp=cat(results, "top_lp", (PROVIDER_TOP_N,), np.float64),
        ref_top_ids={dt: cat(rd, "top_ids", (REF_TOP_K,), np.int64) for dt, rd in ref.items()},
        ref_top_lp={dt: cat(rd, "top_lp", (REF_TOP_K,), np.float64) for dt, rd in ref.items()},
        ref_token_lp={dt: cat(rd, "token_lp", (), np.float64) for dt, rd in ref.items()},
    )
