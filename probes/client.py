"""Async probe client for OpenAI-compatible endpoints; failures are data, never exceptions.

Layout (after lm-evaluation-harness and HELM): only two pure functions know the wire API —
:func:`build_payload` (probe + config → request body) and :func:`parse_response` (HTTP status +
raw body → :class:`ParsedResponse`). :class:`ProbeClient` adds transport: an
``httpx.AsyncClient``, a concurrency semaphore and a requests-per-second limiter, per-request
deadlines, tenacity retries with exponential backoff (honouring ``Retry-After``), SSE streaming
with timing, and a frozen :class:`ProbeResult` record per request whose ``attempts`` keep every
try (status, error, latency, raw body). ``on_attempt`` is called after each attempt so a
runner can persist it before the next one starts.

API docs: OpenAI Chat Completions and (legacy) Completions, including ``stream`` (server-sent
events, ``data: {...}`` lines ending with ``data: [DONE]``) and ``stream_options.include_usage``.

Timing units are seconds (float, ``time.perf_counter``); timestamps are timezone-aware UTC.
The API key is read once from the environment (``ProviderConfig.resolve_api_key``), sent only in
the ``Authorization`` header, and scrubbed from every recorded body and error string.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import inspect
import json
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import tenacity

from probes.config import ProviderConfig

__all__ = [
    "ParsedResponse",
    "AttemptRecord",
    "ProbeResult",
    "ProbeClient",
    "RateLimiter",
    "build_payload",
    "parse_response",
    "parse_sse",
    "parse_retry_after",
    "count_chunk_tokens",
    "RETRYABLE_STATUS",
]

#: HTTP statuses worth retrying: timeouts, conflicts, rate limits and server errors.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})
#: Error kinds (``ProbeResult.error_kind``) that a retry may fix.
RETRYABLE_KINDS = frozenset({"timeout", "connect_error", "read_error", "rate_limited", "server_error"})
#: Error kinds that are retried only when ``RetryPolicy.retry_malformed`` is set.
MALFORMED_KINDS = frozenset({"malformed_json", "truncated_stream"})

_REDACTED = "[REDACTED]"
#: Connections per pooled ``httpx.AsyncClient`` shard (see ``ProbeClient``).
_CONNS_PER_SHARD = 8

OnAttempt = Callable[[str, "AttemptRecord"], Awaitable[None] | None]


# -- pure per-API functions -----------------------------------------------------------------

def build_payload(
    api: str,
    probe: Any,
    config: ProviderConfig,
    *,
    sample: int = 0,
    stream: bool | None = None,
) -> dict[str, Any]:
    """Request body for ``probe`` (a :class:`probes.suites.Probe`) on ``config``'s endpoint. Pure.

    - ``api="chat"``: ``messages``, ``logprobs: true`` and ``top_logprobs = min(k, cap)``;
      ``api="completions"``: ``prompt`` and ``logprobs = min(k, cap)`` (an int).
      ``k = probe.top_logprobs`` (``None`` = logprobs not asked); ``cap =
      config.capabilities.max_top_logprobs``; nothing is asked when ``capabilities.logprobs`` is off.
    - ``seed = probe.seed + sample`` when set and ``capabilities.seed``; samples of one probe get
      distinct seeds.
    - ``stream`` defaults to ``capabilities.streaming``; streamed requests add
      ``stream_options.include_usage``.
    - ``config.extra_body`` is merged last (it wins).

    Raises ``ValueError`` for an unknown ``api``.
    """
    if api not in ("chat", "completions"):
        raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
    caps = config.capabilities
    body: dict[str, Any] = {"model": config.model}
    if api == "chat":
        body["messages"] = probe.chat_messages()
    else:
        body["prompt"] = probe.prompt_text()
    body["max_tokens"] = int(probe.max_tokens)
    body["temperature"] = float(probe.temperature)
    if getattr(probe, "top_p", None) is not None:
        body["top_p"] = float(probe.top_p)
    k = getattr(probe, "top_logprobs", None)
    if k is not None and caps.logprobs:
        k = min(int(k), caps.max_top_logprobs)
        if api == "chat":
            body["logprobs"] = True
            if k > 0:
                body["top_logprobs"] = k
        else:
            body["logprobs"] = k
    seed = getattr(probe, "seed", None)
    if seed is not None and caps.seed:
        body["seed"] = int(seed) + int(sample)
    do_stream = caps.streaming if stream is None else bool(stream)
    if do_stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(config.extra_body)
    return body


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    """Outcome of :func:`parse_response`: the decoded body, or why it is unusable."""

    ok: bool
    """2xx status and a well-formed body with ``choices``."""
    json: Any
    """Decoded body: a dict (plain) or the list of chunk dicts (stream); ``None`` if undecodable."""
    error_kind: str | None = None
    """``rate_limited`` | ``server_error`` | ``http_error`` | ``malformed_json`` |
    ``truncated_stream`` | ``provider_error`` | ``bad_response`` | ``None``."""
    error: str | None = None
    """Human-readable detail, prefixed by the kind."""
    retryable: bool = False
    """Whether a retry may help (status 429/5xx, malformed or truncated body)."""
    text: str | None = None
    """Generated text of choice 0 (concatenated deltas for a stream)."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def _loads(text: str) -> Any:
    # Python's json accepts the non-strict NaN / Infinity / -Infinity some engines emit.
    return json.loads(text)


