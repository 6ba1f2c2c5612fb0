"""The normalized shapes of a provider's answer (data only, no parsing): what :mod:`probes.normalize`
produces, what :mod:`auditor.check.attempt_writer` stores and what the analysis stages read back.

Kept apart from the normalizer so that the evidence stage (``auditor.check.evidence``) can rebuild stored
tokens without importing the normalizer (issue 11: each response is normalized once, at probe time).
Logprobs are natural-log probabilities (nats), as in the OpenAI API reference (``logprobs``,
``top_logprobs``).
"""

from __future__ import annotations

import builtins
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["NormalizedResponse", "TokenRecord"]


class TokenRecord(BaseModel):
    """One generated (or, for echo, prompt) token after normalization.

    ``logprob`` is in nats, finite and ≤ 1e-6, or ``None`` when censored/untrustworthy (see the
    module docstring). ``raw_logprob`` keeps the reported value for evidence when it is a finite
    number (sentinels included); it is ``None`` for null/NaN/±inf and must not be used as a logprob.
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    index: int
    token: str
    """Token string exactly as reported."""
    bytes: bytes | None
    """Authoritative bytes after recovery; ``None`` when they cannot be recovered."""
    logprob: float | None
    # ``builtins.bytes``: the field ``bytes`` above shadows the builtin inside the class body
    top_logprobs: list[tuple[str, builtins.bytes | None, float | None]] = Field(default_factory=list)
    """Alternatives as ``(token, bytes, logprob)`` in the order given; logprob ``None`` = unusable."""
    anomalies: list[str] = Field(default_factory=list)
    raw_logprob: float | None = None
    span: str | None = None
    """Which span of the answer the token belongs to: ``"reasoning"`` (inside a reasoning span,
    its think tags included), ``"answer"``, or ``None`` where it cannot be told (a reasoning
    response whose logprobs cover neither span consistently; echoed prompt tokens)."""


class NormalizedResponse(BaseModel):
    """A normalized response: the generated text, its tokens and every anomaly found.

    ``n_tokens`` is the number of generated tokens: ``len(tokens)`` when per-token data came
    back, else ``usage.completion_tokens``, else ``None``. ``anomalies`` lists distinct kinds in
    order of first occurrence; ``anomaly_details`` has one ``{"kind", "index", "detail"}`` per
    finding (``index`` = token index or ``None`` for response-level findings). ``prompt_tokens``
    holds echoed prompt tokens (legacy completions with ``echo``), not counted in ``n_tokens``.
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    text: str
    n_tokens: int | None
    tokens: list[TokenRecord]
    anomalies: list[str]
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_tokens: list[TokenRecord] = Field(default_factory=list)
    anomaly_details: list[dict[str, Any]] = Field(default_factory=list)
    usage_missing: bool = True
    """True when ``usage`` has no non-negative integer ``prompt_tokens`` and ``completion_tokens``
    (a stream without ``stream_options.include_usage``, a provider that omits it): spend must
    then be counted with the reference tokenizer and marked estimated."""
    reasoning: str | None = None
    """The reasoning text (``message.reasoning_content`` / ``message.reasoning``, their streamed
    deltas, or what stands between inline think tags in ``text``); ``None`` when the response
    has none. ``text`` stays the answer as delivered (``content``)."""
    reasoning_source: str | None = None
    """Where the reasoning came from: ``"reasoning_content"``, ``"reasoning"``, ``"inline"`` or ``None``."""
    reasoning_coverage: str | None = None
    """What the per-token logprobs cover in a reasoning response: ``"both"`` (reasoning, then
    answer), ``"answer"`` (the answer only), ``"inconsistent"`` (neither: anomaly
    ``reasoning_logprobs_inconsistent``) or ``None`` (no reasoning, or no per-token data)."""

    @property
    def token_bytes(self) -> list[bytes | None]:
        """Bytes of each generated token (``None`` where unrecoverable)."""
        return [t.bytes for t in self.tokens]

    @property
    def spans(self) -> list[str | None]:
        """Span label of each generated token (``"reasoning"``, ``"answer"`` or ``None``)."""
        return [t.span for t in self.tokens]

    @property
    def logprobs(self) -> list[float | None]:
        """Chosen-token logprobs of each generated token (nats; ``None`` where unusable)."""
        return [t.logprob for t in self.tokens]
