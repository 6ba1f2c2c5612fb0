"""Batched plain decoding and shared-prompt teacher forcing for pool collection (torch, CPU).

:func:`decode_rows` decodes a batch of prompts from a served model with per-position records
(emitted token, its logprob, top-N alternatives), optionally under a lossy verifier's
draft-independent per-position rule; :func:`score_prompt_groups` teacher-forces the reference on
many continuations of the same prompts, each prompt's prefill computed once. torch and
transformers are imported inside the functions (the package imports without them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from auditor.calibration.pool import PROVIDER_TOP_N, REF_TOP_K, short_sha

if TYPE_CHECKING:
    import torch

    from reference.models import LoadedModel
    from simulator.engine import ChoiceResult

__all__ = ["choice_row", "decode_rows", "score_groups", "score_prompt_groups"]


def _inner(model: LoadedModel | torch.nn.Module) -> torch.nn.Module:
    """The causal LM inside a ``LoadedModel`` (or ``model`` itself)."""
    from reference.models import unwrap

    m, _ = unwrap(model)
    return m


def _top(logp: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[B, V] log-probs → (ids [B, k] int64, lps [B, k] float64) descending (numpy)."""
    import torch

    tv, ti = torch.topk(logp, k, dim=-1)
    return ti.cpu().numpy().astype(np.int64), tv.double().cpu().numpy()


def choice_row(ch: ChoiceResult) -> dict:
    """One choice of the simulator engine as a pool row (the shape :func:`decode_rows` returns per row):
    ``token_ids`` [T] int64, ``logprob`` [T] float64 (NaN where none), ``top_ids`` [T, 20] int64 (-1 padding),
    ``top_lp`` [T, 20] float64 (-inf padding), the served model's raw logprobs (nats)."""
    toks = list(ch.tokens)
    T = len(toks)
    top_ids = np.full((T, PROVIDER_TOP_N), -1, np.int64)
    top_lp = np.full((T, PROVIDER_TOP_N), -np.inf)
    for j, t in enumerate(toks):
        k = len(t.top_ids)
        top_ids[j, :k] = t.top_ids
        top_lp[j, :k] = t.top_logprobs
    return {
        "token_ids": np.asarray([t.token_id for t in toks], np.int64),
        "logprob": np.asarray([np.nan if t.logprob is None else t.logprob for t in toks], np.float64),
        "top_ids": top_ids,
        "top_lp": top_lp,
    }


