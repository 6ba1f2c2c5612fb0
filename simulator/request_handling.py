"""Request handling around one engine: what the simulator does with a request between the route and the wire.

:class:`SimulatorApp` holds the serving options of one app (``simulator.serving_options``) and applies
them to each request: the model name, the context budget, the sampling parameters (``enforce`` /
``reject``), the choice seeds; it runs the generation jobs (plain or reasoning mode, in a worker thread
when streamed), draws each request's fault (``simulator.faults``) and delivers the answer as JSON or
as server-sent events grouped by the stream chunking. The endpoints (``simulator.endpoints``) build
the jobs and shape the bodies; ``simulator.server.create_app`` builds the app around it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from simulator.engine import ChoiceResult, SimulatorEngine, TokenInfo
from simulator.faults import FaultInjector
from simulator.openai_format import error_body, error_response
from simulator.profiles import DEFAULT_REASONING_BUDGET
from simulator.reasoning import generate_reasoning
from simulator.schemas import InvalidRequest


def _as_list(x: dict | list[dict]) -> list[dict]:
    return x if isinstance(x, list) else [x]


class SimulatorApp:
    """Request handling around one engine (kept separate from FastAPI wiring for testing)."""

    def __init__(
        self,
        engine: SimulatorEngine,
        served_model_name: str,
        faults: FaultInjector,
        expose_profile: bool,
        max_tokens_default: int,
        logprob_convention: str = "openai",
        reasoning: str | None = None,
        reasoning_logprobs: str = "both",
        reasoning_budget: int = DEFAULT_REASONING_BUDGET,
        stream_chunking: str = "round",
        stream_interval_ms: float = 50.0,
        enforce: Mapping[str, float] | None = None,
        reject: Sequence[str] = (),
    ):
        self.enforce = dict(enforce or {})
        self.reject = tuple(reject)
        self.engine = engine
        self.stream_chunking = stream_chunking
        self.stream_interval_ms = float(stream_interval_ms)
        self.logprob_convention = logprob_convention
        self.reasoning = reasoning
        self.reasoning_logprobs = reasoning_logprobs
        self.reasoning_budget = int(reasoning_budget)
        self.name = served_model_name
        self.faults = faults
        self.expose = expose_profile
        self.max_tokens_default = int(max_tokens_default)
        self.created = int(time.time())

    # -- helpers -----------------------------------------------------------------------------
    @property
    def reasoning_field(self) -> str:
        """The message/delta field of the reasoning text in a field reasoning mode."""
        return "reasoning" if self.reasoning == "field-reasoning" else "reasoning_content"

    def check_model(self, model: str) -> None:
        if model != self.name:
            raise InvalidRequest(
                f"The model {model!r} does not exist on this server; available: {self.name!r}",
                param="model",
                code="model_not_found",
            )

    def max_tokens_for(self, prompt_len: int, asked: int | None, field: str = "max_tokens",
                       prompt_param: str = "messages") -> int:
        """Completion budget: ``asked`` checked against the context, or the default (clipped to room)."""
        room = self.engine.max_context - prompt_len
        if room < 1 and (asked is None or asked > 0):
            raise InvalidRequest(
                f"the prompt has {prompt_len} tokens; this model's maximum context length is "
                f"{self.engine.max_context} tokens",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if asked is None:
            return max(0, min(self.max_tokens_default, room))
        if prompt_len + asked > self.engine.max_context:
            raise InvalidRequest(
                f"This model's maximum context length is {self.engine.max_context} tokens; the prompt has "
                f"{prompt_len} and {field}={asked} was requested: lower {field}",
                param=field,
                code="context_length_exceeded",
            )
        return asked

    def sampling(self, req: Any) -> tuple[float, float, int]:
        """``(temperature, top_p, top_k)`` a request is sampled at: an ``enforce``d value replaces the
        requested one (as an API that fixes temperature = 1.0 and top_p = 0.95 does), a ``reject``ed
        parameter present in the request is refused with HTTP 400 naming it (OpenAI's words for its
        reasoning models: "Unsupported value: 'temperature' does not support 0 with this model. Only the
        default (1) value is supported." — sending the default itself is accepted).

        Raises:
            InvalidRequest: a rejected parameter was sent (``param`` names it).
        """
        for name in self.reject:
            got = getattr(req, name, None)
            if got is None:
                continue
            fixed = self.enforce.get(name)
            if fixed is None:
                raise InvalidRequest(f"Unsupported parameter: '{name}' is not supported with this model.",
                                     param=name, code="unsupported_parameter")
            if float(got) != float(fixed):
                raise InvalidRequest(f"Unsupported value: '{name}' does not support {got:g} with this model. Only the "
                                     f"default ({fixed:g}) value is supported.", param=name, code="unsupported_value")
        temperature = 1.0 if req.temperature is None else req.temperature
        top_p = 1.0 if req.top_p is None else req.top_p
        top_k = 0 if req.top_k in (None, -1) else req.top_k
        e = self.enforce
        return (float(e.get("temperature", temperature)), float(e.get("top_p", top_p)),
                int(e.get("top_k", top_k)))

    def seeds(self, seed: int | None, n: int, offset: int = 0) -> list[int]:
        if seed is None:
            return [self.engine.next_seed() for _ in range(n)]
        return [SimulatorEngine.choice_seed(seed, offset + i) for i in range(n)]

    def extra_headers(self) -> dict:
        if not self.expose:
            return {}
        return {"x-simulator-profile": self.engine.profile.name}

    def stamp(self, body: dict) -> dict:
        if self.expose:
            body["system_fingerprint"] = self.engine.fingerprint()
        return body

    # -- generation --------------------------------------------------------------------------
    def run_choices(
        self,
        jobs: list[dict],
        on_chunk: Callable[[int, list[TokenInfo]], None] | None = None,
        on_done: Callable[[int, ChoiceResult], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> list[ChoiceResult]:
        """Generate each job (dict of engine.generate kwargs + ``index``) in order (blocking)."""
        results = []
        for job in jobs:
            idx = job.pop("index")
            if cancel is not None and cancel.is_set():
                break
            cb = (lambda part, idx=idx: on_chunk(idx, part)) if on_chunk else None
            try:
                if job.pop("reasoning", False):
                    res = generate_reasoning(self.engine, **job, budget=self.reasoning_budget, on_chunk=cb,
                                             cancel=cancel)
                else:
                    res = self.engine.generate(**job, on_chunk=cb, cancel=cancel)
            except ValueError as ex:
                raise InvalidRequest(str(ex)) from None
            results.append(res)
            if on_done:
                on_done(idx, res)
        return results

    # -- responses and streaming ---------------------------------------------------------------
    async def fault_gate(self, request: Request, stream: bool) -> tuple[Response | None, str | None]:
        """Draw this request's fault: the error response to send instead (429, 500, a cut body; after the
        ``slow`` delay, 499 when the client left), or None; and the fault's kind (None: no fault)."""
        kind = self.faults.draw()
        hdr = dict(self.extra_headers())
        if kind and self.expose:
            hdr["x-simulator-fault"] = kind
        if kind == "rate_limit":
            hdr["Retry-After"] = str(self.faults.retry_after_s)
            return error_response(429, "Rate limit reached for requests; retry after the Retry-After delay",
                                  type_="rate_limit_exceeded", code="rate_limit_exceeded", headers=hdr), kind
        if kind == "server_error":
            return error_response(500, "The server had an error while processing your request", type_="server_error",
                                  headers=hdr), kind
        if kind == "slow":
            await asyncio.sleep(self.faults.delay_s)
            if await request.is_disconnected():  # the client gave up during the delay
                return Response(status_code=499), kind
        if kind == "malformed" and not stream:
            return Response('{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": ',
                            media_type="application/json", headers=hdr), kind
        return None, kind

    def respond(self, body: dict, kind: str | None) -> Response:
        """A non-streamed JSON response (cut in half under the ``truncated`` fault)."""
        hdr = dict(self.extra_headers())
        if kind and self.expose:
            hdr["x-simulator-fault"] = kind
        if kind == "truncated":
            text = json.dumps(body)
            return Response(text[: max(1, len(text) // 2)], media_type="application/json", headers=hdr)
        return JSONResponse(self.stamp(body), headers=hdr)

    def sse(self, gen: AsyncGenerator[dict | str | list[dict]], kind: str | None) -> StreamingResponse:
        """The SSE response of ``gen``'s chunks, ``data: [DONE]`` last (a broken event under ``malformed``,
        cut after two chunks under ``truncated``)."""
        hdr = dict(self.extra_headers())
        if kind and self.expose:
            hdr["x-simulator-fault"] = kind

        async def body():
            n_chunks = 0
            async for item in gen:
                n_chunks += 1
                if kind == "malformed" and n_chunks == 2:
                    yield 'data: {"id": "broken", "choices": [{"delta": \n\n'
                if isinstance(item, str):
                    yield f"data: {item}\n\n"
                elif isinstance(item, list):
                    yield "".join(f"data: {json.dumps(self.stamp(x))}\n\n" for x in item)
                else:
                    yield f"data: {json.dumps(self.stamp(item))}\n\n"
                if kind == "truncated" and n_chunks >= 2:
                    await gen.aclose()
                    return
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={**hdr, "Cache-Control": "no-cache"})

    async def stream_jobs(self, jobs: list[dict], make_chunk: Callable, make_final: Callable,
                          usage_fn: Callable | None, preface: list[dict]) -> AsyncGenerator[dict | list[dict]]:
        """Run ``jobs`` in a worker thread and yield ``preface``, then the chunks as :attr:`stream_chunking`
        groups them (``make_chunk``), each choice's final chunk (``make_final``) and the usage chunk
        (``usage_fn``); the worker stops when the client leaves."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(item):
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def work():
            try:
                self.run_choices(jobs, on_chunk=lambda i, part: put(("chunk", i, part)),
                                on_done=lambda i, res: put(("done", i, res)), cancel=cancel)
                put(("end", None, None))
            except Exception as ex:
                put(("error", None, ex))

        task = loop.run_in_executor(None, work)
        try:
            for item in preface:
                yield item
            results: list[ChoiceResult] = []
            interval = self.stream_interval_ms / 1000.0
            deadline = loop.time() + interval
            pending: dict[int, list[TokenInfo]] = {}
            while True:
                if self.stream_chunking == "time":
                    try:
                        kind_, idx, payload = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
                    except TimeoutError:  # tick: flush what is ready
                        for i, part in pending.items():
                            if part:
                                yield make_chunk(i, part)
                        pending = {}
                        deadline = max(deadline + interval, loop.time())
                        continue
                else:
                    kind_, idx, payload = await queue.get()
                if kind_ == "chunk":
                    if self.stream_chunking == "time":
                        pending.setdefault(idx, []).extend(payload)
                    elif self.stream_chunking == "token":
                        # one write holding one SSE event per token: back to back, as an engine
                        # that detokenizes a step token by token sends them
                        yield [c for t in payload for c in _as_list(make_chunk(idx, [t]))]
                    else:
                        yield make_chunk(idx, payload)
                elif kind_ == "done":
                    results.append(payload)
                    if pending.get(idx):
                        yield make_chunk(idx, pending.pop(idx))
                    yield make_final(idx, payload)
                elif kind_ == "error":
                    yield error_body(f"generation failed: {payload}", type_="server_error")
                    break
                else:
                    if usage_fn is not None:
                        yield usage_fn(results)
                    break
        finally:
            cancel.set()  # client gone or stream ended: the worker stops at its next round
            del task
