"""The provider simulator's HTTP server: OpenAI-compatible endpoints over a ``SimulatorEngine``.

Endpoints (OpenAI API reference, https://platform.openai.com/docs/api-reference):

- ``GET /v1/models`` — the served model name (operator metadata only with ``expose_profile``);
- ``POST /v1/chat/completions`` — chat template applied like vLLM; ``logprobs`` + ``top_logprobs``
  (0..20) with ``bytes`` per token in ``choices[].logprobs.content[]``;
- ``POST /v1/completions`` — legacy: ``logprobs`` int (0..5), ``echo`` with prompt logprobs
  (``tokens``, ``token_logprobs``, ``top_logprobs`` dicts, ``text_offset``);
- ``stream: true`` — server-sent events, ONE chunk per speculative round (the tokens one target
  forward emitted) by default (``stream_chunking``: ``token`` splits rounds into one-token chunks,
  ``time`` flushes every ``stream_interval_ms``), ``data: [DONE]`` at the end;
  ``stream_options.include_usage`` adds usage; with ``expose_profile`` each choice's final chunk
  carries ``simulator`` = :func:`step_stats` (the true tokens per round, for validating
  ``auditor.detectors.speculation``);
- ``GET /health``.

Every invalid request (unknown model, ``top_logprobs`` > 20, negative ``max_tokens``, malformed
JSON, wrong types, unknown route) gets an OpenAI error body ``{"error": {"message", "type",
"param", "code"}}`` with a 4xx status, never a 500. The profile, the real model and a system
fingerprint appear only with ``expose_profile`` (header ``x-simulator-profile``, ``/v1/models``
metadata, ``system_fingerprint``).

Use ``create_app(...)`` in-process (httpx ``ASGITransport``, ``TestClient``) or with uvicorn
(``auditor serve``, :func:`serve_in_thread`).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference.loopback import free_port
from simulator.engine import REASONING_CLOSE, REASONING_OPENER, ChoiceResult, SimulatorEngine, TokenInfo
from simulator.faults import FaultInjector
from simulator.profiles import DEFAULT_REASONING_BUDGET, Profile, get_profile
from simulator.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
)

DEFAULT_MAX_TOKENS = 256
#: ``create_app(stream_chunking=...)`` values: one SSE chunk per round, per token, or per time interval.
STREAM_CHUNKINGS = ("round", "token", "time")
#: ``create_app(reasoning=...)`` values: where the reasoning goes (see :func:`create_app`).
REASONING_MODES = ("field", "field-reasoning", "inline")
#: ``create_app(reasoning_logprobs=...)`` values: what ``logprobs.content`` covers.
REASONING_LOGPROBS = ("both", "answer")


def step_stats(chunks: list[int]) -> dict:
    """Operator statistics of one choice: tokens per speculative round (``ChoiceResult.chunks``)
    and their mean (= mean accepted tokens per verification step; plain decoding 1.0)."""
    n = len(chunks)
    return {"tokens_per_step": list(chunks), "steps": n,
            "mean_accepted_tokens_per_step": (sum(chunks) / n) if n else None}


def _as_list(x: dict | list[dict]) -> list[dict]:
    return x if isinstance(x, list) else [x]


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: Any = None) -> dict:
    """OpenAI error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: Any = None, headers: dict | None = None) -> JSONResponse:
    """A JSONResponse carrying :func:`error_body`."""
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def _validation_to_invalid(e: ValidationError) -> InvalidRequest:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("function-after",))
    msg = err.get("msg", "invalid value")
    msg = msg.removeprefix("Value error, ")
    inp = err.get("input")
    shown = "" if isinstance(inp, dict) or err.get("type") == "missing" else f" (got {json.dumps(inp, default=str)[:80]})"
    return InvalidRequest(f"{loc or 'body'}: {msg}{shown}", param=loc or None, code="invalid_value")


_Req = TypeVar("_Req", bound=BaseModel)


async def _parse(request: Request, schema: type[_Req]) -> _Req:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the request body is not valid JSON ({e}); send a JSON object", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise _validation_to_invalid(e) from None
    except InvalidRequest:
        raise


#: How chat ``logprobs.content`` is spelled (``create_app(logprob_convention=...)``).
LOGPROB_CONVENTIONS = ("openai", "vllm")


def _decode_piece(b: bytes) -> tuple[str, bool]:
    """``(text, complete)`` of a byte string: incomplete = it ends inside a UTF-8 character (text "")."""
    try:
        return b.decode("utf-8"), True
    except UnicodeDecodeError as ex:
        if ex.reason == "unexpected end of data" and ex.end == len(b):
            return "", False
        return b.decode("utf-8", errors="replace"), True


