"""Measured precision (issue 36, item 4): the estimate names the right precision class on noisy seeded
draws of each class's effect, τ comes from the calibration, and a claim is checked in every format."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from auditor.report.common import JSON_FIELDS, AuditReport
from auditor.report.render import render
from auditor.verdict.precision_estimate import (
    NATIVE,
    PRECISION_GROUPS,
    TAU,
    claim_classes,
    estimate_from_ratio,
    estimate_precision,
)
from auditor.verdict.rules_out import load_effect_sizes

ROOT = Path(__file__).resolve().parents[2]
QUANT = ("int8", "fp8", "kv-fp8", "w8a8", "int4")
# Standard error of log R per logprob position count: s = 3.9 / sqrt(n), read off the calibration's int8
# power (rejections 47% / 77% at 72 / 157 logprob tokens, budgets 500 / 1000, with log R = 0.96 and the
# Bonferroni level 0.05/5: s = 0.96 / (z_0.99 + z_power) = 0.435 / 0.32).
S_PER_ROOT_N = 3.9
LOGPROB_TOKENS = {500: 72, 1000: 157, 3000: 473}
Z_REJECT = 2.326  # one-sided 0.01 = 0.05 / 5 tests


def _ratio(key: str) -> float:
    return next(c.effects["logprob-divergence"] for c in load_effect_sizes().classes if c.key == key)


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
        right += est.best == PRECISION_GROUPS[key]
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
