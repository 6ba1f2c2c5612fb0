"""Sequential stopping for ``auditor check --budget-tokens auto``: a group-sequential design with α spending.

Method. The audit probes in rounds and looks at the evidence after each round, at cumulative
completion-token counts ``n_1 < n_2 < … < n_K = N`` (the maximum budget). Look k has information
fraction ``t_k = n_k / N`` and spends ``α_k = α(t_k) − α(t_{k−1})`` of the family-wise level,
where α(·) is a Lan–DeMets (1983) spending function:

- ``obrien-fleming``: α(t) = 2 − 2Φ(z_{1−α/2} / √t) — almost nothing early, most at the end;
- ``pocock`` (``--budget-tokens auto``): α(t) = α · ln(1 + (e − 1) t) — evenly spread;
- ``linear``: α(t) = α · t.

At look k the whole audit decision — every detector, Holm across them, the decision rules
(``auditor.verdict.decide.decide_verdict``) — is taken at level α_k, on all tokens seen so far:

- a deviation verdict (QUANTIZATION, RELAXED_VERIFICATION, SUBSTITUTION, QUANTIZATION_OR_SUBSTITUTION,
  QUANTIZATION_OR_RELAXED_VERIFICATION, RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT, DECODING_NONCOMPLIANT)
  stops the audit: **reject** — except that with ``resolve_cause`` (``--resolve-cause``) a deviation whose
  cause is not established — QUANTIZATION_OR_SUBSTITUTION ("not the declared weights at their precision;
  heavy quantization or another model"), QUANTIZATION_OR_RELAXED_VERIFICATION (quantized weights or a lossy
  greedy verifier: more sampled tokens can tell them apart), RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT (lossy
  acceptance or a server-side truncation: more sampled tokens widen the emission models' margin), or a
  QUANTIZATION whose verdict records
  ``details["cause_established"] = False`` (named as the milder cause: its flips do not rule out another
  model) — does not stop it before the last look: the rejection stands
  (action ``reject-resolve``) and the audit goes on probing to tell the two causes apart. A later
  look whose verdict is a deviation with an established cause (e.g. SUBSTITUTION once
  the flip test has enough confident positions) stops it with that verdict (action ``cause``,
  ``details["cause_resolved"]`` naming the rejecting look); at the last look the rejection is final
  (action ``reject``) with that look's verdict when it is a deviation, else the rejecting look's;
- PASS (nothing rejects *and* every detector family that ran has the design's ``accept_power``
  against its target effect at level α_k — the verdict's own adequacy check — *and*, with
  ``require_rules_out`` (the default), every deviation class the audit's detectors can test is
  ruled out: ``details["rules_out"]``, :mod:`auditor.verdict.rules_out`, power >= 95% against the
  calibrated effect) stops it: **accept**;
- otherwise (INCONCLUSIVE, or a PASS that does not yet rule out every tested class) the audit
  continues; at the last look its verdict is final, except that a PASS which still leaves a tested
  class not ruled out becomes INCONCLUSIVE (rule ``seq-not-ruled-out``) with the tokens still
  needed (``details["suggested_budget_tokens"]``, :func:`auditor.verdict.rules_out.tokens_to_rule_out`).
  The classes waited for are fixed at the first look: those the design can rule out within its
  cap (projected from that look's positions per token, :func:`_reachable`); a class beyond the cap
  is reported as not ruled out (with its power) and does not hold the PASS back.

Validity (why this is anytime-valid at the design's looks). The looks' tests are dependent (each
uses all earlier tokens), and the detectors are a heterogeneous family (exact binomial,
Cramér–von Mises, z-tests), so the joint-normal boundaries of classical group-sequential designs
do not apply. We use the union bound instead: under H0 (an honest provider)
``P(reject at some look) ≤ Σ_k P(reject at look k) ≤ Σ_k α_k = α(1) = α``, for *any* dependence
between looks (looks after a ``reject-resolve`` only choose which deviation is named, never whether
one is: the audit's outcome is a deviation from the rejecting look on); stopping early to accept can
only remove chances to reject, and so can refusing to accept (continuing past a PASS that does not rule out every class takes looks whose α_k the bound
already counts; turning a last-look PASS into INCONCLUSIVE rejects nothing). This is conservative
(it ignores the positive correlation between looks), which is the price for reusing every
detector unchanged. Look times must not depend on the data (they are fixed by the design; the
token count actually reached at a look is used for t_k, clipped to 1, and the last look spends
everything left).

Measured on the simulator (``auditor calibrate``; docs/calibration.md): false-accusation rate,
power and the mean tokens used against the fixed-budget audit at the maximum budget.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol, cast

from scipy import stats

from auditor.verdict.kinds import UNDETERMINED_CAUSES, VerdictKind
from auditor.verdict.rules_out import RULE_OUT_POWER, RuleOut, as_rule_outs, not_ruled_out, tokens_to_rule_out

if TYPE_CHECKING:
    from auditor.check.pipeline import AnalysisRecord
    from auditor.report.common import AuditReport
    from probes.suites import Suite

__all__ = [
    "AUTO_ACCEPT_POWER",
    "AUTO_MAX_TOKENS",
    "AUTO_SPENDING",
    "SPENDING_FUNCTIONS",
    "LookDecision",
    "SequentialAudit",
    "SequentialDesign",
    "alpha_spent",
    "run_sequential",
    "run_sequential_check",
    "tokens_saved",
]

SPENDING_FUNCTIONS = ("obrien-fleming", "pocock", "linear")
_DEVIATIONS = frozenset(str(v) for v in VerdictKind if v not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE))
#: The deviation verdicts whose cause is undetermined (``auditor.verdict.kinds.UNDETERMINED_CAUSES``): with
#: ``SequentialDesign.resolve_cause`` they do not stop the audit before the last look, nor does a deviation
#: whose verdict records ``details["cause_established"] = False`` (a QUANTIZATION named as the milder cause).
_UNDETERMINED = frozenset(str(v) for v in UNDETERMINED_CAUSES)


def _details_of(v: object) -> dict[str, Any]:
    """A look's verdict details (``Verdict.details`` or ``AuditReport.verdict_details``; {} when it has none)."""
    d = getattr(v, "verdict_details", None)
    if not isinstance(d, dict):
        d = getattr(v, "details", None)
    return d if isinstance(d, dict) else {}


