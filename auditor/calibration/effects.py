"""The effect-size table a PASS's "rules out" list is computed against, refreshed from calibration.

``auditor/calibration/effect_sizes.json`` (read by ``auditor.verdict.rules_out``) holds, per deviation
class (int4, int8, fp8, kv-fp8, w8a8, relaxed acceptance at s, truncation, substitution …), the
effect its simulator profile produces in each detector's power-target unit
(``auditor.verdict.power.power_effect``): clear-mismatch rate, geometric-mean KL / floor, argmax
excess per sampled position, tail ratio. :func:`effect_sizes_from_records` takes them from a
calibration run: per class and detector, the median effect over the audits of the profile's
largest-budget cell in which that detector ran in at least half of the audits (the most
positions, the least noisy median). The reference-free ``self-*`` sampling tests never run in a
calibration (it always has the reference); for a class whose weights are the reference's (relaxed
acceptance, truncation) the served distribution *is* the reference's, so their effect equals the
``sampling-*`` one, and that is what is written (marked in ``derived``).

Under a model card the reference computes the card and the floor is the card's, so the precision
classes below the card have their own effects (``auditor.verdict.precision_estimate``):
:func:`card_effects_from_records` measures them, from the audits of the profiles that serve each step
below the card (``native-fp8-int4`` for int4 weights under an FP8 card ...) against the card's reference,
as an entry of the table's ``cards`` section (``auditor.verdict.rules_out.CardEffects``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from auditor.calibration.metrics import record_suite
from auditor.detectors import DetectorName

__all__ = ["BELOW_CARD_CLASSES", "BELOW_CARD_PROFILES", "EFFECT_SIZES_PATH", "MIN_RAN_SHARE",
           "card_classes_of", "card_effects_from_records", "effect_sizes_from_records", "write_card_effects",
           "write_effect_sizes"]

#: The package's table (``auditor.verdict.rules_out.load_effect_sizes`` reads it).
EFFECT_SIZES_PATH = Path(__file__).with_name("effect_sizes.json")
#: A cell's median counts for a detector only when the detector ran in at least this share of its audits.
MIN_RAN_SHARE = 0.5
_SELF_FROM_REFERENCE = {DetectorName.SELF_ARGMAX: DetectorName.SAMPLING_ARGMAX,
                        DetectorName.SELF_TAIL: DetectorName.SAMPLING_TAIL}


def _effect(records: Sequence[Mapping], profile: str, detector: str) -> tuple[float, str, int] | None:
    """(median effect, suite, budget) of ``detector`` in ``profile``'s largest-budget cell where it ran."""
    best: tuple[int, float, str] | None = None
    for r in records:
        if r.get("profile") != profile or r.get("design", "fixed") != "fixed":
            continue
        d = (r.get("detectors") or {}).get(detector) or {}
        e = d.get("effect_median")
        if e is None or float(d.get("ran") or 0.0) < MIN_RAN_SHARE:
            continue
        b = int(r.get("budget_tokens") or 0)
        if best is None or b > best[0]:
            best = (b, float(e), record_suite(dict(r)))
    return None if best is None else (best[1], best[2], best[0])


