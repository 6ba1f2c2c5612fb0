"""Peak RSS of a whole first audit, per stage: issue 41's acceptance figure.

For each ``MODEL:PROFILE:SUITE`` (``--audits``) this benchmark

1. starts the provider simulator as its own process (``auditor.demo.SimulatorProcess``)::

       python -m auditor serve --profile PROFILE --model MODEL --served-model-name MODEL --device cpu --port N

2. writes a ``providers.toml`` into a fresh temporary ``SPEC_AUDITOR_HOME`` (``api = "completions"``
   for a base model such as gemma-3-270m, ``"chat"`` otherwise; ``reference = MODEL``; logprobs,
   echo and streaming declared as the simulator serves them);
3. runs the audit in a child process (``python benchmarks/first_audit_memory.py --worker ...``) with
   that home and nothing else: no ``SPEC_AUDITOR_NOISE_DIR`` (so the floor cache is the home's own
   ``noise/``, empty: the honest noise floor is measured, as on a first audit), no
   ``AUDITOR_DB_URL`` (a fresh SQLite store in the home), no ``SPEC_AUDITOR_MEMORY_AVAILABLE``.
   Only ``models/`` is a link to the converted models (``--models-dir``, default the user cache of
   ``auditor models pull``): converting the GGUF is ``auditor models pull``'s work, not the audit's.
   The child calls ``auditor.check.pipeline.run_check(provider, suite=SUITE, config_path=...,
   progress=callback)`` with the suite's whole budget (``auditor check``'s default).

The callback ``(stage, done, total)`` groups the audit's stages:

- ``setup+probing``: loading the reference, probing the provider, the pre-flight (everything before
  the first ``noise floor: VARIANT`` or ``reference scoring (DTYPE)`` stage);
- ``floor``: the ``noise floor: VARIANT`` stages (absent when the floor was cached);
- ``scoring``: the ``reference scoring (DTYPE)`` stages, until the last batch is scored;
- ``detectors+report``: from there to ``run_check``'s return (detectors, verdict, report, store).

On each change of group the child reads its RSS high-water mark (``VmHWM`` of /proc/self/status),
keeps it as the finished group's peak, and resets it (``5`` to /proc/self/clear_refs); a group's
peak is therefore the largest RSS while it ran (absolute: weights and interpreter included), and
its seconds are wall-clock. Notes (callbacks with ``total == 0``) do not change the group. The
audit's peak in all is the largest of the groups' peaks and of the high-water mark before the first
group (imports): the child's ``ru_maxrss`` cannot serve, the kernel keeps it in the high-water mark
that each reset clears (it is the last group's peak; recorded as ``last_reset_maxrss_mib``). The
simulator's own peak (its ``VmHWM`` just before it is stopped) is printed apart: it is the
provider's memory, not the auditor's.

Printed: a table per audit (verdict, exit code, whether the floor was measured, peak RSS per group
and in all in MiB, wall seconds, load average before/after) and, with ``--json``, the records as
JSON. Exit status 1 when a verdict is not the profile's expected one or an audit's peak exceeds
``--max-mib`` (per model: ``--max-mib gemma-3-270m=2861,smollm2-135m-instruct=1907``: issue 41's
3 GB / 2 GB), 2 when a simulator or a child fails.

Usage::

    python benchmarks/first_audit_memory.py [--audits gemma-3-270m:honest-fp32:precision,...]
        [--models-dir DIR] [--noise-dir DIR] [--max-mib M=MIB,...] [--json]

``--noise-dir DIR`` shares a floor cache between audits (a warm floor; the table says ``cold no``).
Linux only (/proc, ``os.wait4``). One audit at a time; each needs the model loaded twice (simulator
and reference).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from memory import reset_peak_rss, status_kib, wait_peak  # noqa: E402  # benchmarks/memory.py: one home for RSS

#: Default audits: issue 41's acceptance, in the order of its priority.
DEFAULT_AUDITS = ("gemma-3-270m:honest-fp32:precision,gemma-3-270m:int4:precision,"
                  "smollm2-135m-instruct:honest-fp32:default,gemma-3-270m:honest-fp32:default,"
                  "gemma-3-270m:int4:default")
#: Issue 41's bounds (3 GB, 2 GB) in MiB.
DEFAULT_MAX_MIB = "gemma-3-270m=2861,smollm2-135m-instruct=1907"
GROUPS = ("setup+probing", "floor", "scoring", "detectors+report")
#: Variables that would point the child away from its empty home.
_UNSET = ("SPEC_AUDITOR_NOISE_DIR", "AUDITOR_DB_URL", "SPEC_AUDITOR_MEMORY_AVAILABLE", "SPEC_AUDITOR_LOG_DIR",
          "SPEC_AUDITOR_TEST_NOISE_DIR")


# ----------------------------------------------------------------------------- child process
class StagePeaks:
    """The ``progress(stage, done, total)`` callback that keeps each group's RSS peak (MiB) and seconds."""

    def __init__(self) -> None:
        self.group = GROUPS[0]
        self.peak_mib: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.notes: list[str] = []
        self._t = time.perf_counter()
        self.start_peak_mib = status_kib("VmHWM") / 1024  # imports, before the first reset
        reset_peak_rss()

    def _switch(self, group: str) -> None:
        if group == self.group:
            return
        self.close()
        self.group = group

    def close(self) -> None:
        """Book the current group's peak and seconds, and reset the high-water mark."""
        now = time.perf_counter()
        hwm = status_kib("VmHWM") / 1024
        self.peak_mib[self.group] = max(self.peak_mib.get(self.group, 0.0), hwm)
        self.seconds[self.group] = self.seconds.get(self.group, 0.0) + now - self._t
        self._t = now
        reset_peak_rss()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if total == 0:  # a note, not a stage
            self.notes.append(stage[:200])
            return
        if stage.startswith("noise floor"):
            self._switch("floor")
        elif stage.startswith("reference scoring"):
            self._switch("scoring")
            if done >= total:  # last batch scored: what follows is the detectors' (unless another dtype starts)
                self._switch("detectors+report")
        elif self.group == GROUPS[0]:
            pass  # probing, pre-flight
        else:
            self.notes.append(f"unexpected stage after {self.group}: {stage}"[:200])