def parse_sse(body: str) -> tuple[list[Any], bool, str | None]:
    """Split a server-sent-events body into decoded ``data:`` payloads.

    Returns ``(events, done, error)``: ``done`` is True when ``data: [DONE]`` was seen; ``error``
    describes the first undecodable event (later events are still decoded). Pure.
    """
    events: list[Any] = []
    done = False
    error: str | None = None
    for raw in body.splitlines():
        line = raw.strip()
        if not line.startswith("data:"):
            continue  # comments (":"), event:, id:, retry:, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        if not data:
            continue
        try:
            events.append(_loads(data))
        except ValueError as exc:
            if error is None:
                error = f"event {len(events)}: {exc}: {data[:80]!r}"
    return events, done, error


def count_chunk_tokens(api: str, chunk: Any) -> int:
    """Tokens carried by one streamed chunk (choice 0).

    Uses the chunk's logprobs entries when present (exact); otherwise 1 when the chunk carries
    non-empty text, else 0 (role-only or usage-only chunks). Without logprobs this is a lower
    bound: a multi-token chunk counts 1.
    """
    if not isinstance(chunk, dict):
        return 0
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return 0
    ch = choices[0]
    lp = ch.get("logprobs")
    if isinstance(lp, dict):
        if api == "chat" and isinstance(lp.get("content"), list):
            return len(lp["content"])
        if api == "completions" and isinstance(lp.get("tokens"), list):
            return len(lp["tokens"])
    if api == "chat":
        delta = ch.get("delta") or {}
        content = delta.get("content") if isinstance(delta, dict) else None
    else:
        content = ch.get("text")
    return 1 if content else 0


def _choice_text(api: str, choice: dict[str, Any], stream: bool) -> str:
    if api == "chat":
        part = choice.get("delta" if stream else "message") or {}
        val = part.get("content") if isinstance(part, dict) else None
    else:
        val = choice.get("text")
    return val if isinstance(val, str) else ""


def _error_message(body: Any) -> str | None:
    if isinstance(body, dict) and "error" in body and body["error"]:
        err = body["error"]
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return None


