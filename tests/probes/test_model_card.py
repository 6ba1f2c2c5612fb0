"""Model cards (issue 36, item 1): the recipe, [cards.NAME] tables, provider card/claim fields, and the
refusals (unknown format, a block size that does not divide the weights, a contradicted quantization_config)."""

from __future__ import annotations

import pytest

from probes.config import ConfigError, provider_card
from probes.model_card import (
    BUNDLED_CARDS,
    CardError,
    ModelCard,
    WeightsSpec,
    card_description,
    check_quantization_config,
    check_shapes,
    checkpoint_recipe,
    resolve_kv_cache,
)
from probes.providers_file import parse_providers

DEEPSEEK = {"weights": {"format": "fp8-block", "block_size": [128, 128], "fp8_format": "e4m3"},
            "activations": {"format": "fp8", "tile": [1, 128]}, "kv_cache": "bf16",
            "source": "DeepSeek-V3 technical report, section 3.3"}
# DeepSeek-V3's config.json quantization_config, verbatim
DEEPSEEK_QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
# Kimi K2-Thinking's (compressed-tensors, abridged to the fields read)
KIMI_QC = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
    "weights": {"num_bits": 4, "type": "int", "group_size": 32, "strategy": "group", "symmetric": True}}}}


def _doc(card: dict, **prov: object) -> dict:
    return {"providers": {"acme": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "card": "ds", **prov}},
            "cards": {"ds": card}}


def test_card_table_resolves_and_describes() -> None:
    p = parse_providers(_doc(DEEPSEEK, claimed_precision="fp8"), "providers.toml")["acme"]
    card = provider_card(p)
    assert isinstance(card, ModelCard) and card.name == "ds"
    assert card.describe() == "card ds: weights fp8-block 128x128 e4m3, activations fp8 per 1x128, KV cache bf16"
    assert card.precision_label == "fp8" and p.claimed_precision == "fp8"
    # the resolved card is what the run's snapshot keeps, and the report line reads it back
    assert card_description(p.safe_dump()["card"], "whatever") == card.describe()


def test_bundled_cards_are_fp32_dequantized() -> None:
    p = parse_providers({"providers": {"a": {"base_url": "http://x/v1", "model": "m"}}})["a"]
    card = provider_card(p)  # no card: the bundled reference's own card
    assert card is BUNDLED_CARDS["smollm2-135m-instruct"]
    assert card.weights.format == "fp32" and card.weights.dequantized_from == "gguf:Q4_1"
    assert BUNDLED_CARDS["gemma-3-270m"].weights.dequantized_from == "gguf:Q4_K_M"
    assert "no card" in card_description(None, "/some/dir", "float32")


