"""Summary stage of ``auditor check``: speed figures and headline numbers stored with the run.

- :func:`summary_stage`: the speed figures (:func:`auditor.check.stream_timing.speed_summary`) and
  :func:`headline_summary`, as the pipeline stores them (one call);
- :func:`headline_summary`: mean KL and the honest floor's, the clear-mismatch rate, the nearest
  honest reference, and the position counts of the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from auditor.check.stream_timing import speed_summary
from auditor.detectors import DetectorName
from auditor.detectors.logprob import kl_floor_ratio
from auditor.util import finite

if TYPE_CHECKING:  # pragma: no cover
    from auditor.check.measured_floors import FloorSet
    from auditor.check.observations import Observation
    from auditor.detectors import DetectorResult
    from auditor.store import Store

__all__ = ["LOGPROB_DEFECT_KINDS", "headline_summary", "logprob_defects", "summary_stage"]

#: Per-token normalizer anomalies (``probes.anomalies.ANOMALY_KINDS``) that the report names with
#: their counts (issue 37, item 11): what the provider's logprobs were, in the report's words.
LOGPROB_DEFECT_KINDS: dict[str, str] = {
    "nonfinite_logprob": "NaN, ±Infinity or null logprobs",
    "positive_logprob": "positive logprobs",
    "sentinel_logprob": "placeholder logprobs (e.g. -9999)",
    "masked_logit": "masked-logit logprobs (≤ -1e30)",
    "top_logprobs_excess": "more alternatives than asked (the excess dropped)",
}


def _by_ref_effect(r: DetectorResult | None, ref: str) -> float | None:
    if r is None or not r.ran:
        return None
    by = (r.details or {}).get("by_reference") or {}
    if ref in by and by[ref].get("effect") is not None:
        return float(by[ref]["effect"])
    return finite(r.effect)


def _floor_mean_kl(floors: FloorSet | None, ref: str, lp: DetectorResult | None) -> float | None:
    fl = floors.floors.get(ref) if floors is not None else None
    if fl is None:
        return None
    m = (lp.details or {}).get("m") if lp is not None else None
    try:
        return float(fl.kl_floor(int(m)).mean_kl) if m is not None else float(fl.kl_floor(fl.available_m()[-1]).mean_kl)
    except (KeyError, IndexError):
        return None


def headline_summary(
    results: Sequence[DetectorResult],
    floors: FloorSet | None,
    ref0: str,
    observations: Sequence[Observation],
    n_positions: int,
) -> tuple[dict[str, Any], dict[str, int]]:
    """Headline figures against the reference precision ``ref0`` (float32: the model as published).

    Args:
        results: the detectors' results (Holm-adjusted, as the verdict returns them).
        floors: the noise floors used (None: none); observations: the analysed probes; n_positions: positions
            in the evidence batch.

    Returns:
        (summary, tokens_extra): ``mean_kl`` and ``noise_floor`` (nats/position), ``kl_floor_ratio``
        (:func:`auditor.detectors.logprob.kl_floor_ratio`, dimensionless),
        ``clear_mismatch_rate``, ``nearest_reference``, ``scored_positions``; and the counts
        ``scored_positions``, ``aligned_positions`` (1:1), ``unaligned_positions``, ``provider_tokens``.
    """
    by = {r.name: r for r in results}
    lp = by.get(DetectorName.LOGPROB_DIVERGENCE)
    lp = lp if lp is not None and lp.ran else None
    g = by.get(DetectorName.GREEDY_MATCH)
    g = g if g is not None and g.ran else None
    n_tok = sum(len(o.tokens) for o in observations)
    summary: dict[str, Any] = {
        "mean_kl": _by_ref_effect(lp, ref0) if lp is not None else None,
        "noise_floor": _floor_mean_kl(floors, ref0, lp),
        # the one KL-vs-floor figure every report shows (issue 38, item 1), for the dashboard, which cannot
        # import the detectors: never recomputed there from mean_kl / noise_floor
        "kl_floor_ratio": kl_floor_ratio(lp.details) if lp is not None else None,
        "clear_mismatch_rate": _by_ref_effect(g, ref0) if g is not None else None,
        "nearest_reference": (lp.details.get("nearest_reference") if lp is not None
                              else g.details.get("nearest_reference") if g is not None else None),
        "scored_positions": n_positions,
    }
    tokens_extra = {
        "scored_positions": n_positions,
        "aligned_positions": sum(1 for o in observations for x in o.one_to_one if x is not None),
        "unaligned_positions": n_tok - sum(1 for o in observations for s in o.spans if s is not None),
        "provider_tokens": n_tok,
    }
    return summary, tokens_extra


def summary_stage(
    store: Store,
    run_id: str,
    results: Sequence[DetectorResult],
    floors: FloorSet | None,
    ref0: str,
    observations: Sequence[Observation],
    n_positions: int,
    *,
    speed: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """The summary stage: (``{**speed_summary, **headline summary}``, tokens_extra) — the run summary's
    figures (:func:`speed_summary` of ``run_id``'s attempts, or ``speed`` when the pipeline measured it
    already for the verdict, then :func:`headline_summary` of the other arguments, whose keys win) and the
    position counts."""
    headline, tokens_extra = headline_summary(results, floors, ref0, observations, n_positions)
    sp = dict(speed) if speed is not None else speed_summary(store, run_id)
    return {**sp, **headline, "logprob_defects": logprob_defects(store, run_id)}, tokens_extra


def logprob_defects(store: Store, run_id: str) -> dict[str, Any] | None:
    """The run's provider-logprob defects counted in the store (summary key ``logprob_defects``):
    ``{"tokens": {kind: tokens}, "responses": {kind: responses}}`` over
    :data:`LOGPROB_DEFECT_KINDS`, None when there are none (``auditor.report.render.logprob_defects_line``
    words it)."""
    from auditor.store import queries as q

    with store.session() as s:
        tokens, responses = q.token_anomaly_counts(s, run_id, LOGPROB_DEFECT_KINDS)
    if not tokens:
        return None
    order = [k for k in LOGPROB_DEFECT_KINDS if k in tokens]
    return {"tokens": {k: tokens[k] for k in order}, "responses": {k: responses.get(k, 0) for k in order}}
