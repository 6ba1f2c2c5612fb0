"""Reasoning-mode calibration cells (issue 35 item 5): ``think:PROFILE`` pools carry span labels and stream steps,
resampled audits use the reasoning tokens as evidence, and the cells reach the targets table and ``auditor plan``."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def think_cfg():
    """A miniature pool long enough for reasoning (at most 32 tokens), the close tag and an answer at T=0."""
    from auditor.calibration import PoolConfig

    return PoolConfig(max_prompts=2, t0_max_tokens=44, sampling_samples=2, engine_sampling_samples=2,
                      honest_sampling_samples=3, sampling_max_tokens=8)


@pytest.fixture(scope="module")
def think_pool(tiny_refs, think_cfg, pool_cache):
    from auditor.calibration import load_or_collect_pool

    return load_or_collect_pool("think:honest-fp32", tiny_refs, think_cfg, cache_dir=pool_cache)[0]


def test_think_profiles_resolve_and_reject_nesting():
    from simulator.profiles import DEFAULT_REASONING_BUDGET, get_profile, reasoning_of

    p = get_profile("think:synthetic-acceptance:3")
    assert (p.name, p.verifier, p.synthetic_accept_len, p.expected_verdict) == (
        "think:synthetic-acceptance:3", "synthetic-acceptance", 3, "RELAXED_VERIFICATION")
    assert reasoning_of(p) == DEFAULT_REASONING_BUDGET and reasoning_of(get_profile("synthetic-acceptance:3")) is None
    assert get_profile("think:honest-bf16").honest and get_profile("think:honest-bf16").dtype == "bfloat16"
    for bad in ("think:mix-int4:0.1", "think:think:honest-fp32"):
        with pytest.raises(ValueError, match="think:"):
            get_profile(bad)


def test_backends_of_reasoning_profiles():
    """relaxed-think is lossy only in reasoning mode, at T=0; synthetic acceptance at every temperature."""
    from auditor.calibration import backend_for
    from simulator.profiles import get_profile

    def be(name: str) -> list[str]:
        return [backend_for(get_profile(name), t) for t in (0.0, 1.0)]

    assert be("relaxed-think") == ["batched", "batched"]
    assert be("think:relaxed-think") == ["engine", "batched"]
    assert be("think:synthetic-acceptance:3") == ["engine", "engine"]
    assert be("think:honest-fp32") == ["batched", "batched"]


def test_reasoning_pool_is_what_the_simulator_serves_and_round_trips(tiny_lm, think_cfg, think_pool, tmp_path):
    """The batched T=0 rows equal simulator.reasoning.generate_reasoning (tokens and span labels), and a saved pool
    reads back with its span labels and steps."""
    from auditor.calibration import Pool, build_requests
    from auditor.calibration.reasoning import opener_ids
    from simulator.engine import SimulatorEngine
    from simulator.profiles import DEFAULT_REASONING_BUDGET, get_profile
    from simulator.reasoning import generate_reasoning

    pool = think_pool
    assert pool.token_span is not None and pool.step_final is not None
    assert set(np.unique(pool.token_span)) == {"reasoning", "close", "answer"}
    eng = SimulatorEngine(get_profile("honest-fp32"), tiny_lm, seed=0)
    reqs = [r for r in build_requests(tiny_lm.tokenizer, think_cfg, opener=opener_ids(tiny_lm.tokenizer))
            if r.temperature == 0]
    for r in reqs:
        ch = generate_reasoning(eng, list(r.prompt_ids), max_tokens=r.max_tokens, budget=DEFAULT_REASONING_BUDGET,
                                temperature=0.0, seed=1, top_n=5)
        i = int(np.flatnonzero(pool.item_keys == r.key)[0])
        a, b = pool.item_offsets[i], pool.item_offsets[i + 1]
        assert pool.token_ids[a:b].tolist() == [t.token_id for t in ch.tokens]
        assert pool.token_span[a:b].tolist() == [t.span for t in ch.tokens]
        answer = pool.token_span[a:b] == "answer"
        np.testing.assert_allclose(pool.prov_logprob[a:b][answer], [t.logprob for t in ch.tokens if t.span == "answer"],
                                   atol=2e-4)
    path = tmp_path / "think.npz"
    pool.save(path)
    back = Pool.load(path)
    assert back.token_span is not None and back.token_span.tolist() == pool.token_span.tolist()
    assert back.step_final is not None and np.array_equal(back.step_final, pool.step_final, equal_nan=True)
    assert back.summary()["span_tokens"]["reasoning"] > back.summary()["span_tokens"]["answer"] > 0


def test_resampled_audit_uses_the_reasoning_tokens(think_pool, honest_pool, get_pool):
    """Evidence of a reasoning-mode audit: every reasoning and answer token, labelled; the close tag left out; a
    plain pool's evidence carries no spans and no steps (its cells are unchanged)."""
    from auditor.calibration import default_mix, draw_audit, evidence_for
    from auditor.calibration.draws import span_tokens

    mix = default_mix()
    d = draw_audit(think_pool, 300, mix, np.random.default_rng(3))
    ev = evidence_for(think_pool, d, mix)
    spans = span_tokens(think_pool, d)
    assert spans["reasoning"] > 0 and sum(spans.values()) == d.total
    assert ev.token_spans is not None
    labels, counts = np.unique(ev.token_spans.astype(str), return_counts=True)
    got = dict(zip(labels.tolist(), counts.tolist(), strict=True))
    assert got["reasoning"] == spans["reasoning"] and got.get("answer", 0) == spans.get("answer", 0)
    assert "close" not in got and len(ev.token_ids) == d.total - spans.get("close", 0)
    plain = evidence_for(honest_pool, draw_audit(honest_pool, 300, mix, np.random.default_rng(3)), mix)
    assert plain.token_spans is None and plain.step_final is None


