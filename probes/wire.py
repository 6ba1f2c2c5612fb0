"""The wire API of OpenAI-compatible endpoints as pure functions (no I/O), used by :mod:`probes.client`.

Only these functions know the request and response shapes (after lm-evaluation-harness and
HELM): :func:`build_payload` (probe + config → request body) and :func:`parse_response` (HTTP
status + raw body → :class:`ParsedResponse`), plus the stream helpers the client uses while a
body arrives (:func:`chunk_tokens_by_choice`, :func:`stream_token_cap`) and
:func:`parse_retry_after`. Bodies, SSE and in-band errors are read by :mod:`probes.sse`, the
parser the normalizer uses too.

API docs: OpenAI Chat Completions and (legacy) Completions, including ``stream`` (server-sent
events, ``data: {...}`` lines ending with ``data: [DONE]``) and ``stream_options.include_usage``;
``Retry-After``: RFC 9110 §10.2.3.
"""

from __future__ import annotations

import email.utils
import html
import math
import re
import time
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import urljoin

from probes.config import ProviderConfig
from probes.sse import JSONTooDense, find_error, loads_json, looks_like_plain_json
from probes.sse import parse_sse as _parse_sse_body

__all__ = [
    "EMPTY_KINDS",
    "ENDPOINT_KINDS",
    "LIMIT_KINDS",
    "MALFORMED_KINDS",
    "RETRYABLE_KINDS",
    "RETRYABLE_STATUS",
    "ParsedResponse",
    "build_payload",
    "chunk_tokens_by_choice",
    "count_chunk_tokens",
    "describe_error",
    "parse_response",
    "parse_retry_after",
    "parse_sse",
    "stream_token_cap",
    "suggest_base_url",
]

#: HTTP statuses worth retrying: timeouts, conflicts, rate limits and server errors.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})
#: Error kinds (``ProbeResult.error_kind``) that a retry may fix (``connect_error`` only once the endpoint has
#: answered: :class:`probes.client.ProbeClient` fails fast on a first connection refused).
RETRYABLE_KINDS = frozenset({"timeout", "connect_error", "read_error", "rate_limited", "server_error", "empty_stream",
                             "empty_answer"})
#: Failure kinds of an endpoint that is not the API at all (never retried; the message says what to change):
ENDPOINT_KINDS: dict[str, str] = {
    "html_response": "a 2xx answer that is an HTML page (a sign-in, proxy or docs page): base_url is not the API",
    "redirect": "a 3xx answer: the API moved; redirects are not followed, base_url should change to where it points",
}
#: Answers that end without content and without a finish reason (retried; a pressure failure, since a server
#: ends a running answer this way when another request waits, as llama.cpp's does):
EMPTY_KINDS: dict[str, str] = {
    "empty_stream": "an SSE stream that ended ([DONE]) after a role chunk with no content and no finish_reason",
    "empty_answer": "a plain answer with empty content and no finish_reason",
}
#: Error kinds that are retried only when ``RetryPolicy.retry_malformed`` is set.
MALFORMED_KINDS = frozenset({"malformed_json", "truncated_stream", "malformed_response"})
#: Failure kinds of the resource bounds (``ProviderConfig.response_limits``); never retried.
LIMIT_KINDS: dict[str, str] = {
    "response_too_large": "the body exceeded response_limits.max_response_bytes and was dropped, or is JSON too dense to decode safely",
    "stream_token_overrun": "the stream carried more tokens than max_tokens allows (factor x max_tokens x n + slack)",
    "deadline_exceeded": "the request (retries and backoff included) ran past its whole-request deadline",
    "stalled": "the answer made no progress for response_limits.stall_timeout_s (a stream of keep-alives only, or a "
               "body trickling bytes)",
}


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
      ``stream_options.include_usage`` when ``capabilities.stream_usage`` (default on).
    - ``config.enforced`` (:meth:`probes.config.EnforcedParams.apply`): a declared value replaces the
      probe's (the stored request states the law the provider applies), a rejected parameter is left out.
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
    config.enforced.apply(body)
    do_stream = caps.streaming if stream is None else bool(stream)
    if do_stream:
        body["stream"] = True
        if caps.stream_usage:
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
    ``truncated_stream`` | ``provider_error`` | ``malformed_response`` | ``response_too_large``
    (JSON too dense to decode safely) | ``None``."""
    error: str | None = None
    """Human-readable detail, prefixed by the kind."""
    retryable: bool = False
    """Whether a retry may help (status 429/5xx, malformed or truncated body, a provider error
    that says overloaded/unavailable/5xx)."""
    text: str | None = None
    """Generated text of choice 0 (concatenated deltas for a stream)."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def parse_sse(body: str) -> tuple[list[Any], bool, str | None]:
    """Split a server-sent-events body into decoded ``data:`` payloads (:func:`probes.sse.parse_sse`).

    Returns ``(events, done, error)``: ``done`` is True when ``data: [DONE]`` was seen; ``error``
    describes the first undecodable event (later events are still decoded). Pure.
    """
    sse = _parse_sse_body(body)
    return sse.events, sse.done, (sse.malformed[0] if sse.malformed else None)