class _VllmLogprobs:
    """vLLM's chat logprob entries for one choice (issue 40, item 2), stateful over its tokens in order.

    Follows vLLM's OpenAI server as measured in issue 40 (vLLM 0.32 CPU build; ``serving_chat.py``
    ``_get_top_logprobs`` and the incremental detokenizer): the sampled token is the first entry of
    ``top_logprobs``, followed by the best other tokens (k + 1 entries when it is not among the top k);
    a token that ends inside a UTF-8 character is returned as ``""`` with ``bytes: []`` and the token
    that completes the character carries the whole character (the pending bytes + its own), as do its
    alternatives (pending bytes + theirs; ``""`` when still incomplete, U+FFFD where invalid).
    """

    def __init__(self, engine: SimulatorEngine):
        self.engine = engine
        self.pending = b""

    def _alt(self, tid: int, lp: float) -> dict:
        text, _ = _decode_piece(self.pending + self.engine.token_bytes(tid))
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    def entry(self, t: TokenInfo) -> dict:
        e = self.engine
        special = t.token_id in e.special_ids
        text, complete = (e.token_str(t.token_id), True) if special else _decode_piece(self.pending + e.token_bytes(t.token_id))
        own = {"token": text, "logprob": t.logprob, "bytes": list(text.encode("utf-8"))}
        alts = [own] + [self._alt(i, lp) for i, lp in zip(t.top_ids, t.top_logprobs, strict=True) if i != t.token_id]
        if not t.top_ids:  # top_logprobs = 0: no list
            alts = []
        self.pending = b"" if complete or special else self.pending + e.token_bytes(t.token_id)
        return {**own, "top_logprobs": alts}


class _Stream:
    """Incremental text of one choice from released tokens (UTF-8 held back until complete)."""

    def __init__(self, engine: SimulatorEngine):
        self.engine = engine
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, tokens: list[TokenInfo]) -> str:
        b = b"".join(self.engine.token_bytes(t.token_id) for t in tokens if t.token_id not in self.engine.special_ids)
        return self.dec.decode(b)

    def flush(self) -> str:
        return self.dec.decode(b"", final=True)


def vllm_prompt_logprobs(engine: SimulatorEngine, ids: Sequence[int], k: int) -> list[dict | None]:
    """vLLM's ``prompt_logprobs`` for one prompt under the served model (teacher forcing).

    Format of vLLM's ``CompletionResponseChoice.prompt_logprobs``
    (``vllm/entrypoints/openai/completion/protocol.py``): one entry per prompt position, the first
    ``None``; each a dict ``{token_id: {"logprob", "rank", "decoded_token"}}`` holding the top-``k``
    (ranks 1..k) plus the prompt token itself with its exact rank (1 + the number of ids with a
    higher logprob); ``-inf`` is sent as ``-9999.0``. Raw log-softmax of the served model, nats.
    """
    ids = [int(t) for t in ids]
    out: list[dict | None] = [None]
    if len(ids) < 2:
        return out
    with engine._lock, torch.inference_mode():
        engine.served.model.nonce = 0
        logits = engine.served.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1]
        for j, t in enumerate(ids[1:]):
            row = torch.log_softmax(logits[j].float(), dim=-1)
            entry: dict = {}
            if k > 0:
                tv, ti = torch.topk(row, min(k, row.shape[-1]))
                for r, (tid, lp) in enumerate(zip(ti.tolist(), tv.tolist(), strict=True), start=1):
                    entry[str(tid)] = {"logprob": max(float(lp), -9999.0), "rank": r, "decoded_token": engine.token_str(tid)}
            if str(t) not in entry:
                lp = float(row[t])
                entry[str(t)] = {"logprob": max(lp, -9999.0), "rank": int((row > row[t]).sum()) + 1,
                                 "decoded_token": engine.token_str(t)}
            out.append(entry)
    return out


#: Parameters ``create_app(enforce=...)`` may fix, and those ``reject`` may refuse.
ENFORCEABLE = ("temperature", "top_p", "top_k")
REJECTABLE = ("temperature", "top_p", "top_k", "seed")


