"""gemma-3-270m audit matrix on the simulator: profile × reference backend → verdict, plus backend agreement.

For each simulator profile (default: honest-fp32, honest-bf16, int4, relaxed-threshold, substituted)
a provider simulator is started as its own process::

    python3 -m auditor serve --model gemma-3-270m --profile P --port N

and audited through ``/v1/completions`` (``api = "completions"``; gemma-3-270m is a base model
without a chat template) with ``python3 -m auditor check`` against each reference backend:

- ``local``: ``[references.gemma-local] kind = "local", model = "gemma-3-270m"`` (transformers in
  the check process, float32; its noise floor is measured once and cached, see ``--floor``);
- ``vllm``: ``[references.gemma-trusted] kind = "vllm"`` pointed at a *second* simulator process
  (``--profile honest-fp32 --served-model-name gemma-3-270m-trusted``) acting as the trusted
  vLLM engine (token-id prompts, ``prompt_logprobs``).

The ``substituted`` profile serves gemma-3-270m with decoder layers dropped
(``simulator.profiles.default_substitute_keep``: every 5th layer from n/3 to n−5) under the
claimed name. Before the matrix the script checks that ``api = "chat"`` against the base model
exits 3 before probing, and measures teacher-forced agreement: the same token ids (the suite's
first greedy prompts + local greedy continuations) scored by ``LocalBackend`` (float32) and by
``VLLMBackend`` against the trusted simulator; the max |Δ logprob| (nats) over chosen and top-k
logprobs is reported (acceptance: < 1e-4).

Output: a table (profile, backend, expected, verdict, rule, deciding p-value, tokens, wall s),
the machine load (``os.getloadavg``) before/after each audit, and a JSON file with everything
(``--json``). Exit status 1 when any verdict differs from the expected one (or agreement > 1e-4),
2 on a setup failure.

Usage::

    python3 benchmarks/gemma_matrix.py [--backends local,vllm] [--profiles a,b] [--suite default]
        [--budget-tokens N|auto] [--json out.json] [--workdir DIR]
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

import httpx

from reference.loopback import free_port

MODEL = "gemma-3-270m"
TRUSTED_NAME = "gemma-3-270m-trusted"
EXPECTED = {
    "honest-fp32": "PASS",
    "honest-bf16": "PASS",
    "int4": "QUANTIZATION",
    "relaxed-threshold": "RELAXED_VERIFICATION",
    "substituted": "SUBSTITUTION",
}
AGREEMENT_MAX_NATS = 1e-4


class Sim:
    """One ``auditor serve`` subprocess (stdout/stderr to ``log``); ``base_url`` ends in ``/v1``."""

    def __init__(self, profile: str, log: Path, served_name: str | None = None, seed: int = 0):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        cmd = [sys.executable, "-m", "auditor", "serve", "--model", MODEL, "--profile", profile,
               "--port", str(self.port), "--seed", str(seed), "--device", "cpu"]
        if served_name:
            cmd += ["--served-model-name", served_name]
        self.log = log
        self._fh = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._fh, stderr=subprocess.STDOUT)
        self.t_start = time.perf_counter()

    def wait(self, timeout: float = 900.0) -> float:
        """Block until ``/v1/models`` answers; returns the start-up seconds.

        Raises:
            RuntimeError: the process exited or did not answer within ``timeout`` seconds.
        """
        while time.perf_counter() - self.t_start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited ({self.proc.returncode}); log: {self.log}")
            try:
                if httpx.get(self.base_url + "/models", timeout=2).status_code == 200:
                    return time.perf_counter() - self.t_start
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"simulator did not answer within {timeout:.0f} s; log: {self.log}")

    def stop(self) -> None:
        """Terminate this process (only this pid) and close the log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._fh.close()


