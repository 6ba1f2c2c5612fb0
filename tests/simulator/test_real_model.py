"""Simulator checks on the bundled SmolLM2-135M-Instruct (few and short)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.speculative import autoregressive_generate
from simulator.profiles import get_profile
from simulator.served_model import build_served_model
from simulator.server import create_app

pytestmark = pytest.mark.real_model

PROMPTS = ["Write a haiku about the sea.", "Why is the sky blue?", "Give three tips for writing clear emails."]


def test_honest_fp32_greedy_equals_reference_generate(real_lm, client):
    app = create_app("honest-fp32", real_lm)
    eng = app.state.sim.engine
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    r = client(app).post("/v1/chat/completions", json={"model": "smollm2-135m-instruct", "messages": msgs,
                                                     "max_tokens": 16, "temperature": 0, "logprobs": True})
    assert r.status_code == 200
    got = [bytes(t["bytes"]) for t in r.json()["choices"][0]["logprobs"]["content"]]
    ref = autoregressive_generate(real_lm, eng.encode_chat(msgs), max_new_tokens=16, temperature=0.0)
    assert got == [eng.token_bytes(t) for t in ref.token_ids]
    assert r.json()["choices"][0]["message"]["content"] == ref.text


def _tf_logprobs(model, ids, cont):
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids + cont]), use_cache=False).logits[0].double()
    return torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + len(cont)], -1)


def test_int4_kl_is_far_above_bf16(real_lm):
    from reference.scoring import encode_prompt

    tok = real_lm.tokenizer
    items = []
    for p in PROMPTS:
        ids = encode_prompt(tok, [{"role": "user", "content": p}], chat=True)
        cont = autoregressive_generate(real_lm, ids, max_new_tokens=12, temperature=0.0, eos_token_ids=[]).token_ids
        items.append((ids, cont, _tf_logprobs(real_lm.model, ids, cont)))
    kls = {}
    for name in ("honest-bf16", "int4"):
        served, _ = build_served_model(get_profile(name), real_lm, copy_model=True)
        kl = [(ref.exp() * (ref - _tf_logprobs(served.model, ids, cont))).sum(-1) for ids, cont, ref in items]
        kls[name] = float(torch.cat(kl).mean())
        del served
    assert 0 < kls["honest-bf16"] < 0.01
    assert kls["int4"] >= 10 * kls["honest-bf16"], kls


def test_relaxed_threshold_overemits_on_real_model(real_lm):
    from simulator.engine import SimulatorEngine

    eng = SimulatorEngine(get_profile("relaxed-threshold"), real_lm)
    hits, pmax = [], []
    # Two seeds per prompt: at s=0.5 the expected z is ~3.5 with one seed (n≈60 positions in the
    # band), too close to the threshold; ~130 positions put it near 5.
    runs = [(i, p, seed) for i, p in enumerate(PROMPTS) for seed in (i, 100 + i)]
    for _i, p, seed in runs:
        res = eng.generate(eng.encode_chat([{"role": "user", "content": p}]), max_tokens=64, temperature=1.0,
                           seed=seed, top_n=1)
        for t in res.tokens:
            pa = float(np.exp(t.top_logprobs[0]))
            if 0.5 <= pa <= 0.9:
                hits.append(t.token_id == t.top_ids[0])
                pmax.append(pa)
    n = len(hits)
    assert n >= 25
    z = (sum(hits) - sum(pmax)) / np.sqrt(sum(p * (1 - p) for p in pmax))
    assert z > 3, (n, np.mean(hits), np.mean(pmax), z)
