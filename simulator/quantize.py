"""Quantization of a causal LM for the quantized simulator profiles (fake-quant): weights, activations, KV.

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
- ``int3``: as ``int4`` with 3 bits (scale = (max - min) / 7, group 64): the heavier quantization
  cause attribution is calibrated on (issue 14). quanto has no 3-bit type, so it is always the
  torch RTN below.
- ``fp8``: E4M3 (max 448) with one per-tensor scale amax/448 (vLLM online fp8); quanto
  ``qfloat8_e4m3fn`` with that scale broadcast to every row.
- ``nvfp4``: NVIDIA's NVFP4, FP4 E2M1 values with one E4M3 scale per 16 input values and one FP32 scale
  per tensor (``reference.native.nvfp4_fake_quant``, the one home of the format); always the torch path
  (quanto has no NVFP4 type). With ``act_quant="nvfp4"`` (``reference.native.install_act_nvfp4``) it is
  W4A4, the ``native-fp8-nvfp4`` profile.

Fallback: when quanto is unavailable or fails (e.g. its C++ unpack extension cannot be
compiled), an equivalent quantize-dequantize written in torch is used (same formulas; the
fp8 path casts through ``torch.float8_e4m3fn``). ``QuantReport.backend`` says which ran.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reference.native import (
    FP8_E4M3_MAX,
    KV_CALIBRATION_TEXT,
    install_act_nvfp4,
    install_kv_fp8,
    iter_decoder_linears,
    nvfp4_fake_quant,
)


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
        cached: the quantized weights were read from ``cache_file`` (``seconds`` is then the read time).
    """

    scheme: str
    group_size: int | None
    n_matrices: int = 0
    n_params: int = 0
    seconds: float = 0.0
    mean_rel_error: float = 0.0
    backend: str = "optimum-quanto"
    errors: list[str] = field(default_factory=list)
    cached: bool = False


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


def rtn_int4_groupwise(w: torch.Tensor, group_size: int = 64, bits: int = 4) -> torch.Tensor:
    """Affine int4 (``bits``-bit) RTN per group of ``group_size`` input elements (min/max); dequantized ``[out, in]``.

    Raises:
        ValueError: ``in`` not divisible by ``group_size``.
    """
    out_f, in_f = w.shape
    if in_f % group_size:
        raise ValueError(f"int{bits}: in_features={in_f} is not divisible by group_size={group_size}")
    top = float(2**bits - 1)
    g = w.float().reshape(-1, group_size)
    rmin = g.amin(dim=1, keepdim=True)
    rmax = g.amax(dim=1, keepdim=True)
    scale = (rmax - rmin) / top
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    shift = -rmin
    q = torch.clamp(torch.round((g + shift) / scale), 0, top)
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


#: A quanto extension build lock older than this (seconds) is taken as left by a killed build. The C++
#: unpack extension compiles in about a minute on two cores; torch's ``FileBaton`` would wait for a
#: stale lock forever, so the simulator would never start (seen: 795 s blocked until deleted by hand).
QUANTO_STALE_LOCK_S = 600.0


def quanto_stale_lock(max_age_s: float = QUANTO_STALE_LOCK_S) -> str | None:
    """Path of a stale optimum-quanto C++ extension build lock, or None.

    torch.utils.cpp_extension builds quanto's ``quanto_cpp`` extension under
    ``optimum/quanto/library/extensions/cpp/build`` and serializes builds with a ``lock`` file that
    a killed build leaves behind; every later build then waits on it without end. Returns the lock's
    path when it exists and is older than ``max_age_s`` seconds (the caller then uses the torch
    fallback and records why); None when there is no lock, it is fresh, or quanto is not installed.
    """
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("optimum.quanto")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    lock = Path(spec.origin).parent / "library" / "extensions" / "cpp" / "build" / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return None
    return str(lock) if age > max_age_s else None


def _fallback(w: torch.Tensor, scheme: str, group_size: int) -> torch.Tensor:
    if scheme == "int8":
        return rtn_int8_per_channel(w.float())
    if scheme == "int4":
        return rtn_int4_groupwise(w.float(), group_size)
    if scheme == "int3":
        return rtn_int4_groupwise(w.float(), group_size, bits=3)
    if scheme == "fp8":
        return rtn_fp8_per_tensor(w.float())
    if scheme == "nvfp4":
        return nvfp4_fake_quant(w.float())
    raise ValueError(f"unknown quantization scheme {scheme!r}; use int8, int4, int3, fp8 or nvfp4")