def test_engine_reasoning_pool_records_stream_steps(get_pool, tiny_refs, think_cfg, pool_cache):
    """Where the simulator's engine serves the requests (relaxed-think at T=0), every position knows its streamed
    step: each chunk ends with a 1.0, the close tag is one chunk of its own."""
    from auditor.calibration import load_or_collect_pool

    pool = load_or_collect_pool("think:relaxed-think", tiny_refs, think_cfg, cache_dir=pool_cache)[0]
    assert pool.meta["backend_t0"] == "engine" and pool.meta["reasoning_budget"] == 32
    assert pool.step_final is not None and pool.token_span is not None
    for i in pool.items_at(0.0):
        a, b = pool.item_offsets[i], pool.item_offsets[i + 1]
        f, s = pool.step_final[a:b], pool.token_span[a:b]
        assert np.isfinite(f).all() and f[-1] == 1.0
        close = np.flatnonzero(s == "close")
        if close.size:
            assert f[close[-1]] == 1.0 and (f[close[:-1]] == 0.0).all() and f[close[0] - 1] == 1.0
    t1 = pool.items_at(1.0)
    assert np.isnan(pool.step_final[pool.item_offsets[t1[0]]:pool.item_offsets[t1[0] + 1]]).all()  # batched


def _rec(profile: str, budget: int, rate: float, *, honest: bool = False, reasoning: float | None = None,
         named: float | None = None, rejections: int | None = None) -> dict:
    from auditor.calibration import clopper_pearson

    n = 400 if honest else 100
    k = round(rate * n) if rejections is None else rejections
    lo, hi = clopper_pearson(k, n)
    extra = {} if reasoning is None else {"reasoning_tokens": reasoning, "span_named_rate": named,
                                          "span_tokens": {"reasoning": reasoning, "answer": budget / 10, "close": 9.0}}
    return {"profile": profile, "budget_tokens": budget, "audits": n, "rejections": k, "rejection_rate": k / n,
            "ci_low": lo, "ci_high": hi, "honest": honest, "expected_verdict": "PASS" if honest else "RELAXED_VERIFICATION",
            "cause_correct_rate": None if honest or not k else 1.0, "verdicts": {}, "mix": "default",
            "design": "fixed", "model": "m", "sampled_tokens": budget * 0.4, "prompt_tokens": 10.0, "extra": extra}