def _undetermined(v: object, verdict: str) -> bool:
    """A deviation verdict whose cause the evidence does not single out (see ``_UNDETERMINED``)."""
    return verdict in _UNDETERMINED or (verdict in _DEVIATIONS and _details_of(v).get("cause_established") is False)


def alpha_spent(t: float, alpha: float, spending: str = "obrien-fleming") -> float:
    """Cumulative α spent at information fraction ``t`` (Lan & DeMets 1983).

    Args:
        t: information fraction in [0, 1] (values outside are clipped).
        alpha: overall level in (0, 1).
        spending: ``obrien-fleming`` | ``pocock`` | ``linear``.

    Returns:
        α(t), non-decreasing in t, α(0) = 0, α(1) = alpha.

    Raises:
        ValueError: unknown spending function or alpha outside (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    t = min(1.0, max(0.0, float(t)))
    if t <= 0:
        return 0.0
    if spending == "obrien-fleming":
        z = stats.norm.isf(alpha / 2)
        return float(min(alpha, 2 * stats.norm.sf(z / math.sqrt(t))))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    if spending == "linear":
        return float(alpha * t)
    raise ValueError(f"spending={spending!r}; choose one of {SPENDING_FUNCTIONS}")


@dataclass(frozen=True)
class SequentialDesign:
    """Looks (cumulative completion tokens) and the α-spending function.

    Attributes:
        looks: strictly increasing cumulative token counts; the last is the maximum budget N.
        alpha: family-wise level of the whole sequential audit.
        spending: ``obrien-fleming`` (default) | ``pocock`` | ``linear``.
        accept_power: power against the verdict's target effects that a PASS must have to stop
            the audit *before* the last look (None: the verdict's own default, 0.8). Early
            acceptance only ever removes chances to reject, so it does not touch the level; a
            higher value trades tokens saved on honest providers for power on subtle deviations.
        require_rules_out: a PASS (early or at the last look) also needs every deviation class that
            the look's detectors can test ruled out (the verdict's ``details["rules_out"]``); a verdict
            object without that record (a callback that computes none) is taken as it is.
        resolve_cause: a rejection whose cause is not established before the last look
            (QUANTIZATION_OR_SUBSTITUTION, or a verdict with ``details["cause_established"] = False``) does not
            stop the audit; it probes on until a look names a deviation with an established cause or the cap
            is reached (see the module docstring). False (the default): every deviation verdict
            stops at once. Both answers to the buyer's precision question are "no", so resolving only
            names the cause, at a cost (docs/calibration.md, seventh run): on the simulator it names the
            near-sibling substitute SUBSTITUTION in 99% of audits (0% without) at 1,989 tokens instead of
            94, but spends 2,992 tokens instead of 93 on int3 and still cannot tell.

    Raises:
        ValueError: empty or non-increasing looks, non-positive tokens, bad alpha/spending.
    """

    looks: tuple[int, ...]
    alpha: float = 0.05
    spending: str = "obrien-fleming"
    accept_power: float | None = None
    require_rules_out: bool = True
    resolve_cause: bool = False

    def __post_init__(self) -> None:
        if not self.looks:
            raise ValueError("looks must hold at least one token count")
        if any(int(n) < 1 for n in self.looks) or any(b <= a for a, b in pairwise(self.looks)):
            raise ValueError(f"looks must be strictly increasing positive token counts, got {self.looks}")
        if self.spending not in SPENDING_FUNCTIONS:
            raise ValueError(f"spending={self.spending!r}; choose one of {SPENDING_FUNCTIONS}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.accept_power is not None and not 0 < self.accept_power < 1:
            raise ValueError(f"accept_power must be in (0, 1), got {self.accept_power}")

    @property
    def max_tokens(self) -> int:
        """The maximum budget N (the last look)."""
        return int(self.looks[-1])

    @classmethod
    def geometric(
        cls, max_tokens: int = 3000, first: int = 100, factor: float = 2.0, *, alpha: float = 0.05,
        spending: str = "obrien-fleming", accept_power: float | None = None, require_rules_out: bool = True,
        resolve_cause: bool = False,
    ) -> SequentialDesign:
        """Looks at ``first, first·factor, first·factor², …`` tokens, capped by (and ending at) ``max_tokens``.

        Raises:
            ValueError: first < 1, factor <= 1, or max_tokens < first.
        """
        if first < 1 or factor <= 1 or max_tokens < first:
            raise ValueError(f"need 1 <= first <= max_tokens and factor > 1 (got {first}, {factor}, {max_tokens})")
        looks = []
        n = float(first)
        while n < max_tokens:
            looks.append(round(n))
            n *= factor
        if looks and max_tokens - looks[-1] < 0.25 * looks[-1]:
            looks[-1] = max_tokens  # avoid a tiny last round
        else:
            looks.append(int(max_tokens))
        return cls(tuple(sorted(set(looks))), alpha, spending, accept_power, require_rules_out, resolve_cause)

    def look_alphas(self) -> list[float]:
        """α_k for the planned looks (they sum to ``alpha``)."""
        out, prev = [], 0.0
        for n in self.looks:
            a = alpha_spent(n / self.max_tokens, self.alpha, self.spending)
            out.append(a - prev)
            prev = a
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"looks": list(self.looks), "alpha": self.alpha, "spending": self.spending,
                "accept_power": self.accept_power, "require_rules_out": self.require_rules_out,
                "resolve_cause": self.resolve_cause, "look_alphas": self.look_alphas()}


@dataclass
class LookDecision:
    """What happened at one look.

    Attributes:
        look: 1-based look index; tokens: cumulative completion tokens at the look.
        alpha_look: α_k spent at this look; alpha_spent: cumulative α after it.
        verdict: the verdict at level α_k; stop: whether the audit stops here.
        action: ``reject`` | ``accept`` | ``continue`` | ``final`` | ``reject-resolve`` (a rejection with an
            undetermined cause; probing goes on) | ``resolve`` (a later look that did not determine it) |
            ``cause`` (a later look that did: the audit stops with its verdict).
    """

    look: int
    tokens: int
    alpha_look: float
    alpha_spent: float
    verdict: str
    stop: bool
    action: str
    details: dict[str, Any] = field(default_factory=dict)


class Decided(Protocol):
    """What a look's callback returns: anything with a ``verdict`` (``auditor.verdict.kinds.Verdict``
    in simulations, ``auditor.report.common.AuditReport`` in ``run_sequential_check``)."""

    @property
    def verdict(self) -> str: ...


class SequentialAudit:
    """State machine of one sequential audit (the pipeline drives the probing).

    Usage (``auditor check --budget-tokens auto``)::

        seq = SequentialAudit(SequentialDesign.geometric(3000))
        while (target := seq.next_look_tokens()) is not None:
            ...probe until at least `target` completion tokens are in...
            d = seq.update(tokens_so_far, lambda a: decide(all_evidence_so_far, alpha=a))
            if d.stop:
                break
        verdict = seq.final_verdict   # a Verdict object as returned by the callback

    ``update`` calls ``verdict_at(alpha_k)`` once — ``verdict_at(alpha_k, power=accept_power)``
    before the last look when the design sets ``accept_power`` — and it must return an object with
    a ``verdict`` attribute (``auditor.verdict.kinds.Verdict``).
    """

    def __init__(self, design: SequentialDesign):
        self.design = design
        self.decisions: list[LookDecision] = []
        self.final: Decided | None = None
        self._spent = 0.0
        self._done = False
        #: deviation classes this audit must rule out before a PASS (fixed at the first look that
        #: records them: the classes whose projected tokens fit the cap; see :func:`_reachable`)
        self._required: frozenset[str] | None = None
        #: the look that rejected with an undetermined cause, and its verdict object (resolve_cause)
        self._rejected: tuple[LookDecision, Decided] | None = None

    @property
    def done(self) -> bool:
        """True once a look stopped the audit (or the last look was taken)."""
        return self._done

    @property
    def final_verdict(self) -> Decided | None:
        """The verdict object of the stopping look (None before)."""
        return self.final

    @property
    def alpha_spent(self) -> float:
        """Cumulative α spent so far."""
        return self._spent

    def next_look_tokens(self) -> int | None:
        """Cumulative tokens at which to look next (None when the audit is finished)."""
        if self._done:
            return None
        k = len(self.decisions)
        return int(self.design.looks[k]) if k < len(self.design.looks) else None

    def update(self, tokens: int, verdict_at: Callable[..., Decided]) -> LookDecision:
        """Take the next look with ``tokens`` cumulative completion tokens.

        Args:
            tokens: completion tokens actually collected so far (>= 1).
            verdict_at: ``alpha -> Verdict`` on all evidence so far at family-wise level alpha
                (called with ``power=`` too, see the class doc).

        Returns:
            The LookDecision (``stop`` tells the caller to stop probing).

        Raises:
            RuntimeError: the audit is already finished.
        """
        if self._done:
            raise RuntimeError("sequential audit already finished; read final_verdict")
        k = len(self.decisions)
        last = k == len(self.design.looks) - 1 or tokens >= self.design.max_tokens
        t = 1.0 if last else min(1.0, tokens / self.design.max_tokens)
        cum = self.design.alpha if last else alpha_spent(t, self.design.alpha, self.design.spending)
        a_k = max(cum - self._spent, 0.0)
        if a_k <= 0.0:
            # nothing to spend (a look before any information): the verdict cannot reject
            a_k = 1e-300
        if not last and self.design.accept_power is not None:
            v = verdict_at(min(a_k, 0.999999), power=self.design.accept_power)
        else:
            v = verdict_at(min(a_k, 0.999999))
        verdict = str(getattr(v, "verdict", v))
        info: dict[str, Any] = {}
        ro = _rules_out_of(v)
        if self._required is None and ro is not None and self.design.require_rules_out:
            self._required = frozenset(_reachable(ro, int(tokens), self.design.max_tokens))
        beyond = [r.key for r in not_ruled_out(ro) if self._required is not None and r.key not in self._required]
        if beyond:
            info["beyond_cap"] = beyond
        short = ([r for r in _short_of(ro, None if last else self.design.accept_power)
                  if self._required is None or r.key in self._required]
                 if verdict == "PASS" and self.design.require_rules_out else [])
        if short:
            info["not_ruled_out"] = [r.key for r in short]
            if last:
                v = _not_ruled_out_verdict(v, short, self.design.max_tokens)
                verdict = str(getattr(v, "verdict", v))
        if self._rejected is not None:  # the null is rejected already: this look only decides the cause
            first, first_v = self._rejected
            info["rejected_at_look"] = first.look
            if verdict in _DEVIATIONS and not _undetermined(v, verdict):
                action, stop = "cause", True
                v = _with_detail(v, "cause_resolved", {"rejected_at_look": first.look, "rejected_at_tokens": first.tokens,
                                                       "rejected_verdict": first.verdict})
            elif last:
                action, stop = "reject", True
                if verdict not in _DEVIATIONS:  # the rejection stands; its own look's evidence says why
                    v = first_v
                    verdict = first.verdict
            else:
                action, stop = "resolve", False
        elif _undetermined(v, verdict) and self.design.resolve_cause and not last:
            action, stop = "reject-resolve", False
        elif verdict in _DEVIATIONS:
            action, stop = "reject", True
        elif verdict == "PASS" and not short:
            action, stop = "accept", True
        else:
            action, stop = ("final", True) if last else ("continue", False)
        self._spent = cum
        d = LookDecision(k + 1, int(tokens), a_k, cum, verdict, stop, action, info)
        self.decisions.append(d)
        if action == "reject-resolve":
            self._rejected = (d, v)
        if stop:
            self._done = True
            self.final = v
        return d

    def summary(self) -> dict[str, Any]:
        """JSON-able record: design, every look, the final verdict and tokens used."""
        return {
            "method": "group-sequential, Lan-DeMets alpha spending, union bound over looks",
            "design": self.design.to_dict(),
            "looks": [d.__dict__ for d in self.decisions],
            "verdict": self.decisions[-1].verdict if self.decisions else None,
            "tokens_used": self.decisions[-1].tokens if self.decisions else 0,
            "alpha_spent": self._spent,
        }


def _short_of(records: list[Any] | None, accept_power: float | None) -> list[RuleOut]:
    """Classes a PASS at this look does not yet rule out: the verdict's "not ruled out" ones and,
    before the last look with an ``accept_power`` above RULE_OUT_POWER, also those ruled out at less
    than that power. An early PASS needs the design's early-acceptance power against every class, as
    it needs it against every family's target (the calibrated effect is a median: at exactly 95% power
    against it, more than 5% of such providers would still pass); the last look uses RULE_OUT_POWER."""
    out = not_ruled_out(records)
    if accept_power is not None and accept_power > RULE_OUT_POWER:
        out += [r for r in as_rule_outs(records or [])
                if r.status == "ruled out" and r.power is not None and r.power < accept_power]
    return out


def _reachable(records: Sequence[RuleOut | dict[str, Any]], tokens: int, max_tokens: int) -> list[str]:
    """Classes an audit of this design can rule out within its cap, judged at the first look.

    A class is required when it is ruled out already, or when the positions its most powerful
    detector still needs, scaled by that detector's positions per completion token so far, fit in
    ``max_tokens``. The others (an effect too small for the cap, e.g. an fp8 KV cache on a
    3,000-token cap) are not waited for: the PASS says it does not rule them out, with their power.
    Fixing the set at the first look keeps the stopping rule from chasing classes that no look of
    the design could rule out (the acceptance check only ever removes chances to reject).
    """
    out = []
    for r in as_rule_outs(records):
        if r.status == "ruled out":
            out.append(r.key)
        elif r.status == "not ruled out" and r.required_positions is not None and r.n and tokens > 0:
            per_token = r.n / tokens
            if per_token > 0 and r.required_positions / per_token <= max_tokens:
                out.append(r.key)
    return out


def _rules_out_of(v: object) -> list[Any] | None:
    """The rules-out record of a look's verdict (``Verdict.details`` or ``AuditReport.verdict_details``)."""
    ro = _details_of(v).get("rules_out")
    return ro if isinstance(ro, list) else None


