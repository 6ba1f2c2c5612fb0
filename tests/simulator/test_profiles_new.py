"""Issue-14 simulator profiles on the tiny model: each differs from honest in the intended way.

honest-fp16 (a second honest rounding), kv-fp8 (fp8 E4M3 KV cache, static per-layer scales),
w8a8 (int8 weights + int8 per-token activations), relaxed-threshold:S / typical-acceptance:EPS,
greedy-relaxed (top-2 within 0.5 nats accepted at T = 0), mix-PROFILE:F (a fraction F of requests
served by another profile).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from reference.native import FP8_E4M3_MAX, fp8_e4m3_fake_quant, iter_decoder_linears
from reference.scoring import score_continuations
from simulator.engine import SimulatorEngine
from simulator.profiles import PROFILES, get_profile, mix_selects
from simulator.quantize import int8_per_token_fake_quant
from simulator.served_model import MixtureServedModel, build_served_model
from simulator.verifiers import GreedyRelaxedVerifier, RelaxedThresholdVerifier, make_verifier

TEXT = "Once upon a time there was a small village by the sea, and every morning the fishermen went out."


def _logprobs(slm, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(slm.model(input_ids=ids, use_cache=False).logits[0].double(), -1)


def _kl(p: torch.Tensor, q: torch.Tensor) -> float:
    return float((p.exp() * (p - q)).sum(-1).mean())


@pytest.fixture(scope="module")
def ids(tiny_lm) -> torch.Tensor:
    return torch.tensor([tiny_lm.tokenizer.encode(TEXT)])


@pytest.fixture(scope="module")
def ref_lp(tiny_lm, ids) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(tiny_lm.model(input_ids=ids).logits[0].double(), -1)


def test_new_profiles_registered_and_parameterized_names_resolve():
    for n in ("honest-fp16", "kv-fp8", "w8a8", "greedy-relaxed", "relaxed-threshold:0.7",
              "relaxed-threshold:0.9", "typical-acceptance:0.03", "mix-int4:0.1", "mix-int4:0.05"):
        assert n in PROFILES
    assert get_profile("honest-fp16").honest and get_profile("honest-fp16").dtype == "float16"
    assert get_profile("relaxed-threshold:0.8").accept_threshold_single == 0.8
    assert get_profile("typical-acceptance:0.05").typical_epsilon == 0.05
    assert get_profile("greedy-relaxed:0.25").greedy_relaxed_margin == 0.25
    m = get_profile("mix-relaxed-threshold:0.7:0.2")
    assert (m.mix_with, m.mix_fraction, m.expected_verdict) == ("relaxed-threshold:0.7", 0.2, "RELAXED_VERIFICATION")
    assert get_profile("mix-int4:0.1").verifier == "strict" and get_profile("mix-int4:0.1").weight_quant is None
    with pytest.raises(KeyError, match="not a number"):
        get_profile("relaxed-threshold:abc")
    with pytest.raises(ValueError, match="must be in"):
        get_profile("mix-int4:1.5")
    with pytest.raises(KeyError, match="unknown profile"):
        get_profile("mix-nope:0.1")
    with pytest.raises(KeyError, match="parameterized forms"):
        get_profile("int4:0.3")
    with pytest.raises(ValueError, match="mixture cannot mix"):
        get_profile("mix-mix-int4:0.1:0.5")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        get_profile("kv-fp8", kv_cache_dtype="int4")


def test_honest_fp16_is_a_small_rounding_unlike_bf16(tiny_lm, ids, ref_lp):
    fp16, info = build_served_model(get_profile("honest-fp16"), tiny_lm)
    bf16, _ = build_served_model(get_profile("honest-bf16"), tiny_lm)
    assert next(fp16.model.parameters()).dtype == torch.float16 and info.dtype == "float16"
    k16, kb = _kl(ref_lp, _logprobs(fp16, ids)), _kl(ref_lp, _logprobs(bf16, ids))
    assert 0.0 < k16 < kb  # a different, finer rounding than bf16 (10 vs 7 mantissa bits)
    assert next(tiny_lm.model.parameters()).dtype == torch.float32  # caller's model untouched
    # its GEMMs accumulate in float32 (as on a GPU): the same values as native float16 linears up
    # to reduction order, i.e. far closer to them than either is to the float32 reference
    from simulator.quantize import Fp32AccumLinear

    lins = [m for m in fp16.model.modules() if isinstance(m, torch.nn.Linear)]
    assert lins and all(type(m) is Fp32AccumLinear for m in lins)
    native = SimpleNamespace(model=copy.deepcopy(tiny_lm.model).to(torch.float16))
    kn, kx = _kl(ref_lp, _logprobs(native, ids)), _kl(_logprobs(native, ids), _logprobs(fp16, ids))
    assert 0.0 < kn < kb and kx < 0.5 * kb
    eng = SimulatorEngine(get_profile("honest-fp16"), tiny_lm, seed=0)
    res = eng.generate(eng.encode_text("Hello"), max_tokens=6, temperature=0.0, top_n=2)
    assert len(res.tokens) >= 1 and all(t.top_ids[0] == t.token_id for t in res.tokens)


def test_fp8_fake_quant_is_on_grid_idempotent_and_saturating():
    torch.manual_seed(0)
    x = torch.randn(4, 64) * 3
    s = float(x.abs().max()) / FP8_E4M3_MAX
    q = fp8_e4m3_fake_quant(x, s)
    assert torch.equal(fp8_e4m3_fake_quant(q, s), q)  # a stored fp8 cache entry is re-read unchanged
    grid = (q / s).to(torch.float8_e4m3fn).to(torch.float32) * s
    assert torch.allclose(q, grid, rtol=1e-6, atol=0)
    rel = float(((q - x).abs() / x.abs().clamp_min(1e-3)).median())
    assert 0 < rel < 2 ** -3  # E4M3: 3 mantissa bits
    assert float(fp8_e4m3_fake_quant(torch.tensor([1e6]), s)) == pytest.approx(FP8_E4M3_MAX * s, rel=1e-6)


def test_kv_fp8_small_nonzero_kl_and_cache_equals_recompute(tiny_lm, ids, ref_lp):
    slm, info = build_served_model(get_profile("kv-fp8"), tiny_lm)
    assert info.quant["kv_cache_dtype"] == "fp8_e4m3" and len(info.quant["k_scales"]) == 2
    assert all(s > 0 for s in info.quant["k_scales"] + info.quant["v_scales"])
    kl = _kl(ref_lp, _logprobs(slm, ids))
    int4, _ = build_served_model(get_profile("int4"), tiny_lm)
    assert 1e-5 < kl < _kl(ref_lp, _logprobs(int4, ids))  # nonzero, below int4's
    # weights stay full precision
    w_ref = dict(iter_decoder_linears(tiny_lm.model))
    for name, lin in iter_decoder_linears(slm.model.inner):
        assert torch.equal(lin.weight, w_ref[name].weight)
    # incremental decoding (K/V read from the cache, quantized on every read) == full recompute
    eng = SimulatorEngine(get_profile("kv-fp8"), tiny_lm, seed=0)
    p = eng.encode_text("The quick brown fox")
    res = eng.generate(p, max_tokens=10, temperature=0.0, top_n=1)
    toks = [t.token_id for t in res.tokens]
    sc = score_continuations(slm, [p], [toks], top_k=1)[0]
    np.testing.assert_allclose([t.logprob for t in res.tokens], sc.logprobs, atol=2e-4)


def test_w8a8_quantizes_weights_and_per_token_activations(tiny_lm, ids, ref_lp):
    slm, info = build_served_model(get_profile("w8a8"), tiny_lm)
    assert info.quant["scheme"] == "int8" and info.quant["act_quant_linears"] == 14
    seen: list[torch.Tensor] = []
    _name, lin = next(iter(iter_decoder_linears(slm.model.inner)))
    h = lin.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach().clone()), prepend=False)
    int8, _ = build_served_model(get_profile("int8"), tiny_lm)
    lp = _logprobs(slm, ids)
    h.remove()
    x = seen[0]  # the input after the int8 pre-hook ran (hooks run in registration order)
    scale = x.abs().amax(-1, keepdim=True) / 127
    assert torch.allclose(x / scale, torch.round(x / scale), atol=1e-3)
    assert torch.equal(int8_per_token_fake_quant(x), x)
    w = lin.weight
    ws = w.abs().amax(1, keepdim=True) / 127
    assert torch.allclose(w / ws, torch.round(w / ws), atol=1e-3)
    k_w8a8, k_int8 = _kl(ref_lp, lp), _kl(ref_lp, _logprobs(int8, ids))
    assert k_w8a8 > 0 and k_w8a8 != pytest.approx(k_int8, rel=1e-3)


def test_greedy_relaxed_rule_on_constructed_distributions():
    v = GreedyRelaxedVerifier(margin=0.5)
    p = torch.tensor([0.40, 0.30, 0.20, 0.10], dtype=torch.float64)  # log(0.4/0.3) = 0.288 nats
    assert v.accepts(p, 0) and v.accepts(p, 1) and not v.accepts(p, 2)
    far = torch.tensor([0.60, 0.25, 0.15], dtype=torch.float64)  # log(0.6/0.25) = 0.875 > 0.5
    assert v.accepts(far, 0) and not v.accepts(far, 1)
    g = torch.Generator().manual_seed(0)
    r = v.verify(torch.stack([p, p]), None, torch.tensor([1]), g, greedy=True)
    assert (r.n_accepted, r.next_token) == (1, 0)
    r = v.verify(torch.stack([far, far]), None, torch.tensor([1]), g, greedy=True)
    assert (r.n_accepted, r.next_token) == (0, 0)
    # ideal fallback: the 2nd token is emitted at about p(2nd) of near-tie steps
    out = [v.verify(p[None], None, torch.zeros(0, dtype=torch.long), g, greedy=True).next_token for _ in range(2000)]
    assert set(out) <= {0, 1}
    assert stats.binomtest(sum(o == 1 for o in out), 2000, 0.30).pvalue > 1e-3
    with pytest.raises(ValueError, match="margin"):
        GreedyRelaxedVerifier(margin=-1)


def test_greedy_relaxed_engine_emits_only_near_argmax_tokens(peaked_lm):
    eng = SimulatorEngine(get_profile("greedy-relaxed"), peaked_lm, seed=0)
    honest = SimulatorEngine(get_profile("honest-fp32"), peaked_lm, seed=0)
    n_off = n = 0
    for i, prompt in enumerate(["Once upon a time", "The weather today", "In 1999 the", "def f(x):", "Dear Sir,"]):
        ids = eng.encode_text(prompt)
        res = eng.generate(ids, max_tokens=16, temperature=0.0, top_n=2, seed=i)
        for t in res.tokens:
            n += 1
            if t.token_id != t.top_ids[0]:
                n_off += 1
                assert t.token_id == t.top_ids[1] and t.top_logprobs[0] - t.top_logprobs[1] <= 0.5 + 1e-6
        h = honest.generate(ids, max_tokens=16, temperature=0.0, top_n=2, seed=i)
        assert all(t.token_id == t.top_ids[0] for t in h.tokens)
    assert n_off >= 1, f"no near-tie emitted off-argmax in {n} greedy positions"


def test_relaxed_threshold_parameter_reaches_the_verifier():
    v = make_verifier(get_profile("relaxed-threshold:0.7"))
    assert isinstance(v, RelaxedThresholdVerifier) and v.s == 0.7
    assert v.accept_probability(0.6) == pytest.approx(0.6) and v.accept_probability(0.7) == 1.0
    assert make_verifier(get_profile("typical-acceptance:0.03")).epsilon == 0.03


def test_mix_routes_fraction_f_of_requests_deterministically():
    f = 0.1
    sel = np.array([mix_selects(s, f) for s in range(5000)])
    assert stats.binomtest(int(sel.sum()), sel.size, f).pvalue > 1e-3
    assert [mix_selects(s, f) for s in range(50)] == [mix_selects(s, f) for s in range(50)]
    prof = get_profile("mix-relaxed-threshold:0.3")
    kinds = {type(make_verifier(prof, request_seed=s)).__name__: mix_selects(s, 0.3) for s in range(40)}
    assert kinds == {"StrictVerifier": False, "RelaxedThresholdVerifier": True}


def test_mix_serves_routed_requests_from_the_degraded_model(tiny_lm, ids, ref_lp):
    slm, info = build_served_model(get_profile("mix-int4:0.3"), tiny_lm)
    assert isinstance(slm.model, MixtureServedModel) and info.quant["mix_with"] == "int4"
    int4, _ = build_served_model(get_profile("int4"), tiny_lm)
    lp4 = _logprobs(int4, ids)
    routed = []
    for seed in range(30):
        slm.model.nonce = seed
        lp = _logprobs(slm, ids)
        alt = mix_selects(seed, 0.3)
        routed.append(alt)
        assert torch.allclose(lp, lp4 if alt else ref_lp, atol=1e-5)
    assert 0 < sum(routed) < 30
    eng = SimulatorEngine(get_profile("mix-int4:0.3"), tiny_lm, seed=0)
    p = eng.encode_text("Hello")
    seed = next(s for s in range(100) if mix_selects(s, 0.3))
    res = eng.generate(p, max_tokens=5, temperature=0.0, top_n=1, seed=seed)
    sc = score_continuations(int4, [p], [[t.token_id for t in res.tokens]], top_k=1)[0]
    np.testing.assert_allclose([t.logprob for t in res.tokens], sc.logprobs, atol=1e-4)
