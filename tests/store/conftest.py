"""Fixtures for the store/runner tests: database URLs (SQLite, PostgreSQL) and a fault-injecting
OpenAI-compatible HTTP server (real TCP, so subprocesses can use it)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

PG_CANDIDATES = (
    os.environ.get("AUDITOR_TEST_PG_URL", ""),
    "postgresql+psycopg://root@127.0.0.1:5432/test",
    "postgresql+psycopg://postgres@127.0.0.1:5432/test",
)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A fresh SQLite file URL under the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'auditor.db'}"


def _pg_base_url() -> str | None:
    import sqlalchemy as sa

    for url in PG_CANDIDATES:
        if not url:
            continue
        try:
            eng = sa.create_engine(url, connect_args={"connect_timeout": 3})
            with eng.connect() as c:
                c.execute(sa.text("select 1"))
            eng.dispose()
            return url
        except Exception:
            continue
    return None


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A SQLAlchemy URL whose search_path is a fresh schema in database ``test``; the schema is
    dropped afterwards (never touches other schemas). Skips when PostgreSQL is unreachable."""
    import sqlalchemy as sa

    base = _pg_base_url()
    if base is None:
        pytest.skip("PostgreSQL on 127.0.0.1:5432 (database test) is unreachable")
    schema = f"auditor_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{base}?options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


# ---------------------------------------------------------------------------------------------
# Fault-injecting OpenAI-compatible server
# ---------------------------------------------------------------------------------------------

WORDS = ["the", " cat", " sat", " on", " a", " mat", ".", " It", " was", " warm", "\n", " and", " quiet", "!"]


def _completion_tokens(payload: dict) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """Deterministic tokens for a request: depends only on the prompt, seed and max_tokens."""
    prompt = json.dumps(payload.get("messages") or payload.get("prompt"), sort_keys=True)
    seed = payload.get("seed") if float(payload.get("temperature") or 0) > 0 else None
    h = hashlib.sha256(f"{prompt}|{seed}".encode()).digest()
    rng = random.Random(h)
    n = min(int(payload.get("max_tokens") or 8), 12)
    k = int(payload.get("top_logprobs") or 0)
    out = []
    for _ in range(n):
        chosen = rng.randrange(len(WORDS))
        lp = math.log(rng.uniform(0.3, 0.95))
        alts = [(WORDS[chosen], lp)]
        others = [w for i, w in enumerate(WORDS) if i != chosen]
        rng.shuffle(others)
        for j in range(max(0, k - 1)):
            alts.append((others[j], lp - 1.0 - j))
        out.append((WORDS[chosen], lp, alts[:k]))
    return out


def _lp_entry(tok: str, lp: float, alts: list[tuple[str, float]]) -> dict:
    return {
        "token": tok,
        "logprob": lp,
        "bytes": list(tok.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts],
    }


@dataclass
class FaultServer:
    """Handle of the running server: URL, counters and the fault RNG."""

    base_url: str
    fault_rate: float
    slow_s: float
    delay_s: float
    counts: dict[str, int] = field(default_factory=dict)
    headers_seen: list[dict] = field(default_factory=list)

    def bump(self, k: str) -> None:
        self.counts[k] = self.counts.get(k, 0) + 1