def _not_ruled_out_verdict(v: Any, short: Sequence[RuleOut], max_tokens: int) -> Any:
    """A last-look PASS that leaves ``short`` not ruled out, as INCONCLUSIVE with the tokens still needed
    (``Verdict`` or ``AuditReport``: the same fields under their names; anything else is returned as is)."""
    import dataclasses

    report = hasattr(v, "verdict_details")
    fields = ("verdict_reason", "verdict_details") if report else ("reason", "details")
    if not dataclasses.is_dataclass(v) or isinstance(v, type) or not all(hasattr(v, f) for f in fields):
        return v
    reason, details = getattr(v, fields[0]), dict(getattr(v, fields[1]))
    budget = tokens_to_rule_out(short)
    what = ", ".join(f"{r.label} (power {r.power:.0%})" if r.power is not None else r.label for r in short)
    text = (f"no detector rejects, but the sequential audit reached its cap of {max_tokens} tokens before it ruled "
            f"out {what} at {RULE_OUT_POWER:.0%} power"
            + (f"; about {budget} more tokens would suffice" if budget else
               "; no budget the power model reaches would rule it out"))
    details.update(rule="seq-not-ruled-out", suggested_budget_tokens=budget,
                   previous_verdict={"verdict": "PASS", "reason": reason})
    return dataclasses.replace(v, verdict="INCONCLUSIVE", **{fields[0]: text, fields[1]: details})


