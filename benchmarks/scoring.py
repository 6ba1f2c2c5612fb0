"""Teacher-forced scoring throughput and memory: ``score_continuations`` vs one plain batched forward.

For one model, device and dtype, on the same synthetic workload (``--seqs`` sequences of
``--prompt-len`` prompt + ``--cont-len`` continuation tokens; the defaults have the shape of the
default suite: 58 sequences, about 60 prompt and 32 completion tokens each), two methods run:

  score  — ``reference.scoring.score_continuations`` (token-budgeted batches, lm_head on the
           continuation positions only, logits reduced ``logit_rows`` rows at a time; chosen
           logprob, top-20, tail mass)
  plain  — the same batches through ``model(input_ids, attention_mask, position_ids)`` (full
           ``[B, L, V]`` logits, nothing reduced): the cost of "just running the model"

Method: ``--repeats`` rounds (>= 3) after one warm-up of each; in each round both methods run back
to back in alternating order. Figures: tokens/s (prompt + continuation tokens, the same for both)
per method as the median over rounds (min-max), the ratio ``score / plain`` per round and its
median (goal >= 0.8), and peak memory per method: host RSS sampled every 5 ms (psutil when
installed, else ``ru_maxrss`` of the whole run) and ``torch.cuda.max_memory_allocated`` on CUDA.

Usage:
  python benchmarks/scoring.py [--model smollm2-135m-instruct|gemma-3-270m|DIR] [--device auto|cpu|cuda|cuda:N]
         [--dtype float32|bfloat16] [--device-map auto] [--seqs 58] [--prompt-len 60] [--cont-len 32]
         [--token-budget 4096] [--repeats 3] [--threads 0] [--json out.json]

Needs only torch, transformers, safetensors and numpy (runs on an accelerator machine without the
auditor's other dependencies); ``--model DIR`` takes a converted model directory.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference.models import load_model
from reference.scoring import DEFAULT_TOKEN_BUDGET, input_device, plan_batches, score_continuations


class PeakRSS:
    """Peak resident set size (bytes) of this process while the block runs (5 ms sampling)."""

    def __init__(self) -> None:
        try:
            import psutil

            self._proc = psutil.Process()
        except ImportError:  # pragma: no cover - minimal machines
            self._proc = None
        self.peak = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> PeakRSS:
        if self._proc is not None:
            self.peak = self._proc.memory_info().rss
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._stop.set()
            self._t.join()
        else:
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def workload(vocab: int, seqs: int, prompt_len: int, cont_len: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Random ids (3..vocab-1) with lengths jittered +-25% around the given means (seeded)."""
    g = torch.Generator().manual_seed(seed)
    prompts, conts = [], []
    for _ in range(seqs):
        lp = max(1, int(prompt_len * (0.75 + 0.5 * torch.rand(1, generator=g).item())))
        lc = max(1, int(cont_len * (0.75 + 0.5 * torch.rand(1, generator=g).item())))
        prompts.append(torch.randint(3, vocab, (lp,), generator=g).tolist())
        conts.append(torch.randint(3, vocab, (lc,), generator=g).tolist())
    return prompts, conts


def plain_forward(model, prompts, conts, token_budget: int, batch_size: int) -> None:
    """The same batches as the scorer, through the model's full forward (logits for every position)."""
    dev = input_device(model)
    lengths = [len(p) + len(c) for p, c in zip(prompts, conts, strict=True)]
    with torch.inference_mode():
        for b in plan_batches(lengths, token_budget, batch_size):
            L = max(lengths[i] for i in b)
            ids = torch.zeros((len(b), L), dtype=torch.long)
            mask = torch.zeros((len(b), L), dtype=torch.long)
            for r, i in enumerate(b):
                seq = prompts[i] + conts[i]
                ids[r, L - len(seq):] = torch.tensor(seq)
                mask[r, L - len(seq):] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=False)
            out.logits[:, -1, 0].cpu()  # force completion (CUDA) without a copy of the logits
            del out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    lm = load_model(args.model, dtype=args.dtype, device=args.device, device_map=args.device_map)
    load_s = time.perf_counter() - t0
    model = lm.model
    dev = input_device(model)
    V = int(model.config.vocab_size)
    prompts, conts = workload(V, args.seqs, args.prompt_len, args.cont_len, args.seed)
    n_tokens = sum(len(p) + len(c) for p, c in zip(prompts, conts, strict=True))
    methods = {
        "score": lambda: score_continuations(lm, prompts, conts, top_k=20, token_budget=args.token_budget,
                                             batch_size=args.batch_size),
        "plain": lambda: plain_forward(model, prompts, conts, args.token_budget, args.batch_size),
    }
    for f in methods.values():  # warm-up (kernels, allocator)
        f()
    _sync(dev)
    times: dict[str, list[float]] = {m: [] for m in methods}
    peak_rss: dict[str, int] = dict.fromkeys(methods, 0)
    peak_cuda: dict[str, int] = dict.fromkeys(methods, 0)
    for r in range(args.repeats):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        for m in order:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with PeakRSS() as pk:
                _sync(dev)
                t = time.perf_counter()
                methods[m]()
                _sync(dev)
                times[m].append(time.perf_counter() - t)
            peak_rss[m] = max(peak_rss[m], pk.peak)
            if dev.type == "cuda":
                peak_cuda[m] = max(peak_cuda[m], int(torch.cuda.max_memory_allocated()))
    ratios = [tp / ts for ts, tp in zip(times["score"], times["plain"], strict=True)]
    res = {
        "model": args.model,
        "revision": lm.revision,
        "device": str(dev),
        "device_map": sorted({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()}) or None,
        "dtype": args.dtype,
        "vocab_size": V,
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "seqs": args.seqs,
        "tokens": n_tokens,
        "continuation_tokens": sum(len(c) for c in conts),
        "token_budget": args.token_budget,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "load_s": round(load_s, 2),
        "tokens_per_s": {m: round(n_tokens / statistics.median(ts), 1) for m, ts in times.items()},
        "tokens_per_s_range": {m: [round(n_tokens / max(ts), 1), round(n_tokens / min(ts), 1)] for m, ts in times.items()},
        "ratio_score_over_plain": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "peak_rss_mb": {m: round(v / 2**20, 1) for m, v in peak_rss.items()},
        "peak_cuda_mb": {m: round(v / 2**20, 1) for m, v in peak_cuda.items()} if dev.type == "cuda" else None,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "torch": torch.__version__,
    }
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--device-map", default=None, choices=[None, "auto"], help="spread over every visible GPU")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--seqs", type=int, default=58)
    ap.add_argument("--prompt-len", type=int, default=60)
    ap.add_argument("--cont-len", type=int, default=32)
    ap.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    try:
        res = run(args)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    line = (f"{res['model']} {res['dtype']} on {res['device']}: score {res['tokens_per_s']['score']} tok/s, "
            f"plain forward {res['tokens_per_s']['plain']} tok/s, ratio {res['ratio_score_over_plain']} "
            f"({res['ratio_range'][0]}-{res['ratio_range'][1]}), peak RSS score {res['peak_rss_mb']['score']} MB / "
            f"plain {res['peak_rss_mb']['plain']} MB")
    if res["peak_cuda_mb"]:
        line += f", peak CUDA score {res['peak_cuda_mb']['score']} MB / plain {res['peak_cuda_mb']['plain']} MB"
    print(line)
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
