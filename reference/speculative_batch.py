"""Lock-step batched speculative decoding: many independent requests, one target forward per round.

:func:`reference.speculative.speculative_generate` serves one request at a time: every round is one
forward over ``[pending] + drafts`` (1–5 rows), which on a CPU costs about as much as a forward over
many more rows. :func:`speculative_generate_batch` runs B requests side by side, each with its own
state, generator, verifier and draft-length policy, exactly as the sequential loop would (the same
stages: ``_propose``, the verifier's decision, ``_record_round``, ``_emit``), and batches only the
target forward. The calibration collects the pools of draft-dependent lossy verifiers this way
(``auditor.calibration.collect``: relaxed-threshold, typical-acceptance, greedy-relaxed).

How rows of different lengths share one KV cache: prompts are left-padded; each round appends a block
of ``W = 1 + max drafts`` columns to every row, with explicit ``position_ids`` (a row's positions
continue from its own length) and an attention mask that marks the row's real tokens. After the
verifier's decision the columns of the row's rejected drafts (and its padding) are masked out for good
— the batched counterpart of ``DynamicCache.crop`` — so every later query attends to exactly the
tokens the sequential loop keeps, at the same positions. Finished rows leave the batch
(``DynamicCache.batch_select_indices``).

Each row's output has the same law as the sequential loop's (same draws from the row's generator, in
the same order); the logits differ only by float reduction order across batch shapes (the same
difference as any batched serving), so a row's tokens equal the sequential ones except where a decision
sits within that rounding of its threshold.

Not supported (:func:`batchable` says why; callers fall back to the sequential loop): drafters with
per-sequence or cross-request state (a draft model's incremental cache, the suffix drafter), models
with sliding-window layers (their window counts cache columns, and masked columns would shift it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from reference.drafters import Drafter
from reference.models import unwrap
from reference.speculative import (
    GenerationResult,
    TargetLike,
    _emit,
    _finish,
    _new_run,
    _propose,
    _record_round,
    _target_probs,
)

if TYPE_CHECKING:
    from reference.verify import Verifier

__all__ = ["batchable", "speculative_generate_batch"]


def _stateless(drafter: Drafter | None) -> bool:
    """A drafter whose proposals depend only on their arguments (it keeps the base class's no-op
    ``reset`` and ``observe_output``), so one instance can serve every row of a batch."""
    if drafter is None:
        return True
    cls = type(drafter)
    return cls.reset is Drafter.reset and cls.observe_output is Drafter.observe_output


def batchable(lm: TargetLike, drafter: Drafter | None) -> str | None:
    """None when :func:`speculative_generate_batch` can run this model and drafter, else the reason."""
    model, _ = unwrap(lm)
    cfg = getattr(model, "config", None)
    if getattr(cfg, "sliding_window", None) or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        return "the model has sliding-window layers (their window would count masked cache columns)"
    if not _stateless(drafter):
        return f"the {type(drafter).__name__} keeps per-sequence or cross-request state"
    return None


def speculative_generate_batch(
    lm: TargetLike,
    prompts: Sequence[Sequence[int]],
    *,
    drafter: Drafter | None,
    k: int,
    max_new_tokens: Sequence[int],
    temperature: float,
    top_k: int,
    top_p: float,
    generators: Sequence[torch.Generator],
    verifiers: Sequence[Verifier],
    eos_token_ids: Sequence[int] | None = None,
    adaptive_k: bool = True,
    on_round: Callable[[int, list[int], torch.Tensor], None] | None = None,
) -> list[GenerationResult]:
    """Speculative decoding of B requests in lock step (module docstring); row b is the sequential
    ``speculative_generate(lm, prompts[b], drafter=drafter, k=k, max_new_tokens=max_new_tokens[b],
    generator=generators[b], verifier=verifiers[b], ...)``.

    Args:
        lm: ``LoadedModel`` or a transformers causal LM (target p).
        prompts: [B] prompt token id lists, each of at least 2 tokens (the batched prefill feeds all but
            the last, left-padded).
        drafter: a stateless drafter shared by every row (:func:`batchable`), or None (plain decoding).
        k: maximum drafts per round (>= 0).
        max_new_tokens: [B] token caps (>= 1 each).
        temperature, top_k, top_p: sampling parameters shared by the rows (temperature 0 = greedy).
        generators: [B] one source of random draws per row.
        verifiers: [B] one acceptance rule per row (``reference.verify.Verifier``).
        eos_token_ids: ids that stop a row; default the model's eos.
        adaptive_k: per-row draft-length policy, as in the sequential loop.
        on_round: ``on_round(b, ids, logits)`` with the tokens row b emitted in a round (EOS excluded,
            never empty) and the target's raw logits that produced them, ``[len(ids), V]`` (row j
            predicted ``ids[j]``).

    Returns:
        [B] GenerationResult in the order of ``prompts`` (``elapsed_s`` is the whole batch's).

    Raises:
        ValueError: mismatched lengths, a prompt shorter than 2 tokens, or a configuration that
            :func:`batchable` rejects (and the sequential loop's own checks).
        RuntimeError: a verifier returned an accepted count outside ``0..nd``.
    """
    B = len(prompts)
    if not (len(max_new_tokens) == len(generators) == len(verifiers) == B):
        raise ValueError(f"give one max_new_tokens, generator and verifier per prompt ({B} prompts, "
                         f"{len(max_new_tokens)}, {len(generators)}, {len(verifiers)})")
    why = batchable(lm, drafter)
    if why is not None:
        raise ValueError(f"cannot batch: {why}; use reference.speculative.speculative_generate")
    if any(len(p) < 2 for p in prompts):
        raise ValueError("every prompt needs at least 2 tokens for the batched prefill")
    if B == 0:
        return []
    model, tok = unwrap(lm)
    cur: dict[str, torch.Tensor] = {}

    def hook(b: int) -> Callable[[list[int]], None] | None:
        if on_round is None:
            return None
        return lambda ids: on_round(b, ids, cur["logits"][: len(ids)])

    made = [
        _new_run(lm, prompts[b], drafter=drafter, k=k, max_new_tokens=int(max_new_tokens[b]), temperature=temperature,
                 top_k=top_k, top_p=top_p, seed=None, generator=generators[b], eos_token_ids=eos_token_ids,
                 verifier=verifiers[b], return_logprobs=False, on_round=hook(b), adaptive_k=adaptive_k, policy=None,
                 tokenizer=None)
        for b in range(B)
    ]
    runs = [m[0] for m in made]
    device = runs[0].device
    t_start = time.perf_counter()
    with torch.inference_mode():
        from transformers import DynamicCache

        lp = max(len(p) - 1 for p in prompts)
        ids = torch.zeros((B, lp), dtype=torch.long)
        mask = torch.zeros((B, lp), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, lp - len(p) + 1 :] = torch.tensor([int(t) for t in p[:-1]])
            mask[b, lp - len(p) + 1 :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device), cache=cache,
              use_cache=True, logits_to_keep=1)
        next_pos = [len(p) - 1 for p in prompts]  # the pending token's position, per row
        pending = [int(p[-1]) for p in prompts]
        active = list(range(B))  # rows in cache order
        while active:
            props = [_propose(runs[b], drafter) for b in active]
            nds = [int(d.numel()) for d, _ in props]
            w = 1 + max(nds)
            feed = torch.zeros((len(active), w), dtype=torch.long)
            new = torch.zeros((len(active), w), dtype=torch.long)
            for i, b in enumerate(active):
                feed[i, 0] = pending[b]
                feed[i, 1 : 1 + nds[i]] = props[i][0]
                new[i, : 1 + nds[i]] = 1
            step_pos = torch.tensor(next_pos)[active][:, None] + torch.arange(w)[None, :]
            mask = torch.cat([mask, new], 1)
            logits = model(input_ids=feed.to(device), attention_mask=mask.to(device), position_ids=step_pos.to(device),
                           cache=cache, use_cache=True).logits  # [A, w, V]
            keep: list[int] = []
            for i, b in enumerate(active):
                run, nd = runs[b], nds[i]
                drafts, q = props[i]
                lg = logits[i, : nd + 1]
                res = run.verifier.verify(_target_probs(run, lg), q, drafts, run.generator, run.params.greedy)
                n_acc = int(res.n_accepted)
                if not 0 <= n_acc <= nd:
                    raise RuntimeError(f"verifier returned n_accepted={n_acc} outside 0..{nd}")
                mask[i, mask.shape[1] - w + 1 + n_acc :] = 0  # rejected drafts and padding: never attended again
                _record_round(run, nd, n_acc)
                next_pos[b] += 1 + n_acc
                pending[b] = int(res.next_token)
                cur["logits"] = lg
                if not _emit(run, drafts[:n_acc].tolist() + [pending[b]], lg):
                    keep.append(i)
            if len(keep) < len(active):
                if keep:
                    cache.batch_select_indices(torch.tensor(keep, device=device))
                mask = mask[keep]
                active = [active[i] for i in keep]
    elapsed = time.perf_counter() - t_start
    return [_finish(run, elapsed, tok, m[2]) for run, m in zip(runs, made, strict=True)]
