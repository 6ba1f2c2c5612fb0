"""Weight-only quantization of a causal LM for the quantized simulator profiles (fake-quant).

Plan: quantize with a maintained library (``optimum-quanto``'s weight quantizers and qtypes) and
serve the *dequantized* float32 weights. Numerically the served model is the weight-only
quantized model (the weights lie exactly on the quantization grid), at float32 speed on CPU:
quanto's own quantized kernels take ~2 s (qint8) to ~95 s (qint4) per 64-token forward on two
cores, far too slow to serve.

Formats (the decoder's linear layers ``q,k,v,o,gate,up,down``; embeddings and the tied
``lm_head`` are left in float32, as vLLM does for online fp8 and as GPTQ/AWQ checkpoints do):

- ``int8``: symmetric per-output-channel round-to-nearest, scale = max|w_row| / 127
  (quanto ``qint8`` + ``AbsmaxOptimizer``, axis 0).
- ``int4``: group-wise affine round-to-nearest along the input dimension, group 64 by default,
  scale = (max - min) / 15 and a float shift per group (quanto ``qint4`` + ``MaxOptimizer``,
  the library's default int4 recipe).
- ``fp8``: E4M3 (max 448) with one per-tensor scale amax/448 (vLLM online fp8); quanto
  ``qfloat8_e4m3fn`` with that scale broadcast to every row.

Fallback: when quanto is unavailable or fails (e.g. its C++ unpack extension cannot be
compiled), an equivalent quantize-dequantize written in torch is used (same formulas; the
fp8 path casts through ``torch.float8_e4m3fn``). ``QuantReport.backend`` says which ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_E4M3_MAX = 448.0


@dataclass
class QuantReport:
    """What :func:`quantize_model_weights` did.

    Attributes:
        scheme: ``int8`` | ``int4`` | ``fp8``.
        group_size: int4 group size (None otherwise).
        n_matrices: number of weight matrices quantized.
        n_params: number of weights quantized.
        seconds: wall time of quantization (s).
        mean_rel_error: mean over matrices of ||W_q - W|| / ||W|| (Frobenius).
        backend: ``optimum-quanto`` or ``torch-rtn`` (fallback), per matrix majority.
        errors: messages from quanto failures that triggered the fallback.
    """

    scheme: str
    group_size: int | None
    n_matrices: int = 0
    n_params: int = 0
    seconds: float = 0.0
    mean_rel_error: float = 0.0
    backend: str = "optimum-quanto"
    errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# torch reference implementations (fallback; also used by tests to cross-check quanto)
# ---------------------------------------------------------------------------------------------


def rtn_int8_per_channel(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 RTN per output channel; returns the dequantized ``[out, in]`` weights (same dtype)."""
    w32 = w.float()
    scale = w32.abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.clamp(torch.round(w32 / scale), -127, 127)
    return (q * scale).to(w.dtype)


def rtn_int4_groupwise(w: torch.Tensor, group_size: int = 64) -> torch.Tensor:
    """Affine int4 RTN per group of ``group_size`` input elements (min/max); dequantized ``[out, in]``.

    Raises:
        ValueError: ``in`` not divisible by ``group_size``.
    """
    out_f, in_f = w.shape
    if in_f % group_size:
        raise ValueError(f"int4: in_features={in_f} is not divisible by group_size={group_size}")
    g = w.float().reshape(-1, group_size)
    rmin = g.amin(dim=1, keepdim=True)
    rmax = g.amax(dim=1, keepdim=True)
    scale = (rmax - rmin) / 15.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    shift = -rmin
    q = torch.clamp(torch.round((g + shift) / scale), 0, 15)
    return (q * scale - shift).reshape(out_f, in_f).to(w.dtype)


def rtn_fp8_per_tensor(w: torch.Tensor) -> torch.Tensor:
    """E4M3 with one per-tensor scale amax/448 (saturating cast); dequantized, same dtype."""
    w32 = w.float()
    scale = w32.abs().max() / FP8_E4M3_MAX
    if float(scale) == 0.0:
        return w.clone()
    q = torch.clamp(w32 / scale, -FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.to(torch.float32) * scale).to(w.dtype)


# ---------------------------------------------------------------------------------------------
# optimum-quanto path
# ---------------------------------------------------------------------------------------------


