"""Probe client: pure payload/parse functions, retries, timeouts, streaming timing, secrets (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from probes.client import (
    ProbeClient,
    RateLimiter,
    build_payload,
    count_chunk_tokens,
    parse_response,
    parse_retry_after,
    parse_sse,
)
from probes.config import Capabilities, ProviderConfig, RetryPolicy
from probes.suites import Probe

OK_BODY = {
    "id": "c",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
KEY = "sk-test-SECRET-0123456789"


def _cfg(**kw) -> ProviderConfig:
    base = dict(
        name="mock",
        base_url="http://mock.test/v1",
        model="m",
        timeout_s=2.0,
        retry=RetryPolicy(max_attempts=4, backoff_initial_s=0.001, backoff_max_s=0.002),
    )
    base.update(kw)
    return ProviderConfig(**base)


def _probe(**kw) -> Probe:
    base = dict(id="p1", workload="chat", mode="logprob", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0.0, top_logprobs=5)
    base.update(kw)
    return Probe(**base)


class SleepRecorder:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, s: float) -> None:
        self.calls.append(s)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


# -- pure functions --------------------------------------------------------------------------

def test_build_payload_chat_caps_and_seed() -> None:
    cfg = _cfg(capabilities=Capabilities(max_top_logprobs=3, seed=True, streaming=False), extra_body={"top_k": -1})
    p = _probe(seed=100, top_p=0.9)
    body = build_payload("chat", p, cfg, sample=2)
    assert body["model"] == "m" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["logprobs"] is True and body["top_logprobs"] == 3  # capped at the provider's max
    assert body["seed"] == 102 and body["top_p"] == 0.9 and body["top_k"] == -1
    assert "stream" not in body
    streamed = build_payload("chat", p, cfg, stream=True)
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}


def test_build_payload_completions_and_no_logprobs() -> None:
    cfg = _cfg(api="completions", capabilities=Capabilities(max_top_logprobs=5, streaming=False))
    body = build_payload("completions", _probe(top_logprobs=20, seed=7), cfg)
    assert body["prompt"] == "hi" and body["logprobs"] == 5
    assert "seed" not in body  # capability off
    off = _cfg(capabilities=Capabilities(logprobs=False, streaming=False))
    assert "logprobs" not in build_payload("chat", _probe(), off)
    sampling = _probe(mode="sampling", temperature=1.0, top_logprobs=None, n_samples=3)
    assert "logprobs" not in build_payload("chat", sampling, _cfg())
    with pytest.raises(ValueError):
        build_payload("responses", _probe(), cfg)


@pytest.mark.parametrize(
    ("status", "body", "stream", "ok", "kind", "retryable"),
    [
        (200, json.dumps(OK_BODY), False, True, None, False),
        (200, '{"choices": [{"index": 0, "message": {"content": "x"}, "logprobs": {"content": [{"token": "x", "logprob": -Infinity}]}}]}', False, True, None, False),
        (200, "{broken", False, False, "malformed_json", True),
        (200, '{"error": {"message": "model overloaded"}}', False, False, "provider_error", True),
        (200, '{"error": {"message": "bad prompt", "type": "invalid_request_error", "code": 400}}', False, False, "provider_error", False),
        (200, '{"error": {"message": "x", "code": 503}}', False, False, "provider_error", True),
        (200, '{"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500}', False, False, "provider_error", True),
        (200, '{"error": {"message": "quota", "type": "rate_limit_exceeded"}}', False, False, "provider_error", True),
        (200, '{"id": 1}', False, False, "malformed_response", False),
        (200, "data: [DONE]\n\n", True, False, "malformed_response", True),
        (200, 'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n', True, False, "provider_error", True),
        (200, 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: {"error": {"message": "ctx too long", "code": 400}}\n\ndata: [DONE]\n\n', True, False, "provider_error", False),
        (429, '{"error": {"message": "slow down"}}', False, False, "rate_limited", True),
        (503, "upstream", False, False, "server_error", True),
        (400, '{"error": {"message": "top_logprobs too large"}}', False, False, "http_error", False),
        (200, 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\ndata: [DONE]\n\n', True, True, None, False),
        (200, 'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n', True, False, "truncated_stream", True),
        (200, 'data: {"choices": [\n\ndata: [DONE]\n\n', True, False, "malformed_json", True),
        (None, None, False, False, "read_error", True),
    ],
)
def test_parse_response_classifies(status, body, stream, ok, kind, retryable) -> None:
    pr = parse_response("chat", status, body, stream=stream)
    assert pr.ok is ok and pr.error_kind == kind and pr.retryable is retryable
    if not ok:
        assert pr.error and pr.error.startswith(("http_", kind))


def test_parse_response_stream_text_usage() -> None:
    sse = (
        'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
        'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}\n\n'
        'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n'
        "data: [DONE]\n\n"
    )
    pr = parse_response("chat", 200, sse, stream=True)
    assert pr.ok and pr.text == "Hello" and pr.finish_reason == "stop" and pr.usage == {"completion_tokens": 2}
    events, done, err = parse_sse(sse)
    assert len(events) == 4 and done and err is None
    assert [count_chunk_tokens("chat", e) for e in events] == [0, 1, 1, 0]
    lp_chunk = {"choices": [{"index": 0, "delta": {"content": "ab"}, "logprobs": {"content": [{"token": "a"}, {"token": "b"}]}}]}
    assert count_chunk_tokens("chat", lp_chunk) == 2
    assert count_chunk_tokens("completions", {"choices": [{"text": "abc", "logprobs": {"tokens": ["a", "b", "c"]}}]}) == 3


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = datetime(2025, 1, 1, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after(later, now=now.timestamp()) == pytest.approx(7.0)
    assert parse_retry_after("-5") == 0.0


# -- the async client --------------------------------------------------------------------------

def test_retry_on_429_honours_retry_after_and_reports_attempts() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(429, headers={"Retry-After": "1.5"}, json={"error": {"message": "rate limited"}})
        if calls["n"] == 2:
            return httpx.Response(500, text="boom")
        return httpx.Response(200, json=OK_BODY)

    sleeps = SleepRecorder()
    seen: list[tuple[str, int, int | None]] = []

    async def go():
        async with ProbeClient(_cfg(), transport=httpx.MockTransport(handler), sleep=sleeps,
                               on_attempt=lambda k, a: seen.append((k, a.attempt_no, a.http_status))) as c:
            return await c.run_probe(_probe(), sample=0)

    res = run(go())
    assert res.success and res.text == "hello" and res.key == "p1#0"
    assert [a.http_status for a in res.attempts] == [429, 500, 200]
    assert res.attempts[0].error_kind == "rate_limited" and res.attempts[0].retry_after_s == 1.5
    assert res.attempts[1].error_kind == "server_error" and res.attempts[1].response_text == "boom"
    assert sleeps.calls[0] == pytest.approx(1.5)  # Retry-After honoured
    assert sleeps.calls[1] < 0.01  # exponential backoff from the policy
    assert seen == [("p1#0", 1, 429), ("p1#0", 2, 500), ("p1#0", 3, 200)]  # persisted as they happen
    assert res.usage == OK_BODY["usage"] and res.json["choices"][0]["message"]["content"] == "hello"


def test_retry_after_capped_and_exhaustion_returns_data() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "999"}, text="down")

    sleeps = SleepRecorder()
    cfg = _cfg(retry=RetryPolicy(max_attempts=3, max_retry_after_s=2.0, backoff_initial_s=0.001))

    async def go():
        async with ProbeClient(cfg, transport=httpx.MockTransport(handler), sleep=sleeps) as c:
            return await c.send({"model": "m", "messages": []}, key="k")

    res = run(go())
    assert not res.success and res.n_attempts == 3 and res.http_status == 503
    assert res.error.startswith("http_503") and res.error_kind == "server_error"
    assert sleeps.calls == [2.0, 2.0]


def test_client_errors_are_not_retried() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(400, json={"error": {"message": "bad top_logprobs"}})

    async def go():
        async with ProbeClient(_cfg(), transport=httpx.MockTransport(handler), sleep=SleepRecorder()) as c:
            return await c.send({"model": "m"}, key="k")

    res = run(go())
    assert calls["n"] == 1 and not res.success and res.error == "http_400: bad top_logprobs"


def test_timeouts_and_connect_errors_are_retried() -> None:
    calls = {"n": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            await asyncio.sleep(1.0)  # past the 0.1 s deadline
        if calls["n"] == 2:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=OK_BODY)

    async def go():
        async with ProbeClient(_cfg(timeout_s=0.1), transport=httpx.MockTransport(handler), sleep=SleepRecorder()) as c:
            return await c.send({"model": "m"}, key="k")

    t0 = time.perf_counter()
    res = run(go())
    assert time.perf_counter() - t0 < 0.9
    assert res.success and [a.error_kind for a in res.attempts] == ["timeout", "connect_error", None]
    assert res.attempts[0].http_status is None and 0.09 <= res.attempts[0].latency_s < 0.9


def test_malformed_json_recorded_as_data() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text='{"choices": [ {"index": 0, "message": ')

    cfg = _cfg(retry=RetryPolicy(max_attempts=3, retry_malformed=False))

    async def go():
        async with ProbeClient(cfg, transport=httpx.MockTransport(handler), sleep=SleepRecorder()) as c:
            return await c.send({"model": "m"}, key="k")

    res = run(go())
    assert not res.success and res.n_attempts == 1 and res.error_kind == "malformed_json"
    assert res.response_text == '{"choices": [ {"index": 0, "message": ' and res.json is None
    d = res.attempts[0].to_dict()
    json.dumps(d)
    assert d["error_kind"] == "malformed_json"


def _sse_chunks():
    def ev(content, n_lp):
        lp = {"content": [{"token": content[i : i + 1], "logprob": -0.1, "top_logprobs": []} for i in range(n_lp)]}
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": content}, "logprobs": lp, "finish_reason": None}]}) + "\n\n"

    return [
        'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n',
        ev("ab", 2),
        ev("c", 1),
        ev("def", 3),
        "data: [DONE]\n\n",
    ]


class _SlowStream(httpx.AsyncByteStream):
    def __init__(self, parts: list[str], delays: list[float]) -> None:
        self.parts, self.delays = parts, delays

    async def __aiter__(self):
        for part, d in zip(self.parts, self.delays, strict=True):
            await asyncio.sleep(d)
            yield part.encode()


def test_streaming_timing_ttft_gaps_tokens_per_chunk() -> None:
    delays = [0.0, 0.15, 0.05, 0.10, 0.0]

    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_SlowStream(_sse_chunks(), delays))

    async def go():
        async with ProbeClient(_cfg(), transport=httpx.MockTransport(handler)) as c:
            return await c.run_probe(_probe(), stream=True)

    res = run(go())
    assert res.success and res.stream and res.text == "abcdef"
    assert res.tokens_per_chunk == (2, 1, 3)
    assert 0.13 <= res.ttft_s < 0.6
    assert len(res.chunk_gaps_s) == 2
    assert 0.035 <= res.chunk_gaps_s[0] < 0.4 and 0.08 <= res.chunk_gaps_s[1] < 0.5
    assert res.latency_s >= res.ttft_s + sum(res.chunk_gaps_s) - 1e-6
    assert isinstance(res.json, list) and len(res.json) == 4


def test_truncated_stream_is_retried_and_kept() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        parts = _sse_chunks()
        if calls["n"] == 1:
            parts = parts[:2]  # cut before [DONE]
        return httpx.Response(200, stream=_SlowStream(parts, [0.0] * len(parts)))

    async def go():
        async with ProbeClient(_cfg(), transport=httpx.MockTransport(handler), sleep=SleepRecorder()) as c:
            return await c.send({"model": "m", "stream": True}, key="k")

    res = run(go())
    assert res.success and res.n_attempts == 2
    first = res.attempts[0]
    assert first.error_kind == "truncated_stream" and "ab" in first.response_text and first.tokens_per_chunk == (2,)


def test_api_key_only_in_authorization_header() -> None:
    seen_auth: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        auth = request.headers.get("authorization", "")
        seen_auth.append(auth)
        # a hostile/buggy server echoing the key in error bodies and successful bodies
        if len(seen_auth) == 1:
            return httpx.Response(500, json={"error": {"message": f"bad key {auth}"}})
        body = dict(OK_BODY)
        body["choices"] = [{"index": 0, "message": {"content": f"your header was {auth}"}, "finish_reason": "stop"}]
        return httpx.Response(200, json=body)

    cfg = _cfg(api_key_env="MOCK_KEY_ENV")

    async def go():
        recs = []
        async with ProbeClient(cfg, transport=httpx.MockTransport(handler), api_key=KEY, sleep=SleepRecorder(),
                               on_attempt=lambda k, a: recs.append(a)) as c:
            return await c.send({"model": "m"}, key="k"), recs

    res, recs = run(go())
    assert seen_auth == [f"Bearer {KEY}"] * 2
    everything = repr(res) + json.dumps([a.to_dict() for a in recs]) + json.dumps(res.json) + json.dumps(res.request)
    assert KEY not in everything
    assert "[REDACTED]" in res.response_text and "[REDACTED]" in res.attempts[0].error


def test_api_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCK_KEY_ENV", KEY)
    got: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        got.append(request.headers.get("authorization"))
        return httpx.Response(200, json=OK_BODY)

    async def go():
        async with ProbeClient(_cfg(api_key_env="MOCK_KEY_ENV"), transport=httpx.MockTransport(handler)) as c:
            return await c.send({"model": "m"})

    assert run(go()).success and got == [f"Bearer {KEY}"]


def test_concurrency_bound_and_map() -> None:
    state = {"now": 0, "max": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return httpx.Response(200, json=OK_BODY)

    cfg = _cfg(rate_limits={"concurrency": 11})

    async def go():
        async with ProbeClient(cfg, transport=httpx.MockTransport(handler)) as c:
            return [r async for r in c.map((f"k{i}", {"model": "m"}) for i in range(60))]

    results = run(go())
    assert sorted(r.key for r in results) == sorted(f"k{i}" for i in range(60))
    assert all(r.success for r in results)
    assert state["max"] == 11  # bounded, and the bound is reached


def test_rate_limiter_spacing() -> None:
    clock = {"t": 100.0}
    sleeps = SleepRecorder()

    async def go():
        lim = RateLimiter(4.0, clock=lambda: clock["t"], sleep=sleeps)
        for _ in range(4):
            await lim.acquire()
        clock["t"] += 10.0  # long idle: no sleep, no burst credit beyond one slot
        await lim.acquire()

    run(go())
    assert sleeps.calls == pytest.approx([0.25, 0.5, 0.75])  # 4 starts at 4/s, clock frozen
    assert RateLimiter(None).interval == 0.0


def test_rate_limit_applies_to_client() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=OK_BODY)

    async def go():
        async with ProbeClient(_cfg(rate_limits={"requests_per_s": 40, "concurrency": 8}), transport=httpx.MockTransport(handler)) as c:
            t0 = time.perf_counter()
            res = [r async for r in c.map((f"k{i}", {"model": "m"}) for i in range(9))]
            return time.perf_counter() - t0, res

    elapsed, res = run(go())
    assert len(res) == 9 and elapsed >= 8 / 40 - 0.02