def test_reasoning_cells_reach_the_targets_and_the_plan():
    """check_targets: the think: honest cells get false-accusation rows, relaxed-think's power is read on the
    reasoning-token axis and its verdicts must name the span; auditor plan's targets: `reasoning` covers the think:
    deviations only, `any` the plain-chat ones only, each with the false accusations of its own honest cells."""
    from auditor.calibration import check_targets, make_plan, render_markdown

    rows = [
        _rec("honest-fp32", 500, 0.01, honest=True), _rec("honest-fp32", 1000, 0.02, honest=True),
        _rec("int4", 500, 0.99), _rec("int4", 1000, 1.0),
        _rec("think:honest-fp32", 500, 0.03, honest=True, reasoning=380.0),
        _rec("think:honest-fp32", 1000, 0.045, honest=True, reasoning=760.0),
        _rec("think:relaxed-think", 500, 0.80, reasoning=380.0, named=0.95),
        _rec("think:relaxed-think", 1000, 0.97, reasoning=760.0, named=0.90),
    ]
    targets = check_targets(rows)
    fa = next(r for r in targets if r["profile"] == "think:honest-fp32")
    assert fa["met"] and "max 0.045" in fa["measured"]  # 18/400, upper bound 7.0%
    power = next(r for r in targets if r["profile"] == "think:relaxed-think" and "power" in r["target"])
    # 95% between 380 (0.80) and 760 (0.97) reasoning tokens: ~700 <= 1,000, though the budget is 1,000 tokens
    assert "1000 reasoning tokens" in power["target"] and power["met"] and "700 reasoning" in power["measured"]
    named = next(r for r in targets if r["profile"] == "think:relaxed-think" and "reasoning span" in r["target"])
    assert named["met"] and named["measured"] == "0.921 (163/177)"  # round(80 x 0.95) + round(97 x 0.90)
    rows[-1]["extra"]["span_named_rate"] = 0.5
    assert not next(r for r in check_targets(rows) if "reasoning span" in r["target"])["met"]

    plan = make_plan(rows, model="m", target="reasoning")
    assert [r["profile"] for r in plan["rows"]] == ["think:relaxed-think"]
    assert plan["budget_tokens"] == 1000 and plan["rows"][0]["false_accusation_max"] == pytest.approx(0.045)
    plain = make_plan(rows, model="m", target="any")
    assert [r["profile"] for r in plain["rows"]] == ["int4"]
    assert plain["rows"][0]["false_accusation_max"] == pytest.approx(0.01)

    md = render_markdown(rows, {"model": "m"})
    assert "| `think:relaxed-think` | RELAXED_VERIFICATION |" in md  # the rate table
    assert "## Reasoning mode" in md and "| `think:relaxed-think` | default | 1,000 | 97.0% [" in md
    assert "| 760 / 100 / 9 | 50% |" in md  # reasoning / answer / close tokens, verdicts naming the span
    assert "## Reasoning mode" not in render_markdown([r for r in rows if "think" not in r["profile"]], {"model": "m"})


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reasoning_batch_is_generate_reasoning(tiny_lm, temperature):
    """simulator.reasoning.generate_reasoning_batch (the calibration's engine pools) is row by row generate_reasoning:
    the same tokens, spans and chunks, for a verifier that relaxes inside the reasoning span only."""
    from auditor.calibration import PoolConfig, build_requests
    from auditor.calibration.reasoning import opener_ids
    from simulator.engine import SimulatorEngine
    from simulator.profiles import get_profile
    from simulator.reasoning import generate_reasoning, generate_reasoning_batch

    eng = SimulatorEngine(get_profile("think:relaxed-think"), tiny_lm, seed=0)
    reqs = [r for r in build_requests(tiny_lm.tokenizer, PoolConfig(max_prompts=3), n_samples=1,
                                      opener=opener_ids(tiny_lm.tokenizer)) if r.temperature == temperature]
    caps = [40, 20, 12][: len(reqs)]  # an answer; one answer token (20 - 16 - 3); reasoning only
    got = generate_reasoning_batch(eng, [list(r.prompt_ids) for r in reqs], max_tokens=caps, budget=16,
                                   temperature=temperature, seeds=[r.seed for r in reqs], top_n=5)
    for r, cap, g in zip(reqs, caps, got, strict=True):
        one = generate_reasoning(eng, list(r.prompt_ids), max_tokens=cap, budget=16, temperature=temperature,
                                 seed=r.seed, top_n=5)
        assert [t.token_id for t in g.tokens] == [t.token_id for t in one.tokens]
        assert [t.span for t in g.tokens] == [t.span for t in one.tokens]
        assert g.chunks == one.chunks and g.text == one.text
