"""Pools: batched decoding and shared-prompt scoring agree with the simulator and the reference."""

from __future__ import annotations

import numpy as np


def test_score_groups_matches_score_continuations(tiny_lm):
    from auditor.calibration import score_groups
    from reference.scoring import encode_prompt, score_continuations

    prompt = encode_prompt(tiny_lm.tokenizer, [{"role": "user", "content": "Count to five."}], chat=True)
    rng = np.random.default_rng(0)
    conts = [rng.integers(100, 5000, size=n).tolist() for n in (7, 3, 0, 11)]
    got = score_groups(tiny_lm, prompt, conts, top_k=5, max_rows_tokens=15)  # forces two chunks
    ref = score_continuations(tiny_lm, [prompt] * 4, conts, top_k=5)
    for g, r, c in zip(got, ref, conts, strict=True):
        assert g["token_lp"].shape == (len(c),)
        if not c:
            continue
        np.testing.assert_allclose(g["token_lp"], r.logprobs, atol=2e-4)
        np.testing.assert_allclose(g["top_lp"], r.top_logprobs, atol=2e-4)
        assert (g["top_ids"][:, 0] == r.top_ids[:, 0]).all()


def test_batched_greedy_equals_simulator_engine(tiny_lm, mini_cfg, honest_pool):
    """At T=0 a strict profile's batched pool reproduces the simulator's speculative output exactly."""
    from auditor.calibration import build_requests
    from simulator.engine import SimulatorEngine
    from simulator.profiles import get_profile

    pool = honest_pool
    assert pool.meta["backend_t0"] == "batched"
    # honest profiles get the larger sampling pool (false-accusation estimates need it)
    assert pool.summary()["t1_items"] == 4 * mini_cfg.honest_sampling_samples
    eng = SimulatorEngine(get_profile("honest-fp32"), tiny_lm, seed=0)
    reqs = [r for r in build_requests(tiny_lm.tokenizer, mini_cfg) if r.temperature == 0]
    assert len(reqs) == pool.items_at(0.0).size or pool.item_lengths.min() == 0
    for r in reqs:
        ch = eng.generate(list(r.prompt_ids), max_tokens=r.max_tokens, temperature=0.0, seed=1, top_n=5)
        i = int(np.flatnonzero(pool.item_keys == r.key)[0])
        a, b = pool.item_offsets[i], pool.item_offsets[i + 1]
        assert pool.token_ids[a:b].tolist() == [t.token_id for t in ch.tokens]
        np.testing.assert_allclose(pool.prov_logprob[a:b], [t.logprob for t in ch.tokens], atol=2e-4)
        # the served model is the reference: its rows are the reference rows
        np.testing.assert_allclose(pool.ref_token_lp["float32"][a:b], pool.prov_logprob[a:b])


def test_pool_shapes_backends_and_roundtrip(tiny_refs, mini_cfg, get_pool, pool_cache, tmp_path):
    from auditor.calibration import (
        PROVIDER_TOP_N,
        REF_TOP_K,
        Pool,
        load_or_collect_pool,
        pool_path,
    )

    pool = get_pool("relaxed-threshold")
    assert pool_path("relaxed-threshold", tiny_refs, mini_cfg, pool_cache).is_file()
    # relaxed acceptance only changes sampling: T=1 through the engine, T=0 batched
    assert pool.meta["backend_t0"] == "batched" and pool.meta["backend_t1"] == "engine"
    s = pool.summary()
    assert s["t0_items"] == 4 and s["t1_items"] == 4 * mini_cfg.engine_sampling_samples
    N = int(pool.item_offsets[-1])
    assert pool.token_ids.shape == (N,)
    assert pool.prov_top_ids.shape == (N, PROVIDER_TOP_N)
    assert set(pool.references) == {"float32", "bfloat16"}
    for r in pool.references:
        assert pool.ref_top_ids[r].shape == (N, REF_TOP_K)
        assert np.all(pool.ref_top_lp[r] <= 1e-6)
        # the emitted token's reference logprob is finite and not above the reference top-1
        assert np.all(np.isfinite(pool.ref_token_lp[r]))
        assert np.all(pool.ref_token_lp[r] <= pool.ref_top_lp[r][:, 0] + 1e-4)
    # bf16 reference differs from fp32 but only slightly
    d = np.abs(pool.ref_token_lp["float32"] - pool.ref_token_lp["bfloat16"])
    assert d.max() > 0 and np.median(d) < 0.1
    again, cached2 = load_or_collect_pool("relaxed-threshold", tiny_refs, mini_cfg, cache_dir=pool_cache)
    assert cached2
    pool.save(tmp_path / "p.npz")
    again = Pool.load(tmp_path / "p.npz")
    for k in Pool._ARRAYS:
        np.testing.assert_array_equal(getattr(again, k), getattr(pool, k))
    np.testing.assert_array_equal(again.ref_top_lp["bfloat16"], pool.ref_top_lp["bfloat16"])
    np.testing.assert_array_equal(again.item_prompt_tokens, pool.item_prompt_tokens)


