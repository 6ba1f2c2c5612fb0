"""The client over real HTTP on loopback (uvicorn + the benchmark's trivial ASGI app)."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
import time
from pathlib import Path

import pytest

from probes.client import ProbeClient
from probes.config import ProviderConfig

BENCH = Path(__file__).parents[2] / "benchmarks" / "client.py"


@pytest.fixture(scope="module")
def server_port():
    import uvicorn

    spec = importlib.util.spec_from_file_location("bench_client", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(mod.app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield port
    server.should_exit = True
    th.join(timeout=10)


@pytest.mark.parametrize("stream", [False, True])
def test_loopback_requests(server_port: int, stream: bool) -> None:
    cfg = ProviderConfig(name="loop", base_url=f"http://127.0.0.1:{server_port}/v1", model="m", rate_limits={"concurrency": 16}, timeout_s=10)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **({"stream": True} if stream else {})}

    async def go():
        async with ProbeClient(cfg) as c:
            return [r async for r in c.map((f"k{i}", payload) for i in range(80))]

    results = asyncio.run(asyncio.wait_for(go(), 60))
    assert len(results) == 80 and all(r.success and r.n_attempts == 1 for r in results)
    if stream:
        assert all(r.text == "xxxx" and r.tokens_per_chunk == (1, 1, 1, 1) and r.ttft_s is not None and len(r.chunk_gaps_s) == 3 for r in results)
    else:
        assert all(r.text == "ok" and r.usage["completion_tokens"] == 1 for r in results)
