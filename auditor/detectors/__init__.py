"""Statistical detectors: each a pure function (EvidenceBatch, NoiseFloor | None) → DetectorResult.

Registry keys (kebab-case) and what they need — a summary; the :data:`DETECTORS` entries below are
authoritative:

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
| greedy-heterogeneity | T = 0, per request    | reference (+ floor)           | a minority of requests mismatches  |
| greedy-near-tie      | T = 0, near-ties      | reference + floor             | near-ties flipped beyond noise     |

Each key's metadata lives here, in one place (:class:`DetectorSpec` in :data:`DETECTORS`): the
probe mode it reads, the positions it uses, its test kind, the causes a rejection points at, the
power family and the target effect of the PASS/INCONCLUSIVE power check. ``auditor.verdict.decide`` and
the pipeline read it through :func:`spec`, :func:`detectors_where`, :data:`MODES`,
:data:`IMPLICATIONS`, :data:`POWER_FAMILIES`, :data:`POWER_TARGETS`, :data:`REFERENCE_DETECTORS`
and :data:`SELF_SAMPLING_DETECTORS`; names are :class:`DetectorName` members, never bare strings.
The pre-flight parameter checks that join the same Holm family (``auditor.check.preflight``) have their
entries in :data:`PREFLIGHT_CHECKS` (the verdict rule each decides, its implication).

``run_detectors`` runs a selection and returns one DetectorResult per key (``ran=False`` with a
reason when a detector had nothing to work on); ``auditor.verdict.decide.decide_verdict`` applies Holm
across those that ran and names the cause. Decision rules: docs/detectors.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

import numpy as np

from .base import (
    MIN_POSITIONS,
    UNTRUSTED_LOGPROB_ANOMALIES,
    UNTRUSTED_RESPONSE_ANOMALIES,
    DetectorName,
    DetectorResult,
    EvidenceBatch,
    PositionEvidence,
    not_run,
)
from .consistency import self_argmax, self_gof, self_greedy, self_tail
from .greedy import greedy_match
from .heterogeneity import greedy_heterogeneity, logprob_heterogeneity
from .logprob import logprob_divergence
from .near_tie import greedy_near_tie
from .noise_floor import NoiseFloor, compute_noise_floor
from .sampling import sampling_argmax, sampling_gof, sampling_tail
from .stats import holm

__all__ = [
    "DETECTORS",
    "IMPLICATIONS",
    "MIN_POSITIONS",
    "MODES",
    "POWER_FAMILIES",
    "POWER_TARGETS",
    "PREFLIGHT_CHECKS",
    "REFERENCE_DETECTORS",
    "SELF_SAMPLING_DETECTORS",
    "UNTRUSTED_LOGPROB_ANOMALIES",
    "UNTRUSTED_RESPONSE_ANOMALIES",
    "DetectorFn",
    "DetectorName",
    "DetectorResult",
    "DetectorSpec",
    "EvidenceBatch",
    "Mode",
    "NoiseFloor",
    "PositionEvidence",
    "PowerFamily",
    "PowerTarget",
    "PreflightSpec",
    "TestKind",
    "compute_noise_floor",
    "detectors_where",
    "holm",
    "not_run",
    "run_detectors",
    "spec",
]


class Mode(StrEnum):
    """Probe mode a detector reads (the store's ``probes.mode``): what the audit must request."""

    GREEDY = "greedy"
    LOGPROB = "logprob"
    SAMPLING = "sampling"


class TestKind(StrEnum):
    """The statistic behind a detector (decides its power calculation in ``auditor.verdict.decide``)."""

    __test__ = False  # not a pytest class

    CLEAR_MISMATCH = "clear-mismatch"  # exact binomial on clear mismatches (greedy.py)
    KL = "kl"  # z-test on mean log bucketed KL against the floor (logprob.py)
    PIT = "pit"  # randomized-PIT Cramér–von Mises omnibus (sampling.py); no power target
    ARGMAX = "argmax"  # Poisson-binomial argmax over-emission (sampling.py)
    TAIL = "tail"  # Poisson-binomial tail deficit (sampling.py)
    SCAN = "scan"  # per-request exact binomial, Šidák over requests (heterogeneity.py); no power target
    NEAR_TIE = "near-tie"  # Poisson tail of near-tie flips vs the honest flip bound (near_tie.py); no power family


class PowerFamily(StrEnum):
    """PASS needs, for every family that ran, one detector with enough power for its target."""

    MODEL = "model"
    ACCEPTANCE = "acceptance"
    TRUNCATION = "truncation"
    DECODE_PATH = "decode-path"


@dataclass(frozen=True)
class PowerTarget:
    """The effect an audit must be able to see (``auditor.verdict.power.required_positions``).

    Attributes:
        key: name of the target (the key of :data:`POWER_TARGETS`).
        value: target effect in ``unit``.
        unit: unit of the detector's effect the target is stated in.
        meaning: what an effect of this size corresponds to.
    """

    key: str
    value: float
    unit: str
    meaning: str


_CLEAR_MISMATCH = PowerTarget(
    "clear_mismatch_rate", 0.03, "fraction of greedy positions", "3% clear mismatches (int8-like)"
)
_KL_RATIO = PowerTarget(
    "kl_ratio", 3.0, "geometric-mean KL / honest floor", "KL three times the honest noise floor"
)
_ARGMAX_EXCESS = PowerTarget(
    "argmax_excess", 0.08, "extra argmax emissions per sampled position",
    "0.08 extra argmax emissions per sampled position (relaxed acceptance)"
)
_TAIL_RATIO = PowerTarget(
    "tail_ratio", 0.0, "observed / expected tail emissions", "the tail entirely missing (truncation)"
)
_NEAR_TIE_FLIPS = PowerTarget(
    "near_tie_flip_rate", 0.1, "near-tie flips per tested near-tie position",
    "one in ten near-ties flipped to the runner-up (greedy-relaxed verification)"
)

#: Target effects by key (read by the verdict's power check): key → value.
POWER_TARGETS: Mapping[str, float] = MappingProxyType(
    {t.key: t.value for t in (_CLEAR_MISMATCH, _KL_RATIO, _ARGMAX_EXCESS, _TAIL_RATIO, _NEAR_TIE_FLIPS)}
)

#: A detector: (batch, floor, *, rng, ...) → DetectorResult.
DetectorFn = Callable[..., DetectorResult]

# verdict names a rejection can lead to (auditor.verdict.kinds.VerdictKind values; tests check them)
_Q, _S, _R, _D = "QUANTIZATION", "SUBSTITUTION", "RELAXED_VERIFICATION", "DECODING_NONCOMPLIANT"
_QS = "QUANTIZATION_OR_SUBSTITUTION"
_QR = "QUANTIZATION_OR_RELAXED_VERIFICATION"
_RD = "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT"


@dataclass(frozen=True)
class DetectorSpec:
    """Registry entry: everything the verdict, the pipeline and reports know about one detector.

    Attributes:
        name: registry key.
        fn: the detector function.
        description: one line, what it compares.
        needs_reference: compares with the reference model's distribution at the same prompt (else:
            the provider's own logprobs); such detectors are set aside on a chat-template mismatch.
        needs_top_logprobs: needs the provider's reported top_logprobs.
        mode: the probe mode whose responses it reads.
        test: the statistic (decides the power calculation).
        positions: which positions it uses (temperature and what must be known there).
        causes: verdicts a rejection can lead to (``auditor.verdict.kinds.VerdictKind`` values), most
            likely first; which one is decided by the rules in ``auditor.verdict.decide``.
        implication: short cause-naming phrase for ``Verdict.details["findings"]``.
        finding: one sentence for reports (``auditor.report.render``).
        power_family: its family in the PASS/INCONCLUSIVE power check, None when it has none
            (the omnibus PIT tests, the per-request scan, the near-tie test).
        power_target: the target effect of that check (and of the rules-out power model: the near-tie test has
            a target without a family), None when the detector has no power calculation.
    """

    name: DetectorName
    fn: DetectorFn
    description: str
    needs_reference: bool
    needs_top_logprobs: bool
    mode: Mode
    test: TestKind
    positions: str
    causes: tuple[str, ...]
    implication: str
    finding: str
    power_family: PowerFamily | None
    power_target: PowerTarget | None


@dataclass(frozen=True)
class _Kind:
    """What a test kind fixes for the detectors of that kind that read the reference (``ref_*``) or the
    provider's own logprobs (``own_*``): probe mode, positions text, description prefix, power check."""

    mode: Mode
    ref_positions: str
    own_positions: str
    ref_prefix: str
    own_prefix: str
    ref_power: tuple[PowerFamily | None, PowerTarget | None]
    own_power: tuple[PowerFamily | None, PowerTarget | None]


_REF_SAMPLED = "T > 0, aligned token, reference row (top-K list: T = 1 only; full rows: any T > 0, tempered)"
_OWN_SAMPLED = "T = 1, aligned token, trusted provider top_logprobs (listed support + tail bucket)"


def _sampled(power: tuple[PowerFamily | None, PowerTarget | None]) -> _Kind:
    """A sampling test kind: the same power check for the reference and the self test."""
    return _Kind(Mode.SAMPLING, _REF_SAMPLED, _OWN_SAMPLED, "sampled tokens: ", "sampled tokens vs own logprobs: ",
                 power, power)


#: The test kinds read from the reference or from the provider's own logprobs (not KL: reference only).
_KINDS: Mapping[TestKind, _Kind] = MappingProxyType(
    {
        TestKind.CLEAR_MISMATCH: _Kind(
            Mode.GREEDY, "T = 0, aligned token, reference row", "T = 0, aligned token, trusted provider top_logprobs",
            "", "", (PowerFamily.MODEL, _CLEAR_MISMATCH), (PowerFamily.DECODE_PATH, _CLEAR_MISMATCH),
        ),
        TestKind.PIT: _sampled((None, None)),
        TestKind.ARGMAX: _sampled((PowerFamily.ACCEPTANCE, _ARGMAX_EXCESS)),
        TestKind.TAIL: _sampled((PowerFamily.TRUNCATION, _TAIL_RATIO)),
    }
)


def _paired_spec(
    name: DetectorName,
    fn: DetectorFn,
    test: TestKind,
    causes: tuple[str, ...],
    own: bool,
    description: str,
    implication: str,
    finding: str | None = None,
    positions_note: str = "",
) -> DetectorSpec:
    """A registry entry of a test kind in :data:`_KINDS`: what follows from reading the reference
    (``own=False``) or the provider's own top_logprobs (``own=True``), and from the test kind (mode,
    positions, power family and target).

    ``description`` follows the kind's prefix (sampling tests: "sampled tokens: " or "sampled tokens
    vs own logprobs: "); ``finding`` defaults to ``implication``; ``positions_note`` is appended to the
    positions text; the other arguments are :class:`DetectorSpec` fields.
    """
    k = _KINDS[test]
    family, target = k.own_power if own else k.ref_power
    return DetectorSpec(
        name,
        fn,
        (k.own_prefix if own else k.ref_prefix) + description,
        needs_reference=not own,
        needs_top_logprobs=own,
        mode=k.mode,
        test=test,
        positions=(k.own_positions if own else k.ref_positions) + positions_note,
        causes=causes,
        implication=implication,
        finding=implication if finding is None else finding,
        power_family=family,
        power_target=target,
    )


#: The registry, in a fixed order (``run_detectors`` derives each detector's seed from its index:
#: append new detectors at the end so that existing seeds do not move).
DETECTORS: Mapping[str, DetectorSpec] = MappingProxyType(
    {
        str(s.name): s
        for s in (
            _paired_spec(DetectorName.GREEDY_MATCH, greedy_match, TestKind.CLEAR_MISMATCH, (_Q, _QS, _D), False,
                         "T=0 tokens vs reference argmax; clear mismatches beyond the noise band",
                         "greedy tokens differ from the reference (model changed, or decode path differs)",
                         "greedy tokens differ from the reference argmax beyond the honest noise band"),
            DetectorSpec(
                DetectorName.LOGPROB_DIVERGENCE,
                logprob_divergence,
                "reported top_logprobs vs reference: bucketed KL vs honest floor",
                needs_reference=True,
                needs_top_logprobs=True,
                mode=Mode.LOGPROB,
                test=TestKind.KL,
                positions="T in {0, 1}, trusted provider top_logprobs (>= floor width M), reference row",
                causes=(_Q, _S, _QS),
                implication="reported distribution differs from the reference (quantization or substitution)",
                finding="the reported distribution differs from every honest variant of the reference",
                power_family=PowerFamily.MODEL,
                power_target=_KL_RATIO,
            ),
            _paired_spec(DetectorName.SAMPLING_GOF, sampling_gof, TestKind.PIT, (_R, _Q, _S, _QS, _RD), False,
                         "randomized PIT uniformity (Cramér–von Mises)",
                         "sampled tokens do not follow the reference distribution"),
            _paired_spec(DetectorName.SAMPLING_ARGMAX, sampling_argmax, TestKind.ARGMAX, (_R, _D, _RD), False,
                         "argmax over-emission (relaxed acceptance)",
                         "argmax over-emitted (relaxed acceptance, or greedy serving)",
                         "the argmax is over-emitted when sampling (relaxed acceptance, or greedy serving)",
                         positions_note="; scanned over p(argmax) >= t from ARGMAX_TEST_MIN_P"),
            _paired_spec(DetectorName.SAMPLING_TAIL, sampling_tail, TestKind.TAIL, (_D, _R, _Q, _RD), False,
                         "low-probability tail deficit (truncated sampling)",
                         "low-probability tail under-emitted (truncated sampling)",
                         "the low-probability tail is under-emitted (truncated sampling)"),
            _paired_spec(DetectorName.SELF_GOF, self_gof, TestKind.PIT, (_R, _RD), True,
                         "randomized PIT uniformity",
                         "sampled tokens do not follow the provider's own reported distribution"),
            _paired_spec(DetectorName.SELF_ARGMAX, self_argmax, TestKind.ARGMAX, (_R, _D, _RD), True,
                         "top-1 over-emission", "own top-1 over-emitted (relaxed acceptance)",
                         "the provider's own top-1 is over-emitted when sampling"),
            _paired_spec(DetectorName.SELF_TAIL, self_tail, TestKind.TAIL, (_D, _R, _RD), True,
                         "tail deficit", "own tail under-emitted (truncated sampling)",
                         "the provider's own tail is under-emitted"),
            _paired_spec(DetectorName.SELF_GREEDY, self_greedy, TestKind.CLEAR_MISMATCH, (_D,), True,
                         "T=0 tokens vs own reported top-1 (decode path consistency)",
                         "greedy tokens contradict own reported top-1 (decode path differs)",
                         "greedy tokens contradict the provider's own reported top-1 (decode path differs)"),
            DetectorSpec(
                DetectorName.GREEDY_HETEROGENEITY,
                greedy_heterogeneity,
                "T=0 tokens vs reference argmax, request by request: the most divergent request against the honest rate",
                needs_reference=True,
                needs_top_logprobs=False,
                mode=Mode.GREEDY,
                test=TestKind.SCAN,
                positions="T = 0, aligned token, reference row; grouped by request (prompt)",
                causes=(_Q, _QS, _D),
                implication="a minority of requests is served by a different or degraded model (mixed serving)",
                finding="some requests' greedy tokens differ from the reference far more than honest serving allows, "
                        "while others match: part of the traffic is served differently",
                power_family=None,
                power_target=None,
            ),
            DetectorSpec(
                DetectorName.GREEDY_NEAR_TIE,
                greedy_near_tie,
                "T=0 tokens vs reference argmax at near-ties: runner-up picks vs the honest |Δ margin| bound",
                needs_reference=True,
                needs_top_logprobs=False,
                mode=Mode.GREEDY,
                test=TestKind.NEAR_TIE,
                positions="T = 0, aligned token, reference row; reference margin in [q_0.9 of |Δ margin|, band]",
                causes=(_R, _Q, _QR),
                implication="greedy tokens take the reference's runner-up at near-ties more often than numeric noise "
                            "allows (greedy verification accepts non-argmax drafts)",
                finding="at temperature 0 the provider emits the reference's runner-up at near-ties more often than "
                        "honest numeric noise can flip them: its greedy (speculative) verification accepts "
                        "non-argmax drafts",
                power_family=None,
                power_target=_NEAR_TIE_FLIPS,
            ),
            DetectorSpec(
                DetectorName.LOGPROB_HETEROGENEITY,
                logprob_heterogeneity,
                "reported top_logprobs vs reference, request by request: the most divergent request's mean log KL "
                "against the floor (Šidák over requests)",
                needs_reference=True,
                needs_top_logprobs=True,
                mode=Mode.LOGPROB,
                test=TestKind.SCAN,
                positions="T in {0, 1}, trusted provider top_logprobs (>= floor width M), reference row; grouped by "
                          "request (prompt)",
                causes=(_Q, _QS),
                implication="a minority of requests reports a distribution that differs from the reference (mixed "
                            "serving, e.g. some requests routed to a quantized replica)",
                finding="some requests' reported logprobs differ from the reference far more than honest serving "
                        "allows, while others match: part of the traffic is served by another numeric format or model",
                power_family=None,
                power_target=None,
            ),
        )
    }
)


def spec(name: str) -> DetectorSpec:
    """The registry entry of ``name`` (a :class:`DetectorName` or its string).

    Raises:
        KeyError: on an unknown name, listing the known ones.
    """
    try:
        return DETECTORS[name]
    except KeyError:
        raise KeyError(f"unknown detector {name!r}; known: {list(DETECTORS)}") from None


def detectors_where(
    *,
    mode: Mode | None = None,
    test: TestKind | None = None,
    power_family: PowerFamily | None = None,
    needs_reference: bool | None = None,
) -> tuple[DetectorName, ...]:
    """Names of the detectors matching every given attribute (None = any), in registry order."""
    return tuple(
        s.name
        for s in DETECTORS.values()
        if (mode is None or s.mode == mode)
        and (test is None or s.test == test)
        and (power_family is None or s.power_family == power_family)
        and (needs_reference is None or s.needs_reference == needs_reference)
    )


#: name → probe mode.
MODES: Mapping[str, Mode] = MappingProxyType({k: s.mode for k, s in DETECTORS.items()})
#: name → short implication of a rejection (``Verdict.details["findings"]``).
IMPLICATIONS: Mapping[str, str] = MappingProxyType({k: s.implication for k, s in DETECTORS.items()})
#: power family → its detectors, in registry order (families in PowerFamily order).
POWER_FAMILIES: Mapping[str, tuple[DetectorName, ...]] = MappingProxyType(
    {str(f): detectors_where(power_family=f) for f in PowerFamily}
)
#: Detectors that compare with the reference model at the same prompt (set aside on a template mismatch).
REFERENCE_DETECTORS = detectors_where(needs_reference=True)
#: The sampling tests on the provider's own logprobs (run only without a reference, by default).
SELF_SAMPLING_DETECTORS = tuple(
    s.name for s in DETECTORS.values() if not s.needs_reference and s.mode == Mode.SAMPLING
)


@dataclass(frozen=True)
class PreflightSpec:
    """Entry of a pre-flight parameter check that joins the verdict's Holm family.

    ``auditor.check.preflight`` turns its decoding checks into ``preflight-*`` DetectorResults; the verdict
    (rule 6) names DECODING_NONCOMPLIANT when one rejects. Pre-flight results never count towards
    the power check.

    Attributes:
        name: the DetectorResult name (``preflight-<check>``).
        rule: the verdict rule it decides (``Verdict.details["rule"]``).
        implication: short cause-naming phrase for ``Verdict.details["findings"]``.
    """

    name: str
    rule: str
    implication: str


#: The pre-flight checks in the Holm family, in the order the verdict consults them.
PREFLIGHT_CHECKS: Mapping[str, PreflightSpec] = MappingProxyType(
    {
        s.name: s
        for s in (
            PreflightSpec("preflight-greedy-top1", "6-preflight-greedy",
                          "pre-flight: temperature-0 tokens are not the provider's own top-1"),
            PreflightSpec("preflight-top-p", "6-preflight-sampling",
                          "pre-flight: server-side top-k/top-p/min-p at temperature 1 with top_p=1"),
        )
    }
)


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
