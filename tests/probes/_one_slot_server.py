"""Loopback OpenAI-style server with one decoding slot that behaves like llama.cpp's server:
whenever another request arrives while one is being answered, the running one is cancelled
(a stream ends without ``data: [DONE]``; a plain request gets HTTP 503). Raw asyncio, HTTP/1.1,
``Connection: close``, 127.0.0.1 only, bounded (request bodies ≤ 64 KiB, ``n_tokens`` chunks).

``tolerant=True`` serves every request to completion (a server that takes concurrency).

``cancel_mode="empty"`` cancels as llama.cpp's server does in its own words (issue 37 item 7): a stream
starts with a role chunk and sends its tokens only once the answer is complete; a cancelled one ends with
``data: [DONE]`` and nothing else (no content, ``finish_reason`` null), and a cancelled plain request
gets HTTP 200 with empty content and ``finish_reason`` null.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class OneSlotServer:
    n_tokens: int = 6
    token_delay_s: float = 0.01
    tolerant: bool = False
    cancel_mode: str = "truncate"
    port: int = 0
    served: int = 0
    cancelled: int = 0
    max_overlap: int = 0
    _active: int = 0
    _current: asyncio.Event | None = None
    _server: asyncio.base_events.Server | None = field(default=None, repr=False)

    async def __aenter__(self) -> OneSlotServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if length > 65536:
                raise ValueError("body too large")
            body = json.loads(await reader.readexactly(length)) if length else {}
            await self._serve(body, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _serve(self, body: dict, writer: asyncio.StreamWriter) -> None:
        cancel = asyncio.Event()
        if not self.tolerant and self._current is not None:
            self._current.set()  # another request waits: cancel the running one
        self._current = cancel
        self._active += 1
        self.max_overlap = max(self.max_overlap, self._active)
        try:
            stream = bool(body.get("stream"))
            toks: list[str] = []
            empty = self.cancel_mode == "empty"
            if stream:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                if empty:
                    role = {"id": "x", "object": "chat.completion.chunk",
                            "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
                    writer.write(f"data: {json.dumps(role)}\n\n".encode())
                    await writer.drain()
            for i in range(self.n_tokens):
                await asyncio.sleep(self.token_delay_s)
                if cancel.is_set():
                    self.cancelled += 1
                    if empty:  # llama.cpp: the running answer ends empty, without a finish reason
                        if stream:
                            writer.write(b"data: [DONE]\n\n")
                        else:
                            out = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                                {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": None}]}).encode()
                            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                         + f"Content-Length: {len(out)}\r\n\r\n".encode() + out)
                        await writer.drain()
                        return
                    if not stream:
                        err = json.dumps({"error": {"message": "request cancelled", "type": "unavailable_error", "code": 503}}).encode()
                        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                                     + f"Content-Length: {len(err)}\r\n\r\n".encode() + err)
                    await writer.drain()
                    return  # stream closed without [DONE]
                tok = f" w{i}"
                toks.append(tok)
                if stream and not empty:
                    ev = {"id": "x", "object": "chat.completion.chunk",
                          "choices": [{"index": 0, "delta": {"content": tok}, "finish_reason": None}]}
                    writer.write(f"data: {json.dumps(ev)}\n\n".encode())
                    await writer.drain()
            self.served += 1
            if stream and empty:  # the whole answer at once, now that it is complete
                for tok in toks:
                    ev = {"id": "x", "object": "chat.completion.chunk",
                          "choices": [{"index": 0, "delta": {"content": tok}, "finish_reason": None}]}
                    writer.write(f"data: {json.dumps(ev)}\n\n".encode())
            if stream:
                ev = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
                writer.write(f"data: {json.dumps(ev)}\n\ndata: [DONE]\n\n".encode())
            else:
                out = json.dumps({"id": "x", "object": "chat.completion",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(toks)}, "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": len(toks), "total_tokens": 3 + len(toks)}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             + f"Content-Length: {len(out)}\r\n\r\n".encode() + out)
            await writer.drain()
        finally:
            self._active -= 1
            if self._current is cancel:
                self._current = None


@contextlib.contextmanager
def threaded_server(**kw: object) -> Iterator[OneSlotServer]:
    """Run a :class:`OneSlotServer` on its own thread and event loop (for code that calls
    ``asyncio.run`` itself: the CLI, ``auditor.check.runner.run_probes``); stopped on exit."""
    ready, stop = threading.Event(), threading.Event()
    box: dict[str, OneSlotServer] = {}

    def serve() -> None:
        async def main() -> None:
            async with OneSlotServer(**kw) as srv:  # type: ignore[arg-type]
                box["srv"] = srv
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.02)

        asyncio.run(main())

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("one-slot server did not start")
        yield box["srv"]
    finally:
        stop.set()
        th.join(10)
