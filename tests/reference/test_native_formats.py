"""Native low-precision formats (issue 36, item 3, first part): FP8 128x128-block weights, FP8 1x128
activation tiles, INT4 group-32 weights — on the grid (idempotent), scaled per block, refused when the
block does not divide."""

from __future__ import annotations

import pytest
import torch

from reference.native import (
    fp8_block_fake_quant,
    fp8_tile_fake_quant,
    install_act_fp8_tiles,
    int4_group_fake_quant,
    make_native_weights,
)
from tests.conftest import make_tiny_model


def _w(o: int, i: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(o, i, generator=g) * 0.05


def test_fp8_block_is_on_the_grid_and_per_block() -> None:
    w = _w(256, 256)
    w[:128, :128] *= 1e5  # one loud block must not coarsen the others (a per-tensor scale would)
    q = fp8_block_fake_quant(w, (128, 128))
    assert torch.equal(fp8_block_fake_quant(q, (128, 128)), q)  # idempotent: exact reference
    rel = lambda a, b: float((a - b).norm() / b.norm())
    assert rel(q[128:, 128:], w[128:, 128:]) < 0.05  # e4m3: 3 mantissa bits, ~2-3% error
    per_tensor = torch.clamp(w / (w.abs().max() / 448), -448, 448).to(torch.float8_e4m3fn).float() * (w.abs().max() / 448)
    assert rel(q[128:, 128:], w[128:, 128:]) < rel(per_tensor[128:, 128:], w[128:, 128:]) / 3
    with pytest.raises(ValueError, match=r"block 128x128 does not divide the weight shape \[192, 576\]"):
        fp8_block_fake_quant(_w(192, 576), (128, 128))


def test_fp8_activation_tiles_and_int4_groups() -> None:
    x = torch.randn(3, 5, 256)
    x[..., :128] *= 1e3
    y = fp8_tile_fake_quant(x, 128)
    assert y.shape == x.shape and torch.equal(fp8_tile_fake_quant(y, 128), y)
    assert float((y[..., 128:] - x[..., 128:]).norm() / x[..., 128:].norm()) < 0.05
    with pytest.raises(ValueError, match="tile 128 does not divide the input dimension 576"):
        fp8_tile_fake_quant(torch.randn(2, 576), 128)
    w = _w(64, 128)
    q = int4_group_fake_quant(w, 32)
    assert torch.equal(int4_group_fake_quant(q, 32), q)
    levels = (q.reshape(64, 4, 32) / (q.reshape(64, 4, 32).abs().amax(-1, keepdim=True) / 7)).round()
    assert levels.min() >= -8 and levels.max() <= 7 and len(torch.unique(levels)) <= 16
    assert 0.05 < float((q - w).norm() / w.norm()) < 0.3  # 4 bits: a visible error
    with pytest.raises(ValueError, match="group 32 does not divide"):
        int4_group_fake_quant(_w(8, 48), 32)


def test_native_variant_of_a_model() -> None:
    m = make_tiny_model(hidden_size=64)
    ids = torch.tensor([[1, 5, 9, 200, 3000]])
    with torch.no_grad():
        before = m(ids).logits
    with pytest.raises(ValueError, match="does not divide"):
        make_native_weights(m, "fp8-block", block=(128, 128))  # hidden 64: refused, nothing changed
    with torch.no_grad():
        assert torch.equal(m(ids).logits, before)
    assert make_native_weights(m, "fp8-block", block=(32, 32)) == 14
    w = m.model.layers[0].mlp.up_proj.weight.data.clone()
    make_native_weights(m, "fp8-block", block=(32, 32))
    assert torch.equal(m.model.layers[0].mlp.up_proj.weight.data, w)  # a native variant re-made is identical
    assert install_act_fp8_tiles(m, 32) == 14
    with torch.no_grad():
        after = m(ids).logits
    assert not torch.equal(after, before) and torch.isfinite(after).all()
    with pytest.raises(ValueError, match="unknown native format"):
        make_native_weights(m, "mxfp4")



def test_fp4_e2m1_rounds_to_the_nearest_value_ties_to_even() -> None:
    """FP4 E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; a tie goes to the even mantissa (0, 1, 2, 4, 6: 0.25 → 0,
    0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4); beyond 6 saturates."""
    from reference.native import FP4_E2M1_GRID, fp4_e2m1_round

    x = torch.tensor([0.0, 0.2, 0.25, 0.3, 0.75, 1.25, 1.3, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, 7.0, 100.0])
    want = torch.tensor([0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0, 6.0])
    assert torch.equal(fp4_e2m1_round(x), want)
    assert torch.equal(fp4_e2m1_round(-x), -want)
    g = torch.tensor(FP4_E2M1_GRID)
    assert torch.equal(fp4_e2m1_round(g), g)  # the grid is its own rounding


def test_nvfp4_two_level_scales_and_blocks_of_16() -> None:
    """NVFP4 (NVIDIA's 'Introducing NVFP4' / ModelOpt): every block of 16 decodes as e2m1 x e4m3 x fp32, the
    largest value of the tensor is kept exactly, one loud block does not coarsen the others (per-block scales),
    and a last dimension 16 does not divide is refused."""
    from reference.native import FP4_E2M1_GRID, FP8_E4M3_MAX, nvfp4_fake_quant, nvfp4_tensor_scale

    w = _w(64, 128)
    w[0, :16] *= 50.0  # one loud block
    q = nvfp4_fake_quant(w)
    ts = nvfp4_tensor_scale(w.abs().max())
    assert float(ts) == pytest.approx(float(w.abs().max()) / (FP8_E4M3_MAX * 6.0))
    assert float(q.abs().max()) == pytest.approx(float(w.abs().max()), rel=1e-6)  # the amax block: scale 448 exactly
    grid = torch.tensor(FP4_E2M1_GRID)
    for r, c in ((0, 0), (5, 3), (63, 7)):  # each block: e2m1 values times one e4m3 scale times the tensor scale
        blk, src = q[r, 16 * c:16 * (c + 1)], w[r, 16 * c:16 * (c + 1)]
        dec = (src.abs().max() / 6.0 / ts).to(torch.float8_e4m3fn).float() * ts
        vals = (blk / dec).abs()
        assert torch.allclose(vals, grid[(vals[:, None] - grid).abs().argmin(-1)], atol=1e-5)
    rel = lambda a, b: float((a - b).norm() / b.norm())
    quiet = slice(1, None)
    assert rel(q[quiet], w[quiet]) < 0.15  # 4-bit values with a scale per 16: ~10% error, not swamped by the loud block
    assert rel(q[quiet], w[quiet]) > 0.01
    # activations: a fixed (calibrated) tensor scale; values beyond its range saturate at 6 x 448 x scale
    a = torch.randn(3, 5, 32)
    qa = nvfp4_fake_quant(a, tensor_scale=float(a.abs().max()) / (448 * 6) / 4)
    assert qa.shape == a.shape and float(qa.abs().max()) <= float(a.abs().max()) / 4 + 1e-6
    with pytest.raises(ValueError, match="NVFP4 block 16 does not divide the input dimension 24"):
        nvfp4_fake_quant(torch.randn(4, 24))


def test_nvfp4_w4a4_profile_quantizes_weights_and_activations(tiny_lm) -> None:
    """The simulator's ``native-fp8-nvfp4`` profile (issue 36 item 3: NVFP4-like W4A4 of the FP8 model): weights
    through NVFP4, every decoder linear's input through NVFP4 with its calibrated tensor scale; it moves the
    distribution more than the FP8 activation tiles of honest native-FP8 serving."""
    from reference.native import iter_decoder_linears, nvfp4_fake_quant
    from simulator.profiles import get_profile
    from simulator.served_model import build_served_model

    p = get_profile("native-fp8-nvfp4")
    assert p.expected_verdict == "QUANTIZATION" and p.weight_quant == "nvfp4" and p.act_quant == "nvfp4"
    slm, info = build_served_model(p, tiny_lm)
    assert info.quant["scheme"] == "nvfp4" and info.quant["act_quant"] == "nvfp4-e2m1-e4m3x16"
    assert info.quant["act_quant_linears"] == 14 and all(s > 0 for s in info.quant["act_tensor_scales"].values())
    w_ref = dict(iter_decoder_linears(tiny_lm.model))
    for name, lin in iter_decoder_linears(slm.model.inner):
        assert torch.equal(lin.weight, nvfp4_fake_quant(w_ref[name].weight.float()))
    ids = torch.tensor([tiny_lm.tokenizer.encode("Once upon a time there was a small village by the sea.")])
    fp8, _ = build_served_model(get_profile("native-fp8"), tiny_lm)
    with torch.no_grad():
        ref = torch.log_softmax(tiny_lm.model(input_ids=ids).logits[0].double(), -1)
        lp4 = torch.log_softmax(slm.model(input_ids=ids, use_cache=False).logits[0].double(), -1)
        lp8 = torch.log_softmax(fp8.model(input_ids=ids, use_cache=False).logits[0].double(), -1)
    kl = lambda p, q: float((p.exp() * (p - q)).sum(-1).mean())
    assert 0 < kl(ref, lp8) < kl(ref, lp4)
