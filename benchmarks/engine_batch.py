"""Engine-served pool requests on CPU: one at a time vs in lock-step batches, side by side.

The pools of draft-dependent lossy verifiers (relaxed-threshold, typical-acceptance, greedy-relaxed)
are collected through the simulator's speculative loop. ``SimulatorEngine.generate`` serves one
request per target forward; ``SimulatorEngine.generate_batch`` (``reference.speculative_batch``) serves
``--batch`` requests per forward, each with its own drafts, verifier and draws. This script times both
on the same requests (the pool's own: ``auditor.calibration.collect.build_requests``) with one torch
thread, as each ``auditor calibrate --workers 2`` process runs, and checks that they agree.

Method: one warm-up of each, then ``--repeats`` rounds in which the two run back to back in alternating
order; medians over rounds (min–max) of seconds per 1,000 emitted tokens, and the per-round ratio's median.
Also printed: how many requests emitted exactly the same tokens both ways (the rest differ only where a
decision sits within float rounding of its threshold; see ``reference.speculative_batch``).

Usage:
  python benchmarks/engine_batch.py [--profile relaxed-threshold:0.7] [--requests 32] [--batch 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auditor.calibration.collect import build_requests
from auditor.calibration.pool import PROVIDER_TOP_N, PoolConfig
from reference.models import load_model
from simulator.engine import ChoiceResult, SimulatorEngine
from simulator.profiles import get_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="relaxed-threshold:0.7")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    lm = load_model()
    prof = get_profile(a.profile)
    greedy = prof.name == "greedy-relaxed"
    reqs = [r for r in build_requests(lm.tokenizer, PoolConfig(), n_samples=2) if (r.temperature == 0) == greedy]
    reqs = sorted(reqs[: a.requests], key=lambda r: len(r.prompt_ids))
    eng = SimulatorEngine(prof, lm, seed=0, copy_model=True)
    why = eng.batch_unsupported()
    if why is not None:
        sys.exit(f"{a.profile}: cannot batch ({why})")

    def one() -> list[ChoiceResult]:
        return [eng.generate(list(r.prompt_ids), max_tokens=r.max_tokens, temperature=r.temperature, seed=r.seed,
                             top_n=PROVIDER_TOP_N) for r in reqs]

    def batched() -> list[ChoiceResult]:
        out: list[ChoiceResult] = []
        for b in range(0, len(reqs), a.batch):
            ch = reqs[b : b + a.batch]
            out += eng.generate_batch([list(r.prompt_ids) for r in ch], max_tokens=[r.max_tokens for r in ch],
                                      temperature=ch[0].temperature, seeds=[r.seed for r in ch], top_n=PROVIDER_TOP_N)
        return out

    def timed(fn):
        t = time.perf_counter()
        res = fn()
        return time.perf_counter() - t, res

    _, ra = timed(one)
    _, rb = timed(batched)
    toks = sum(len(c.tokens) for c in ra)
    same = sum([t.token_id for t in x.tokens] == [t.token_id for t in y.tokens] for x, y in zip(ra, rb, strict=True))
    sa, sb, ratios = [], [], []
    for i in range(a.repeats):
        order = (one, batched) if i % 2 == 0 else (batched, one)
        got = {fn: timed(fn)[0] for fn in order}
        sa.append(got[one] / toks * 1000)
        sb.append(got[batched] / toks * 1000)
        ratios.append(got[one] / got[batched])
    print(f"{a.profile}: {len(reqs)} requests, {toks} tokens, batches of {a.batch}, 1 thread, {a.repeats} rounds")
    print(f"  one at a time : {statistics.median(sa):6.2f} s / 1k tokens ({min(sa):.2f}-{max(sa):.2f})")
    print(f"  lock-step     : {statistics.median(sb):6.2f} s / 1k tokens ({min(sb):.2f}-{max(sb):.2f})")
    print(f"  ratio (median of rounds): {statistics.median(ratios):.2f}x; identical tokens in {same}/{len(reqs)} requests")


if __name__ == "__main__":
    main()
