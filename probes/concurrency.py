"""Adaptive (AIMD) concurrency limit for the probe client.

Some servers cannot take the configured number of concurrent requests: a llama.cpp server
cancels a running stream whenever another request waits (``truncated_stream``), hosted APIs
answer 429 / 503 / "overloaded". Retrying at full width then fails the same way (48 of 52
requests lost after 155 retries in one audit). :class:`AdaptiveConcurrency` narrows the width
instead: additive increase, multiplicative decrease, as TCP congestion control does
(Jacobson 1988; Chiu & Jain 1989) and as Netflix's ``concurrency-limits`` library does for
RPC clients.

- **Decrease**: ``decrease_after`` consecutive *pressure* failures (see :func:`is_pressure`)
  halve the width (``width // 2``, never below 1). Only requests admitted at the current width
  count: the requests already in flight when the width dropped were sent at the old width and
  would otherwise halve it again for the same overload (one decrease per window, as TCP's
  one-cut-per-RTT rule).
- **Increase**: ``increase_after`` successes in a row at the current width raise it by one,
  never above the configured ``max_width``. Each decrease doubles the successes needed for the
  next increase (at most ``64 × increase_after``), so a server that takes only one request at a
  time is re-probed ever more rarely instead of every few requests.
- Other failures (HTTP 400, malformed JSON, limits) neither raise nor lower the width and do
  not reset the success run.

Every change is recorded as a :class:`WidthChange` so a report can say
"concurrency reduced 8→1 after 3 truncated_stream failures".
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

__all__ = ["PRESSURE_KINDS", "PRESSURE_STATUS", "AdaptiveConcurrency", "Ticket", "WidthChange", "is_pressure"]

#: Error kinds (``ProbeResult.error_kind``) that mean "too many requests at once": a cut
#: stream, a 429, a connection dropped mid-response, an answer ended empty (llama.cpp's server
#: ends a running stream with a role chunk and ``[DONE]`` when another request waits).
PRESSURE_KINDS = frozenset({"truncated_stream", "rate_limited", "read_error", "empty_stream", "empty_answer"})
#: HTTP statuses that mean "too many requests at once" (429 rate limit, 503 unavailable,
#: 529 overloaded as Anthropic's API uses it).
PRESSURE_STATUS = frozenset({429, 503, 529})


def is_pressure(error_kind: str | None, http_status: int | None, retryable: bool = False) -> bool:
    """True when a failed attempt looks like server overload from concurrency.

    ``truncated_stream``, ``rate_limited``, ``read_error``, ``empty_stream`` and ``empty_answer`` always;
    HTTP 429/503/529; a retryable in-band
    ``provider_error`` (its code is 5xx/429 or its type says overloaded / unavailable).
    ``error_kind is None`` (success) is never pressure.
    """
    if error_kind is None:
        return False
    if error_kind in PRESSURE_KINDS or http_status in PRESSURE_STATUS:
        return True
    return error_kind == "provider_error" and retryable


@dataclass(frozen=True, slots=True)
class WidthChange:
    """One change of the allowed width. ``at`` is UTC; ``t_s`` seconds since the limiter began."""

    old: int
    new: int
    reason: str
    """``"pressure"`` (decrease) or ``"recovery"`` (increase)."""
    failures: int
    """Pressure failures in the run that caused a decrease (0 for an increase)."""
    kinds: tuple[str, ...]
    """Pressure failure kinds in that run, e.g. ``("truncated_stream",)``."""
    at: datetime
    t_s: float

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return {"old": self.old, "new": self.new, "reason": self.reason, "failures": self.failures,
                "kinds": list(self.kinds), "at": self.at.isoformat(), "t_s": round(self.t_s, 3)}


@dataclass(frozen=True, slots=True)
class Ticket:
    """Admission to send one attempt; hand it back to :meth:`AdaptiveConcurrency.release`."""

    epoch: int
    """The limiter's epoch (number of width decreases so far) when the attempt was admitted."""


