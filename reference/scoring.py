"""Teacher-forced scoring: the target's log-probabilities at every position of given continuations.

``score_continuations`` runs ONE forward pass per batch over left-padded ``prompt + continuation``
sequences (attention mask + position ids from the mask), keeping only the trailing logits that
predict continuation tokens, and returns per position: the chosen token's logprob, the top-k
(ids, logprobs) and optionally the full ``[T, V]`` log-softmax. All values are raw (temperature 1,
no top-k/top-p) natural-log probabilities (nats), like vLLM's default ``--logprobs-mode raw_logprobs``.

``encode_prompt`` tokenizes a prompt the way an OpenAI-compatible server (vLLM) does: chat
messages are rendered with the model's chat template and ``add_generation_prompt=True`` and then
tokenized without adding special tokens; completion prompts are tokenized with the tokenizer's
default special tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reference.models import unwrap


@dataclass
class ScoredContinuation:
    """Teacher-forced scores of one continuation.

    Attributes:
        token_ids: ``[T]`` continuation ids.
        logprobs: ``[T]`` float64, log p(token_t | prompt, token_<t) in nats.
        top_ids: ``[T, K]`` int64, the K most likely ids at each position (descending).
        top_logprobs: ``[T, K]`` float64 logprobs of ``top_ids``.
        full_logprobs: ``[T, V]`` float32 log-softmax rows when ``full=True``, else None.
    """

    token_ids: list[int]
    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    full_logprobs: np.ndarray | None = None

    def to_dict(self, tokenizer: Any = None) -> dict:
        """JSON-friendly per-position records: token_id, (token), logprob, top_logprobs."""
        rows = []
        for t, tid in enumerate(self.token_ids):
            row: dict[str, Any] = {"position": t, "token_id": int(tid), "logprob": float(self.logprobs[t])}
            if tokenizer is not None:
                row["token"] = tokenizer.convert_ids_to_tokens(int(tid))
            tops = []
            for j in range(self.top_ids.shape[1]):
                e: dict[str, Any] = {"token_id": int(self.top_ids[t, j]), "logprob": float(self.top_logprobs[t, j])}
                if tokenizer is not None:
                    e["token"] = tokenizer.convert_ids_to_tokens(int(self.top_ids[t, j]))
                tops.append(e)
            row["top_logprobs"] = tops
            rows.append(row)
        return {"token_ids": [int(x) for x in self.token_ids], "positions": rows}


def encode_prompt(tokenizer: Any, prompt: str | list[dict], chat: bool) -> list[int]:
    """Token ids of a prompt as an OpenAI-compatible server would build them (vLLM).

    Args:
        tokenizer: a transformers tokenizer (with a chat template when ``chat``).
        prompt: text, or a list of ``{"role", "content"}`` messages (implies chat).
        chat: apply the chat template with ``add_generation_prompt=True`` (chat completions);
            False = completions endpoint (plain tokenization with default special tokens).

    Returns:
        list[int] prompt ids.

    Raises:
        ValueError: chat requested but the tokenizer has no chat template; malformed messages.
    """
    if isinstance(prompt, list) or chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template; drop --chat or use a chat model")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def score_continuations(
    lm: Any,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    top_k: int = 20,
    full: bool = False,
    batch_size: int = 8,
) -> list[ScoredContinuation]:
    """Teacher-force each continuation after its prompt and return the target's logprobs.

    One forward pass per batch of ``batch_size`` sequences (left padding, attention mask, position
    ids from the mask; sequences sorted by length to limit padding), never one per token.

    Args:
        lm: ``LoadedModel`` or a transformers causal LM.
        prompts: per item, the prompt ids (non-empty).
        continuations: per item, the continuation ids (may be empty).
        top_k: number of top alternatives per position (0..V).
        full: also return the full ``[T, V]`` float32 log-softmax.
        batch_size: sequences per forward (>= 1).

    Returns:
        list of ScoredContinuation, in input order.

    Raises:
        ValueError: length mismatch, an empty prompt, ids outside the vocabulary, bad top_k/batch_size.
    """
    model, _ = unwrap(lm)
    if len(prompts) != len(continuations):
        raise ValueError(f"prompts ({len(prompts)}) and continuations ({len(continuations)}) differ in length")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    V = int(model.config.vocab_size)
    if not 0 <= top_k <= V:
        raise ValueError(f"top_k={top_k} must be in 0..{V}")
    device = next(model.parameters()).device
    items = []
    for i, (pr, co) in enumerate(zip(prompts, continuations)):
        pr = [int(t) for t in pr]
        co = [int(t) for t in co]
        if not pr:
            raise ValueError(f"prompts[{i}] is empty; scoring needs at least one prompt token")
        bad = [t for t in pr + co if not 0 <= t < V]
        if bad:
            raise ValueError(f"item {i}: token ids {bad[:5]} are outside the vocabulary 0..{V - 1}")
        items.append((i, pr, co))
    results: list[ScoredContinuation | None] = [None] * len(items)
    empty_top = (np.zeros((0, top_k), dtype=np.int64), np.zeros((0, top_k), dtype=np.float64))
    todo = []
    for i, pr, co in items:
        if not co:
            results[i] = ScoredContinuation(
                [], np.zeros(0), *empty_top, np.zeros((0, V), dtype=np.float32) if full else None
            )
        else:
            todo.append((i, pr, co))
    todo.sort(key=lambda it: len(it[1]) + len(it[2]))
    pad_id = 0
    with torch.inference_mode():
        for b in range(0, len(todo), batch_size):
            batch = todo[b : b + batch_size]
            L = max(len(pr) + len(co) for _, pr, co in batch)
            T_max = max(len(co) for _, _, co in batch)
            ids = torch.full((len(batch), L), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), L), dtype=torch.long)
            for r, (_, pr, co) in enumerate(batch):
                seq = pr + co
                ids[r, L - len(seq) :] = torch.tensor(seq)
                mask[r, L - len(seq) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                position_ids=pos.to(device),
                use_cache=False,
                logits_to_keep=T_max + 1,
            )
            # logits[:, j] is at absolute position L-T_max-1+j; the last one predicts beyond the sequence
            logits = out.logits[:, :-1]  # [B, T_max, V]
            logits = logits.double() if logits.dtype == torch.float64 else logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for r, (i, _, co) in enumerate(batch):
                T = len(co)
                rows = logp[r, T_max - T :]  # [T, V]
                tgt = torch.tensor(co, device=rows.device).unsqueeze(1)
                chosen = rows.gather(1, tgt).squeeze(1)
                if top_k > 0:
                    tv, ti = torch.topk(rows, top_k, dim=-1)
                    top_ids, top_lp = ti.cpu().numpy().astype(np.int64), tv.double().cpu().numpy()
                else:
                    top_ids, top_lp = np.zeros((T, 0), dtype=np.int64), np.zeros((T, 0))
                results[i] = ScoredContinuation(
                    token_ids=list(co),
                    logprobs=chosen.double().cpu().numpy(),
                    top_ids=top_ids,
                    top_logprobs=top_lp,
                    full_logprobs=rows.cpu().numpy().astype(np.float32) if full else None,
                )
    return results  # type: ignore[return-value]