def effect_sizes_from_records(records: Sequence[Mapping], template: Mapping) -> dict:
    """A new effect-size table: ``template``'s classes with their effects measured in ``records``.

    Args:
        records: calibration records (``calibration.json`` rows; fixed-budget rows with
            ``detectors[name]["effect_median"]``).
        template: the current table (``{"classes": {name: {"profile", "label", "question",
            "effects"}}}``); its classes, labels and questions are kept.

    Returns:
        The table (JSON-able). Classes whose profile has no record keep their old effects and are
        listed under ``"not_measured"``; detector effects taken from another detector are listed
        under each class's ``"derived"``. ``"provisional"`` is dropped when every class was measured.
    """
    classes: dict[str, dict] = {}
    missing: list[str] = []
    for name, c in (template.get("classes") or {}).items():
        c = dict(c)
        profile = str(c.get("profile") or name)
        names = set(c.get("effects") or {}) | {
            k for r in records if r.get("profile") == profile for k in (r.get("detectors") or {})
        }
        effects: dict[str, float] = {}
        source: dict[str, str] = {}
        for det in sorted(names):
            got = _effect(records, profile, det)
            if got is not None:
                effects[det] = round(got[0], 6)
                source[det] = f"{got[1]} @ {got[2]} tokens"
        derived = {}
        for own, ref in _SELF_FROM_REFERENCE.items():
            if own not in effects and ref in effects and own in (c.get("effects") or {}):
                effects[own] = effects[ref]
                derived[own] = ref
        if effects:
            c["effects"] = effects
            c["measured_in"] = source
            if derived:
                c["derived"] = derived
            else:
                c.pop("derived", None)
        else:
            missing.append(name)
        classes[name] = c
    out = {k: v for k, v in template.items() if k not in ("classes", "provisional", "not_measured")}
    out["generated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["classes"] = classes
    if missing:
        out["provisional"] = True
        out["not_measured"] = missing
    return out


def write_effect_sizes(records: Sequence[Mapping], path: Path | str = EFFECT_SIZES_PATH) -> Path | None:
    """Refresh the table at ``path`` from ``records`` (:func:`effect_sizes_from_records`); None when
    ``path`` does not exist (nothing to refresh: the classes are defined there)."""
    p = Path(path)
    if not p.is_file():
        return None
    table = effect_sizes_from_records(records, json.loads(p.read_text(encoding="utf-8")))
    p.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    return p


#: The class each below-card profile serves under a card (issue 36): the float32 table's class of that key (its
#: label, question and ``lowers``), or one of :data:`BELOW_CARD_CLASSES`. ``kv-fp8`` serves an FP8 KV cache under a
#: card whose own KV cache is float (the INT4 card); ``native-fp8-kv-fp8`` the same step with the FP8 card's tiles.
BELOW_CARD_PROFILES: Mapping[str, str] = {
    "native-fp8-int4": "int4", "native-fp8-kv-fp8": "kv-fp8", "native-fp8-nvfp4": "nvfp4",
    "native-int4-int3": "int3", "kv-fp8": "kv-fp8",
}
#: Classes that exist only below a card (no float32 class: their profiles serve a native variant), each saying
#: what it lowers (``auditor.verdict.rules_out.DeviationClass.lowers``): NVFP4 W4A4 of the FP8 model
#: (``simulator.profiles`` ``native-fp8-nvfp4``, ``reference.native.nvfp4_fake_quant``).
BELOW_CARD_CLASSES: Mapping[str, Mapping[str, object]] = {
    "nvfp4": {"label": "NVFP4 weights and activations (W4A4)", "question": "precision",
              "lowers": {"weights": 4, "activations": 4}},
}


def card_classes_of(profiles: Sequence[str], card_bits: Mapping[str, int], template: Mapping) -> dict[str, dict]:
    """The ``classes`` argument of :func:`card_effects_from_records` for a calibration under a card: per profile of
    ``profiles`` that :data:`BELOW_CARD_PROFILES` maps to a class, that class (from the float32 table
    ``template``'s ``classes``, else :data:`BELOW_CARD_CLASSES`) with ``profile`` set, kept only when it is a step
    below the card (``auditor.verdict.rules_out.lowers_below``, the rule the reports apply); the first profile of
    a class wins.

    Args:
        profiles: the profiles the calibration ran; card_bits: the card's bits per component
            (``probes.model_card.ModelCard.component_bits``); template: the effect-size table (JSON).
    """
    from auditor.verdict.rules_out import lowers_below

    known = dict(template.get("classes") or {})
    out: dict[str, dict] = {}
    for p in profiles:
        key = BELOW_CARD_PROFILES.get(p)
        base = known.get(key) if key is not None else None
        if base is None and key is not None:
            base = BELOW_CARD_CLASSES.get(key)
        if key is None or base is None or key in out:
            continue
        lowers = dict(base.get("lowers") or {})
        if lowers and lowers_below(lowers, card_bits):
            out[key] = {"label": base["label"], "question": base["question"], "profile": p, "lowers": lowers}
    return out


def write_card_effects(records: Sequence[Mapping], *, key: str, model: str, card: str, card_bits: Mapping[str, int],
                       source: str, path: Path | str = EFFECT_SIZES_PATH) -> tuple[Path, dict]:
    """Write the effects of a calibration under a card into the table at ``path``, ``cards[key]``
    (:func:`card_effects_from_records` of the below-card classes of the profiles in ``records``,
    :func:`card_classes_of`); the float32 classes and the other cards are kept, and so are the classes of an earlier
    entry for the same card (same model and recipe) that this run's profiles do not serve (the entry's ``source``
    names them and where they came from); a different recipe under the same key replaces the entry. The file is validated
    (``auditor.verdict.rules_out.parse_effect_sizes``) before it is written.

    Args:
        records: calibration records under the card; key: the entry's key (the card's name); model: the reference
            model audits name (a provider's ``reference``, e.g. ``smollm2-135m-instruct+fp8``); card: the card's recipe
            (``ModelCard.recipe``); card_bits: its bits per component; source: what produced the records.

    Returns:
        (the path written, the entry).

    Raises:
        ValueError: ``path`` is not a table, or no profile of ``records`` serves a class below the card (the message
            names the below-card profiles to run).
    """
    from auditor.verdict.rules_out import EffectSizesError, parse_effect_sizes

    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: cannot read the effect-size table ({exc})") from None
    profiles = list(dict.fromkeys(str(r.get("profile")) for r in records if r.get("design", "fixed") == "fixed"))
    classes = card_classes_of(profiles, card_bits, raw)
    if not classes:
        raise ValueError(f"card {card!r}: none of the profiles run ({', '.join(profiles) or 'none'}) serves a class below "
                         f"the card; run the below-card profiles ({', '.join(BELOW_CARD_PROFILES)}) that apply to it")
    entry = card_effects_from_records(records, model=model, card=card, classes=classes, source=source)
    old = dict(raw.get("cards") or {}).get(key)
    if isinstance(old, Mapping) and old.get("card") == card and old.get("model") == model:
        # the same card measured before: classes this run did not serve keep their earlier effects (and say so)
        kept = {k: v for k, v in dict(old.get("classes") or {}).items() if k not in entry["classes"]}
        if kept:
            entry = {**entry, "classes": {**entry["classes"], **kept},
                     "source": f"{entry['source']}; {', '.join(kept)} kept from {old.get('source')} "
                               f"(generated {old.get('generated')})"}
    raw["cards"] = {**dict(raw.get("cards") or {}), key: entry}
    try:
        parse_effect_sizes(raw, p)
    except EffectSizesError as exc:
        raise ValueError(str(exc)) from None
    p.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    return p, entry


def card_effects_from_records(records: Sequence[Mapping], *, model: str, card: str,
                              classes: Mapping[str, Mapping], source: str) -> dict:
    """An entry of the effect-size table's ``cards`` section: the classes below one card with their effects
    measured in ``records`` (:func:`effect_sizes_from_records`: per class and detector, the median over the
    audits of the largest-budget cell of the class's profile).

    Args:
        records: calibration records of audits against the card's reference (``profile``, ``budget_tokens``,
            ``detectors[name]["effect_median"]`` and ``["ran"]``).
        model: the reference model; card: the card's recipe (``probes.model_card.ModelCard.recipe``).
        classes: class key → ``{"label", "question": "precision", "profile", "lowers"}``: the profile that
            serves the class's step below the card.
        source: what produced the records.

    Returns:
        ``{"model", "card", "source", "generated", "classes"}`` (JSON-able; ``auditor.verdict.rules_out``
        parses it).

    Raises:
        ValueError: a class without records of its profile (its effect was not measured under the card).
    """
    template = {"classes": {k: {**dict(c), "effects": {}} for k, c in classes.items()}}
    table = effect_sizes_from_records(records, template)
    if table.get("not_measured"):
        raise ValueError(f"card {card!r} on {model}: no records of the profiles of {table['not_measured']} "
                         "(audit each class's profile against the card's reference first)")
    return {"model": model, "card": card, "source": source, "generated": table["generated"],
            "classes": table["classes"]}