def make_fault_app(state: FaultServer, seed: int = 0):
    """Starlette app: /v1/chat/completions with logprobs, plain or streamed, and faults at
    ``state.fault_rate``: 429 (Retry-After: 0), 500, slow (sleeps ``slow_s``), truncated body or
    stream, malformed JSON."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    rng = random.Random(seed)
    lock = threading.Lock()

    async def chat(request: Request):
        # count the request before reading its body: a client that gave up still sent it
        with lock:
            fault = rng.random() < state.fault_rate
            kind = rng.choice(["429", "500", "slow", "truncated", "malformed"]) if fault else "ok"
        state.bump(kind)
        state.headers_seen.append({k.lower(): v for k, v in request.headers.items()})
        payload = await request.json()
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
        stream = bool(payload.get("stream"))
        if kind == "429":
            return JSONResponse({"error": {"message": "rate limited"}}, status_code=429, headers={"Retry-After": "0"})
        if kind == "500":
            return JSONResponse({"error": {"message": "internal error"}}, status_code=500)
        if kind == "slow":
            await asyncio.sleep(state.slow_s)
        toks = _completion_tokens(payload)
        text = "".join(t for t, _, _ in toks)
        want_lp = bool(payload.get("logprobs"))
        usage = {"prompt_tokens": 11, "completion_tokens": len(toks), "total_tokens": 11 + len(toks)}
        if not stream:
            body = {
                "id": "cmpl-x",
                "object": "chat.completion",
                "model": payload.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length",
                        "logprobs": {"content": [_lp_entry(*t) for t in toks]} if want_lp else None,
                    }
                ],
                "usage": usage,
            }
            raw = json.dumps(body)
            if kind == "truncated":
                raw = raw[: len(raw) // 2]
            elif kind == "malformed":
                raw = raw.replace('"choices":', '"choices" ', 1)
            return Response(raw, media_type="application/json")

        async def gen():
            yield 'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
            for i, t in enumerate(toks):
                ch = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": t[0]},
                            "finish_reason": "length" if i == len(toks) - 1 else None,
                            "logprobs": {"content": [_lp_entry(*t)]} if want_lp else None,
                        }
                    ],
                }
                line = json.dumps(ch)
                if kind == "malformed" and i == 1:
                    line = line[:-3]
                yield f"data: {line}\n\n"
                if kind == "truncated" and i == len(toks) // 2:
                    return
            yield (
                "data: "
                + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage})
                + "\n\n"
            )
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture
def fault_server(request) -> Iterator[FaultServer]:
    """Run the fault app with uvicorn on a free 127.0.0.1 port in a background thread.

    Parametrize with ``@pytest.mark.parametrize("fault_server", [dict(fault_rate=..)], indirect=True)``.
    """
    import uvicorn

    opts = getattr(request, "param", None) or {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    state = FaultServer(
        base_url=f"http://127.0.0.1:{port}/v1",
        fault_rate=float(opts.get("fault_rate", 0.2)),
        slow_s=float(opts.get("slow_s", 1.5)),
        delay_s=float(opts.get("delay_s", 0.0)),
    )
    app = make_fault_app(state, seed=int(opts.get("seed", 0)))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=30))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("fault server did not start")
        time.sleep(0.02)
    try:
        yield state
    finally:
        server.should_exit = True
        th.join(timeout=10)
        sock.close()


# ---------------------------------------------------------------------------------------------
# The provider simulator (simulator) with faults, serving the tiny random model
# ---------------------------------------------------------------------------------------------


@dataclass
class SimServer:
    """A running simulator: ``base_url``, the served model name and its ``FaultInjector``."""

    base_url: str
    model: str
    faults: object


@pytest.fixture
def sim_server(request, tiny_lm) -> Iterator[SimServer]:
    """``simulator`` (profile honest-fp32, the ``tiny_lm`` fixture) on a free loopback
    port with seeded faults: 429 (Retry-After: 0), 500, slow (2.5 s, past the tests' 2 s client
    timeout), truncated and malformed answers. Parametrize with ``dict(rate=..)`` (default 0.2)."""
    sim = pytest.importorskip("simulator.server")
    from simulator.faults import FaultInjector

    opts = getattr(request, "param", None) or {}
    inj = FaultInjector(rate=float(opts.get("rate", 0.2)), seed=int(opts.get("seed", 1)), delay_s=2.5, retry_after_s=0)
    app = sim.create_app("honest-fp32", tiny_lm, served_model_name="tiny", faults=inj, seed=0)
    with sim.ServerThread(app) as srv:
        yield SimServer(base_url=srv.base_url, model="tiny", faults=inj)