def parse_enforce(text: str | None) -> dict[str, float]:
    """``"temperature=1.0,top_p=0.95"`` → ``{"temperature": 1.0, "top_p": 0.95}`` (``auditor serve --enforce``).

    Raises:
        ValueError: an item without ``=`` or with a value that is no number, naming it.
    """
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--enforce: {item.strip()!r} is not PARAM=NUMBER (e.g. temperature=1.0,top_p=0.95)") from None
    check_enforce(out, ())
    return out


def check_enforce(enforce: Mapping[str, float], reject: Sequence[str]) -> None:
    """Validate ``create_app``'s ``enforce`` / ``reject``.

    Raises:
        ValueError: an unknown parameter name, or a value out of its range (temperature in [0, 2],
            top_p in (0, 1], top_k >= 1), naming the parameter.
    """
    for k, v in enforce.items():
        if k not in ENFORCEABLE:
            raise ValueError(f"enforce: unknown parameter {k!r}; use {', '.join(ENFORCEABLE)}")
        ok = {"temperature": 0.0 <= v <= 2.0, "top_p": 0.0 < v <= 1.0, "top_k": v >= 1 and float(v).is_integer()}[k]
        if not ok:
            raise ValueError(f"enforce: {k}={v} is out of range (temperature in [0, 2], top_p in (0, 1], top_k >= 1)")
    for k in reject:
        if k not in REJECTABLE:
            raise ValueError(f"reject: unknown parameter {k!r}; use {', '.join(REJECTABLE)}")



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

    def chat_logprob(self, t: TokenInfo) -> dict:
        e = self.engine
        return {
            "token": e.token_str(t.token_id),
            "logprob": t.logprob,
            "bytes": list(e.token_bytes(t.token_id)),
            "top_logprobs": [
                {"token": e.token_str(i), "logprob": lp, "bytes": list(e.token_bytes(i))}
                for i, lp in zip(t.top_ids, t.top_logprobs, strict=True)
            ],
        }

    def chat_logprobs(self) -> Callable[[TokenInfo], dict]:
        """The entry maker of one choice's chat logprobs under the app's convention (call it on the
        choice's tokens in order: vLLM's partial characters need the pending bytes)."""
        if self.logprob_convention == "vllm":
            return _VllmLogprobs(self.engine).entry
        return self.chat_logprob

    def legacy_logprobs(self, tokens: list[TokenInfo], start_offset: int, prefix: bytes = b"") -> dict:
        """Legacy completions logprobs block; offsets are characters into the choice text."""
        e = self.engine
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        acc = bytearray(prefix)
        for t in tokens:
            out["tokens"].append(e.token_str(t.token_id))
            out["token_logprobs"].append(t.logprob)
            if t.logprob is None:
                out["top_logprobs"].append(None)
            else:
                d = {e.token_str(i): lp for i, lp in zip(t.top_ids, t.top_logprobs, strict=True)}
                d.setdefault(e.token_str(t.token_id), t.logprob)
                out["top_logprobs"].append(d)
            out["text_offset"].append(start_offset + len(bytes(acc).decode("utf-8", errors="ignore")))
            if t.token_id not in e.special_ids:
                acc.extend(e.token_bytes(t.token_id))
        return out

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
                    res = self.engine.generate_reasoning(**job, budget=self.reasoning_budget, on_chunk=cb, cancel=cancel)
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


