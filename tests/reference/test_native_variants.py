"""Native low-precision variants of a bundled model (issue 36, item 3): made once, cached, on the format's
grid (the reference dequantizes them exactly), and described by the bundled cards."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from probes.model_card import BUNDLED_CARDS, CardError, ModelCard, WeightsSpec, check_shapes
from reference import models as rm
from reference.native import fp8_block_fake_quant, int4_group_fake_quant, is_decoder_linear_key

BASE = "smollm2-135m-instruct"


@pytest.fixture
def variant_cache(tmp_path, monkeypatch):
    """A model cache in tmp_path holding (a link to) the converted bundled model, so variants land there."""
    src = rm.pull_model(BASE)
    (tmp_path / BASE).symlink_to(src, target_is_directory=True)
    monkeypatch.setattr(rm, "model_cache_dir", lambda: tmp_path)
    return tmp_path


@pytest.mark.real_model
def test_fp8_and_int4_variants_are_on_their_grid(variant_cache) -> None:
    base = load_file(str(variant_cache / BASE / "model.safetensors"))
    fp8_dir = rm.resolve_model_path(f"{BASE}+fp8")
    assert fp8_dir == variant_cache / f"{BASE}+fp8"
    man = json.loads((fp8_dir / "manifest.json").read_text())
    assert man["native"] == {"format": "fp8-block", "block": [64, 64], "fp8_format": "e4m3", "act_tile": 64}
    fp8 = load_file(str(fp8_dir / "model.safetensors"))
    keys = [k for k in fp8 if is_decoder_linear_key(k)]
    assert len(keys) == 30 * 7
    for k in keys[:14]:
        assert torch.equal(fp8_block_fake_quant(fp8[k], (64, 64)), fp8[k])  # exact dequantization
        assert not torch.equal(fp8[k], base[k])
    assert torch.equal(fp8["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert rm.pull_native_variant(f"{BASE}+fp8") == fp8_dir  # cached: not re-made
    assert man["revision"] != json.loads((variant_cache / BASE / "manifest.json").read_text())["revision"]
    # the bundled card matches the variant; a 128x128 card is refused on its shapes
    shapes = {k: tuple(v.shape) for k, v in fp8.items()}
    check_shapes(BUNDLED_CARDS[f"{BASE}+fp8"], shapes)
    with pytest.raises(CardError, match=r"block_size: \[128, 128\] does not divide"):
        check_shapes(ModelCard(name="x", weights=WeightsSpec(format="fp8-block", block_size=(128, 128))), shapes)
    int4 = load_file(str(rm.pull_native_variant(f"{BASE}+int4") / "model.safetensors"))
    for k in keys[:7]:
        assert torch.equal(int4_group_fake_quant(int4[k], 32), int4[k])
    check_shapes(BUNDLED_CARDS[f"{BASE}+int4"], {k: tuple(v.shape) for k, v in int4.items()})
    lm = rm.load_model(f"{BASE}+int4")
    assert lm.revision == json.loads((variant_cache / f"{BASE}+int4" / "manifest.json").read_text())["revision"]


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(rm.ModelNotAvailableError, match=r"no native variant named 'smollm2-135m-instruct\+fp4'"):
        rm.pull_native_variant(f"{BASE}+fp4")