def providers_toml(entries: dict[str, tuple[str, str, str]], trusted_url: str | None, tokenizer: str = MODEL) -> str:
    """``[providers.NAME]`` per ``{name: (base_url, api, reference)}`` plus the two reference tables
    (``tokenizer``: the vllm table's; a bundled name gives the check local weights for the floor)."""
    out = [f'[references.gemma-local]\nkind = "local"\nmodel = "{MODEL}"\ndevice = "cpu"\n\n']
    if trusted_url:
        out.append(f'[references.gemma-trusted]\nkind = "vllm"\nmodel = "{TRUSTED_NAME}"\nbase_url = "{trusted_url}"\n'
                   f'tokenizer = "{tokenizer}"\ntimeout_s = 600\n\n')
    for name, (url, api, ref) in entries.items():
        out.append(
            f'[providers.{name}]\nbase_url = "{url}"\nmodel = "{MODEL}"\napi = "{api}"\nreference = "{ref}"\n'
            f"timeout_s = 600\n\n[providers.{name}.capabilities]\nmax_top_logprobs = 20\nlogprobs = true\n"
            f"n = true\nseed = true\nstreaming = true\necho = {'true' if api == 'completions' else 'false'}\n\n"
            f"[providers.{name}.rate_limits]\nconcurrency = 2\n\n"
        )
    return "".join(out)


def run_check(provider: str, cfg: Path, db: str, suite: str, budget: str | None, out_json: Path,
              log: Path) -> tuple[int, float, dict | None]:
    """``python3 -m auditor check`` as a subprocess; returns (exit code, wall seconds, JSON report or None)."""
    cmd = [sys.executable, "-m", "auditor", "check", "--provider", provider, "--config", str(cfg), "--db", db,
           "--suite", suite, "--json", str(out_json), "--no-progress", "--format", "text"]
    if budget:
        cmd += ["--budget-tokens", budget]
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    rep = json.loads(out_json.read_text()) if out_json.is_file() else None
    return rc, wall, rep


def deciding(rep: dict) -> tuple[str, float | None]:
    """(rule, deciding p-value): the smallest Holm-adjusted p among the verdict's deciding detectors,
    else among every detector that ran (for PASS: the closest call)."""
    vd = rep.get("verdict_details") or {}
    dets = vd.get("detectors") or {}
    ev = [e for e in (vd.get("evidence") or []) if isinstance(e, dict) and e.get("p_adjusted") is not None]
    if ev:
        return str(vd.get("rule", "")), min(float(e["p_adjusted"]) for e in ev)
    ps = [float(d["p_adjusted"]) for d in dets.values() if isinstance(d, dict) and d.get("ran")
          and d.get("p_adjusted") is not None]
    return str(vd.get("rule", "")), (min(ps) if ps else None)


def measure_floor() -> dict:
    """Measure (or read from the cache) gemma-3-270m's float32 noise floor in this process; timings."""
    from auditor.check.measured_floors import get_floors
    from auditor.check.reference_setup import get_reference_models

    t0 = time.perf_counter()
    lms = get_reference_models(MODEL, ["float32"])
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    last_stage = [""]
    last_t = [0.0]

    def progress(stage: str, done: int, total: int) -> None:  # one line per stage, then every 60 s
        now = time.perf_counter()
        if stage != last_stage[0] or now - last_t[0] > 60 or done == total:
            print(f"  floor: {stage} {done}/{total} at {now - t1:.0f} s", flush=True)
            last_stage[0], last_t[0] = stage, now

    fs = get_floors(lms, progress=progress)
    return {"load_s": round(t_load, 1), "floor_s": round(time.perf_counter() - t1, 1),
            "cached": bool(fs.meta.get("cached")), "measured_seconds": fs.meta.get("seconds"),
            "summary": fs.summary()}


