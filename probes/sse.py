"""One parser for provider bodies: server-sent events, JSON decoding and in-band error objects.

Shared by the client (:mod:`probes.client`, which classifies attempts and decides retries) and
the normalizer (:mod:`probes.normalize`, which reports anomalies), so both read a body the same
way and name what they find with one vocabulary (:data:`BODY_ANOMALIES`, a subset of
``probes.anomalies.ANOMALY_KINDS``).

Wire format (WHATWG HTML "Server-sent events" §9.2, as used by the OpenAI streaming API): a
body is lines ending in ``\\n``, ``\\r\\n`` or ``\\r``; ``field: value`` lines; a blank line ends an
event; lines starting with ``:`` are comments. Only the ``event`` and ``data`` fields matter here.
LLM servers put one JSON object per ``data:`` line, and some omit the blank separator, so each
``data:`` line is read as one payload (multi-line ``data`` joining is not used by any OpenAI-style
API). ``data: [DONE]`` ends the stream. An ``event: error`` field (Anthropic-style, some proxies)
marks the following payload as an error object.

In-band errors: a ``2xx`` body (or one stream event) that carries ``{"error": {...}}``,
``{"error": "text"}`` or vLLM's ``{"object": "error", "message": ..., "code": N}``.
:func:`find_error` extracts it; :attr:`ProviderError.retryable` says whether a retry may help
(5xx/429/408 codes, or an ``overloaded``/``unavailable``/``server_error``/rate-limit type).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

__all__ = [
    "BODY_ANOMALIES",
    "JSONTooDense",
    "JSONValue",
    "ProviderError",
    "SSEBody",
    "SSELineDecoder",
    "find_error",
    "loads_json",
    "looks_like_plain_json",
    "parse_sse",
]

#: JSON as decoded by :func:`json.loads` (``object`` stands for nested values).
JSONValue = dict[str, object] | list[object] | str | int | float | bool | None

#: Body-level anomaly kinds this module's callers report (meanings as in ``../shared/cases/README.md``).
BODY_ANOMALIES: dict[str, str] = {
    "malformed_json": "the body or an SSE event is not valid JSON",
    "malformed_response": "valid JSON but not a usable answer: no choices, or a stream with no content events",
    "truncated_stream": "an SSE stream ended without data: [DONE]",
    "empty_stream": "an SSE stream ended (data: [DONE]) with no content and no finish_reason",
    "empty_answer": "a plain (non-streamed) answer with no content and no finish_reason",
    "provider_error": "an error object inside an HTTP 200 body or an SSE error event",
}

#: Error ``type``/``code`` words that mean "try again later" (lower-cased substrings).
_RETRY_WORDS = (
    "overload",
    "unavailable",
    "server_error",
    "internal_error",
    "internalservererror",
    "rate_limit",
    "ratelimit",
    "too_many_requests",
    "timeout",
    "capacity",
    "try again",
    "temporarily",
)
_RETRY_STATUS = frozenset({408, 409, 425, 429})


class _JSONError(ValueError):
    pass


class JSONTooDense(ValueError):
    """A large JSON text with so many objects/arrays per byte that decoding it would take many
    times its size in memory (a hostile body); see :func:`loads_json`."""


#: Texts above this many characters are checked for container density before decoding.
DENSITY_CHECK_CHARS = 1 << 20
#: Most ``{``/``[`` per character allowed in a large text. Real answers have about 1 in 20-30
#: (``{"token":"a","logprob":-1,"bytes":[97]}`` is 2 in 40); ``[{},{},...]`` is 1 in 3 and
#: decodes to ~24x its size.
MAX_CONTAINER_DENSITY = 0.1


def loads_json(text: str | bytes) -> JSONValue:
    """Decode JSON, accepting the non-strict ``NaN``/``Infinity``/``-Infinity`` some engines emit.

    Raises ``ValueError`` (never ``RecursionError``) for anything undecodable, including
    pathologically deep nesting from a hostile body, and :class:`JSONTooDense` (a ``ValueError``)
    for a text over :data:`DENSITY_CHECK_CHARS` with more than :data:`MAX_CONTAINER_DENSITY`
    objects/arrays per character, whose decoded form would need many times its size in memory.
    """
    if len(text) > DENSITY_CHECK_CHARS:
        t = text if isinstance(text, str) else text.decode("utf-8", errors="replace")
        n = t.count("{") + t.count("[")
        if n > MAX_CONTAINER_DENSITY * len(t):
            raise JSONTooDense(f"{n} JSON objects/arrays in {len(t)} characters: too dense to decode safely")
    try:
        value: JSONValue = json.loads(text)
    except RecursionError:
        raise _JSONError("JSON nested too deeply to decode") from None
    return value


def looks_like_plain_json(text: str) -> bool:
    """True when a body sent for a streamed request is a plain JSON object (stream ignored)."""
    head = text.lstrip()
    return head.startswith("{") and "data:" not in head[:64]


@dataclass(frozen=True, slots=True)
class ProviderError:
    """An error object found inside a 2xx body or a stream event.

    ``code`` and ``type`` are as sent (``code`` may be an HTTP-like int or a string such as
    ``"rate_limit_exceeded"``); ``status`` is ``code`` read as an HTTP status when it is one.
    """

    message: str
    code: str | int | None = None
    type: str | None = None
    status: int | None = None

    @property
    def retryable(self) -> bool:
        """A retry may help: a 5xx/408/409/425/429 ``code``, or an overloaded / unavailable /
        server-error / rate-limit ``type`` or ``code`` word (or such a message without a 4xx
        code). A 4xx ``code`` other than those is final (the request itself is at fault)."""
        if self.status is not None:
            return self.status >= 500 or self.status in _RETRY_STATUS
        words = " ".join(str(x).lower() for x in (self.type, self.code, self.message) if x is not None)
        return any(w in words for w in _RETRY_WORDS)

    def describe(self) -> str:
        """``message`` plus code/type, for an attempt's error string (at most ~300 characters)."""
        extra = ", ".join(f"{k}={v}" for k, v in (("code", self.code), ("type", self.type)) if v is not None)
        return (self.message[:240] + (f" ({extra})" if extra else ""))[:300]