def parse_response(api: str, status: int | None, body: str | bytes | None, *, stream: bool = False) -> ParsedResponse:
    """Classify and decode one HTTP response. Pure; never raises on bad input.

    ``status`` is the HTTP status (``None`` when no response arrived), ``body`` the raw body
    (for ``stream=True`` the whole SSE text). A stream without ``data: [DONE]`` is
    ``truncated_stream``; a body that is not JSON is ``malformed_json``; a 2xx with an
    ``error`` object is ``provider_error``; a 2xx without ``choices`` is ``bad_response``.
    """
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    body = body or ""
    if status is None:
        return ParsedResponse(False, None, "read_error", "read_error: no response", True)
    if not 200 <= status < 300:
        try:
            decoded = _loads(body) if body.strip() else None
        except ValueError:
            decoded = None
        msg = _error_message(decoded) or body.strip()[:200]
        if status == 429:
            kind = "rate_limited"
        elif status >= 500 or status in RETRYABLE_STATUS:
            kind = "server_error"
        else:
            kind = "http_error"
        return ParsedResponse(False, decoded, kind, f"http_{status}: {msg}", status in RETRYABLE_STATUS)

    if stream:
        events, done, err = parse_sse(body)
        if not events and not done and err is None and body.lstrip().startswith("{"):
            # the server ignored stream=true and answered with a plain JSON body
            return parse_response(api, status, body, stream=False)
        if err is not None:
            return ParsedResponse(False, events, "malformed_json", f"malformed_json: {err}", True)
        for ev in events:
            msg = _error_message(ev)
            if msg is not None:
                return ParsedResponse(False, events, "provider_error", f"provider_error: {msg}", False)
        if not done:
            return ParsedResponse(False, events, "truncated_stream", f"truncated_stream: {len(events)} events, no [DONE]", True)
        text_parts: list[str] = []
        finish = None
        usage = None
        seen_choice = False
        for ev in events:
            if not isinstance(ev, dict):
                return ParsedResponse(False, events, "bad_response", "bad_response: stream event is not an object", False)
            if isinstance(ev.get("usage"), dict):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                    continue
                seen_choice = True
                text_parts.append(_choice_text(api, ch, True))
                finish = ch.get("finish_reason") or finish
        if not seen_choice:
            return ParsedResponse(False, events, "bad_response", "bad_response: stream has no choices", False)
        return ParsedResponse(True, events, text="".join(text_parts), finish_reason=finish, usage=usage)

    try:
        decoded = _loads(body)
    except ValueError as exc:
        return ParsedResponse(False, None, "malformed_json", f"malformed_json: {exc}: {body[:80]!r}", True)
    msg = _error_message(decoded)
    if msg is not None:
        return ParsedResponse(False, decoded, "provider_error", f"provider_error: {msg}", False)
    if not isinstance(decoded, dict) or not isinstance(decoded.get("choices"), list) or not decoded["choices"]:
        return ParsedResponse(False, decoded, "bad_response", "bad_response: no choices in body", False)
    ch0 = decoded["choices"][0]
    if not isinstance(ch0, dict):
        return ParsedResponse(False, decoded, "bad_response", "bad_response: choice is not an object", False)
    usage = decoded.get("usage") if isinstance(decoded.get("usage"), dict) else None
    return ParsedResponse(True, decoded, text=_choice_text(api, ch0, False), finish_reason=ch0.get("finish_reason"), usage=usage)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date; RFC 9110 §10.2.3).

    Returns ``None`` when absent or unparseable; negative values clamp to 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        dt = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    ref = time.time() if now is None else now
    return max(0.0, dt.timestamp() - ref)


# -- records --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One HTTP attempt (a request may take several). Units: seconds; ``started_at`` UTC."""

    attempt_no: int
    """1-based."""
    started_at: datetime
    latency_s: float
    """Request start to the end of the body (or to the failure)."""
    http_status: int | None
    """``None`` when no response arrived (timeout, connection error)."""
    error: str | None
    """``None`` on success; else ``"<kind>: detail"``."""
    error_kind: str | None
    response_text: str | None
    """Raw body (partial for a cut stream); the API key is scrubbed."""
    ttft_s: float | None = None
    """Time to the first token-bearing SSE chunk (streaming only)."""
    chunk_gaps_s: tuple[float, ...] = ()
    """Gaps between successive token-bearing chunks (streaming only)."""
    tokens_per_chunk: tuple[int, ...] = ()
    """Tokens in each token-bearing chunk (see :func:`count_chunk_tokens`)."""
    retry_after_s: float | None = None
    """Parsed ``Retry-After`` header, if any."""
    retryable: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (timestamps ISO 8601, tuples as lists)."""
        d = asdict(self)
        d["started_at"] = self.started_at.isoformat()
        d["chunk_gaps_s"] = list(self.chunk_gaps_s)
        d["tokens_per_chunk"] = list(self.tokens_per_chunk)
        return d


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Final record of one request: the last attempt's outcome plus every attempt.

    ``success`` False means every allowed attempt failed; ``error`` then holds the last error.
    No field ever contains the API key.
    """

    key: str
    """Caller's key, e.g. the run's ``probe_key`` (``{suite_probe_id}#{sample}``)."""
    request: dict[str, Any]
    """The JSON body sent (no headers)."""
    stream: bool
    success: bool
    error: str | None
    error_kind: str | None
    http_status: int | None
    response_text: str | None
    """Raw body of the last attempt (the SSE text when streamed)."""
    json: Any
    """Decoded body of the last attempt: dict, list of stream chunks, or ``None``."""
    latency_s: float
    """Latency of the last attempt, seconds."""
    ttft_s: float | None
    chunk_gaps_s: tuple[float, ...]
    tokens_per_chunk: tuple[int, ...]
    attempts: tuple[AttemptRecord, ...]
    started_at: datetime
    """UTC start of the first attempt."""
    finished_at: datetime
    text: str | None = None
    """Generated text of choice 0 (from :func:`parse_response`)."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def n_attempts(self) -> int:
        return len(self.attempts)

    @property
    def total_latency_s(self) -> float:
        """Wall time from the first attempt's start to the end of the last one, seconds."""
        return (self.finished_at - self.started_at).total_seconds()