def _choice_tokens(api: str, ch: dict[str, Any]) -> int:
    lp = ch.get("logprobs")
    if isinstance(lp, dict):
        if isinstance(lp.get("content"), list):
            return len(lp["content"])
        if isinstance(lp.get("tokens"), list):
            return len(lp["tokens"])
    if api == "chat":
        delta = ch.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
    else:
        content = ch.get("text")
    return 1 if content else 0


def chunk_tokens_by_choice(api: str, chunk: Any) -> dict[int, int]:
    """Tokens carried by one streamed chunk, per choice ``index`` (choices with none omitted).

    Uses each choice's logprobs entries when present (exact; either logprobs shape); otherwise
    1 when it carries non-empty text, else 0 (role-only or usage-only chunks). Without logprobs
    this is a lower bound: a multi-token chunk counts 1.
    """
    out: dict[int, int] = {}
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return out
    for ch in chunk["choices"]:
        if not isinstance(ch, dict):
            continue
        idx = ch.get("index", 0)
        idx = idx if isinstance(idx, int) and not isinstance(idx, bool) else 0
        n = _choice_tokens(api, ch)
        if n:
            out[idx] = out.get(idx, 0) + n
    return out


def count_chunk_tokens(api: str, chunk: Any, choice: int = 0) -> int:
    """Tokens carried by one streamed chunk for choice ``choice`` (see :func:`chunk_tokens_by_choice`)."""
    return chunk_tokens_by_choice(api, chunk).get(choice, 0)


def stream_token_cap(payload: dict[str, Any], config: ProviderConfig) -> int | None:
    """Most tokens a stream for ``payload`` may carry before ``stream_token_overrun``:
    ``factor × max_tokens × n + slack`` (``config.response_limits``); ``None`` without ``max_tokens``."""
    mt = payload.get("max_tokens", payload.get("max_completion_tokens"))
    if not isinstance(mt, int) or isinstance(mt, bool) or mt <= 0:
        return None
    n = payload.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    lim = config.response_limits
    return math.ceil(lim.stream_token_factor * mt * n) + lim.stream_token_slack


#: Stored-body allowance per token a request can bring back: the chunk/entry around it, and per alternative.
_STORED_BYTES_PER_TOKEN = 512
_STORED_BYTES_PER_ALTERNATIVE = 160
#: Stored-body allowance for what does not scale with tokens (headers of the body, usage, errors).
_STORED_BYTES_BASE = 64 * 1024
#: What a body keeps once the run's stored-bytes budget is spent.
STORED_EVIDENCE_CHARS = 4096


def stored_body_cap(payload: dict[str, Any], config: ProviderConfig) -> int:
    """Most characters of one attempt's raw body the store keeps (issue 37, item 11): what the
    request can bring back — tokens (:func:`stream_token_cap`, plus an echoed prompt's characters)
    × (512 + 160 × (alternatives asked + 1)) + 64 KiB — at most
    ``response_limits.max_stored_body_bytes`` (also the cap when the request has no ``max_tokens``)."""
    ceiling = config.response_limits.max_stored_body_bytes
    # the stream cap is the token bound whether streamed or not (a plain body holds the same tokens)
    tokens = stream_token_cap(payload, config)
    if tokens is None:
        return ceiling
    prompt = payload.get("prompt")
    if payload.get("echo") and isinstance(prompt, (str, list)):
        tokens += len(prompt) if isinstance(prompt, str) else sum(len(str(p)) for p in prompt)
    k = payload.get("top_logprobs") if "messages" in payload else payload.get("logprobs")
    k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 0
    per = _STORED_BYTES_PER_TOKEN + _STORED_BYTES_PER_ALTERNATIVE * (k + 1)
    return min(ceiling, _STORED_BYTES_BASE + tokens * per)