def create_app(
    profile: Profile | str = "honest-fp32",
    lm: Any = None,
    *,
    engine: SimulatorEngine | None = None,
    model: str | None = None,
    served_model_name: str | None = None,
    drafter: str | None = None,
    k: int = 4,
    seed: int | None = 0,
    faults: float | FaultInjector = 0.0,
    fault_delay: float = 30.0,
    expose_profile: bool = False,
    max_tokens_default: int = DEFAULT_MAX_TOKENS,
    adaptive_k: bool = True,
    stream_chunking: str = "round",
    stream_interval_ms: float = 50.0,
    device: str | None = None,
    logprob_convention: str = "openai",
    reasoning: str | None = None,
    reasoning_logprobs: str = "both",
    reasoning_budget: int = DEFAULT_REASONING_BUDGET,
    enforce: Mapping[str, float] | None = None,
    reject: Sequence[str] = (),
    **profile_overrides: Any,
) -> FastAPI:
    """Build the FastAPI app of the provider simulator.

    Args:
        profile: a Profile or a built-in profile name (see ``--list-profiles``).
        lm: a loaded reference ``LoadedModel`` (tests: ``tiny_lm``); copied when the profile
            changes weights. None loads ``model`` (default SmolLM2-135M-Instruct).
        engine: a ready ``SimulatorEngine`` (overrides profile/lm/model/drafter/k/seed).
        model: model name/path when ``lm`` is None.
        served_model_name: the name clients must send and ``/v1/models`` lists; default the
            reference model's short name (last path component).
        drafter: drafter spec (``ngram``, ``self:L``, ``none``); None = the profile's default.
        k: maximum drafts per speculative round.
        seed: server RNG seed (requests without ``seed`` and fault decisions); None = random.
        faults: fault rate in [0, 1] (or a ``FaultInjector``); fault_delay: ``slow`` delay (s).
        expose_profile: operator mode: ``x-simulator-profile`` header, fingerprint, /v1/models metadata.
        max_tokens_default: completion length when the request gives no ``max_tokens`` (chat).
        adaptive_k: the loop's adaptive draft length.
        stream_chunking: how streamed tokens are grouped into SSE chunks: ``round`` (one chunk per
            speculative round, as vLLM sends one per engine step), ``token`` (each round split into
            one-token chunks sent back to back) or ``time`` (whatever is ready every
            ``stream_interval_ms`` milliseconds, as servers that batch output by time do).
        stream_interval_ms: the ``time`` chunking interval (ms, > 0).
        device: where ``model`` is loaded when ``lm`` is None (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``;
            ``reference.models.resolve_device``); None = CPU.
        logprob_convention: how chat ``logprobs.content`` is spelled: ``openai`` (ranked top-k, raw
            partial-character bytes) or ``vllm`` (sampled token first, ``""`` then whole-character
            tokens; :class:`_VllmLogprobs`). Legacy completions are unchanged.
        reasoning: reasoning mode of chat completions (None = plain chat): the template opens the
            assistant turn with ``engine.REASONING_OPENER``, the model writes the reasoning, a token
            budget forces the close tag, then the answer; the response carries it as
            ``message.reasoning_content`` (``field``), ``message.reasoning`` (``field-reasoning``),
            streamed as ``delta.reasoning_content`` / ``delta.reasoning`` (the close tag's tokens
            as empty-text deltas, as vLLM's parsers send them), or inline in ``content`` (``inline``).
        reasoning_logprobs: ``both`` (``logprobs.content`` covers reasoning, close tag and answer)
            or ``answer`` (the answer tokens only; with a field mode: inline has no parser to split them).
        reasoning_budget: reasoning tokens at most before the close tag is forced (>= 1).
        enforce: sampling parameters the server applies whatever the request says (``temperature``,
            ``top_p``, ``top_k``; e.g. ``{"temperature": 1.0, "top_p": 0.95}``, as Kimi's API fixes them);
            ``SimulatorApp.sampling``.
        reject: parameters (``temperature``, ``top_p``, ``top_k``, ``seed``) refused with HTTP 400 when sent
            (sending the ``enforce``d value itself is accepted, as OpenAI does for its reasoning models).
        **profile_overrides: Profile fields to override (e.g. ``accept_threshold_single=0.3``).

    Returns:
        FastAPI app; ``app.state.sim`` is the :class:`SimulatorApp` (``.engine``, ``.faults``).

    Raises:
        KeyError: unknown profile name; ValueError: invalid overrides or arguments.
    """
    _check_serving_options(stream_chunking=stream_chunking, stream_interval_ms=stream_interval_ms,
                           logprob_convention=logprob_convention, reasoning=reasoning,
                           reasoning_logprobs=reasoning_logprobs, reasoning_budget=reasoning_budget)
    check_enforce(enforce or {}, reject)
    if engine is None:
        engine = _build_engine(profile, lm, model=model, drafter=drafter, k=k, seed=seed, adaptive_k=adaptive_k,
                               device=device, profile_overrides=profile_overrides)
    name = served_model_name or str(engine.reference_name).rstrip("/").split("/")[-1]
    inj = faults if isinstance(faults, FaultInjector) else FaultInjector(
        rate=float(faults), seed=None if seed is None else seed + 7919, delay_s=fault_delay
    )
    sim = SimulatorApp(engine, name, inj, expose_profile, max_tokens_default, logprob_convention,
                       reasoning=reasoning, reasoning_logprobs=reasoning_logprobs, reasoning_budget=reasoning_budget,
                       stream_chunking=stream_chunking, stream_interval_ms=stream_interval_ms,
                       enforce=enforce, reject=reject)
    app = FastAPI(title="spec-auditor provider simulator", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sim = sim
    _add_error_handlers(app, sim)
    _add_routes(app, sim)
    return app


def _check_serving_options(*, stream_chunking: str, stream_interval_ms: float, logprob_convention: str,
                           reasoning: str | None, reasoning_logprobs: str, reasoning_budget: int) -> None:
    """Raises:
        ValueError: a :func:`create_app` serving option outside its allowed values (the message names it)."""
    if stream_chunking not in STREAM_CHUNKINGS:
        raise ValueError(f"stream_chunking={stream_chunking!r}: use one of {', '.join(STREAM_CHUNKINGS)}")
    if not stream_interval_ms > 0:
        raise ValueError(f"stream_interval_ms={stream_interval_ms} must be > 0")
    if logprob_convention not in LOGPROB_CONVENTIONS:
        raise ValueError(f"logprob_convention={logprob_convention!r}: use one of {', '.join(LOGPROB_CONVENTIONS)}")
    if reasoning not in (None, *REASONING_MODES):
        raise ValueError(f"reasoning={reasoning!r}: use one of {', '.join(REASONING_MODES)}")
    if reasoning_logprobs not in REASONING_LOGPROBS:
        raise ValueError(f"reasoning_logprobs={reasoning_logprobs!r}: use one of {', '.join(REASONING_LOGPROBS)}")
    if reasoning == "inline" and reasoning_logprobs != "both":
        raise ValueError("reasoning='inline' has no parser to split the logprobs: use reasoning_logprobs='both'")
    if reasoning_budget < 1:
        raise ValueError(f"reasoning_budget={reasoning_budget} must be >= 1")


def _build_engine(profile: Profile | str, lm: Any, *, model: str | None, drafter: str | None, k: int,
                  seed: int | None, adaptive_k: bool, device: str | None,
                  profile_overrides: dict[str, Any]) -> SimulatorEngine:
    """The engine of :func:`create_app`: the profile (with overrides) over ``lm``, or over ``model``
    loaded on ``device`` (the engine then owns it: no copy)."""
    prof = get_profile(profile, **profile_overrides) if isinstance(profile, str) else profile.with_overrides(
        **profile_overrides
    )
    owned = None
    if lm is None and device is not None:
        from reference import DEFAULT_MODEL
        from reference.models import load_model

        lm, owned = load_model(model or DEFAULT_MODEL, device=device), False  # the engine owns it: no copy
    return SimulatorEngine(prof, lm, model=model, drafter=drafter, k=k, seed=seed, adaptive_k=adaptive_k,
                           copy_model=owned)


def _add_error_handlers(app: FastAPI, sim: SimulatorApp) -> None:
    """OpenAI error bodies for an invalid request (400), an unknown route or method (404/405) and
    anything else (500)."""

    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, exc: InvalidRequest):
        return error_response(400, exc.message, param=exc.param, code=exc.code, headers=sim.extra_headers())

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        msg = {404: f"no route {request.method} {request.url.path}; see /v1/models, /v1/chat/completions, "
                    "/v1/completions", 405: f"method {request.method} not allowed on {request.url.path}"}
        return error_response(exc.status_code, msg.get(exc.status_code, str(exc.detail)),
                              code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):  # pragma: no cover - defensive
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error")


