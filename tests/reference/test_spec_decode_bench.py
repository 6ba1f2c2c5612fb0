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
    assert lookup_ceiling(prompt, out, 8, CostModel.linear(2.0, 0.08)) < c8


def test_forward_cost_table_measurement_runs(tiny_lm):
    from benchmarks.spec_decode import forward_costs

    r = forward_costs(tiny_lm, [1, 2, 5], ctx_len=8, repeats=3)
    assert set(r) == {1, 2, 5} and r[1] == 1.0 and all(v > 0 for v in r.values())


def test_suffix_warm_cache_holds_the_held_out_answers(tiny_lm):
    from benchmarks.spec_decode import warm_suffix_cache

    held = [("a", [11, 12, 13]), ("b", [21, 22, 23, 24])]
    cache = warm_suffix_cache(tiny_lm, held, k=4, max_new=6, eos=[])
    assert cache.n_outputs == 2 and len(cache) == 1 + 2 * 7  # two 6-token outputs + separators
    frozen = cache.copy()
    frozen.add([1, 2, 3])
    assert cache.n_outputs == 2  # a measured run's copy never feeds the warm cache
