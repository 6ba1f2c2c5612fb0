"""`auditor plan`: the budget (and USD) for a wanted power, from calibration records."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from auditor.cli import app


def _records(model="m"):
    rows = []
    curves = {
        "honest-fp32": [0.0, 0.01, 0.02, 0.03],
        "int8": [0.1, 0.5, 0.97, 1.0],
        "int4": [0.96, 1.0, 1.0, 1.0],
        "fp8": [0.05, 0.2, 0.6, 0.9],
    }
    for p, ys in curves.items():
        for b, y in zip((100, 300, 1000, 3000), ys, strict=True):
            rows.append({
                "profile": p, "budget_tokens": b, "audits": 100, "rejection_rate": y, "ci_low": max(0, y - 0.05),
                "ci_high": min(1, y + 0.05), "cause_correct_rate": None if p.startswith("honest") else 1.0,
                "honest": p.startswith("honest"), "model": model, "design": "fixed", "sampled_tokens": b * 0.45,
                "prompt_tokens": b * 2.0, "mix": "default",
            })
    return rows


@pytest.fixture
def cal_file(tmp_path):
    p = tmp_path / "calibration.json"
    p.write_text(json.dumps(_records()))
    return p


def test_make_plan_picks_the_first_calibrated_budget_reaching_the_power():
    from auditor.calibration import make_plan
    from probes.config import Pricing

    free = make_plan(_records(), model="m", target="int8", power=0.95, pricing=Pricing())  # no prices configured
    assert free["usd"] is None and "no prices configured" in free["message"] and "$0.0000" not in free["message"]
    plan = make_plan(_records(), model="m", target="int8", power=0.95, pricing=Pricing(usd_per_1m_input=1.0, usd_per_1m_output=2.0))
    assert plan["covered"] and plan["reached"]
    assert plan["budget_tokens"] == 1000
    row = plan["rows"][0]
    assert row["estimate"] <= 1000 and row["power_at_grid"] == 0.97
    assert plan["usd"] == pytest.approx((2000 * 1.0 + 1000 * 2.0) / 1e6)
    assert "--budget-tokens 1000" in plan["command"]
    assert row["false_accusation_max"] == 0.02


def test_make_plan_any_and_unreached_and_uncovered():
    from auditor.calibration import make_plan

    any_plan = make_plan(_records(), model="m", target="any", power=0.95)
    assert not any_plan["reached"]  # fp8 never reaches 95% here
    assert "fp8" in any_plan["message"] and "never reaches" in any_plan["message"]
    # `any` is every calibrated deviation class, not a fixed list naming profiles the calibration lacks
    assert {r["profile"] for r in any_plan["rows"]} == {"int8", "int4", "fp8"}
    assert not any("not in the calibration" in n for n in any_plan["notes"])
    low = make_plan(_records(), model="m", target="any", power=0.85)
    assert low["reached"] and low["budget_tokens"] == 3000
    other = make_plan(_records(), model="other", target="int8")
    assert not other["covered"] and "does not cover model 'other'" in other["message"]
    with pytest.raises(KeyError):
        make_plan(_records(), model="m", target="int2")


def test_cli_plan_with_model_and_provider(cal_file, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["plan", "--model", "m", "--target", "int8", "--calibration", str(cal_file)])
    assert r.exit_code == 0, r.output
    assert "budget of 1,000 completion tokens" in r.output and "auditor check" in r.output
    assert "no prices configured" in r.output and "$0.0000" not in r.output  # issue 38 item 3
    cfg = tmp_path / "providers.toml"
    cfg.write_text('[providers.x]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "mm"\nreference = "m"\n\n'
                   "[providers.x.pricing]\nusd_per_1m_input = 1.0\nusd_per_1m_output = 2.0\n\n"
                   "[providers.x.capabilities]\nlogprobs = false\n")
    r = runner.invoke(app, ["plan", "--provider", "x", "--config", str(cfg), "--target", "int4", "--json",
                            "--calibration", str(cal_file)])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["budget_tokens"] == 100 and plan["usd"] == pytest.approx((200 + 200) / 1e6)
    assert any("no logprobs" in n for n in plan["notes"])
    # the printed command can be pasted as it is: it names the provider and the config file
    assert plan["command"] == f"auditor check --provider x --config {cfg} --suite default --budget-tokens 100"


def test_cli_plan_exit_codes(cal_file):
    runner = CliRunner()
    r = runner.invoke(app, ["plan", "--model", "nope", "--calibration", str(cal_file)])
    assert r.exit_code == 2 and "does not cover" in r.output
    r = runner.invoke(app, ["plan", "--model", "m", "--target", "fp8", "--calibration", str(cal_file)])
    assert r.exit_code == 2 and "never reaches" in r.output
    r = runner.invoke(app, ["plan", "--calibration", str(cal_file)])
    assert r.exit_code == 3 and "exactly one of" in r.output
    r = runner.invoke(app, ["plan", "--model", "m", "--target", "int2", "--calibration", str(cal_file)])
    assert r.exit_code == 3 and "--target" in r.output


def test_make_plan_chooses_the_cheapest_suite_within_what_it_can_spend():
    """With several calibrated suites the plan names the one needing the fewest tokens, and never a
    budget beyond what that suite holds (``auditor check --suite`` cannot spend more)."""
    from auditor.calibration import make_plan

    rows = _records()
    for r in rows:
        r["extra"] = {"suite_max_tokens": 1680}  # the default suite holds 1,680 tokens: 3000 is not plannable
    for b, y in zip((100, 300, 1000, 1248), (0.2, 0.96, 1.0, 1.0), strict=True):
        rows.append({**rows[0], "profile": "int8", "honest": False, "budget_tokens": b, "rejection_rate": y,
                     "mix": "precision", "extra": {"suite_max_tokens": 1248}})
    for b in (100, 300, 1000, 1248):
        rows.append({**rows[0], "budget_tokens": b, "rejection_rate": 0.01, "mix": "precision",
                     "extra": {"suite_max_tokens": 1248}})
    plan = make_plan(rows, model="m", target="int8", power=0.95)
    assert plan["reached"] and plan["suite"] == "precision" and plan["budget_tokens"] == 300
    assert plan["command"] == "auditor check --suite precision --budget-tokens 300"
    assert any("'default'" in n and "1,000 tokens" in n for n in plan["notes"])
    # fp8 reaches 0.9 only at 3000 tokens of the default mix, which the default suite cannot spend
    fp8 = make_plan(rows, model="m", target="fp8", power=0.85)
    assert not fp8["reached"] and "never reaches" in fp8["message"]


def test_make_plan_any_combines_suites_when_none_covers_everything():
    """`--target any` with no single suite reaching every deviation: one audit per suite needed."""
    from auditor.calibration import make_plan

    rows = [{**r, "extra": {"suite_max_tokens": 3000}} for r in _records() if r["profile"] != "fp8"]
    # a sampling-only suite reaching relaxed-threshold, which the default mix never does
    for p, ys in {"relaxed-threshold": (0.3, 0.97), "honest-fp32": (0.02, 0.03), "int8": (0.0, 0.01)}.items():
        for b, y in zip((100, 300), ys, strict=True):
            rows.append({**_records()[0], "profile": p, "honest": p.startswith("honest"), "budget_tokens": b,
                         "rejection_rate": y, "mix": "verification", "extra": {"suite_max_tokens": 3000}})
    plan = make_plan(rows, model="m", target="any", power=0.95)
    assert plan["reached"] and plan["suite"] is None
    by = {a["suite"]: a for a in plan["audits"]}
    assert set(by) == {"default", "verification"}
    assert by["default"]["budget_tokens"] == 1000 and set(by["default"]["profiles"]) == {"int8", "int4"}
    assert by["verification"]["budget_tokens"] == 300 and by["verification"]["profiles"] == ["relaxed-threshold"]
    assert plan["budget_tokens"] == 1300 and plan["command"].count("auditor check") == 2


def test_plan_without_logprobs_says_what_a_decisive_audit_needs(cal_file, tmp_path):
    """Issue 37 item 2: without the provider's top_logprobs, a near-tie rejection cannot tell quantized weights
    from a lossy greedy verifier (QUANTIZATION_OR_RELAXED_VERIFICATION); the plan says so and what decides it."""
    cfg = tmp_path / "providers.toml"
    cfg.write_text('[providers.x]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "mm"\nreference = "m"\n\n'
                   "[providers.x.capabilities]\nlogprobs = false\n")
    r = CliRunner().invoke(app, ["plan", "--provider", "x", "--config", str(cfg), "--target", "int4",
                                 "--calibration", str(cal_file)])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "QUANTIZATION_OR_RELAXED_VERIFICATION" in out
    assert "capabilities.logprobs = true" in out and "--suite verification" in out
    r = CliRunner().invoke(app, ["plan", "--model", "m", "--target", "int4", "--calibration", str(cal_file)])
    assert "QUANTIZATION_OR_RELAXED_VERIFICATION" not in r.output  # no provider named: nothing to warn about


def test_plan_any_covers_every_calibrated_class_of_the_shipped_calibration():
    """Issue 37 item 4: `--target any` planned for 6 of the calibrated classes (int8, int4, fp8, relaxed-threshold,
    typical-acceptance, substituted) and advised precision@500 + verification@300, at which a 10% int4 mixture
    passed. It now plans for every deviation class in docs/calibration.json — mixtures, kv-fp8, w8a8,
    greedy-relaxed included — and each reaches the power at the budget of the audit planned for it."""
    from pathlib import Path

    from auditor.calibration import make_plan
    from auditor.calibration.metrics import record_suite
    from auditor.calibration.plan import target_profiles

    rows = json.loads((Path(__file__).resolve().parents[2] / "docs" / "calibration.json").read_text())
    model = "smollm2-135m-instruct"
    mine = [r for r in rows if r.get("model") == model and r.get("design", "fixed") == "fixed"]
    deviating = {r["profile"] for r in mine if r["expected_verdict"] != "PASS"}
    # `any` plans the plain-chat deviations; the reasoning-mode cells (think:PROFILE, issue 35 item 5) are the
    # `reasoning` target's (a reasoning model's audit), and neither target takes the other's
    thinking = {p for p in deviating if p.startswith("think:")}
    classes = deviating - thinking
    assert {"mix-int4:0.1", "mix-int4:0.05", "kv-fp8", "w8a8", "greedy-relaxed"} <= classes
    assert set(target_profiles("any", mine)) == classes
    assert thinking and set(target_profiles("reasoning", mine)) == thinking
    plan = make_plan(rows, model=model, target="any", power=0.95)
    assert plan["reached"], plan["message"]
    assert {r["profile"] for r in plan["rows"]} == classes
    budgets = {a["suite"]: a["budget_tokens"] for a in plan.get("audits") or []} or {plan["suite"]: plan["budget_tokens"]}
    for p in classes:  # each class reaches 95% at some audit of the plan, at or below that audit's budget
        ok = [r for r in mine if r["profile"] == p and record_suite(r) in budgets
              and r["budget_tokens"] <= budgets[record_suite(r)] and r["rejection_rate"] >= 0.95]
        assert ok, p
    mix = [r for r in mine if r["profile"] == "mix-int4:0.1" and record_suite(r) == "precision"
           and r["budget_tokens"] <= budgets.get("precision", 0)]
    assert max(r["rejection_rate"] for r in mix) >= 0.95
    reasoning = make_plan(rows, model=model, target="reasoning", power=0.95)
    assert reasoning["reached"], reasoning["message"]
    assert {r["profile"] for r in reasoning["rows"]} == thinking


def test_plan_for_a_provider_under_a_card_uses_the_cells_calibrated_under_it(tmp_path):
    """Issue 36 item 5: a provider whose card is SmolLM2's FP8 card is planned from docs/cards/smollm2-fp8 (its
    floor and effects are the card's), not from the float32 cells; a provider without a card from docs/calibration.json.
    Before, the plan always read the reference model's float32 cells."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    cfg = tmp_path / "providers.toml"
    cfg.write_text('[providers.native]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
                   'reference = "smollm2-135m-instruct+fp8"\n\n'
                   '[providers.plain]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\nreference = "smollm2-135m-instruct"\n')
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    runner = CliRunner()
    plans = {}
    for name in ("native", "plain"):
        r = runner.invoke(app, ["plan", "--provider", name, "--config", str(cfg), "--target", "any", "--json", "--db", db])
        assert r.exit_code in (0, 2), r.output
        plans[name] = json.loads(r.output)
    assert Path(plans["native"]["source"]) == docs / "cards" / "smollm2-fp8" / "calibration.json", plans["native"]["source"]
    assert {r["profile"] for r in plans["native"]["rows"]} >= {"native-fp8-int4", "native-fp8-kv-fp8"}
    assert plans["native"]["reached"], plans["native"]["message"]
    assert Path(plans["plain"]["source"]) == docs / "calibration.json"
    assert "native-fp8-int4" not in {r["profile"] for r in plans["plain"]["rows"]}