def stored_body(text: str | None, cap: int) -> str | None:
    """``text`` cut to ``cap`` characters, with a note naming what was dropped (``None`` stays)."""
    if text is None or len(text) <= cap:
        return text
    return text[:cap] + f"\n[spec-auditor: {len(text) - cap} more characters of this body not stored (cap {cap})]"


def _choice_text(api: str, choice: dict[str, Any], stream: bool) -> str:
    if api == "chat":
        part = choice.get("delta" if stream else "message") or {}
        val = part.get("content") if isinstance(part, dict) else None
    else:
        val = choice.get("text")
    return val if isinstance(val, str) else ""


def _error_message(body: Any) -> str | None:
    err = find_error(body)
    return err.describe() if err is not None else None


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)


def _is_html(content_type: str | None, body: str) -> bool:
    if content_type is not None and content_type.split(";", 1)[0].strip().lower() in ("text/html", "application/xhtml+xml"):
        return True
    head = body.lstrip()[:64].lower()
    return head.startswith(("<!doctype html", "<html"))


def _html_title(body: str) -> str:
    m = _TITLE.search(body[:65536])
    title = " ".join(html.unescape(m.group(1)).split())[:120] if m else ""
    return f"title {title!r}" if title else "no title"


def suggest_base_url(base_url: str, endpoint_url: str, location: str) -> str | None:
    """The ``base_url`` that would reach the endpoint a redirect points at: ``location`` (made absolute
    against ``endpoint_url``) without the endpoint's path below ``base_url`` (``/chat/completions``);
    None when ``location`` does not end with that path. Pure."""
    target = urljoin(endpoint_url, location)
    suffix = endpoint_url[len(base_url.rstrip("/")):] if endpoint_url.startswith(base_url.rstrip("/")) else ""
    if suffix and target.split("?", 1)[0].endswith(suffix):
        return target.split("?", 1)[0][: -len(suffix)]
    return None


