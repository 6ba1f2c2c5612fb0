"""Detector stage of ``auditor check``: every detector against every reference precision, combined.

:func:`run_reference_detectors` runs the reference detectors (greedy-match, logprob-divergence,
sampling-gof/-argmax/-tail) against each precision's ``EvidenceBatch`` with that precision's noise
floor, keeps per detector the result with the largest p-value over the references
(intersection–union test: accuse only if inconsistent with every honest precision), and runs
``self-greedy`` once on the provider's own logprobs with the most lenient floor. logprob-divergence
uses the temperature-0 positions, where its floor is measured. :func:`detect` is the stage as the
pipeline runs it: those detectors, then their evidence rows given token texts and context
(``auditor.check.evidence.enrich_evidence``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from auditor.check.evidence import enrich_evidence
from auditor.util import finite

if TYPE_CHECKING:  # pragma: no cover
    from auditor.check.measured_floors import FloorSet
    from auditor.check.observations import Observation
    from auditor.detectors import DetectorResult, EvidenceBatch

__all__ = ["LOGPROB_TEST_MAX_TEMPERATURE", "detect", "run_reference_detectors"]

#: logprob-divergence uses positions requested at temperature <= this (greedy), where its noise
#: floor was measured (the floor's honest variants generate greedily).
LOGPROB_TEST_MAX_TEMPERATURE = 1e-6


def run_reference_detectors(
    batches: Mapping[str, EvidenceBatch],
    floors: FloorSet | None,
    *,
    seed: int = 0,
    self_batch: EvidenceBatch | None = None,
) -> list[DetectorResult]:
    """Run every detector against every reference precision and combine (intersection–union).

    Args:
        batches: reference dtype → EvidenceBatch (same positions, different reference rows).
        floors: ``auditor.check.measured_floors.FloorSet`` (a floor per reference dtype), or None.
        seed: seeds every detector's randomization.
        self_batch: batch for the self-consistency detectors (default: the first batch). When
            ``batches`` is empty the self sampling tests run too (no reference available).

    Returns:
        One DetectorResult per detector (registry order). For the reference detectors the result
        kept is the one with the largest p-value over the references (the nearest honest
        reference), with ``details['nearest_reference']`` and ``details['by_reference']``
        (p_value, statistic, effect, n per reference).
    """
    from auditor.detectors import (
        DETECTORS,
        REFERENCE_DETECTORS,
        SELF_SAMPLING_DETECTORS,
        Mode,
        detectors_where,
        run_detectors,
    )

    # the logprob tests compare with a floor measured on greedy continuations: like with like (T = 0)
    logprob_names = [str(k) for k in detectors_where(mode=Mode.LOGPROB, needs_reference=True)]
    other_names = [str(k) for k in REFERENCE_DETECTORS if k not in logprob_names]
    self_greedy = [str(k) for k in detectors_where(mode=Mode.GREEDY, needs_reference=False)]

    out: dict[str, DetectorResult] = {}
    per_ref: dict[str, dict[str, DetectorResult]] = {}
    for r, batch in batches.items():
        floor = floors.floors.get(r) if floors is not None else None
        res_all = run_detectors(batch, floor, names=other_names, seed=seed)
        greedy = batch.subset(batch.temperatures <= LOGPROB_TEST_MAX_TEMPERATURE)
        res_all += run_detectors(greedy, floor, names=logprob_names, seed=seed)
        for res in res_all:
            per_ref.setdefault(res.name, {})[r] = res
    for name, by in per_ref.items():
        ran = {r: res for r, res in by.items() if res.ran}
        if not ran:
            best_r = next(iter(by))
            out[name] = by[best_r]
            continue
        best_r = max(ran, key=lambda r: (ran[r].p_value, -list(batches).index(r)))
        best = ran[best_r]
        det = dict(best.details or {})
        det["nearest_reference"] = best_r
        det["by_reference"] = {
            r: {"p_value": finite(res.p_value), "statistic": finite(res.statistic), "effect": finite(res.effect), "n": res.n}
            for r, res in by.items()
        }
        out[name] = replace(best, details=det)
    sb = self_batch if self_batch is not None else (next(iter(batches.values())) if batches else None)
    if sb is not None:
        self_names = self_greedy + ([] if batches else [str(k) for k in SELF_SAMPLING_DETECTORS])
        lenient = floors.most_lenient() if floors is not None else None
        for res in run_detectors(sb, lenient, names=self_names, seed=seed):
            out[res.name] = res
    return [out[k] for k in DETECTORS if k in out]


def detect(
    batches: Mapping[str, EvidenceBatch],
    floors: FloorSet | None,
    observations: Sequence[Observation],
    tokenizer: Any,
    *,
    seed: int = 0,
    self_batch: EvidenceBatch | None = None,
) -> list[DetectorResult]:
    """The detection stage: :func:`run_reference_detectors` (same arguments), then every evidence row
    given its token texts and preceding provider text (``auditor.check.evidence.enrich_evidence``, from
    ``observations`` and the reference ``tokenizer``), so that reports need no tokenizer."""
    results = run_reference_detectors(batches, floors, seed=seed, self_batch=self_batch)
    return enrich_evidence(results, observations, tokenizer)
