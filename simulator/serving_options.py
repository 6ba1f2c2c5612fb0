"""The serving options of :func:`simulator.server.create_app` (``auditor serve``'s flags): their allowed
values and the checks that refuse anything else with a ``ValueError`` naming the option.

Stream chunking, reasoning mode and its logprobs, the chat logprob convention, and the sampling
parameters the server fixes (``enforce``) or refuses (``reject``); the requests themselves are
checked against them by ``simulator.request_handling.SimulatorApp``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: ``create_app(stream_chunking=...)`` values: one SSE chunk per round, per token, or per time interval.
STREAM_CHUNKINGS = ("round", "token", "time")
#: ``create_app(reasoning=...)`` values: where the reasoning goes (see :func:`create_app`).
REASONING_MODES = ("field", "field-reasoning", "inline")
#: ``create_app(reasoning_logprobs=...)`` values: what ``logprobs.content`` covers.
REASONING_LOGPROBS = ("both", "answer")
#: How chat ``logprobs.content`` is spelled (``create_app(logprob_convention=...)``).
LOGPROB_CONVENTIONS = ("openai", "vllm")
#: Parameters ``create_app(enforce=...)`` may fix, and those ``reject`` may refuse.
ENFORCEABLE = ("temperature", "top_p", "top_k")
REJECTABLE = ("temperature", "top_p", "top_k", "seed")


def parse_enforce(text: str | None) -> dict[str, float]:
    """``"temperature=1.0,top_p=0.95"`` → ``{"temperature": 1.0, "top_p": 0.95}`` (``auditor serve --enforce``).

    Raises:
        ValueError: an item without ``=`` or with a value that is no number, naming it.
    """
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--enforce: {item.strip()!r} is not PARAM=NUMBER (e.g. temperature=1.0,top_p=0.95)") from None
    check_enforce(out, ())
    return out


def check_enforce(enforce: Mapping[str, float], reject: Sequence[str]) -> None:
    """Validate ``create_app``'s ``enforce`` / ``reject``.

    Raises:
        ValueError: an unknown parameter name, or a value out of its range (temperature in [0, 2],
            top_p in (0, 1], top_k >= 1), naming the parameter.
    """
    for k, v in enforce.items():
        if k not in ENFORCEABLE:
            raise ValueError(f"enforce: unknown parameter {k!r}; use {', '.join(ENFORCEABLE)}")
        ok = {"temperature": 0.0 <= v <= 2.0, "top_p": 0.0 < v <= 1.0, "top_k": v >= 1 and float(v).is_integer()}[k]
        if not ok:
            raise ValueError(f"enforce: {k}={v} is out of range (temperature in [0, 2], top_p in (0, 1], top_k >= 1)")
    for k in reject:
        if k not in REJECTABLE:
            raise ValueError(f"reject: unknown parameter {k!r}; use {', '.join(REJECTABLE)}")


def check_serving_options(*, stream_chunking: str, stream_interval_ms: float, logprob_convention: str,
                          reasoning: str | None, reasoning_logprobs: str, reasoning_budget: int) -> None:
    """Raises:
        ValueError: a :func:`create_app` serving option outside its allowed values (the message names it)."""
    if stream_chunking not in STREAM_CHUNKINGS:
        raise ValueError(f"stream_chunking={stream_chunking!r}: use one of {', '.join(STREAM_CHUNKINGS)}")
    if not stream_interval_ms > 0:
        raise ValueError(f"stream_interval_ms={stream_interval_ms} must be > 0")
    if logprob_convention not in LOGPROB_CONVENTIONS:
        raise ValueError(f"logprob_convention={logprob_convention!r}: use one of {', '.join(LOGPROB_CONVENTIONS)}")
    if reasoning not in (None, *REASONING_MODES):
        raise ValueError(f"reasoning={reasoning!r}: use one of {', '.join(REASONING_MODES)}")
    if reasoning_logprobs not in REASONING_LOGPROBS:
        raise ValueError(f"reasoning_logprobs={reasoning_logprobs!r}: use one of {', '.join(REASONING_LOGPROBS)}")
    if reasoning == "inline" and reasoning_logprobs != "both":
        raise ValueError("reasoning='inline' has no parser to split the logprobs: use reasoning_logprobs='both'")
    if reasoning_budget < 1:
        raise ValueError(f"reasoning_budget={reasoning_budget} must be >= 1")
