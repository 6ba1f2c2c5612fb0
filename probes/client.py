"""Async probe client for OpenAI-compatible endpoints; failures are data, never exceptions.

Layout (after lm-evaluation-harness and HELM): only the pure functions of :mod:`probes.wire`
know the wire API — :func:`build_payload` (probe + config → request body) and
:func:`parse_response` (HTTP status + raw body → :class:`ParsedResponse`); they are re-exported
here. :class:`ProbeClient` adds transport: an
``httpx.AsyncClient``, a concurrency semaphore and a requests-per-second limiter, per-request
deadlines, tenacity retries with exponential backoff (honouring ``Retry-After``), SSE streaming
with timing, and a frozen :class:`ProbeResult` record per request whose ``attempts`` keep every
try (status, error, latency, raw body). ``on_attempt`` is called after each attempt so a
runner can persist it before the next one starts.

Bounded resources (``ProviderConfig.response_limits``): bodies are read incrementally
(``httpx`` ``client.stream`` + ``aiter_bytes``) and dropped past ``max_response_bytes``
(``response_too_large``); a stream carrying far more tokens than ``max_tokens`` allows is cut
(``stream_token_overrun``); an answer that makes no progress for ``stall_timeout_s`` (a stream
of keep-alives only, a body trickling bytes) ends as ``stalled``; the whole request, retries and
backoff included, ends at ``request_deadline_s`` (``deadline_exceeded``). None of these is
retried and none raises.

In-band errors (an error object inside an HTTP 200 body or an SSE ``error`` event; parsed by
:mod:`probes.sse`, the parser the normalizer uses) are ``provider_error``: retried when the
error's code is 5xx/429 or its type says overloaded / unavailable / server error / rate limit,
final otherwise.

Adaptive concurrency (:mod:`probes.concurrency`): every attempt is admitted by an AIMD limit
within ``rate_limits.concurrency``; a run of truncated streams / 429 / overload failures halves
the width (down to 1), successes grow it back by one; :meth:`ProbeClient.concurrency_stats`
records each change ("concurrency reduced 8→1 after 4 truncated_stream failures"). Backoff
sleeps hold no place.

Timing units are seconds (float, ``time.perf_counter``); timestamps are timezone-aware UTC.
The API key is read once from the environment (``ProviderConfig.resolve_api_key``), sent only in
the ``Authorization`` header, and scrubbed from every recorded body and error string.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import itertools
import json
import math
import ssl
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import tenacity

from probes import wire as _wire
from probes.concurrency import AdaptiveConcurrency
from probes.config import ProviderConfig
from probes.sse import SSELineDecoder, loads_json
from probes.wire import (
    LIMIT_KINDS,  # noqa: F401 -- re-exported (__all__)
    MALFORMED_KINDS,
    RETRYABLE_KINDS,
    RETRYABLE_STATUS,  # noqa: F401 -- re-exported (__all__)
    ParsedResponse,
    build_payload,
    chunk_tokens_by_choice,
    count_chunk_tokens,  # noqa: F401 -- re-exported (__all__)
    parse_response,
    parse_retry_after,
    parse_sse,
    stream_token_cap,
    suggest_base_url,
)

__all__ = ["AttemptRecord", "ProbeClient", "ProbeResult", "RateLimiter"]
__all__ += _wire.__all__  # the wire-format names, re-exported (their home is probes.wire)

#: Bytes of an over-cap body kept as evidence.
_EVIDENCE_BYTES = 64 * 1024
#: Bytes read from a non-2xx body (an error message) at most.
_ERROR_BODY_BYTES = 1024 * 1024
_REDACTED = "[REDACTED]"
#: Connections per pooled ``httpx.AsyncClient`` shard (see ``ProbeClient``).
_CONNS_PER_SHARD = 8

OnAttempt = Callable[[str, "AttemptRecord"], Awaitable[None] | None]


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
    """Time to the first token-bearing SSE chunk of choice 0 (streaming only)."""
    chunk_gaps_s: tuple[float, ...] = ()
    """Gaps between successive token-bearing chunks of choice 0 (streaming only)."""
    tokens_per_chunk: tuple[int, ...] = ()
    """Tokens in each token-bearing chunk of choice 0 (see :func:`count_chunk_tokens`)."""
    retry_after_s: float | None = None
    """Parsed ``Retry-After`` header, if any."""
    retryable: bool = False
    tokens_per_chunk_by_choice: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """``(choice index, tokens per token-bearing chunk)`` for every choice of an ``n > 1``
    stream (choice 0 included), in index order; empty when not streamed."""
    bytes_read: int = 0
    """Body bytes read (after Content-Encoding), at most ``max_response_bytes`` (+ one chunk)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (timestamps ISO 8601, tuples as lists)."""
        d = asdict(self)
        d["started_at"] = self.started_at.isoformat()
        d["chunk_gaps_s"] = list(self.chunk_gaps_s)
        d["tokens_per_chunk"] = list(self.tokens_per_chunk)
        d["tokens_per_chunk_by_choice"] = {str(i): list(v) for i, v in self.tokens_per_chunk_by_choice}
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
    """The JSON body sent in the last attempt (no headers)."""
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
    """The provider's ``usage`` object (``None`` when it sent none; see :attr:`usage_missing`)."""
    stream_options_dropped: bool = False
    """``stream_options`` was removed from ``request`` because the provider rejected it (HTTP 400)."""

    @property
    def usage_missing(self) -> bool:
        """True when the provider reported no integer ``prompt_tokens``/``completion_tokens``:
        spend must be counted with the reference tokenizer and marked estimated."""
        u = self.usage
        return not (
            isinstance(u, dict)
            and all(isinstance(u.get(k), int) and not isinstance(u.get(k), bool) for k in ("prompt_tokens", "completion_tokens"))
        )

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
        adaptive_concurrency: ``False`` keeps ``rate_limits.concurrency`` fixed instead of
            backing off on a run of truncated streams / 429s (:class:`AdaptiveConcurrency`).
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
        adaptive_concurrency: bool = True,
    ) -> None:
        self.config = config
        self.url = config.endpoint_url()
        self._key = api_key if api_key is not None else config.resolve_api_key()
        self._headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **config.headers}
        if self._key:
            self._headers["Authorization"] = f"Bearer {self._key}"
        conc = config.rate_limits.concurrency
        self._limiter = RateLimiter(config.rate_limits.requests_per_s)
        #: AIMD width within ``concurrency``: halves on a run of truncated streams / 429 /
        #: overload, grows back after successes (:mod:`probes.concurrency`); see :meth:`concurrency_stats`
        self.concurrency = AdaptiveConcurrency(conc, adaptive=adaptive_concurrency)
        self._on_attempt = on_attempt
        self._sleep = sleep or asyncio.sleep
        self._max_attempts = max_attempts or config.retry.max_attempts
        #: set once the provider rejects ``stream_options`` with a 400; later requests omit it
        self._stream_options_rejected = not config.capabilities.stream_usage
        #: whether any attempt reached the server (an HTTP status, or a timeout / read error after connecting)
        self._reached = False
        #: the error of a connection refused before the endpoint ever answered (then not retried; a runner
        #: stops sending, :attr:`unreachable`)
        self.unreachable: str | None = None
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

    def concurrency_stats(self) -> dict[str, object]:
        """Width changes of the adaptive limit (configured, current, min, each change, a
        one-line ``summary`` such as ``"concurrency reduced 8→1 after 4 truncated_stream
        failures"``; ``None`` when unchanged). JSON-ready."""
        return self.concurrency.stats()

    # -- helpers --
    def _scrub(self, text: str | None) -> str | None:
        if text is None or not self._key:
            return text
        return text.replace(self._key, _REDACTED)

    def _backoff_s(self, rec: AttemptRecord) -> float:
        """Wait before the attempt after ``rec``: its ``Retry-After`` (capped), else exponential
        backoff with jitter from the retry policy (tenacity's ``wait_exponential_jitter``)."""
        pol = self.config.retry
        if rec.retry_after_s is not None:
            return min(rec.retry_after_s, pol.max_retry_after_s)
        base = tenacity.wait_exponential_jitter(initial=pol.backoff_initial_s, max=pol.backoff_max_s, jitter=pol.backoff_initial_s)
        return float(base(types.SimpleNamespace(attempt_number=rec.attempt_no)))  # type: ignore[arg-type]

    def _should_retry(self, rec: AttemptRecord) -> bool:
        return rec.retryable

    async def _attempt(
        self, key: str, payload: bytes, stream: bool, attempt_no: int, api: str, time_left_s: float, token_cap: int | None
    ) -> tuple[AttemptRecord, ParsedResponse | None]:
        """One HTTP attempt, the body read incrementally within the configured bounds."""
        ticket = await self.concurrency.acquire()
        try:
            rec, pr = await self._attempt_admitted(key, payload, stream, attempt_no, api, time_left_s, token_cap)
        except BaseException:
            self.concurrency.release(ticket, error_kind="cancelled")
            raise
        self.concurrency.release(ticket, error_kind=rec.error_kind, http_status=rec.http_status, retryable=rec.retryable)
        return rec, pr

    async def _attempt_admitted(
        self, key: str, payload: bytes, stream: bool, attempt_no: int, api: str, time_left_s: float, token_cap: int | None
    ) -> tuple[AttemptRecord, ParsedResponse | None]:
        await self._limiter.acquire()
        shard = await self._slots.get()
        http = self._shards[shard]
        lim = self.config.response_limits
        cap = lim.max_response_bytes
        budget = min(float(self.config.timeout_s), max(0.0, time_left_s))
        deadline_bound = budget < float(self.config.timeout_s)
        try:
            started = _utcnow()
            t0 = time.perf_counter()
            status: int | None = None
            retry_after: float | None = None
            buf = bytearray()
            arrivals: list[float] = []
            per_choice: dict[int, list[int]] = {}
            n_tokens = 0
            n_events = 0
            limit_error: tuple[str, str] | None = None
            transport_error: tuple[str, str] | None = None
            content_type: str | None = None
            location: str | None = None
            stall_s = float(lim.stall_timeout_s)
            loop = asyncio.get_running_loop()
            stall: asyncio.Timeout | None = None
            sse: SSELineDecoder | None = None
            keepalives = 0
            body_started = False
            try:
                async with asyncio.timeout(budget), asyncio.timeout(None) as stall, \
                        http.stream("POST", self.url, content=payload) as resp:
                    status = resp.status_code
                    retry_after = parse_retry_after(resp.headers.get("retry-after"))
                    content_type = resp.headers.get("content-type")
                    location = resp.headers.get("location")
                    ok = 200 <= status < 300
                    sse = SSELineDecoder() if stream and ok else None
                    body_cap = cap if ok else min(cap, _ERROR_BODY_BYTES)
                    if sse is not None:  # a stream must bring a data event every stall_s (keep-alives are not one)
                        stall.reschedule(loop.time() + stall_s)
                    async for chunk in resp.aiter_bytes():
                        if sse is None and not body_started and chunk.strip():
                            body_started = True  # a plain body, once begun, must end within stall_s
                            stall.reschedule(loop.time() + stall_s)
                        if len(buf) + len(chunk) > body_cap:
                            if ok:
                                limit_error = (
                                    "response_too_large",
                                    f"response_too_large: body exceeds response_limits.max_response_bytes = {cap} "
                                    f"bytes; reading stopped, first {_EVIDENCE_BYTES} bytes kept",
                                )
                            buf += chunk[: max(0, body_cap - len(buf))]
                            break
                        buf += chunk
                        if sse is None:
                            continue
                        for _event, data in sse.feed(chunk):
                            if data in ("", "[DONE]"):
                                keepalives += data == ""
                                continue
                            stall.reschedule(loop.time() + stall_s)
                            n_events += 1
                            try:
                                counts = chunk_tokens_by_choice(api, loads_json(data))
                            except ValueError:
                                continue
                            if not counts:
                                continue
                            now = time.perf_counter()
                            for idx, n in counts.items():
                                per_choice.setdefault(idx, []).append(n)
                                n_tokens += n
                            if 0 in counts:
                                arrivals.append(now)
                        if token_cap is not None and (n_tokens > token_cap or n_events > 2 * token_cap + 256):
                            limit_error = (
                                "stream_token_overrun",
                                f"stream_token_overrun: {n_tokens} tokens in {n_events} events streamed, more than the "
                                f"{token_cap} tokens (or {2 * token_cap + 256} events) that max_tokens allows "
                                "(response_limits.stream_token_factor/stream_token_slack); stream cut",
                            )
                            break
            except (TimeoutError, httpx.TimeoutException) as exc:
                self._reached = self._reached or not isinstance(exc, httpx.ConnectTimeout)
                if stall is not None and stall.expired():
                    what = (f"no data event for {stall_s:g}s after {n_events} event(s) ({keepalives} keep-alive(s) "
                            f"and {sse.dropped_lines if sse is not None else 0} overlong line(s) do not count)"
                            if status is not None and stream and 200 <= status < 300 else
                            f"the body was still incomplete {stall_s:g}s after it began ({len(buf)} bytes read)")
                    transport_error = ("stalled", f"stalled: {what}; response_limits.stall_timeout_s; not retried")
                elif deadline_bound:
                    transport_error = ("deadline_exceeded", f"deadline_exceeded: the request's {self._deadline_s:g}s deadline ran out during attempt {attempt_no} ({type(exc).__name__})")
                else:
                    transport_error = ("timeout", f"timeout: no complete response within {self.config.timeout_s:g}s ({type(exc).__name__})")
            except httpx.ConnectError as exc:
                transport_error = ("connect_error", f"connect_error: cannot connect to {self.url}: {exc}")
                if not self._reached:  # never answered: the endpoint is down or base_url is wrong; fail fast
                    self.unreachable = transport_error[1] + (
                        " (no answer from this endpoint yet, so not retried: is the server running, and is base_url right?)")
                    transport_error = ("connect_error", self.unreachable)
            except httpx.TransportError as exc:
                self._reached = True
                transport_error = ("read_error", f"read_error: {type(exc).__name__}: {exc}")
            latency = time.perf_counter() - t0
            if status is not None:
                self._reached = True
        finally:
            self._slots.put_nowait(shard)

        n_read = len(buf)
        if limit_error is not None:
            del buf[_EVIDENCE_BYTES:]
        body = self._scrub(buf.decode("utf-8", errors="replace")) if buf else None
        del buf
        pr: ParsedResponse | None = None
        kind: str | None
        err: str | None
        if limit_error is not None:
            kind, err = limit_error
            retryable = False
            parsed_ok = False
        elif transport_error is not None:
            kind, err = transport_error
            if kind not in ("deadline_exceeded", "stalled") and stream and status is not None and 200 <= status < 300 and body:
                kind, err = "truncated_stream", f"truncated_stream: {err}"
            retryable = kind in RETRYABLE_KINDS or (kind in MALFORMED_KINDS and self.config.retry.retry_malformed)
            if kind == "connect_error" and self.unreachable is not None and not self._reached:
                retryable = False
            parsed_ok = False
        else:
            pr = parse_response(api, status, body, stream=stream, content_type=content_type, location=location,
                                suggested_base_url=suggest_base_url(self.config.base_url, self.url, location)
                                if location else None)
            kind, err, parsed_ok = pr.error_kind, pr.error, pr.ok
            retryable = pr.retryable and (kind not in MALFORMED_KINDS or self.config.retry.retry_malformed)
        tpc0 = tuple(per_choice.get(0, ()))
        rec = AttemptRecord(
            attempt_no=attempt_no,
            started_at=started,
            latency_s=latency,
            http_status=status,
            error=None if parsed_ok else self._scrub(err),
            error_kind=None if parsed_ok else kind,
            response_text=body,
            ttft_s=(arrivals[0] - t0) if arrivals else None,
            chunk_gaps_s=tuple(b - a for a, b in itertools.pairwise(arrivals)),
            tokens_per_chunk=tpc0,
            retry_after_s=retry_after,
            retryable=(not parsed_ok) and retryable,
            tokens_per_chunk_by_choice=tuple((i, tuple(v)) for i, v in sorted(per_choice.items())),
            bytes_read=n_read,
        )
        return rec, pr

    @property
    def _deadline_s(self) -> float:
        d = self.config.response_limits.request_deadline_s
        return float(d) if d is not None else float(self.config.timeout_s) * self._max_attempts

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
        A 400 that names ``stream_options`` is retried at once without that field (and the
        client leaves it out for this provider from then on). The whole request ends at the
        deadline (``response_limits.request_deadline_s``): an attempt cut by it, or a retry its
        wait would push past it, ends as ``deadline_exceeded`` (not retryable, so the
        ``on_attempt`` record already says it is final).
        """
        api = self.config.api
        do_stream = bool(payload.get("stream")) if stream is None else stream
        sent = dict(payload)
        if self._stream_options_rejected and "stream_options" in sent:
            sent.pop("stream_options")
        blob = [json.dumps(sent, allow_nan=False).encode()]
        next_wait = [0.0]
        token_cap = stream_token_cap(payload, self.config) if do_stream else None
        cb = on_attempt if on_attempt is not None else self._on_attempt
        attempts: list[AttemptRecord] = []
        parsed: list[ParsedResponse | None] = [None]
        t_start = time.monotonic()
        deadline = t_start + self._deadline_s

        async def one() -> AttemptRecord:
            left = deadline - time.monotonic()
            rec, pr = await self._attempt(key, blob[0], do_stream, len(attempts) + 1, api, left, token_cap)
            next_wait[0] = 0.0
            if rec.http_status == 400 and "stream_options" in sent and "stream_options" in (rec.response_text or "").lower():
                self._stream_options_rejected = True
                sent.pop("stream_options")
                blob[0] = json.dumps(sent, allow_nan=False).encode()
                rec = dataclasses.replace(rec, retryable=rec.attempt_no < self._max_attempts)
            elif rec.retryable and rec.attempt_no < self._max_attempts:
                wait = self._backoff_s(rec)
                if time.monotonic() + wait >= deadline:
                    rec = dataclasses.replace(
                        rec,
                        retryable=False,
                        error_kind="deadline_exceeded",
                        error=f"deadline_exceeded: no time left in the request's {self._deadline_s:g}s deadline for a retry after: {rec.error}",
                    )
                else:
                    next_wait[0] = wait
            parsed[0] = pr
            attempts.append(rec)
            if cb is not None:
                out = cb(key, rec)
                if inspect.isawaitable(out):
                    await out
            return rec

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self._max_attempts),
            wait=lambda _state: next_wait[0],
            retry=tenacity.retry_if_result(self._should_retry),
            retry_error_callback=lambda st: st.outcome.result(),  # type: ignore[union-attr]
            sleep=self._sleep,
            reraise=True,
        )
        last: AttemptRecord = await retrying(one)
        finished = _utcnow()
        pr = parsed[0] if last.error is None else None
        return ProbeResult(
            key=key,
            request=sent,
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
            stream_options_dropped="stream_options" in payload and "stream_options" not in sent,
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
        return loads_json(text)
    except ValueError:
        return None
