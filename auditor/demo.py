"""``auditor demo``: three simulated providers on loopback, audited side by side.

With nothing configured, :func:`run_demo`:

1. starts the provider simulator three times as subprocesses (``python -m auditor serve
   --profile P --host 127.0.0.1 --port <free port>``) for the profiles in :data:`DEMO_PROFILES`
   (an honest bf16 deployment, int4 weight quantization, SGLang-style relaxed speculative
   acceptance), and waits until each answers ``GET /v1/models``;
2. writes a temporary ``providers.toml`` naming them ``demo-<profile>``;
3. audits each with the default suite (``auditor.check.pipeline.run_check``; runs stored in the default
   database unless ``--db``), one after the other;
4. prints the side-by-side table (profile, expected, verdict, deciding p-values, tokens, USD, wall
   time) and how to open the dashboard (``auditor dashboard``);
5. always shuts the servers down — on success, error and Ctrl-C (each process group is terminated,
   then killed after a grace period).

The simulators are the same code as ``auditor serve``; the auditor never sees which profile a
server runs (the providers file only has URLs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference.loopback import free_port

__all__ = ["DEMO_BUDGET_TOKENS", "DEMO_PROFILES", "EXPECTED", "DemoError", "DemoResult", "SimulatorProcess", "render_demo_table", "run_demo"]

#: The profiles the demo serves, in display order.
DEMO_PROFILES = ("honest-bf16", "int4", "relaxed-threshold")
#: The verdict a correct audit reaches on each (simulator ground truth).
EXPECTED = {
    "honest-bf16": "PASS",
    "int4": "QUANTIZATION",
    "relaxed-threshold": "RELAXED_VERIFICATION",
}
#: Planned completion tokens per audit (of the default suite's ~1.7k): enough for PASS to have
#: power in every detector family and for both deviations to be named with margin, in minutes.
DEMO_BUDGET_TOKENS = 800
#: Seconds to wait for a simulator to load its model and answer /v1/models.
START_TIMEOUT_S = 600.0


class DemoError(RuntimeError):
    """The demo could not run (a simulator failed to start); ``exit_code`` 3."""

    exit_code = 3


class SimulatorProcess:
    """One ``auditor serve`` subprocess on loopback (its own process group, log file in ``log_dir``).

    Attributes:
        profile: simulator profile; port: TCP port; base_url: ``http://127.0.0.1:PORT/v1``;
        model_id: the served model name (from ``/v1/models``) once started.
    """

    def __init__(self, profile: str, log_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 extra_args: list[str] | None = None):
        self.profile = profile
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_dir) / f"serve-{profile}.log"
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.model_id: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> SimulatorProcess:
        """Launch the server process (does not wait; see :meth:`wait_ready`)."""
        cmd = [sys.executable, "-m", "auditor", "serve", "--profile", self.profile, "--host", self.host,
               "--port", str(self.port), *self.extra_args]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    def _tail(self, n: int = 600) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:].strip()
        return ""

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        """Poll ``GET /v1/models`` until it answers 200; return the served model id.

        Raises:
            DemoError: the process exited, or no answer within ``timeout`` seconds.
        """
        import httpx

        t0 = time.monotonic()
        while True:
            if self.proc is None or self.proc.poll() is not None:
                rc = None if self.proc is None else self.proc.returncode
                raise DemoError(f"simulator {self.profile!r} exited (rc={rc}) before answering; log {self.log_path}: {self._tail()}")
            try:
                r = httpx.get(self.base_url + "/models", timeout=2.0)
                if r.status_code == 200:
                    data = r.json().get("data") or []
                    self.model_id = str(data[0]["id"]) if data else "smollm2-135m-instruct"
                    return self.model_id
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() - t0 > timeout:
                raise DemoError(f"simulator {self.profile!r} did not answer {self.base_url}/models within {timeout:.0f} s; log {self.log_path}")
            time.sleep(0.5)

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after ``grace`` s). Idempotent."""
        p = self.proc
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=grace)
        log = getattr(self, "_log", None)
        if log is not None and not log.closed:
            log.close()