def _as_status(code: object) -> int | None:
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code if 100 <= code <= 599 else None
    if isinstance(code, str) and re.fullmatch(r"[1-5]\d\d", code.strip()):
        return int(code)
    return None


def find_error(obj: object, *, event: str | None = None) -> ProviderError | None:
    """The error object carried by a decoded body or stream event, or ``None``.

    Recognised shapes: ``{"error": {...}}`` / ``{"error": "text"}`` (OpenAI, vLLM, llama.cpp),
    ``{"type": "error", "error": {...}}`` (Anthropic-style), ``{"object": "error", "message": ...}``
    (vLLM's ``ErrorResponse``), and any payload of an SSE event named ``error`` (``event``).
    """
    if not isinstance(obj, dict):
        if event == "error":
            return ProviderError(message=str(obj)[:240])
        return None
    err = obj.get("error")
    src: dict[str, object] | None = None
    if isinstance(err, dict) and err:
        src = err
    elif isinstance(err, str) and err:
        return ProviderError(message=err, code=_scalar(obj.get("code")), status=_as_status(obj.get("code")))
    elif err not in (None, False, "", {}):
        return ProviderError(message=str(err)[:240])
    elif obj.get("object") == "error" or event == "error":
        src = obj
    if src is None:
        return None
    code = _scalar(src.get("code", obj.get("code")))
    status = _as_status(src.get("status", src.get("code", obj.get("code"))))
    typ = src.get("type")
    msg = src.get("message")
    return ProviderError(
        message=str(msg) if msg is not None else json.dumps(src, default=str)[:240],
        code=code,
        type=str(typ) if typ is not None and typ != "error" else None,
        status=status,
    )


def _scalar(v: object) -> str | int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, str)):
        return v
    return str(v)[:80]