def parse_response(
    api: str,
    status: int | None,
    body: str | bytes | None,
    *,
    stream: bool = False,
    content_type: str | None = None,
    location: str | None = None,
    suggested_base_url: str | None = None,
) -> ParsedResponse:
    """Classify and decode one HTTP response. Pure; never raises on bad input.

    ``status`` is the HTTP status (``None`` when no response arrived), ``body`` the raw body
    (for ``stream=True`` the whole SSE text), ``content_type`` and ``location`` the response's headers
    (None when absent), ``suggested_base_url`` the base_url that reaches ``location``
    (:func:`suggest_base_url`). A stream without ``data: [DONE]`` is
    ``truncated_stream``; a body that is not JSON is ``malformed_json``; a 2xx with an error
    object (or an SSE error event) is ``provider_error``, retryable when the error says so
    (:attr:`probes.sse.ProviderError.retryable`); a 2xx without ``choices``, or a stream with no
    content events (e.g. only ``data: [DONE]``), is ``malformed_response``. A 2xx HTML page is
    ``html_response`` and a 3xx ``redirect`` (:data:`ENDPOINT_KINDS`, never retried); an answer with no
    content and no ``finish_reason`` is ``empty_stream`` / ``empty_answer`` (:data:`EMPTY_KINDS`, retried).
    An error status quotes the server: its error object's message, else the title of an HTML page, else
    the body's first 200 characters.
    """
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", errors="replace")
    body = body or ""
    if status is None:
        return ParsedResponse(False, None, "read_error", "read_error: no response", True)
    if 300 <= status < 400:
        where = f"redirects to {location}" if location else "redirects (no Location header)"
        fix = (f"set base_url = \"{suggested_base_url}\"" if suggested_base_url else "point base_url at the new address")
        return ParsedResponse(False, None, "redirect", f"redirect: http_{status}: the server {where}; redirects are "
                              f"not followed (a request's body and key must not go elsewhere unasked): {fix}", False)
    html_page = _is_html(content_type, body)
    if not 200 <= status < 300:
        try:
            decoded = loads_json(body) if body.strip() and not html_page else None
        except ValueError:
            decoded = None
        msg = _error_message(decoded) or (f"an HTML page ({_html_title(body)})" if html_page else body.strip()[:200])
        if status == 429:
            kind = "rate_limited"
        elif status >= 500 or status in RETRYABLE_STATUS:
            kind = "server_error"
        else:
            kind = "http_error"
        return ParsedResponse(False, decoded, kind, f"http_{status}: {msg}", status in RETRYABLE_STATUS)
    if html_page:
        return ParsedResponse(False, None, "html_response", f"html_response: HTTP {status} with an HTML page "
                              f"({_html_title(body)}) instead of an API answer: base_url points at a web page (a "
                              "sign-in, proxy or docs page), not the OpenAI-compatible API (which usually ends in /v1)",
                              False)

    if stream and looks_like_plain_json(body):
        # the server ignored stream=true and answered with a plain JSON body
        return parse_response(api, status, body, stream=False)
    if stream:
        sse = _parse_sse_body(body)
        events = sse.events
        if sse.errors:
            idx, err = sse.errors[0]
            return ParsedResponse(False, events, "provider_error", f"provider_error: SSE event {idx}: {err.describe()}", err.retryable)
        if sse.malformed:
            return ParsedResponse(False, events, "malformed_json", f"malformed_json: {sse.malformed[0]}", True)
        if not sse.done:
            return ParsedResponse(False, events, "truncated_stream", f"truncated_stream: {len(events)} events, no [DONE]", True)
        text_parts: list[str] = []
        finish = None
        usage: dict[str, Any] | None = None
        seen_choice = False
        for ev in events:
            if not isinstance(ev, dict):
                return ParsedResponse(False, events, "malformed_response", "malformed_response: stream event is not an object", False)
            u = ev.get("usage")
            if isinstance(u, dict):
                usage = u
            chs = ev.get("choices")
            for ch in chs if isinstance(chs, list) else []:
                if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                    continue
                seen_choice = True
                text_parts.append(_choice_text(api, ch, True))
                finish = ch.get("finish_reason") or finish
        if not seen_choice:
            # e.g. only data: [DONE]: generation failed before its first token (vllm#40978)
            return ParsedResponse(False, events, "malformed_response", f"malformed_response: stream has no content events ({len(events)} events)", True)
        text = "".join(text_parts)
        if not text and finish is None and not sum(count_chunk_tokens(api, ev) for ev in events):
            # llama.cpp's server ends a running stream this way when another request waits
            return ParsedResponse(False, events, "empty_stream", f"empty_stream: the stream ended ([DONE], {len(events)} "
                                  "events) without content and without a finish_reason (a server ending a running "
                                  "answer, e.g. because another request waits)", True)
        return ParsedResponse(True, events, text=text, finish_reason=finish, usage=usage)

    try:
        decoded = loads_json(body)
    except JSONTooDense as exc:
        return ParsedResponse(False, None, "response_too_large", f"response_too_large: {exc}", False)
    except ValueError as exc:
        return ParsedResponse(False, None, "malformed_json", f"malformed_json: {exc}: {body[:80]!r}", True)
    perr = find_error(decoded)
    if perr is not None:
        return ParsedResponse(False, decoded, "provider_error", f"provider_error: {perr.describe()}", perr.retryable)
    chs = decoded.get("choices") if isinstance(decoded, dict) else None
    if not isinstance(decoded, dict) or not isinstance(chs, list) or not chs:
        return ParsedResponse(False, decoded, "malformed_response", "malformed_response: no choices in body", False)
    ch0 = chs[0]
    if not isinstance(ch0, dict):
        return ParsedResponse(False, decoded, "malformed_response", "malformed_response: choice is not an object", False)
    u = decoded.get("usage")
    usage = u if isinstance(u, dict) else None
    text, finish = _choice_text(api, ch0, False), ch0.get("finish_reason")
    if not text and finish is None and not _choice_tokens(api, ch0):
        return ParsedResponse(False, decoded, "empty_answer", "empty_answer: the answer has no content and no "
                              "finish_reason (a server ending a running answer, e.g. because another request waits)", True)
    return ParsedResponse(True, decoded, text=text, finish_reason=finish, usage=usage)


_HTTP_PREFIX = re.compile(r"^(?:[a-z_]+: )?http_(\d{3}):\s*")


def describe_error(error: str, limit: int = 300) -> str:
    """An attempt's error string for a person: the kind prefix dropped where the status says it
    (``http_error: http_401: msg`` and ``http_401: msg`` → ``HTTP 401: msg``), at most ``limit`` characters."""
    text = _HTTP_PREFIX.sub(lambda m: f"HTTP {m.group(1)}: ", error.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
