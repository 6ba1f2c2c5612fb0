"""Resampled calibration audits (``auditor.calibration.draws.run_audits``): a baseline revision and the
working tree, side by side.

Workload: the pools of ``--profiles`` (``PoolConfig(max_prompts=--max-prompts)``, read from ``--cache-dir``,
default ``auditor calibrate``'s cache, collected there on a first run) x the default, precision and
verification mixes x budgets of 300 and 3,000 tokens, ``--audits`` audits each (seed 0): ``run_audits`` end
to end (draws, evidence batches, every detector, the verdict with its power and rules-out records). This
process loads the pools and noise floors once and hands them to both sides pickled, so both audit the same
data. Measured without a profiler (``cProfile`` multiplies the cost of Python calls, so a profiled run
shows larger gains).

Method: the baseline (``--baseline``, a git revision; default b72a66c, the parent of the commit that
sped the audits up, 2c4d833) is exported with ``git archive`` to a
temporary directory; each round runs the workload once per side in a fresh interpreter (``PYTHONPATH`` and
working directory the side's tree), alternating which side goes first, and times ``run_audits`` alone
(imports and unpickling excluded); ``--repeats`` rounds; medians (min-max) and the median of the per-round
ratios. The two sides' outcomes (every ``AuditOutcome``, compared by ``repr``: types and float digits) must
be identical, else the script exits with status 1.

Usage:
  python benchmarks/audit_speed.py [--baseline b72a66c] [--cache-dir DIR] [--audits 6] [--repeats 3]
         [--max-prompts 24] [--profiles honest-fp32,int8,relaxed-threshold:0.7]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_CHILD = """
import json, pickle, sys, time
from dataclasses import asdict
from auditor.calibration import default_mix
from auditor.calibration.draws import run_audits
pools, floors, audits = pickle.load(open(sys.argv[1], "rb"))
mixes = [default_mix(s) for s in ("default", "precision", "verification")]
t = time.perf_counter()
outs = [o for pool in pools for m in mixes
        for o in run_audits(pool, floors, budgets=[300, 3000], audits=audits, mix=m, seed=0)]
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "outcomes": repr([asdict(o) for o in outs])}))
"""


def _export(rev: str, dest: Path) -> None:
    """The tree of git revision ``rev`` under ``dest`` (``git archive``)."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(dest, filter="data")


def _run(tree: Path, data: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(data)], cwd=tree, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="b72a66c",
                    help="git revision of the baseline (default b72a66c: before the audit speed-up)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="pool and noise-floor cache root (default: auditor calibrate's; collected when missing)")
    ap.add_argument("--profiles", default="honest-fp32,int8,relaxed-threshold:0.7")
    ap.add_argument("--max-prompts", type=int, default=24)
    ap.add_argument("--audits", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from auditor.calibration import PoolConfig
    from auditor.calibration.benchmark import load_reference_models
    from auditor.calibration.cells import get_noise_floor
    from auditor.calibration.collect import load_or_collect_pool

    refs = load_reference_models()
    cfg = PoolConfig(max_prompts=args.max_prompts)
    floors = get_noise_floor(refs, cache_dir=args.cache_dir)
    pools = [load_or_collect_pool(p, refs, cfg, cache_dir=args.cache_dir)[0] for p in args.profiles.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "workload.pkl"
        data.write_bytes(pickle.dumps((pools, floors, args.audits)))
        base = Path(tmp) / "baseline"
        base.mkdir()
        _export(args.baseline, base)
        sides = {f"baseline ({args.baseline})": base, "working tree": ROOT}
        names = list(sides)
        secs: dict[str, list[float]] = {n: [] for n in names}
        outcomes: dict[str, str] = {}
        for r in range(args.repeats):
            for n in names if r % 2 == 0 else names[::-1]:
                res = _run(sides[n], data)
                secs[n].append(res["seconds"])
                if outcomes.setdefault(n, res["outcomes"]) != res["outcomes"]:
                    print(f"{n}: outcomes differ between rounds", file=sys.stderr)
                    return 1
    n_audits = 3 * len(pools) * 2 * args.audits
    print(f"run_audits, {n_audits} audits ({len(pools)} pools x 3 mixes x 2 budgets x {args.audits}), "
          f"{args.repeats} alternating rounds:")
    for n in names:
        xs = secs[n]
        print(f"  {n:24s} median {statistics.median(xs):6.2f} s  (min {min(xs):.2f}, max {max(xs):.2f})")
    ratios = [b / a for a, b in zip(secs[names[0]], secs[names[1]], strict=True)]
    print(f"  working tree / baseline: median ratio {statistics.median(ratios):.3f} over rounds")
    same = outcomes[names[0]] == outcomes[names[1]]
    print(f"  outcomes identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