def worker(provider: str, config: str, suite: str) -> dict[str, Any]:
    """One audit (``run_check``) in this process; the record the parent reads."""
    from auditor.check.errors import AuditError
    from auditor.check.measured_floors import noise_cache_dir
    from auditor.check.pipeline import run_check

    noise = Path(noise_cache_dir())
    cached_before = sorted(p.name for p in noise.rglob("*") if p.is_file()) if noise.is_dir() else []
    cb = StagePeaks()
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"noise_dir": str(noise), "noise_files_before": cached_before}
    try:
        rep = run_check(provider, suite=suite, config_path=config, progress=cb)
        rec.update(verdict=str(rep.verdict), exit_code=int(rep.exit_code), run_id=getattr(rep, "run_id", None))
    except AuditError as exc:
        rec.update(verdict="ERROR", exit_code=3, error=str(exc)[:500])
    rec["wall_s"] = time.perf_counter() - t0
    cb.close()
    rec.update(stage_peak_mib=cb.peak_mib, stage_s=cb.seconds, notes=cb.notes[-20:],
               floor_measured="floor" in cb.peak_mib, peak_mib=max(cb.start_peak_mib, *cb.peak_mib.values()))
    return rec


# ----------------------------------------------------------------------------- parent
def providers_toml(name: str, base_url: str, model: str, chat: bool) -> str:
    """One ``[providers.NAME]`` entry for a simulator serving ``model`` (see the module docstring)."""
    api = "chat" if chat else "completions"
    return (f'[providers.{name}]\nbase_url = "{base_url}"\nmodel = "{model}"\napi = "{api}"\nreference = "{model}"\n'
            f"timeout_s = 600\n\n[providers.{name}.capabilities]\nmax_top_logprobs = 20\nlogprobs = true\n"
            f"n = true\nseed = true\nstreaming = true\necho = {'false' if chat else 'true'}\n\n"
            f"[providers.{name}.rate_limits]\nconcurrency = 2\n")


