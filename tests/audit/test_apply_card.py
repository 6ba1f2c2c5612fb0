"""The reference computes the card (issue 36, item 2) on the tiny model: what ``apply_card`` changes and what it
leaves alone (end-to-end verdicts on SmolLM2's native variants: test_native_card.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from auditor.check.errors import AuditError
from auditor.check.reference_scoring import local_scorers
from auditor.check.reference_setup import ReferenceSetup, apply_card, card_steps
from probes.model_card import ActivationSpec, ModelCard, WeightsSpec
from reference.native import fp8_block_fake_quant, fp8_tile_fake_quant, iter_decoder_linears, make_native_weights

FP8 = ModelCard(name="tiny-fp8", weights=WeightsSpec(format="fp8-block", block_size=(32, 32)),
                activations=ActivationSpec(format="fp8", tile=(1, 32)), kv_cache="fp32")


def _ref(lm) -> ReferenceSetup:
    return ReferenceSetup("local", lm.tokenizer, dict(local_scorers({"float32": lm})), {"float32": lm},
                          str(lm.revision), "float32")


@pytest.fixture(scope="module")
def fp8_lm(tiny_lm):
    """The tiny model moved onto the FP8 card's grid (its native checkpoint, dequantized exactly)."""
    import copy

    m = copy.deepcopy(tiny_lm.model)
    make_native_weights(m, "fp8-block", block=(32, 32))
    return replace(tiny_lm, model=m, revision="tiny-fp8")


def test_fp8_card_reference_quantizes_activations_and_pins_its_revision(fp8_lm, tiny_lm) -> None:
    assert card_steps(FP8, fp8_lm) == ("act-fp8-1x32",)  # on the grid: the weights need nothing
    ref = apply_card(_ref(fp8_lm), FP8)
    lm = ref.lms["float32"]
    assert ref.revision == lm.revision == "tiny-fp8+card:act-fp8-1x32" and ref.scorers["float32"].revision == ref.revision
    assert lm.model is not fp8_lm.model and any("reference computes card tiny-fp8" in n for n in ref.notes or [])
    seen: list[torch.Tensor] = []
    _n, lin = next(iter(iter_decoder_linears(lm.model)))
    h = lin.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach().clone()), prepend=False)
    ids = torch.tensor([tiny_lm.tokenizer.encode("The card says how the native GEMMs compute.")])
    with torch.no_grad():
        card_lp = torch.log_softmax(lm.model(input_ids=ids).logits[0], -1)
        plain_lp = torch.log_softmax(fp8_lm.model(input_ids=ids).logits[0], -1)
    h.remove()
    assert torch.equal(fp8_tile_fake_quant(seen[0], 32), seen[0]) and not torch.equal(card_lp, plain_lp)
    # the loaded model itself is untouched (no hook leaks into the plain reference)
    assert all(not m._forward_pre_hooks for _n, m in iter_decoder_linears(fp8_lm.model))


def test_off_grid_weights_are_moved_onto_the_card_grid(tiny_lm) -> None:
    steps = card_steps(FP8, tiny_lm)
    assert steps == ("weights-fp8-block-32x32", "act-fp8-1x32")
    lm = apply_card(_ref(tiny_lm), FP8).lms["float32"]
    for name, m in iter_decoder_linears(lm.model):
        assert torch.equal(fp8_block_fake_quant(m.weight, (32, 32)), m.weight), name


def test_float_cards_and_no_card_keep_the_plain_reference(tiny_lm) -> None:
    ref = _ref(tiny_lm)
    assert apply_card(ref, None) is ref
    bf16 = ModelCard(name="b", weights=WeightsSpec(format="bf16"), kv_cache="bf16")
    same = apply_card(ref, bf16)
    assert same.lms == ref.lms and same.revision == ref.revision and "card b" in " ".join(same.notes or [])
    kv = ModelCard(name="k", weights=WeightsSpec(format="bf16"), kv_cache="auto")
    assert card_steps(kv, tiny_lm, {"kv_cache_scheme": {"num_bits": 8, "type": "float"}}) == ("kv-fp8",)
    assert card_steps(kv, tiny_lm, None) == ()


def test_a_card_the_reference_cannot_compute_is_exit_3(fp8_lm) -> None:
    two_rows = FP8.model_copy(update={"activations": ActivationSpec(format="fp8", tile=(2, 32))})
    with pytest.raises(AuditError, match=r"activations\.tile: \[2, 32\]") as ei:
        apply_card(_ref(fp8_lm), two_rows)
    assert ei.value.parameter == "card"
    odd = FP8.model_copy(update={"activations": ActivationSpec(format="fp8", tile=(1, 48))})
    with pytest.raises(AuditError, match=r"tile 48 does not divide") as ei:
        apply_card(_ref(fp8_lm), odd)
    assert ei.value.parameter == "card"


def test_fp8_kv_card_reads_keys_and_values_through_fp8(tiny_lm) -> None:
    from reference.native import KV_FP8_ATTN

    kv = ModelCard(name="k", weights=WeightsSpec(format="bf16"), kv_cache="fp8")
    ref = apply_card(_ref(tiny_lm), kv)
    lm = ref.lms["float32"]
    assert lm.revision == "tiny-llama-seed0+card:kv-fp8"
    assert lm.model.config._attn_implementation == KV_FP8_ATTN != tiny_lm.model.config._attn_implementation
    scales = [layer.self_attn.kv_fp8_scales for layer in lm.model.model.layers]
    assert len(scales) == 2 and all(k > 0 and v > 0 for k, v in scales)