def _with_detail(v: Any, key: str, value: object) -> Any:
    """``v`` (``Verdict`` or ``AuditReport``) with ``details[key] = value``; anything else as it is."""
    import dataclasses

    name = "verdict_details" if hasattr(v, "verdict_details") else "details"
    if not dataclasses.is_dataclass(v) or isinstance(v, type) or not isinstance(getattr(v, name, None), dict):
        return v
    return dataclasses.replace(v, **{name: {**getattr(v, name), key: value}})


def run_sequential(
    design: SequentialDesign,
    verdict_after: Callable[..., Decided],
) -> SequentialAudit:
    """Drive a whole sequential audit with a callback (simulations, tests).

    Args:
        design: the looks and spending.
        verdict_after: ``(tokens, alpha_k) -> Verdict``: the verdict on the first ``tokens``
            cumulative completion tokens of the audit at family-wise level ``alpha_k`` (called
            with ``power=`` as well when the design sets ``accept_power``).

    Returns:
        The finished SequentialAudit (``final_verdict``, ``decisions``, ``summary()``).
    """
    seq = SequentialAudit(design)
    while (target := seq.next_look_tokens()) is not None:
        d = seq.update(
            target,
            lambda a, power=None, _t=target: verdict_after(_t, a) if power is None else verdict_after(_t, a, power=power),
        )
        if d.stop:
            break
    return seq


