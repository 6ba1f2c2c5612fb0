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
  carries ``simulator`` = ``simulator.openai_format.step_stats`` (the true tokens per round, for validating
  ``auditor.detectors.speculation``);
- ``GET /health``.

Every invalid request (unknown model, ``top_logprobs`` > 20, negative ``max_tokens``, malformed
JSON, wrong types, unknown route) gets an OpenAI error body ``{"error": {"message", "type",
"param", "code"}}`` with a 4xx status, never a 500. The profile, the real model and a system
fingerprint appear only with ``expose_profile`` (header ``x-simulator-profile``, ``/v1/models``
metadata, ``system_fingerprint``).

Use ``create_app(...)`` in-process (httpx ``ASGITransport``, ``TestClient``) or with uvicorn
(``auditor serve``, :func:`serve_in_thread`).

This module assembles the app (options checked, engine built, error handlers and routes) and runs it
in a thread; the endpoints' work is in ``simulator.endpoints``, the per-request checks, generation,
faults and SSE delivery in ``simulator.request_handling``, the wire format in
``simulator.openai_format``, the serving options' checks in ``simulator.serving_options``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from reference.loopback import free_port
from simulator.endpoints import chat_completion, completion
from simulator.engine import SimulatorEngine
from simulator.faults import FaultInjector
from simulator.openai_format import error_response
from simulator.profiles import DEFAULT_REASONING_BUDGET, Profile, get_profile
from simulator.request_handling import SimulatorApp
from simulator.schemas import InvalidRequest
from simulator.serving_options import check_enforce, check_serving_options

#: ``create_app(max_tokens_default=...)``: the completion length of a chat request without ``max_tokens``.
DEFAULT_MAX_TOKENS = 256


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
            tokens; :class:`simulator.openai_format.VllmLogprobs`). Legacy completions are unchanged.
        reasoning: reasoning mode of chat completions (None = plain chat): the template opens the
            assistant turn with ``simulator.reasoning.REASONING_OPENER``, the model writes the reasoning, a token
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
    check_serving_options(stream_chunking=stream_chunking, stream_interval_ms=stream_interval_ms,
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