def providers_toml(servers: list[SimulatorProcess], reference: str | None = None) -> str:
    """A providers file naming each simulator ``demo-<profile>`` (chat API, logprobs, streaming)."""
    parts = ["# written by `auditor demo` (temporary)\n"]
    for s in servers:
        parts.append(
            f"[providers.demo-{s.profile}]\n"
            f'base_url = "{s.base_url}"\n'
            f'model = "{s.model_id}"\n'
            'api = "chat"\n'
            + (f"reference = {json.dumps(str(reference))}\n" if reference else "")
            + "timeout_s = 300\n\n"
            f"[providers.demo-{s.profile}.capabilities]\n"
            "max_top_logprobs = 20\nlogprobs = true\nn = true\nseed = true\nstreaming = true\necho = false\n\n"
            f"[providers.demo-{s.profile}.rate_limits]\nconcurrency = 4\n\n"
            f"[providers.demo-{s.profile}.pricing]\nusd_per_1m_input = 0.05\nusd_per_1m_output = 0.10\n\n"
        )
    return "".join(parts)


@dataclass
class DemoResult:
    """Outcome of :func:`run_demo`: one report per profile (same order as ``profiles``)."""

    profiles: list[str]
    reports: list[Any]
    wall_s: float
    db_url: str
    json_path: str | None = None
    server_start_s: float = 0.0
    db_given: bool = False
    expected: dict[str, str] = field(default_factory=lambda: dict(EXPECTED))

    @property
    def all_expected(self) -> bool:
        """True when every audit named the profile's true cause."""
        return all(r.verdict == self.expected.get(p) for p, r in zip(self.profiles, self.reports, strict=True))


def run_demo(
    *,
    profiles: tuple[str, ...] = DEMO_PROFILES,
    suite: str | None = None,
    budget_tokens: int | None = DEMO_BUDGET_TOKENS,
    db_url: str | None = None,
    json_path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    console: Any = None,
    serve_args: list[str] | None = None,
    reference: str | None = None,
) -> DemoResult:
    """Run the demo (see the module docstring). Servers are always shut down before returning.

    Args:
        profiles: simulator profiles to serve and audit.
        suite: probe suite (default ``default``); budget_tokens: per-audit cap on planned completion
            tokens (default :data:`DEMO_BUDGET_TOKENS`; None = the whole suite).
        db_url: where runs are stored (default database when None).
        json_path: also write the list of the JSON reports there.
        progress: rich progress bars on stderr (``console``).
        serve_args: extra ``auditor serve`` arguments for every simulator (e.g. ``["--model", DIR]``).
        reference: reference model of the audits (default: the bundled model).

    Returns:
        DemoResult.

    Raises:
        DemoError: a simulator did not start. auditor.check.errors.AuditError: an audit failed.
    """
    from auditor.check.pipeline import run_check
    from auditor.report.render import render_json
    from auditor.store import resolve_db_url

    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="auditor-demo-"))
    # SIGTERM (e.g. `kill`, a CI timeout) must also shut the servers down: turn it into Ctrl-C.
    old_term = None
    if threading.current_thread() is threading.main_thread():
        def _term(_sig: int, _frame: Any) -> None:
            raise KeyboardInterrupt
        old_term = signal.signal(signal.SIGTERM, _term)
    servers = [SimulatorProcess(p, tmp, extra_args=serve_args) for p in profiles]
    reports = []
    say = (lambda m: console.print(m, highlight=False)) if console is not None else (lambda m: None)
    try:
        for s in servers:
            s.start()
        say(f"started {len(servers)} simulators on loopback: " + ", ".join(f"{s.profile} :{s.port}" for s in servers)
            + " (each loads the model; a weight-quantized one quantizes it the first time, about a minute on 2 "
              "cores, then reads it from the cache)")
        for s in servers:
            s.wait_ready()
        t_ready = time.perf_counter() - t0
        say(f"simulators ready after {t_ready:.0f} s")
        cfg_path = tmp / "providers.toml"
        cfg_path.write_text(providers_toml(servers, reference), encoding="utf-8")
        for i, s in enumerate(servers, 1):
            say(f"auditing demo-{s.profile} ({i} of {len(servers)}): sending the {suite or 'default'} suite's probes, then scoring "
                "every returned token against the reference model and running the detectors ...")
            rep = run_check(f"demo-{s.profile}", suite=suite, budget_tokens=budget_tokens, db_url=db_url,
                            config_path=str(cfg_path), progress=True if progress else None, console=console)
            reports.append(rep)
            say(f"demo-{s.profile}: {rep.verdict} (run {rep.run_id}, {rep.wall_s:.0f} s)")
    finally:
        for s in servers:
            s.stop()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    out = None
    if json_path is not None:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("[\n" + ",\n".join(render_json(r) for r in reports) + "\n]\n", encoding="utf-8")
        json.loads(p.read_text(encoding="utf-8"))  # a valid JSON list, or fail loudly
        out = str(p)
    with contextlib.suppress(OSError):
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return DemoResult(list(profiles), reports, time.perf_counter() - t0, resolve_db_url(db_url), out, t_ready,
                      db_given=db_url is not None)


