"""A fixed effect-size table for the rules-out tests, so they do not move when the calibration's
``auditor/calibration/effect_sizes.json`` is regenerated. Values in each detector's power-target
unit (``auditor.verdict.power.power_effect``), of the order the calibration measures."""

from __future__ import annotations

from auditor.verdict.rules_out import EffectSizes, parse_effect_sizes

_CLASSES = {
    "int4": ("int4 weights", "precision", {"greedy-match": 0.08, "logprob-divergence": 12.0}),
    "int8": ("int8 weights", "precision", {"greedy-match": 0.015, "logprob-divergence": 2.3}),
    "kv-fp8": ("fp8 KV cache", "precision", {"greedy-match": 0.005, "logprob-divergence": 1.3}),
    "substituted": ("a different model", "precision", {"greedy-match": 0.36, "logprob-divergence": 40.0}),
    "relaxed-threshold": ("relaxed acceptance s = 0.5", "verification",
                          {"sampling-argmax": 0.12, "self-argmax": 0.12, "sampling-tail": 0.8, "self-tail": 0.8}),
    "truncated-sampling": ("truncated sampling", "decoding", {"sampling-tail": 0.22, "self-tail": 0.22}),
}

#: What each precision class lowers (``auditor.verdict.rules_out.DeviationClass.lowers``; substitution lowers nothing).
_LOWERS = {"int4": {"weights": 4}, "int8": {"weights": 8}, "kv-fp8": {"kv_cache": 8}}


def effect_table() -> EffectSizes:
    """The test table (:class:`auditor.verdict.rules_out.EffectSizes`)."""
    return parse_effect_sizes({
        "source": "tests/effect_table.py", "model": "test", "generated": "2026-01-01T00:00:00Z",
        "classes": {k: {"label": lab, "question": q, "profile": k, "effects": e, **({"lowers": _LOWERS[k]} if k in _LOWERS else {})}
                    for k, (lab, q, e) in _CLASSES.items()},
    }, "tests/effect_table.py")
