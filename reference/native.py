"""Native low-precision formats for the test bed of native models (issue 36, item 3).

Fake quantization (quantize, then dequantize to the working dtype) of the formats the model cards
(``probes/model_card.py``, docs/model-cards.md) declare, so that a native-FP8 or native-INT4 variant
of a bundled model can be made (weights moved onto the format's grid once) and served honestly
(activations quantized as the native GEMMs do) or below its card:

- :func:`fp8_block_fake_quant` — FP8 e4m3 weights with one float32 scale per ``[rows, cols]``
  block, scale = amax(block) / 448 (DeepSeek-V3 technical report §3.3, "fine-grained quantization":
  128x128 weight blocks; the checkpoint's ``weight_scale_inv``).
- :func:`fp8_tile_fake_quant` — FP8 e4m3 activations with one dynamic scale per 1 x ``tile`` slice
  of each token's channels (DeepSeek-V3 §3.3: 1x128 activation tiles; DeepGEMM).
- :func:`int4_group_fake_quant` — symmetric INT4 weights, one scale per ``group`` input values,
  scale = amax(group) / 7, values in [-8, 7] (Kimi K2-Thinking's weight-only group-32 INT4,
  compressed-tensors ``pack-quantized``, symmetric).
- :func:`nvfp4_fake_quant` — NVIDIA's NVFP4 (a below-card format, not a native one here: the simulator's
  ``native-fp8-nvfp4`` re-quantizes the FP8 model's weights and activations to it): FP4 E2M1 values
  (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) with one FP8 E4M3 scale per 16 consecutive values along the reduction
  dimension and one FP32 scale per tensor, amax(tensor) / (448 · 6), so that a value decodes as
  e2m1 · e4m3 · fp32 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference",
  developer.nvidia.com, 2025; the ModelOpt NVFP4 checkpoint: ``weight_scale`` per 16, ``weight_scale_2`` per
  tensor; torchao ``NVFP4Tensor``'s two-level scaling, ``per_tensor_amax_to_scale``).
  :func:`install_act_nvfp4` quantizes the decoder linears' inputs to it with static per-linear tensor
  scales calibrated on :data:`KV_CALIBRATION_TEXT` (ModelOpt's calibrated ``input_scale``).
- :func:`install_kv_fp8` — an FP8 e4m3 KV cache with static per-layer scales amax/448 (vLLM
  ``--kv-cache-dtype fp8`` with calibrated ``k_scale``/``v_scale``): the simulator's ``kv-fp8`` profiles
  and a reference computing a card whose KV cache is FP8 (``auditor.check.reference_setup.apply_card``).

A format applied twice gives the same weights as applied once (the values lie on the grid), which is
what makes a native variant's reference exact: the reference dequantizes the variant's weights
without error. Shapes the block or group does not divide raise ``ValueError`` (the card check,
``probes.model_card.check_shapes``, refuses such a card before an audit).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

#: The decoder's projection matrices every weight format quantizes (embeddings, norms and the LM head stay
#: in the compute dtype, as DeepSeek-V3, Kimi K2 and gpt-oss ship them).
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Largest finite float8 e4m3 (``torch.float8_e4m3fn``; OCP 8-bit floating point spec, E4M3).
FP8_E4M3_MAX = 448.0
#: Block / tile sizes a native variant of a model tries, largest first (:func:`native_block`).
NATIVE_BLOCKS = (128, 64, 32)
#: The magnitudes FP4 E2M1 represents (1 sign, 2 exponent, 1 mantissa bit; OCP MX spec v1.0, FP4 E2M1).
FP4_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: Largest FP4 E2M1 magnitude.
FP4_E2M1_MAX = 6.0
#: Values per NVFP4 block scale (one FP8 E4M3 scale per 16 values along the reduction dimension).
NVFP4_BLOCK = 16

__all__ = [
    "FP4_E2M1_GRID",
    "FP4_E2M1_MAX",
    "FP8_E4M3_MAX",
    "KV_CALIBRATION_TEXT",
    "KV_FP8_ATTN",
    "LINEAR_NAMES",
    "NATIVE_BLOCKS",
    "NVFP4_BLOCK",
    "fp4_e2m1_round",
    "fp8_block_fake_quant",
    "fp8_e4m3_fake_quant",
    "fp8_tile_fake_quant",
    "install_act_fp8_tiles",
    "install_act_nvfp4",
    "install_kv_fp8",
    "int4_group_fake_quant",
    "is_decoder_linear_key",
    "iter_decoder_linears",
    "make_native_weights",
    "native_block",
    "nvfp4_fake_quant",
    "nvfp4_tensor_scale",
]


def iter_decoder_linears(model: Any) -> Iterator[tuple[str, torch.nn.Linear]]:
    """Yield ``(qualified_name, nn.Linear)`` for the decoder layers' projection matrices (:data:`LINEAR_NAMES`)."""
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in LINEAR_NAMES:
            yield name, mod