def decode_rows(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    eos_ids: Sequence[int],
    seeds: Sequence[int],
    top_n: int = PROVIDER_TOP_N,
    expand: int = 1,
    rule: str | None = None,
    flip_rate: float = 0.0,
) -> list[dict]:
    """Plain autoregressive decoding of a batch (left padding, KV cache) with per-position records.

    Args:
        model: the served model (``ServedModel`` or a causal LM).
        prompts: [B] prompt id lists; with ``expand > 1`` every prompt is decoded ``expand`` times
            (its prefill is computed once and the cache repeated); rows are prompt-major.
        max_new_tokens: tokens per row at most (EOS ends a row early; EOS is not emitted, as the
            simulator's responses exclude it).
        temperature, top_p, top_k: sampling (``reference.sampling.logits_to_probs``; 0 = greedy).
        eos_ids: end-of-sequence ids.
        seeds: the decoded rows' seeds; the batch's draws come from one generator seeded by their hash.
        top_n: alternatives recorded per position.
        expand: rows per prompt (see ``prompts``).
        rule: None (plain decoding), ``argmax`` (emit the argmax whatever the temperature: the
            output law of ``greedy-verify``'s verifier), or ``flip2nd`` (at T=0 emit the 2nd-ranked
            token with probability ``flip_rate`` per position, independently: the output law of
            ``decode-noncompliant``'s verifier, simulator/verifiers.py).
        flip_rate: see ``rule``.

    Returns:
        One dict per row: ``token_ids`` [T] int64, ``logprob`` [T] float64 (raw log-softmax of the
        served model, nats), ``top_ids`` [T, top_n] int64, ``top_lp`` [T, top_n] float64.
    """
    import torch
    from transformers import DynamicCache

    from reference.sampling import logits_to_probs, sample_rows

    if expand < 1:
        raise ValueError(f"expand={expand} must be >= 1")
    B0 = len(prompts)
    B = B0 * expand
    L = max(len(p) for p in prompts)
    ids = torch.zeros((B0, L), dtype=torch.long)
    mask = torch.zeros((B0, L), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, L - len(p) :] = torch.tensor(list(p))
        mask[r, L - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    gen = torch.Generator().manual_seed(int(short_sha(list(seeds), 15), 16))
    eos = torch.tensor(sorted({int(e) for e in eos_ids}) or [-1])
    recs: list[dict[str, list]] = [{"token_ids": [], "logprob": [], "top_ids": [], "top_lp": []} for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool)
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else cache
        logits = out.logits[:, -1].float()
        if expand > 1:
            cache.batch_repeat_interleave(expand)
            mask = mask.repeat_interleave(expand, 0)
            pos = pos.repeat_interleave(expand, 0)
            logits = logits.repeat_interleave(expand, 0)
        last_pos = pos[:, -1]
        for _t in range(max_new_tokens):
            logp = torch.log_softmax(logits, dim=-1)
            if temperature == 0 or rule == "argmax":
                nxt = logits.argmax(-1)
                if rule == "flip2nd":
                    second = torch.topk(logits, 2, dim=-1).indices[:, 1]
                    coin = torch.rand(nxt.shape[0], dtype=torch.float64, generator=gen) < flip_rate
                    nxt = torch.where(coin, second, nxt)
            else:
                probs = logits_to_probs(logits, temperature, top_k, top_p, dtype=torch.float64)
                nxt = sample_rows(probs, gen)
            is_eos = torch.isin(nxt, eos)
            tid, tlp = _top(logp, top_n)
            chosen = logp.gather(1, nxt.unsqueeze(1)).squeeze(1).double().numpy()
            nxt_np = nxt.numpy()
            for r in range(B):
                if done[r] or is_eos[r]:
                    continue
                rec = recs[r]
                rec["token_ids"].append(int(nxt_np[r]))
                rec["logprob"].append(float(chosen[r]))
                rec["top_ids"].append(tid[r])
                rec["top_lp"].append(tlp[r])
            done |= is_eos
            if bool(done.all()) or _t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], 1)
            last_pos = last_pos + 1
            out = model(
                input_ids=nxt.unsqueeze(1),
                attention_mask=mask,
                position_ids=last_pos.unsqueeze(1),
                cache=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1].float()
    res = []
    for rec in recs:
        T = len(rec["token_ids"])
        res.append(
            {
                "token_ids": np.asarray(rec["token_ids"], np.int64),
                "logprob": np.asarray(rec["logprob"], np.float64),
                "top_ids": np.asarray(rec["top_ids"], np.int64).reshape(T, top_n),
                "top_lp": np.asarray(rec["top_lp"], np.float64).reshape(T, top_n),
            }
        )
    return res


def score_groups(
    lm: LoadedModel | torch.nn.Module,
    prompt_ids: Sequence[int],
    continuations: Sequence[Sequence[int]],
    *,
    top_k: int = REF_TOP_K,
    max_rows_tokens: int = 1024,
) -> list[dict]:
    """Teacher-force several continuations of ONE prompt (its prefill computed once).

    See :func:`score_prompt_groups` (this is the one-group case).
    """
    return score_prompt_groups(lm, [(prompt_ids, continuations)], top_k=top_k, max_rows_tokens=max_rows_tokens)[0]


