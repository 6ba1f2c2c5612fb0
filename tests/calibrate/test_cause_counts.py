"""check_targets counts the undetermined answer (QUANTIZATION_OR_SUBSTITUTION) apart from right and wrong causes."""

from __future__ import annotations

from auditor.calibration.metrics import check_targets


def _rec(profile: str, expected: str, budget: int, verdicts: dict[str, int], correct: int) -> dict:
    rej = sum(v for k, v in verdicts.items() if k not in ("PASS", "INCONCLUSIVE"))
    n = sum(verdicts.values())
    return {"profile": profile, "expected_verdict": expected, "budget_tokens": budget, "audits": n, "mix": "default",
            "design": "fixed", "rejections": rej, "rejection_rate": rej / n, "ci_low": 0.0, "ci_high": 1.0,
            "cause_correct_rate": correct / rej if rej else None, "verdicts": verdicts, "tokens": {"total": budget},
            "sampled_tokens": budget / 2}


def test_undetermined_is_neither_right_nor_wrong_and_per_target_rows_use_the_best_suite():
    recs = [
        _rec("int3", "QUANTIZATION", 300, {"QUANTIZATION": 20, "QUANTIZATION_OR_SUBSTITUTION": 70, "SUBSTITUTION": 10},
             20),
        _rec("substituted", "SUBSTITUTION", 100, {"SUBSTITUTION": 60, "QUANTIZATION_OR_SUBSTITUTION": 40}, 60),
        _rec("substituted", "SUBSTITUTION", 300, {"SUBSTITUTION": 50, "QUANTIZATION_OR_SUBSTITUTION": 50}, 50),
        # a relaxed profile named QUANTIZATION_OR_SUBSTITUTION is a wrong cause, not an undetermined one
        _rec("relaxed-threshold", "RELAXED_VERIFICATION", 300,
             {"RELAXED_VERIFICATION": 90, "QUANTIZATION_OR_SUBSTITUTION": 10}, 90),
    ]
    rows = check_targets(recs)
    suite = next(r for r in rows if r["profile"] == "all deviating profiles")
    # right 20 + 60 + 50 + 90 = 220 of 400; undetermined 70 + 40 + 50 = 160; wrong 10 + 10 = 20
    assert suite["measured"].startswith("0.550 (220/400)") and not suite["met"]
    assert "undetermined quantization-or-substitution 0.400 (160)" in suite["measured"]
    assert suite["measured"].endswith("wrong cause 0.050 (20)")
    sub = next(r for r in rows if r["profile"] == "substituted" and r["target"].startswith("cause"))
    assert sub["suite"] == "default" and sub["measured"].startswith("0.550 (110/200)")
    assert sub["measured"].endswith("wrong cause 0.000 (0)")


def test_quantization_or_relaxed_verification_is_undetermined_for_its_two_causes_only():
    """Issue 37 item 2: the second undetermined pair counts apart for quantized and relaxed profiles, and as a wrong
    cause for a substituted one."""
    recs = [
        _rec("int4", "QUANTIZATION", 300, {"QUANTIZATION": 80, "QUANTIZATION_OR_RELAXED_VERIFICATION": 20}, 80),
        _rec("greedy-relaxed", "RELAXED_VERIFICATION", 300,
             {"RELAXED_VERIFICATION": 70, "QUANTIZATION_OR_RELAXED_VERIFICATION": 30}, 70),
        _rec("substituted", "SUBSTITUTION", 300, {"SUBSTITUTION": 90, "QUANTIZATION_OR_RELAXED_VERIFICATION": 10}, 90),
    ]
    suite = next(r for r in check_targets(recs) if r["profile"] == "all deviating profiles")
    assert suite["measured"] == ("0.800 (240/300); undetermined quantization-or-relaxed-verification 0.167 (50); "
                                 "wrong cause 0.033 (10)"), suite["measured"]