def test_quantized_pool_differs_from_reference(get_pool):
    pool = get_pool("int4")
    a = pool.items_at(0.0)
    sel = np.concatenate([np.arange(pool.item_offsets[i], pool.item_offsets[i + 1]) for i in a])
    # provider logprob of its own (greedy) token vs the reference's: int4 moves them
    diff = np.abs(pool.prov_logprob[sel] - pool.ref_token_lp["float32"][sel])
    assert diff.mean() > 1e-3


def test_batched_sampling_truncation_and_expand(tiny_lm):
    """Batched sampling applies top-k/top-p (the simulator's forced truncation) and repeats the prompt."""
    from auditor.calibration.decoding import decode_rows
    from reference.scoring import encode_prompt

    prompt = encode_prompt(tiny_lm.tokenizer, [{"role": "user", "content": "Name a colour."}], chat=True)
    rows = decode_rows(tiny_lm.model, [prompt], max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=3,
                        eos_ids=[], seeds=[1, 2, 3, 4, 5], expand=5)
    assert len(rows) == 5
    for r in rows:
        assert r["token_ids"].shape == (6,) and r["top_ids"].shape == (6, 20)
        assert all(t in top[:3] for t, top in zip(r["token_ids"], r["top_ids"], strict=True))
    # five samples of one prompt are not all identical (independent draws)
    assert len({tuple(r["token_ids"]) for r in rows}) > 1
    # the same seeds reproduce the same samples
    again = decode_rows(tiny_lm.model, [prompt], max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=3,
                         eos_ids=[], seeds=[1, 2, 3, 4, 5], expand=5)
    assert all((a["token_ids"] == b["token_ids"]).all() for a, b in zip(rows, again, strict=True))


def test_rule_backends_reproduce_the_verifiers(tiny_lm, mini_cfg, get_pool):
    """greedy-verify's sampling = the engine's tokens exactly (argmax); decode-noncompliant flips
    to the 2nd-ranked token at about its flip rate, reporting true logprobs."""
    from auditor.calibration import build_requests, collect_pool
    from simulator.engine import SimulatorEngine
    from simulator.profiles import get_profile

    gv = get_pool("greedy-verify")
    assert gv.meta["backend_t1"] == "rule" and gv.meta["backend_t0"] == "batched"
    eng = SimulatorEngine(get_profile("greedy-verify"), tiny_lm, seed=0)
    reqs = [r for r in build_requests(tiny_lm.tokenizer, mini_cfg) if r.temperature > 0][:3]
    for r in reqs:
        ch = eng.generate(list(r.prompt_ids), max_tokens=r.max_tokens, temperature=1.0, seed=r.seed)
        i = int(np.flatnonzero(gv.item_keys == r.key)[0])
        assert gv.token_ids[gv.item_offsets[i]:gv.item_offsets[i + 1]].tolist() == [t.token_id for t in ch.tokens]

    cfg = type(mini_cfg)(**{**mini_cfg.__dict__, "t0_max_tokens": 40, "max_prompts": 8})
    dn = collect_pool("decode-noncompliant", tiny_lm, cfg)
    assert dn.meta["backend_t0"] == "rule"
    sel = np.concatenate([np.arange(dn.item_offsets[i], dn.item_offsets[i + 1]) for i in dn.items_at(0.0)])
    first = dn.token_ids[sel] == dn.prov_top_ids[sel, 0]
    second = dn.token_ids[sel] == dn.prov_top_ids[sel, 1]
    assert (first | second).all()
    rate = second.mean()
    assert 0.03 < rate < 0.2, rate  # flip rate 0.10 over a few hundred positions
    # reported logprobs are the served model's own (the reference: fp32 weights)
    np.testing.assert_allclose(dn.prov_logprob[sel], dn.ref_token_lp["float32"][sel], atol=2e-4)


def test_every_lossy_verifier_is_lossy_in_its_pool(tiny_lm, mini_cfg):
    """A profile whose verifier is lossy is served through the engine (or the verifier's own rule) at the temperature
    where it is lossy, never by plain decoding: `unverified-mixed-batch` was missing from that table until 7 Dec 2026,
    so its pools were an honest provider's and its calibration cells measured 0% power. Its T=0 pool now holds
    tokens that are not the served model's argmax (the unverified ones)."""
    from auditor.calibration import backend_for, collect_pool
    from simulator.profiles import list_profiles

    for p in list_profiles():
        if p.verifier in ("strict", "relaxed-think"):  # relaxed-think is lossy in reasoning mode only (test_reasoning_pools)
            continue
        assert {backend_for(p, t) for t in (0.0, 1.0)} != {"batched"}, p.name

    cfg = type(mini_cfg)(**{**mini_cfg.__dict__, "t0_max_tokens": 40, "max_prompts": 8})
    pool = collect_pool("unverified-mixed-batch", tiny_lm, cfg)
    assert pool.meta["backend_t0"] == "engine" and pool.meta["backend_t1"] == "batched"
    sel = np.concatenate([np.arange(pool.item_offsets[i], pool.item_offsets[i + 1]) for i in pool.items_at(0.0)])
    not_argmax = pool.token_ids[sel] != pool.prov_top_ids[sel, 0]
    assert 0 < not_argmax.sum() < 0.5 * sel.size, (int(not_argmax.sum()), sel.size)
