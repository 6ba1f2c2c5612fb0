"""Teacher-forced scoring: the target's log-probabilities at every position of given continuations.

``score_continuations`` runs ONE forward pass per batch over left-padded ``prompt + continuation``
sequences (attention mask + position ids from the mask) and returns per continuation position: the
chosen token's logprob, the top-k (ids, logprobs), the probability mass outside the top-k and
optionally the full ``[T, V]`` log-softmax.

Memory bound (see :func:`plan_batches` and :func:`score_continuations`): a batch holds at most
``token_budget`` padded tokens, and the vocabulary projection is applied to the final hidden
states of the continuation positions only, ``logit_rows`` rows at a time, so no ``[batch, T, V]``
float32 tensor exists: per chunk ``[logit_rows, V]`` logits are reduced to the chosen logprob,
the top-k and the log-sum-exp and then dropped. Architectures whose logits are not simply
``lm_head(hidden)`` (+ Gemma's final soft-capping) fall back to the model's own logits for the
continuation positions (``logits_to_keep``), still reduced in chunks of ``logit_rows``. All values are raw (temperature 1,
no top-k/top-p) natural-log probabilities (nats), like vLLM's default ``--logprobs-mode raw_logprobs``.

``encode_prompt`` tokenizes a prompt the way an OpenAI-compatible server (vLLM) does: chat
messages are rendered with the model's chat template and ``add_generation_prompt=True`` and then
tokenized without adding special tokens; completion prompts are tokenized with the tokenizer's
default special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reference.models import unwrap

#: Default padded tokens per forward pass (prompt + continuation, all sequences of a batch).
DEFAULT_TOKEN_BUDGET = 4096
#: Default bytes for one chunk of float32 logits ``[logit_rows, V]`` (sets ``logit_rows``).
DEFAULT_LOGIT_BYTES = 256 << 20
#: ``config.model_type`` values whose causal-LM head is ``lm_head(final hidden)`` with optional
#: ``final_logit_softcapping`` (checked against the model's own logits in tests/reference).
HIDDEN_HEAD_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi3", "olmo2", "deepseek_v3", "smollm3", "starcoder2",
})


def check_score_args(prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], top_k: int,
                     vocab_size: int | None) -> list[tuple[list[int], list[int]]]:
    """Validate scoring inputs shared by every backend; return them as lists of ints.

    Raises:
        ValueError: length mismatch, an empty prompt, ids outside ``0..vocab_size-1``, bad top_k.
    """
    if len(prompts) != len(continuations):
        raise ValueError(f"prompts ({len(prompts)}) and continuations ({len(continuations)}) differ in length")
    if top_k < 0 or (vocab_size is not None and top_k > vocab_size):
        raise ValueError(f"top_k={top_k} must be in 0..{vocab_size if vocab_size is not None else 'V'}")
    out = []
    for i, (pr, co) in enumerate(zip(prompts, continuations, strict=True)):
        pr = [int(t) for t in pr]
        co = [int(t) for t in co]
        if not pr:
            raise ValueError(f"prompts[{i}] is empty; scoring needs at least one prompt token")
        if vocab_size is not None:
            bad = [t for t in pr + co if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"item {i}: token ids {bad[:5]} are outside the vocabulary 0..{vocab_size - 1}")
        out.append((pr, co))
    return out


@dataclass
class ScoredContinuation:
    """Teacher-forced scores of one continuation.

    Attributes:
        token_ids: ``[T]`` continuation ids.
        logprobs: ``[T]`` float64, log p(token_t | prompt, token_<t) in nats.
        top_ids: ``[T, K]`` int64, the K most likely ids at each position (descending).
        top_logprobs: ``[T, K]`` float64 logprobs of ``top_ids``.
        full_logprobs: ``[T, V]`` float32 log-softmax rows when ``full=True``, else None.
        tail_mass: ``[T]`` float64, 1 - sum of the top-k probabilities (mass outside the top-k),
            or None when the source did not report it.
    """

    token_ids: list[int]
    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    full_logprobs: np.ndarray | None = None
    tail_mass: np.ndarray | None = None

    def to_dict(self, tokenizer: Any = None) -> dict[str, Any]:
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


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, Any]], chat: bool) -> list[int]:
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


def plan_batches(lengths: Sequence[int], token_budget: int, max_batch: int) -> list[list[int]]:
    """Group items into batches of at most ``token_budget`` padded tokens (``rows * longest``).

    Items are taken in order of increasing length (padding stays small); an item longer than the
    budget forms a batch of its own (its forward cannot be split without changing the result).

    Args:
        lengths: per item, prompt + continuation length in tokens.
        token_budget: padded tokens per forward (>= 1). max_batch: sequences per forward (>= 1).

    Returns:
        Lists of item indices; every index appears exactly once.

    Raises:
        ValueError: token_budget or max_batch < 1.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget={token_budget} must be >= 1 (padded tokens per forward pass)")
    if max_batch < 1:
        raise ValueError(f"batch_size={max_batch} must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[i]  # increasing order: the newcomer is the longest
        if cur and ((len(cur) + 1) * longest > token_budget or len(cur) >= max_batch):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def logit_rows_for(vocab_size: int, logit_bytes: int = DEFAULT_LOGIT_BYTES) -> int:
    """Rows of float32 logits ``[rows, V]`` that fit in ``logit_bytes`` (at least 1)."""
    return max(1, int(logit_bytes) // (4 * max(1, int(vocab_size))))


def input_device(model: Any) -> torch.device:
    """Device that takes ``input_ids``: the input embedding's (also right under ``device_map``)."""
    try:
        dev: torch.device = model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        dev = next(model.parameters()).device
    return dev


def _uses_hidden_head(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in HIDDEN_HEAD_MODEL_TYPES:
        return False
    for attr in ("logit_scale", "logits_scaling"):
        if getattr(cfg, attr, None) not in (None, 1, 1.0):
            return False
    try:
        return model.get_decoder() is not None and model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def _reduce_rows(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int, full: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``[n, V]`` logits (any float dtype) → chosen ``[n]``, top ids/logprobs ``[n, k]``, tail ``[n]``.

    Computed in float32 (float64 when the logits are float64), values in nats.
    """
    x = logits.double() if logits.dtype == torch.float64 else logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [n, 1]
    chosen = (x.gather(1, targets.unsqueeze(1)) - lse).squeeze(1)
    if top_k > 0:
        tv, ti = torch.topk(x, top_k, dim=-1)
        tv = tv - lse
        tail = (1.0 - tv.double().exp().sum(-1)).clamp(min=0.0)
    else:
        ti = torch.zeros((x.shape[0], 0), dtype=torch.long, device=x.device)
        tv = torch.zeros((x.shape[0], 0), dtype=x.dtype, device=x.device)
        tail = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
    fl = (x - lse) if full else None
    return chosen, ti, tv, tail, fl


def _to_sink(row_sink: Callable[[int, int, torch.Tensor], None], rows: torch.Tensor,
             owner: Sequence[tuple[int, int]], s: int) -> None:
    """Pass ``rows`` (flat rows ``s .. s + n - 1`` of a batch) to ``row_sink`` one item segment at a time."""
    j = 0
    while j < rows.shape[0]:
        item, first = owner[s + j]
        e = j
        while e < rows.shape[0] and owner[s + e][0] == item:
            e += 1
        row_sink(item, s + j - first, rows[j:e])
        j = e


def score_continuations(
    lm: Any,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    top_k: int = 20,
    full: bool = False,
    batch_size: int = 64,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    logit_rows: int | None = None,
    row_sink: Callable[[int, int, torch.Tensor], None] | None = None,
) -> list[ScoredContinuation]:
    """Teacher-force each continuation after its prompt and return the target's logprobs.

    One forward pass per batch (left padding, attention mask, position ids from the mask;
    :func:`plan_batches` groups items by length under ``token_budget``), never one per token.
    The vocabulary projection runs on the continuation positions only, ``logit_rows`` rows at a
    time (:data:`HIDDEN_HEAD_MODEL_TYPES`; other architectures use the model's logits for the
    kept positions), so peak extra memory is about ``token_budget`` activations plus
    ``2 * logit_rows * V * 4`` bytes (logits and their log-sum-exp work array; + ``T * V * 4`` per
    item when ``full`` keeps the rows, nothing more when a ``row_sink`` takes them). The same code runs on
    CPU, one GPU (``cuda:N``) and a ``device_map="auto"`` model spread over several GPUs: inputs
    go to the input embedding's device, results come back to host memory.

    Args:
        lm: ``LoadedModel`` or a transformers causal LM.
        prompts: per item, the prompt ids (non-empty).
        continuations: per item, the continuation ids (may be empty).
        top_k: number of top alternatives per position (0..V).
        full: also return the full ``[T, V]`` float32 log-softmax (memory grows with T * V).
        row_sink: instead of returning them (``full_logprobs`` stays None), pass the full rows to
            ``row_sink(item, t0, rows)`` as they are computed: ``rows`` is ``[n, V]`` float32 CPU
            log-softmax of item ``item``'s positions ``t0 .. t0 + n - 1`` (at most ``logit_rows``
            rows, valid during the call only). Every position of every item is passed exactly once,
            batch by batch (:func:`plan_batches` order), positions of an item in increasing order.
        batch_size: at most this many sequences per forward (>= 1).
        token_budget: at most this many padded tokens per forward (>= 1); a longer single item
            is scored alone.
        logit_rows: rows of logits reduced at once (default: :func:`logit_rows_for` V).

    Returns:
        list of ScoredContinuation, in input order, with ``tail_mass`` filled.

    Raises:
        ValueError: length mismatch, an empty prompt, ids outside the vocabulary, bad
            top_k/batch_size/token_budget/logit_rows.
    """
    model, _ = unwrap(lm)
    V = int(model.config.vocab_size)
    items = check_score_args(prompts, continuations, top_k, V)
    rows_per_chunk = logit_rows_for(V) if logit_rows is None else int(logit_rows)
    if rows_per_chunk < 1:
        raise ValueError(f"logit_rows={logit_rows} must be >= 1")
    keep_full = full and row_sink is None
    results: list[ScoredContinuation | None] = [None] * len(items)
    todo = []
    for i, (_, co) in enumerate(items):
        if not co:
            results[i] = ScoredContinuation(
                [], np.zeros(0), np.zeros((0, top_k), dtype=np.int64), np.zeros((0, top_k), dtype=np.float64),
                np.zeros((0, V), dtype=np.float32) if keep_full else None, np.zeros(0),
            )
        else:
            todo.append(i)
    batches = plan_batches([len(items[i][0]) + len(items[i][1]) for i in todo], token_budget, batch_size)
    dev = input_device(model)
    hidden_path = _uses_hidden_head(model)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    pad_id = 0
    with torch.inference_mode():
        for bidx in batches:
            batch = [(todo[j], *items[todo[j]]) for j in bidx]
            L = max(len(pr) + len(co) for _, pr, co in batch)
            T_max = max(len(co) for _, _, co in batch)
            ids = torch.full((len(batch), L), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), L), dtype=torch.long)
            sel_r: list[int] = []
            sel_c: list[int] = []
            targets: list[int] = []
            owner: list[tuple[int, int]] = []  # per flat row: (item, start row of that item)
            for r, (i_item, pr, co) in enumerate(batch):
                owner.extend([(i_item, len(targets))] * len(co))
                seq = [*pr, *co]
                ids[r, L - len(seq):] = torch.tensor(seq)
                mask[r, L - len(seq):] = 1
                # column j of the kept window (absolute position L-T_max-1+j) predicts position j+1
                sel_r.extend([r] * len(co))
                sel_c.extend(range(T_max - len(co), T_max))
                targets.extend(co)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            kwargs = dict(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
            if hidden_path:
                h = model.get_decoder()(**kwargs).last_hidden_state[:, L - T_max - 1: L - 1]  # [B, T_max, H]
                head = model.get_output_embeddings()
            else:
                h = model(**kwargs, logits_to_keep=T_max + 1).logits[:, :-1]  # [B, T_max, V] (model dtype)
                head = None
            rr = torch.tensor(sel_r, device=h.device)
            cc = torch.tensor(sel_c, device=h.device)
            flat = h[rr, cc]  # [N, H] or [N, V]
            del h
            tgt_all = torch.tensor(targets, dtype=torch.long)
            parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
            for s in range(0, flat.shape[0], rows_per_chunk):
                x = flat[s: s + rows_per_chunk]
                if head is not None:
                    x = head(x)
                    if softcap:
                        x = torch.tanh(x / softcap) * softcap
                ch, ti, tv, tail, fl = _reduce_rows(x, tgt_all[s: s + rows_per_chunk].to(x.device), top_k,
                                                    full or row_sink is not None)
                if row_sink is not None and fl is not None:
                    _to_sink(row_sink, fl.float().cpu(), owner, s)
                    fl = None
                parts.append((ch.double().cpu(), ti.cpu(), tv.double().cpu(), tail.double().cpu(),
                              fl.float().cpu() if fl is not None else None))
                del x, fl
            chosen = torch.cat([p[0] for p in parts]).numpy()
            top_i = torch.cat([p[1] for p in parts]).numpy().astype(np.int64)
            top_v = torch.cat([p[2] for p in parts]).numpy()
            tails = torch.cat([p[3] for p in parts]).numpy()
            fulls = torch.cat([p[4] for p in parts if p[4] is not None]).numpy() if keep_full else None  # all set then
            off = 0
            for i, _, co in batch:
                T = len(co)
                results[i] = ScoredContinuation(
                    token_ids=list(co),
                    logprobs=chosen[off: off + T],
                    top_ids=top_i[off: off + T],
                    top_logprobs=top_v[off: off + T],
                    full_logprobs=fulls[off: off + T] if fulls is not None else None,
                    tail_mass=tails[off: off + T],
                )
                off += T
    return results  # type: ignore[return-value]
