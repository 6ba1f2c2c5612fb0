"""SimulatorEngine on tiny models: honest decoding, logprobs, bytes, stop, each profile's mechanism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.scoring import score_continuations
from reference.speculative import autoregressive_generate
from simulator.engine import SimulatorEngine, build_vocab_bytes, token_display
from simulator.profiles import get_profile

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def honest(tiny_lm):
    return SimulatorEngine(get_profile("honest-fp32"), tiny_lm, seed=0)


def test_token_bytes_reproduce_text(tiny_lm):
    tok = tiny_lm.tokenizer
    vb = build_vocab_bytes(tok)
    text = "Café, 日本語 and emoji 🙂 — done.\n\ttabs"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert b"".join(vb[i] for i in ids) == text.encode("utf-8")
    assert vb[2] == b"<|im_end|>"
    assert token_display(b"\xc3") == "\\xc3" and token_display("é".encode()) == "é"


def test_honest_greedy_equals_reference_and_logprobs_are_teacher_forced(honest, tiny_lm):
    ids = honest.encode_text(PROMPT)
    res = honest.generate(ids, max_tokens=12, temperature=0.0, top_n=5)
    ref = autoregressive_generate(tiny_lm, ids, max_new_tokens=12, temperature=0.0, eos_token_ids=honest.eos_ids)
    assert [t.token_id for t in res.tokens] == ref.token_ids
    assert sum(res.chunks) == len(res.tokens)
    sc = score_continuations(tiny_lm, [ids], [ref.token_ids], top_k=5)[0]
    np.testing.assert_allclose([t.logprob for t in res.tokens], sc.logprobs, atol=1e-4)
    assert [t.top_ids for t in res.tokens] == sc.top_ids.tolist()
    assert all(t.top_ids[0] == t.token_id for t in res.tokens)  # greedy = reported top-1


def test_seeds_are_reproducible_and_distinct(honest):
    ids = honest.encode_text(PROMPT)
    a = honest.generate(ids, max_tokens=8, temperature=1.0, seed=11)
    b = honest.generate(ids, max_tokens=8, temperature=1.0, seed=11)
    c = honest.generate(ids, max_tokens=8, temperature=1.0, seed=12)
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
    assert [t.token_id for t in a.tokens] != [t.token_id for t in c.tokens]


def test_rounds_are_delivered_as_bursts(tiny_lm):
    """With a drafter that proposes the target's own greedy continuation, rounds carry k+1 tokens."""
    from reference.drafters import SequenceDrafter

    eng = SimulatorEngine(get_profile("honest-fp32"), tiny_lm, k=4, adaptive_k=False)
    ids = eng.encode_text(PROMPT)
    first = eng.generate(ids, max_tokens=11, temperature=0.0)
    eng.drafter = SequenceDrafter(ids + [t.token_id for t in first.tokens])
    chunks = []
    res = eng.generate(ids, max_tokens=11, temperature=0.0, on_chunk=lambda part: chunks.append(len(part)))
    assert [t.token_id for t in res.tokens] == [t.token_id for t in first.tokens]
    assert chunks == res.chunks and sum(chunks) == 11
    assert chunks.count(5) == 2  # two full rounds of k drafts + 1 token, each one chunk


def test_stop_string_truncates_output(honest):
    ids = honest.encode_text(PROMPT)
    full = honest.generate(ids, max_tokens=12, temperature=0.0)
    toks = [t.token_id for t in full.tokens]
    stop_text = honest.text_of(toks[5:7])
    res = honest.generate(ids, max_tokens=12, temperature=0.0, stop=[stop_text])
    assert res.finish_reason == "stop"
    assert stop_text not in res.text
    assert full.text.startswith(res.text) and len(res.tokens) <= 5


def test_relaxed_threshold_overemits_argmax_but_reports_true_logprobs(peaked_lm):
    """Positions with p(argmax) in [0.5, 0.9]: argmax emitted far more often than p(argmax)."""
    out = {}
    for name in ("honest-fp32", "relaxed-threshold"):
        eng = SimulatorEngine(get_profile(name), peaked_lm, drafter="none")
        ids = eng.encode_text(PROMPT)
        hits, pmax = [], []
        for s in range(3):
            res = eng.generate(ids, max_tokens=60, temperature=1.0, seed=100 + s, top_n=1)
            for t in res.tokens:
                p = float(np.exp(t.top_logprobs[0]))
                if 0.5 <= p <= 0.9:
                    hits.append(t.token_id == t.top_ids[0])
                    pmax.append(p)
        out[name] = (np.mean(hits), np.mean(pmax), len(hits))
    freq, mean_p, n = out["relaxed-threshold"]
    assert n >= 60
    assert freq - mean_p > 0.12, out  # expected ~p(2-p) - p = p(1-p) ~ 0.2
    freq_h, mean_h, n_h = out["honest-fp32"]
    assert abs(freq_h - mean_h) < 3.5 * np.sqrt(mean_h * (1 - mean_h) / n_h), out


def test_greedy_verify_and_decode_noncompliant(peaked_lm):
    gv = SimulatorEngine(get_profile("greedy-verify"), peaked_lm)
    ids = gv.encode_text(PROMPT)
    res = gv.generate(ids, max_tokens=15, temperature=1.0, top_n=1, seed=3)
    assert all(t.token_id == t.top_ids[0] for t in res.tokens)

    nc = SimulatorEngine(get_profile("decode-noncompliant", greedy_flip_rate=0.3), peaked_lm)
    res = nc.generate(ids, max_tokens=30, temperature=0.0, top_n=2, seed=4)
    flips = [t.token_id != t.top_ids[0] for t in res.tokens]
    assert 0 < sum(flips) < len(flips)
    assert all(t.token_id in t.top_ids[:2] for t in res.tokens)
    # reported logprobs are the true model's at the served prefix
    sc = score_continuations(peaked_lm, [ids], [[t.token_id for t in res.tokens]], top_k=2)[0]
    np.testing.assert_allclose([t.logprob for t in res.tokens], sc.logprobs, atol=1e-4)


