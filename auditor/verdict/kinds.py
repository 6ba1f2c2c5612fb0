"""What a verdict is: the kinds an audit can end in, the undetermined pairs, the exit codes, :class:`Verdict`,
and the two shapes every rule module shares (:class:`Cause`, :class:`RuleContext`).

The rules themselves: :mod:`auditor.verdict.model_rules` (is the declared model served at its precision?),
:mod:`auditor.verdict.verification_rules` (strict verification, decoding compliance), applied in order by
:func:`auditor.verdict.decide.decide_verdict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from auditor.detectors import DetectorName
from auditor.detectors.base import DetectorResult
from auditor.util import finite as _f
from auditor.verdict.cause import implication, no_speculation_seen

__all__ = ["EXIT_CODES", "LOGPROBS_CONSISTENT_MAX_RATIO", "UNDETERMINED_CAUSES", "Cause", "RuleContext", "Verdict",
           "VerdictKind"]


class VerdictKind(StrEnum):
    PASS = "PASS"
    QUANTIZATION = "QUANTIZATION"
    RELAXED_VERIFICATION = "RELAXED_VERIFICATION"
    SUBSTITUTION = "SUBSTITUTION"
    #: The served weights are not the declared model at its original precision, and the evidence cannot
    #: tell a heavily degraded quantized copy from another model (issue 14 item 5: a third answer rather
    #: than a forced, possibly false, choice between the two).
    QUANTIZATION_OR_SUBSTITUTION = "QUANTIZATION_OR_SUBSTITUTION"
    #: A deviation that is either quantized weights or a lossy greedy verifier, and the evidence cannot tell
    #: which (issue 37 item 2: near-tie flips without the provider's own top_logprobs; rule 3n).
    QUANTIZATION_OR_RELAXED_VERIFICATION = "QUANTIZATION_OR_RELAXED_VERIFICATION"
    #: The sampled tokens deviate (a thinned tail, an over-emitted argmax) and the evidence cannot tell lossy
    #: speculative acceptance from a server-side top-k / top-p / min-p (issue 37 item 8: the emission models'
    #: margin is below DECISIVE_EMISSION_MARGIN, or they lean to acceptance while the speculation fingerprint saw
    #: no speculation).
    RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT = "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT"
    DECODING_NONCOMPLIANT = "DECODING_NONCOMPLIANT"
    INCONCLUSIVE = "INCONCLUSIVE"


#: The undetermined verdicts → the two causes each stands for (a deviation was found; which of the two is
#: not established). The one home of this fact: questions, standing, sequential stopping and calibration read it.
UNDETERMINED_CAUSES: Mapping[VerdictKind, tuple[VerdictKind, VerdictKind]] = {
    VerdictKind.QUANTIZATION_OR_SUBSTITUTION: (VerdictKind.QUANTIZATION, VerdictKind.SUBSTITUTION),
    VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION: (VerdictKind.QUANTIZATION, VerdictKind.RELAXED_VERIFICATION),
    VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT: (VerdictKind.RELAXED_VERIFICATION,
                                                                VerdictKind.DECODING_NONCOMPLIANT),
}

#: CLI exit codes (issue 5): 0 PASS, 1 a deviation, 2 INCONCLUSIVE (3 = usage errors, CLI's own).
EXIT_CODES = {
    VerdictKind.PASS: 0,
    VerdictKind.QUANTIZATION: 1,
    VerdictKind.RELAXED_VERIFICATION: 1,
    VerdictKind.SUBSTITUTION: 1,
    VerdictKind.QUANTIZATION_OR_SUBSTITUTION: 1,
    VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION: 1,
    VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT: 1,
    VerdictKind.DECODING_NONCOMPLIANT: 1,
    VerdictKind.INCONCLUSIVE: 2,
}

#: Reported logprobs "match the reference" when logprob-divergence did not reject and its mean
#: KL is at most this multiple of the honest floor's.
LOGPROBS_CONSISTENT_MAX_RATIO = 2.0


@dataclass
class Verdict:
    """An audit's outcome.

    Attributes:
        verdict: a VerdictKind value (str).
        reason: one sentence naming the deciding detector(s) and numbers.
        details: JSON-able: alpha, detectors (name → ran, p, p_adjusted, effect, n, rejects),
            findings (every rejecting detector with its implication), power (per detector:
            required positions, adequate), suggested_budget_tokens (INCONCLUSIVE), rule (which
            rule decided).
        results: the DetectorResults with ``p_adjusted`` filled in (not serialised in details).
    """

    verdict: str
    reason: str
    details: dict[str, Any]
    results: list[DetectorResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[VerdictKind(self.verdict)]


@dataclass(frozen=True)
class Cause:
    """One cause with its rule, reason and the detectors that decide it."""

    kind: VerdictKind
    reason: str
    rule: str
    deciding: tuple[str, ...] = ()
    short: str = ""
    by: Mapping[str, DetectorResult] = field(default_factory=dict, compare=False, repr=False)
    #: False when the reason itself says the evidence does not single out this cause (a QUANTIZATION
    #: named as the milder cause, :func:`auditor.verdict.cause.milder_cause_clause`)
    established: bool = True

    def to_dict(self) -> dict[str, Any]:
        ev = []
        for n in self.deciding:
            r = self.by.get(n)
            if r is not None:
                ev.append({"detector": n, "p_adjusted": _f(r.p_adjusted), "p_value": _f(r.p_value),
                           "effect": _f(r.effect), "n": r.n, "implication": implication(n)})
        return {"verdict": str(self.kind), "rule": self.rule, "reason": self.reason, "evidence": ev}


@dataclass
class RuleContext:
    """One audit's Holm-adjusted results as the rules read them: ``by`` name, ``rejects(name)`` at the
    family-wise alpha, the verdict ``details`` being written (rules record their figures there) and the speculation
    fingerprint (``decide_verdict(speculation=...)``)."""

    by: dict[str, DetectorResult]
    rejects: Callable[[str], bool]
    details: dict[str, Any]
    speculation: Mapping[str, Any] | None = None

    @property
    def no_speculation(self) -> bool:
        """The speculation fingerprint saw no speculation (``detected`` False)."""
        return no_speculation_seen(self.speculation)

    @property
    def lp(self) -> DetectorResult | None:
        return self.by.get(DetectorName.LOGPROB_DIVERGENCE)

    @property
    def lp_sig(self) -> bool:
        return self.rejects(DetectorName.LOGPROB_DIVERGENCE)

    @property
    def lp_ratio(self) -> float | None:
        lp = self.lp
        return (lp.details or {}).get("ratio_to_floor") if lp is not None and lp.ran else None

    @property
    def lp_consistent(self) -> bool:
        lp, ratio = self.lp, self.lp_ratio
        return bool(lp is not None and lp.ran and not self.lp_sig and ratio is not None
                    and ratio <= LOGPROBS_CONSISTENT_MAX_RATIO
                    and not self.rejects(DetectorName.LOGPROB_HETEROGENEITY))  # some requests' logprobs differ

    def cause(self, kind: VerdictKind, reason: str, rule: str, deciding: Sequence[str], short: str, *,
              established: bool = True) -> Cause:
        return Cause(kind, reason, rule, tuple(deciding), short, self.by, established)
