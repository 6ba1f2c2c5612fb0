"""What a PASS rules out: per deviation class, the audit's power against that class's measured effect.

A PASS says no detector rejected; this module says what that excludes (issue 14, item 2). For
each deviation class of the calibration's effect-size table (``auditor/calibration/effect_sizes.json``,
written by ``auditor calibrate``, docs/calibration.md: the median effect each simulator profile
produced on each detector, in the unit of the detector's registry ``PowerTarget``, read by
:func:`auditor.verdict.power.power_effect`) it computes the power of every detector that ran
against that effect, at the positions the detector used and at the Bonferroni level alpha/m of the
verdict's power check (m = the audit's tests that ran, pre-flight checks excluded), with the
formulas of :func:`auditor.verdict.power.required_positions` (:func:`auditor.verdict.power.power_at`).

A class is

- **ruled out** when some detector that ran has power >= :data:`RULE_OUT_POWER` (0.95) against it:
  an audit of a provider with that deviation would have rejected with probability >= 95%;
- **not ruled out** when detectors that can see it ran but none reached that power (the record
  holds the best power, and the positions the detector with that power still lacks);
- **not tested** when no detector of the audit can test it (e.g. no sampling probes for the
  acceptance classes, or no reference for the precision classes).

``auditor.verdict.decide.decide_verdict`` records the list as ``details["rules_out"]`` on PASS and
INCONCLUSIVE verdicts and appends :func:`rules_out_sentence` to a PASS reason;
``auditor.check.auto_budget`` (``--budget-tokens auto``) stops with PASS only once every tested class is
ruled out (:func:`not_ruled_out`, :func:`tokens_to_rule_out`).

**Relative to the model card in use** (issue 36): the precision classes are the steps *below* the card
(:func:`classes_for_card`, the one home of that rule, which ``auditor.verdict.precision_estimate`` reads too):
a class that lowers a component (``DeviationClass.lowers``) to no fewer bits than the card already has there
is the card itself, not a deviation below it, and is left out (an FP8 card's PASS never "rules out 8-bit
weights"). Their effects are those measured under the card (the table's ``cards`` section) where the table
has them; otherwise the float32 effects stand in, each such record says so (``under_card`` False) and
:func:`rules_out_sentence` names them: under the card's more lenient floor a step's effect is smaller, so
the power against it is overstated.

The measured effects are those of the simulator's profiles on SmolLM2-135M: a real provider's
deviation of the same kind may be larger or smaller, so "rules out int8" means "rules out a
deviation at least as large as the simulator's int8".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from auditor.detectors import DETECTORS, MODES, PREFLIGHT_CHECKS
from auditor.detectors.base import DetectorResult
from auditor.detectors.noise_floor import NoiseFloor
from auditor.verdict.power import _power_at_model, _power_model, required_positions, tokens_per_position

__all__ = [
    "BELOW_RESOLUTION",
    "COMPONENTS",
    "EFFECT_SIZES_PATH",
    "FLOAT_BITS",
    "QUESTIONS",
    "RULE_OUT_POWER",
    "CardClasses",
    "CardEffects",
    "DeviationClass",
    "EffectSizes",
    "EffectSizesError",
    "RuleOut",
    "as_rule_outs",
    "card_basis",
    "classes_for_card",
    "load_effect_sizes",
    "lowers_below",
    "not_ruled_out",
    "rules_out",
    "rules_out_rows",
    "rules_out_sentence",
    "tokens_to_rule_out",
]

#: Power an audit needs against a class's measured effect to rule the class out.
RULE_OUT_POWER = 0.95
#: The packaged effect-size table (``auditor calibrate`` regenerates it).
EFFECT_SIZES_PATH = Path(__file__).resolve().parent.parent / "calibration" / "effect_sizes.json"
#: The question a class belongs to: the buyer's two (``auditor.verdict.questions``) and requested decoding.
QUESTIONS = ("precision", "verification", "decoding")
#: What a precision class lowers (``DeviationClass.lowers``): the linear weights, the linear layers' input
#: activations, the KV cache — the three fields of a model card (``probes.model_card``).
COMPONENTS = ("weights", "activations", "kv_cache")
#: Bits a float component counts as (16- and 32-bit floats are one class: the noise floor measures honest bf16 /
#: fp16 serving; ``probes.model_card.ModelCard.component_bits`` counts a float format as 16).
FLOAT_BITS = 16

Status = Literal["ruled out", "not ruled out", "not tested"]

#: What no budget can resolve (issue 37, item 5): a precision change no larger than the variation between
#: honest stacks is indistinguishable from honest serving, because the noise floor *is* that variation.
#: Measured: an int8 KV cache (per token and head, weights at full precision) moved the reported
#: logprobs 0.93–1.03x the honest floor; such a PASS must not read as "rules it out".
BELOW_RESOLUTION = ("changes within the variation between honest float32, bf16 and fp16 serving (the noise floor), "
                    "e.g. an 8-bit KV cache with per-token scales (measured at 0.93-1.03x the floor)")
_ATOMIC = (str, bool, int, float)


class EffectSizesError(ValueError):
    """The effect-size file is missing or malformed (the message names the file and the field)."""


@dataclass(frozen=True)
class DeviationClass:
    """One deviation class of the effect-size table.

    Attributes:
        key: class key (``int4``, ``relaxed-threshold:0.7``, ...).
        label: human name for reports ("int4 weights", "relaxed acceptance s = 0.5").
        question: ``precision`` | ``verification`` | ``decoding``.
        profile: the simulator profile whose calibration audits measured the effects.
        effects: detector registry name → median effect in that detector's power-target unit.
        lowers: precision classes: component (:data:`COMPONENTS`) → the bits the class leaves it with
            (``int4``: ``{"weights": 4}``; ``w8a8``: ``{"weights": 8, "activations": 8}``); empty for the
            other classes (a precision class that lowers nothing is a substitution class: another model). Whether a class is a step *below* a model card compares these with the card's
            (``auditor.verdict.precision_estimate``).
    """

    key: str
    label: str
    question: str
    profile: str
    effects: Mapping[str, float]
    lowers: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CardEffects:
    """The precision classes' effects measured under one model card (``effect_sizes.json`` ``cards``).

    Under a card the reference computes the card and the honest floor is the card's (more lenient than
    the float32 floor: ``auditor.check.reference_setup.apply_card``), so a step below the card moves the
    geometric-mean KL / floor ratio by its own amount; the calibration measures it per card, with the
    card's below-card profiles (``native-fp8-int4`` for the int4 class under an FP8 card ...).

    Attributes:
        key: the table key; model: the reference model it was measured on; card: the card's recipe
            (``probes.model_card.ModelCard.recipe``: ``weights fp8-block 128x128 e4m3, activations fp8 per
            1x128, KV cache fp32``); source, generated: what measured it, ISO time.
        classes: the classes below the card, each with the profile that served it under the card.
    """

    key: str
    model: str
    card: str
    source: str
    generated: str
    classes: tuple[DeviationClass, ...]


@dataclass(frozen=True)
class EffectSizes:
    """The effect-size table (``effect_sizes.json``).

    Attributes:
        source: what produced it; model: the model calibrated on; generated: ISO time.
        provisional: True while the numbers are placeholders, not measurements.
        classes: the deviation classes, in file order (measured against the float32 reference).
        path: the file read.
        cards: the precision classes' effects measured under model cards (:class:`CardEffects`).
    """

    source: str
    model: str
    generated: str
    provisional: bool
    classes: tuple[DeviationClass, ...]
    path: str
    cards: tuple[CardEffects, ...] = ()

    def for_card(self, model: str | None, card: str | None) -> CardEffects | None:
        """The effects measured under ``card`` (a recipe, :attr:`CardEffects.card`) on ``model``, or None."""
        return next((c for c in self.cards if card is not None and c.card == card and c.model == model), None)


def lowers_below(lowers: Mapping[str, int], card_bits: Mapping[str, int]) -> bool:
    """A class lowering ``lowers`` (component → bits, :attr:`DeviationClass.lowers`) is a step below a card with
    ``card_bits`` (component → bits, ``probes.model_card.ModelCard.component_bits``; a missing component and
    anything above :data:`FLOAT_BITS` count as a float): below it somewhere and above it nowhere."""
    have = {c: min(int(card_bits.get(c, FLOAT_BITS)), FLOAT_BITS) for c in lowers}
    return all(b <= have[c] for c, b in lowers.items()) and any(b < have[c] for c, b in lowers.items())


@dataclass(frozen=True)
class CardClasses:
    """The table's deviation classes relative to the model card in use (:func:`classes_for_card`).

    Attributes:
        classes: the precision classes below the card and the classes that lower nothing (substitution,
            verification, decoding), in the table's order (classes only the card's entry has last).
        under_card: keys of the classes whose effects were measured under the card (empty without a
            ``cards`` entry for it).
        card: the recipe of the non-float card the precision classes are steps below (None: no card or a
            float card, the float32 reference).
        measured: the table's entry measured under the card, or None.
    """

    classes: tuple[DeviationClass, ...]
    under_card: frozenset[str]
    card: str | None
    measured: CardEffects | None


def classes_for_card(table: EffectSizes, card_bits: Mapping[str, int] | None = None, *, model: str | None = None,
                     recipe: str | None = None) -> CardClasses:
    """The deviation classes of ``table`` relative to a model card (module docstring): the one rule both
    :func:`rules_out` and ``auditor.verdict.precision_estimate.card_classes`` apply.

    A class that lowers something (:attr:`DeviationClass.lowers`) is kept only when it is a step below the card
    (:func:`lowers_below`). A class the table's entry measured under the card (:meth:`EffectSizes.for_card` of
    ``model`` and ``recipe``) has that entry's effects (:attr:`CardClasses.under_card`); every other class keeps
    the float32 table's (another model, verification, decoding, and a step the entry did not measure).

    Args:
        table: the effect-size table.
        card_bits: the card's bits per component (``probes.model_card.ModelCard.component_bits``); None = no
            card: the float32 reference, every class below it (the table's classes, unchanged).
        model: the reference model; recipe: the card's recipe (``probes.model_card.ModelCard.recipe``).
    """
    bits = dict.fromkeys(COMPONENTS, FLOAT_BITS) if card_bits is None else dict(card_bits)
    is_float = all(min(int(b), FLOAT_BITS) >= FLOAT_BITS for b in bits.values())
    measured = table.for_card(model, recipe)
    mine = {c.key: c for c in (measured.classes if measured is not None else ())}
    known = {c.key for c in table.classes}
    every = [mine.get(c.key, c) for c in table.classes] + [c for k, c in mine.items() if k not in known]
    picked = tuple(c for c in every if not c.lowers or lowers_below(c.lowers, bits))
    under = frozenset(c.key for c in picked if c.key in mine)
    return CardClasses(picked, under, None if card_bits is None or is_float else recipe, measured)


def _fail(path: Path | str, field: str, what: str) -> EffectSizesError:
    return EffectSizesError(f"{path}: field {field!r}: {what}")


def _str(obj: Mapping[str, Any], key: str, path: Path | str, where: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not v:
        raise _fail(path, f"{where}{key}", f"expected a non-empty string, got {v!r}")
    return v


def parse_effect_sizes(raw: Any, path: Path | str = "<effect sizes>") -> EffectSizes:
    """Validate a decoded effect-size table (see :func:`load_effect_sizes`).

    Raises:
        EffectSizesError: naming ``path`` and the offending field (``classes.int4.effects.greedy-match``).
    """
    if not isinstance(raw, Mapping):
        raise _fail(path, "<top level>", f"expected an object, got {type(raw).__name__}")
    provisional = raw.get("provisional", False)
    if not isinstance(provisional, bool):
        raise _fail(path, "provisional", f"expected true or false, got {provisional!r}")
    cards = raw.get("cards", {})
    if not isinstance(cards, Mapping):
        raise _fail(path, "cards", "expected an object card key -> {model, card, source, generated, classes}")
    per_card = []
    for key, c in cards.items():
        if not isinstance(c, Mapping):
            raise _fail(path, f"cards.{key}", "expected an object")
        where = f"cards.{key}."
        per_card.append(CardEffects(str(key), _str(c, "model", path, where), _str(c, "card", path, where),
                                    _str(c, "source", path, where), _str(c, "generated", path, where),
                                    _parse_classes(c.get("classes"), path, f"cards.{key}.classes")))
    return EffectSizes(_str(raw, "source", path, ""), _str(raw, "model", path, ""), _str(raw, "generated", path, ""),
                       provisional, _parse_classes(raw.get("classes"), path, "classes"), str(path), tuple(per_card))


def _parse_lowers(raw: Any, path: Path | str, where: str) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not raw:
        raise _fail(path, where, f"expected a non-empty object component -> bits ({list(COMPONENTS)}), got {raw!r}")
    out = {}
    for comp, bits in raw.items():
        if comp not in COMPONENTS:
            raise _fail(path, f"{where}.{comp}", f"not a component (known: {list(COMPONENTS)})")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 32:
            raise _fail(path, f"{where}.{comp}", f"expected bits 1..32, got {bits!r}")
        out[str(comp)] = bits
    return out


def _parse_classes(classes: Any, path: Path | str, prefix: str) -> tuple[DeviationClass, ...]:
    if not isinstance(classes, Mapping) or not classes:
        raise _fail(path, prefix, "expected a non-empty object of deviation classes")
    out = []
    for key, c in classes.items():
        where = f"{prefix}.{key}."
        if not isinstance(c, Mapping):
            raise _fail(path, f"{prefix}.{key}", "expected an object")
        question = _str(c, "question", path, where)
        if question not in QUESTIONS:
            raise _fail(path, f"{where}question", f"expected one of {list(QUESTIONS)}, got {question!r}")
        effects = c.get("effects")
        if not isinstance(effects, Mapping) or not effects:
            raise _fail(path, f"{where}effects", "expected a non-empty object detector -> effect")
        eff: dict[str, float] = {}
        for det, v in effects.items():
            s = DETECTORS.get(det)
            if s is None or s.power_target is None:
                raise _fail(path, f"{where}effects.{det}", "not a detector with a power target "
                            f"(known: {[k for k, d in DETECTORS.items() if d.power_target is not None]})")
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise _fail(path, f"{where}effects.{det}", f"expected a finite number, got {v!r}")
            eff[det] = float(v)
        out.append(DeviationClass(str(key), _str(c, "label", path, where), question,
                                  _str(c, "profile", path, where), eff, _parse_lowers(c.get("lowers"), path,
                                                                                      f"{where}lowers")))
    return tuple(out)


def load_effect_sizes(path: str | Path | None = None) -> EffectSizes:
    """Read and validate the effect-size table (default :data:`EFFECT_SIZES_PATH`; cached per path).

    Format: ``{"source", "model", "generated", "provisional"?, "classes": {key: {"label", "question",
    "profile", "lowers"?: {component: bits}, "effects": {detector: effect}}}, "cards"?: {key: {"model", "card",
    "source", "generated", "classes": {...}}}}`` (:class:`DeviationClass`, :class:`CardEffects`).

    Raises:
        EffectSizesError: the file cannot be read, is not JSON, or a field is malformed (named).
    """
    return _load(str(Path(path).resolve() if path is not None else EFFECT_SIZES_PATH))


@lru_cache(maxsize=8)
def _load(path: str) -> EffectSizes:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise EffectSizesError(f"{path}: cannot read the effect-size file ({exc})") from None
    except json.JSONDecodeError as exc:
        raise EffectSizesError(f"{path}: not valid JSON ({exc})") from None
    return parse_effect_sizes(raw, path)


@dataclass(frozen=True)
class RuleOut:
    """What one audit says about one deviation class.

    Attributes:
        key, label, question: the class (:class:`DeviationClass`).
        status: ``ruled out`` | ``not ruled out`` | ``not tested``.
        ruled_out: status == ``ruled out``.
        power: the best power among the detectors that ran against the class's effect (None: not tested).
        detector: the detector with that power (the deciding one when ruled out).
        effect: the class's effect for that detector (its power-target unit).
        n: positions that detector used.
        required_positions: positions that detector needs for RULE_OUT_POWER when it falls short
            (None: ruled out, not tested, or not reachable at any budget).
        missing_positions: completion tokens of its mode it still lacks (0 when ruled out; None when not
            reachable): the positions it lacks, times its tokens per position (greedy-near-tie tests only
            the near-ties among the greedy tokens, :func:`auditor.verdict.power.tokens_per_position`).
        mode: that detector's probe mode (``greedy`` | ``logprob`` | ``sampling``).
        card: a precision class that lowers something, under a non-float model card: the card's recipe (the
            class is a step below it, :func:`classes_for_card`); None: relative to the float32 reference.
        under_card: with ``card``: the effect was measured under the card (False: the float32 effect stands in).
    """

    key: str
    label: str
    question: str
    status: Status
    ruled_out: bool
    power: float | None = None
    detector: str | None = None
    effect: float | None = None
    n: int | None = None
    required_positions: int | None = None
    missing_positions: int | None = None
    mode: str | None = None
    card: str | None = None
    under_card: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """``dataclasses.asdict(self)``; built directly when every field holds a str, number, bool or None
        (what asdict would copy as it is)."""
        d = {k: getattr(self, k) for k in _RULE_OUT_FIELDS}
        if all(v is None or type(v) in _ATOMIC for v in d.values()):
            return d
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuleOut:
        """From a stored ``details["rules_out"]`` entry (unknown keys ignored)."""
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})  # type: ignore[arg-type]


_RULE_OUT_FIELDS = tuple(f.name for f in fields(RuleOut))


def rules_out(
    results: Sequence[DetectorResult],
    *,
    alpha: float,
    n_tests: int | None = None,
    floor: NoiseFloor | None = None,
    effect_sizes: EffectSizes | None = None,
    power: float = RULE_OUT_POWER,
    card_bits: Mapping[str, int] | None = None,
    card_recipe: str | None = None,
    model: str | None = None,
) -> list[RuleOut]:
    """Per deviation class, the audit's power against its measured effect (module docstring).

    Args:
        results: the audit's DetectorResults (after Holm or before: ``ran`` decides).
        alpha: family-wise level; each detector is taken at alpha / n_tests.
        n_tests: m, the tests of the power check (default: the results that ran, pre-flight excluded).
        floor: the noise floor (a KL test's power needs its variance components).
        effect_sizes: the table (default :func:`load_effect_sizes`).
        power: power that rules a class out.
        card_bits, card_recipe, model: the model card in use (``ModelCard.component_bits`` and ``.recipe``) and
            the reference model: the classes are those below the card, with the effects measured under it where
            the table has them (:func:`classes_for_card`); None = the float32 reference.

    Returns:
        One :class:`RuleOut` per class of :func:`classes_for_card`, in its order.
    """
    table = effect_sizes if effect_sizes is not None else load_effect_sizes()
    cc = classes_for_card(table, card_bits, model=model, recipe=card_recipe)
    ran = {r.name: r for r in results if r.ran and r.name not in PREFLIGHT_CHECKS}
    m = n_tests if n_tests is not None else len(ran)
    alpha_test = alpha / max(1, m)
    out = []
    models: dict[str, Any] = {}  # detector → its power model, read once (power_at's, for every class)
    for c in cc.classes:
        rel: dict[str, Any] = ({"card": cc.card, "under_card": c.key in cc.under_card}
                               if cc.card is not None and c.lowers else {})
        best: tuple[float, str, float, DetectorResult] | None = None
        for det, eff in c.effects.items():
            r = ran.get(det)
            if r is None:
                continue
            if det not in models:
                models[det] = _power_model(r, floor)
            pw = _power_at_model(models[det], r.n, eff, alpha_test)  # = power_at(r, effect=eff, ...)
            if pw is not None and (best is None or pw > best[0]):
                best = (pw, det, eff, r)
        if best is None:
            out.append(RuleOut(c.key, c.label, c.question, "not tested", False, **rel))
            continue
        pw, det, eff, r = best
        ok = pw >= power
        # the positions the most powerful detector still lacks (computed only when it falls short:
        # the search of an exact test is the costly part, and the verdict is taken at every look)
        req = None if ok else required_positions(r, alpha_test=alpha_test, power=power, floor=floor, effect=eff)
        out.append(RuleOut(
            c.key, c.label, c.question, "ruled out" if ok else "not ruled out", ok, float(pw), det, eff, int(r.n),
            required_positions=req,
            missing_positions=0 if ok else (math.ceil(max(0, req - r.n) * tokens_per_position(r)) if req is not None
                                            else None),
            mode=str(MODES[det]), **rel,
        ))
    return out


def as_rule_outs(records: Sequence[RuleOut | Mapping[str, Any]]) -> list[RuleOut]:
    """:class:`RuleOut` records from a mix of records and stored ``details["rules_out"]`` dicts."""
    return [r if isinstance(r, RuleOut) else RuleOut.from_dict(r) for r in records]


def rules_out_sentence(records: Sequence[RuleOut | Mapping[str, Any]]) -> str:
    """"rules out int4 weights, fp8 weights; does not rule out int8 weights (power 39%); not tested:
    truncated sampling; cannot be distinguished at any budget: ...; precision classes are steps below the card
    (...): effects of ... measured against float32, not under it" (parts without classes are left out;
    :data:`BELOW_RESOLUTION` whenever a precision class was tested; the card part, :func:`card_basis`, when the
    precision classes are relative to a non-float card; "" for no records)."""
    recs = as_rule_outs(records)
    yes = [r.label for r in recs if r.status == "ruled out"]
    no = [f"{r.label} (power {r.power:.0%})" if r.power is not None else r.label
          for r in recs if r.status == "not ruled out"]
    nt = [r.label for r in recs if r.status == "not tested"]
    parts = []
    if yes:
        parts.append("rules out " + ", ".join(yes))
    if no:
        parts.append("does not rule out " + ", ".join(no))
    if nt:
        parts.append("not tested: " + ", ".join(nt))
    if any(r.question == "precision" and r.status != "not tested" for r in recs):
        parts.append("cannot be distinguished at any budget: " + BELOW_RESOLUTION)
    basis = card_basis(recs)
    if basis:
        parts.append(basis)
    return "; ".join(parts)


def card_basis(records: Sequence[RuleOut | Mapping[str, Any]]) -> str:
    """What the precision classes of ``records`` are relative to, when a non-float card is in use (:attr:`RuleOut.card`):
    "precision classes are steps below the card (RECIPE), effects measured under it" or, for the classes whose
    effects were not (the table has no calibration under this card), "...; the effects of int4 weights are the
    float32 reference's, not measured under this card: under its more lenient floor a step's effect is smaller,
    so this power overstates the audit's" ("" without a card)."""
    recs = [r for r in as_rule_outs(records) if r.question == "precision" and r.card]
    if not recs:
        return ""
    cards = sorted({str(r.card) for r in recs})
    out = f"precision classes are steps below the card ({'; '.join(cards)})"
    fallback = [r.label for r in recs if not r.under_card]
    if len(fallback) < len(recs):
        out += ", effects measured under it" + (" where calibrated" if fallback else "")
    if fallback:
        out += (f"; the effects of {', '.join(fallback)} are the float32 reference's, not measured under this card: "
                "under its more lenient floor a step's effect is smaller, so this power overstates the audit's")
    return out


