"""Measured precision (issue 36, item 4): the estimate names the right precision class on noisy seeded
draws of each class's effect, τ comes from the calibration, and a claim is checked in every format."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from auditor.calibration.effects import card_effects_from_records
from auditor.report.common import JSON_FIELDS, AuditReport
from auditor.report.render import render
from auditor.verdict.precision_estimate import (
    NATIVE,
    TAU,
    card_classes,
    claim_classes,
    estimate_from_ratio,
    estimate_precision,
)
from auditor.verdict.rules_out import load_effect_sizes, parse_effect_sizes
from probes.model_card import ModelCard

ROOT = Path(__file__).resolve().parents[2]
QUANT = ("int8", "fp8", "kv-fp8", "w8a8", "int4", "int3")
# Standard error of log R per logprob position count: s = 3.9 / sqrt(n), read off the calibration's int8
# power (rejections 47% / 77% at 72 / 157 logprob tokens, budgets 500 / 1000, with log R = 0.96 and the
# Bonferroni level 0.05/5: s = 0.96 / (z_0.99 + z_power) = 0.435 / 0.32).
S_PER_ROOT_N = 3.9
LOGPROB_TOKENS = {500: 72, 1000: 157, 3000: 473}
Z_REJECT = 2.326  # one-sided 0.01 = 0.05 / 5 tests


def _ratio(key: str) -> float:
    return next(c.effects["logprob-divergence"] for c in load_effect_sizes().classes if c.key == key)


def _group(key: str) -> str:
    """The precision class of ``key`` with no card (every class is a step below the float32 reference)."""
    return next(g for k, _, g, _, _ in card_classes(load_effect_sizes()).classes if k == key)


def test_tau_covers_the_calibrated_spread_of_each_class() -> None:
    """τ is the largest half-range of log(median ratio) over a quantization profile's calibration cells."""
    rows = json.loads((ROOT / "docs" / "calibration.json").read_text())
    logs: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        e = (r.get("detectors") or {}).get("logprob-divergence") or {}
        if r.get("design") == "fixed" and e.get("effect_median") and e.get("ran", 0) >= 0.5:
            logs[r["profile"]].append(math.log(e["effect_median"]))
    spread = max((max(logs[p]) - min(logs[p])) / 2 for p in QUANT)
    assert spread <= TAU <= spread + 0.02  # from the calibration, rounded up, not tuned


@pytest.mark.parametrize("budget", [500, 1000, 3000])
@pytest.mark.parametrize("key", QUANT)
def test_estimate_names_the_right_class_in_rejections(key: str, budget: int) -> None:
    """Noisy seeded draws: log R = log R_c + τ·N(0,1) + s·N(0,1); among the draws the detector rejects,
    the estimate names the class's precision class and keeps the class consistent in >= 90%."""
    rng = np.random.default_rng(sum(map(ord, key)) + budget)
    s = S_PER_ROOT_N / math.sqrt(LOGPROB_TOKENS[budget])
    y = math.log(_ratio(key)) + TAU * rng.standard_normal(600) + s * rng.standard_normal(600)
    rejected = y[y / s > Z_REJECT]
    assert rejected.size >= 100  # enough rejections to measure a rate
    right = consistent = 0
    for v in rejected:
        est = estimate_from_ratio(math.exp(v), s, LOGPROB_TOKENS[budget])
        right += est.best == _group(key)
        consistent += next(c for c in est.classes if c.key == key).status == "consistent"
    assert right / rejected.size >= 0.90, (key, budget, right / rejected.size)
    assert consistent / rejected.size >= 0.90, (key, budget, consistent / rejected.size)


def test_honest_pass_names_the_native_precision() -> None:
    """An honest provider (R ≈ 0.95, the calibrated honest-bf16 ratio) that passes at 3000 tokens: the
    estimate is the card's precision, and it rules out 4-bit weights."""
    rng = np.random.default_rng(7)
    s = S_PER_ROOT_N / math.sqrt(LOGPROB_TOKENS[3000])
    y = math.log(0.95) + s * rng.standard_normal(500)
    passed = y[y / s <= Z_REJECT]
    ests = [estimate_from_ratio(math.exp(v), s, 473) for v in passed]
    assert np.mean([e.best_class == NATIVE for e in ests]) >= 0.95
    assert all(next(c for c in e.classes if c.key == "int4").status == "ruled out" for e in ests)