#: Environment variable naming another folder for the quantized-weight cache (the test session points it
#: at a temporary folder so that no test writes into the user's cache).
ENV_QUANT_DIR = "SPEC_AUDITOR_QUANT_DIR"


def quant_cache_dir() -> Path:
    """``$SPEC_AUDITOR_QUANT_DIR`` when set, else ``<model cache>/quantized``
    (``$SPEC_AUDITOR_HOME/models/quantized`` or the user cache), beside the converted models it is made from."""
    override = os.environ.get(ENV_QUANT_DIR)
    if override:
        return Path(override).expanduser()
    from reference.models import model_cache_dir

    return model_cache_dir() / "quantized"


def quant_cache_file(cache_dir: Path, model_name: str, revision: str, scheme: str, group_size: int) -> Path:
    """Where :func:`quantize_model_weights` caches one model's quantized decoder weights (issue 38, item 11):
    ``<cache_dir>/<name>-<revision>-<scheme>[-g<group>].safetensors`` (float32, the dequantized values;
    about 4 bytes per decoder weight, e.g. 0.4 GB for SmolLM2-135M)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)[-60:]
    g = f"-g{group_size}" if scheme in ("int4", "int3") else ""
    return cache_dir / f"{safe}-{revision}-{scheme}{g}.safetensors"


def _load_cached(model: Any, rep: QuantReport, cache_file: Path) -> bool:
    """Copy cached quantized weights into ``model``; False (nothing changed) when the file is absent,
    unreadable, or does not match the model's decoder linears name for name and shape for shape."""
    from safetensors import SafetensorError, safe_open

    t0 = time.perf_counter()
    lins = dict(iter_decoder_linears(model))
    try:
        with safe_open(str(cache_file), framework="pt") as f:
            meta = f.metadata() or {}
            if set(f.keys()) != set(lins) or meta.get("scheme") != rep.scheme:
                return False
            tensors = {k: f.get_tensor(k) for k in lins}
    except (OSError, SafetensorError, ValueError, RuntimeError):
        return False
    if any(tensors[k].shape != lin.weight.shape for k, lin in lins.items()):
        return False
    with torch.no_grad():
        for k, lin in lins.items():
            lin.weight.data.copy_(tensors[k].to(lin.weight.dtype))
    rep.n_matrices = len(lins)
    rep.n_params = sum(lin.weight.numel() for lin in lins.values())
    rep.mean_rel_error = float(meta.get("mean_rel_error", "nan"))
    rep.backend = meta.get("backend", rep.backend)
    rep.seconds = time.perf_counter() - t0
    rep.cached = True
    return True


def _save_cache(model: Any, rep: QuantReport, cache_file: Path) -> None:
    """Write the quantized decoder weights atomically (tmp file, then rename); a failure to write is
    recorded in ``rep.errors`` and never stops serving."""
    from safetensors.torch import save_file

    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + f".tmp{os.getpid()}")
        save_file({k: lin.weight.data.float().contiguous() for k, lin in iter_decoder_linears(model)}, str(tmp),
                  metadata={"scheme": rep.scheme, "group_size": str(rep.group_size), "backend": rep.backend,
                            "mean_rel_error": repr(rep.mean_rel_error)})
        tmp.replace(cache_file)
    except (OSError, RuntimeError) as e:
        rep.errors.append(f"quantized weights not cached in {cache_file}: {e}")


