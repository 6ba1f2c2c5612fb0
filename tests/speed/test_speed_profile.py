"""`auditor speed` on the simulator (loopback, the chain model of conftest.py): with and without the
n-gram drafter, the fingerprint and the TPOT ratio move together, the announced budget bounds the
spend, and the run is stored and read back."""

from __future__ import annotations

import json

import pytest

from auditor.speed import SpeedError, measure_speed, plan_speed, store_speed
from probes.config import Pricing, ProviderConfig, RateLimits

PRICING = Pricing(usd_per_1m_input=2.0, usd_per_1m_output=8.0)


def cfg(url: str, name: str = "sim", concurrency: int = 8) -> ProviderConfig:
    return ProviderConfig(name=name, base_url=url, model="sim", pricing=PRICING,
                          rate_limits=RateLimits(concurrency=concurrency))


def test_plan_states_budget_and_caps_levels():
    c = cfg("http://127.0.0.1:9/v1", concurrency=4)
    plan = plan_speed(c, workloads=["chat", "repetition"], concurrency=[1, 4, 16], max_tokens=32)
    assert plan.concurrency == (1, 4) and any("16" in n for n in plan.notes)
    assert plan.requests == 2 * 4 + 2 * 4
    assert plan.completion_tokens_max == plan.requests * 32
    assert plan.cost_usd_max == pytest.approx(PRICING.cost_usd(plan.prompt_tokens_est, plan.completion_tokens_max))
    small = plan_speed(c, workloads=["chat"], concurrency=[1], max_tokens=32, budget_tokens=plan.budget_tokens // 4)
    assert small.budget_tokens <= plan.budget_tokens // 4 and small.requests >= 2
    with pytest.raises(SpeedError, match="budget_tokens"):
        plan_speed(c, workloads=["chat"], concurrency=[4], max_tokens=32, budget_tokens=10)
    with pytest.raises(SpeedError, match="workloads"):
        plan_speed(c, workloads=["poetry"])
    with pytest.raises(SpeedError, match="max_tokens"):
        plan_speed(c, max_tokens=2)


def test_speed_with_and_without_drafter(sim_urls, tmp_path):
    reports = {}
    for name in ("ngram-round", "none-round"):
        c = cfg(sim_urls[name], name=name)
        plan = plan_speed(c, workloads=["repetition", "chat"], concurrency=[1, 2], requests_per_cell=2, max_tokens=24)
        rep = measure_speed(plan, c, seed=0)
        reports[name] = rep
        assert all(cell.n_ok == len(pc.probes) and cell.n_failed == 0 for cell, pc in zip(rep.cells, plan.cells, strict=True))
        # spend: completions never exceed the announced maximum; prompts within the estimate
        assert rep.completion_tokens <= plan.completion_tokens_max
        assert rep.prompt_tokens <= plan.prompt_tokens_est
        assert rep.cost_usd <= plan.cost_usd_max
        assert rep.cost_usd == pytest.approx(PRICING.cost_usd(rep.prompt_tokens, rep.completion_tokens))
        json.dumps(rep.to_dict())  # JSON-ready
    spec_on = [c.speculation for c in reports["ngram-round"].cells]
    spec_off = [c.speculation for c in reports["none-round"].cells]
    assert reports["ngram-round"].speculation["detected"] is True
    assert reports["none-round"].speculation["detected"] is False
    assert all(s["detected"] is False for s in spec_off)
    # fingerprint and TPOT move together: tokens/step with the drafter ~ TPOT ratio off/on
    for on, off in zip(reports["ngram-round"].cells, reports["none-round"].cells, strict=True):
        m = on.speculation["mean_accepted_tokens_per_step"]
        assert m > 2.0 and on.speculation["detected"] is True
        ratio = off.tpot_median_s / on.tpot_median_s
        assert ratio > 1.25, (on, off)
    run_id = store_speed(reports["ngram-round"], cfg(sim_urls["ngram-round"], "ngram-round"), f"sqlite:///{tmp_path}/a.db")
    from auditor.store import open_store
    from auditor.store import queries as q

    with open_store(f"sqlite:///{tmp_path}/a.db").session() as s:
        runs = q.list_runs(s, kind="speed")
        assert [r.id for r in runs] == [run_id]
        assert runs[0].summary["kind"] == "speed-profile" and runs[0].completion_tokens > 0
        assert runs[0].summary["speculation"]["detected"] is True
    assert spec_on


def test_cli_speed(sim_urls, tmp_path):
    from typer.testing import CliRunner

    from auditor.cli import app

    (tmp_path / "providers.toml").write_text(
        f'[providers.simx]\nbase_url = "{sim_urls["ngram-round"]}"\nmodel = "sim"\n'
        '[providers.simx.pricing]\nusd_per_1m_input = 1.0\nusd_per_1m_output = 4.0\n')
    db = f"sqlite:///{tmp_path}/cli.db"
    res = CliRunner().invoke(app, ["speed", "--provider", "simx", "--config", str(tmp_path / "providers.toml"),
                                   "--db", db, "--workloads", "repetition", "--concurrency", "1",
                                   "--requests-per-cell", "2", "--max-tokens", "16", "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["run_id"] and out["actual"]["completion_tokens"] <= out["announced"]["budget_tokens"]
    assert "plan:" in res.stderr and "$" in res.stderr
    bad = CliRunner().invoke(app, ["speed", "--provider", "simx", "--config", str(tmp_path / "providers.toml"),
                                   "--concurrency", "0"])
    assert bad.exit_code == 3 and "concurrency" in bad.output
