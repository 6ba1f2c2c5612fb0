"""Detector stage of ``auditor check``: every detector against every reference precision, combined.

:func:`run_reference_detectors` runs the reference detectors (greedy-match, logprob-divergence,
sampling-gof/-argmax/-tail) against each precision's ``EvidenceBatch`` with that precision's noise
floor, keeps per detector the result with the largest p-value over the references
(intersection–union test: accuse only if inconsistent with every honest precision), and runs
``self-greedy`` once on the provider's own logprobs with the most lenient floor. logprob-divergence
uses the temperature-0 positions, where its floor is measured; when some greedy responses carry unverified tokens
(self-greedy's, :func:`auditor.detectors.consistency.first_unverified`, found once) it is also run on the positions before
each response's first one, recorded as ``details["verified_prefix"]`` (:func:`verified_prefix`: a cause feature the
verdict's rule 1u reads, not a member of the Holm family). :func:`detect` is the stage as the
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
    import numpy as np

    from auditor.check.measured_floors import FloorSet
    from auditor.check.observations import Observation
    from auditor.detectors import DetectorResult, EvidenceBatch
    from auditor.detectors.noise_floor import NoiseFloor

__all__ = ["LOGPROB_TEST_MAX_TEMPERATURE", "detect", "run_reference_detectors", "verified_prefix"]

#: logprob-divergence uses positions requested at temperature <= this (greedy), where its noise
#: floor was measured (the floor's honest variants generate greedily).
LOGPROB_TEST_MAX_TEMPERATURE = 1e-6


def verified_prefix(greedy: EvidenceBatch, late: np.ndarray, floor: NoiseFloor | None, *, seed: int = 0) -> dict[str, Any]:
    """logprob-divergence on the greedy positions before each response's first unverified token (issue 40).

    Args:
        greedy: the batch logprob-divergence ran on (temperature-0 positions, one reference).
        late: [N] bool over ``greedy``'s rows, True at or after its response's first unverified token
            (:func:`auditor.detectors.consistency.at_or_after`).
        floor: that reference's noise floor; seed: the detector's seed.

    Returns:
        ``{"ran", "p_value", "n", "ratio_to_floor", "geometric_ratio", "top1_agreement", "n_after_unverified",
        "reason"}`` (JSON-able; p_value and the ratios None when the test did not run, e.g. fewer than MIN_POSITIONS
        usable positions, with its reason).
    """
    from auditor.detectors import DetectorName, run_detectors

    (res,) = run_detectors(greedy.subset(~late), floor, names=[DetectorName.LOGPROB_DIVERGENCE], seed=seed)
    d = res.details or {}
    return {"ran": res.ran, "p_value": finite(res.p_value) if res.ran else None, "n": res.n,
            "ratio_to_floor": finite(d.get("ratio_to_floor")), "geometric_ratio": finite(d.get("geometric_ratio")),
            "top1_agreement": finite(d.get("top1_agreement")), "n_after_unverified": int(late.sum()),
            "reason": res.reason}


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
        (p_value, statistic, effect, n per reference); logprob-divergence's with ``details["verified_prefix"]``
        (:func:`verified_prefix`) when some greedy response of the self batch has an unverified token.
    """
    from auditor.detectors import (
        DETECTORS,
        REFERENCE_DETECTORS,
        SELF_SAMPLING_DETECTORS,
        DetectorName,
        Mode,
        detectors_where,
        run_detectors,
    )
    from auditor.detectors.consistency import at_or_after, first_unverified

    # the logprob tests compare with a floor measured on greedy continuations: like with like (T = 0)
    logprob_names = [str(k) for k in detectors_where(mode=Mode.LOGPROB, needs_reference=True)]
    other_names = [str(k) for k in REFERENCE_DETECTORS if k not in logprob_names]
    self_greedy = [str(k) for k in detectors_where(mode=Mode.GREEDY, needs_reference=False)]

    sb = self_batch if self_batch is not None else (next(iter(batches.values())) if batches else None)
    lenient = floors.most_lenient() if floors is not None else None
    # the unverified tokens self-greedy counts (its batch and floor): found once, placed on each reference's greedy rows
    first = first_unverified(sb, lenient) if sb is not None else {}
    out: dict[str, DetectorResult] = {}
    per_ref: dict[str, dict[str, DetectorResult]] = {}
    for r, batch in batches.items():
        floor = floors.floors.get(r) if floors is not None else None
        res_all = run_detectors(batch, floor, names=other_names, seed=seed)
        greedy = batch.subset(batch.temperatures <= LOGPROB_TEST_MAX_TEMPERATURE)
        res_all += run_detectors(greedy, floor, names=logprob_names, seed=seed)
        late = at_or_after(first, greedy)
        if late.any():
            res_all = [replace(x, details={**(x.details or {}), "verified_prefix": verified_prefix(
                greedy, late, floor, seed=seed)}) if x.name == DetectorName.LOGPROB_DIVERGENCE and x.ran else x
                for x in res_all]
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
    if sb is not None:
        self_names = self_greedy + ([] if batches else [str(k) for k in SELF_SAMPLING_DETECTORS])
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
