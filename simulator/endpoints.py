"""The OpenAI endpoints' work: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Each endpoint parses its request (``simulator.schemas``), checks it and plans one generation job per
choice (``SimulatorApp`` applies the model name, context budget, sampling and seeds), draws the
request's fault, and answers whole (the ``chat.completion`` / ``text_completion`` body) or as
server-sent events (``chat.completion.chunk`` / ``text_completion`` chunks, reasoning in its field or
inline); the wire pieces come from ``simulator.openai_format``. ``simulator.server`` routes to them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from simulator.engine import ChoiceResult, TokenInfo
from simulator.openai_format import (
    TextStream,
    chat_logprobs,
    legacy_logprobs,
    step_stats,
    usage,
    vllm_prompt_logprobs,
)
from simulator.reasoning import REASONING_CLOSE, REASONING_OPENER
from simulator.request_handling import SimulatorApp
from simulator.schemas import ChatCompletionRequest, CompletionRequest, InvalidRequest, parse_request


# -- chat ----------------------------------------------------------------------------------------
async def chat_completion(sim: SimulatorApp, request: Request) -> Response:
    """``POST /v1/chat/completions``: validate the request, draw its fault, then answer it whole or
    as server-sent events (:meth:`SimulatorApp.sse`)."""
    req: ChatCompletionRequest = await parse_request(request, ChatCompletionRequest)
    prompt_ids, jobs, top_n = _chat_jobs(sim, req)
    fault_resp, kind = await sim.fault_gate(request, req.stream)
    if fault_resp is not None:
        return fault_resp
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if not req.stream:
        results = await run_in_threadpool(sim.run_choices, [dict(j) for j in jobs])
        return sim.respond(_chat_body(sim, rid, created, len(prompt_ids), results, top_n), kind)
    return sim.sse(_chat_stream(sim, req, rid, created, len(prompt_ids), jobs, top_n), kind)


def _chat_jobs(sim: SimulatorApp, req: ChatCompletionRequest) -> tuple[list[int], list[dict], int | None]:
    """The chat request checked (model, template, context) and turned into one generation job per
    choice; returns ``(prompt_ids, jobs, top_n)`` (``top_n`` None: no logprobs asked).

    Raises:
        InvalidRequest: unknown model, messages the template refuses, a prompt or ``max_tokens`` past the context.
    """
    engine = sim.engine
    sim.check_model(req.model)
    msgs = []
    for m in req.messages:
        msgs.append({"role": "system" if m.role == "developer" else m.role, "content": m.text()})
    try:
        prompt_ids = engine.encode_chat(msgs)
    except ValueError as ex:
        raise InvalidRequest(str(ex), param="messages") from None
    mode = sim.reasoning
    if mode is not None:  # the template opens the reasoning span (DeepSeek-R1's)
        prompt_ids = list(prompt_ids) + list(engine.tokenizer.encode(REASONING_OPENER, add_special_tokens=False))
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = sim.max_tokens_for(len(prompt_ids), asked, "max_completion_tokens"
                                    if req.max_completion_tokens is not None else "max_tokens")
    top_n = (req.top_logprobs or 0) if req.logprobs else None
    temperature, top_p, top_k = sim.sampling(req)
    seeds = sim.seeds(req.seed, req.n)
    jobs = [
        dict(index=i, prompt_ids=prompt_ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
             top_k=top_k, seed=seeds[i], stop=req.stop_list(), top_n=top_n, **({"reasoning": True} if mode else {}))
        for i in range(req.n)
    ]
    return prompt_ids, jobs, top_n


def _chat_body(sim: SimulatorApp, rid: str, created: int, prompt_tokens: int, results: list[ChoiceResult],
               top_n: int | None) -> dict:
    """The non-streamed ``chat.completion`` body (reasoning in its field or inline, by the app's mode)."""
    mode = sim.reasoning
    choices = []
    for i, r in enumerate(results):
        entry = chat_logprobs(sim.engine, sim.logprob_convention)
        message: dict[str, Any] = {"role": "assistant", "content": r.text}
        covered = r.tokens
        if mode is not None:
            if mode == "inline":
                closed = any(t.span == "close" for t in r.tokens)
                message["content"] = (r.reasoning_text or "") + (REASONING_CLOSE if closed else "") + r.text
            else:
                message[sim.reasoning_field] = r.reasoning_text or ""
                message["content"] = r.text or None
            if sim.reasoning_logprobs == "answer":
                covered = [t for t in r.tokens if t.span == "answer"]
        choices.append({
            "index": i,
            "message": message,
            "logprobs": {"content": [entry(t) for t in covered], "refusal": None}
            if top_n is not None else None,
            "finish_reason": r.finish_reason,
        })
    return {"id": rid, "object": "chat.completion", "created": created, "model": sim.name,
            "choices": choices, "usage": usage(prompt_tokens, results)}


def _chat_stream(sim: SimulatorApp, req: ChatCompletionRequest, rid: str, created: int, prompt_tokens: int,
                 jobs: list[dict], top_n: int | None) -> AsyncGenerator[dict | list[dict]]:
    """The ``chat.completion.chunk`` events of a streamed chat request (:meth:`SimulatorApp.stream_jobs`)."""
    engine = sim.engine
    mode = sim.reasoning
    rfield = sim.reasoning_field
    streams = {i: TextStream(engine) for i in range(req.n)}
    entries = {i: chat_logprobs(sim.engine, sim.logprob_convention) for i in range(req.n)}
    r_streams = {i: TextStream(engine) for i in range(req.n)}  # reasoning text, decoded apart

    def base(choices: list[dict]) -> dict:
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": sim.name,
                "choices": choices}

    def make_chunk(i: int, part: list[TokenInfo]) -> dict | list[dict]:
        if mode is not None and mode != "inline":
            return reasoning_chunk(i, part)
        covered = [t for t in part if t.span == "answer"] if mode and sim.reasoning_logprobs == "answer" else part
        ch = {"index": i, "delta": {"content": streams[i].text(part)}, "finish_reason": None,
              "logprobs": {"content": [entries[i](t) for t in covered], "refusal": None}
              if top_n is not None and covered else None}
        return base([ch])

    def reasoning_chunk(i: int, part: list[TokenInfo]) -> list[dict]:
        """One chunk of a parsed reasoning stream: the reasoning tokens' text in the reasoning
        field, the forced close tag's tokens with empty text (the parser consumes the tag),
        the answer's in ``content``; one SSE event per run of tokens of one kind, in order."""
        out = []
        j = 0
        while j < len(part):
            span = part[j].span
            run = [part[j]]
            j += 1
            while j < len(part) and part[j].span == span:
                run.append(part[j])
                j += 1
            if span == "answer":
                delta = {"content": streams[i].text(run)}
            else:
                delta = {rfield: r_streams[i].text(run) if span == "reasoning" else r_streams[i].flush()}
            covers = top_n is not None and (sim.reasoning_logprobs == "both" or span == "answer")
            out.append({"index": i, "delta": delta, "finish_reason": None,
                        "logprobs": {"content": [entries[i](t) for t in run], "refusal": None}
                        if covers else None})
        return [base([o]) for o in out]

    def make_final(i: int, res: ChoiceResult) -> dict:
        rest = streams[i].flush()
        delta: dict[str, Any] = {"content": rest} if rest else {}
        if mode is not None and mode != "inline" and (r_rest := r_streams[i].flush()):
            delta[rfield] = r_rest
        out = base([{"index": i, "delta": delta, "finish_reason": res.finish_reason, "logprobs": None}])
        if sim.expose:
            out["simulator"] = step_stats(res.chunks)
        return out

    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    usage_fn = (lambda results: {**base([]), "usage": usage(prompt_tokens, results)}) if include_usage else None
    preface = [base([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                      "logprobs": None}]) for i in range(req.n)]
    return sim.stream_jobs([dict(j) for j in jobs], make_chunk, make_final, usage_fn, preface)


