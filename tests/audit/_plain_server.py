"""A plain OpenAI-compatible chat server written apart from the simulator, for pipeline tests.

Every request is answered "The answer is 4." (cut at ``max_tokens`` tokens and before a ``stop``
string), plainly or as SSE, with ``n`` identical choices and, when asked, logprobs whose listed
``top_logprobs`` carry **all** the probability mass (they sum to 1 at every position: the chosen
token 0.4, the listed alternatives the remaining 0.6) — the known real-provider bug of issue 37,
item 1 (a temperature-1 answer whose alternatives leave nothing unlisted). Nothing else is wrong
with it: it honours seeds trivially (the answer never changes) and sends no ``usage``.

Serve it with ``simulator.server.ServerThread(create_plain_app())``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

ANSWER = ("The", " answer", " is", " 4", ".")
#: Listed probabilities at every position: the chosen token first; they sum to exactly 1, and none is
#: below a tenth of the largest (so the pre-flight's low-probability region is empty too).
MASS = (0.4, 0.2, 0.15, 0.13, 0.12)
_ALTS = (" maybe", " not", " perhaps", " so")


def _entry(tok: str, k: int) -> dict[str, Any]:
    alts = [(tok, MASS[0])] + [(a, p) for a, p in zip(_ALTS, MASS[1:], strict=True)]
    if k >= 1:  # the listed alternatives carry all the mass: the last one listed takes the rest
        alts = alts[:k]
        rest = 1.0 - sum(p for _t, p in alts[:-1])
        alts[-1] = (alts[-1][0], rest) if len(alts) > 1 else alts[-1]
    return {"token": tok, "logprob": math.log(MASS[0]), "bytes": list(tok.encode()),
            "top_logprobs": [{"token": t, "logprob": math.log(p), "bytes": list(t.encode())} for t, p in alts[:k]]}


def _tokens(body: dict[str, Any]) -> list[str]:
    toks = list(ANSWER)[: max(1, int(body.get("max_tokens") or len(ANSWER)))]
    stop = body.get("stop")
    for s in [stop] if isinstance(stop, str) else list(stop or []):
        text = ""
        for i, t in enumerate(toks):
            if s in text + t:
                toks = toks[:i]
                break
            text += t
    return toks


def create_plain_app(model: str = "plain") -> FastAPI:
    """The FastAPI app (``/v1/models``, ``/v1/chat/completions``)."""
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        toks = _tokens(body)
        k = int(body.get("top_logprobs") or 0) if body.get("logprobs") else -1
        finish = "length" if len(toks) >= int(body.get("max_tokens") or 10**9) else "stop"
        n = int(body.get("n") or 1)
        if body.get("stream"):
            def events() -> Any:
                for i in range(n):
                    yield "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
                        {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}) + "\n\n"
                    for t in toks:
                        ch: dict[str, Any] = {"index": i, "delta": {"content": t}, "finish_reason": None}
                        if k >= 0:
                            ch["logprobs"] = {"content": [_entry(t, k)]}
                        yield "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [ch]}) + "\n\n"
                    yield "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
                        {"index": i, "delta": {}, "finish_reason": finish}]}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        choices = []
        for i in range(n):
            c: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": "".join(toks)},
                                 "finish_reason": finish}
            if k >= 0:
                c["logprobs"] = {"content": [_entry(t, k) for t in toks]}
            choices.append(c)
        return JSONResponse({"id": "plain", "object": "chat.completion", "model": model, "choices": choices})

    return app
