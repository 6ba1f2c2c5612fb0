"""Loopback endpoints that never answer like an API (issue 37 items 3 and 12), on a stdlib HTTP server
in a thread (no simulator, no model): every POST and GET gets the same answer.

Modes:
- ``401``: HTTP 401 with OpenAI's error object ("Incorrect API key provided ...").
- ``wrong-model``: HTTP 404 with vLLM's error object for a model the server lacks.
- ``html``: HTTP 200, ``text/html``: a gateway's sign-in page (title "Sign in · Example Gateway").
- ``redirect``: HTTP 307 to :data:`REDIRECT_TO` (the API moved; redirects are not followed).
- ``500``: HTTP 500 with a plain-text body.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY_MESSAGE = "Incorrect API key provided: sk-wr***ng. You can find your API key at https://example.com/keys."
MODEL_MESSAGE = "The model `m` does not exist."
HTML_TITLE = "Sign in · Example Gateway"
REDIRECT_TO = "https://api.example.com/openai/v1/chat/completions"

_ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "401": (401, {"Content-Type": "application/json"}, json.dumps(
        {"error": {"message": KEY_MESSAGE, "type": "invalid_request_error", "code": "invalid_api_key"}}).encode()),
    "wrong-model": (404, {"Content-Type": "application/json"}, json.dumps(
        {"object": "error", "message": MODEL_MESSAGE, "type": "NotFoundError", "param": None, "code": 404}).encode()),
    "html": (200, {"Content-Type": "text/html; charset=utf-8"},
             f"<!DOCTYPE html><html><head><title>{HTML_TITLE}</title></head><body><form>...</form></body></html>".encode()),
    "redirect": (307, {"Location": REDIRECT_TO, "Content-Length": "0"}, b""),
    "500": (500, {"Content-Type": "text/plain"}, b"upstream exploded"),
}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def error_server(mode: str) -> Iterator[tuple[str, list[str]]]:
    """Serve ``mode`` on 127.0.0.1; yields ``(base_url, paths requested)``; stopped on exit."""
    status, headers, body = _ANSWERS[mode]
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            seen.append(self.path)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = _answer
        do_GET = _answer

        def log_message(self, *_a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", seen
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)
