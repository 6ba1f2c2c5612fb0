"""Resampled audits: exact budgets, the probe mix, nesting, evidence widths, metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest


def _mix(**shares):
    from auditor.calibration import AuditMix

    return AuditMix("t", shares, {"greedy": 2, "logprob": 5, "sampling": 0})


def test_default_mix_follows_the_default_suite():
    from auditor.calibration import default_mix
    from probes.suites import load_suite

    m = default_mix()
    assert math.isclose(sum(m.shares.values()), 1.0)
    suite = load_suite("default")
    sampled = sum(p.max_tokens * p.n_samples for p in suite.probes if p.mode == "sampling")
    total = sum(p.max_tokens * p.n_samples for p in suite.probes)
    assert m.shares["sampling"] == pytest.approx(sampled / total)
    assert m.top_m["logprob"] == max(p.top_logprobs or 0 for p in suite.probes if p.mode == "logprob")


def test_audit_mix_validates():
    from auditor.calibration import AuditMix

    with pytest.raises(ValueError, match="sum to"):
        AuditMix("bad", {"greedy": 0.5, "sampling": 0.2}, {})
    with pytest.raises(ValueError, match="unknown modes"):
        AuditMix("bad", {"beam": 1.0}, {})


@pytest.mark.parametrize("budget", [30, 100, 250, 600])
def test_draw_audit_charges_planned_tokens_like_plan_budget(honest_pool, budget):
    from auditor.calibration import default_mix, draw_audit

    mix = default_mix()
    d = draw_audit(honest_pool, budget, mix, np.random.default_rng(budget))
    biggest = max(v for by in mix.max_tokens.values() for v in by.values())
    assert budget - biggest < d.planned_total <= budget
    assert d.total <= d.planned_total  # continuations may end early (EOS) or be cut to max_tokens
    lens = honest_pool.item_lengths
    for i, n, mode, _ in d.items:
        w = str(honest_pool.item_workload[i])
        assert n == min(lens[i], mix.request_tokens(mode, w, 0))
    # a temperature-0 prompt is used at most once per audit (it has one answer)
    t0 = [i for i, _, m, _ in d.items if m in ("greedy", "logprob")]
    assert len(t0) == len(set(t0))
    assert all(honest_pool.item_temperature[i] == 0 for i in t0)
    assert all(honest_pool.item_temperature[i] == 1 for i, _, m, _ in d.items if m == "sampling")
    assert d.prompt_tokens > 0


def test_draw_below_smallest_request_is_an_error(honest_pool):
    from auditor.calibration import default_mix, draw_audit

    with pytest.raises(ValueError, match="smaller than the smallest request"):
        draw_audit(honest_pool, 5, default_mix(), np.random.default_rng(0))


def test_draw_follows_shares_and_moves_exhausted_t0_to_sampling(honest_pool):
    from auditor.calibration import AuditMix, draw_audit

    mt = {"greedy": {"chat": 10, "code": 10, "math": 10, "repetition": 10}, "logprob": {"chat": 10, "code": 10, "math": 10, "repetition": 10},
          "sampling": {"chat": 5, "code": 5, "math": 5, "repetition": 5}}
    mix = AuditMix("t", {"greedy": 0.25, "logprob": 0.25, "sampling": 0.5}, {"greedy": 2, "logprob": 5, "sampling": 0}, mt)
    d = draw_audit(honest_pool, 40, mix, np.random.default_rng(0))
    assert d.planned == {"greedy": 10, "logprob": 10, "sampling": 20}
    big = draw_audit(honest_pool, 400, mix, np.random.default_rng(0))
    n_t0 = honest_pool.items_at(0.0).size
    assert big.planned["greedy"] + big.planned["logprob"] == 10 * n_t0  # every T=0 prompt, once
    assert big.planned_total == 400
    assert big.reused  # the miniature pool holds fewer sampled requests than that


def test_drawer_is_nested(honest_pool):
    """A sequential audit's later looks contain every request of the earlier ones."""
    from auditor.calibration import AuditDrawer, default_mix

    dr = AuditDrawer(honest_pool, default_mix(), np.random.default_rng(3))
    prev: list = []
    for b in (60, 120, 250, 500):
        d = dr.extend_to(b)
        assert d.planned_total <= b
        assert d.items[: len(prev)] == prev
        prev = list(d.items)


def test_evidence_widths_follow_the_mix(honest_pool):
    from auditor.calibration import default_mix, draw_audit, evidence_for

    mix = default_mix()
    d = draw_audit(honest_pool, 300, mix, np.random.default_rng(1))
    b = evidence_for(honest_pool, d, mix, "bfloat16")
    assert len(b) == d.total
    listed = b.provider_listed
    modes = np.concatenate([[m] * n for _, n, m, _ in d.items])
    assert (listed[modes == "greedy"] == mix.top_m["greedy"]).all()
    assert (listed[modes == "logprob"] == mix.top_m["logprob"]).all()
    assert (listed[modes == "sampling"] == mix.top_m["sampling"]).all()
    if mix.top_m["sampling"] == 0:
        assert np.isnan(b.provider_token_logprobs[modes == "sampling"]).all()
    assert (b.temperatures[modes == "sampling"] == 1).all() and (b.temperatures[modes != "sampling"] == 0).all()
    with pytest.raises(KeyError, match="no 'float16' reference"):
        evidence_for(honest_pool, d, mix, "float16")


def test_clopper_pearson_known_values():
    from auditor.calibration import clopper_pearson

    lo, hi = clopper_pearson(0, 200)
    assert lo == 0 and hi == pytest.approx(0.01811, abs=2e-4)  # 1 - 0.025**(1/200)
    lo, hi = clopper_pearson(10, 200)
    assert lo == pytest.approx(0.02423, abs=3e-4) and hi == pytest.approx(0.09009, abs=3e-4)
    assert all(math.isnan(x) for x in clopper_pearson(0, 0))


def test_tokens_for_power_interpolates_on_log_scale():
    from auditor.calibration import tokens_for_power

    rs = [{"budget_tokens": b, "rejection_rate": y, "sampled_tokens": b / 2} for b, y in
          [(100, 0.2), (1000, 0.9), (3000, 1.0)]]
    tp = tokens_for_power(rs, 0.95)
    assert tp["grid"] == 3000
    # halfway in power between 1000 and 3000 → geometric midpoint
    assert tp["interpolated"] == pytest.approx(math.sqrt(1000 * 3000), rel=1e-6)
    assert tokens_for_power(rs, 0.1)["interpolated"] == 100
    assert tokens_for_power(rs, 0.95, unit="sampled")["grid"] == 1500
    none = tokens_for_power(rs[:2], 0.95)
    assert none["grid"] is None and none["power_at_max"] == 0.9