def test_truncated_sampling_never_emits_the_tail(peaked_lm):
    eng = SimulatorEngine(get_profile("truncated-sampling"), peaked_lm)
    assert eng.effective_sampling(1.0, 1.0, 0)["top_p"] == 0.8
    assert eng.effective_sampling(0.0, 1.0, 0)["top_p"] == 1.0
    ids = eng.encode_text(PROMPT)
    res = eng.generate(ids, max_tokens=20, temperature=1.0, top_n=20, seed=5)
    for t in res.tokens:
        probs = np.exp(t.top_logprobs)
        rank = t.top_ids.index(t.token_id)
        assert probs[:rank].sum() < 0.8 + 1e-6  # inside the 0.8 nucleus of the reported (raw) p


def test_noisy_bf16_substituted_and_int4_change_p_as_designed(tiny_lm):
    ids = tiny_lm.tokenizer(PROMPT)["input_ids"]
    cont = autoregressive_generate(tiny_lm, ids, max_new_tokens=8, temperature=0.0).token_ids

    def lp(engine, nonce=0):
        m = engine.served.model
        m.nonce = nonce
        with torch.inference_mode():
            logits = m(input_ids=torch.tensor([ids + cont]), use_cache=False).logits[0, len(ids) - 1 : -1]
        return torch.log_softmax(logits.double(), -1)

    ref = lp(SimulatorEngine(get_profile("honest-fp32"), tiny_lm))

    def kl(x):
        return float((ref.exp() * (ref - x)).sum(-1).mean())

    noisy = SimulatorEngine(get_profile("honest-noisy"), tiny_lm)
    a, b, c = lp(noisy, 1), lp(noisy, 1), lp(noisy, 2)
    assert torch.equal(a, b) and not torch.equal(a, c)  # seeded per (request nonce, position)
    bf16 = SimulatorEngine(get_profile("honest-bf16"), tiny_lm)
    assert bf16.served.model.dtype == torch.bfloat16
    int4 = SimulatorEngine(get_profile("int4"), tiny_lm)
    assert int4.build_info.quant["scheme"] == "int4"
    sub = SimulatorEngine(get_profile("substituted"), tiny_lm)
    assert sub.build_info.layers == 1 and len(tiny_lm.model.model.layers) == 2  # caller's model intact
    k_noisy, k_bf16, k_int4, k_sub = kl(a), kl(lp(bf16)), kl(lp(int4)), kl(lp(sub))
    assert 0 < k_noisy < 0.01 and 0 < k_bf16 < 0.01
    assert k_int4 > 10 * max(k_noisy, k_bf16)
    assert k_sub > k_int4
    # the served substitute still generates (cache indexing after layer pruning)
    assert len(sub.generate(ids, max_tokens=5, temperature=0.0).tokens) == 5


def test_self_drafter_spec(tiny_lm):
    eng = SimulatorEngine(get_profile("relaxed-threshold"), tiny_lm, drafter="self:1")
    ids = eng.encode_text(PROMPT)
    res = eng.generate(ids, max_tokens=6, temperature=1.0, seed=1)
    assert len(res.tokens) == 6
    with pytest.raises(ValueError, match="drafter"):
        SimulatorEngine(get_profile("honest-fp32"), tiny_lm, drafter="bogus")


def test_generate_batch_is_generate_per_request(tiny_lm):
    """The lock-step batch serves each request as generate() does: same tokens, logprobs and top lists for a
    draft-dependent lossy verifier (relaxed-threshold at T = 1); profiles it cannot batch say why."""
    from simulator.engine import SimulatorEngine
    from simulator.profiles import get_profile

    eng = SimulatorEngine(get_profile("relaxed-threshold:0.7"), tiny_lm, seed=0)
    assert eng.batch_unsupported() is None
    prompts = [eng.encode_text(t) for t in ("one two one two one two", "a b c a b c a b", "x = [1, 2, 1, 2, 1")]
    seeds, caps = [3, 4, 5], [12, 9, 12]
    one = [eng.generate(p, max_tokens=m, temperature=1.0, seed=s, top_n=5)
           for p, m, s in zip(prompts, caps, seeds, strict=True)]
    many = eng.generate_batch(prompts, max_tokens=caps, temperature=1.0, seeds=seeds, top_n=5)
    for a, b in zip(one, many, strict=True):
        assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
        assert a.finish_reason == b.finish_reason and a.text == b.text and sum(b.chunks) == len(b.tokens)
        for x, y in zip(a.tokens, b.tokens, strict=True):
            assert x.top_ids == y.top_ids
            assert abs(x.logprob - y.logprob) < 1e-4
    noisy = SimulatorEngine(get_profile("honest-noisy"), tiny_lm, seed=0)
    assert "noise" in (noisy.batch_unsupported() or "")
    assert "mixture" in (SimulatorEngine(get_profile("mix-int4:0.1"), tiny_lm, seed=0).batch_unsupported() or "")
    with pytest.raises(ValueError, match="cannot batch"):
        noisy.generate_batch(prompts, max_tokens=caps, temperature=1.0, seeds=seeds)
