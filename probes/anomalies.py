"""The normalizer's anomaly vocabulary, the log that collects a response's anomalies, and the rule that
classifies one reported logprob value (:mod:`probes.normalize` documents what each kind means for a
token record). Data and pure functions only: no parsing of a body here.

Values are natural-log probabilities (nats), as in the OpenAI API reference (``logprobs``,
``top_logprobs``); OpenAI documents ``-9999.0`` as its "not in top-k" placeholder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from probes.sse import BODY_ANOMALIES

__all__ = [
    "ANOMALY_KINDS",
    "MASKED_THRESHOLD",
    "MASS_TOL",
    "MAX_UNASKED_ALTERNATIVES",
    "POSITIVE_TOL",
    "SENTINEL_THRESHOLD",
    "AnomalyLog",
    "as_float",
    "classify_logprob",
]

#: A logprob at or below this is a placeholder, not a model number (OpenAI documents -9999.0).
SENTINEL_THRESHOLD = -9999.0
#: A logprob at or below this is a masked logit leaking as a number (float32 lowest ≈ -3.4e38).
MASKED_THRESHOLD = -1e30
#: Positive slack for rounding noise on logprobs (nats).
POSITIVE_TOL = 1e-6
#: Probability-mass slack for the listed alternatives.
MASS_TOL = 1e-3
#: Alternatives kept per token when the request did not say how many it asked for (no logprobs
#: asked, or no request known): a provider's unasked list is bounded too.
MAX_UNASKED_ALTERNATIVES = 20

#: Every anomaly kind the normalizer can report, with its meaning.
ANOMALY_KINDS: dict[str, str] = {
    "sentinel_logprob": "a placeholder (e.g. -9999.0) in a chosen or alternative logprob",
    "masked_logit": "a logprob at or below -1e30 (masked logit leaking as a number); treated as -inf",
    "nonfinite_logprob": "NaN, null or ±inf where a chosen token's logprob should be",
    "positive_logprob": "a logprob above +1e-6",
    "mass_exceeds_one": "the listed alternatives' probabilities sum above 1 + 1e-3",
    "chosen_not_in_top": "top_logprobs returned but the chosen token, which belongs there, is not among them",
    "greedy_not_argmax": "temperature 0, and the chosen token is not the top-1 alternative",
    "top_logprobs_short": "fewer finite alternatives than requested (and than the provider's cap)",
    "top_logprobs_padded": "alternatives padded with -inf to reach the requested count",
    "zero_logprob_run": "two or more consecutive chosen tokens at exactly 0.0 while finite alternatives hold mass",
    "duplicate_stream_top_logprobs": "streamed tokens repeating an earlier token's alternatives with a different chosen token",
    "replacement_char_bytes": "token bytes are U+FFFD although the text has no U+FFFD",
    "surrogate_token_strings": "token strings in GPT-2 byte-to-unicode form (Ġ, Ċ, …) instead of text",
    "bytes_text_mismatch": "after every recovery, the tokens' bytes still do not reproduce the text",
    "echo_ignored": "echo with logprobs was asked, but no prompt-token logprobs came back",
    "missing_logprobs": "logprobs were asked, none (or not for every token) came back",
    "spm_token_strings": "SentencePiece '▁' word-boundary marks leaked into token strings",
    "replacement_char_text": "text/token strings carry U+FFFD where the tokens' bytes hold a valid character; bytes kept",
    "top_logprobs_excess": "more alternatives than asked (+1 for the chosen token); only the asked number are kept",
    "malformed_usage": "the usage object's token counts are not non-negative integers (dropped)",
    "reasoning_logprobs_inconsistent": "a reasoning response whose logprobs spell neither the answer alone nor the reasoning then the answer",
    **BODY_ANOMALIES,  # malformed_json, malformed_response, truncated_stream, empty_stream, provider_error: shared with the client
}


@dataclass
class AnomalyLog:
    """The anomalies found so far in one response: each kind once, in the order first seen
    (``anomalies``), and every occurrence (``details``: ``{kind, index, detail}``, ``index`` the
    token's position or None). Also carries the bound on alternatives kept per token while parsing
    (``keep_alternatives``), whose excess is reported as ``top_logprobs_excess``."""

    anomalies: dict[str, None] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)
    keep_alternatives: int = MAX_UNASKED_ALTERNATIVES
    """Alternatives kept per token while parsing (the request's count + 1, :mod:`probes.logprob_entries`)."""

    def add(self, kind: str, index: int | None = None, detail: str = "") -> None:
        self.anomalies.setdefault(kind, None)
        self.details.append({"kind": kind, "index": index, "detail": detail})


def as_float(v: Any) -> float | None:
    """A reported number (int, float or numeric string; never a bool) as a float, else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def classify_logprob(v: Any) -> tuple[float | None, str | None, float | None]:
    """Reported value → (usable logprob or None, anomaly kind or None, raw finite value or None).

    The kind is one of ``nonfinite_logprob``, ``masked_logit``, ``sentinel_logprob``, ``positive_logprob``,
    or ``padded_inf`` (a -inf entry: padding among alternatives, the caller decides). Never raises."""
    f = as_float(v)
    if f is None or math.isnan(f):
        return None, "nonfinite_logprob", None
    if math.isinf(f):
        return None, ("padded_inf" if f < 0 else "nonfinite_logprob"), None
    if f <= MASKED_THRESHOLD:
        return None, "masked_logit", f
    if f <= SENTINEL_THRESHOLD:
        return None, "sentinel_logprob", f
    if f > POSITIVE_TOL:
        return None, "positive_logprob", f
    return f, None, f
