"""Detector inputs and outputs: `PositionEvidence`, `EvidenceBatch`, `DetectorResult`.

The pipeline (``auditor/check/pipeline.py``) teacher-forces the reference at the provider's own prefixes,
so every generated position is one trial. It hands the detectors one :class:`PositionEvidence`
per position, or builds an :class:`EvidenceBatch` (struct of arrays) directly; every detector is
a pure function of the batch (plus the noise floor) returning a :class:`DetectorResult`.

Token ids are reference-vocabulary ids (the provider's tokens aligned to the reference tokenizer
by bytes, ``probes/align.py``); -1 marks a token that could not be aligned. Log-probabilities are
natural-log (nats), raw (before temperature), as ``reference.scoring.score_continuations`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, NamedTuple, cast

import numpy as np

from auditor.util import json_safe

__all__ = [
    "MIN_POSITIONS",
    "UNTRUSTED_LOGPROB_ANOMALIES",
    "UNTRUSTED_RESPONSE_ANOMALIES",
    "DetectorName",
    "DetectorResult",
    "EvidenceBatch",
    "PositionEvidence",
    "ReferenceArrays",
    "not_run",
]

class DetectorName(StrEnum):
    """Registry keys of the detectors (kebab-case; stored in ``detector_results.name``).

    Use these members instead of bare strings; a member equals (and hashes as) its string value,
    so dicts keyed by stored names accept them. Metadata per name: ``auditor.detectors.DETECTORS``.
    """

    GREEDY_MATCH = "greedy-match"
    LOGPROB_DIVERGENCE = "logprob-divergence"
    SAMPLING_GOF = "sampling-gof"
    SAMPLING_ARGMAX = "sampling-argmax"
    SAMPLING_TAIL = "sampling-tail"
    SELF_GOF = "self-gof"
    SELF_ARGMAX = "self-argmax"
    SELF_TAIL = "self-tail"
    SELF_GREEDY = "self-greedy"
    GREEDY_HETEROGENEITY = "greedy-heterogeneity"
    GREEDY_NEAR_TIE = "greedy-near-tie"
    LOGPROB_HETEROGENEITY = "logprob-heterogeneity"


#: Normalizer anomaly kinds (see ../shared/cases/README.md) after which a position's reported
#: top_logprobs are not used by the logprob and self-consistency detectors. `greedy_not_argmax`
#: and `chosen_not_in_top` are deliberately absent: they are the evidence, not a defect.
UNTRUSTED_LOGPROB_ANOMALIES = frozenset(
    {
        "sentinel_logprob",
        "masked_logit",
        "positive_logprob",
        "mass_exceeds_one",
        "zero_logprob_run",
        "duplicate_stream_top_logprobs",
        "top_logprobs_padded",
    }
)

#: Response-level anomaly kinds (``probes.anomalies.ANOMALY_KINDS``; ``normalize_error`` is the runner's)
#: after which the response's tokens no longer stand for what the model generated, so none of its
#: positions reaches any detector (``auditor.check.observations.read_observations`` excludes the whole
#: response, records it and counts it; reports list it as excluded with this reason). A per-token
#: kind only untrusts that position (``UNTRUSTED_LOGPROB_ANOMALIES``); these untrust the response:
#: the reference would be teacher-forced at prefixes the model never saw.
UNTRUSTED_RESPONSE_ANOMALIES: Mapping[str, str] = MappingProxyType(
    {
        "bytes_text_mismatch": "the tokens' bytes do not reproduce the response text (e.g. reasoning tokens "
        "mixed into logprobs.content without a reasoning field or think tags that account for them)",
        "malformed_json": "an SSE event was not JSON, so the token sequence has a gap",
        "normalize_error": "the response could not be normalized",
        "reasoning_logprobs_inconsistent": "a reasoning response whose logprobs spell neither the answer alone nor "
        "the reasoning then the answer, so no token's position in the output is known",
        "reasoning_prefix_unknown": "a reasoning response whose logprobs cover the answer only (or none came back): "
        "the reasoning tokens the model wrote before its answer are unknown, so the answer has no exact prefix",
    }
)

#: A detector needs at least this many usable positions to run at all.
MIN_POSITIONS = 10

#: Provider logprobs above this (nats) are malformed (a log-probability is <= 0).
_POSITIVE_LOGPROB_TOL = 1e-6
#: Listed provider probabilities summing above this are malformed.
_MASS_TOL = 1e-3
#: Reported values at or below this are sentinels / masked logits, i.e. "not known".
_SENTINEL_LOGPROB = -9000.0
#: ``from_arrays`` matches every provider-listed id against the reference top-K at once ([N, M, K] bools)
#: up to this many cells, column by column beyond (bounded memory).
_MATCH_CELLS = 1 << 22


@dataclass
class DetectorResult:
    """One statistical test's outcome, as stored in ``detector_results``.

    Attributes:
        name: registry key, kebab-case (e.g. ``greedy-match``).
        statistic: the test statistic (z, count, Cramér–von Mises W², ... — see the detector).
        p_value: one-sided p-value (NaN when the detector did not run).
        effect: effect size in the detector's unit (rate, nats, ratio — see the detector).
        effect_ci: 95% confidence interval of ``effect``.
        n: usable positions (tokens) the test used.
        evidence: the strongest positions, each a JSON-able dict with at least ``prompt_id``,
            ``position``, ``token_id``, ``ref_top5`` ([[id, logprob], ...], when a reference
            exists) and ``margin`` (nats).
        ran: False when the detector could not run (``reason`` says why).
        reason: why it did not run, or a note.
        p_adjusted: Holm-adjusted p-value, filled in by ``auditor.verdict.decide``.
        details: extra named numbers (JSON-able) the verdict rules and reports use, e.g.
            ``top1_agreement``, ``ratio_to_floor``, ``excess_per_position``, ``p_randomized``.
    """

    name: str
    statistic: float
    p_value: float
    effect: float
    effect_ci: tuple[float, float]
    n: int
    evidence: list[dict[str, Any]] = field(default_factory=list)
    ran: bool = True
    reason: str | None = None
    p_adjusted: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a DetectorName member becomes its plain string (stored, serialised, compared as text)
        self.name = str(self.name)

    def with_adjusted(self, p_adjusted: float | None) -> DetectorResult:
        """Copy with ``p_adjusted`` set."""
        return replace(self, p_adjusted=p_adjusted)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (NaN/inf → None, numpy scalars → Python; ``auditor.util.json_safe``)."""
        return cast("dict[str, Any]", json_safe(asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetectorResult:
        """Inverse of :meth:`to_dict` (None → NaN for the numeric fields)."""

        def f(x: Any) -> float:
            return float("nan") if x is None else float(x)

        ci = d.get("effect_ci") or (None, None)
        return cls(
            name=d["name"],
            statistic=f(d.get("statistic")),
            p_value=f(d.get("p_value")),
            effect=f(d.get("effect")),
            effect_ci=(f(ci[0]), f(ci[1])),
            n=int(d.get("n") or 0),
            evidence=list(d.get("evidence") or []),
            ran=bool(d.get("ran", True)),
            reason=d.get("reason"),
            p_adjusted=None if d.get("p_adjusted") is None else float(d["p_adjusted"]),
            details=dict(d.get("details") or {}),
        )


def not_run(name: str, reason: str, n: int = 0, **details: Any) -> DetectorResult:
    """A `DetectorResult` for a detector that could not run."""
    nan = float("nan")
    return DetectorResult(
        name,
        nan,
        nan,
        nan,
        (nan, nan),
        n,
        [],
        ran=False,
        reason=reason,
        details=dict(details),
    )


@dataclass
class PositionEvidence:
    """Everything the detectors know about one generated position (one trial).

    Attributes:
        prompt_id: the probe/prompt this position belongs to (positions of one prompt are
            statistically dependent; tests aggregate or correct per prompt).
        position: 0-based index of the token in the provider's continuation.
        token_id: provider's emitted token as a reference-vocabulary id, -1 if not alignable.
        temperature: the requested sampling temperature (0 = greedy).
        ref_top_ids: [K] int reference top-K token ids at this prefix (any order; sorted here).
        ref_top_logprobs: [K] float reference log-probs of those ids (nats, raw log-softmax).
        ref_token_logprob: reference log p(token_id | prefix) (nats); NaN if unknown.
        ref_full_logprobs: [V] float32 full reference log-softmax row, optional.
        provider_top: provider's reported top_logprobs, reference id → logprob (nats); may be
            empty. Unalignable alternatives are simply left out.
        provider_token_logprob: the provider's reported logprob of its emitted token, or None.
        anomalies: normalizer anomaly kinds at this position (see UNTRUSTED_LOGPROB_ANOMALIES).
        token_text: optional text of the emitted token, for evidence lists.
    """

    prompt_id: str
    position: int
    token_id: int
    temperature: float
    ref_top_ids: np.ndarray | Sequence[int] | None = None
    ref_top_logprobs: np.ndarray | Sequence[float] | None = None
    ref_token_logprob: float | None = None
    ref_full_logprobs: np.ndarray | None = None
    provider_top: Mapping[int, float] = field(default_factory=dict)
    provider_token_logprob: float | None = None
    anomalies: Sequence[str] = ()
    token_text: str | None = None


def _clean_provider_logprob(x: float | None) -> float:
    """Provider value → finite logprob or NaN (sentinels, masked logits, non-finite → NaN)."""
    if x is None:
        return float("nan")
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    if not math.isfinite(v) or v <= _SENTINEL_LOGPROB:
        return float("nan")
    return v


class ReferenceArrays(NamedTuple):
    """A batch's reference arrays when it has them (:meth:`EvidenceBatch.reference`).

    Shapes as in :class:`EvidenceBatch`: top_ids [N, K] int64, top_logprobs [N, K] float64 nats,
    token_logprobs [N] float64 nats, at_provider_top [N, M] float64 nats.
    """

    top_ids: np.ndarray
    top_logprobs: np.ndarray
    token_logprobs: np.ndarray
    at_provider_top: np.ndarray


@dataclass
class EvidenceBatch:
    """Struct-of-arrays view of N positions, the detectors' input.

    Shapes (N positions, K reference top-K width, M provider top_logprobs width, V vocab):
        prompt_ids: [N] object (str); positions: [N] int64; token_ids: [N] int64 (-1 = unaligned);
        temperatures: [N] float64.
        ref_top_ids: [N, K] int64 sorted by reference logprob descending, -1 padding; None when no
            reference is available (self-consistency detectors still run).
        ref_top_logprobs: [N, K] float64 nats, -inf padding.
        ref_token_logprobs: [N] float64 nats, NaN unknown.
        ref_full_logprobs: [N, V] float32 nats, optional.
        provider_top_ids: [N, M] int64 sorted by provider logprob descending, -1 padding.
        provider_top_logprobs: [N, M] float64 nats, -inf padding.
        provider_token_logprobs: [N] float64 nats, NaN when not reported.
        provider_trusted: [N] bool — False when the position's reported logprobs are malformed
            (positive, sentinel, mass > 1, or an UNTRUSTED_LOGPROB_ANOMALIES kind).
        ref_at_provider_top: [N, M] float64 reference log-prob at each provider-listed id, NaN
            when unknown (derived: full row, else the reference top-K, else the emitted token).
        token_texts: [N] object, optional.
        token_spans: [N] object (``"reasoning"`` / ``"answer"`` / None), optional: the span of the
            answer each position belongs to (issue 35: span-aware reporting).
        top_ps: [N] float64 in (0, 1], optional: the nucleus the position was sampled from (a provider's
            enforced ``top_p``, issue 35 item 4); None = 1 everywhere (the whole distribution).
        top_ks: [N] int64, optional: the top-k it was sampled from, 0 = none; None = 0 everywhere.
        step_final: [N] float64, optional: 1.0 where the position is the last token of its streamed
            chunk (a speculative engine streams one chunk per verification step, whose last token is the
            target's own pick), 0.0 inside a chunk, NaN unknown (not streamed, or the chunks do not cover
            the tokens); None = unknown everywhere.

    Construct with :meth:`from_positions` or :meth:`from_arrays` (which validate and derive).
    """

    prompt_ids: np.ndarray
    positions: np.ndarray
    token_ids: np.ndarray
    temperatures: np.ndarray
    ref_top_ids: np.ndarray | None
    ref_top_logprobs: np.ndarray | None
    ref_token_logprobs: np.ndarray | None
    ref_full_logprobs: np.ndarray | None
    provider_top_ids: np.ndarray
    provider_top_logprobs: np.ndarray
    provider_token_logprobs: np.ndarray
    provider_trusted: np.ndarray
    ref_at_provider_top: np.ndarray | None
    token_texts: np.ndarray | None = None
    token_spans: np.ndarray | None = None
    top_ps: np.ndarray | None = None
    top_ks: np.ndarray | None = None
    step_final: np.ndarray | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(
        cls,
        *,
        prompt_ids: Sequence[object] | np.ndarray,
        token_ids: Sequence[int] | np.ndarray,
        temperatures: Sequence[float] | np.ndarray | float,
        positions: Sequence[int] | np.ndarray | None = None,
        ref_top_ids: np.ndarray | None = None,
        ref_top_logprobs: np.ndarray | None = None,
        ref_token_logprobs: np.ndarray | None = None,
        ref_full_logprobs: np.ndarray | None = None,
        provider_top_ids: np.ndarray | None = None,
        provider_top_logprobs: np.ndarray | None = None,
        provider_token_logprobs: np.ndarray | None = None,
        provider_trusted: np.ndarray | None = None,
        token_texts: Sequence[str | None] | None = None,
        token_spans: Sequence[str | None] | None = None,
        top_ps: Sequence[float] | np.ndarray | None = None,
        top_ks: Sequence[int] | np.ndarray | None = None,
        step_final: Sequence[float | None] | np.ndarray | None = None,
    ) -> EvidenceBatch:
        """Validate, sort and derive. Reference arrays are our own engine's output: malformed ones
        raise ``ValueError`` naming the field. Provider arrays come from outside: malformed rows are
        marked untrusted (``provider_trusted`` False), never raised.

        If ``ref_full_logprobs`` is given without ``ref_top_ids``, the top-20 is derived from it;
        ``ref_token_logprobs`` is derived from the full row or the top-K when missing.
        """
        token_ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        n = token_ids.size
        ids = np.asarray(prompt_ids, dtype=object).reshape(-1)
        keys = ids.tolist()  # str() of each, a copy: already strs (str(s) is s) are copied as they are
        prompt_ids = ids.copy() if set(map(type, keys)) <= {str} else np.asarray([str(p) for p in keys], dtype=object)
        if prompt_ids.size != n:
            raise ValueError(
                f"prompt_ids has {prompt_ids.size} entries, token_ids {n}; give one per position"
            )
        temps = np.broadcast_to(np.asarray(temperatures, dtype=np.float64), (n,)).copy()
        if np.any(~np.isfinite(temps) | (temps < 0)):
            raise ValueError("temperatures must be finite and >= 0 (0 = greedy)")
        if positions is None:
            positions = _positions_within(prompt_ids)
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions.size != n:
            raise ValueError(f"positions has {positions.size} entries, expected {n}")

        # ---- reference
        full = None
        if ref_full_logprobs is not None:
            full = np.asarray(ref_full_logprobs, dtype=np.float32)
            if full.ndim != 2 or full.shape[0] != n:
                raise ValueError(
                    f"ref_full_logprobs must be [N={n}, V], got {full.shape}"
                )
            if ref_top_ids is None:
                k = min(20, full.shape[1])
                idx = np.argpartition(-full, k - 1, axis=1)[:, :k]
                ref_top_ids = idx
                ref_top_logprobs = np.take_along_axis(full, idx, 1).astype(np.float64)
        if (ref_top_ids is None) != (ref_top_logprobs is None):
            raise ValueError("give both ref_top_ids and ref_top_logprobs, or neither")
        rt_ids = rt_lp = rt_tok = None
        if ref_top_ids is not None:
            rt_ids = np.asarray(ref_top_ids, dtype=np.int64)
            rt_lp = np.asarray(ref_top_logprobs, dtype=np.float64)
            if rt_ids.ndim != 2 or rt_ids.shape[0] != n or rt_lp.shape != rt_ids.shape:
                raise ValueError(
                    f"ref_top_ids {rt_ids.shape} and ref_top_logprobs {rt_lp.shape} must both be [N={n}, K]"
                )
            rt_lp = np.where(rt_ids < 0, -np.inf, rt_lp)
            if np.any(np.isnan(rt_lp)):
                raise ValueError(
                    "ref_top_logprobs contains NaN; the reference scoring is broken"
                )
            if np.any(rt_lp > 1e-4):
                raise ValueError(
                    "ref_top_logprobs must be log-probabilities (<= 0 nats)"
                )
            mass = np.exp(rt_lp).sum(1)
            if np.any(mass > 1 + 1e-3):
                raise ValueError(
                    f"ref_top_logprobs rows sum to more than 1 in probability (max {mass.max():.4f}); "
                    "pass log-softmax values, not logits"
                )
            if bool((rt_lp[:, 1:] <= rt_lp[:, :-1]).all()):  # sorted already: the stable sort keeps the order
                rt_ids = rt_ids.copy()
            else:
                order = np.argsort(-rt_lp, axis=1, kind="stable")
                rt_ids = np.take_along_axis(rt_ids, order, 1)
                rt_lp = np.take_along_axis(rt_lp, order, 1)
            if ref_token_logprobs is None:
                rt_tok = np.full(n, np.nan)
            else:
                rt_tok = (
                    np.asarray(ref_token_logprobs, dtype=np.float64).reshape(-1).copy()
                )
                if rt_tok.size != n:
                    raise ValueError(
                        f"ref_token_logprobs must be [N={n}], got {rt_tok.size}"
                    )
            # derive unknown token logprobs from the full row or the top-K
            miss = np.isnan(rt_tok) & (token_ids >= 0)
            if full is not None and np.any(miss):
                ok = miss & (token_ids < full.shape[1])
                rt_tok[ok] = full[np.flatnonzero(ok), token_ids[ok]]
                miss = np.isnan(rt_tok) & (token_ids >= 0)
            if np.any(miss):
                hit = rt_ids == token_ids[:, None]
                found = hit.any(1) & miss
                rt_tok[found] = rt_lp[found][hit[found]]
        # ---- provider
        if provider_top_ids is None:
            p_ids = np.full((n, 0), -1, dtype=np.int64)
            p_lp = np.full((n, 0), -np.inf)
        else:
            p_ids = np.asarray(provider_top_ids, dtype=np.int64)
            p_lp = np.asarray(provider_top_logprobs, dtype=np.float64)
            if p_ids.ndim != 2 or p_ids.shape[0] != n or p_lp.shape != p_ids.shape:
                raise ValueError(
                    f"provider_top_ids {p_ids.shape} and provider_top_logprobs {p_lp.shape} must both be [N={n}, M]"
                )
        trusted = (
            np.ones(n, bool)
            if provider_trusted is None
            else np.asarray(provider_trusted, bool).reshape(-1).copy()
        )
        p_lp = p_lp.copy()
        p_ids = p_ids.copy()
        bad_val = (p_lp > _POSITIVE_LOGPROB_TOL) & (p_ids >= 0)
        trusted &= ~bad_val.any(1)
        sentinel = (p_lp <= _SENTINEL_LOGPROB) | np.isnan(p_lp) | (p_ids < 0)
        p_lp[sentinel] = -np.inf
        p_ids[sentinel] = -1
        p_lp = np.minimum(p_lp, 0.0)
        if not bool((p_lp[:, 1:] <= p_lp[:, :-1]).all()):  # (sorted already: the stable sort keeps the order)
            order = np.argsort(-p_lp, axis=1, kind="stable")
            p_ids = np.take_along_axis(p_ids, order, 1)
            p_lp = np.take_along_axis(p_lp, order, 1)
        if p_ids.shape[1] > 1:  # drop duplicate ids (keep the first = largest)
            srt = np.sort(p_ids, axis=1)
            has_dup = ((np.diff(srt, axis=1) == 0) & (srt[:, 1:] >= 0)).any(1)
            for i in np.flatnonzero(has_dup):
                _, first = np.unique(p_ids[i], return_index=True)
                keep = np.zeros(p_ids.shape[1], bool)
                keep[first] = True
                keep &= p_ids[i] >= 0
                p_lp[i, ~keep] = -np.inf
                p_ids[i, ~keep] = -1
            if has_dup.any():
                order = np.argsort(-p_lp, axis=1, kind="stable")
                p_ids = np.take_along_axis(p_ids, order, 1)
                p_lp = np.take_along_axis(p_lp, order, 1)
        mass = np.exp(p_lp).sum(1)
        trusted &= mass <= 1 + _MASS_TOL
        if provider_token_logprobs is None:
            p_tok = np.full(n, np.nan)
        elif isinstance(provider_token_logprobs, np.ndarray) and provider_token_logprobs.dtype.kind == "f":
            # _clean_provider_logprob of every entry, vectorised: the same floats, NaN where it gives NaN
            v = provider_token_logprobs.astype(np.float64).reshape(-1)
            with np.errstate(invalid="ignore"):
                p_tok = np.where(np.isfinite(v) & (v > _SENTINEL_LOGPROB), v, np.nan)
        else:
            p_tok = np.array(
                [
                    _clean_provider_logprob(x)
                    for x in np.asarray(provider_token_logprobs, dtype=object).reshape(
                        -1
                    )
                ]
            )
            if p_tok.size != n:
                raise ValueError(
                    f"provider_token_logprobs must be [N={n}], got {p_tok.size}"
                )
            trusted &= ~(p_tok > _POSITIVE_LOGPROB_TOL)
            p_tok = np.minimum(p_tok, 0.0)
        # fill the emitted token's reported logprob from the list when missing
        hit = (p_ids == token_ids[:, None]) & (token_ids[:, None] >= 0)
        fill = np.isnan(p_tok) & hit.any(1)
        p_tok[fill] = p_lp[fill][hit[fill]]

        # ---- reference logprob at provider-listed ids
        ref_at = None
        if rt_ids is not None and rt_lp is not None and rt_tok is not None:  # set together above
            ref_at = np.full(p_ids.shape, np.nan)
            if full is not None:
                ok = (p_ids >= 0) & (p_ids < full.shape[1])
                r_i, c_i = np.nonzero(ok)
                ref_at[r_i, c_i] = full[r_i, p_ids[r_i, c_i]]
            else:
                if p_ids.shape[1]:
                    any_eq = np.zeros(p_ids.shape, bool)
                    eq3, n_eq = None, None
                    if rt_ids.shape[1] and p_ids.size * rt_ids.shape[1] <= _MATCH_CELLS:
                        eq3 = (rt_ids[:, None, :] == p_ids[:, :, None]) & (p_ids[:, :, None] >= 0)  # [N, M, K]
                        n_eq = eq3.sum(2)
                    if eq3 is not None and n_eq is not None and bool((n_eq <= 1).all()):
                        # every listed id matches at most one reference id: all columns at once, the same values
                        any_eq = n_eq == 1
                        ref_at = np.where(any_eq, np.take_along_axis(rt_lp, eq3.argmax(2), 1), ref_at)
                    else:
                        for j in range(p_ids.shape[1]):  # [N, K] per listed column: bounded memory
                            eq = (rt_ids == p_ids[:, j : j + 1]) & (p_ids[:, j : j + 1] >= 0)
                            hit = eq.any(1)
                            any_eq[:, j] = hit
                            ref_at[hit, j] = rt_lp[hit][eq[hit]]
                    is_tok = (p_ids == token_ids[:, None]) & (p_ids >= 0) & ~any_eq
                    ref_at = np.where(
                        is_tok & ~np.isnan(rt_tok)[:, None], rt_tok[:, None], ref_at
                    )
        texts = None
        if token_texts is not None:
            texts = np.asarray(list(token_texts), dtype=object)
            if texts.size != n:
                raise ValueError(f"token_texts must have N={n} entries")
        spans = None
        if token_spans is not None:
            spans = np.asarray(list(token_spans), dtype=object)
            if spans.size != n:
                raise ValueError(f"token_spans must have N={n} entries")
        tps = tks = None
        if top_ps is not None:
            tps = np.broadcast_to(np.asarray(top_ps, dtype=np.float64), (n,)).copy()
            if np.any(~np.isfinite(tps) | (tps <= 0) | (tps > 1)):
                raise ValueError("top_ps must be in (0, 1] (1 = the whole distribution)")
        if top_ks is not None:
            tks = np.broadcast_to(np.asarray(top_ks, dtype=np.int64), (n,)).copy()
            if np.any(tks < 0):
                raise ValueError("top_ks must be >= 0 (0 = no top-k)")
        finals = None
        if step_final is not None:
            finals = np.asarray([np.nan if v is None else float(v) for v in step_final], dtype=np.float64)
            if finals.size != n:
                raise ValueError(f"step_final must have N={n} entries")
            if np.any(np.isfinite(finals) & (finals != 0.0) & (finals != 1.0)):
                raise ValueError("step_final must be 1 (last token of its streamed chunk), 0 or NaN (unknown)")
        return cls(
            prompt_ids=prompt_ids,
            positions=positions,
            token_ids=token_ids,
            temperatures=temps,
            ref_top_ids=rt_ids,
            ref_top_logprobs=rt_lp,
            ref_token_logprobs=rt_tok,
            ref_full_logprobs=full,
            provider_top_ids=p_ids,
            provider_top_logprobs=p_lp,
            provider_token_logprobs=p_tok,
            provider_trusted=trusted,
            ref_at_provider_top=ref_at,
            token_texts=texts,
            token_spans=spans,
            top_ps=tps,
            top_ks=tks,
            step_final=finals,
        )

    @classmethod
    def from_positions(cls, items: Sequence[PositionEvidence]) -> EvidenceBatch:
        """Stack per-position records (reference fields must be given for all positions or none).

        Raises:
            ValueError: if some positions carry a reference and others do not, or on malformed
                reference values (see :meth:`from_arrays`).
        """
        items = list(items)
        n = len(items)
        has_ref = [it.ref_top_ids is not None for it in items]
        has_full = [it.ref_full_logprobs is not None for it in items]
        if any(has_ref) and not all(has_ref):
            raise ValueError("ref_top_ids must be given for every position or for none")
        if any(has_full) and not all(has_full):
            raise ValueError(
                "ref_full_logprobs must be given for every position or for none"
            )
        rt_ids = rt_lp = rt_tok = full = None
        if n and all(has_ref):
            k = max(len(np.asarray(it.ref_top_ids)) for it in items)
            rt_ids = np.full((n, k), -1, np.int64)
            rt_lp = np.full((n, k), -np.inf)
            for i, it in enumerate(items):
                ids = np.asarray(it.ref_top_ids, np.int64).reshape(-1)
                lps = np.asarray(it.ref_top_logprobs, np.float64).reshape(-1)
                if ids.size != lps.size:
                    raise ValueError(
                        f"position {it.prompt_id}#{it.position}: ref_top_ids ({ids.size}) and "
                        f"ref_top_logprobs ({lps.size}) differ in length"
                    )
                rt_ids[i, : ids.size] = ids
                rt_lp[i, : ids.size] = lps
            rt_tok = np.array(
                [
                    np.nan
                    if it.ref_token_logprob is None
                    else float(it.ref_token_logprob)
                    for it in items
                ]
            )
        if n and all(has_full):
            full = np.stack(
                [
                    np.asarray(it.ref_full_logprobs, np.float32).reshape(-1)
                    for it in items
                ]
            )
        m = max([len(it.provider_top) for it in items] + [0])
        p_ids = np.full((n, m), -1, np.int64)
        p_lp = np.full((n, m), -np.inf)
        trusted = np.ones(n, bool)
        for i, it in enumerate(items):
            for j, (tid, lp) in enumerate(it.provider_top.items()):
                p_ids[i, j] = int(tid)
                v = _clean_provider_logprob(lp)
                p_lp[i, j] = -np.inf if math.isnan(v) else v
            if set(it.anomalies) & UNTRUSTED_LOGPROB_ANOMALIES:
                trusted[i] = False
        return cls.from_arrays(
            prompt_ids=[it.prompt_id for it in items],
            positions=[it.position for it in items],
            token_ids=[it.token_id for it in items],
            temperatures=[it.temperature for it in items],
            ref_top_ids=rt_ids,
            ref_top_logprobs=rt_lp,
            ref_token_logprobs=rt_tok,
            ref_full_logprobs=full,
            provider_top_ids=p_ids,
            provider_top_logprobs=p_lp,
            provider_token_logprobs=np.array(
                [it.provider_token_logprob for it in items], dtype=object
            ),
            provider_trusted=trusted,
            token_texts=[it.token_text for it in items]
            if any(it.token_text is not None for it in items)
            else None,
        )

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return int(self.token_ids.size)

    @property
    def has_reference(self) -> bool:
        """True when reference top-K arrays are present."""
        return self.ref_top_ids is not None

    def reference(self) -> ReferenceArrays:
        """The reference arrays, typed as present (check :attr:`has_reference` first).

        Raises:
            ValueError: if the batch was built without a reference.
        """
        if (
            self.ref_top_ids is None
            or self.ref_top_logprobs is None
            or self.ref_token_logprobs is None
            or self.ref_at_provider_top is None
        ):
            raise ValueError("this EvidenceBatch has no reference arrays (has_reference is False)")
        return ReferenceArrays(
            self.ref_top_ids, self.ref_top_logprobs, self.ref_token_logprobs, self.ref_at_provider_top
        )

    @property
    def provider_listed(self) -> np.ndarray:
        """[N] int64 number of provider-listed alternatives per position."""
        return np.asarray((self.provider_top_ids >= 0).sum(1), dtype=np.int64)

    def subset(self, mask: np.ndarray) -> EvidenceBatch:
        """A batch restricted to the positions where mask [N] bool (or an index array) selects.

        Every field is a per-position array (first axis N) or None (class docstring), so each is indexed."""
        cut: dict[str, Any] = {  # np.ndarray | None per field
            f.name: None if (a := getattr(self, f.name)) is None else a[mask] for f in fields(self)
        }
        return replace(self, **cut)

    def evidence_row(self, i: int, **extra: Any) -> dict[str, Any]:
        """A JSON-able evidence dict for position i (prompt, position, token, reference top-5, ...).

        What ``json_safe`` makes of the row, built directly: the ids and strings are already JSON values,
        the rounded logprobs become None where not finite, and each ``extra`` value (floats rounded)
        goes through :func:`~auditor.util.json_safe`.
        """
        fin = math.isfinite
        row: dict[str, Any] = {
            "prompt_id": str(self.prompt_ids[i]),
            "position": int(self.positions[i]),
            "token_id": int(self.token_ids[i]),
        }
        if self.token_texts is not None and self.token_texts[i] is not None:
            row["token"] = str(self.token_texts[i])
        if self.has_reference:
            ref = self.reference()
            # tolist: the Python ints / floats that int() and float() of the entries give
            ids, lps = np.asarray(ref.top_ids[i, :5], np.int64).tolist(), ref.top_logprobs[i, :5].tolist()
            row["ref_top5"] = [[a, b if fin(b := round(x, 6)) else None] for a, x in zip(ids, lps, strict=True) if a >= 0]
            if len(lps) >= 2 and fin(lps[1]):
                row["ref_margin"] = v if fin(v := round(lps[0] - lps[1], 6)) else None
            if not math.isnan(v := float(ref.token_logprobs[i])):
                row["ref_token_logprob"] = v if fin(v := round(v, 6)) else None
        listed = [
            (a, x)
            for a, x in zip(np.asarray(self.provider_top_ids[i], np.int64).tolist(),
                            self.provider_top_logprobs[i].tolist(), strict=True)
            if a >= 0
        ]
        if listed:
            row["provider_top5"] = [[a, b if fin(b := round(x, 6)) else None] for a, x in listed[:5]]
        if not math.isnan(v := float(self.provider_token_logprobs[i])):
            row["provider_token_logprob"] = v if fin(v := round(v, 6)) else None
        for k, x in extra.items():
            row[k] = json_safe(_r(x) if isinstance(x, (float, np.floating)) else x)
        return row


def _r(x: float | np.floating[Any]) -> float:
    return round(float(x), 6)


def _positions_within(prompt_ids: np.ndarray) -> np.ndarray:
    """0-based index of each entry within its prompt, in order of appearance."""
    counts: dict[str, int] = {}
    out = np.empty(prompt_ids.size, np.int64)
    for i, p in enumerate(prompt_ids):
        out[i] = counts.get(p, 0)
        counts[p] = out[i] + 1
    return out
