"""Client: retryable in-band errors, per-choice stream counting, stream usage, resource bounds (issue 13)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from probes.client import ProbeClient, chunk_tokens_by_choice, stream_token_cap
from probes.config import ProviderConfig, ResponseLimits, RetryPolicy

OK_BODY = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _cfg(**kw) -> ProviderConfig:
    base = dict(name="mock", base_url="http://mock.test/v1", model="m", timeout_s=2.0,
                retry=RetryPolicy(max_attempts=4, backoff_initial_s=0.001, backoff_max_s=0.002))
    base.update(kw)
    return ProviderConfig(**base)


async def _nosleep(_s: float) -> None:
    return None


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def _send(cfg: ProviderConfig, handler, payload=PAYLOAD, n: int = 1, **kw):
    async def go():
        async with ProbeClient(cfg, transport=httpx.MockTransport(handler), sleep=_nosleep, **kw) as c:
            return [await c.send(payload, key=f"k{i}") for i in range(n)]

    out = run(go())
    return out[0] if n == 1 else out


class _Gen(httpx.AsyncByteStream):
    """A lazily generated body (never held whole in memory)."""

    def __init__(self, parts, delay: float = 0.0) -> None:
        self.parts, self.delay = parts, delay

    async def __aiter__(self):
        for p in self.parts:
            if self.delay:
                await asyncio.sleep(self.delay)
            yield p


def _sse(chunks: list[dict], done: bool = True) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + ("data: [DONE]\n\n" if done else "")).encode()


# -- in-band errors -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("first", "retried"),
    [
        ({"error": {"message": "The server is overloaded", "type": "server_error"}}, True),
        ({"error": {"message": "x", "code": 503}}, True),
        ({"error": {"message": "slow down", "type": "rate_limit_exceeded"}}, True),
        ({"object": "error", "message": "Service Unavailable", "code": 503}, True),
        ({"error": {"message": "prompt too long", "type": "invalid_request_error", "code": 400}}, False),
    ],
)
def test_error_object_in_200_body_retried_when_transient(first: dict, retried: bool) -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(200, json=first if calls["n"] == 1 else OK_BODY)

    res = _send(_cfg(), handler)
    assert res.attempts[0].error_kind == "provider_error"
    assert res.success is retried and res.n_attempts == (2 if retried else 1)


@pytest.mark.parametrize(
    ("err_event", "retried"),
    [
        ('event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n', True),
        ('data: {"error": {"message": "engine crashed", "code": 500}}\n\n', True),
        ('data: {"error": {"message": "bad logprobs", "code": 400, "type": "invalid_request_error"}}\n\ndata: [DONE]\n\n', False),
    ],
)
def test_sse_error_event_mid_stream(err_event: str, retried: bool) -> None:
    calls = {"n": 0}
    good = [{"choices": [{"index": 0, "delta": {"content": "a"}}]}, {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}]}]

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(200, stream=_Gen([_sse(good[:1], done=False), err_event.encode()]))
        return httpx.Response(200, stream=_Gen([_sse(good)]))

    res = _send(_cfg(), handler, {**PAYLOAD, "stream": True})
    assert res.attempts[0].error_kind == "provider_error"
    assert res.success is retried and (res.text == "ab") is retried


# -- n > 1 streams ----------------------------------------------------------------------------

def test_tokens_per_chunk_counted_per_choice_index() -> None:
    def ch(i, toks):
        return {"choices": [{"index": i, "delta": {"content": "".join(toks)}, "logprobs": {"content": [{"token": t, "logprob": -0.1} for t in toks]}}]}

    chunks = [ch(0, ["a"]), ch(1, ["x", "y", "z"]), ch(0, ["b", "c"]), ch(1, ["w"]), ch(0, ["d", "e", "f", "g"])]
    both = {"choices": [{"index": 1, "delta": {"content": "q"}}, {"index": 0, "delta": {"content": "h"}, "finish_reason": "stop"}]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Gen([_sse([*chunks, both])]))

    res = _send(_cfg(), handler, {**PAYLOAD, "n": 2, "stream": True})
    assert res.success and res.text == "abcdefgh"
    assert res.tokens_per_chunk == (1, 2, 4, 1)  # choice 0 only, whatever the chunk order
    assert dict(res.attempts[0].tokens_per_chunk_by_choice) == {0: (1, 2, 4, 1), 1: (3, 1, 1)}
    assert len(res.chunk_gaps_s) == 3
    assert chunk_tokens_by_choice("chat", both) == {1: 1, 0: 1}
    json.dumps(res.attempts[0].to_dict())


# -- usage in streams -------------------------------------------------------------------------

def test_stream_options_sent_and_usage_flag() -> None:
    seen: list[dict] = []
    usage = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        chunks = [{"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}]
        if body.get("stream_options", {}).get("include_usage"):
            chunks.append({"choices": [], "usage": usage})
        return httpx.Response(200, stream=_Gen([_sse(chunks)]))

    res = _send(_cfg(), handler, {**PAYLOAD, "stream": True, "stream_options": {"include_usage": True}})
    assert res.success and res.usage == usage and not res.usage_missing
    res2 = _send(_cfg(), handler, {**PAYLOAD, "stream": True})
    assert res2.success and res2.usage is None and res2.usage_missing


def test_stream_options_rejected_with_400_falls_back_once_per_client() -> None:
    seen: list[bool] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append("stream_options" in body)
        if "stream_options" in body:
            return httpx.Response(400, json={"error": {"message": "Unrecognized request argument supplied: stream_options"}})
        return httpx.Response(200, stream=_Gen([_sse([{"choices": [{"index": 0, "delta": {"content": "a"}}]}])]))

    payload = {**PAYLOAD, "stream": True, "stream_options": {"include_usage": True}}
    first, second = _send(_cfg(), handler, payload, n=2)
    assert seen == [True, False, False]  # one rejected attempt, then never sent again
    assert first.success and first.n_attempts == 2 and first.stream_options_dropped and "stream_options" not in first.request
    assert first.attempts[0].http_status == 400 and first.attempts[0].retryable
    assert second.success and second.n_attempts == 1 and second.usage_missing


def test_other_400_is_still_final() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "max_tokens too large"}})

    res = _send(_cfg(), handler, {**PAYLOAD, "stream": True, "stream_options": {"include_usage": True}})
    assert res.n_attempts == 1 and not res.success and not res.stream_options_dropped


# -- resource bounds ----------------------------------------------------------------------------

def _endless(piece: bytes, total: int):
    sent = 0
    while sent < total:
        sent += len(piece)
        yield piece


def test_body_over_byte_cap_is_dropped_and_recorded() -> None:
    cap = 256 * 1024
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(200, stream=_Gen(_endless(b'{"choices": [' + b" " * 65536, 50 * cap)))

    cfg = _cfg(response_limits=ResponseLimits(max_response_bytes=cap))
    res = _send(cfg, handler)
    assert calls["n"] == 1 and not res.success and res.error_kind == "response_too_large"
    assert str(cap) in res.error and len(res.response_text) <= 64 * 1024
    assert res.attempts[0].bytes_read <= cap


def test_stream_over_byte_cap_one_endless_line() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Gen(_endless(b"data: " + b"x" * 65536, 10**9)))

    res = _send(_cfg(response_limits=ResponseLimits(max_response_bytes=1 << 20)), handler, {**PAYLOAD, "stream": True})
    assert res.error_kind == "response_too_large" and res.n_attempts == 1


def test_stream_token_overrun() -> None:
    tok = _sse([{"choices": [{"index": 0, "delta": {"content": "x"}}]}], done=False)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Gen(_endless(tok, 10**8)))

    payload = {**PAYLOAD, "stream": True, "max_tokens": 10}
    cfg = _cfg()
    assert stream_token_cap(payload, cfg) == 4 * 10 + 64
    assert stream_token_cap({**payload, "n": 3}, cfg) == 4 * 30 + 64 and stream_token_cap(PAYLOAD | {"max_tokens": None}, cfg) is None
    res = _send(cfg, handler, payload)
    assert res.error_kind == "stream_token_overrun" and res.n_attempts == 1
    assert sum(res.attempts[0].tokens_per_chunk) == 105


def test_honest_stream_near_max_tokens_is_not_cut() -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"content": "x"}}]} for _ in range(8)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Gen([_sse(chunks)]))

    res = _send(_cfg(), handler, {**PAYLOAD, "stream": True, "max_tokens": 8})
    assert res.success and res.tokens_per_chunk == (1,) * 8


def test_slow_drip_ends_at_request_deadline() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Gen(_endless(b" ", 10**6), delay=0.02))

    cfg = _cfg(timeout_s=0.3, response_limits=ResponseLimits(request_deadline_s=0.7))
    t0 = time.perf_counter()
    res = _send(cfg, handler)
    took = time.perf_counter() - t0
    assert 0.6 <= took < 2.0
    kinds = [a.error_kind for a in res.attempts]
    assert kinds[-1] == "deadline_exceeded" and set(kinds[:-1]) <= {"timeout"} and not res.attempts[-1].retryable


def test_retry_after_past_deadline_ends_the_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "30"}, text="busy")

    res = _send(_cfg(response_limits=ResponseLimits(request_deadline_s=5.0)), handler)
    assert res.n_attempts == 1 and res.error_kind == "deadline_exceeded" and "http_503" in res.error
    assert not res.attempts[0].retryable  # the runner's on_attempt sees a final record


def test_limits_config_validation() -> None:
    with pytest.raises(ValueError):
        ResponseLimits(max_response_bytes=10)
    with pytest.raises(ValueError):
        ResponseLimits(request_deadline_s=float("inf"))
    assert _cfg(timeout_s=10).request_deadline_s() == 40.0


def test_json_bomb_under_the_byte_cap_is_not_decoded() -> None:
    from probes.sse import JSONTooDense, loads_json

    bomb = '{"choices": [' + "{}," * (1 << 20) + "{}]}"  # 3 MiB that would decode to ~75 MB
    with pytest.raises(JSONTooDense):
        loads_json(bomb)
    # a real answer of the same size decodes
    alt = {"token": " the", "logprob": -1.25, "bytes": [32, 116, 104, 101]}
    real = {"choices": [{"index": 0, "message": {"content": "x"}, "logprobs": {"content": [{**alt, "top_logprobs": [alt] * 20}] * 1200}}]}
    text = json.dumps(real, separators=(",", ":"))
    assert len(text) > 1 << 20 and loads_json(text) == real

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=bomb)

    res = _send(_cfg(), handler)
    assert res.error_kind == "response_too_large" and res.n_attempts == 1 and res.json is None


def test_stream_of_empty_events_is_cut() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Gen(_endless(b"data: {}\n\n" * 1000, 10**8)))

    res = _send(_cfg(), handler, {**PAYLOAD, "stream": True, "max_tokens": 10})
    assert res.error_kind == "stream_token_overrun" and res.attempts[0].bytes_read < 1 << 20


def test_one_vocabulary_for_body_problems() -> None:
    from probes.anomalies import ANOMALY_KINDS
    from probes.normalize import normalize_response
    from probes.sse import BODY_ANOMALIES
    from probes.wire import parse_response

    assert set(BODY_ANOMALIES) <= set(ANOMALY_KINDS)
    bodies = [
        ("{broken", False),
        ('{"id": 1}', False),
        ('{"error": {"message": "overloaded"}}', False),
        ("data: [DONE]\n\n", True),
        ('data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n', True),
        ('event: error\ndata: {"message": "boom"}\n\n', True),
    ]
    for body, stream in bodies:
        pr = parse_response("chat", 200, body, stream=stream)
        norm = normalize_response("chat", {}, response_text=body, stream=stream)
        assert pr.error_kind in BODY_ANOMALIES and pr.error_kind in norm.anomalies, (body, pr.error_kind, norm.anomalies)