def test_claims() -> None:
    served_int4 = estimate_from_ratio(_ratio("int4"), 0.3, 480, claimed="bf16")
    assert served_int4.claim is not None and served_int4.claim.outcome == "does not match"
    assert served_int4.claim.power is not None and served_int4.claim.power > 0.5
    ok = estimate_from_ratio(_ratio("int4"), 0.3, 480, claimed="int4")
    assert ok.claim is not None and ok.claim.outcome == "matches" and ok.claim.classes == ("int4",)
    assert "rules out the card's native precision, 8-bit" in ok.sentence()
    # too few positions: 8-bit and 4-bit both consistent -> cannot tell
    vague = estimate_from_ratio(30.0, 1.5, 20, claimed="int8")
    assert vague.claim is not None and vague.claim.outcome == "cannot tell"
    assert claim_classes("fp8", "fp8") == (NATIVE,)  # DeepSeek: fp8 is the card's precision
    assert claim_classes("bf16", "fp8") == (NATIVE,)
    assert set(claim_classes("fp8", None)) == {"int8", "fp8", "kv-fp8", "w8a8"}
    assert claim_classes("fp6", None) == ()
    assert claim_classes("bf16", "fp32") == (NATIVE,)  # the bundled cards: honest bf16 is in the floor
    with pytest.raises(ValueError, match="not one of"):
        claim_classes("q4", None)
    with pytest.raises(ValueError, match="ratio"):
        estimate_from_ratio(0.0, 0.1, 10)


def _report(verdict: str, ratio: float, se: float, claimed: str | None) -> AuditReport:
    det = {"name": "logprob-divergence", "ran": True, "statistic": math.log(ratio) / se, "p_value": 1e-9,
           "p_adjusted": 1e-8, "effect": 1.0, "effect_ci": [0.5, 2.0], "n": 480, "reason": None,
           "rejects": verdict != "PASS", "evidence": [], "details": {"geometric_ratio": ratio}}
    return AuditReport(run_id="r1", provider="acme", model="m", verdict=verdict, verdict_reason="logprob-divergence",
                       alpha=0.05, detectors=[det], suite="precision", suite_version="1",
                       reference={"model": "smollm2-135m-instruct", "revision": "x", "dtype": "float32",
                                  "card": "card smollm2-135m-instruct: weights fp32", "card_precision": "fp32",
                                  "claimed_precision": claimed})


def test_non_matching_claim_leads_every_format() -> None:
    rep = _report("QUANTIZATION", _ratio("int4"), 0.3, "bf16")
    assert rep.headline.startswith("The provider's claimed precision (bf16) does not match what it serves "
                                   "(measured: 4-bit weights).")
    js = json.loads(str(render(rep, "json")))
    assert "precision_estimate" in JSON_FIELDS and js["precision_estimate"]["claim"]["outcome"] == "does not match"
    assert js["precision_estimate"]["best"] == "4-bit weights"
    md = str(render(rep, "markdown"))
    assert "## Measured precision" in md and "| int4 weights | 4-bit weights |" in md
    assert md.index("does not match") < md.index("## Measured precision")  # named in the first lines
    ju = str(render(rep, "junit"))
    assert 'name="claimed_precision" value="bf16: does not match"' in ju and "measured precision:" in ju
    from rich.console import Console

    con = Console(record=True, width=400)
    render(rep, "text", console=con)
    assert "measured precision: consistent with 4-bit weights" in con.export_text()


def test_matching_claim_and_pass_and_not_applicable() -> None:
    rep = _report("QUANTIZATION", _ratio("int4"), 0.3, "int4")
    est = rep.precision_estimate
    assert est is not None and est["claim"]["outcome"] == "matches" and not rep.headline.startswith("The provider")
    assert "rules out" in est["sentence"]
    passed = _report("PASS", 0.9, 0.2, None).precision_estimate
    assert passed is not None and passed["best_class"] == NATIVE
    assert _report("RELAXED_VERIFICATION", 3.0, 0.2, None).precision_estimate is None
    assert estimate_precision("QUANTIZATION", [{"name": "logprob-divergence", "ran": False}]) is None
    assert estimate_precision("QUANTIZATION", [{"name": "logprob-divergence", "ran": True, "details": "junk"}]) is None


def test_stored_run_states_the_card_and_the_claim(tmp_path) -> None:
    """report_from_store reads the card (the bundled one when the snapshot names none) and the claim."""
    from auditor.report.render import report_from_store
    from auditor.store import models as orm
    from auditor.store.db import open_store
    from tests.fixtures_store import seed_demo

    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    with store.session() as s:
        rid = seed_demo(s, calibration=False)["runs"]["sim-int4"][-1]
    with store.session() as s:
        run = s.get(orm.AuditRun, rid)
        snap = dict(run.config_snapshot or {})
        snap["provider"] = {**(snap.get("provider") or {}), "claimed_precision": "bf16"}
        run.config_snapshot = snap
    with store.session() as s:
        ref = report_from_store(s, rid).reference
    store.close()
    assert ref["card"].startswith("card smollm2-135m-instruct: the model is published as 4-bit weights (gguf:Q4_1); "
                                  "the reference computes in float32 with exactly those values")
    assert ref["card_precision"] == "fp32" and ref["claimed_precision"] == "bf16"


#: The FP8 card of DeepSeek-V3 (weights and activations FP8, KV cache bf16) and an INT4 card (Kimi K2-Thinking).
FP8_CARD = ModelCard.model_validate({"name": "ds", "weights": {"format": "fp8-block", "block_size": [128, 128]},
                                     "activations": {"format": "fp8", "tile": [1, 128]}, "kv_cache": "bf16"})
