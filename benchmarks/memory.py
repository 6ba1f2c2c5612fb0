"""Peak memory and time of the honest noise floor: the whole-array measurement before issue 41 vs the
blocked one (``FloorAccumulator``, row spill file, scoring ``row_sink``), side by side in one run.

Issue 41: the first gemma-3-270m audit was killed at 23 GB while measuring the floor, because every
honest variant's ``[positions, V]`` rows were kept (float32) with float64 copies of them and of the
reference's rows. This benchmark measures both measurements on the same model, prompts and tokens:

- ``old``: ``auditor.check.measured_floors.compute_floors`` as it was before issue 41 (commit :data:`OLD_COMMIT`'s
  parent), loaded from git history together with the ``compute_noise_floor`` of that commit (the
  whole-array reduction), not a re-implementation;
- ``new``: the current ``auditor.check.measured_floors.compute_floors`` (spill file in a temporary directory).

Each measurement runs in its own child process (``python benchmarks/memory.py --worker ...``), the
two paths interleaved (old, new, old, new, ...) ``--repeats`` times per model. Per child:

- ``peak``: the child's absolute peak RSS (``ru_maxrss`` from ``os.wait4``, KiB on Linux → MiB:
  interpreter, torch, the model's weights and the floor; what the kernel's OOM killer sees);
- ``floor extra``: the floor stage's own peak over the RSS it started from (the child resets its
  RSS high-water mark by writing ``5`` to ``/proc/self/clear_refs`` once the model is loaded, then
  reads ``VmHWM`` − ``VmRSS``-at-start from ``/proc/self/status``), so model loading does not hide it;
- ``wall``: seconds of the floor stage alone;
- the high-water mark over the floor's start when each honest variant's first prompt is decoded
  (``compute_floors``'s progress callback): which variant's set-up or the previous one's scoring
  reached the peak.

RSS, not tracemalloc: torch's tensors are not allocated through Python's allocator. Printed: the
median of each figure per path, the ratios old/new, and whether the floors agree (``NoiseFloor``
records compared as sorted JSON: ``identical`` bytes, else the largest relative difference of any
number; ``cross_kl`` — the full-vocabulary KL, summed in another order by the blocked path — as its
largest relative difference). Exits 1 when the floors of the two paths differ by more than
``--rtol`` (default 0: byte-identical records required) or a child fails.

Models (``--models``, comma-separated): the bundled ``smollm2-135m-instruct`` and ``gemma-3-270m``
(float32, loaded by ``reference.models.load_model``; installed packages, no hub), and ``tiny-200k``:
a random 2-layer Llama with a 200,000-token vocabulary (``tests/conftest.make_tiny_model``, SmolLM2
tokenizer) to show that the blocked floor's memory does not grow with positions × vocabulary. The
old path at full size (52 prompts × 32 tokens) needs ~23 GB for gemma-3-270m; keep ``--prompts`` ×
``--tokens`` small for it (``old`` needs about ``positions × V × 52`` bytes, ``--paths new`` skips it).

Usage::

    python benchmarks/memory.py [--models smollm2-135m-instruct,tiny-200k] [--prompts 6] [--tokens 12]
                                [--repeats 3] [--paths old,new] [--threads 2] [--rtol 0] [--json]

Linux only (``/proc/self/status``, ``os.wait4``). Needs git and this repository's history.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The commit that made the floor blocked (issue 41); the old path is read from its parent.
OLD_COMMIT = "cb8bc57"
#: Synthetic model name → vocabulary size (random tiny Llama, ``tests/conftest.make_tiny_model``).
TINY = {"tiny-200k": 200_000}
MIB = 1 << 20


# ----------------------------------------------------------------------------- child process
def status_kib(key: str, pid: int | str = "self") -> int:
    """A ``/proc/PID/status`` field in KiB (``VmRSS``, ``VmHWM``) of this process or of ``pid``.

    Raises:
        RuntimeError: the field is missing (not Linux, or a kernel thread).
    """
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


def reset_peak_rss() -> None:
    """Reset this process's RSS high-water mark (``VmHWM``) to its current RSS (``5`` written to
    ``/proc/self/clear_refs``), so that the next ``status_kib("VmHWM")`` is the peak since now."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def wait_peak(proc: subprocess.Popen[Any]) -> float:
    """Wait for ``proc`` and return its peak RSS in MiB (``ru_maxrss`` from ``os.wait4``, KiB on
    Linux); sets ``proc.returncode``. The kernel reads it from the same high-water mark that
    :func:`reset_peak_rss` resets: for a child that reset it, the peak since its last reset."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_maxrss / 1024


def _git_source(path: str) -> str:
    """The text of ``path`` at the parent of :data:`OLD_COMMIT`.

    Raises:
        RuntimeError: naming the command and the fix when git or the history is missing.
    """
    cmd = ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}^:{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.stderr.strip()}); run from a git clone with full history")
    return out.stdout


def _module(name: str, package: str, source: str) -> types.ModuleType:
    """Execute ``source`` as module ``name`` (registered in ``sys.modules``: dataclasses need it)."""
    mod = types.ModuleType(name)
    mod.__package__ = package
    mod.__file__ = f"<{OLD_COMMIT}^:{name}>"
    sys.modules[name] = mod
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)  # this repository's own history
    return mod


def old_noise_module() -> types.ModuleType:
    """``auditor.check.measured_floors`` before issue 41, bound to the ``compute_noise_floor`` of the same commit."""
    nf_name = "auditor.detectors._noise_floor_before_41"
    _module(nf_name, "auditor.detectors", _git_source("auditor/detectors/noise_floor.py"))
    src = _git_source("auditor/check/measured_floors.py")
    line = "from auditor.detectors.noise_floor import KLFloor, NoiseFloor, compute_noise_floor"
    if line not in src:
        raise RuntimeError(f"auditor/check/measured_floors.py at {OLD_COMMIT}^ does not import {line!r}; update benchmarks/memory.py")
    return _module("auditor._noise_before_41", "auditor", src.replace(line, line.replace(".noise_floor ", f".{nf_name.rsplit('.', 1)[1]} ")))


def _load(model: str) -> Any:
    """The float32 model named ``model`` as a ``reference.models.LoadedModel``."""
    import torch

    from reference.models import LoadedModel, load_model, pull_default_model

    if model not in TINY:
        return load_model(model, dtype="float32", device="cpu")
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_tiny_model  # type: ignore[import-not-found]  # tests/ is not a package
    from transformers import AutoTokenizer

    v = TINY[model]
    tok = AutoTokenizer.from_pretrained(str(pull_default_model()))
    return LoadedModel(model=make_tiny_model(vocab_size=v, seed=0), tokenizer=tok, name=model, path="tiny",
                       revision=f"tiny-{v}", dtype=torch.float32, device=torch.device("cpu"))


def worker(model: str, path: str, n_prompts: int, tokens: int, threads: int) -> dict[str, Any]:
    """One floor measurement (``path`` ``old`` or ``new``) of ``model``; the record the parent reads."""
    import torch

    from auditor.check.measured_floors import compute_floors, floor_prompts

    torch.set_num_threads(threads)
    lm = _load(model)
    names, prompts = floor_prompts(lm.tokenizer, n_prompts)
    old = old_noise_module() if path == "old" else None
    reset_peak_rss()  # the floor's own peak, not the model load's
    rss0 = status_kib("VmRSS")
    marks: list[tuple[str, int, float]] = []

    def progress(stage: str, done: int, total: int) -> None:  # high-water mark after each decoded prompt
        marks.append((stage, done, status_kib("VmHWM") / 1024))

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="floor-bench-") as d:
        if old is not None:
            fs = old.compute_floors({"float32": lm}, prompt_names=names, prompts=prompts, max_new_tokens=tokens,
                                    progress=progress)
        else:
            fs = compute_floors({"float32": lm}, prompt_names=names, prompts=prompts, max_new_tokens=tokens,
                                spill_dir=d, progress=progress)
    wall = time.perf_counter() - t0
    hwm = status_kib("VmHWM")
    return {
        "model": model, "path": path, "vocab": int(lm.model.config.vocab_size),
        "positions": int(sum(fs.meta["positions"].values())), "wall_s": wall,
        "rss_start_mib": rss0 / 1024, "floor_extra_mib": (hwm - rss0) / 1024,
        "floors": {r: f.to_dict() for r, f in fs.floors.items()}, "cross_kl": fs.cross_kl,
        "hwm_by_variant_mib": _first_mark_of_each_stage(marks, rss0 / 1024),
    }


def _first_mark_of_each_stage(marks: list[tuple[str, int, float]], rss0_mib: float) -> dict[str, float]:
    """Per progress stage (``noise floor: VARIANT``), the RSS high-water mark over the floor's start
    (MiB) when its first prompt was decoded: it covers the previous variant's scoring and this one's
    set-up (the bfloat16 weight copy) and decoding; ``end`` is the whole stage."""
    out: dict[str, float] = {}
    for stage, _, hwm in marks:
        out.setdefault(stage.removeprefix("noise floor: "), hwm - rss0_mib)
    out["end"] = status_kib("VmHWM") / 1024 - rss0_mib
    return out


# ----------------------------------------------------------------------------- parent
def run_child(model: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """``worker`` in a child process; adds its absolute peak RSS (``peak_mib``, from ``os.wait4``).

    Raises:
        RuntimeError: the child failed (its stderr's tail), e.g. killed for memory.
    """
    with tempfile.TemporaryDirectory(prefix="mem-bench-") as d:
        out = Path(d) / "out.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", model, path, str(args.prompts),
               str(args.tokens), str(args.threads), str(out)]
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        with (Path(d) / "stderr.txt").open("w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
            peak_mib = wait_peak(proc)
            err.seek(0)
            tail = err.read()[-2000:]
        if proc.returncode != 0:
            raise RuntimeError(f"{model} {path}: child exited {proc.returncode}: {tail}")
        rec: dict[str, Any] = json.loads(out.read_text())
    rec["peak_mib"] = peak_mib
    return rec


def _numbers(x: Any) -> list[float]:
    """Every number of a JSON value, in key order (for the relative difference of two records)."""
    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _numbers(x[k])]
    if isinstance(x, list):
        return [v for e in x for v in _numbers(e)]
    return [float(x)] if isinstance(x, int | float) and not isinstance(x, bool) else []


def max_rel_diff(a: Any, b: Any) -> float:
    """Largest |a − b| / max(|a|, |b|) over the numbers of two JSON values of the same shape (inf
    when the shapes differ)."""
    na, nb = _numbers(a), _numbers(b)
    if len(na) != len(nb):
        return float("inf")
    return max((abs(x - y) / max(abs(x), abs(y)) for x, y in zip(na, nb, strict=True) if x != y), default=0.0)


def compare(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Agreement of the two paths' floors and cross KL (see the module docstring)."""
    identical = json.dumps(old["floors"], sort_keys=True) == json.dumps(new["floors"], sort_keys=True)
    return {"floors_identical": identical, "floors_max_rel_diff": max_rel_diff(old["floors"], new["floors"]),
            "cross_kl_max_rel_diff": max_rel_diff(old["cross_kl"], new["cross_kl"])}


def summarize(model: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per path, ratios old/new and the floors' agreement for one model's records."""
    out: dict[str, Any] = {"model": model, "vocab": recs[0]["vocab"], "positions": recs[0]["positions"]}
    for path in ("old", "new"):
        rs = [r for r in recs if r["path"] == path]
        if rs:
            out[path] = {k: statistics.median(r[k] for r in rs) for k in ("peak_mib", "floor_extra_mib", "wall_s")}
            out[path]["runs"] = len(rs)
            out[path]["hwm_by_variant_mib"] = rs[-1].get("hwm_by_variant_mib", {})  # last run's
    if "old" in out and "new" in out:
        out["ratio_old_new"] = {k: out["old"][k] / out["new"][k] for k in ("peak_mib", "floor_extra_mib", "wall_s")}
        olds = [r for r in recs if r["path"] == "old"]
        news = [r for r in recs if r["path"] == "new"]
        out["agreement"] = compare(olds[0], news[0])
        out["repeatable"] = all(json.dumps(r["floors"], sort_keys=True) == json.dumps(news[0]["floors"], sort_keys=True)
                                for r in news)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,tiny-200k")
    ap.add_argument("--prompts", type=int, default=6, help="floor prompts (the audit's floor: 52)")
    ap.add_argument("--tokens", type=int, default=12, help="greedy tokens per prompt (the audit's floor: 32)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paths", default="old,new", help="old,new | new | old")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per child")
    ap.add_argument("--rtol", type=float, default=0.0, help="largest relative difference of the floors allowed")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=6, metavar=("MODEL", "PATH", "PROMPTS", "TOKENS", "THREADS", "OUT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        model, path, n, t, th, out = args.worker
        Path(out).write_text(json.dumps(worker(model, path, int(n), int(t), int(th))))
        return 0
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - {"old", "new"}:
        ap.error(f"--paths {args.paths!r}: give old,new or one of them")
    results = []
    failed = False
    for model in [m for m in args.models.split(",") if m]:
        recs = []
        for _ in range(args.repeats):
            for path in paths:  # interleaved: load drifts on a shared machine hit both paths alike
                try:
                    recs.append(run_child(model, path, args))
                except RuntimeError as e:
                    print(f"FAILED {e}", file=sys.stderr)
                    failed = True
        if not recs:
            continue
        s = summarize(model, recs)
        results.append(s)
        agree = s.get("agreement")
        if agree is not None and not agree["floors_identical"] and agree["floors_max_rel_diff"] > args.rtol:
            failed = True
        if args.json:
            continue
        print(f"{model}: V = {s['vocab']:,}, {s['positions']} floor positions (3 honest variants), medians of "
              f"{args.repeats}")
        for path in paths:
            if path in s:
                r = s[path]
                print(f"  {path}: peak RSS {r['peak_mib']:8.0f} MiB   floor extra {r['floor_extra_mib']:8.0f} MiB"
                      f"   floor wall {r['wall_s']:7.1f} s")
                print("       high-water mark over the floor's start, at the first prompt of: "
                      + ", ".join(f"{k} {v:.0f}" for k, v in r["hwm_by_variant_mib"].items()) + " MiB")
        if "ratio_old_new" in s and agree is not None:
            q = s["ratio_old_new"]
            print(f"  old/new: peak RSS {q['peak_mib']:.2f}×, floor extra {q['floor_extra_mib']:.2f}×, "
                  f"wall {q['wall_s']:.2f}×")
            print(f"  floors {'byte-identical' if agree['floors_identical'] else 'differ'} (max rel. diff "
                  f"{agree['floors_max_rel_diff']:.1e}); cross KL max rel. diff {agree['cross_kl_max_rel_diff']:.1e}; "
                  f"new path repeatable: {s['repeatable']}")
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
