#!/usr/bin/env python3
"""Record an honest provider's outputs on a real GPU engine, for the calibration (issue 14).

Standalone on purpose: it imports only the standard library, numpy, torch and transformers (plus the
``gguf`` package that transformers' GGUF reader needs), so it runs on a GPU machine that has none of this
project's dependencies. It serves the bundled reference weights (the SmolLM2-135M-Instruct GGUF,
dequantized by transformers exactly as ``reference.models.convert_gguf`` does here; every float32 tensor is
checked against ``manifest.json``, the sha256 of the reference's own tensors) in each requested dtype
with plain batched decoding — left-padded prompts, an attention mask, a KV cache, cuBLAS GEMMs and PyTorch's
scaled-dot-product attention: a real engine's reduction orders, none of which the simulator emulates.

Every request of ``requests.json`` (``auditor calibrate --export-requests``: the calibration pool's exact
prompt token ids, temperatures, budgets and seeds) is decoded once per dtype:

- temperature 0: the argmax of the served logits;
- temperature 1: an exact draw from softmax(logits in float32), by inverse CDF in float64 with the request's
  own uniform stream (numpy ``default_rng(seed)``, one uniform per position), so a draw depends on the
  request alone, never on the batch it shares.

Per emitted position it records the token, the provider's logprob of it and the top-20 alternatives
(log_softmax of the served logits in float32, as vLLM and the OpenAI API report them). Decoding stops at an
EOS id or ``max_tokens``. Output, per dtype: ``<prefix>-<dtype>.npz`` (keys [I] str; offsets [I+1] int64;
token_ids [N] int32; logprob [N] float32 (nats); top_ids [N, 20] int32; top_lp [N, 20] float32 (nats); and
what each request was: prompt_sha [I] str, seeds [I] int64, temperatures [I] float64, max_tokens [I] int64) and
``<prefix>-<dtype>.json`` (environment: GPU, versions, attention implementation, TF32 flags, seconds).
``auditor.calibration.recorded`` turns such a file into a calibration pool (the reference side is
teacher-forced there, on the CPU).

Usage::

    python3 scripts/gpu_pool.py --gguf model.gguf --requests requests.json --manifest manifest.json \\
        --dtypes bfloat16,float16 --device cuda --out OUT
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

TOP_N = 20
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def say(msg: str) -> None:
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def load_float32_model(gguf: Path, manifest: dict[str, str]) -> tuple[torch.nn.Module, dict]:
    """The reference weights in float32, via transformers' GGUF reader; checked tensor by tensor.

    Only public API (``from_pretrained(dir, gguf_file=...)``, as ``reference.models.convert_gguf`` converts the
    GGUF), so it reads the same on transformers 5.17 and 5.25.

    Args:
        gguf: the SmolLM2-135M-Instruct Q4_1 GGUF.
        manifest: tensor name → sha256 (hex) of the reference's float32 tensor bytes.

    Returns:
        (model on the CPU in float32, check report {matched: int, mismatched, missing, unexpected: [names]}):
        ``missing`` = in the manifest, not in the model; ``unexpected`` = in the model, not in the manifest.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    report: dict = {"matched": 0, "mismatched": [], "missing": [], "unexpected": []}
    sd = model.state_dict()
    report["unexpected"] = sorted(set(sd) - set(manifest))
    for name, digest in manifest.items():
        t = sd.get(name)
        if t is None:
            report["missing"].append(name)
            continue
        got = hashlib.sha256(t.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()
        if got == digest:
            report["matched"] += 1
        else:
            report["mismatched"].append(name)
    return model, report


def prompt_digest(prompt_ids: list[int]) -> str:
    """First 16 hex of sha256 of ``"1,2,3"`` (= ``auditor.calibration.recorded.prompt_digest``)."""
    return hashlib.sha256(",".join(str(int(t)) for t in prompt_ids).encode()).hexdigest()[:16]


def _top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_softmax in float32 of [B, V] logits and its top-N (ids, logprobs)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top_lp, top_ids = torch.topk(lp, TOP_N, dim=-1)
    return lp, top_ids, top_lp


def decode_batch(model: torch.nn.Module, reqs: list[dict], eos: set[int], device: str, pad_id: int) -> list[dict]:
    """Plain batched decoding of requests that share one temperature (0 or 1).

    Args:
        model: the served model (its dtype and device set).
        reqs: requests {key, prompt_ids, max_tokens, temperature, seed}.
        eos: end-of-sequence ids (a row stops after emitting one).
        device: torch device of the model.
        pad_id: id used for left padding and for finished rows (masked out).

    Returns:
        Per request {token_ids [T] int, logprob [T] float, top_ids [T, 20] int, top_lp [T, 20] float}.
    """
    b = len(reqs)
    temp = float(reqs[0]["temperature"])
    lens = [len(r["prompt_ids"]) for r in reqs]
    width = max(lens)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, r in enumerate(reqs):
        ids[i, width - lens[i]:] = torch.tensor(r["prompt_ids"], dtype=torch.long)
        mask[i, width - lens[i]:] = 1
    ids, mask = ids.to(device), mask.to(device)
    rngs = [np.random.default_rng(int(r["seed"])) for r in reqs]
    steps = max(int(r["max_tokens"]) for r in reqs)
    out: list[dict] = [{"token_ids": [], "logprob": [], "top_ids": [], "top_lp": []} for _ in reqs]
    done = [False] * b
    past = None
    cur_ids, cur_mask = ids, mask
    with torch.inference_mode():
        for _ in range(steps):
            pos = (cur_mask.cumsum(-1) - 1).clamp(min=0)
            if past is not None:
                pos = pos[:, -1:]
            # logits of the last position only, as a serving engine computes them (vLLM: sampled positions only)
            res = model(input_ids=cur_ids, attention_mask=cur_mask, position_ids=pos, past_key_values=past,
                        use_cache=True, logits_to_keep=1)
            past = res.past_key_values
            lp, top_ids, top_lp = _top(res.logits[:, -1, :])
            if temp == 0:
                nxt = lp.argmax(dim=-1).cpu().numpy()
            else:  # inverse CDF in float64, row by row: the draw depends on the row's own uniform only
                cdf = torch.cumsum(torch.exp(lp.double()), dim=-1)  # [B, V]
                u = torch.tensor([g.random() for g in rngs], dtype=torch.float64, device=cdf.device)
                at = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous())  # first cdf >= u·total
                nxt = at.clamp(max=cdf.shape[1] - 1)[:, 0].cpu().numpy()
            lp_c = lp.cpu().numpy()
            ti, tl = top_ids.cpu().numpy(), top_lp.cpu().numpy()
            for i, r in enumerate(reqs):
                if done[i]:
                    continue
                t = int(nxt[i])
                o = out[i]
                o["token_ids"].append(t)
                o["logprob"].append(float(lp_c[i, t]))
                o["top_ids"].append(ti[i])
                o["top_lp"].append(tl[i])
                if t in eos or len(o["token_ids"]) >= int(r["max_tokens"]):
                    done[i] = True
            if all(done):
                break
            feed = torch.tensor([int(nxt[i]) if not done[i] else pad_id for i in range(b)], dtype=torch.long)
            cur_ids = feed.to(device)[:, None]
            live = torch.tensor([0 if done[i] else 1 for i in range(b)], dtype=torch.long, device=device)
            cur_mask = torch.cat([cur_mask, live[:, None]], dim=1)
    return [
        {
            "token_ids": np.asarray(o["token_ids"], np.int64),
            "logprob": np.asarray(o["logprob"], np.float64),
            "top_ids": np.asarray(o["top_ids"], np.int64).reshape(-1, TOP_N),
            "top_lp": np.asarray(o["top_lp"], np.float64).reshape(-1, TOP_N),
        }
        for o in out
    ]