def agreement(trusted_url: str, suite: str, n_prompts: int, n_tokens: int) -> dict:
    """Teacher-forced agreement of the local float32 backend and the vllm backend on the same ids.

    Prompts: the suite's first ``n_prompts`` greedy/logprob probes as completions text (BOS added
    as vLLM does); continuations: the local model's greedy ``n_tokens`` tokens. Returns max and
    mean |Δ| of the chosen logprobs and of the top-20 logprobs, and whether the top-20 ids agree.
    """
    import numpy as np

    from probes.suites import load_suite
    from reference.backends.local import LocalBackend
    from reference.backends.vllm import VLLMBackend
    from reference.models import load_model
    from reference.scoring import encode_prompt

    lm = load_model(MODEL, dtype="float32", device="cpu")
    probes = [p for p in load_suite(suite).probes if p.mode in ("greedy", "logprob")][:n_prompts]
    prompts = [encode_prompt(lm.tokenizer, p.prompt_text(), chat=False) for p in probes]
    local = LocalBackend(lm)
    remote = VLLMBackend(trusted_url, TRUSTED_NAME, tokenizer=lm.tokenizer, timeout_s=600)
    try:
        remote.check()
        conts = [local.greedy(p, n_tokens, stop_at_eos=False) for p in prompts]
        a = local.score(prompts, conts, top_k=20)
        b = remote.score(prompts, conts, top_k=20)
        greedy_same = remote.greedy(prompts[0], n_tokens, stop_at_eos=False) == conts[0]
    finally:
        remote.close()
    d_chosen = np.concatenate([np.abs(x.logprobs - y.logprobs) for x, y in zip(a, b, strict=True)])
    d_top = np.concatenate([np.abs(x.top_logprobs - y.top_logprobs).ravel() for x, y in zip(a, b, strict=True)])
    ids_same = all(np.array_equal(x.top_ids, y.top_ids) for x, y in zip(a, b, strict=True))
    return {"sequences": len(prompts), "positions": int(d_chosen.size),
            "max_abs_dlogp_chosen": float(d_chosen.max()), "mean_abs_dlogp_chosen": float(d_chosen.mean()),
            "max_abs_dlogp_top20": float(d_top.max()), "top20_ids_equal": bool(ids_same),
            "greedy_equal": bool(greedy_same)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="local,vllm", help="comma list of local, vllm")
    ap.add_argument("--profiles", default=",".join(EXPECTED), help="comma list of simulator profiles")
    ap.add_argument("--suite", default="default")
    ap.add_argument("--budget-tokens", default=None, help="passed to auditor check (default: the whole suite)")
    ap.add_argument("--agreement-prompts", type=int, default=8)
    ap.add_argument("--agreement-tokens", type=int, default=24)
    ap.add_argument("--no-agreement", action="store_true")
    ap.add_argument("--vllm-tokenizer", default=MODEL,
                    help="tokenizer of the vllm reference table: the bundled name (local weights → noise floor) or a "
                         "tokenizer-only directory (no floor: how a 70B/671B trusted engine is audited)")
    ap.add_argument("--no-floor", action="store_true", help="skip the explicit floor measurement step")
    ap.add_argument("--workdir", default=None, help="logs, reports, providers.toml, audit db (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write all results to this JSON file")
    args = ap.parse_args()

    backends = [b for b in args.backends.split(",") if b]
    profiles = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in profiles if p not in EXPECTED] + [b for b in backends if b not in ("local", "vllm")]
    if unknown:
        print(f"unknown profile/backend: {unknown}", file=sys.stderr)
        return 2
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gemma-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{work / 'audit.db'}"
    cfg = work / "providers.toml"
    results: dict = {"model": MODEL, "suite": args.suite, "budget_tokens": args.budget_tokens, "rows": [],
                     "cpu_count": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"workdir {work}; load {os.getloadavg()}", flush=True)

    if "local" in backends and not args.no_floor:
        fl = measure_floor()
        results["floor"] = fl
        print(f"noise floor: cached={fl['cached']} load {fl['load_s']} s, floor {fl['floor_s']} s "
              f"(measured in {fl['measured_seconds']} s); band {fl['summary'].get('margin_band')}", flush=True)

    trusted = None
    ok = True
    try:
        if "vllm" in backends or not args.no_agreement:
            trusted = Sim("honest-fp32", work / "trusted.log", served_name=TRUSTED_NAME, seed=1)
            print(f"trusted engine up in {trusted.wait():.1f} s at {trusted.base_url}", flush=True)
        if trusted is not None and not args.no_agreement:
            t0 = time.perf_counter()
            ag = agreement(trusted.base_url, args.suite, args.agreement_prompts, args.agreement_tokens)
            ag["wall_s"] = round(time.perf_counter() - t0, 1)
            results["agreement"] = ag
            good = ag["max_abs_dlogp_top20"] < AGREEMENT_MAX_NATS and ag["max_abs_dlogp_chosen"] < AGREEMENT_MAX_NATS
            ok &= good and ag["top20_ids_equal"]
            print(f"local vs vllm teacher forcing ({ag['positions']} positions): max |Δ| chosen "
                  f"{ag['max_abs_dlogp_chosen']:.2e}, top-20 {ag['max_abs_dlogp_top20']:.2e} nats; top-20 ids equal "
                  f"{ag['top20_ids_equal']}; greedy equal {ag['greedy_equal']} -> {'ok' if good else 'FAIL'}", flush=True)
        trusted_url = trusted.base_url if trusted is not None else None

        # a chat suite against the base model: refused before probing, exit 3
        cfg.write_text(providers_toml({"chatbase": ("http://127.0.0.1:9/v1", "chat", "gemma-local")}, trusted_url))
        rc, wall, _ = run_check("chatbase", cfg, db, "smoke", None, work / "chatbase.json", work / "chatbase.log")
        results["chat_refused"] = {"exit_code": rc, "wall_s": round(wall, 1)}
        ok &= rc == 3
        print(f"api = chat against the base model: exit {rc} ({'ok' if rc == 3 else 'FAIL'}) in {wall:.1f} s", flush=True)

        for prof in profiles:
            sim = Sim(prof, work / f"sim-{prof}.log")
            try:
                up = sim.wait()
                print(f"[{prof}] simulator up in {up:.1f} s", flush=True)
                for be in backends:
                    name = f"{prof.replace('-', '_')}_{be}"
                    ref = "gemma-local" if be == "local" else "gemma-trusted"
                    cfg.write_text(providers_toml({name: (sim.base_url, "completions", ref)}, trusted_url, args.vllm_tokenizer))
                    load0 = os.getloadavg()[0]
                    rc, wall, rep = run_check(name, cfg, db, args.suite, args.budget_tokens, work / f"{name}.json",
                                              work / f"{name}.log")
                    verdict = rep.get("verdict") if rep else f"exit {rc}"
                    rule, p = deciding(rep) if rep else ("", None)
                    toks = (rep.get("tokens") or {}) if rep else {}
                    row = {"profile": prof, "backend": be, "expected": EXPECTED[prof], "verdict": verdict,
                           "rule": rule, "deciding_p": p, "tokens_completion": toks.get("completion"),
                           "tokens_total": toks.get("total"), "wall_s": round(wall, 1), "exit_code": rc,
                           "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
                           "reason": rep.get("verdict_reason") if rep else None}
                    results["rows"].append(row)
                    ok &= verdict == EXPECTED[prof]
                    print(f"[{prof}/{be}] {verdict} (expected {EXPECTED[prof]}) rule {rule} p {p} "
                          f"tokens {toks.get('completion')} wall {wall:.0f} s load {load0:.1f}", flush=True)
            finally:
                sim.stop()
    except RuntimeError as exc:
        print(f"setup failure: {exc}", file=sys.stderr)
        return 2
    finally:
        if trusted is not None:
            trusted.stop()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if ok else 1


def _print_table(results: dict) -> None:
    """The matrix as a Markdown table on stdout (pasteable into docs/performance.md)."""
    print("\n| profile | backend | expected | verdict | rule | deciding p (Holm) | completion tokens | wall s | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results["rows"]:
        p = "–" if r["deciding_p"] is None else f"{r['deciding_p']:.3g}"
        mark = "" if r["verdict"] == r["expected"] else " ✗"
        print(f"| {r['profile']} | {r['backend']} | {r['expected']} | {r['verdict']}{mark} | {r['rule']} | {p} | "
              f"{r['tokens_completion']} | {r['wall_s']:.0f} | {r['load_before']:.1f} |")
    ag = results.get("agreement")
    if ag:
        print(f"\nlocal vs vllm teacher-forced max |Δ logprob|: chosen {ag['max_abs_dlogp_chosen']:.2e}, top-20 "
              f"{ag['max_abs_dlogp_top20']:.2e} nats over {ag['positions']} positions ({ag['sequences']} sequences)")


if __name__ == "__main__":
    raise SystemExit(main())
