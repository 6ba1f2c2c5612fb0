"""The benchmark's prompt-lookup ceiling (benchmarks/spec_decode.py, issue 15): an oracle bound that
tells a weak draft-length policy from a workload with nothing to copy."""

from __future__ import annotations

import pytest

from benchmarks.spec_decode import lookup_ceiling
from reference.speculative import CostModel


def test_nothing_to_copy_has_no_headroom():
    prompt = list(range(50))
    out = list(range(100, 130))  # no token of the output occurs earlier
    assert lookup_ceiling(prompt, out, 8) == pytest.approx(1.0)


def test_copied_span_is_priced_by_the_cost_model():
    prompt = list(range(50))
    out = list(range(10, 40))  # a copy of the prompt: after one plain step every token can be drafted
    cost = CostModel()
    c8 = lookup_ceiling(prompt, out, 8, cost)
    # one plain step, then rounds of 8 drafts + 1 bonus token: at least 9 tokens per round_cost(8)
    assert c8 > 30 / (1 + 4 * cost.round_cost(8))
    assert c8 < 9 / cost.round_cost(8)  # never better than full rounds all the way
    assert lookup_ceiling(prompt, out, 16, cost) > c8  # longer drafts pay on a long copy
    # a dearer verify forward lowers the ceiling
    assert lookup_ceiling(prompt, out, 8, CostModel(verify_overhead=2.0)) < c8