@dataclass
class AdaptiveConcurrency:
    """AIMD limit on requests in flight (asyncio; one event loop).

    Args:
        max_width: the configured ``rate_limits.concurrency`` (≥ 1); the width starts there
            and never exceeds it.
        decrease_after: consecutive pressure failures (at the current width) that halve it.
        increase_after: consecutive successes (at the current width) that add one.
        adaptive: ``False`` keeps the width fixed at ``max_width`` (changes never happen).

    Raises:
        ValueError: ``max_width``, ``decrease_after`` or ``increase_after`` below 1.
    """

    max_width: int
    decrease_after: int = 2
    increase_after: int = 8
    adaptive: bool = True
    width: int = field(init=False)
    in_flight: int = field(default=0, init=False)
    changes: list[WidthChange] = field(default_factory=list, init=False)
    pressure_failures: Counter[str] = field(default_factory=Counter, init=False)
    """Every pressure failure seen, by kind (all epochs)."""
    _epoch: int = field(default=0, init=False)
    _run_fail: list[str] = field(default_factory=list, init=False)
    _run_ok: int = field(default=0, init=False)
    _need_ok: int = field(default=0, init=False)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list, init=False)
    _t0: float = field(default_factory=time.monotonic, init=False)

    def __post_init__(self) -> None:
        for name in ("max_width", "decrease_after", "increase_after"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"AdaptiveConcurrency.{name} must be >= 1, got {getattr(self, name)!r}")
        self.width = self.max_width
        self._need_ok = self.increase_after

    @property
    def min_width(self) -> int:
        """Narrowest width reached so far (``max_width`` if never reduced)."""
        return min([self.max_width, *(c.new for c in self.changes)])

    async def acquire(self) -> Ticket:
        """Wait until fewer than ``width`` attempts are in flight; count this one in.

        FIFO: a newcomer does not pass waiters; a freed place is handed to the first waiter.
        A cancelled waiter leaves the queue (and hands on a place it was just given)."""
        if self.in_flight < self.width and not self._waiters:
            self.in_flight += 1
            return Ticket(self._epoch)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # _wake counted us in before setting the result
        except asyncio.CancelledError:
            if fut in self._waiters:
                self._waiters.remove(fut)
            elif fut.done() and not fut.cancelled():
                self.in_flight -= 1  # handed a place, then cancelled: pass it on
                self._wake()
            raise
        return Ticket(self._epoch)

    def release(self, ticket: Ticket, *, error_kind: str | None, http_status: int | None = None, retryable: bool = False) -> None:
        """Count the attempt out and adapt the width to its outcome (``error_kind None`` =
        success; ``"cancelled"`` neither raises nor lowers it). Synchronous, so it is safe in a
        ``finally`` of a cancelled task."""
        self.in_flight -= 1
        pressure = is_pressure(error_kind, http_status, retryable)
        if pressure:
            self.pressure_failures[str(error_kind)] += 1
        if self.adaptive and ticket.epoch == self._epoch:
            if pressure:
                self._run_ok = 0
                self._run_fail.append(str(error_kind))
                if len(self._run_fail) >= self.decrease_after and self.width > 1:
                    self._change(max(1, self.width // 2), "pressure")
            elif error_kind is None:
                self._run_fail.clear()
                self._run_ok += 1
                if self._run_ok >= self._need_ok and self.width < self.max_width:
                    self._change(self.width + 1, "recovery")
        self._wake()

    def _wake(self) -> None:
        """Wake as many waiters (FIFO) as there are free places."""
        free = self.width - self.in_flight
        for fut in list(self._waiters):
            if free <= 0:
                break
            self._waiters.remove(fut)
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)
                free -= 1

    def _change(self, new: int, reason: str) -> None:
        fails = list(self._run_fail) if reason == "pressure" else []
        self.changes.append(
            WidthChange(self.width, new, reason, len(fails), tuple(sorted(set(fails))), datetime.now(UTC), time.monotonic() - self._t0)
        )
        self.width = new
        if reason == "pressure":
            self._epoch += 1
            # each cut doubles the successes needed to probe a wider width again (capped), so a
            # server that only takes one request at a time is not re-probed every few requests
            self._need_ok = min(self._need_ok * 2, 64 * self.increase_after)
        self._run_fail.clear()
        self._run_ok = 0

    def summary(self) -> str | None:
        """One line for a report, e.g. ``"concurrency reduced 8→1 after 4 truncated_stream
        failures (now 2)"``; ``None`` when the width never changed."""
        if not self.changes:
            return None
        cuts = [c for c in self.changes if c.reason == "pressure"]
        if not cuts:
            return f"concurrency {self.max_width}→{self.width} (recovered)"
        n = sum(c.failures for c in cuts)
        kinds = ", ".join(sorted({k for c in cuts for k in c.kinds}))
        s = f"concurrency reduced {self.max_width}→{self.min_width} after {n} {kinds} failures"
        return s + (f" (now {self.width})" if self.width != self.min_width else "")

    def stats(self) -> dict[str, object]:
        """JSON-ready record: configured/current/min width, every change, pressure failures by kind."""
        return {
            "configured": self.max_width,
            "current": self.width,
            "min": self.min_width,
            "adaptive": self.adaptive,
            "changes": [c.to_dict() for c in self.changes],
            "pressure_failures": dict(self.pressure_failures),
            "summary": self.summary(),
        }