@pytest.mark.parametrize(("card", "field", "fix"), [
    ({"weights": {"format": "fp7"}}, "cards.ds.weights.format", "use one of"),
    ({"weights": {"format": "fp8-block"}}, "cards.ds.weights", "block_size"),
    ({"weights": {"format": "int4"}}, "cards.ds.weights", "group_size"),
    ({"weights": {"format": "mxfp4", "group_size": 16}}, "cards.ds.weights", "32"),
    ({"weights": {"format": "bf16"}, "kv_cache": "int8"}, "cards.ds.kv_cache", "use one of"),
    ({"weights": {"format": "bf16"}, "activations": {"format": "fp8"}}, "cards.ds.activations", "tile"),
])
def test_bad_card_names_field_and_fix(card: dict, field: str, fix: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_providers(_doc(card), "providers.toml")
    msg = str(ei.value)
    assert f"providers.toml: {field}" in msg and "Fix:" in msg and fix in msg


def test_unknown_card_name_and_claim_refused() -> None:
    doc = _doc(DEEPSEEK)
    doc["providers"]["acme"]["card"] = "deepseek-v9"
    with pytest.raises(ConfigError, match=r"providers\.acme\.card: no card named 'deepseek-v9'.*Fix:"):
        parse_providers(doc)
    with pytest.raises(ConfigError, match=r"acme\.claimed_precision.*Fix: use one of"):
        parse_providers(_doc(DEEPSEEK, claimed_precision="q4_k_m"))


def test_block_size_must_divide_weight_shapes() -> None:
    card = ModelCard.model_validate({**DEEPSEEK, "name": "ds"})
    ok = {"model.layers.0.mlp.up_proj.weight": (256, 128), "model.embed_tokens.weight": (49152, 100),
          "model.norm.weight": (100,)}
    check_shapes(card, ok)  # embeddings and norms are not block-quantized
    with pytest.raises(CardError, match=r"cards\.ds\.weights\.block_size: \[128, 128\] does not divide the shape "
                                        r"\[576, 1536\] of .*q_proj.*Fix:"):
        check_shapes(card, {**ok, "model.layers.0.self_attn.q_proj.weight": (576, 1536)})
    int4 = ModelCard(name="k2", weights=WeightsSpec(format="int4", group_size=32))
    check_shapes(int4, {"a.weight": (7, 64)})
    with pytest.raises(CardError, match=r"cards\.k2\.weights\.group_size: groups of 32 .* 48"):
        check_shapes(int4, {"a.weight": (64, 48)})


def test_card_contradicting_quantization_config() -> None:
    ds = ModelCard.model_validate({**DEEPSEEK, "name": "ds"})
    check_quantization_config(ds, DEEPSEEK_QC)
    assert checkpoint_recipe(DEEPSEEK_QC) == {"format": "fp8-block", "block_size": [128, 128], "group_size": None,
                                              "kv_cache": None, "activations": "fp8"}
    bf16 = ModelCard(name="b", weights=WeightsSpec(format="bf16"))
    with pytest.raises(CardError, match=r"cards\.b\.weights\.format: the card says 'bf16' but .* 'fp8-block'.*Fix:"):
        check_quantization_config(bf16, DEEPSEEK_QC)
    other_block = ModelCard.model_validate({**DEEPSEEK, "name": "ds",
                                            "weights": {"format": "fp8-block", "block_size": [64, 64]}})
    with pytest.raises(CardError, match=r"weights\.block_size: the card says \[64, 64\]"):
        check_quantization_config(other_block, DEEPSEEK_QC)
    k2 = ModelCard(name="k2", weights=WeightsSpec(format="int4", group_size=32, training="qat"))
    check_quantization_config(k2, KIMI_QC)
    with pytest.raises(CardError, match=r"group_size: the card says 128 .* group_size 32"):
        check_quantization_config(ModelCard(name="k2", weights=WeightsSpec(format="int4", group_size=128)), KIMI_QC)
    check_quantization_config(bf16, None)  # nothing declared, nothing contradicted
    # a dequantized reference (the bundled GGUF models) never contradicts its source's declaration
    check_quantization_config(BUNDLED_CARDS["gemma-3-270m"], {"quant_method": "mxfp4"})


def test_kv_cache_auto_follows_the_checkpoint() -> None:
    qc = {**KIMI_QC, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
    auto = ModelCard(name="a", weights=WeightsSpec(format="int4", group_size=32))
    assert resolve_kv_cache(auto, qc) == "fp8"
    assert resolve_kv_cache(auto, KIMI_QC) == "bf16"
    with pytest.raises(CardError, match=r"kv_cache: the card says 'bf16' but the checkpoint declares an FP8 KV"):
        check_quantization_config(ModelCard(name="a", weights=WeightsSpec(format="int4", group_size=32),
                                            kv_cache="bf16"), qc)


def test_check_card_against_a_loaded_reference_is_exit_3(tiny_lm, tmp_path) -> None:
    """The audit's reference stage refuses a card the loaded weights contradict (AuditError, exit 3)."""
    import json
    from dataclasses import replace

    from auditor.check.reference_setup import ReferenceSetup, check_card

    lm = replace(tiny_lm, path=str(tmp_path))
    ref = ReferenceSetup("local", lm.tokenizer, {}, {"float32": lm}, "r", "float32")
    check_card(BUNDLED_CARDS["smollm2-135m-instruct"], ref, provider="acme")  # fp32: nothing to divide
    ok = ModelCard(name="g", weights=WeightsSpec(format="int4", group_size=32))
    check_card(ok, ref, provider="acme")  # hidden 64: groups of 32 divide every linear weight
    bad = ModelCard(name="g", weights=WeightsSpec(format="int4", group_size=48))
    with pytest.raises(Exception) as ei:
        check_card(bad, ref, provider="acme")
    assert getattr(ei.value, "exit_code", None) == 3 and ei.value.parameter == "card"  # type: ignore[attr-defined]
    assert "providers.acme.card (g).weights.group_size" in str(ei.value)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": DEEPSEEK_QC}))
    with pytest.raises(Exception, match=r"weights\.format: the card says 'int4' but .* 'fp8-block'"):
        check_card(ok, ref, provider="acme")