def tokens_saved(used: Sequence[int], max_tokens: int) -> float:
    """Mean fraction of the maximum budget not spent: 1 − mean(used) / max_tokens."""
    if not used:
        return math.nan
    return 1.0 - (sum(used) / len(used)) / max_tokens


#: ``--budget-tokens auto``: the maximum budget (tokens) and the first look, unless given.
AUTO_MAX_TOKENS = 3000
AUTO_FIRST_LOOK = 100
#: Spending and early-acceptance power of ``--budget-tokens auto``, chosen on the simulator
#: (docs/calibration.md): Pocock-type spending stops blatant deviations within a few hundred tokens,
#: and requiring 99% (not the verdict's 80%) power for an early PASS keeps subtle ones (int8,
#: relaxed acceptance) from being waved through at the first adequately powered look.
AUTO_SPENDING = "pocock"
AUTO_ACCEPT_POWER = 0.99


def _union_suite(suite: Suite, prev: Suite | None) -> Suite:
    """``suite`` with every request of ``prev`` kept (samples per probe = the larger): the requests
    already sent stay planned, so a resumed run never loses a stored probe."""
    if prev is None:
        return suite
    n_prev = {p.id: p.n_samples for p in prev.probes}
    n_new = {p.id: p.n_samples for p in suite.probes}
    full = {p.id: p for p in list(prev.probes) + list(suite.probes)}
    order = [p.id for p in prev.probes] + [p.id for p in suite.probes if p.id not in n_prev]
    kept = [full[i].model_copy(update={"n_samples": max(n_prev.get(i, 0), n_new.get(i, 0))}) for i in order]
    return suite.model_copy(update={"probes": kept})


