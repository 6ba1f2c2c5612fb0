"""The effect-size table is refreshed from calibration records: largest powered cell, medians, derived self tests."""

from __future__ import annotations

import json
from pathlib import Path

from auditor.calibration.effects import effect_sizes_from_records, write_effect_sizes

TEMPLATE = {
    "source": "test",
    "provisional": True,
    "classes": {
        "int8": {"label": "int8 weights", "question": "precision", "profile": "int8",
                 "effects": {"greedy-match": 0.5, "logprob-divergence": 9.0}},
        "relaxed": {"label": "relaxed s = 0.5", "question": "verification", "profile": "relaxed-threshold",
                    "effects": {"sampling-argmax": 0.5, "self-argmax": 0.5}},
        "ghost": {"label": "never calibrated", "question": "precision", "profile": "nope", "effects": {"greedy-match": 0.1}},
    },
}


def _rec(profile: str, budget: int, dets: dict, suite: str = "default") -> dict:
    return {"profile": profile, "budget_tokens": budget, "mix": suite, "design": "fixed", "detectors": dets}


RECORDS = [
    _rec("int8", 300, {"logprob-divergence": {"ran": 1.0, "effect_median": 2.0}}),
    _rec("int8", 3000, {"logprob-divergence": {"ran": 1.0, "effect_median": 2.3},
                        "greedy-match": {"ran": 0.2, "effect_median": 0.9}}),
    _rec("int8", 1000, {"greedy-match": {"ran": 1.0, "effect_median": 0.012}}, "precision"),
    _rec("relaxed-threshold", 1000, {"sampling-argmax": {"ran": 1.0, "effect_median": 0.07}}),
    {**_rec("int8", 5000, {"logprob-divergence": {"ran": 1.0, "effect_median": 99.0}}), "design": "sequential"},
]


def test_effects_come_from_the_largest_cell_where_the_detector_ran() -> None:
    t = effect_sizes_from_records(RECORDS, TEMPLATE)
    int8 = t["classes"]["int8"]
    assert int8["effects"]["logprob-divergence"] == 2.3  # 3000 beats 300; the sequential row is ignored
    assert int8["effects"]["greedy-match"] == 0.012  # the 3000-token cell ran it in only 20% of audits
    assert int8["measured_in"]["greedy-match"] == "precision @ 1000 tokens"
    assert int8["label"] == "int8 weights" and int8["question"] == "precision"


def test_self_tests_take_the_reference_tests_effect_and_unmeasured_classes_stay_provisional() -> None:
    t = effect_sizes_from_records(RECORDS, TEMPLATE)
    rel = t["classes"]["relaxed"]
    assert rel["effects"] == {"sampling-argmax": 0.07, "self-argmax": 0.07}
    assert rel["derived"] == {"self-argmax": "sampling-argmax"}
    assert t["classes"]["ghost"]["effects"] == {"greedy-match": 0.1}
    assert t["provisional"] is True and t["not_measured"] == ["ghost"]
    full = effect_sizes_from_records(RECORDS, {**TEMPLATE, "classes": {k: v for k, v in TEMPLATE["classes"].items() if k != "ghost"}})
    assert "provisional" not in full and "not_measured" not in full


def test_write_refreshes_an_existing_table_only(tmp_path: Path) -> None:
    p = tmp_path / "effect_sizes.json"
    assert write_effect_sizes(RECORDS, p) is None
    p.write_text(json.dumps(TEMPLATE), encoding="utf-8")
    assert write_effect_sizes(RECORDS, p) == p
    assert json.loads(p.read_text(encoding="utf-8"))["classes"]["int8"]["effects"]["logprob-divergence"] == 2.3