def not_ruled_out(records: Sequence[RuleOut | Mapping[str, Any]] | None) -> list[RuleOut]:
    """The tested classes that are not ruled out ([] when every tested class is, or no record)."""
    return [r for r in as_rule_outs(records or []) if r.status == "not ruled out"]


def tokens_to_rule_out(records: Sequence[RuleOut | Mapping[str, Any]] | None) -> int | None:
    """Extra tokens (≈ positions) that would rule out every tested class: per probe mode, the largest
    missing positions among the classes whose most powerful detector reads that mode, summed over modes
    (one mode's probes serve all its classes). 0 when nothing is missing; None when some class
    cannot be ruled out at any budget the power model reaches (its effect is on the null side)."""
    per_mode: dict[str, int] = {}
    for r in not_ruled_out(records):
        if r.missing_positions is None:
            return None
        mode = r.mode or "?"
        per_mode[mode] = max(per_mode.get(mode, 0), int(r.missing_positions))
    return int(sum(per_mode.values()))


def rules_out_rows(records: Sequence[RuleOut | Mapping[str, Any]] | None) -> list[list[str]]:
    """Table rows for reports: [class label, question, status, power, deciding detector and positions,
    positions still missing] per record (stored dicts or :class:`RuleOut`); under a non-float card a step's label
    says whether its effect was measured under the card or the float32 one stands in."""
    rows = []
    for r in as_rule_outs(records or []):
        pw = f"{r.power:.0%}" if r.power is not None else "—"
        det = f"{r.detector} on {r.n} positions" if r.detector else "no detector of this audit tests it"
        miss = str(r.missing_positions) if r.status == "not ruled out" and r.missing_positions is not None else (
            "unreachable" if r.status == "not ruled out" else "—")
        label = r.label + ("" if not r.card else " (effect under the card)" if r.under_card else
                           " (float32 effect: not calibrated under the card)")
        rows.append([label, r.question, r.status, pw, det, miss])
    return rows
