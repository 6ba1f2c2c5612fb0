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