INT4_CARD = ModelCard.model_validate({"name": "k2", "weights": {"format": "int4", "group_size": 32},
                                      "kv_cache": "bf16"})


def _groups(card: ModelCard | None) -> dict[str, str]:
    bits = card.component_bits() if card is not None else None
    return {k: g for k, _, g, _, _ in card_classes(load_effect_sizes(), bits).classes}


def test_classes_are_steps_below_the_card() -> None:
    """An FP8 card has no "8-bit weights" below it (4- and 3-bit weights, an 8-bit KV cache are); an INT4 card has
    3-bit weights and an 8-bit KV cache, not 4- or 8-bit weights; no card: every class, 8-bit ones as one group."""
    free = _groups(None)
    assert free["int8"] == free["fp8"] == free["kv-fp8"] == free["w8a8"] == "8-bit weights, activations or KV cache"
    assert free["int4"] == "4-bit weights" and free["int3"] == "3-bit weights"
    fp8 = _groups(FP8_CARD)
    assert set(fp8) >= {NATIVE, "int4", "int3", "kv-fp8"} and not {"int8", "fp8", "w8a8"} & set(fp8)
    assert fp8["kv-fp8"] == "8-bit KV cache" and fp8["int4"] == "4-bit weights"
    assert not any(g.startswith("8-bit weights") for g in fp8.values())
    int4 = _groups(INT4_CARD)
    assert set(int4) >= {NATIVE, "int3", "kv-fp8"} and not {"int4", "int8", "fp8", "w8a8"} & set(int4)
    # a claim below the card names the card's classes of its width; at or above it, the native precision
    assert claim_classes("int4", "fp8", classes=card_classes(load_effect_sizes(), FP8_CARD.component_bits())) == ("int4",)
    assert claim_classes("fp8", "fp8") == (NATIVE,)
    # a KV cache the checkpoint declares FP8 ("auto" resolved) is the card's: no 8-bit KV step below it
    auto = FP8_CARD.model_copy(update={"kv_cache": "auto"})
    assert "kv-fp8" not in {k for k, *_ in card_classes(load_effect_sizes(), auto.component_bits("fp8")).classes}


def _card_table(int4_ratio: float, kv_ratio: float):
    """The packaged table plus effects measured under FP8_CARD (calibration records of its below-card profiles)."""
    recs = [{"profile": p, "design": "fixed", "budget_tokens": 1000,
             "detectors": {"logprob-divergence": {"effect_median": r, "ran": 1.0}}}
            for p, r in (("native-fp8-int4", int4_ratio), ("native-fp8-kv-fp8", kv_ratio))]
    entry = card_effects_from_records(recs, model="m+fp8", card=FP8_CARD.recipe(), source="test", classes={
        "int4": {"label": "int4 weights", "question": "precision", "profile": "native-fp8-int4", "lowers": {"weights": 4}},
        "kv-fp8": {"label": "fp8 KV cache", "question": "precision", "profile": "native-fp8-kv-fp8",
                   "lowers": {"kv_cache": 8}}})
    raw = json.loads(Path(load_effect_sizes().path).read_text())
    return parse_effect_sizes({**raw, "cards": {"m+fp8": entry}}, "test")


def test_effects_measured_under_the_card_name_the_step() -> None:
    """int4 of an FP8 model reads 5x the card's floor (its lenient floor; 8-bit KV steps reach 8x the float32
    floor): against the float32 effects the estimate names the 8-bit KV cache and says the effects are not the
    card's; against the effects measured under the card it names 4-bit weights, relative to the card."""
    bits, recipe = FP8_CARD.component_bits(), FP8_CARD.recipe()
    plain = estimate_from_ratio(5.1, 0.2, 300, card_bits=bits, card_recipe=recipe, model="m+fp8")
    assert plain.best == "8-bit KV cache" and not plain.card_calibrated
    assert "not under this card" in plain.sentence() and recipe in plain.sentence()
    table = _card_table(5.0, 1.9)
    est = estimate_from_ratio(5.1, 0.2, 300, card_bits=bits, card_recipe=recipe, model="m+fp8", effect_sizes=table)
    assert est.best == "4-bit weights" and est.card_calibrated
    assert "effects measured under this card on m+fp8" in est.sentence()
    kv = estimate_from_ratio(1.8, 0.2, 300, card_bits=bits, card_recipe=recipe, model="m+fp8", effect_sizes=table)
    assert kv.best == "8-bit KV cache"
    assert "rules out 4-bit weights" in kv.sentence()
    # another model, or another card on it: the measured effects do not apply
    other = estimate_from_ratio(5.1, 0.2, 300, card_bits=bits, card_recipe=recipe, model="x", effect_sizes=table)
    assert not other.card_calibrated
    with pytest.raises(ValueError, match="no records"):
        card_effects_from_records([], model="m", card="c", source="t", classes={"int4": {
            "label": "int4", "question": "precision", "profile": "p", "lowers": {"weights": 4}}})
