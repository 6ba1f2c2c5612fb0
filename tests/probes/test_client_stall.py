"""Issue 37, item 9: a provider that stalls (endless SSE keep-alives, a JSON body trickling one byte at
a time) ends each attempt as ``stalled`` after ``response_limits.stall_timeout_s``, not retried;
an honest slow stream that keeps sending data events is not cut (``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from probes.client import ProbeClient
from probes.config import Capabilities, ProviderConfig, ResponseLimits, RetryPolicy

STALL_S = 0.6


def _config() -> ProviderConfig:
    return ProviderConfig(
        name="stall", base_url="http://stall.invalid/v1", model="m", api="chat",
        capabilities=Capabilities(streaming=True), retry=RetryPolicy(max_attempts=4, backoff_initial_s=0.01),
        response_limits=ResponseLimits(stall_timeout_s=STALL_S), timeout_s=30.0,
    )


async def _keepalives() -> AsyncIterator[bytes]:
    yield b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
    while True:  # endless keep-alives: comments and empty data lines
        await asyncio.sleep(0.05)
        yield b": ping\n\ndata:\n\n"


async def _trickle() -> AsyncIterator[bytes]:
    body = json.dumps({"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}).encode()
    for b in body:
        await asyncio.sleep(0.05)
        yield bytes([b])


async def _slow_honest() -> AsyncIterator[bytes]:
    for i in range(6):  # 1.5 s in all (longer than the stall timeout), a data event every 0.25 s
        await asyncio.sleep(0.25)
        yield ('data: ' + json.dumps({"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]})
               + "\n\n: ping\n\n").encode()
    yield b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


def _handler(kind: str):
    def handle(request: httpx.Request) -> httpx.Response:
        if kind == "keepalive":
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_keepalives())
        if kind == "trickle":
            return httpx.Response(200, headers={"content-type": "application/json"}, content=_trickle())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_slow_honest())
    return handle


async def _send(kind: str, stream: bool):
    async with ProbeClient(_config(), transport=httpx.MockTransport(_handler(kind)), api_key="") as c:
        t0 = time.monotonic()
        res = await c.send({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                            "stream": stream})
        return res, time.monotonic() - t0


@pytest.mark.parametrize("kind,stream", [("keepalive", True), ("trickle", False)])
def test_a_stalling_answer_ends_as_stalled_once(kind: str, stream: bool) -> None:
    res, took = asyncio.run(_send(kind, stream))
    assert not res.success and res.error_kind == "stalled"
    assert res.n_attempts == 1  # not retried: a stalling provider stalls again
    assert STALL_S <= took < STALL_S + 1.5
    assert "stall_timeout_s" in (res.error or "")
    if kind == "keepalive":
        assert "no data event" in (res.error or "")
    else:
        assert "still incomplete" in (res.error or "")


def test_a_slow_stream_that_keeps_sending_data_is_not_stalled() -> None:
    res, took = asyncio.run(_send("honest", True))
    assert res.success, res.error
    assert took > STALL_S * 2  # it ran well past one stall timeout
    assert res.text == "w0 w1 w2 w3 w4 w5 "
