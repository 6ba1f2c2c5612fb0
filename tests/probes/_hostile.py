"""A hostile OpenAI-compatible endpoint on loopback, and a probe run that reports its peak RSS.

Two commands (each its own process, so the server's memory never counts against the client's):

``python tests/probes/_hostile.py serve --mode MODE --size BYTES``
    Listens on 127.0.0.1 (a free port, printed as ``PORT <n>`` on stdout) and answers every
    POST with a body generated lazily in 64 KiB pieces (never held in memory): ``json`` = one
    ``BYTES``-long JSON object (a ``choices`` array padded with whitespace), ``sse`` = an SSE
    stream of token chunks that ignores ``max_tokens`` and never sends ``[DONE]``, ``line`` =
    one ``data:`` line of ``BYTES`` without a line ending.

``python tests/probes/_hostile.py probe --port N --requests R --concurrency C [--cap BYTES] [--stream]``
    Sends R chat requests through :class:`probes.client.ProbeClient` and prints one JSON line:
    ``maxrss_start_mb``, ``maxrss_end_mb`` (``resource.getrusage`` peak RSS, MiB), the error kinds
    and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

PIECE = 64 * 1024


def _maxrss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / (1024.0 * 1024.0)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mode: str, size: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            ctype = b"application/json" if mode == "json" else b"text/event-stream"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
            sent = 0
            if mode == "json":
                first = b'{"id": "x", "object": "chat.completion", "choices": ['
                pieces = [first]
                filler = b" " * PIECE
            elif mode == "sse":
                ev = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}]}\n\n'
                filler = ev * (PIECE // len(ev))
                pieces = []
            else:
                pieces = [b"data: "]
                filler = b"x" * PIECE
            while sent < size:
                chunk = pieces.pop(0) if pieces else filler
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(mode: str, size: int) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, mode, size), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    async with server:
        await server.serve_forever()


async def _probe(port: int, requests: int, concurrency: int, cap: int | None, stream: bool, timeout_s: float) -> dict:
    from probes.client import ProbeClient
    from probes.config import ProviderConfig, RetryPolicy

    limits = {"max_response_bytes": cap} if cap else {}
    cfg = ProviderConfig(
        name="hostile",
        base_url=f"http://127.0.0.1:{port}/v1",
        model="m",
        timeout_s=timeout_s,
        rate_limits={"concurrency": concurrency},
        retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05),
        response_limits=limits,
    )
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    if stream:
        payload["stream"] = True
    start = _maxrss_mb()
    t0 = time.perf_counter()
    kinds: dict[str, int] = {}
    read = 0
    async with ProbeClient(cfg) as client:
        async for res in client.map((f"k{i}", payload) for i in range(requests)):
            kinds[str(res.error_kind)] = kinds.get(str(res.error_kind), 0) + 1
            read += sum(a.bytes_read for a in res.attempts)
    return {
        "maxrss_start_mb": round(start, 1),
        "maxrss_end_mb": round(_maxrss_mb(), 1),
        "kinds": kinds,
        "bytes_read_mb": round(read / 2**20, 1),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def start_server(mode: str, size: int, *, timeout_s: float = 30.0) -> tuple[subprocess.Popen[str], int]:
    """Start ``serve --mode MODE --size BYTES`` of this file in its own process; returns (process, port).

    Raises:
        RuntimeError: it did not print its port within ``timeout_s`` seconds (the process is killed).
    """
    here = Path(__file__).resolve()
    proc = subprocess.Popen([sys.executable, str(here), "serve", "--mode", mode, "--size", str(size)],
                            stdout=subprocess.PIPE, text=True, cwd=here.parents[2])
    deadline = time.monotonic() + timeout_s
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        if line.startswith("PORT "):
            return proc, int(line.split()[1])
    proc.kill()
    raise RuntimeError(f"hostile server ({mode}) did not start: {line!r}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--mode", choices=["json", "sse", "line"], default="json")
    s.add_argument("--size", type=int, default=2 * 1024**3)
    p = sub.add_parser("probe")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--cap", type=int, default=None)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        asyncio.run(_serve(a.mode, a.size))
    else:
        print(json.dumps(asyncio.run(_probe(a.port, a.requests, a.concurrency, a.cap, a.stream, a.timeout))), flush=True)


if __name__ == "__main__":
    main()
