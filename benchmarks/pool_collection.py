"""Calibration pool collection on CPU: batch size and float16 GEMM accumulation, side by side.

Two comparisons on the bundled model, one torch thread (as each ``auditor calibrate --workers 2``
process runs):

  batch  — ``decode_rows`` of ``--prompts`` prompts x ``--samples`` temperature-1 samples of
           ``--tokens`` tokens, in batches of 32 rows (the old ``PoolConfig.batch_size``) and of
           128 rows (the new default); figure: seconds per 1,000 decoded tokens.
  fp16   — one teacher-forced forward of ``--seqs`` x ``--seq-len`` tokens through the model cast to
           float16 with PyTorch's native CPU float16 GEMM, and through the same float16 model with
           ``simulator.quantize.install_fp32_accumulation`` (the honest-fp16 profile); figures:
           seconds, and the mean KL (nats) of each from the float32 model and from each other.

Method: one warm-up of each, then ``--repeats`` rounds in which the variants run back to back in
alternating order; medians over rounds (min-max), and the per-round ratio's median.

Usage:
  python benchmarks/pool_collection.py [--prompts 8] [--samples 12] [--tokens 24] [--seqs 4]
         [--seq-len 96] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auditor.calibration.decoding import decode_rows
from reference.models import load_model
from simulator.quantize import install_fp32_accumulation


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _rounds(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Warm-up, then ``repeats`` alternating rounds; seconds per variant per round."""
    for fn in variants.values():
        fn()
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            out[n].append(_timed(variants[n]))
    return out


def _line(name: str, xs: list[float], scale: float = 1.0, unit: str = "s") -> str:
    return f"  {name:<28} {statistics.median(xs) * scale:8.2f} {unit} (min {min(xs) * scale:.2f}, max {max(xs) * scale:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if a.repeats < 3:
        ap.error("--repeats must be >= 3")
    torch.set_num_threads(1)
    lm = load_model("smollm2-135m-instruct")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (60 + 7 * i,), generator=g).tolist() for i in range(a.prompts)]
    eos = list(lm.eos_token_ids)

    def decode(batch: int) -> None:
        per = max(1, batch // a.samples)
        for b in range(0, len(prompts), per):
            chunk = prompts[b : b + per]
            decode_rows(lm.model, chunk, max_new_tokens=a.tokens, temperature=1.0, top_p=1.0, top_k=0,
                        eos_ids=eos, seeds=list(range(len(chunk) * a.samples)), expand=a.samples)

    n_tok = a.prompts * a.samples * a.tokens
    res = _rounds({"batch 32": lambda: decode(32), "batch 128": lambda: decode(128)}, a.repeats)
    print(f"batch: {a.prompts} prompts x {a.samples} samples x {a.tokens} tokens = {n_tok} tokens, 1 thread")
    for n, xs in res.items():
        print(_line(n, xs, 1000 / n_tok, "s / 1k tokens"))
    ratio = [x / y for x, y in zip(res["batch 128"], res["batch 32"], strict=True)]
    print(f"  ratio 128 / 32 (median of rounds): {statistics.median(ratio):.2f}")

    m16 = copy.deepcopy(lm.model).to(torch.float16)
    m16e = copy.deepcopy(lm.model).to(torch.float16)
    install_fp32_accumulation(m16e)
    ids = torch.randint(100, 40000, (a.seqs, a.seq_len), generator=g)
    logp: dict[str, torch.Tensor] = {}

    def fwd(name: str, m: torch.nn.Module) -> None:
        with torch.inference_mode():
            logp[name] = torch.log_softmax(m(input_ids=ids).logits.float(), -1)

    res = _rounds({"fp16 native GEMM": lambda: fwd("native", m16),
                   "fp16, fp32 accumulation": lambda: fwd("emul", m16e),
                   "fp32": lambda: fwd("fp32", lm.model)}, a.repeats)
    print(f"fp16: one forward of {a.seqs} x {a.seq_len} tokens, 1 thread")
    for n, xs in res.items():
        print(_line(n, xs))
    ratio = [x / y for x, y in zip(res["fp16, fp32 accumulation"], res["fp16 native GEMM"], strict=True)]
    print(f"  ratio fp32-accumulating / native (median of rounds): {statistics.median(ratio):.2f}")

    def kl(p: torch.Tensor, q: torch.Tensor) -> float:
        return float((p.exp() * (p - q)).sum(-1).mean())

    print(f"  mean KL(fp32 || native) {kl(logp['fp32'], logp['native']):.2e} nats, "
          f"KL(fp32 || fp32-accumulating) {kl(logp['fp32'], logp['emul']):.2e}, "
          f"KL(native || fp32-accumulating) {kl(logp['native'], logp['emul']):.2e}")


if __name__ == "__main__":
    main()
