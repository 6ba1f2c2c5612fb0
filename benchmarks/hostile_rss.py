"""Peak RSS of ``auditor probe --suite smoke`` against a provider that answers 2 GiB bodies (issue 13).

One bad provider must not be able to exhaust the machine that audits all the others: with the
per-response byte cap, the streamed-token cap and the request deadline (``probes.config.
ResponseLimits``, defaults) the auditor's absolute peak RSS stays under 1 GiB, the run completes,
and every probe records a named failure kind.

For each hostile mode of ``tests/probes/_hostile.py`` (its own process, bodies generated lazily,
so its memory never counts here) — ``json`` (one 2 GiB JSON object), ``sse`` (an SSE token flood
that ignores ``max_tokens`` and never sends ``[DONE]``), ``line`` (one ``data:`` line of 2 GiB
without a line ending) — this runs, as a child process::

    python -m auditor probe --provider hostile --suite smoke --concurrency 8 --new --no-progress --json

and reads the child's own peak RSS from ``os.wait4`` (``ru_maxrss``, KiB on Linux: the absolute
peak of the auditor process, interpreter and imports included, the same figure as
``/usr/bin/time -v``'s "Maximum resident set size"), and the failure kinds from the run summary.

Usage::

    python benchmarks/hostile_rss.py [--size BYTES] [--concurrency 8] [--modes json,sse,line]
                                     [--limit-mib 1024] [--json]

Prints one line per mode (peak RSS MiB, failure kinds, wall s) and exits 1 when a peak reaches
``--limit-mib`` or a probe did not end in a named failure. Light on CPU: the client drops every
body at its cap (32 MiB by default), so about 12 × 32 MiB cross loopback per mode.
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

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ROOT / "tests" / "probes" / "_hostile.py"
GIB = 1024**3
#: Failure kinds a hostile body may end in (probes.client; each names the bound that was hit).
BOUND_KINDS = frozenset({"response_too_large", "stream_token_overrun", "deadline_exceeded", "timeout"})


def start_server(mode: str, size: int) -> tuple[subprocess.Popen[str], int]:
    """The hostile endpoint (``tests/probes/_hostile.py serve``) in its own process; returns (process, port)."""
    sys.path.insert(0, str(HOSTILE.parent))
    from _hostile import start_server as start  # tests/probes is not a package

    return start(mode, size, timeout_s=30.0)


def providers_toml(port: int, *, stream: bool, concurrency: int) -> str:
    """A providers file for the hostile endpoint; every response limit at its default."""
    return (f'[providers.hostile]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "m"\napi = "chat"\n'
            f'reference = "none"\ntimeout_s = 60\n\n[providers.hostile.capabilities]\nlogprobs = true\n'
            f"max_top_logprobs = 20\nstreaming = {'true' if stream else 'false'}\n\n"
            f"[providers.hostile.rate_limits]\nconcurrency = {concurrency}\n")


def run_probe(port: int, workdir: Path, *, stream: bool, concurrency: int, timeout_s: float) -> dict:
    """``auditor probe --suite smoke`` as a child; returns its peak RSS (MiB), exit code, summary, wall s."""
    cfg = workdir / "providers.toml"
    cfg.write_text(providers_toml(port, stream=stream, concurrency=concurrency))
    out, err = workdir / "stdout.txt", workdir / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "auditor", "probe", "--provider", "hostile", "--suite", "smoke",
           "--config", str(cfg), "--db", f"sqlite:///{workdir / 'audit.db'}", "--new",
           "--concurrency", str(concurrency), "--no-progress", "--json"]
    t0 = time.perf_counter()
    with out.open("w") as fo, err.open("w") as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, cwd=workdir, env=env)
        deadline = t0 + timeout_s
        while True:  # reap the child ourselves: os.wait4 gives this child's own rusage
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait on a reaped pid
    kib = ru.ru_maxrss if sys.platform != "darwin" else ru.ru_maxrss / 1024
    text = out.read_text()
    try:
        summary = json.loads(text[text.index("{"):]) if "{" in text else {}
    except ValueError:
        summary = {}
    return {"peak_rss_mib": round(kib / 1024, 1), "exit_code": proc.returncode, "wall_s": round(wall, 1),
            "summary": summary, "stderr_tail": err.read_text()[-400:]}


def measure(mode: str, size: int, concurrency: int, timeout_s: float) -> dict:
    """One hostile mode end to end: server up, probe run measured, server down."""
    server, port = start_server(mode, size)
    try:
        with tempfile.TemporaryDirectory(prefix=f"hostile-{mode}-") as tmp:
            res = run_probe(port, Path(tmp), stream=mode != "json", concurrency=concurrency, timeout_s=timeout_s)
    finally:
        server.kill()
        server.wait(timeout=10)
    s = res.pop("summary")
    return {"mode": mode, "body_bytes": size, "concurrency": concurrency, **res,
            "probes_total": s.get("probes_total"), "probes_failed": s.get("probes_failed"),
            "status": s.get("status"), "error_kinds": s.get("error_kinds") or {}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--size", type=int, default=2 * GIB, help="hostile body size in bytes (default 2 GiB)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--modes", default="json,sse,line")
    ap.add_argument("--limit-mib", type=float, default=1024.0, help="fail at or above this peak RSS (MiB)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per probe run before it is killed")
    ap.add_argument("--json", action="store_true", help="print one JSON line per mode")
    a = ap.parse_args(argv)
    ok = True
    for mode in a.modes.split(","):
        r = measure(mode, a.size, a.concurrency, a.timeout)
        kinds = r["error_kinds"]
        named = bool(kinds) and set(kinds) <= BOUND_KINDS and sum(kinds.values()) == r["probes_failed"] == r["probes_total"]
        r["passed"] = bool(r["peak_rss_mib"] < a.limit_mib and named)
        ok &= r["passed"]
        if a.json:
            print(json.dumps(r), flush=True)
        else:
            print(f"{mode:5s} body {a.size / GIB:.2f} GiB, concurrency {a.concurrency}: peak RSS {r['peak_rss_mib']:.0f} MiB "
                  f"(limit {a.limit_mib:.0f}), {r['probes_failed']}/{r['probes_total']} probes failed as "
                  f"{json.dumps(kinds)}, run {r['status']}, exit {r['exit_code']}, {r['wall_s']} s"
                  + ("" if r["passed"] else f"  FAIL  {r['stderr_tail']!r}"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