def quantize_model_weights(
    model: Any, scheme: str, group_size: int = 64, use_quanto: bool = True, *,
    cache_file: Path | None = None, progress: Callable[[int, int, float], None] | None = None,
) -> QuantReport:
    """Replace the decoder linears' weights of ``model`` in place by their quantize-dequantize.

    Args:
        model: a transformers causal LM (float32 weights expected; other dtypes are cast back).
        scheme: ``int8`` | ``int4`` | ``int3`` | ``fp8`` | ``nvfp4`` (see module docstring).
        group_size: int4/int3 group size along the input dimension (must divide every in_features).
        use_quanto: try optimum-quanto first (default); False forces the torch fallback.
        cache_file: read the quantized weights from this file when it matches the model (seconds
            instead of minutes: optimum-quanto's int4 takes ~176 s for SmolLM2 on two cores), else
            quantize and write it (:func:`quant_cache_file`). None: no cache (tests, calibration).
        progress: ``progress(done_matrices, total_matrices, elapsed_s)`` after each matrix.

    Returns:
        QuantReport with timing (seconds) and the mean relative Frobenius error.

    Raises:
        ValueError: unknown scheme, or no linear layer found.
    """
    if scheme not in ("int8", "int4", "int3", "fp8", "nvfp4"):
        raise ValueError(f"unknown quantization scheme {scheme!r}; use int8, int4, int3, fp8 or nvfp4")
    rep = QuantReport(scheme=scheme, group_size=group_size if scheme in ("int4", "int3") else None)
    if cache_file is not None and cache_file.is_file() and _load_cached(model, rep, cache_file):
        return rep
    use_quanto = use_quanto and scheme not in ("int3", "nvfp4")  # quanto has no 3-bit or NVFP4 type
    t0 = time.perf_counter()
    errs: list[float] = []
    n_fallback = 0
    stale = quanto_stale_lock() if use_quanto else None
    if stale is not None:
        use_quanto = False
        rep.errors.append(f"optimum-quanto skipped: its extension build lock {stale} is older than "
                          f"{QUANTO_STALE_LOCK_S:.0f} s (a killed build); delete it if no build is running")
    total = sum(1 for _ in iter_decoder_linears(model))
    with torch.no_grad():
        for name, lin in iter_decoder_linears(model):
            w = lin.weight.data
            dq = None
            if use_quanto:
                try:
                    dq = quanto_fake_quant(w, scheme, group_size)
                except ValueError:
                    raise
                except Exception as e:  # fall back to the torch RTN on any quanto failure
                    if len(rep.errors) < 3:
                        rep.errors.append(f"{name}: {type(e).__name__}: {e}")
            if dq is None:
                dq = _fallback(w, scheme, group_size)
                n_fallback += 1
            errs.append(float((dq.float() - w.float()).norm() / w.float().norm().clamp_min(1e-30)))
            lin.weight.data.copy_(dq.to(w.dtype))
            rep.n_matrices += 1
            rep.n_params += w.numel()
            if progress is not None:
                progress(rep.n_matrices, total, time.perf_counter() - t0)
    if rep.n_matrices == 0:
        raise ValueError("quantize_model_weights: no decoder linear layers found (expected Llama-style *_proj)")
    rep.seconds = time.perf_counter() - t0
    rep.mean_rel_error = sum(errs) / len(errs)
    rep.backend = "torch-rtn" if n_fallback * 2 > rep.n_matrices else "optimum-quanto"
    if cache_file is not None:
        _save_cache(model, rep, cache_file)
    return rep


# ---------------------------------------------------------------------------------------------
# runtime (activation / KV-cache) fake quantization: w8a8 and kv-fp8 profiles (issue 14)
# ---------------------------------------------------------------------------------------------

def int8_per_token_fake_quant(x: torch.Tensor) -> torch.Tensor:
    """Dynamic symmetric int8 per token: each row along the last dim scaled by max|x_row|/127; same dtype.

    This is the activation half of W8A8 (vLLM/compressed-tensors ``int8`` dynamic per-token
    activations; SmoothQuant's per-token scheme without the smoothing factors).
    """
    x32 = x.float()
    scale = x32.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.clamp(torch.round(x32 / scale), -127, 127) * scale).to(x.dtype)


def _act_quant_pre_hook(_module: torch.nn.Module, args: tuple) -> tuple:
    return (int8_per_token_fake_quant(args[0]),) + tuple(args[1:])


def install_act_int8(model: Any) -> int:
    """Fake-quantize the inputs of every decoder linear to int8 per token (forward pre-hooks).

    Returns the number of linears hooked. ``lm_head`` is left in full precision (as vLLM does).

    Raises:
        ValueError: no decoder linear found.
    """
    n = 0
    for _name, lin in iter_decoder_linears(model):
        lin.register_forward_pre_hook(_act_quant_pre_hook)
        n += 1
    if n == 0:
        raise ValueError("w8a8: no decoder linear layers found (expected Llama-style *_proj)")
    return n


