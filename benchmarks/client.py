"""Benchmark: requests/s of ``probes.client.ProbeClient`` against a trivial local endpoint.

    python benchmarks/client.py [--requests 2000] [--concurrency 64] [--repeats 3] [--json]

A minimal ASGI app (no model, a fixed chat-completion body or a 4-chunk SSE stream) runs under
uvicorn in a separate process on 127.0.0.1; the client sends ``--requests`` requests with
``--concurrency`` in flight through the full path (payload encoding, semaphore, tenacity,
timing, parsing, records) and the figure is completed requests per second of wall time.
Plain and streamed batches are interleaved (``--repeats`` rounds, order alternating), and each
mode reports its median with the min-max spread and the 1-minute load average during the run.
Target (issues 4 and 15): >= 300 requests/s at concurrency 64, so the client is never the bottleneck.

The server uses uvicorn's ``http="auto"``: ``httptools`` when installed (the ``bench`` extra
declares it; faster), else the pure-Python ``h11`` that uvicorn always brings. The report names the
one used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from reference.loopback import free_port

_BODY = json.dumps(
    {
        "id": "bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
_CHUNK = {"id": "b", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
_STREAM = ("".join(f"data: {json.dumps(_CHUNK)}\n\n" for _ in range(4)) + "data: [DONE]\n\n").encode()


async def app(scope, receive, send):
    """ASGI app: POST .../chat/completions → fixed body (or SSE when the request asks to stream)."""
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    stream = b'"stream": true' in body or b'"stream":true' in body
    payload = _STREAM if stream else _BODY
    ctype = b"text/event-stream" if stream else b"application/json"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def http_impl() -> str:
    """The HTTP implementation uvicorn's ``http="auto"`` picks here: ``httptools`` if importable, else ``h11``."""
    import importlib.util

    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def _serve(port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="auto", loop="auto")


def _wait_up(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"benchmark server did not start on port {port} within {timeout_s}s")


async def _run(port: int, n: int, concurrency: int, stream: bool, server_pid: int = 0) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from probes.client import ProbeClient
    from probes.config import ProviderConfig

    cfg = ProviderConfig.model_validate(
        {
            "name": "bench",
            "base_url": f"http://127.0.0.1:{port}/v1",
            "model": "m",
            "rate_limits": {"concurrency": concurrency},
            "timeout_s": 30,
        }
    )
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0.0}
    if stream:
        payload["stream"] = True
    async with ProbeClient(cfg) as client:
        # warm-up: open the connection pool
        async for _ in client.map((f"w{i}", payload) for i in range(concurrency)):
            pass
        ok = 0
        srv0 = _proc_cpu_s(server_pid)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        async for r in client.map((f"r{i}", payload) for i in range(n)):
            ok += r.success
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        srv = _proc_cpu_s(server_pid) - srv0
    return {
        "requests": n,
        "ok": ok,
        "concurrency": concurrency,
        "stream": stream,
        "wall_s": round(wall, 3),
        "requests_per_s": round(n / wall, 1),
        "client_cpu_ms_per_request": round(1000 * cpu / n, 3),
        "server_cpu_ms_per_request": round(1000 * srv / n, 3) if srv > 0 else None,
        "requests_per_client_cpu_s": round(n / cpu, 1) if cpu > 0 else None,
        "loadavg_1m": os.getloadavg()[0],
    }


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (Linux /proc; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main(argv: list[str] | None = None) -> int:
    import statistics

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per batch")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds of (plain, stream) batches, >= 3")
    ap.add_argument("--modes", default="plain,stream", help="comma list of plain, stream")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve is not None:
        _serve(args.serve)
        return 0
    if args.repeats < 3:
        ap.error("--repeats must be >= 3")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in ("plain", "stream") for m in modes):
        ap.error(f"--modes {args.modes!r}: use plain, stream or plain,stream")
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        _wait_up(port)
        for rnd in range(args.repeats):
            order = modes if rnd % 2 == 0 else modes[::-1]
            for m in order:
                runs[m].append(asyncio.run(_run(port, args.requests, args.concurrency, m == "stream", server.pid)))
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    res: dict[str, object] = {"http": http_impl(), "cpus": os.cpu_count(), "concurrency": args.concurrency,
                              "requests_per_batch": args.requests, "repeats": args.repeats}
    ok = True
    for m, rs in runs.items():
        rps = [r["requests_per_s"] for r in rs]
        ok = ok and all(r["ok"] == r["requests"] for r in rs)
        res[m] = {
            "requests_per_s": {"median": statistics.median(rps), "min": min(rps), "max": max(rps)},
            "client_cpu_ms_per_request": statistics.median(r["client_cpu_ms_per_request"] for r in rs),
            "server_cpu_ms_per_request": statistics.median(
                [r["server_cpu_ms_per_request"] for r in rs if r["server_cpu_ms_per_request"] is not None] or [0.0]
            ),
            "ok": sum(r["ok"] for r in rs),
            "requests": sum(r["requests"] for r in rs),
            "loadavg_1m": {"mean": round(statistics.mean(r["loadavg_1m"] for r in rs), 2),
                           "max": max(r["loadavg_1m"] for r in rs)},
        }
    if args.json:
        print(json.dumps(res))
    else:
        for m in runs:
            r = res[m]
            assert isinstance(r, dict)
            q = r["requests_per_s"]
            print(
                f"client ({m}): median {q['median']:.0f} requests/s [{q['min']:.0f}-{q['max']:.0f}] over {args.repeats} "
                f"interleaved batches of {args.requests} ({r['ok']}/{r['requests']} ok, concurrency {args.concurrency}) "
                f"— target >= 300"
            )
            print(
                f"  client CPU {r['client_cpu_ms_per_request']} ms/request, server CPU {r['server_cpu_ms_per_request']} "
                f"ms/request ({res['http']}), load average {r['loadavg_1m']['mean']} (max {r['loadavg_1m']['max']}) "
                f"on {os.cpu_count()} CPUs"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