def score_prompt_groups(
    lm: LoadedModel | torch.nn.Module,
    groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    *,
    top_k: int = REF_TOP_K,
    max_rows_tokens: int = 1024,
    max_prompts: int = 16,
) -> list[list[dict]]:
    """Teacher-force continuations grouped by prompt, batched, each prompt's prefill computed once.

    Same values as ``reference.scoring.score_continuations`` (raw log-softmax, nats) at a fraction
    of the cost when many samples share a prompt: the prompts of a chunk are prefilled together
    (left padding, KV cache), the cache rows are repeated for each continuation
    (``DynamicCache.batch_select_indices``), then one forward runs over the right-padded
    continuations (position ids continue each prompt).

    Args:
        lm: reference ``LoadedModel`` or causal LM.
        groups: [(prompt ids (non-empty), [continuation ids, ...]), ...].
        top_k: alternatives per position.
        max_rows_tokens: continuation rows × length per forward at most (bounds the
            [rows, T, V] float32 logits: 1024 × 49152 × 4 B ≈ 200 MB).
        max_prompts: prompts per chunk at most.

    Returns:
        Per group, per continuation: ``top_ids`` [T, top_k] int64, ``top_lp`` [T, top_k] float64,
        ``token_lp`` [T] float64 (reference log p of each continuation token).

    Raises:
        ValueError: an empty prompt.
    """
    import torch
    from transformers import DynamicCache

    model = _inner(lm)
    out: list[list[dict | None]] = [[None] * len(c) for _, c in groups]
    empty = {"top_ids": np.zeros((0, top_k), np.int64), "top_lp": np.zeros((0, top_k)), "token_lp": np.zeros(0)}
    for gi, (pr, conts) in enumerate(groups):
        if not len(pr):
            raise ValueError(f"score_prompt_groups: group {gi} has an empty prompt")
        for ci, c in enumerate(conts):
            if len(c) == 0:
                out[gi][ci] = dict(empty)
    # chunks of groups bounded by rows × length
    chunks: list[list[int]] = []
    cur: list[int] = []
    rows = t_max = 0
    for gi, (_, conts) in enumerate(groups):
        live = [c for c in conts if len(c)]
        if not live:
            continue
        r2, t2 = rows + len(live), max(t_max, max(len(c) for c in live))
        if cur and (r2 * t2 > max_rows_tokens or len(cur) >= max_prompts):
            chunks.append(cur)
            cur, rows, t_max = [], 0, 0
            r2, t2 = len(live), max(len(c) for c in live)
        cur.append(gi)
        rows, t_max = r2, t2
    if cur:
        chunks.append(cur)
    with torch.inference_mode():
        for chunk in chunks:
            prompts = [list(groups[g][0]) for g in chunk]
            B0, P = len(prompts), max(len(p) for p in prompts)
            ids = torch.zeros((B0, P), dtype=torch.long)
            mask = torch.zeros((B0, P), dtype=torch.long)
            for r, p in enumerate(prompts):
                ids[r, P - len(p) :] = torch.tensor(p)
                mask[r, P - len(p) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache()
            pre = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                        logits_to_keep=1)
            cache = pre.past_key_values if getattr(pre, "past_key_values", None) is not None else cache
            first = torch.log_softmax(pre.logits[:, -1].float(), -1)  # [B0, V] predicts token 0
            src: list[tuple[int, int, int]] = []  # (row in chunk, group, continuation index)
            for r, g in enumerate(chunk):
                for ci, c in enumerate(groups[g][1]):
                    if len(c):
                        src.append((r, g, ci))
            R = len(src)
            T = max(len(groups[g][1][ci]) for _, g, ci in src)
            cache.batch_select_indices(torch.tensor([r for r, _, _ in src]))
            cids = torch.zeros((R, T), dtype=torch.long)
            cmask = torch.cat([mask[[r for r, _, _ in src]], torch.zeros((R, T), dtype=torch.long)], 1)
            plen = torch.tensor([len(prompts[r]) for r, _, _ in src])
            for k, (_, g, ci) in enumerate(src):
                c = list(groups[g][1][ci])
                cids[k, : len(c)] = torch.tensor(c)
                cmask[k, P : P + len(c)] = 1
            cpos = plen.unsqueeze(1) + torch.arange(T).unsqueeze(0)
            o = model(input_ids=cids, attention_mask=cmask, position_ids=cpos, cache=cache, use_cache=True)
            logp = torch.log_softmax(o.logits.float(), -1)  # [R, T, V]; [:, t] predicts token t+1
            for k, (r, g, ci) in enumerate(src):
                c = list(groups[g][1][ci])
                rows_lp = torch.cat([first[r].unsqueeze(0), logp[k, : len(c) - 1]], 0)  # [Tc, V]
                tid, tlp = _top(rows_lp, top_k)
                tok = rows_lp.gather(1, torch.tensor(c).unsqueeze(1)).squeeze(1).double().numpy()
                out[g][ci] = {"top_ids": tid, "top_lp": tlp, "token_lp": tok}
            del logp, o
    return out  # type: ignore[return-value]