# -- completions ---------------------------------------------------------------------------------
@dataclass
class _CompletionRequestPlan:
    """A legacy completions request checked and planned: each prompt's ids and text, the generation
    jobs (none for a choice with ``max_tokens`` 0), and ``(choice index, prompt index)`` per choice."""

    encoded: list[tuple[list[int], str]]
    jobs: list[dict]
    meta: list[tuple[int, int]]
    echo_info: dict[int, list[TokenInfo]] = field(default_factory=dict)
    prompt_logprobs: dict[int, list[dict | None]] = field(default_factory=dict)
    echo: bool = False

    def echo_prefix(self, pi: int) -> tuple[str, list[TokenInfo]]:
        """Prompt ``pi``'s echoed text and tokens (empty without ``echo``)."""
        return (self.encoded[pi][1], self.echo_info.get(pi, [])) if self.echo else ("", [])

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.encoded)


async def completion(sim: SimulatorApp, request: Request) -> Response:
    """``POST /v1/completions`` (legacy): validate the request, draw its fault, score the prompt for
    ``echo`` / ``prompt_logprobs``, then answer it whole or as server-sent events."""
    req: CompletionRequest = await parse_request(request, CompletionRequest)
    plan = _completion_jobs(sim, req)
    fault_resp, kind = await sim.fault_gate(request, req.stream)
    if fault_resp is not None:
        return fault_resp
    rid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    engine = sim.engine
    if req.prompt_logprobs is not None:  # vLLM extension: teacher-forced logprobs of the prompt
        for pi, (ids, _) in enumerate(plan.encoded):
            plan.prompt_logprobs[pi] = await run_in_threadpool(vllm_prompt_logprobs, engine, ids, req.prompt_logprobs)
    if req.echo:
        for pi, (ids, _) in enumerate(plan.encoded):
            if req.logprobs is not None:
                plan.echo_info[pi] = await run_in_threadpool(engine.score_prompt, ids, req.logprobs, 0)
            else:
                plan.echo_info[pi] = [TokenInfo(t) for t in ids]
    if not req.stream:
        res_list = await run_in_threadpool(sim.run_choices, [dict(j) for j in plan.jobs])
        return sim.respond(_completion_body(sim, req, plan, rid, created, res_list), kind)
    return sim.sse(_completion_stream(sim, req, plan, rid, created), kind)