def quanto_fake_quant(w: torch.Tensor, scheme: str, group_size: int = 64) -> torch.Tensor:
    """Quantize ``w`` ``[out, in]`` with optimum-quanto and return the dequantized float tensor.

    Raises:
        ImportError: optimum-quanto missing.
        ValueError: unknown scheme or group size not dividing ``in``.
        RuntimeError: quanto internals failed (e.g. its extension could not be built).
    """
    from optimum.quanto import qfloat8_e4m3fn, qint4, qint8
    from optimum.quanto.tensor.optimizers import AbsmaxOptimizer, MaxOptimizer
    from optimum.quanto.tensor.weights.quantization import quantize_weight

    w32 = w.detach().float().contiguous()
    if scheme == "int8":
        scale = AbsmaxOptimizer()(w32, qtype=qint8, axis=0)
        qt = quantize_weight(w32, qtype=qint8, axis=0, scale=scale, optimized=False)
    elif scheme == "int4":
        if w32.shape[1] % group_size:
            raise ValueError(f"int4: in_features={w32.shape[1]} is not divisible by group_size={group_size}")
        scale, shift = MaxOptimizer()(w32, qtype=qint4, axis=0, group_size=group_size)
        qt = quantize_weight(w32, qtype=qint4, axis=0, scale=scale, shift=shift, group_size=group_size, optimized=False)
    elif scheme == "fp8":
        amax = w32.abs().max()
        s = (amax / FP8_E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)
        scale = s.reshape(1, 1).expand(w32.shape[0], 1).contiguous()
        qt = quantize_weight(w32, qtype=qfloat8_e4m3fn, axis=0, scale=scale, optimized=False)
    else:
        raise ValueError(f"unknown quantization scheme {scheme!r}; use int8, int4 or fp8")
    return qt.dequantize().to(torch.float32).reshape(w.shape)


def _fallback(w: torch.Tensor, scheme: str, group_size: int) -> torch.Tensor:
    if scheme == "int8":
        return rtn_int8_per_channel(w.float())
    if scheme == "int4":
        return rtn_int4_groupwise(w.float(), group_size)
    if scheme == "fp8":
        return rtn_fp8_per_tensor(w.float())
    raise ValueError(f"unknown quantization scheme {scheme!r}; use int8, int4 or fp8")


def iter_decoder_linears(model: Any):
    """Yield ``(qualified_name, nn.Linear)`` for the decoder layers' projection matrices."""
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in LINEAR_NAMES:
            yield name, mod


def quantize_model_weights(
    model: Any, scheme: str, group_size: int = 64, use_quanto: bool = True
) -> QuantReport:
    """Replace the decoder linears' weights of ``model`` in place by their quantize-dequantize.

    Args:
        model: a transformers causal LM (float32 weights expected; other dtypes are cast back).
        scheme: ``int8`` | ``int4`` | ``fp8`` (see module docstring).
        group_size: int4 group size along the input dimension (must divide every in_features).
        use_quanto: try optimum-quanto first (default); False forces the torch fallback.

    Returns:
        QuantReport with timing (seconds) and the mean relative Frobenius error.

    Raises:
        ValueError: unknown scheme, or no linear layer found.
    """
    if scheme not in ("int8", "int4", "fp8"):
        raise ValueError(f"unknown quantization scheme {scheme!r}; use int8, int4 or fp8")
    rep = QuantReport(scheme=scheme, group_size=group_size if scheme == "int4" else None)
    t0 = time.perf_counter()
    errs: list[float] = []
    n_fallback = 0
    with torch.no_grad():
        for name, lin in iter_decoder_linears(model):
            w = lin.weight.data
            dq = None
            if use_quanto:
                try:
                    dq = quanto_fake_quant(w, scheme, group_size)
                except ValueError:
                    raise
                except Exception as e:  # noqa: BLE001 - fall back to the torch RTN on any quanto failure
                    if len(rep.errors) < 3:
                        rep.errors.append(f"{name}: {type(e).__name__}: {e}")
            if dq is None:
                dq = _fallback(w, scheme, group_size)
                n_fallback += 1
            errs.append(float((dq.float() - w.float()).norm() / w.float().norm().clamp_min(1e-30)))
            lin.weight.data.copy_(dq.to(w.dtype))
            rep.n_matrices += 1
            rep.n_params += w.numel()
    if rep.n_matrices == 0:
        raise ValueError("quantize_model_weights: no decoder linear layers found (expected Llama-style *_proj)")
    rep.seconds = time.perf_counter() - t0
    rep.mean_rel_error = sum(errs) / len(errs)
    rep.backend = "torch-rtn" if n_fallback * 2 > rep.n_matrices else "optimum-quanto"
    return rep