def _deciding(rep: Any) -> str:
    """The rejecting detectors with Holm-adjusted p (or the smallest one when none rejects), one per line."""
    ran = [d for d in rep.detectors if d.get("ran") and d.get("p_adjusted") is not None]
    rej = [d for d in ran if d.get("rejects")]
    show = rej or sorted(ran, key=lambda d: d["p_adjusted"])[:1]
    return "\n".join(f"{d['name']} p={d['p_adjusted']:.2g}" for d in show) or "—"


def _breakable(verdict: str) -> str:
    """A verdict name that a narrow column wraps after each ``_OR_`` instead of cutting it:
    ``QUANTIZATION_OR_RELAXED_VERIFICATION`` → ``QUANTIZATION_OR_`` / ``RELAXED_VERIFICATION``
    (each line at most 24 characters; the name reads whole when the lines are joined)."""
    return verdict.replace("_OR_", "_OR_\n")


#: Narrowest the deciding-tests column is squeezed to before the other cells fold too.
_DECIDING_MIN_WIDTH = 16


def render_demo_table(result: DemoResult, console: Any = None) -> None:
    """Print the side-by-side table and how to open the dashboard.

    Fits a 100-column terminal without cutting a cell (no ``…``): the run id sits under the
    provider, tokens / USD / seconds share one column, each deciding test takes its own line (the
    only column that wraps), and a long verdict (``..._OR_...``) breaks after ``_OR_``. On a console
    too narrow even for that (80 columns), every cell folds instead of being cut.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    headers = ("provider\nrun", "expected", "verdict", "deciding tests\n(Holm-adjusted p)", "tokens\nUSD\ntime")
    rows = []
    for p, r in zip(result.profiles, result.reports, strict=True):
        ok = r.verdict == result.expected.get(p)
        rows.append((
            f"demo-{p}\n[dim]{r.run_id}[/dim]", _breakable(result.expected.get(p, "?")),
            _breakable(r.verdict) + (" [green]✓[/green]" if ok else " [red]✗[/red]"), _deciding(r),
            f"{(r.tokens or {}).get('total', 0)}\n{r.cost_usd:.5f}\n{(r.wall_s or 0):.0f} s",
        ))

    def widest(i: int) -> int:
        return max(Text.from_markup(line).cell_len for cell in (headers[i], *(row[i] for row in rows))
                   for line in cell.split("\n"))

    deciding = 3
    gaps = 2 * (len(headers) - 1)  # collapse_padding: one space each side of a column, shared
    whole = sum(widest(i) for i in range(len(headers)) if i != deciding) + gaps + _DECIDING_MIN_WIDTH <= console.width
    t = Table(title="auditor demo — simulated providers (profile hidden from the auditor)", title_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for i, c in enumerate(headers):
        kw: dict[str, Any] = {"no_wrap": True} if whole else {"overflow": "fold"}
        if i == deciding:
            kw = {"overflow": "fold"}
        t.add_column(c, justify="right" if i == len(headers) - 1 else "left", **kw)
    for row in rows:
        t.add_row(*row)
    console.print(t)
    console.print(
        f"total {result.wall_s:.0f} s (simulators ready after {result.server_start_s:.0f} s). Runs stored in {result.db_url}.\n"
        "Open the dashboard:  python -m auditor dashboard" + (f" --db {result.db_url}" if result.db_given else "")
        + "\nRe-render a run:     python -m auditor report RUN_ID --format markdown" + (f" --db {result.db_url}" if result.db_given else "")
        + (f"\nJSON reports:        {result.json_path}" if result.json_path else ""),
        highlight=False,
    )
