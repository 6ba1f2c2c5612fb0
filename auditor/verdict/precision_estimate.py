"""Measured precision, not only "not original" (issue 36, item 4).

Every QUANTIZATION verdict (and QUANTIZATION_OR_SUBSTITUTION) and every PASS says which precision
classes the evidence is consistent with and which it rules out, e.g. "consistent with 4-bit weights;
rules out 8-bit weights, activations or KV cache, the card's native precision".

**Evidence.** The main effect is the logprob-divergence detector's geometric-mean KL / honest floor
ratio ``R = exp(ȳ − μ0)`` (``details["geometric_ratio"]``, ``auditor/detectors/logprob.py``), with its
standard error on the log scale ``s = log R / z`` (z = the detector's statistic: ``z = (ȳ − μ0) / s``).
Each precision class *c* (:func:`card_classes`) has a centre ``m_c = log R_c``, ``R_c`` the median ratio
its simulator profile produced in the calibration (docs/calibration.md); the card's native precision
(honest serving) has ``m = 0`` (the noise floor *is* honest serving's variation: R ≈ 1).

**Classes relative to the card.** A class is a *step below the model card in use*: each class of the
effect-size table (``auditor/calibration/effect_sizes.json``, :func:`auditor.verdict.rules_out.load_effect_sizes`)
says what it lowers (``lowers``: ``int4`` → weights to 4 bits, ``kv-fp8`` → the KV cache to 8 bits,
``w8a8`` → weights and activations to 8) and is a class under a card when it lowers some component below
the card's bits and none above (``probes.model_card.ModelCard.component_bits``; floats count as 16): an
FP8 card (weights and activations 8, KV cache float) has 4- and 3-bit weights and an 8-bit KV cache below
it, never "8-bit weights"; an INT4 card has 3-bit weights and an 8-bit KV cache. The effects are
relative to the card too: under a card the reference computes the card and the floor is the card's
(more lenient than the float32 floor: ``auditor.check.reference_setup.apply_card``), so the same step
has another ratio (measured on the tiny model's FP8 card: int4 weights 5.1x its floor, while 8-bit KV
steps reach 8x the float32 floor). The table's ``cards`` section holds the effects the calibration code
measured under a card (:class:`auditor.verdict.rules_out.CardEffects`,
:func:`auditor.calibration.effects.card_effects_from_records`); a non-float card without one is compared
with the float32 effects and the estimate says so (``card_calibrated`` False). Each estimate names the
card its classes are relative to (``relative_to``).

**Rule.** With ``w = z_{1-α/2} · sqrt(s² + τ²)``, class *c* is

- *consistent* when ``|log R − m_c| <= w`` (native: one-sided, ``log R <= w``: serving closer to the
  reference than the floor is honest);
- *ruled out* otherwise, as too small (``log R < m_c − w``) or too large (``log R > m_c + w``).

``τ`` (:data:`TAU`) is the spread of one class's effect between audit settings that no sample size
removes: measured in the committed calibration as the largest half-range of ``log`` of a precision
profile's per-cell median ratio over its cells (budgets 100–3000 tokens, suites ``default`` and
``precision``): 0.2404 (int4; int8 0.08, fp8 0.10, kv-fp8 0.07, w8a8 0.04), rounded up to 0.25
(``tests/audit/test_precision_estimate.py`` recomputes it from ``docs/calibration.json``).

**The estimate** (``best``) is the precision class — the classes below the card of the same bit width,
named by bits and what they lower (:func:`card_classes`: "4-bit weights", "8-bit KV cache") — of the nearest quantization class or native precision in
``log R``; the substitution classes (another model) are listed as consistent or ruled out but never
named as the estimate of a QUANTIZATION or PASS (the verdict decides substitution). Like
``auditor.verdict.rules_out``, the classes are the simulator's profiles on SmolLM2-135M: "consistent with
4-bit weights" means "the effect is that of the simulator's int4 and unlike its 8-bit profiles".

**A claim** (``claimed_precision`` in the provider's config, OpenRouter's labels) maps to classes
(:func:`claim_classes`: a claim at or above the card's bit width is the native class, 16- and 32-bit
floats counting as one width, since honest bf16 / fp16 serving is what the noise floor measures; a
claim below it names the card's classes of its bit width) and is checked:
*matches* (every consistent quantization class is a claimed one), *does not match* (every claimed
class is ruled out), *cannot tell* (both claimed and other classes are consistent), with the power to
tell the claimed class nearest the observation from the nearest other class at this audit's ``s``
(substitution classes are left to the verdict and do not enter the claim check).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from scipy import stats

from auditor.detectors import DetectorName
from auditor.detectors.logprob import LOGPROB_POSITIONS, kl_floor_ratio
from auditor.util import finite, kl_floor_text
from auditor.verdict.kinds import VerdictKind
from auditor.verdict.rules_out import FLOAT_BITS, RULE_OUT_POWER, EffectSizes, classes_for_card, load_effect_sizes

__all__ = [
    "BITS",
    "ESTIMATED_VERDICTS",
    "NATIVE",
    "SUBSTITUTE",
    "TAU",
    "ClaimCheck",
    "ClassFit",
    "ClassSet",
    "PrecisionEstimate",
    "card_classes",
    "claim_classes",
    "estimate_from_ratio",
    "estimate_precision",
    "estimate_rows",
    "profile_precision",
]

#: Verdicts whose report carries the estimate.
ESTIMATED_VERDICTS = (str(VerdictKind.PASS), str(VerdictKind.QUANTIZATION), str(VerdictKind.QUANTIZATION_OR_SUBSTITUTION))
#: Between-setting spread of a class's log effect (module docstring; measured, docs/calibration.json).
TAU = 0.25
#: The native-precision pseudo-class key.
NATIVE = "native"
#: The precision class of the substitution classes (precision classes that lower nothing: another model).
SUBSTITUTE = "another model"
_COMPONENT_WORDS = {"weights": "weights", "activations": "activations", "kv_cache": "KV cache"}
_NATIVE_LABEL = "the card's native precision"
#: Bits per weight of a claimed label (OpenRouter's quantization vocabulary, ``probes.config.CLAIMED_PRECISIONS``).
BITS: Mapping[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "fp6": 6, "fp4": 4, "int4": 4}
_DET = str(DetectorName.LOGPROB_DIVERGENCE)

Status = Literal["consistent", "ruled out", "not ruled out"]
Outcome = Literal["matches", "does not match", "cannot tell"]


@dataclass(frozen=True)
class ClassFit:
    """One class against the observed effect.

    Attributes:
        key: calibration class key (``int4``) or :data:`NATIVE`; label: its report name.
        precision: its precision class (:func:`card_classes`: ``4-bit weights``, :data:`SUBSTITUTE`).
        ratio: its calibrated geometric-mean KL / floor ratio (native: 1).
        status: ``consistent`` | ``ruled out`` | ``not ruled out`` (the audit's power record says it lacks the
            power to rule the class out although the effect is far from it: :func:`estimate_from_ratio`,
            ``rules_out``); direction: ``too small`` / ``too large`` when ruled out, the power when not ruled out.
        distance: ``(log R − m_c) / sqrt(s² + τ²)`` (standardized; signed).
    """

    key: str
    label: str
    precision: str
    ratio: float
    status: Status
    direction: str | None
    distance: float


@dataclass(frozen=True)
class ClaimCheck:
    """The provider's claimed precision against the estimate.

    Attributes:
        claimed: the label (``int4``); classes: the class keys it names.
        outcome: ``matches`` | ``does not match`` | ``cannot tell``.
        power: probability that an audit of this size tells the claimed class nearest the observation
            from the nearest other class (None when the claim names no calibrated class).
        against: that other class's key.
    """

    claimed: str
    classes: tuple[str, ...]
    outcome: Outcome
    power: float | None
    against: str | None

    def sentence(self) -> str:
        """"the claimed int4 matches (power 99% against 8-bit ...)"."""
        pw = f" (power {self.power:.0%} to tell it from {self.against})" if self.power is not None else ""
        if not self.classes:
            return f"the claimed {self.claimed} names no calibrated precision class: cannot tell"
        return f"the claimed {self.claimed} {self.outcome}{pw}"


@dataclass(frozen=True)
class PrecisionEstimate:
    """What the audit's effect says about the served precision.

    Attributes:
        ratio: observed geometric-mean KL / floor ratio R; log_se: its standard error on the log scale.
        n: logprob positions behind it; width: the half-width w of the consistency interval (log scale).
        best: the estimated precision class; best_class: the nearest class's key.
        classes: every class's fit (native first, then the table's order).
        claim: the claim check, or None without a claim.
        card: the card's description, as the report states it.
        relative_to: the card the classes are steps below and where their effects were measured
            (:attr:`ClassSet.relative_to`); card_calibrated: :attr:`ClassSet.calibrated`.
    """

    ratio: float
    log_se: float
    n: int
    width: float
    best: str
    best_class: str
    classes: tuple[ClassFit, ...]
    claim: ClaimCheck | None = None
    card: str | None = field(default=None)
    relative_to: str = ""
    card_calibrated: bool = True

    def consistent(self) -> list[ClassFit]:
        """The consistent classes."""
        return [c for c in self.classes if c.status == "consistent"]

    def sentence(self) -> str:
        """"consistent with 4-bit weights (int4 weights; another model: near-sibling model); rules out 8-bit
        weights, activations or KV cache, the card's native precision; measured 269x the honest floor
        (95% interval 180x-400x, 480 positions)"."""
        by: dict[str, list[ClassFit]] = {}
        for c in self.classes:
            by.setdefault(c.precision, []).append(c)
        yes = [g for g, cs in by.items() if any(c.status == "consistent" for c in cs)]
        no = [g for g, cs in by.items() if all(c.status == "ruled out" for c in cs)]
        maybe = [g for g, cs in by.items() if g not in yes and g not in no]
        if self.best in yes:
            parts = ["consistent with " + ", ".join([self.best] + [g for g in yes if g != self.best])]
        else:
            near = next(c for c in self.classes if c.key == self.best_class)
            parts = [f"nearest {self.best} ({near.direction} for it)"
                     + (", consistent with " + ", ".join(yes) if yes else ", consistent with no calibrated class")]
        if no:
            parts.append("rules out " + ", ".join(no))
        for g in maybe:
            weak = [f"{c.label}: {c.direction}" for c in by[g] if c.status == "not ruled out" and c.direction]
            parts.append(f"does not rule out {g}" + (f" ({', '.join(weak)})" if weak else ""))
        lo, hi = math.exp(math.log(self.ratio) - self.width), math.exp(math.log(self.ratio) + self.width)
        parts.append(f"measured {_x(self.ratio)} the honest floor (interval {_x(lo)}-{_x(hi)}, {self.n} "
                     f"{LOGPROB_POSITIONS})")
        if self.claim is not None:
            parts.append(self.claim.sentence())
        if self.relative_to:
            parts.append(f"classes relative to {self.relative_to}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the report's ``precision_estimate``), with ``sentence``."""
        return {**asdict(self), "sentence": self.sentence()}


def _x(r: float) -> str:
    return kl_floor_text(r) + "x"


@dataclass(frozen=True)
class ClassSet:
    """The classes an estimate compares the effect with: the steps below the card in use.

    Attributes:
        classes: (key, label, precision class, calibrated ratio, bits) per class, :data:`NATIVE` first (ratio 1,
            bits None); bits = the fewest bits the class leaves a component with (None for substitution).
        relative_to: the card they are steps below and where their effects come from (for the report).
        calibrated: the effects were measured under this card (a float card: the float32 table is).
        measured_under_card: the effects come from the table's ``cards`` section (not the float32 classes).
    """

    classes: tuple[tuple[str, str, str, float, int | None], ...]
    relative_to: str
    calibrated: bool
    measured_under_card: bool


def card_classes(table: EffectSizes, card_bits: Mapping[str, int] | None = None, *, model: str | None = None,
                 recipe: str | None = None, card: str | None = None) -> ClassSet:
    """The precision classes below a card, with their effects relative to it (module docstring).

    Args:
        table: the effect-size table.
        card_bits: the card's bits per component (``probes.model_card.ModelCard.component_bits``); None = no
            card (the float32 reference: every class is below it).
        model: the reference model; recipe: the card's recipe (``ModelCard.recipe``): together they select the
            effects measured under the card (:meth:`auditor.verdict.rules_out.EffectSizes.for_card`).
        card: the card's description for :attr:`ClassSet.relative_to` (default: the recipe).

    The precision class of a class is named by its fewest bits and what the card's classes of that width
    lower: "4-bit weights", "8-bit KV cache", under a float card "8-bit weights, activations or KV cache".
    """
    bits = dict.fromkeys(_COMPONENT_WORDS, FLOAT_BITS) if card_bits is None else dict(card_bits)
    is_float = all(min(int(b), FLOAT_BITS) >= FLOAT_BITS for b in bits.values())
    below = classes_for_card(table, card_bits, model=model, recipe=recipe)  # the rule: auditor.verdict.rules_out
    measured = below.measured
    picked: list[tuple[str, str, float, int | None, tuple[str, ...]]] = []
    for c in below.classes:
        r = c.effects.get(_DET)
        if measured is not None and c.key not in below.under_card:
            continue  # effects measured under the card only: the float32 ones are on another floor's scale
        if c.question != "precision" or r is None or r <= 0:
            continue
        picked.append((c.key, c.label, float(r), min(c.lowers.values()) if c.lowers else None, tuple(c.lowers)))
    words: dict[int, set[str]] = {}
    for _, _, _, b, comps in picked:
        if b is not None:
            words.setdefault(b, set()).update(comps)
    out: list[tuple[str, str, str, float, int | None]] = [(NATIVE, _NATIVE_LABEL, _NATIVE_LABEL, 1.0, None)]
    for key, label, r, b, _ in picked:
        group = SUBSTITUTE if b is None else f"{b}-bit " + _or([_COMPONENT_WORDS[c] for c in _COMPONENT_WORDS
                                                                 if c in words[b]])
        out.append((key, label, group, r, b))
    name = card or recipe
    if card_bits is None or name is None:
        where = "the float32 reference (no card)"
    else:
        where = f"the card ({name}), as steps below it"
    if measured is not None:
        how = f"effects measured under this card on {measured.model}"
    elif is_float:
        how = f"effects calibrated on {table.model} against float32"
    else:
        how = (f"effects calibrated on {table.model} against float32, not under this card: under its more lenient "
               "floor a step's ratio is smaller, so the estimate may name a smaller step")
    return ClassSet(tuple(out), f"{where}; {how}", measured is not None or is_float, measured is not None)


def profile_precision(profile: str, table: EffectSizes | None = None, card_bits: Mapping[str, int] | None = None, *,
                      model: str | None = None, recipe: str | None = None) -> tuple[str, str] | None:
    """The precision class a simulator profile serves below a card: what an estimate of its audits should name.

    The profile's class is the table's (``effect_sizes.json``, :attr:`auditor.verdict.rules_out.DeviationClass.profile`:
    the profile whose audits measured it; under a card with measured effects, the card entry's, e.g.
    ``native-fp8-int4`` for ``int4`` under the FP8 card), among the classes below the card
    (:func:`auditor.verdict.rules_out.classes_for_card`); its precision class is the one :func:`card_classes` names
    it by ("4-bit weights or activations"), the string an estimate's ``best`` is compared with.

    Args:
        profile: simulator profile name (``native-fp8-int4``, ``kv-fp8``).
        table: the effect-size table (default :func:`auditor.verdict.rules_out.load_effect_sizes`).
        card_bits, model, recipe: the card in use, as :func:`card_classes` (None: the float32 reference).

    Returns:
        (class key, precision class), or None when no precision class below the card is the profile's (an honest
        profile, a verification or decoding profile, a step not below the card, or one whose effects the table has
        not measured under this card).
    """
    table = table if table is not None else load_effect_sizes()
    keys = {c.key for c in classes_for_card(table, card_bits, model=model, recipe=recipe).classes
            if c.profile == profile and c.lowers}
    cs = card_classes(table, card_bits, model=model, recipe=recipe)
    return next(((key, group) for key, _, group, _, _ in cs.classes if key in keys), None)


def _or(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def claim_classes(claimed: str, card_precision: str | None, table: EffectSizes | None = None, *,
                  classes: ClassSet | None = None) -> tuple[str, ...]:
    """The class keys a claimed label names: :data:`NATIVE` when its bits are at or above the card's
    (default card: 16-bit floats and up), else the card's classes (``classes``, default
    :func:`card_classes` of ``table`` with no card) of its bit width (none for a width no class was
    calibrated at, e.g. ``fp6``).

    Raises:
        ValueError: an unknown label (the message lists :data:`BITS`).
    """
    if claimed not in BITS:
        raise ValueError(f"claimed_precision {claimed!r} is not one of {sorted(BITS)}")
    # 16- and 32-bit floats are one class: honest bf16 / fp16 serving is what the noise floor measures
    card_bits = min(BITS.get(card_precision or "", FLOAT_BITS), FLOAT_BITS)
    if BITS[claimed] >= card_bits:
        return (NATIVE,)
    cs = classes if classes is not None else card_classes(table if table is not None else load_effect_sizes())
    return tuple(k for k, _, _, _, b in cs.classes if b == BITS[claimed])


def estimate_from_ratio(
    ratio: float,
    log_se: float,
    n: int,
    *,
    alpha: float = 0.05,
    claimed: str | None = None,
    card_precision: str | None = None,
    card: str | None = None,
    effect_sizes: EffectSizes | None = None,
    tau: float = TAU,
    rules_out: Sequence[Mapping[str, Any]] | None = None,
    card_bits: Mapping[str, int] | None = None,
    card_recipe: str | None = None,
    model: str | None = None,
) -> PrecisionEstimate:
    """The estimate from an observed ratio R > 0 and the standard error of log R (module docstring).

    Args:
        ratio: geometric-mean KL / floor ratio; log_se: its standard error on the log scale (>= 0).
        n: positions behind it; alpha: 1 − the consistency interval's level.
        claimed: the provider's claimed label (:data:`BITS`), or None.
        card_precision: the card's precision label (``ModelCard.precision_label``), None = a float card.
        card: the card's description, kept for the report.
        effect_sizes: the table (default :func:`auditor.verdict.rules_out.load_effect_sizes`).
        tau: between-setting spread (:data:`TAU`).
        rules_out: the audit's power record (``details["rules_out"]``, :mod:`auditor.verdict.rules_out`; PASS and
            INCONCLUSIVE audits), the one source of "ruled out" whenever it covers a class (issue 38: a
            report must never call a class both ruled out and not): a class it rules out is ``ruled
            out``; a class it does not rule out, which the effect alone would, is ``not ruled out`` with
            the power in ``direction``; a class the effect is consistent with stays ``consistent``. A record
            counts only where its power was computed against the same effects as the estimate's class: under
            the card (``under_card``, :func:`auditor.verdict.rules_out.classes_for_card`) when the estimate's
            are (:attr:`ClassSet.measured_under_card`), against the float32 effects otherwise.
        card_bits, card_recipe, model: the card in use and the reference model (:func:`card_classes`): the
            classes are the steps below the card, with the effects measured under it where the table has them.

    Raises:
        ValueError: a non-positive or non-finite ratio, a negative or non-finite log_se, an unknown claim.
    """
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio must be a finite positive number, got {ratio!r}")
    if not (math.isfinite(log_se) and log_se >= 0):
        raise ValueError(f"log_se must be finite and >= 0, got {log_se!r}")
    table = effect_sizes if effect_sizes is not None else load_effect_sizes()
    cs = card_classes(table, card_bits, model=model, recipe=card_recipe, card=card_recipe or card)
    power_records = {  # a record counts only when its effect was on the same scale (under the card or not)
        str(r.get("key")): r for r in (rules_out or [])
        if isinstance(r, Mapping) and r.get("status") in ("ruled out", "not ruled out")
        and bool(r.get("under_card")) == cs.measured_under_card}
    y = math.log(ratio)
    sd = math.sqrt(log_se * log_se + tau * tau)
    zc = float(stats.norm.ppf(1 - alpha / 2))
    w = zc * sd
    fits = []
    for key, label, group, r, _ in cs.classes:
        m = math.log(r)
        d = (y - m) / sd if sd > 0 else math.copysign(math.inf, y - m)
        if key == NATIVE:
            ok, direction = d <= zc, "too large"
        else:
            ok, direction = abs(d) <= zc, ("too large" if d > 0 else "too small")
        fit = ClassFit(key, label, group, r, "consistent" if ok else "ruled out", None if ok else direction, d)
        fits.append(_with_power_record(fit, power_records.get(key)))
    quant = [f for f in fits if f.precision != SUBSTITUTE]
    nearest = min(quant, key=lambda f: abs(f.distance) if f.key != NATIVE else max(f.distance, 0.0))
    check = None
    if claimed is not None:
        keys = claim_classes(claimed, card_precision, classes=cs)
        check = _check_claim(claimed, keys, fits, y, log_se, w)
    return PrecisionEstimate(ratio, log_se, int(n), w, nearest.precision, nearest.key, tuple(fits), check, card,
                             cs.relative_to, cs.calibrated)


def _with_power_record(fit: ClassFit, rec: Mapping[str, Any] | None) -> ClassFit:
    """``fit`` with its status taken from the audit's power record ``rec`` when there is one (see
    :func:`estimate_from_ratio`, ``rules_out``)."""
    if rec is None:
        return fit
    if rec.get("status") == "ruled out":
        return fit if fit.status == "ruled out" else replace(fit, status="ruled out", direction=f"at {RULE_OUT_POWER:.0%} power")
    if fit.status == "consistent":
        return fit
    p = finite(rec.get("power"))
    return replace(fit, status="not ruled out", direction=f"power {p:.0%}" if p is not None else "too little power")


def _check_claim(claimed: str, keys: tuple[str, ...], fits: Sequence[ClassFit], y: float, s: float,
                 w: float) -> ClaimCheck:
    mine = [f for f in fits if f.key in keys]
    others = [f for f in fits if f.key not in keys and f.precision != SUBSTITUTE]  # substitution: the verdict's
    if not mine:
        return ClaimCheck(claimed, (), "cannot tell", None, None)
    ok_mine = any(f.status != "ruled out" for f in mine)
    ok_other = any(f.status != "ruled out" for f in others)
    outcome: Outcome = "does not match" if not ok_mine else ("cannot tell" if ok_other else "matches")
    a = min(mine, key=lambda f: abs(y - math.log(f.ratio)))
    b = min(others, key=lambda f: abs(math.log(a.ratio) - math.log(f.ratio))) if others else None
    power = None if b is None else _separation_power(math.log(a.ratio), math.log(b.ratio), s, w,
                                                     native_b=b.key == NATIVE)
    return ClaimCheck(claimed, tuple(keys), outcome, power, b.label if b is not None else None)


def _separation_power(m_true: float, m_other: float, s: float, w: float, *, native_b: bool) -> float:
    """P(an audit of a provider exactly at m_true rules out the class at m_other), Y ~ N(m_true, s²)."""
    if s <= 0:
        return 1.0 if abs(m_true - m_other) > w else 0.0
    if native_b:  # native is ruled out only from above
        return float(stats.norm.sf((m_other + w - m_true) / s))
    return float(stats.norm.sf((m_other + w - m_true) / s) + stats.norm.cdf((m_other - w - m_true) / s))


def estimate_precision(
    verdict: str,
    detectors: Sequence[Mapping[str, Any]],
    *,
    alpha: float = 0.05,
    claimed: str | None = None,
    card_precision: str | None = None,
    card: str | None = None,
    effect_sizes: EffectSizes | None = None,
    rules_out: Sequence[Mapping[str, Any]] | None = None,
    card_bits: Mapping[str, int] | None = None,
    card_recipe: str | None = None,
    model: str | None = None,
) -> PrecisionEstimate | None:
    """The estimate of a report (its stored detector dicts), or None when it does not apply: a verdict
    outside :data:`ESTIMATED_VERDICTS`, logprob-divergence did not run, or its ratio / statistic is
    missing or not finite (a malformed stored report never raises; an unknown claim is ignored).

    Args:
        verdict: the verdict kind; detectors: the report's detector dicts (``name``, ``ran``,
            ``statistic``, ``n``, ``details.geometric_ratio``).
        alpha, claimed, card_precision, card, effect_sizes, rules_out, card_bits, card_recipe, model: as
            :func:`estimate_from_ratio` (a malformed ``card_bits`` counts as no card).
    """
    if verdict not in ESTIMATED_VERDICTS:
        return None
    d = next((x for x in detectors if isinstance(x, Mapping) and x.get("name") == _DET and x.get("ran")), None)
    if d is None:
        return None
    raw = d.get("details")
    det: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    r, z = kl_floor_ratio(det), finite(d.get("statistic"))
    if r is None or r <= 0 or z is None or z == 0 or math.log(r) == 0:
        return None
    se = math.log(r) / z
    if not (se > 0 and math.isfinite(se)):
        return None
    if claimed not in BITS:
        claimed = None
    try:
        n = int(d.get("n") or 0)
    except (TypeError, ValueError):
        n = 0
    bits = ({str(k): int(v) for k, v in card_bits.items() if isinstance(v, int) and not isinstance(v, bool)}
            if isinstance(card_bits, Mapping) else None)
    return estimate_from_ratio(r, se, n, alpha=alpha, claimed=claimed, card_precision=card_precision, card=card,
                               effect_sizes=effect_sizes, rules_out=rules_out, card_bits=bits or None,
                               card_recipe=card_recipe if isinstance(card_recipe, str) else None,
                               model=model if isinstance(model, str) else None)


def estimate_rows(est: Mapping[str, Any] | None) -> list[list[str]]:
    """Table rows for reports from a stored ``precision_estimate`` dict: [class, precision class,
    calibrated ratio, outcome, standardized distance] per class ([] for None)."""
    rows = []
    for c in (est or {}).get("classes") or []:
        if not isinstance(c, Mapping):
            continue
        out = str(c.get("status")) + (f" ({c.get('direction')})" if c.get("direction") else "")
        r, dist = finite(c.get("ratio")), finite(c.get("distance"))
        rows.append([str(c.get("label")), str(c.get("precision")), _x(r) if r is not None else "—", out,
                     f"{dist:+.2f}" if dist is not None else "—"])
    return rows