def _completion_jobs(sim: SimulatorApp, req: CompletionRequest) -> _CompletionRequestPlan:
    """The completions request checked (model, prompt ids in the vocabulary, non-empty prompts, context)
    and planned: ``n`` choices per prompt, choice index ``prompt index * n + j``.

    Raises:
        InvalidRequest: unknown model, a token id outside the vocabulary, an empty prompt, a prompt or
            ``max_tokens`` past the context.
    """
    engine = sim.engine
    sim.check_model(req.model)
    encoded: list[tuple[list[int], str]] = []
    for p in req.prompts():
        if isinstance(p, str):
            ids = engine.encode_text(p)
            text = p
        else:
            bad = [t for t in p if not 0 <= t < engine.vocab_size]
            if bad:
                raise InvalidRequest(f"prompt token ids {bad[:5]} are outside the vocabulary 0..{engine.vocab_size - 1}",
                                     param="prompt")
            ids = list(p)
            text = engine.text_of(ids)
        if not ids:
            raise InvalidRequest("the prompt is empty after tokenization; send at least one token", param="prompt")
        encoded.append((ids, text))
    max_tokens_asked = req.max_tokens  # 0 is allowed (echo-only scoring, as OpenAI's legacy API)
    temperature, top_p, top_k = sim.sampling(req)
    jobs = []
    meta = []
    for pi, (ids, _text) in enumerate(encoded):
        mt = sim.max_tokens_for(len(ids), max_tokens_asked, "max_tokens", "prompt")
        seeds = sim.seeds(req.seed, req.n, offset=pi * req.n)
        for j in range(req.n):
            idx = pi * req.n + j
            meta.append((idx, pi))
            if mt > 0:
                jobs.append(dict(index=idx, prompt_ids=ids, max_tokens=mt, temperature=temperature, top_p=top_p,
                                 top_k=top_k, seed=seeds[j], stop=req.stop_list(), top_n=req.logprobs))
    return _CompletionRequestPlan(encoded, jobs, meta, echo=bool(req.echo))


