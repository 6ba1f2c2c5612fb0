"""Statistical detectors: each a pure function (EvidenceBatch, NoiseFloor | None) → DetectorResult.

Registry keys (kebab-case) and what they need:

| key                  | positions             | needs                         | H1 (one-sided)                     |
|----------------------|-----------------------|-------------------------------|------------------------------------|
| greedy-match         | T = 0                 | reference (+ floor)           | clear mismatches above honest rate |
| logprob-divergence   | T ∈ {0, 1}, top_lps   | reference + floor             | KL above the honest floor          |
| sampling-gof         | T > 0                 | reference                     | PIT not uniform                    |
| sampling-argmax      | T > 0                 | reference                     | argmax over-emitted                |
| sampling-tail        | T > 0                 | reference                     | tail under-emitted (truncation)    |
| self-gof             | T = 1, top_lps        | —                             | PIT not uniform (own logprobs)     |
| self-argmax          | T = 1, top_lps        | —                             | own top-1 over-emitted             |
| self-tail            | T = 1, top_lps        | —                             | own tail under-emitted             |
| self-greedy          | T = 0, top_lps        | (floor)                       | emitted ≠ own top-1, clear margin  |

``run_detectors`` runs a selection and returns one DetectorResult per key (``ran=False`` with a
reason when a detector had nothing to work on); ``auditor.verdict.decide_verdict`` applies Holm
across those that ran and names the cause. Decision rules: docs/detectors.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .base import (
    MIN_POSITIONS,
    UNTRUSTED_LOGPROB_ANOMALIES,
    DetectorResult,
    EvidenceBatch,
    PositionEvidence,
    not_run,
)
from .consistency import self_argmax, self_gof, self_greedy, self_tail
from .greedy import greedy_match
from .logprob import logprob_divergence
from .noise_floor import NoiseFloor, compute_noise_floor
from .sampling import sampling_argmax, sampling_gof, sampling_tail
from .stats import holm

__all__ = [
    "DETECTORS",
    "MIN_POSITIONS",
    "REFERENCE_DETECTORS",
    "SELF_SAMPLING_DETECTORS",
    "UNTRUSTED_LOGPROB_ANOMALIES",
    "DetectorResult",
    "DetectorSpec",
    "EvidenceBatch",
    "NoiseFloor",
    "PositionEvidence",
    "compute_noise_floor",
    "holm",
    "not_run",
    "run_detectors",
]


@dataclass(frozen=True)
class DetectorSpec:
    """Registry entry: key, function, one-line description, whether it needs the reference."""

    name: str
    fn: Callable[..., DetectorResult]
    description: str
    needs_reference: bool


DETECTORS: dict[str, DetectorSpec] = {
    s.name: s
    for s in (
        DetectorSpec(
            "greedy-match",
            greedy_match,
            "T=0 tokens vs reference argmax; clear mismatches beyond the noise band",
            True,
        ),
        DetectorSpec(
            "logprob-divergence",
            logprob_divergence,
            "reported top_logprobs vs reference: bucketed KL vs honest floor",
            True,
        ),
        DetectorSpec(
            "sampling-gof",
            sampling_gof,
            "sampled tokens: randomized PIT uniformity (Cramér–von Mises)",
            True,
        ),
        DetectorSpec(
            "sampling-argmax",
            sampling_argmax,
            "sampled tokens: argmax over-emission (relaxed acceptance)",
            True,
        ),
        DetectorSpec(
            "sampling-tail",
            sampling_tail,
            "sampled tokens: low-probability tail deficit (truncated sampling)",
            True,
        ),
        DetectorSpec(
            "self-gof",
            self_gof,
            "sampled tokens vs own logprobs: randomized PIT uniformity",
            False,
        ),
        DetectorSpec(
            "self-argmax",
            self_argmax,
            "sampled tokens vs own logprobs: top-1 over-emission",
            False,
        ),
        DetectorSpec(
            "self-tail",
            self_tail,
            "sampled tokens vs own logprobs: tail deficit",
            False,
        ),
        DetectorSpec(
            "self-greedy",
            self_greedy,
            "T=0 tokens vs own reported top-1 (decode path consistency)",
            False,
        ),
    )
}

REFERENCE_DETECTORS = tuple(k for k, s in DETECTORS.items() if s.needs_reference)
SELF_SAMPLING_DETECTORS = ("self-gof", "self-argmax", "self-tail")


def run_detectors(
    batch: EvidenceBatch,
    floor: NoiseFloor | None = None,
    *,
    names: Sequence[str] | None = None,
    self_consistency: str | bool = "auto",
    seed: int = 0,
) -> list[DetectorResult]:
    """Run detectors on one audit's evidence.

    Args:
        batch: the audit's positions.
        floor: the model's noise floor (None: greedy tests use conservative defaults and
            logprob-divergence does not run).
        names: registry keys to run (default: all, subject to ``self_consistency``).
        self_consistency: "auto" (default) runs the self sampling tests only when the batch has no
            reference — with a reference they duplicate the reference sampling tests and would
            only widen the Holm family; True/False force them on/off. ``self-greedy`` always runs
            (it is the only test of the decode path against the provider's own logprobs).
        seed: seeds every detector's randomization (randomized PIT, randomized p-values,
            bootstrap); record it with the run for reproducibility.

    Returns:
        One DetectorResult per selected key, in registry order.

    Raises:
        KeyError: on an unknown detector key (lists the known ones).
    """
    if names is None:
        names = list(DETECTORS)
        if self_consistency == "auto":
            use_self = not batch.has_reference
        else:
            use_self = bool(self_consistency)
        if not use_self:
            names = [k for k in names if k not in SELF_SAMPLING_DETECTORS]
    unknown = [k for k in names if k not in DETECTORS]
    if unknown:
        raise KeyError(f"unknown detector(s) {unknown}; known: {list(DETECTORS)}")
    ss = np.random.SeedSequence(seed)
    children = ss.spawn(len(DETECTORS))
    seeds = {k: children[i] for i, k in enumerate(DETECTORS)}
    return [
        DETECTORS[k].fn(batch, floor, rng=np.random.default_rng(seeds[k]))
        for k in names
    ]
