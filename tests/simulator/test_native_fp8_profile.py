"""The simulator's native-fp8 profile (issue 36, item 3): FP8 activations per 1xT tile."""

from __future__ import annotations

import torch

from reference.native import fp8_tile_fake_quant


def test_native_fp8_profile_quantizes_activations_per_tile(tiny_lm) -> None:
    """The simulator's native-fp8 profile: FP8 e4m3 inputs per 1xT tile (T = the model's native block),
    weights as loaded; a small nonzero change of the distribution, below int4's."""
    from reference.native import iter_decoder_linears, native_block
    from simulator.profiles import get_profile
    from simulator.served_model import build_served_model

    slm, info = build_served_model(get_profile("native-fp8"), tiny_lm)
    tile = native_block(tuple(m.weight.shape) for _, m in iter_decoder_linears(tiny_lm.model))
    assert tile == 32 and info.quant["act_quant"] == "fp8-e4m3-per-1x32" and info.quant["act_quant_linears"] == 14
    w_ref = dict(iter_decoder_linears(tiny_lm.model))
    for name, lin in iter_decoder_linears(slm.model.inner):
        assert torch.equal(lin.weight, w_ref[name].weight)
    seen: list[torch.Tensor] = []
    _name, lin = next(iter(iter_decoder_linears(slm.model.inner)))
    h = lin.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach().clone()), prepend=False)
    ids = torch.tensor([tiny_lm.tokenizer.encode("Once upon a time there was a small village by the sea.")])
    with torch.no_grad():
        ref = torch.log_softmax(tiny_lm.model(input_ids=ids).logits[0].double(), -1)
        lp = torch.log_softmax(slm.model(input_ids=ids, use_cache=False).logits[0].double(), -1)
    h.remove()
    assert torch.equal(fp8_tile_fake_quant(seen[0], 32), seen[0])  # the inputs the GEMM saw are on the grid
    int4, _ = build_served_model(get_profile("int4"), tiny_lm)
    with torch.no_grad():
        lp4 = torch.log_softmax(int4.model(input_ids=ids, use_cache=False).logits[0].double(), -1)
    kl = lambda p, q: float((p.exp() * (p - q)).sum(-1).mean())
    assert 0 < kl(ref, lp) < kl(ref, lp4)


def test_below_the_card_profiles_build(tiny_lm) -> None:
    """issue 36 item 3: int4 of the FP8 model (W4A8), FP8 KV under an FP8 card, int3 of the INT4 model at its group."""
    from simulator.profiles import get_profile
    from simulator.served_model import build_served_model

    _m, w4 = build_served_model(get_profile("native-fp8-int4"), tiny_lm)
    assert w4.quant["scheme"] == "int4" and w4.quant["act_quant"] == "fp8-e4m3-per-1x32"
    _m, kv = build_served_model(get_profile("native-fp8-kv-fp8"), tiny_lm)
    assert kv.quant["kv_cache_dtype"] == "fp8_e4m3" and kv.quant["act_quant"] == "fp8-e4m3-per-1x32"
    _m, w3 = build_served_model(get_profile("native-int4-int3"), tiny_lm)
    assert w3.quant["scheme"] == "int3" and w3.quant["group_size"] == 32 and "act_quant" not in w3.quant
    assert {get_profile(n).expected_verdict for n in ("native-fp8-int4", "native-fp8-kv-fp8", "native-int4-int3")} \
        == {"QUANTIZATION"}