def apply_runtime_quant(model: Any, profile: Any, tokenizer: Any = None) -> dict:
    """Install a profile's runtime fake quantization (``act_quant``, ``kv_cache_dtype``) on ``model``.

    Args:
        model: a float32 Llama-style causal LM (modified in place: hooks / attention function).
        profile: a ``simulator.profiles.Profile`` (reads ``act_quant`` and ``kv_cache_dtype``).
        tokenizer: encodes :data:`KV_CALIBRATION_TEXT` for the KV scales (None: token ids 1..128).

    Returns:
        A JSON-ready dict for ``BuildInfo.quant`` (empty when the profile asks for nothing).

    Raises:
        ValueError: unknown ``act_quant`` / ``kv_cache_dtype`` value, or an unsupported model.
    """
    out: dict = {}
    act = getattr(profile, "act_quant", None)
    kv = getattr(profile, "kv_cache_dtype", None)
    if act == "fp8-tile":  # issue 36: native FP8 GEMMs quantize activations per 1 x block tile
        from reference.native import install_act_fp8_tiles, native_block

        tile = native_block(tuple(m.weight.shape) for _, m in iter_decoder_linears(model))
        out["act_quant"] = f"fp8-e4m3-per-1x{tile}"
        out["act_quant_linears"] = install_act_fp8_tiles(model, tile)
    elif act == "nvfp4":  # issue 36: NVFP4 W4A4, activations with calibrated static tensor scales
        ids = list(tokenizer.encode(KV_CALIBRATION_TEXT)) if tokenizer is not None else list(range(1, 129))
        out.update(install_act_nvfp4(model, ids))
    elif act is not None:
        if act != "int8":
            raise ValueError(f"act_quant={act!r}: only 'int8' (dynamic per token), 'fp8-tile' or 'nvfp4' is supported")
        out["act_quant"] = "int8-per-token"
        out["act_quant_linears"] = install_act_int8(model)
    if kv is not None:
        if kv != "fp8":
            raise ValueError(f"kv_cache_dtype={kv!r}: only 'fp8' (E4M3) is supported")
        ids = list(tokenizer.encode(KV_CALIBRATION_TEXT)) if tokenizer is not None else list(range(1, 129))
        out.update(install_kv_fp8(model, ids))
    return out


class Fp32AccumLinear(torch.nn.Linear):
    """A float16/bfloat16 ``nn.Linear`` whose GEMM accumulates in float32: ``half(x32 @ W32ᵀ + b32)``.

    This is the arithmetic of a float16 or bfloat16 GEMM on a GPU (tensor cores multiply the
    16-bit operands exactly and accumulate in float32, then round the output to 16 bits; cuBLAS
    ``CUBLAS_COMPUTE_32F``), and of PyTorch's CPU 16-bit GEMMs, which also accumulate in float
    (``at::opmath_type``) but without native 16-bit instructions on AVX2 CPUs run 4-6x slower
    than float32 once a batch has more than a few rows. Inputs, weights and outputs stay 16-bit
    values; only the reduction order differs from a native kernel, as it does between any two
    kernels.
    The float32 copy of the weight (``w32``, [out, in] float32, 4 bytes/parameter) is a
    non-persistent buffer made at install time.
    """

    w32: torch.Tensor
    b32: torch.Tensor | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(torch.float32), self.w32, self.b32)
        return y.to(x.dtype)


def install_fp32_accumulation(model: torch.nn.Module) -> int:
    """Make every float16/bfloat16 ``nn.Linear`` of ``model`` an :class:`Fp32AccumLinear`, in place.

    Call after ``model.to(torch.float16)`` or ``.to(torch.bfloat16)`` (a later ``.to()`` would cast
    the float32 copies too).

    Args:
        model: a torch module whose linears hold 16-bit float weights [out, in].

    Returns:
        The number of linears changed (16-bit ones only; others are left alone).
    """
    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and mod.weight.dtype in (torch.float16, torch.bfloat16):
            mod.__class__ = Fp32AccumLinear
            mod.register_buffer("w32", mod.weight.detach().to(torch.float32), persistent=False)
            b = mod.bias
            mod.register_buffer("b32", None if b is None else b.detach().to(torch.float32), persistent=False)
            n += 1
    return n
