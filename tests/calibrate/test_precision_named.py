"""Calibration cells count whether a rejection's report names the precision class the profile serves (issue 36:
"the report's precision estimate names the right class in >= 90% of rejections")."""

from __future__ import annotations

import json
import math
from pathlib import Path

from auditor.calibration import merge_outputs, write_record_files
from auditor.calibration.draws import AuditOutcome, verdict_estimate
from auditor.calibration.metrics import clopper_pearson, precision_named
from auditor.check.reference_setup import card_fields
from auditor.detectors.base import DetectorResult
from auditor.report.common import AuditReport
from auditor.verdict.kinds import Verdict
from auditor.verdict.precision_estimate import card_classes, profile_precision
from auditor.verdict.rules_out import load_effect_sizes
from probes.model_card import card_for_reference

DOCS = Path(__file__).resolve().parents[2] / "docs"
FP8_CARD = "smollm2-135m-instruct+fp8"


def _card() -> dict:
    """The calibration's ``card`` argument under the bundled FP8 card (``auditor.calibration.benchmark``)."""
    return {"model": FP8_CARD, **card_fields(card_for_reference(FP8_CARD), None)}


def _outcome(verdict: str, estimate: str | None, truth: str | None, key: str | None = None) -> AuditOutcome:
    return AuditOutcome(budget=300, verdict=verdict, rule="", rejected=[], ran=[], tokens={}, reused=False,
                        estimate=estimate, estimate_class=key if estimate is not None else None, true_precision=truth)


def test_profile_precision_is_the_tables_class_below_the_card() -> None:
    table = load_effect_sizes()
    c = _card()
    under = card_classes(table, c["card_bits"], model=FP8_CARD, recipe=c["card_recipe"])
    got = profile_precision("native-fp8-int4", card_bits=c["card_bits"], model=FP8_CARD, recipe=c["card_recipe"])
    assert got is not None and got[0] == "int4"
    assert got[1] == next(g for k, _, g, _, _ in under.classes if k == "int4")  # what an estimate's best would say
    kv = profile_precision("kv-fp8")
    assert kv is not None and kv[0] == "kv-fp8" and "8-bit" in kv[1] and "KV cache" in kv[1]
    assert profile_precision("int4") == ("int4", "4-bit weights")
    for none in ("honest-fp32", "relaxed-threshold", "substituted"):  # no precision class to name
        assert profile_precision(none) is None
    # a profile measured under a card is no class of the float32 reference, and the float32 one none of the card's
    assert profile_precision("native-fp8-int4") is None
    assert profile_precision("int4", card_bits=c["card_bits"], model=FP8_CARD, recipe=c["card_recipe"]) is None


def test_named_counts_rejections_whose_estimate_is_the_profiles_class() -> None:
    truth = "8-bit KV cache"
    outs = ([_outcome("QUANTIZATION", truth, truth, "kv-fp8")] * 3
            + [_outcome("QUANTIZATION", "4-bit weights", truth, "int4")]
            + [_outcome("SUBSTITUTION", None, truth)]  # a rejection without an estimate is not named
            + [_outcome("PASS", "the card's native precision", truth, "native")] * 4  # not rejections
            + [_outcome("INCONCLUSIVE", None, truth)])
    got = precision_named(outs)
    assert got is not None
    assert (got["class"], got["named"], got["rejections"], got["estimated"]) == (truth, 3, 5, 4)
    assert math.isclose(got["rate"], 3 / 5)
    assert (got["ci_low"], got["ci_high"]) == clopper_pearson(3, 5)
    assert got["instead"] == {"4-bit weights": 1, "none": 1}
    assert got["nearest"] == {"kv-fp8": 3, "int4": 1}
    # no rejection: counted, no rate
    quiet = precision_named([_outcome("PASS", "x", truth)] * 2)
    assert quiet is not None and quiet["rejections"] == 0 and quiet["rate"] is None
    # a profile without a class (honest, verification): no count at all
    assert precision_named([_outcome("QUANTIZATION", "4-bit weights", None)]) is None


def _verdict(kind: str, ratio: float, se: float) -> tuple[Verdict, dict]:
    det = {"name": "logprob-divergence", "ran": True, "statistic": math.log(ratio) / se, "p_value": 1e-9,
           "p_adjusted": 1e-8, "effect": 1.0, "effect_ci": [0.5, 2.0], "n": 480, "reason": None,
           "evidence": [], "details": {"geometric_ratio": ratio}}
    return Verdict(kind, "logprob-divergence", {"rule": "x"}, [DetectorResult.from_dict(det)]), det