def _completion_body(sim: SimulatorApp, req: CompletionRequest, plan: _CompletionRequestPlan, rid: str,
                     created: int, res_list: list[ChoiceResult]) -> dict:
    """The non-streamed ``text_completion`` body (echoed prompt first, ``prompt_logprobs`` and token ids
    when asked)."""
    top_n = req.logprobs
    by_idx = {j["index"]: r for j, r in zip(plan.jobs, res_list, strict=True)}
    choices = []
    all_res: dict[int, ChoiceResult] = {}
    for idx, pi in plan.meta:
        r = by_idx.get(idx) or ChoiceResult(tokens=[], text="", finish_reason="length", chunks=[], elapsed_s=0.0,
                                            effective={})
        all_res[idx] = r
        ptext, ptoks = plan.echo_prefix(pi)
        lp = None
        if top_n is not None:
            if req.echo:
                lp = legacy_logprobs(sim.engine, ptoks + r.tokens, 0)
            else:
                lp = legacy_logprobs(sim.engine, r.tokens, 0)
        choice = {"index": idx, "text": ptext + r.text, "logprobs": lp, "finish_reason": r.finish_reason}
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = plan.prompt_logprobs[pi]
        if req.return_token_ids:
            choice["prompt_token_ids"] = list(plan.encoded[pi][0])
            choice["token_ids"] = [t.token_id for t in r.tokens]
        choices.append(choice)
    return {"id": rid, "object": "text_completion", "created": created, "model": sim.name,
            "choices": choices, "usage": usage(plan.prompt_tokens, all_res.values())}


def _completion_stream(sim: SimulatorApp, req: CompletionRequest, plan: _CompletionRequestPlan, rid: str,
                       created: int) -> AsyncGenerator[dict | list[dict]]:
    """The ``text_completion`` events of a streamed completions request: the echoed prompts and the
    ``max_tokens`` 0 choices first, then the generated chunks (:meth:`SimulatorApp.stream_jobs`)."""
    engine = sim.engine
    top_n = req.logprobs
    streams = {idx: TextStream(engine) for idx, _ in plan.meta}
    offsets = {idx: len(plan.echo_prefix(pi)[0]) for idx, pi in plan.meta}
    acc_bytes = {idx: b"" for idx, _ in plan.meta}

    def base(choices: list[dict]) -> dict:
        return {"id": rid, "object": "text_completion", "created": created, "model": sim.name, "choices": choices}

    def make_chunk(i: int, part: list[TokenInfo]) -> dict:
        lp = None
        if top_n is not None:
            lp = legacy_logprobs(sim.engine, part, offsets[i], acc_bytes[i])
        acc_bytes[i] += b"".join(engine.token_bytes(t.token_id) for t in part if t.token_id not in engine.special_ids)
        return base([{"index": i, "text": streams[i].text(part), "logprobs": lp, "finish_reason": None}])

    def make_final(i: int, res: ChoiceResult) -> dict:
        out = base([{"index": i, "text": streams[i].flush(), "logprobs": None, "finish_reason": res.finish_reason}])
        if sim.expose:
            out["simulator"] = step_stats(res.chunks)
        return out

    preface = []
    if req.echo:
        for idx, pi in plan.meta:
            ptext, ptoks = plan.echo_prefix(pi)
            lp = legacy_logprobs(sim.engine, ptoks, 0) if top_n is not None else None
            preface.append(base([{"index": idx, "text": ptext, "logprobs": lp, "finish_reason": None}]))
    done_idx = {j["index"] for j in plan.jobs}
    for idx, _ in plan.meta:
        if idx not in done_idx:  # max_tokens == 0
            preface.append(base([{"index": idx, "text": "", "logprobs": None, "finish_reason": "length"}]))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def usage_fn(results: list[ChoiceResult]) -> dict:
        return {**base([]), "usage": usage(plan.prompt_tokens, results)}

    return sim.stream_jobs([dict(j) for j in plan.jobs], make_chunk, make_final,
                           usage_fn if include_usage else None, preface)