def record(model: torch.nn.Module, requests: list[dict], eos: set[int], device: str, batch_size: int,
           pad_id: int) -> dict[str, dict]:
    """Decode every request (grouped by temperature, batches of ``batch_size``); key → outputs."""
    results: dict[str, dict] = {}
    for temp in sorted({float(r["temperature"]) for r in requests}):
        rs = [r for r in requests if float(r["temperature"]) == temp]
        for s in range(0, len(rs), batch_size):
            chunk = rs[s:s + batch_size]
            for r, o in zip(chunk, decode_batch(model, chunk, eos, device, pad_id), strict=True):
                results[r["key"]] = o
            say(f"  T={temp:g}: {min(s + batch_size, len(rs))}/{len(rs)} requests")
    return results


def save(results: dict[str, dict], requests: list[dict], path: Path) -> None:
    """Write the ragged outputs of ``requests`` (in order) as one compressed npz (layout: module docstring).

    Besides the outputs it stores what each request was (prompt_sha [I] str, seeds [I] int64, temperatures [I]
    float64, max_tokens [I] int64), so the calibration can name a request it would read for a different one.
    """
    keys = [r["key"] for r in requests]
    lens = [len(results[k]["token_ids"]) for k in keys]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    def cat(f: str, dtype: type, tail: tuple = ()) -> np.ndarray:
        parts = [np.asarray(results[k][f]).reshape((-1, *tail)) for k in keys]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros((0, *tail), dtype)

    np.savez_compressed(
        path, keys=np.asarray(keys, dtype=str), offsets=offsets, token_ids=cat("token_ids", np.int32),
        logprob=cat("logprob", np.float32), top_ids=cat("top_ids", np.int32, (TOP_N,)),
        top_lp=cat("top_lp", np.float32, (TOP_N,)),
        prompt_sha=np.asarray([prompt_digest(r["prompt_ids"]) for r in requests], dtype=str),
        seeds=np.asarray([int(r["seed"]) for r in requests], np.int64),
        temperatures=np.asarray([float(r["temperature"]) for r in requests], np.float64),
        max_tokens=np.asarray([int(r["max_tokens"]) for r in requests], np.int64),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--requests", required=True, type=Path)
    ap.add_argument("--manifest", required=True, type=Path, help="sha256 of the reference's float32 tensors")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prefix", default="gpu")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--limit", type=int, default=None, help="first N requests of each temperature (dry runs)")
    a = ap.parse_args(argv)
    t_all = time.perf_counter()
    spec = json.loads(a.requests.read_text())
    requests = spec["requests"]
    if a.limit is not None:
        requests = [r for t in sorted({r["temperature"] for r in requests})
                    for r in [q for q in requests if q["temperature"] == t][:a.limit]]
    eos = {int(e) for e in spec["eos_ids"]}
    pad_id = int(spec.get("pad_id", next(iter(eos))))
    manifest = json.loads(a.manifest.read_text())["tensors"]
    say(f"python {platform.python_version()}, torch {torch.__version__}, device {a.device}, {len(requests)} requests")
    t0 = time.perf_counter()
    model32, check = load_float32_model(a.gguf, manifest)
    load_s = time.perf_counter() - t0
    names = sorted(manifest)
    say(f"weights: {check['matched']}/{len(manifest)} float32 tensors bit-identical to the reference manifest "
        f"({names[0]} ... {names[-1]}); mismatched {check['mismatched'][:5]}, missing {check['missing'][:5]}, "
        f"not in the manifest {check['unexpected'][:5]} ({load_s:.1f} s)")
    if check["mismatched"] or check["missing"] or check["unexpected"]:
        say("ABORT: these are not the reference's weights (see the lists above); nothing recorded")
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    import transformers

    keys = [r["key"] for r in requests]
    for name in a.dtypes.split(","):
        model = copy.deepcopy(model32).to(dtype=DTYPES[name], device=a.device)  # the float32 weights, cast once
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        say(f"{name}: decoding")
        results = record(model, requests, eos, a.device, a.batch_size, pad_id)
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        dec_s = time.perf_counter() - t1
        stem = f"{a.prefix}-{name}"
        save(results, requests, a.out / f"{stem}.npz")
        env = {
            "dtype": name, "device": a.device,
            "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else platform.processor(),
            "cuda": torch.version.cuda, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "numpy": np.__version__,
            "attn_implementation": str(getattr(model.config, "_attn_implementation", None)),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
            "reduced_precision_reduction_fp16": bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
            "reduced_precision_reduction_bf16": bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
            "batch_size": a.batch_size, "requests": len(requests),
            "tokens": int(sum(len(results[k]["token_ids"]) for k in keys)),
            "decode_s": round(dec_s, 2), "load_s": round(load_s, 2), "weights_check": {"matched": check["matched"]},
            "requests_sha256": hashlib.sha256(a.requests.read_bytes()).hexdigest(),
            "model": spec.get("model"), "revision": spec.get("revision"),
        }
        (a.out / f"{stem}.json").write_text(json.dumps(env, indent=2))
        say(f"{name}: {env['tokens']} tokens in {dec_s:.1f} s -> {stem}.npz")
        del model
    say(f"done in {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
