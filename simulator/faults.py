"""Seeded fault injection for the simulator (``auditor serve --faults RATE``).

With probability ``rate`` per generation request, one fault kind is chosen uniformly from
:data:`FAULT_KINDS`:

- ``rate_limit``: HTTP 429 with a ``Retry-After`` header (seconds) and an OpenAI
  ``rate_limit_exceeded`` error body;
- ``server_error``: HTTP 500 with an OpenAI ``server_error`` body;
- ``slow``: the answer is delayed by ``delay_s`` seconds (past a typical client timeout), then
  served normally;
- ``truncated``: a streamed answer stops after its first chunk without ``[DONE]``; a
  non-streamed answer is cut in the middle of its JSON body;
- ``malformed``: HTTP 200 whose body is not valid JSON (or, streamed, one ``data:`` line that is
  not JSON).

Decisions come from ``random.Random(seed)`` drawn in request order, so a run of N requests sees the
same faults every time (the seed is the server's ``--seed``).
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

FAULT_KINDS = ("rate_limit", "server_error", "slow", "truncated", "malformed")


@dataclass
class FaultInjector:
    """Decides, per request, whether and which fault to inject.

    Args:
        rate: probability in [0, 1] that a request gets a fault.
        seed: RNG seed (reproducible sequence of decisions).
        delay_s: delay of a ``slow`` fault in seconds.
        retry_after_s: value of the ``Retry-After`` header of a 429 (seconds).
        kinds: the fault kinds to choose from (default all).

    Raises:
        ValueError: rate outside [0, 1], negative delay, or an unknown kind.
    """

    rate: float = 0.0
    seed: int | None = 0
    delay_s: float = 30.0
    retry_after_s: int = 1
    kinds: tuple[str, ...] = FAULT_KINDS
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (0.0 <= self.rate <= 1.0):
            raise ValueError(f"--faults {self.rate}: the fault rate must be in [0, 1]")
        if self.delay_s < 0:
            raise ValueError(f"--fault-delay {self.delay_s}: must be >= 0 seconds")
        bad = [k for k in self.kinds if k not in FAULT_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"unknown fault kinds {bad}; choose from {FAULT_KINDS}")
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self.n_requests = 0

    def draw(self) -> str | None:
        """The fault for the next request (None = serve normally). Thread-safe; counts kinds."""
        with self._lock:
            self.n_requests += 1
            u = self._rng.random()
            kind = self._rng.choice(self.kinds)  # always drawn: the sequence does not depend on the rate
            if self.rate <= 0.0 or u >= self.rate:
                return None
            self.counts[kind] = self.counts.get(kind, 0) + 1
            return kind
