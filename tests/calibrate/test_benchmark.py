"""Miniature benchmark end to end (tiny model, few audits, small budgets): pipeline and output format.

Asserts that the benchmark runs and writes what the issue asks for — not the targets (those are
measured on the real model by `auditor calibrate` and reported in docs/calibration.md).
"""

from __future__ import annotations

import json

import pytest

REQUIRED = ("profile", "budget_tokens", "audits", "rejection_rate", "ci_low", "ci_high", "cause_correct_rate")
PROFILES = ["honest-fp32", "int4", "relaxed-threshold"]


@pytest.fixture(scope="module")
def mini_run(tiny_refs, mini_cfg, pool_cache):
    from auditor.calibration import default_mix, run_calibration
    from auditor.check.auto_budget import SequentialDesign

    cache = pool_cache  # pools shared with the other tests (collected once per session)
    msgs: list[str] = []
    run = run_calibration(
        PROFILES, budgets=[60, 150], audits=4, ref_lms=tiny_refs, pool_cfg=mini_cfg, cache_dir=cache,
        sequential=SequentialDesign((60, 150), spending="pocock"), sequential_audits=3, progress=msgs.append,
        mix=[default_mix(), default_mix("precision")],
        floor_kwargs={"n_prompts": 4, "max_new_tokens": 8},
    )
    return run, cache, msgs


def test_records_have_the_required_fields(mini_run):
    run, _, msgs = mini_run
    recs = run.to_json_list()
    fixed = [r for r in recs if r["design"] == "fixed"]
    seq = [r for r in recs if r["design"] == "sequential"]
    assert len(fixed) == len(PROFILES) * 2 * 2 and len(seq) == len(PROFILES)  # 2 budgets × 2 suites
    assert {r["mix"] for r in fixed} == {"default", "precision"}
    assert all(r["extra"]["suite_max_tokens"] > 0 for r in fixed)
    for r in recs:
        for k in REQUIRED:
            assert k in r, k
        assert 0 <= r["ci_low"] <= r["rejection_rate"] <= r["ci_high"] <= 1
        assert r["audits"] >= 3
    for r in fixed:
        assert r["rejections"] == sum(v for k, v in r["verdicts"].items() if k not in ("PASS", "INCONCLUSIVE"))
        assert sum(r["verdicts"].values()) == r["audits"]
        assert r["planned_tokens"] <= r["budget_tokens"]
        assert r["completion_tokens"] <= r["planned_tokens"]
        assert "greedy-match" in r["detectors"]
        if r["budget_tokens"] == 150 and r["mix"] == "default":
            assert r["detectors"]["sampling-argmax"]["ran"] > 0
        if r["mix"] == "precision":  # temperature 0 only: no sampled tokens, no sampling test
            assert r["sampled_tokens"] == 0 and not r["detectors"].get("sampling-argmax", {}).get("ran")
        if r["profile"] == "honest-fp32":
            assert r["cause_correct_rate"] is None and r["honest"]
    for r in seq:
        assert r["mean_tokens"] <= r["max_tokens"] and 0 <= r["tokens_saved"] <= 1
    assert run.meta["pools"]["relaxed-threshold"]["backend_t1"] == "engine"
    assert run.meta["timings"]["total_s"] > 0
    assert any("pool ready" in m for m in msgs)


def test_pools_are_cached(mini_run, tiny_refs, mini_cfg):
    from auditor.calibration import load_or_collect_pool

    _, cache, _ = mini_run
    pool, cached = load_or_collect_pool("int4", tiny_refs, mini_cfg, cache_dir=cache)
    assert cached and pool.profile == "int4"


def test_outputs_json_markdown_png(mini_run, tmp_path):
    from auditor.calibration import write_outputs

    run, _, _ = mini_run
    paths = write_outputs(run, tmp_path / "docs")
    data = json.loads(paths["json"].read_text())
    assert isinstance(data, list) and all(isinstance(r, dict) for r in data)
    assert {r["profile"] for r in data} == set(PROFILES)
    md = paths["markdown"].read_text()
    assert "| profile | expected |" in md and "calibration.png" in md
    for p in PROFILES:
        assert f"`{p}`" in md
    assert "Sequential audits" in md
    assert "### Suite `default` (primary)" in md and "### Suite `precision`" in md
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = json.loads(paths["meta"].read_text())
    assert meta["budgets"] == [60, 150] and meta["noise_floor"]["model"]
    # hand-written analysis below the marker survives a re-run
    paths["markdown"].write_text(paths["markdown"].read_text() + "\nMy analysis of int8.\n")
    write_outputs(run, tmp_path / "docs")
    again = paths["markdown"].read_text()
    assert again.count("My analysis of int8.") == 1 and again.count("<!-- analysis") == 1


def test_results_are_stored_for_the_dashboard(mini_run, tmp_path):
    from auditor.calibration import load_calibration, store_results
    from auditor.store import open_store
    from auditor.store.dashboard_queries import calibration_table

    run, _, _ = mini_run
    url = f"sqlite:///{tmp_path / 'cal.db'}"
    n = store_results(run, url)
    assert n == len(run.to_json_list())
    assert store_results(run, url) == n  # re-running replaces, never duplicates
    store = open_store(url)
    with store.session() as s:
        rows = calibration_table(s)
    assert len(rows) == n
    assert {r["profile"] for r in rows} == set(PROFILES) | {f"{p} (sequential)" for p in PROFILES}
    recs, src = load_calibration(url)
    assert "database" in src and len(recs) == n
    assert {r["design"] for r in recs} == {"fixed", "sequential"}


def test_plan_answers_from_the_run(mini_run):
    from auditor.calibration import make_plan

    run, _, _ = mini_run
    recs = run.to_json_list()
    model = run.meta["model"]
    plan = make_plan(recs, model=model, target="int4", power=0.01)
    assert plan["covered"]
    other = make_plan(recs, model="some-other-model", target="int4")
    assert not other["covered"] and "does not cover" in other["message"]
