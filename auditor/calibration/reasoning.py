"""Reasoning-mode pools (issue 35 item 5): a ``think:PROFILE`` profile's requests decoded as the simulator serves them.

In reasoning mode (``simulator.reasoning.generate_reasoning``; ``auditor serve --reasoning``) the
template opens the assistant turn with ``<think>\\n`` (``simulator.reasoning.REASONING_OPENER``, put at the end of
the request's prompt ids, :func:`opener_ids`), the served model writes at most ``budget`` reasoning tokens (or
ends its turn earlier), the close tag ``</think>`` is forced, and the answer is generated after it with the rest
of ``max_tokens``. Every position of a reasoning pool carries its span label — ``reasoning``, ``close`` (the
forced tag's tokens) or ``answer`` — and, where the simulator's speculative engine served it, whether it is the
last token of its streamed chunk (one chunk per verification step, ``--stream-chunking round``, the default).

Two ways, as for plain pools (:mod:`auditor.calibration.collect`): :func:`decode_reasoning_rows` decodes a batch
of plain-decoding requests in two phases (reasoning up to the budget; then the answer after reasoning + close
tag, each row with its own prefix) — the output law of ``generate_reasoning`` under strict verification, whose
speculative rounds are lossless; :func:`engine_result` reads one ``generate_reasoning`` choice of the simulator
engine (the lossy verifiers whose law depends on the drafts: ``relaxed-think`` at T = 0, ``synthetic-acceptance``).

What a reasoning pool leaves out on purpose: the close tag's positions are never evidence (the audit excludes think
tags the same way: possibly forced, no sample, ``auditor.check.evidence.build_evidence``), so batched pools store
no provider logprobs there (NaN, -1); batched pools know no stream steps (``step_final`` NaN: the honest engine
streams speculative rounds whose chunk ends are not recorded); spans and steps only ever name a cause
(``auditor.verdict.verification_rules``), never reject, so neither changes a false-accusation rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from auditor.calibration.decoding import choice_row, decode_rows
from auditor.calibration.pool import PROVIDER_TOP_N, short_sha

if TYPE_CHECKING:
    from simulator.engine import ChoiceResult

__all__ = ["SPANS", "close_ids", "decode_reasoning_rows", "engine_result", "opener_ids", "step_finals"]

#: Span labels of a reasoning pool's positions (``Pool.token_span``).
SPANS = ("reasoning", "close", "answer")


def opener_ids(tokenizer: Any) -> tuple[int, ...]:
    """Token ids of the reasoning opener the simulator's template appends to the prompt (``REASONING_OPENER``)."""
    from simulator.reasoning import REASONING_OPENER  # torch

    return tuple(int(x) for x in tokenizer.encode(REASONING_OPENER, add_special_tokens=False))


def close_ids(tokenizer: Any) -> list[int]:
    """Token ids of the close tag ``generate_reasoning`` forces after the reasoning (``REASONING_CLOSE``)."""
    from simulator.reasoning import REASONING_CLOSE  # torch

    return [int(x) for x in tokenizer.encode(REASONING_CLOSE, add_special_tokens=False)]


def step_finals(chunks: Sequence[int], n_tokens: int) -> np.ndarray:
    """[n_tokens] float64: 1.0 at the last token of each streamed chunk, 0.0 inside one (``EvidenceBatch.step_final``);
    all NaN when the chunk sizes do not add up to ``n_tokens`` (as ``auditor.check.observations`` reads a stream)."""
    if sum(int(c) for c in chunks) != n_tokens:
        return np.full(n_tokens, np.nan)
    out = np.zeros(n_tokens)
    ends = np.cumsum([int(c) for c in chunks if int(c) > 0]) - 1
    out[ends] = 1.0
    return out