def test_verdict_estimate_is_the_reports() -> None:
    """The calibration's estimate of a verdict is the one the audit's report states, without and under a card."""
    c = _card()
    for card, ref in ((None, {"model": "smollm2-135m-instruct"}),
                      (c, {"model": FP8_CARD, "card_bits": c["card_bits"], "card_recipe": c["card_recipe"]})):
        for kind, ratio in (("QUANTIZATION", 3.0), ("QUANTIZATION", 40.0), ("QUANTIZATION_OR_SUBSTITUTION", 300.0),
                            ("PASS", 1.1)):
            v, det = _verdict(kind, ratio, 0.2)
            report = AuditReport(run_id="r", provider="p", model="m", verdict=kind, verdict_reason="x", alpha=0.05,
                                 detectors=[det], suite="precision", suite_version="1",
                                 reference={"revision": "x", "dtype": "float32", **ref})
            est = report.precision_estimate
            assert est is not None
            assert verdict_estimate(v, 0.05, card) == (est["best"], est["best_class"]), (card, kind, ratio)
    v, _ = _verdict("SUBSTITUTION", 300.0, 0.2)
    assert verdict_estimate(v, 0.05, None) == (None, None)


def test_records_without_the_count_still_merge_and_render(tmp_path: Path) -> None:
    """Records written before ``precision_named`` (the committed calibration) merge with new ones; the table shows
    the class share only where a record has it."""
    recs = json.loads((DOCS / "calibration.json").read_text(encoding="utf-8"))
    meta = {k: v for k, v in json.loads((DOCS / "calibration.meta.json").read_text(encoding="utf-8")).items()
            if k != "parts"}
    # two committed cells of one profile written before the count (int8's; kv-fp8's have it since 7 Dec 2026)
    old = [r for r in recs if r.get("design", "fixed") == "fixed" and r["profile"] == "int8"
           and "precision_named" not in r][:2]
    assert len(old) == 2 and old[0]["mix"] == old[1]["mix"]
    new = {**old[0], "precision_named": {"class": "8-bit KV cache", "named": 3, "rejections": 4, "estimated": 4,
                                         "rate": 0.75, "ci_low": clopper_pearson(3, 4)[0],
                                         "ci_high": clopper_pearson(3, 4)[1], "instead": {"4-bit weights": 1},
                                         "nearest": {"kv-fp8": 3, "int4": 1}}}
    write_record_files(old, meta, tmp_path / "a")
    write_record_files([new], meta, tmp_path / "b")
    merged, mmeta = merge_outputs([tmp_path / "a", tmp_path / "b"])
    assert len(merged) == len(old)
    by = {(r["mix"], r["budget_tokens"]): r for r in merged}
    assert by[(new["mix"], new["budget_tokens"])]["precision_named"]["named"] == 3
    paths = write_record_files(merged, mmeta, tmp_path / "out")
    md = paths["markdown"].read_text(encoding="utf-8")
    lo, hi = clopper_pearson(3, 4)
    assert f"class 75% [{100 * lo:.0f}%, {100 * hi:.0f}%] of 4" in md
    assert md.count("] of 4") == 1  # the old record's cell has no class share


def test_targets_sum_the_named_share_per_profile_and_suite() -> None:
    from auditor.calibration.metrics import check_targets

    def rec(budget: int, named: int, rej: int, mix: str = "precision") -> dict:
        return {"profile": "native-fp8-int4", "expected_verdict": "QUANTIZATION", "budget_tokens": budget, "audits": 30,
                "mix": mix, "design": "fixed", "rejections": rej, "rejection_rate": rej / 30, "ci_low": 0.0,
                "ci_high": 1.0, "cause_correct_rate": 1.0, "verdicts": {"QUANTIZATION": rej, "PASS": 30 - rej},
                "precision_named": {"class": "4-bit weights", "named": named, "rejections": rej}}

    rows = [r for r in check_targets([rec(300, 27, 30), rec(500, 26, 30), rec(500, 10, 10, "default"),
                                      {**rec(100, 0, 0), "precision_named": None}])
            if "precision estimate" in r["target"]]
    by = {r["suite"]: r for r in rows}
    assert set(by) == {"precision", "default"}
    assert by["precision"]["measured"].startswith("0.883 (53/60)") and not by["precision"]["met"]
    assert by["default"]["met"] and "4-bit weights" in by["default"]["target"]