def native_block(shapes: Iterable[Sequence[int]]) -> int:
    """The largest of :data:`NATIVE_BLOCKS` dividing both dimensions of every [out, in] decoder weight shape:
    the square weight block and activation tile of a model's native-FP8 variant (128 for gemma-3-270m;
    64 for SmolLM2-135M, whose hidden size 576 is 4.5 x 128).

    Raises:
        ValueError: no shape given, or none divides (the message names the shapes).
    """
    sh = {(int(s[0]), int(s[1])) for s in shapes}
    for b in NATIVE_BLOCKS:
        if sh and all(o % b == 0 and i % b == 0 for o, i in sh):
            return b
    raise ValueError(f"no block of {list(NATIVE_BLOCKS)} divides the decoder weight shapes {sorted(sh)}")


def is_decoder_linear_key(key: str) -> bool:
    """A state-dict key of a decoder projection weight (``model.layers.3.mlp.up_proj.weight``)."""
    parts = key.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LINEAR_NAMES


def _e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale rounded to e4m3 (saturating at ±448), times scale; float32."""
    s = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.clamp(x / s, -FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return q * s


def fp8_block_fake_quant(w: torch.Tensor, block: Sequence[int] = (128, 128)) -> torch.Tensor:
    """FP8 e4m3 block quantize-dequantize of a weight matrix.

    Args:
        w: [out, in] weights (any float dtype).
        block: [rows, cols] of one scale block.

    Returns:
        [out, in] float32 dequantized weights (one scale amax/448 per block).

    Raises:
        ValueError: ``w`` is not 2-D, or the block does not divide its shape.
    """
    br, bc = int(block[0]), int(block[1])
    if w.dim() != 2 or w.shape[0] % br or w.shape[1] % bc:
        raise ValueError(f"block {br}x{bc} does not divide the weight shape {list(w.shape)}")
    o, i = w.shape
    x = w.float().reshape(o // br, br, i // bc, bc)
    scale = x.abs().amax(dim=(1, 3), keepdim=True) / FP8_E4M3_MAX
    return _e4m3(x, scale).reshape(o, i)


def _last_dim_blocks(x: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """``x`` [..., K] in float32 as [..., K / n, n] (one scale per row of n); ValueError naming ``what`` when n does
    not divide K (the input dimension of the GEMM that reads it)."""
    k = x.shape[-1]
    if k % n:
        raise ValueError(f"{what} {n} does not divide the input dimension {k} (shape {list(x.shape)})")
    return x.float().reshape(*x.shape[:-1], k // n, n)


def fp8_tile_fake_quant(x: torch.Tensor, tile: int = 128) -> torch.Tensor:
    """FP8 e4m3 activation quantize-dequantize with one dynamic scale per 1 x ``tile`` channels.

    Args:
        x: [..., K] activations (the last dim is the GEMM's reduction dim).
        tile: channels per scale.

    Returns:
        Same shape and dtype as ``x``.

    Raises:
        ValueError: ``tile`` does not divide K.
    """
    t = _last_dim_blocks(x, tile, "activation tile")
    scale = t.abs().amax(dim=-1, keepdim=True) / FP8_E4M3_MAX
    return _e4m3(t, scale).reshape(x.shape).to(x.dtype)


def int4_group_fake_quant(w: torch.Tensor, group: int = 32) -> torch.Tensor:
    """Symmetric INT4 group quantize-dequantize along the input dimension.

    Args:
        w: [out, in] weights; group: input values per scale.

    Returns:
        [out, in] float32 dequantized weights (scale = amax/7 per group, values clamped to [-8, 7]).

    Raises:
        ValueError: the group does not divide the input dimension.
    """
    if w.dim() != 2 or w.shape[1] % group:
        raise ValueError(f"group {group} does not divide the input dimension of shape {list(w.shape)}")
    o, i = w.shape
    x = w.float().reshape(o, i // group, group)
    scale = x.abs().amax(dim=-1, keepdim=True) / 7.0
    s = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.clamp(torch.round(x / s), -8, 7) * s).reshape(o, i)


def make_native_weights(model: Any, fmt: str, *, block: Sequence[int] = (128, 128), group: int = 32) -> int:
    """Move the decoder linears' weights of ``model`` onto a native format's grid, in place.

    Args:
        model: a transformers causal LM; fmt: ``fp8-block`` | ``int4`` (model card names).
        block: fp8-block scale block; group: int4 group size.

    Returns:
        The number of matrices changed.

    Raises:
        ValueError: an unknown format, no decoder linear, or a block / group that does not divide a shape
            (nothing is changed then: every shape is checked first).
    """
    lins = list(iter_decoder_linears(model))
    if not lins:
        raise ValueError("no decoder linear layer found")
    def fn(w: torch.Tensor) -> torch.Tensor:
        return fp8_block_fake_quant(w, block) if fmt == "fp8-block" else int4_group_fake_quant(w, group)

    if fmt == "fp8-block":
        bad = [n for n, m in lins if m.weight.shape[0] % block[0] or m.weight.shape[1] % block[1]]
    elif fmt == "int4":
        bad = [n for n, m in lins if m.weight.shape[1] % group]
    else:
        raise ValueError(f"unknown native format {fmt!r}; use fp8-block or int4")
    if bad:
        raise ValueError(f"{fmt}: the block / group does not divide the weights of {bad[0]} "
                         f"(shape {list(dict(lins)[bad[0]].weight.shape)})")
    with torch.no_grad():
        for _, m in lins:
            m.weight.data.copy_(fn(m.weight.data).to(m.weight.dtype))
    return len(lins)


def install_act_fp8_tiles(model: Any, tile: int = 128) -> int:
    """Quantize the input of every decoder linear to FP8 per 1 x ``tile`` (forward pre-hooks), as the
    native FP8 GEMMs do. Returns the number of hooks installed.

    Raises:
        ValueError: ``tile`` does not divide some linear's input dimension (no hook is installed then).
    """
    lins = list(iter_decoder_linears(model))
    bad = [n for n, m in lins if m.in_features % tile]
    if bad:
        raise ValueError(f"activation tile {tile} does not divide the input dimension of {bad[0]}")

    def hook(_m: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fp8_tile_fake_quant(args[0], tile), *args[1:])

    for _, m in lins:
        m.register_forward_pre_hook(hook)
    return len(lins)


# ------------------------------------------------------------------------------------ NVFP4 (W4A4)
def fp4_e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` (any shape, float) to the nearest FP4 E2M1 value (:data:`FP4_E2M1_GRID`, sign kept), ties to
    the even mantissa as the hardware conversion does (0.25 → 0, 0.75 → 1, 2.5 → 2, 5 → 4); magnitudes beyond 6
    saturate to 6. Returns float32."""
    grid = torch.tensor(FP4_E2M1_GRID, dtype=torch.float32, device=x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    a = x.float().abs().clamp(max=FP4_E2M1_MAX)
    i = torch.bucketize(a, mids)  # mids[i-1] < a <= mids[i]: the lower neighbour on a tie
    tie = (i < len(mids)) & (a == mids[i.clamp(max=len(mids) - 1)]) & (i % 2 == 1)
    i = torch.where(tie, i + 1, i)  # an odd index has mantissa 1: the tie goes to the even neighbour above
    return torch.copysign(grid[i], x.float())


def nvfp4_tensor_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """NVFP4's per-tensor FP32 scale, amax / (448 · 6), so that the largest block scale is E4M3's largest value
    (torchao ``per_tensor_amax_to_scale``); 1 for an all-zero tensor. A float32 0-d tensor."""
    a = torch.as_tensor(amax, dtype=torch.float32)
    return torch.where(a > 0, a / (FP8_E4M3_MAX * FP4_E2M1_MAX), torch.ones_like(a))


def nvfp4_fake_quant(x: torch.Tensor, tensor_scale: torch.Tensor | float | None = None,
                     block: int = NVFP4_BLOCK) -> torch.Tensor:
    """NVFP4 quantize-dequantize along the last dimension (module docstring).

    Per block of ``block`` values: block scale = amax(block) / 6 / tensor_scale rounded to E4M3 (saturating at
    448), decode scale = that E4M3 value · tensor_scale, values = FP4 E2M1 rounding of x / decode scale (a block
    whose E4M3 scale underflows to 0 decodes to 0).

    Args:
        x: [..., K] weights ([out, in]: blocks along the input dimension) or activations ([..., K]).
        tensor_scale: the per-tensor FP32 scale; None = :func:`nvfp4_tensor_scale` of this tensor's amax
            (weights); activations pass the calibrated one (:func:`install_act_nvfp4`).
        block: values per E4M3 scale (16, NVFP4's).

    Returns:
        Same shape and dtype as ``x``.

    Raises:
        ValueError: ``block`` does not divide K.
    """
    t = _last_dim_blocks(x, block, "NVFP4 block")
    ts = nvfp4_tensor_scale(t.abs().max()) if tensor_scale is None else torch.as_tensor(tensor_scale,
                                                                                           dtype=torch.float32)
    ts = ts.to(t.device)
    bs = torch.clamp(t.abs().amax(dim=-1, keepdim=True) / FP4_E2M1_MAX / ts, max=FP8_E4M3_MAX)
    dec = bs.to(torch.float8_e4m3fn).to(torch.float32) * ts
    q = fp4_e2m1_round(t / torch.where(dec > 0, dec, torch.ones_like(dec))) * dec
    return q.reshape(x.shape).to(x.dtype)


def install_act_nvfp4(model: Any, calibration_ids: list[int], block: int = NVFP4_BLOCK) -> dict[str, Any]:
    """Quantize the input of every decoder linear to NVFP4 (forward pre-hooks), with a static per-linear tensor
    scale: amax of that linear's input over a calibration forward of ``calibration_ids``, / (448 · 6) — ModelOpt's
    calibrated ``input_scale`` of an NVFP4 checkpoint (activations beyond the calibrated range saturate at the
    largest E4M3 block scale). Call after the weights are final (the calibration forward runs the model as is).

    Returns:
        ``{"act_quant": "nvfp4-e2m1-e4m3x16", "act_quant_linears": n, "act_tensor_scales": {name: scale}}``.

    Raises:
        ValueError: empty ``calibration_ids``, no decoder linear, or ``block`` does not divide some linear's
            input dimension (no hook is installed then).
    """
    if not calibration_ids:
        raise ValueError("install_act_nvfp4: calibration_ids is empty; pass the calibration text's token ids")
    lins = list(iter_decoder_linears(model))
    if not lins:
        raise ValueError("install_act_nvfp4: no decoder linear layer found")
    bad = [n for n, m in lins if m.in_features % block]
    if bad:
        raise ValueError(f"NVFP4 block {block} does not divide the input dimension of {bad[0]}")
    amax: dict[str, float] = {}

    def recorder(name: str) -> Any:
        def hook(_m: torch.nn.Module, args: tuple[Any, ...]) -> None:
            amax[name] = max(amax.get(name, 0.0), float(args[0].detach().abs().max()))
        return hook

    handles = [m.register_forward_pre_hook(recorder(n)) for n, m in lins]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([list(calibration_ids)]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    scales = {n: float(nvfp4_tensor_scale(amax.get(n, 0.0))) for n, _ in lins}

    def quant(scale: float) -> Any:
        def hook(_m: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return (nvfp4_fake_quant(args[0], scale, block), *args[1:])
        return hook

    for n, m in lins:
        m.register_forward_pre_hook(quant(scales[n]))
    return {"act_quant": f"nvfp4-e2m1-e4m3x{block}", "act_quant_linears": len(lins), "act_tensor_scales": scales}


# ------------------------------------------------------------------------------------ FP8 KV cache
KV_FP8_ATTN = "spec_auditor_kv_fp8"
#: Fixed calibration text for the static KV scales (deterministic; no data set is downloaded).
KV_CALIBRATION_TEXT = (
    "The committee met on Tuesday to review the budget. After a long discussion about schools, roads "
    "and the new library, they agreed to postpone the vote. def add(a, b):\n    return a + b\n"
    "Photosynthesis converts light energy into chemical energy stored in glucose. 1, 2, 3, 5, 8, 13."
)


def fp8_e4m3_fake_quant(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Round ``x`` (any shape, float) to E4M3 with a fixed scale (saturating at ±448·scale); same dtype.

    With a fixed scale the round trip is idempotent, so quantizing the whole (past + new) K/V on
    every read equals storing each entry quantized once, as an fp8 KV cache does.
    """
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device).clamp_min(torch.finfo(torch.float32).tiny)
    y = torch.clamp(x.float() / s, -FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return (y.to(torch.float32) * s).to(x.dtype)


def _kv_fp8_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs: Any) -> Any:
    """SDPA attention reading K/V through an fp8 E4M3 round trip with the layer's static scales."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scales = getattr(module, "kv_fp8_scales", None)
    if scales is not None:
        key = fp8_e4m3_fake_quant(key, scales[0])
        value = fp8_e4m3_fake_quant(value, scales[1])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register_kv_fp8_attention() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(KV_FP8_ATTN, _kv_fp8_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(KV_FP8_ATTN, sdpa_mask)


def _attention_modules(model: Any) -> list[torch.nn.Module]:
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError("kv-fp8 needs a Llama-style model with model.layers[*].self_attn")
    return [layer.self_attn for layer in layers]


def install_kv_fp8(model: Any, calibration_ids: list[int]) -> dict[str, Any]:
    """Serve ``model`` with an fp8 E4M3 KV cache: static per-layer (per-tensor) scales amax/448.

    Scale choice: one scale for K and one for V per layer, amax over a calibration forward of
    ``calibration_ids`` (post-RoPE keys, as the cache stores them) divided by 448 — the recipe of
    vLLM's ``--calculate-kv-scales`` / llm-compressor's calibrated ``k_scale``/``v_scale``
    (vLLM docs, "Quantized KV Cache"). Values beyond the calibrated range saturate. Queries and
    weights stay full precision. Implemented as a registered transformers attention function
    that rounds K and V (past and new) through ``torch.float8_e4m3fn`` before SDPA.

    Returns:
        ``{"kv_cache_dtype": "fp8_e4m3", "k_scales": [...], "v_scales": [...]}`` (per layer).

    Raises:
        ValueError: not a Llama-style model, or empty ``calibration_ids``.
    """
    if not calibration_ids:
        raise ValueError("install_kv_fp8: calibration_ids is empty; pass the calibration text's token ids")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _register_kv_fp8_attention()
    mods = _attention_modules(model)
    amax: dict[int, list[float]] = {}

    def recorder(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs: Any) -> Any:
        i = mods.index(module)
        a = amax.setdefault(i, [0.0, 0.0])
        a[0] = max(a[0], float(key.detach().abs().max()))
        a[1] = max(a[1], float(value.detach().abs().max()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register("spec_auditor_kv_record", recorder)
    ALL_MASK_ATTENTION_FUNCTIONS.register("spec_auditor_kv_record", sdpa_mask)
    old = model.config._attn_implementation
    model.config._attn_implementation = "spec_auditor_kv_record"
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([list(calibration_ids)]), use_cache=False)
    finally:
        model.config._attn_implementation = old
    scales: list[tuple[float, float]] = []
    for i, m in enumerate(mods):
        k, v = amax.get(i, [FP8_E4M3_MAX, FP8_E4M3_MAX])
        scales.append((max(k, 1e-12) / FP8_E4M3_MAX, max(v, 1e-12) / FP8_E4M3_MAX))
        object.__setattr__(m, "kv_fp8_scales", scales[-1])  # a plain attribute, read by _kv_fp8_attention
    model.config._attn_implementation = KV_FP8_ATTN
    return {"kv_cache_dtype": "fp8_e4m3", "k_scales": [s[0] for s in scales], "v_scales": [s[1] for s in scales]}