def run_audit(model: str, profile: str, suite: str, args: argparse.Namespace) -> dict[str, Any]:
    """Simulator + child audit for one ``(model, profile, suite)``; the child's record (``peak_mib``: the
    audit's peak in all) plus the simulator's peak and the load averages.

    Raises:
        RuntimeError: the simulator did not start or the child failed (its stderr's tail).
    """
    from auditor.demo import SimulatorProcess
    from reference.models import BUNDLED

    chat = BUNDLED[model].chat if model in BUNDLED else True
    with tempfile.TemporaryDirectory(prefix="first-audit-") as d:
        home = Path(d) / "home"
        home.mkdir()
        (home / "models").symlink_to(Path(args.models_dir).resolve(), target_is_directory=True)
        sim = SimulatorProcess(profile, Path(d), extra_args=["--model", model, "--served-model-name", model,
                                                             "--device", "cpu"]).start()
        try:
            sim.wait_ready(timeout=900)
            cfg = home / "providers.toml"
            name = f"bench-{profile}"
            cfg.write_text(providers_toml(name, sim.base_url, model, chat))
            env = {k: v for k, v in os.environ.items() if k not in _UNSET}
            env.update(SPEC_AUDITOR_HOME=str(home), PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}")
            if args.noise_dir:
                env["SPEC_AUDITOR_NOISE_DIR"] = str(Path(args.noise_dir).resolve())
            out = Path(d) / "out.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, str(cfg), suite, str(out)]
            load0 = os.getloadavg()
            t0 = time.perf_counter()
            with (Path(d) / "stderr.txt").open("w+") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=d)
                peak = wait_peak(proc)
                err.seek(0)
                tail = err.read()[-2000:]
            wall = time.perf_counter() - t0
            sim_peak = status_kib("VmHWM", sim.proc.pid) / 1024 if sim.proc is not None else float("nan")
        finally:
            sim.stop()
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"{model} {profile} {suite}: child exited {proc.returncode}: {tail}")
        rec: dict[str, Any] = json.loads(out.read_text())
    rec.update(model=model, profile=profile, suite=suite, last_reset_maxrss_mib=peak, child_wall_s=wall,
               simulator_peak_mib=sim_peak,
               load_before=load0, load_after=os.getloadavg(), cold=not args.noise_dir and not rec["noise_files_before"])
    return rec


def _row(r: dict[str, Any], limit: float | None) -> str:
    st = r["stage_peak_mib"]
    cells = " ".join(f"{st[g]:>8.0f}" if g in st else f"{'—':>8}" for g in GROUPS)
    ok = "" if limit is None else ("  ≤ bound" if r["peak_mib"] <= limit else f"  > {limit:.0f} MiB")
    return (f"{r['model']:<22} {r['profile']:<12} {r['suite']:<10} {r['verdict']:<14} {r['exit_code']:>4} "
            f"{'yes' if r['cold'] else 'no':>4} {cells} {r['peak_mib']:>8.0f} {r['wall_s']:>7.0f} "
            f"{r['simulator_peak_mib']:>8.0f}  {r['load_before'][0]:.1f}→{r['load_after'][0]:.1f}{ok}")


def main(argv: list[str] | None = None) -> int:
    from reference.models import model_cache_dir
    from simulator.profiles import PROFILES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--audits", default=DEFAULT_AUDITS, help="MODEL:PROFILE:SUITE, comma-separated")
    ap.add_argument("--models-dir", default=None, help="converted models (default: the model cache)")
    ap.add_argument("--noise-dir", default=None, help="a shared floor cache (warm floor); default: the empty home's")
    ap.add_argument("--max-mib", default=DEFAULT_MAX_MIB, help="MODEL=MiB bounds on the audit's peak RSS")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=4, metavar=("PROVIDER", "CONFIG", "SUITE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        provider, config, suite, out = args.worker
        Path(out).write_text(json.dumps(worker(provider, config, suite)))
        return 0
    args.models_dir = args.models_dir or str(model_cache_dir())
    limits = {k: float(v) for k, v in (kv.split("=", 1) for kv in args.max_mib.split(",") if kv)}
    audits = [a.split(":") for a in args.audits.split(",") if a]
    for a in audits:
        if len(a) != 3:
            ap.error(f"--audits: {':'.join(a)!r} is not MODEL:PROFILE:SUITE")
    header = (f"{'model':<22} {'profile':<12} {'suite':<10} {'verdict':<14} {'exit':>4} {'cold':>4} "
              + " ".join(f"{g[:8]:>8}" for g in GROUPS) + f" {'in all':>8} {'wall s':>7} {'sim peak':>8}  load")
    print(f"peak RSS in MiB; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores", flush=True)
    print(header, flush=True)
    results, status = [], 0
    for model, profile, suite in audits:
        try:
            r = run_audit(model, profile, suite, args)
        except RuntimeError as e:
            print(f"FAILED {e}", file=sys.stderr, flush=True)
            status = 2
            continue
        results.append(r)
        limit = limits.get(model)
        print(_row(r, limit), flush=True)
        expected = PROFILES[profile].expected_verdict if profile in PROFILES else None
        if (expected is not None and r["verdict"] != expected) or (limit is not None and r["peak_mib"] > limit):
            status = max(status, 1)
    if args.json:
        print(json.dumps(results, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