def _add_routes(app: FastAPI, sim: SimulatorApp) -> None:
    """The endpoints (module docstring): ``/health``, ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``."""
    engine = sim.engine

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        card: dict[str, Any] = {
            "id": sim.name,
            "object": "model",
            "created": sim.created,
            "owned_by": "spec-auditor",
            "root": sim.name,
            "parent": None,
            "max_model_len": engine.max_context,
        }
        if sim.expose:
            card["simulator"] = engine.describe()
        return JSONResponse({"object": "list", "data": [card]}, headers=sim.extra_headers())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await chat_completion(sim, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion(sim, request)


def _usage(prompt_tokens: int, results: Iterable[ChoiceResult]) -> dict:
    """The ``usage`` block: prompt, completion and total tokens."""
    c = sum(len(r.tokens) for r in results)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": c, "total_tokens": prompt_tokens + c}


# -- chat ----------------------------------------------------------------------------------------
async def chat_completion(sim: SimulatorApp, request: Request) -> Response:
    """``POST /v1/chat/completions``: validate the request, draw its fault, then answer it whole or
    as server-sent events (:meth:`SimulatorApp.sse`)."""
    req: ChatCompletionRequest = await _parse(request, ChatCompletionRequest)
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
        entry = sim.chat_logprobs()
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
            "choices": choices, "usage": _usage(prompt_tokens, results)}


