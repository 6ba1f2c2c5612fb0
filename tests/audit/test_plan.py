"""Budget planning: the suite cut to --budget-tokens keeps its mix of modes and its run keys."""

from __future__ import annotations

from collections import Counter

import pytest

from auditor.check.errors import AuditError
from auditor.check.planning import plan_budget
from probes.suites import load_suite


def test_no_budget_or_large_budget_keeps_the_suite() -> None:
    s = load_suite("default")
    assert plan_budget(s, None) is s
    assert plan_budget(s, 10**6) is s


@pytest.mark.parametrize("budget", [150, 300, 600, 1000])
def test_budget_caps_planned_tokens_and_keeps_the_mix(budget: int) -> None:
    s = load_suite("default")
    p = plan_budget(s, budget)
    assert p.name == s.name and p.version == s.version
    assert p.max_completion_tokens() <= budget
    assert p.max_completion_tokens() > budget - max(q.max_tokens for q in s.probes)  # no large waste
    by_mode = Counter()
    for q in p.probes:
        by_mode[q.mode] += q.max_tokens * q.n_samples
    if budget >= 300:
        assert set(by_mode) == {"greedy", "logprob", "sampling"}
        full = Counter()
        for q in s.probes:
            full[q.mode] += q.max_tokens * q.n_samples
        for m in by_mode:  # each mode gets about its share of the suite (one request of slack)
            assert abs(by_mode[m] / p.max_completion_tokens() - full[m] / s.max_completion_tokens()) < 0.2
    keys = {k for q in p.probes for k in q.sample_keys()}
    full_keys = {k for q in s.probes for k in q.sample_keys()}
    assert keys <= full_keys  # same run keys as the whole suite, samples contiguous from #0
    assert plan_budget(s, budget) == p  # deterministic


def test_sampling_budget_spreads_over_prompts() -> None:
    p = plan_budget(load_suite("default"), 600)
    samp = [q for q in p.probes if q.mode == "sampling"]
    assert len(samp) >= 4 and max(q.n_samples for q in samp) - min(q.n_samples for q in samp) <= 1


def test_budget_below_the_smallest_request_is_an_error() -> None:
    with pytest.raises(AuditError, match="budget_tokens=5 is smaller"):
        plan_budget(load_suite("default"), 5)