def run_sequential_check(
    provider_name: str,
    *,
    design: SequentialDesign | None = None,
    suite: str | None = None,
    alpha: float = 0.05,
    resolve_cause: bool = False,
    on_look: Callable[[LookDecision], None] | None = None,
    **check_kwargs: Any,
) -> tuple[AuditReport, SequentialAudit]:
    """``auditor check --budget-tokens auto``: probe in rounds and stop once the evidence is decisive.

    Each look k plans the suite cut to the look's token count (``auditor.check.planning.plan_budget``, kept
    a superset of what was already sent), sends only the new requests (the same run, resumed), and
    re-analyses all evidence with ``auditor.check.pipeline.run_check`` at the look's spent level α_k; the
    :class:`SequentialAudit` decides whether to stop. Each look's planned ``Suite`` object goes to the
    pipeline as it is (``CheckOptions.suite``), and its analysis is computed but not written
    (``CheckOptions.on_analysis``): once the audit stops, the deciding look's analysis with the decided
    verdict, the sequential design and every look (summary ``sequential``), the overall α and the
    tokens used are written in one transaction, so the run's verdict is written once. The decided
    report is returned.

    Args:
        provider_name: the provider to audit.
        design: looks and spending; default :meth:`SequentialDesign.geometric` from
            ``AUTO_FIRST_LOOK`` to min(``AUTO_MAX_TOKENS``, the suite's planned tokens), with
            ``AUTO_SPENDING`` and ``AUTO_ACCEPT_POWER``.
        suite: suite name or JSON path (default ``default``).
        alpha: family-wise level of the whole sequential audit.
        resolve_cause: the default design's ``resolve_cause`` (ignored when ``design`` is given).
        on_look: called with each LookDecision (progress output).
        check_kwargs: passed to ``run_check`` (db_url, config_path, progress, console, seed,
            provider_config, reference_dtypes, floors_cache_dir, reference_models).

    Returns:
        (AuditReport of the stopping look, the SequentialAudit).

    Raises:
        AuditError: as ``run_check`` (config, suite, database, connection, budget).
    """
    from auditor.check.errors import AuditError
    from auditor.check.pipeline import run_check
    from auditor.check.planning import allowed_tests, load_suite_spec, plan_budget, provider_config

    full = load_suite_spec(suite)
    # the looks plan only what the provider allows (no greedy request when it fixes the temperature); a config
    # problem is run_check's to report, at the first look
    with contextlib.suppress(AuditError):
        full = allowed_tests(full, provider_config(provider_name, check_kwargs.get("config_path"),
                                                   check_kwargs.get("provider_config")))
    if design is None:
        top = min(AUTO_MAX_TOKENS, full.max_completion_tokens())
        first = min(AUTO_FIRST_LOOK, top)
        design = (
            SequentialDesign.geometric(top, first=first, alpha=alpha, spending=AUTO_SPENDING,
                                       accept_power=AUTO_ACCEPT_POWER, resolve_cause=resolve_cause)
            if top > first
            else SequentialDesign((top,), alpha=alpha, spending=AUTO_SPENDING, resolve_cause=resolve_cause)
        )
    seq = SequentialAudit(design)
    run_id: str | None = None
    sent: Suite | None = None
    #: each look's report and the analysis it did not write (``CheckOptions.on_analysis``)
    looks: list[tuple[AuditReport, AnalysisRecord | None]] = []
    while (target := seq.next_look_tokens()) is not None:
        plan = _union_suite(plan_budget(full, target), sent)  # the suite object itself goes to the pipeline
        box: dict[str, Any] = {}

        def verdict_at(a: float, power: float | None = None, _plan: Suite = plan, _rid: str | None = run_id,
                       _box: dict[str, Any] = box) -> AuditReport:
            rep = run_check(provider_name, suite=_plan, budget_tokens=None, alpha=a, resume=_rid, power=power,
                            on_analysis=lambda rec: _box.__setitem__("record", rec), **check_kwargs)
            _box["report"] = rep
            return rep

        d = seq.update(plan.max_completion_tokens(), verdict_at)
        looks.append((box["report"], box.get("record")))
        run_id = box["report"].run_id
        sent = plan
        if on_look is not None:
            on_look(d)
        if d.stop:
            break
    if not looks:  # SequentialDesign has at least one look, so a report exists
        raise ValueError(f"sequential design {design.looks} took no look")
    report, record, decided = _decided(seq, looks)
    _record(report, seq, record, check_kwargs.get("db_url"), decided=decided)
    return report, seq


