"""Reasoning mode: a reasoning span the model writes, closed by a token budget, then the answer.

The simulator's chat template opens the assistant turn with :data:`REASONING_OPENER` (as
DeepSeek-R1's template opens ``<think>``); :func:`generate_reasoning` lets the served model write up
to a budget of reasoning tokens through :meth:`SimulatorEngine.generate` (``span="reasoning"``:
span-restricted verifiers relax there), forces :data:`REASONING_CLOSE` and generates the answer
after it; :func:`generate_reasoning_batch` does the same for many requests in lock step
(:meth:`SimulatorEngine.generate_batch`; the calibration's ``think:PROFILE`` pools).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from simulator.engine import ChoiceResult, SimulatorEngine, TokenInfo

#: Reasoning mode: the opener the simulator's template puts after the generation prompt (the model
#: writes inside it) and the close tag a token budget forces, DeepSeek-R1's format
#: (``<think>\\n`` opened by the template; vLLM v0.11 ``deepseek_r1`` reasoning parser).
REASONING_OPENER = "<think>\n"
REASONING_CLOSE = "</think>"


def generate_reasoning(
    engine: SimulatorEngine,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    budget: int,
    seed: int | None = None,
    top_n: int | None = None,
    on_chunk: Callable[[list[TokenInfo]], None] | None = None,
    cancel: threading.Event | None = None,
    **sampling: Any,
) -> ChoiceResult:
    """Reasoning mode: the model writes a reasoning span, a token budget closes it, then the answer.

    ``prompt_ids`` already end with the reasoning opener (:data:`REASONING_OPENER`, put there by
    the server's template, as DeepSeek-R1's template opens ``<think>``). The model generates up to
    ``budget`` tokens (or until it ends the turn itself); the close tag (:data:`REASONING_CLOSE`)
    is then forced, as engines with a thinking budget force it (its tokens carry the served
    model's logprobs at their positions, ``span = "close"``), and the answer is generated after
    it from the same served model, with the remaining ``max_tokens``. Stop strings apply to the
    answer only.

    Args:
        prompt_ids: templated prompt ids ending with the opener; max_tokens: >= 1 tokens in all
            (reasoning, close tag, answer); budget: >= 1 reasoning tokens at most.
        seed: choice seed (the answer's is derived from it); top_n, on_chunk, cancel: as
            :meth:`SimulatorEngine.generate`; sampling: temperature, top_p, top_k, stop.

    Returns:
        ChoiceResult whose tokens are reasoning + close + answer (each with its ``span``),
        ``text`` the answer, ``reasoning_text`` the reasoning; ``finish_reason`` ``length``
        when the budget of ``max_tokens`` ran out before the answer.

    Raises:
        ValueError: budget < 1, or from :meth:`SimulatorEngine.generate`.
    """
    if budget < 1:
        raise ValueError(f"budget={budget} must be >= 1")
    if seed is None or engine.profile.ignore_seed:
        seed = engine.next_seed()
    stop = sampling.pop("stop", ())

    def tagged(span: str) -> Callable[[list[TokenInfo]], None] | None:
        def cb(part: list[TokenInfo]) -> None:
            for t in part:
                t.span = span
            if on_chunk is not None:
                on_chunk(part)
        return cb

    t0 = time.perf_counter()
    r = engine.generate(prompt_ids, max_tokens=min(budget, max_tokens), seed=seed, top_n=top_n,
                      on_chunk=tagged("reasoning"), cancel=cancel, span="reasoning", **sampling)
    for t in r.tokens:
        t.span = "reasoning"
    reasoning_ids = [t.token_id for t in r.tokens]
    close_ids = list(engine.tokenizer.encode(REASONING_CLOSE, add_special_tokens=False))
    room = int(max_tokens) - len(reasoning_ids) - len(close_ids)
    done = ChoiceResult(tokens=list(r.tokens), text="", finish_reason="length", chunks=list(r.chunks),
                        elapsed_s=time.perf_counter() - t0, effective=r.effective,
                        reasoning_text=engine.text_of(reasoning_ids))
    if room < 1 or (cancel is not None and cancel.is_set()):
        return done
    prefix = [int(x) for x in prompt_ids] + reasoning_ids
    if top_n is None:
        forced = [TokenInfo(i) for i in close_ids]
    else:
        forced = engine.score_prompt(prefix + close_ids, top_n, nonce=seed)[len(prefix):]
    cb = tagged("close")
    if cb is not None:
        cb(forced)
    a = engine.generate(prefix + close_ids, max_tokens=room, seed=engine.choice_seed(seed, 1 << 20), top_n=top_n,
                      stop=stop, on_chunk=tagged("answer"), cancel=cancel, **sampling)
    for t in a.tokens:
        t.span = "answer"
    return ChoiceResult(tokens=done.tokens + forced + a.tokens, text=a.text, finish_reason=a.finish_reason,
                        chunks=done.chunks + [len(forced)] + a.chunks, elapsed_s=time.perf_counter() - t0,
                        effective=a.effective, reasoning_text=done.reasoning_text)


def generate_reasoning_batch(
    engine: SimulatorEngine,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: Sequence[int],
    budget: int,
    temperature: float,
    seeds: Sequence[int],
    top_n: int | None = None,
) -> list[ChoiceResult]:
    """:func:`generate_reasoning` for many requests at once (:meth:`SimulatorEngine.generate_batch` for the reasoning, then for
    the answers after the forced close tag): row b is ``generate_reasoning(prompts[b], max_tokens=max_tokens[b],
    budget=budget, seed=seeds[b], temperature=temperature, top_n=top_n)``, no stop strings. For offline
    collection (the calibration's ``think:PROFILE`` pools).

    Raises:
        ValueError: budget < 1, or from :meth:`SimulatorEngine.generate_batch`.
    """
    if budget < 1:
        raise ValueError(f"budget={budget} must be >= 1")
    seeds = [engine.next_seed() if engine.profile.ignore_seed else int(s) for s in seeds]
    first = engine.generate_batch(prompts, max_tokens=[min(budget, int(m)) for m in max_tokens],
                                temperature=temperature, seeds=seeds, top_n=top_n, span="reasoning")
    close_ids = list(engine.tokenizer.encode(REASONING_CLOSE, add_special_tokens=False))
    out: list[ChoiceResult] = []
    todo: list[tuple[int, list[int], int]] = []  # (row, prefix + close tag, room)
    for b, r in enumerate(first):
        for t in r.tokens:
            t.span = "reasoning"
        reasoning_ids = [t.token_id for t in r.tokens]
        room = int(max_tokens[b]) - len(reasoning_ids) - len(close_ids)
        out.append(ChoiceResult(tokens=list(r.tokens), text="", finish_reason="length", chunks=list(r.chunks),
                                elapsed_s=r.elapsed_s, effective=r.effective,
                                reasoning_text=engine.text_of(reasoning_ids)))
        if room >= 1:
            todo.append((b, [int(x) for x in prompts[b]] + reasoning_ids + close_ids, room))
    if not todo:
        return out
    answers = engine.generate_batch([p for _, p, _ in todo], max_tokens=[m for *_, m in todo], temperature=temperature,
                                  seeds=[engine.choice_seed(seeds[b], 1 << 20) for b, *_ in todo], top_n=top_n)
    for (b, prefix, _), a in zip(todo, answers, strict=True):
        n_close = len(close_ids)
        forced = ([TokenInfo(i) for i in close_ids] if top_n is None
                  else engine.score_prompt(prefix, top_n, nonce=seeds[b])[len(prefix) - n_close:])
        for t in forced:
            t.span = "close"
        for t in a.tokens:
            t.span = "answer"
        d = out[b]
        out[b] = ChoiceResult(tokens=d.tokens + forced + a.tokens, text=a.text, finish_reason=a.finish_reason,
                              chunks=d.chunks + [n_close] + a.chunks, elapsed_s=d.elapsed_s + a.elapsed_s,
                              effective=a.effective, reasoning_text=d.reasoning_text)
    return out