# -- rate limiting --------------------------------------------------------------------------

class RateLimiter:
    """Spaces request starts at most ``rate`` per second (async, FIFO; ``None`` = unlimited).

    A simple virtual-clock scheduler: each caller reserves the next slot ``1/rate`` after the
    previous one and sleeps until it. Bursts are not allowed (bucket of one).
    """

    def __init__(
        self,
        rate: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.interval = 0.0 if not rate else 1.0 / float(rate)
        self._clock = clock
        self._sleep = sleep or asyncio.sleep
        self._next = 0.0

    async def acquire(self) -> None:
        """Wait until this caller's slot."""
        if self.interval <= 0:
            return
        now = self._clock()
        slot = max(now, self._next)
        self._next = slot + self.interval
        delay = slot - now
        if delay > 0:
            await self._sleep(delay)


# -- the client -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _shared_ssl_context() -> ssl.SSLContext:
    # one verified context for every shard (loading the CA bundle costs ~50 ms each time)
    return httpx.create_ssl_context()


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ProbeClient:
    """Async client for one provider: bounded concurrency, rate limit, retries, stream timing.

    Use as ``async with ProbeClient(config) as client: result = await client.run_probe(probe)``.

    Args:
        config: the provider (URL, model, limits, retry policy, timeout).
        transport: an ``httpx.AsyncBaseTransport`` (tests pass ``httpx.MockTransport``).
        api_key: overrides ``config.resolve_api_key()`` (which reads the env var named by
            ``api_key_env``; raises ``ConfigError`` if that variable is unset).
        on_attempt: ``f(key, AttemptRecord)`` (sync or async) called after every attempt,
            before any backoff sleep; exceptions it raises propagate (persistence must not fail
            silently).
        sleep: the async sleep used for backoff (tests inject a recorder).
        max_attempts: overrides ``config.retry.max_attempts``.
    """

    def __init__(
        self,
        config: ProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        on_attempt: OnAttempt | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        max_attempts: int | None = None,
    ) -> None:
        self.config = config
        self.url = config.endpoint_url()
        self._key = api_key if api_key is not None else config.resolve_api_key()
        self._headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **config.headers}
        if self._key:
            self._headers["Authorization"] = f"Bearer {self._key}"
        conc = config.rate_limits.concurrency
        self._limiter = RateLimiter(config.rate_limits.requests_per_s)
        self._on_attempt = on_attempt
        self._sleep = sleep or asyncio.sleep
        self._max_attempts = max_attempts or config.retry.max_attempts
        # httpcore's pool scans every connection on each request (O(connections) socket polls;
        # encode/httpx#3215, encode/httpcore#1035), so the connections are sharded over small
        # pools. A slot queue bounds total concurrency and keeps each shard within its own
        # connection limit, so no request ever queues inside httpcore.
        # (A caller-supplied transport owns its own pool: one shard then.)
        n_shards = 1 if transport is not None else max(1, math.ceil(conc / _CONNS_PER_SHARD))
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        per = [conc // n_shards + (1 if i < conc % n_shards else 0) for i in range(n_shards)]
        for i, k in enumerate(per):
            for _ in range(k):
                self._slots.put_nowait(i)
        # Per-phase timeouts at the deadline; the whole-request deadline is asyncio.timeout below.
        ssl_ctx = _shared_ssl_context() if transport is None else True
        self._shards = [
            httpx.AsyncClient(
                transport=transport,
                verify=ssl_ctx,
                limits=httpx.Limits(max_connections=k, max_keepalive_connections=k),
                timeout=httpx.Timeout(config.timeout_s),
                headers=self._headers,
            )
            for k in per
        ]

    async def __aenter__(self) -> ProbeClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the underlying connection pool."""
        for c in self._shards:
            await c.aclose()

    # -- helpers --
    def _scrub(self, text: str | None) -> str | None:
        if text is None or not self._key:
            return text
        return text.replace(self._key, _REDACTED)

    def _wait_s(self, state: tenacity.RetryCallState) -> float:
        pol = self.config.retry
        rec: AttemptRecord = state.outcome.result()  # type: ignore[union-attr]
        if rec.retry_after_s is not None:
            return min(rec.retry_after_s, pol.max_retry_after_s)
        base = tenacity.wait_exponential_jitter(initial=pol.backoff_initial_s, max=pol.backoff_max_s, jitter=pol.backoff_initial_s)
        return float(base(state))

    def _should_retry(self, rec: AttemptRecord) -> bool:
        return rec.retryable

    async def _attempt(self, key: str, payload: bytes, stream: bool, attempt_no: int, api: str) -> tuple[AttemptRecord, ParsedResponse | None]:
        await self._limiter.acquire()
        shard = await self._slots.get()
        http = self._shards[shard]
        try:
            started = _utcnow()
            t0 = time.perf_counter()
            status: int | None = None
            retry_after: float | None = None
            body_parts: list[str] = []
            arrivals: list[float] = []
            tpc: list[int] = []
            transport_error: tuple[str, str] | None = None
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    if stream:
                        async with http.stream("POST", self.url, content=payload) as resp:
                            status = resp.status_code
                            retry_after = parse_retry_after(resp.headers.get("retry-after"))
                            if not 200 <= status < 300:
                                body_parts.append((await resp.aread()).decode("utf-8", errors="replace"))
                            else:
                                async for line in resp.aiter_lines():
                                    body_parts.append(line + "\n")
                                    s = line.strip()
                                    if s.startswith("data:") and s[5:].strip() not in ("", "[DONE]"):
                                        try:
                                            n = count_chunk_tokens(api, _loads(s[5:].strip()))
                                        except ValueError:
                                            n = 0
                                        if n > 0:
                                            arrivals.append(time.perf_counter())
                                            tpc.append(n)
                    else:
                        resp = await http.post(self.url, content=payload)
                        status = resp.status_code
                        retry_after = parse_retry_after(resp.headers.get("retry-after"))
                        body_parts.append(resp.text)
            except (TimeoutError, httpx.TimeoutException) as exc:
                transport_error = ("timeout", f"timeout: no complete response within {self.config.timeout_s:g}s ({type(exc).__name__})")
            except httpx.ConnectError as exc:
                transport_error = ("connect_error", f"connect_error: {exc}")
            except httpx.TransportError as exc:
                transport_error = ("read_error", f"read_error: {type(exc).__name__}: {exc}")
            latency = time.perf_counter() - t0
        finally:
            self._slots.put_nowait(shard)

        body = self._scrub("".join(body_parts)) if body_parts else None
        if transport_error is not None:
            kind, err = transport_error
            if stream and status is not None and 200 <= status < 300 and body:
                kind, err = "truncated_stream", f"truncated_stream: {err}"
            retryable = kind in RETRYABLE_KINDS or (kind in MALFORMED_KINDS and self.config.retry.retry_malformed)
            parsed_ok = False
            pr = None
        else:
            pr = parse_response(api, status, body, stream=stream)
            kind, err, parsed_ok = pr.error_kind, pr.error, pr.ok
            retryable = pr.retryable and (kind not in MALFORMED_KINDS or self.config.retry.retry_malformed)
        rec = AttemptRecord(
            attempt_no=attempt_no,
            started_at=started,
            latency_s=latency,
            http_status=status,
            error=None if parsed_ok else self._scrub(err),
            error_kind=None if parsed_ok else kind,
            response_text=body,
            ttft_s=(arrivals[0] - t0) if arrivals else None,
            chunk_gaps_s=tuple(b - a for a, b in zip(arrivals, arrivals[1:])),
            tokens_per_chunk=tuple(tpc),
            retry_after_s=retry_after,
            retryable=(not parsed_ok) and retryable,
        )
        return rec, pr

    async def send(
        self,
        payload: dict[str, Any],
        *,
        key: str = "",
        stream: bool | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> ProbeResult:
        """POST ``payload`` with retries; return a :class:`ProbeResult` (never raises on HTTP,
        transport or body errors; ``asyncio.CancelledError`` and ``on_attempt`` errors propagate).

        ``stream`` defaults to ``payload.get("stream")``. ``on_attempt`` overrides the client's.
        """
        api = self.config.api
        do_stream = bool(payload.get("stream")) if stream is None else stream
        blob = json.dumps(payload, allow_nan=False).encode()
        cb = on_attempt if on_attempt is not None else self._on_attempt
        attempts: list[AttemptRecord] = []
        parsed: list[ParsedResponse | None] = [None]

        async def one() -> AttemptRecord:
            rec, pr = await self._attempt(key, blob, do_stream, len(attempts) + 1, api)
            parsed[0] = pr
            attempts.append(rec)
            if cb is not None:
                out = cb(key, rec)
                if inspect.isawaitable(out):
                    await out
            return rec

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self._max_attempts),
            wait=self._wait_s,
            retry=tenacity.retry_if_result(self._should_retry),
            retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
            sleep=self._sleep,
            reraise=True,
        )
        last: AttemptRecord = await retrying(one)
        finished = _utcnow()
        pr = parsed[0] if last.error is None else None
        return ProbeResult(
            key=key,
            request=payload,
            stream=do_stream,
            success=last.error is None,
            error=last.error,
            error_kind=last.error_kind,
            http_status=last.http_status,
            response_text=last.response_text,
            json=pr.json if pr is not None else _safe_json(last.response_text, do_stream),
            latency_s=last.latency_s,
            ttft_s=last.ttft_s,
            chunk_gaps_s=last.chunk_gaps_s,
            tokens_per_chunk=last.tokens_per_chunk,
            attempts=tuple(attempts),
            started_at=attempts[0].started_at,
            finished_at=finished,
            text=pr.text if pr is not None else None,
            finish_reason=pr.finish_reason if pr is not None else None,
            usage=pr.usage if pr is not None else None,
        )

    async def run_probe(
        self,
        probe: Any,
        *,
        sample: int = 0,
        key: str | None = None,
        stream: bool | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> ProbeResult:
        """Build the payload for ``probe`` (sample ``sample``) and :meth:`send` it.

        ``key`` defaults to ``f"{probe.id}#{sample}"`` (the store's ``probe_key``).
        """
        payload = build_payload(self.config.api, probe, self.config, sample=sample, stream=stream)
        return await self.send(payload, key=key or f"{probe.id}#{sample}", on_attempt=on_attempt)

    async def map(
        self,
        jobs: Iterable[tuple[str, dict[str, Any]]],
        *,
        on_attempt: OnAttempt | None = None,
    ) -> AsyncIterator[ProbeResult]:
        """Send ``(key, payload)`` jobs concurrently (bounded by the client's limits); yield results
        as they complete. Cancelling the iteration cancels the jobs still running."""
        tasks = [asyncio.ensure_future(self.send(p, key=k, on_attempt=on_attempt)) for k, p in jobs]
        try:
            for fut in asyncio.as_completed(tasks):
                yield await fut
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _safe_json(text: str | None, stream: bool) -> Any:
    if not text:
        return None
    if stream:
        events, _, _ = parse_sse(text)
        return events or None
    try:
        return _loads(text)
    except ValueError:
        return None