def _chat_stream(sim: SimulatorApp, req: ChatCompletionRequest, rid: str, created: int, prompt_tokens: int,
                 jobs: list[dict], top_n: int | None) -> AsyncGenerator[dict | list[dict]]:
    """The ``chat.completion.chunk`` events of a streamed chat request (:meth:`SimulatorApp.stream_jobs`)."""
    engine = sim.engine
    mode = sim.reasoning
    rfield = sim.reasoning_field
    streams = {i: _Stream(engine) for i in range(req.n)}
    entries = {i: sim.chat_logprobs() for i in range(req.n)}
    r_streams = {i: _Stream(engine) for i in range(req.n)}  # reasoning text, decoded apart

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
    usage_fn = (lambda results: {**base([]), "usage": _usage(prompt_tokens, results)}) if include_usage else None
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
    req: CompletionRequest = await _parse(request, CompletionRequest)
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
                lp = sim.legacy_logprobs(ptoks + r.tokens, 0)
            else:
                lp = sim.legacy_logprobs(r.tokens, 0)
        choice = {"index": idx, "text": ptext + r.text, "logprobs": lp, "finish_reason": r.finish_reason}
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = plan.prompt_logprobs[pi]
        if req.return_token_ids:
            choice["prompt_token_ids"] = list(plan.encoded[pi][0])
            choice["token_ids"] = [t.token_id for t in r.tokens]
        choices.append(choice)
    return {"id": rid, "object": "text_completion", "created": created, "model": sim.name,
            "choices": choices, "usage": _usage(plan.prompt_tokens, all_res.values())}


def _completion_stream(sim: SimulatorApp, req: CompletionRequest, plan: _CompletionRequestPlan, rid: str,
                       created: int) -> AsyncGenerator[dict | list[dict]]:
    """The ``text_completion`` events of a streamed completions request: the echoed prompts and the
    ``max_tokens`` 0 choices first, then the generated chunks (:meth:`SimulatorApp.stream_jobs`)."""
    engine = sim.engine
    top_n = req.logprobs
    streams = {idx: _Stream(engine) for idx, _ in plan.meta}
    offsets = {idx: len(plan.echo_prefix(pi)[0]) for idx, pi in plan.meta}
    acc_bytes = {idx: b"" for idx, _ in plan.meta}

    def base(choices: list[dict]) -> dict:
        return {"id": rid, "object": "text_completion", "created": created, "model": sim.name, "choices": choices}

    def make_chunk(i: int, part: list[TokenInfo]) -> dict:
        lp = None
        if top_n is not None:
            lp = sim.legacy_logprobs(part, offsets[i], acc_bytes[i])
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
            lp = sim.legacy_logprobs(ptoks, 0) if top_n is not None else None
            preface.append(base([{"index": idx, "text": ptext, "logprobs": lp, "finish_reason": None}]))
    done_idx = {j["index"] for j in plan.jobs}
    for idx, _ in plan.meta:
        if idx not in done_idx:  # max_tokens == 0
            preface.append(base([{"index": idx, "text": "", "logprobs": None, "finish_reason": "length"}]))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def usage_fn(results: list[ChoiceResult]) -> dict:
        return {**base([]), "usage": _usage(plan.prompt_tokens, results)}

    return sim.stream_jobs([dict(j) for j in plan.jobs], make_chunk, make_final,
                           usage_fn if include_usage else None, preface)


class ServerThread:
    """uvicorn serving ``app`` in a daemon thread; use as a context manager.

    Attributes:
        base_url: ``http://HOST:PORT/v1`` (what the ``openai`` client takes).

    Raises:
        RuntimeError: the server did not start within ``timeout`` seconds.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int | None = None, timeout: float = 30.0,
                 log_level: str = "warning"):
        import uvicorn

        self.host = host
        self.port = port or free_port(host)
        self.config = uvicorn.Config(app, host=host, port=self.port, log_level=log_level, lifespan="off",
                                     timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name=f"simulator-{self.port}")
        self.timeout = timeout

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> ServerThread:
        """Start serving; returns once uvicorn accepts connections (RuntimeError after ``timeout``)."""
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > self.timeout:
                raise RuntimeError(f"simulator did not start on {self.host}:{self.port} within {self.timeout}s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread (at most ``timeout`` seconds)."""
        self.server.should_exit = True
        self.thread.join(timeout=self.timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int | None = None) -> ServerThread:
    """Start uvicorn with ``app`` in a background thread on a free loopback port; returns the handle."""
    return ServerThread(app, host, port).start()