def _row(reason: dict, n_close: int, close: Sequence[int], answer: dict | None) -> dict:
    """One row of a reasoning pool: its reasoning row, ``n_close`` close-tag positions (no provider logprobs
    there) and its answer row (``decode_rows`` dicts; ``answer`` None: no answer)."""
    a = answer if answer is not None else {
        "token_ids": np.zeros(0, np.int64), "logprob": np.zeros(0), "top_ids": np.zeros((0, PROVIDER_TOP_N), np.int64),
        "top_lp": np.zeros((0, PROVIDER_TOP_N))}
    n_r, n_a = len(reason["token_ids"]), len(a["token_ids"])
    return {
        "token_ids": np.concatenate([reason["token_ids"], np.asarray(list(close)[:n_close], np.int64), a["token_ids"]]),
        "logprob": np.concatenate([reason["logprob"], np.full(n_close, np.nan), a["logprob"]]),
        "top_ids": np.concatenate([reason["top_ids"], np.full((n_close, PROVIDER_TOP_N), -1, np.int64), a["top_ids"]]),
        "top_lp": np.concatenate([reason["top_lp"], np.full((n_close, PROVIDER_TOP_N), -np.inf), a["top_lp"]]),
        "span": np.asarray(["reasoning"] * n_r + ["close"] * n_close + ["answer"] * n_a, dtype=str),
        "step_final": np.full(n_r + n_close + n_a, np.nan),
    }


def decode_reasoning_rows(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    budget: int,
    close: Sequence[int],
    max_tokens: Sequence[int],
    temperature: float,
    top_p: float,
    top_k: int,
    eos_ids: Sequence[int],
    seeds: Sequence[int],
    expand: int = 1,
    rule: str | None = None,
    flip_rate: float = 0.0,
) -> list[dict]:
    """Batched plain decoding in reasoning mode (see the module docstring): the reasoning, the close tag, the answer.

    Args:
        model: the served model (``decode_rows``).
        prompts: [B] prompt ids, each ending with the reasoning opener (:func:`opener_ids`).
        budget: reasoning tokens at most (>= 1).
        close: the close tag's ids (:func:`close_ids`).
        max_tokens: [B * expand] completion tokens per row in all (reasoning + close tag + answer).
        temperature, top_p, top_k, eos_ids, rule, flip_rate: as ``decode_rows``.
        seeds: [B * expand] row seeds; the answers' are derived from them.
        expand: rows per prompt (prompt-major), as ``decode_rows``.

    Returns:
        One dict per row: ``token_ids`` [T] int64, ``logprob`` [T] float64 (NaN on the close tag), ``top_ids``
        [T, 20] int64 (-1 there), ``top_lp`` [T, 20] float64 (-inf there), ``span`` [T] str (:data:`SPANS`),
        ``step_final`` [T] float64 (NaN: no stream steps in batched decoding).

    Raises:
        ValueError: budget < 1, or ``max_tokens`` / ``seeds`` not one per row.
    """
    rows = len(prompts) * expand
    if budget < 1 or len(max_tokens) != rows or len(seeds) != rows:
        raise ValueError(f"decode_reasoning_rows: budget={budget} must be >= 1 and max_tokens, seeds one per row ({rows})")
    kw: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "eos_ids": eos_ids, "rule": rule,
          "flip_rate": flip_rate}
    first = decode_rows(model, prompts, max_new_tokens=min(budget, max(max_tokens)), seeds=list(seeds), expand=expand,
                        **kw)
    reasoning = [{k: v[: min(budget, int(mt))] for k, v in o.items()} for o, mt in zip(first, max_tokens, strict=True)]
    room = [int(mt) - len(o["token_ids"]) - len(close) for o, mt in zip(reasoning, max_tokens, strict=True)]
    go = [i for i in range(rows) if room[i] >= 1]
    answers: dict[int, dict] = {}
    if go:
        prefixes = [[*prompts[i // expand], *reasoning[i]["token_ids"].tolist(), *close] for i in go]
        outs = decode_rows(model, prefixes, max_new_tokens=max(room[i] for i in go),
                           seeds=[int(short_sha([int(seeds[i]), "answer"], 15), 16) for i in go], **kw)
        answers = {i: {k: v[: room[i]] for k, v in o.items()} for i, o in zip(go, outs, strict=True)}
    # generate_reasoning: no room for an answer token -> the reasoning alone (no close tag)
    return [_row(reasoning[i], len(close) if room[i] >= 1 else 0, close, answers.get(i)) for i in range(rows)]


def engine_result(ch: ChoiceResult) -> dict:
    """One ``simulator.reasoning.generate_reasoning`` choice as a pool row: ``decoding.choice_row``'s arrays (the served
    model's logprobs, close tag included), ``span`` (each token's, :data:`SPANS`) and ``step_final`` from its chunks
    (one per speculative round; the close tag is one chunk of its own)."""
    return {**choice_row(ch), "span": np.asarray([t.span for t in ch.tokens], dtype=str),
            "step_final": step_finals(ch.chunks, len(ch.tokens))}