def _decided(seq: SequentialAudit, looks: Sequence[tuple[AuditReport, AnalysisRecord | None]],
             ) -> tuple[AuditReport, AnalysisRecord | None, bool]:
    """The sequential decision's report, the analysis of the look it rests on, and whether its verdict
    differs from that look's own. The look that rejected (``resolve_cause``) is its own look; a last-look
    PASS made INCONCLUSIVE or a look that resolved the cause is the last look's report, changed
    (``dataclasses.replace``)."""
    final = seq.final_verdict
    for rep, rec in looks:
        if final is rep:
            return rep, rec, False
    last_rep, last_rec = looks[-1]
    return cast("AuditReport", final) if final is not None else last_rep, last_rec, final is not None


def _record(report: AuditReport, seq: SequentialAudit, record: AnalysisRecord | None, db_url: str | None, *,
            decided: bool = False) -> None:
    """Write the sequential audit's outcome, once, in one transaction: the deciding look's analysis
    (``record``: detector results, aligned ids, summary, status) with ``report``'s verdict when ``decided``
    (the sequential decision differs from that look's own), the sequential summary, the overall α and the
    tokens used."""
    from auditor.check.stored_figures import store_figures
    from auditor.store import open_store
    from auditor.store import queries as q

    store = open_store(db_url)
    try:
        with store.session() as s:
            if record is not None:
                record.write(s, decided=(report.verdict, report.verdict_reason, report.verdict_details)
                             if decided else None)
            run = q.get_run(s, report.run_id)
            if run is None:
                return
            summary = dict(run.summary or {})
            summary["sequential"] = seq.summary()
            q.update_run(s, report.run_id, summary=summary, alpha=seq.design.alpha,
                         budget_tokens=seq.decisions[-1].tokens if seq.decisions else None)
            store_figures(s, report.run_id)  # the verdict or alpha may have changed: the dashboard's figures too
    finally:
        store.close()
    if isinstance(getattr(report, "summary", None), dict):
        report.summary["sequential"] = seq.summary()