@dataclass(slots=True)
class SSEBody:
    """A parsed SSE body: decoded payloads, whether ``[DONE]`` came, and what went wrong.

    ``events`` keeps the decoded ``data:`` payloads in order (undecodable ones are skipped);
    ``malformed`` describes each undecodable payload; ``errors`` lists ``(event index, error)``
    for in-band error objects (index into ``events``).
    """

    events: list[JSONValue] = field(default_factory=list)
    done: bool = False
    malformed: list[str] = field(default_factory=list)
    errors: list[tuple[int, ProviderError]] = field(default_factory=list)
    data_after_done: int = 0
    """Payloads that arrived after ``data: [DONE]`` (ignored)."""


def _read_fields(lines: list[str], event: str | None) -> tuple[list[tuple[str | None, str]], str | None]:
    """``(event name or None, data)`` per ``data:`` line, and the event name still in force
    (a name lasts until the blank line that ends its event)."""
    out: list[tuple[str | None, str]] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            event = None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "event":
            event = value.strip() or None
        elif name == "data":
            out.append((event, value.strip()))
    return out, event


def parse_sse(text: str) -> SSEBody:
    """Parse a whole SSE body (see the module docstring). Pure; never raises."""
    out = SSEBody()
    for event, data in _read_fields(text.splitlines(), None)[0]:
        if data == "[DONE]":
            out.done = True
            continue
        if not data:
            continue
        if out.done:
            out.data_after_done += 1
            continue
        try:
            obj = loads_json(data)
        except ValueError as exc:
            out.malformed.append(f"event {len(out.events) + len(out.malformed)}: {exc}: {data[:80]!r}")
            if event == "error":
                out.errors.append((len(out.events), ProviderError(message=data[:240])))
            continue
        err = find_error(obj, event=event)
        if err is not None:
            out.errors.append((len(out.events), err))
        out.events.append(obj)
    return out


class SSELineDecoder:
    """Incremental SSE reader for a byte stream: feed chunks, get ``(event, data)`` pairs.

    Splits on ``\\n``, ``\\r\\n`` and ``\\r`` across chunk boundaries and decodes UTF-8 per line
    (invalid bytes become U+FFFD). A line is held in memory until its end arrives, up to
    ``max_line_bytes``; a longer line is dropped (``dropped_lines``). Callers still bound the
    total bytes fed (the client's per-response byte cap).
    """

    def __init__(self, max_line_bytes: int = 1024 * 1024) -> None:
        self._buf = bytearray()
        self._event: str | None = None
        self._cr_pending = False
        self._skipping = False
        self.max_line_bytes = max_line_bytes
        """Longest line kept (bytes); a longer one is dropped whole, so the decoder never holds
        more than this however long a hostile line is."""
        self.dropped_lines = 0
        """Lines dropped for exceeding ``max_line_bytes``."""

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        """Consume ``chunk``; return the ``(event name, data)`` of each complete ``data:`` line.

        Linear in ``len(chunk)`` (a hostile body with no line ending never causes rescans)."""
        data = bytes(chunk)
        if self._cr_pending and data.startswith(b"\n"):
            data = data[1:]
        self._cr_pending = False
        if b"\r" in data:
            self._cr_pending = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = data.split(b"\n")
        lines: list[str] = []
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if not self._skipping:
                self._buf += part
                if len(self._buf) > self.max_line_bytes:
                    self._buf.clear()
                    self._skipping = True
                    self.dropped_lines += 1
            if last:
                break
            if self._skipping:
                self._skipping = False  # the overlong line ends here
            else:
                lines.append(self._buf.decode("utf-8", errors="replace"))
                self._buf.clear()
        return self._fields(lines)

    def close(self) -> list[tuple[str | None, str]]:
        """Flush a last line that had no line ending."""
        rest = "" if self._skipping else self._buf.decode("utf-8", errors="replace")
        self._buf.clear()
        self._skipping = False
        return self._fields([rest] if rest else [])

    def _fields(self, lines: list[str]) -> list[tuple[str | None, str]]:
        out, self._event = _read_fields(lines, self._event)
        return out
