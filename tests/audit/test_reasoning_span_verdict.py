"""Issue 35 item 3: span-aware near-tie reporting — the verdict names the reasoning span.

The per-span near-tie figures (``greedy-near-tie`` details ``spans``) and the verdict clause
that names the reasoning span. (An end-to-end relaxed-think audit ending RELAXED_VERIFICATION is
not reached yet on the tiny models: see the issue 35 note.)
"""

from __future__ import annotations

import numpy as np
import pytest

from auditor.detectors.near_tie import span_counts
from auditor.verdict.cause import span_clause


def test_span_counts() -> None:
    spans = np.asarray(["reasoning", "reasoning", "answer", None, "answer"], dtype=object)
    rows = np.asarray([0, 1, 2, 4])
    flip = np.asarray([True, False, False, True])
    got = span_counts(spans, rows, flip, np.asarray([0.1, 0.2, 0.3, 0.4]))
    assert got == {"reasoning": {"positions": 2, "flips": 1, "expected": pytest.approx(0.3)},
                   "answer": {"positions": 2, "flips": 1, "expected": pytest.approx(0.7)}}
    assert span_counts(None, rows, flip, np.zeros(4)) == {}


def test_span_clause() -> None:
    inside = {"reasoning": {"positions": 40, "flips": 9, "expected": 0.5}, "answer": {"positions": 30, "flips": 0, "expected": 0.4}}
    assert span_clause(inside).startswith(" inside the reasoning span (9 of 9 flips")
    both = {"reasoning": {"positions": 40, "flips": 9, "expected": 0.5}, "answer": {"positions": 30, "flips": 8, "expected": 0.4}}
    assert span_clause(both) == ""  # the answer flips too: not a reasoning-span rule
    assert span_clause(None) == "" and span_clause({"answer": {"flips": 3}}) == ""


def test_near_tie_reason_names_the_span() -> None:
    from auditor.detectors import DetectorResult
    from auditor.verdict.cause import near_tie_reason

    d = {"expected": 0.9, "band": 0.3, "spans": {"reasoning": {"positions": 40, "flips": 9, "expected": 0.5},
                                                  "answer": {"positions": 30, "flips": 0, "expected": 0.4}}}
    r = DetectorResult(name="greedy-near-tie", statistic=9.0, p_value=1e-6, effect=0.1, effect_ci=(0.0, 0.2), n=70,
                       details=d, p_adjusted=1e-5)
    assert "accepts non-argmax drafts inside the reasoning span (9 of 9 flips" in near_tie_reason(r)
    r2 = DetectorResult(name="greedy-near-tie", statistic=9.0, p_value=1e-6, effect=0.1, effect_ci=(0.0, 0.2), n=70,
                        details={k: v for k, v in d.items() if k != "spans"}, p_adjusted=1e-5)
    assert "reasoning span" not in near_tie_reason(r2)


def test_evidence_batch_carries_spans_through_subsets() -> None:
    from auditor.detectors import EvidenceBatch

    b = EvidenceBatch.from_arrays(prompt_ids=["a", "a", "b"], token_ids=[1, 2, 3], temperatures=0.0,
                                  token_spans=["reasoning", "answer", None])
    assert b.token_spans is not None and list(b.subset(np.asarray([True, False, True])).token_spans) == ["reasoning", None]
    with pytest.raises(ValueError, match="token_spans"):
        EvidenceBatch.from_arrays(prompt_ids=["a"], token_ids=[1], temperatures=0.0, token_spans=["reasoning", "answer"])


def test_span_localized_needs_the_answer_to_show_the_difference() -> None:
    from auditor.verdict.cause import span_localized

    inside = {"reasoning": {"positions": 120, "flips": 14, "expected": 0.12},
              "answer": {"positions": 80, "flips": 0, "expected": 0.08}}
    assert span_localized(inside, 0.05)
    few_answer = {**inside, "answer": {"positions": 3, "flips": 0, "expected": 0.003}}
    assert not span_localized(few_answer, 0.05)  # 3 answer positions cannot show a lower rate
    both = {**inside, "answer": {"positions": 80, "flips": 9, "expected": 0.08}}
    assert not span_localized(both, 0.05) and not span_localized(None, 0.05)


def _self_greedy(spans):
    from auditor.detectors import DetectorResult

    return DetectorResult("self-greedy", 14.0, 1e-9, 0.07, (0.04, 0.1), 200, [],
                          details={"n_clear": 14, "n_unverified": 0, "band": 0.47, "r0": 1e-3, "spans": spans})


def test_self_greedy_inside_the_reasoning_span_is_relaxed_verification() -> None:
    """Rule 1s: greedy departures from the provider's own top-1 confined to <think> name relaxed
    verification inside the reasoning span; the same departures in both spans stay rule 1."""
    from auditor.verdict.decide import decide_verdict

    inside = {"reasoning": {"positions": 120, "flips": 14, "expected": 0.12},
              "answer": {"positions": 80, "flips": 0, "expected": 0.08}}
    v = decide_verdict([_self_greedy(inside)], 0.05)
    assert v.verdict == "RELAXED_VERIFICATION" and v.details["rule"] == "1s-reasoning-span"
    assert "inside the reasoning span" in v.reason
    both = {"reasoning": {"positions": 120, "flips": 8, "expected": 0.12},
            "answer": {"positions": 80, "flips": 6, "expected": 0.08}}
    v = decide_verdict([_self_greedy(both)], 0.05)
    assert v.verdict == "DECODING_NONCOMPLIANT" and v.details["rule"] == "1-self-greedy"
