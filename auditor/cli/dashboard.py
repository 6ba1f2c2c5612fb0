"""CLI command ``auditor dashboard``: serve the Streamlit dashboard over the audit database.

The dashboard is read-only. It binds to loopback (127.0.0.1) unless ``--host`` says otherwise:
audit results may be sensitive, and Streamlit has no authentication of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

#: Default port (Streamlit's own default).
DEFAULT_PORT = 8501
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def app_path() -> Path:
    """Path of the packaged Streamlit script ``dashboard/app.py``."""
    import dashboard

    return Path(dashboard.__file__).resolve().parent / "app.py"


def streamlit_command(*, host: str = "127.0.0.1", port: int = DEFAULT_PORT, python: str | None = None) -> list[str]:
    """The ``python -m streamlit run`` command line serving the dashboard (headless, no usage
    statistics, no file watcher, no browser launch)."""
    return [
        python or sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app_path()),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--global.developmentMode",
        "false",
        "--theme.base",
        "light",
        "--client.toolbarMode",
        "viewer",
    ]


def register(app: typer.Typer) -> None:
    """Attach ``auditor dashboard`` to the root app."""

    @app.command("dashboard")
    def dashboard_cmd(
        db: str | None = typer.Option(
            None, "--db", help="Database URL or SQLite path (default: $AUDITOR_DB_URL, else the user data dir)."
        ),
        port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, help="TCP port to listen on."),
        host: str = typer.Option(
            "127.0.0.1", "--host", help="Address to bind. Loopback by default; the dashboard has no login."
        ),
    ) -> None:
        """Serve the read-only dashboard (providers, speed vs fidelity, history, run detail)."""
        from rich.console import Console

        from auditor.store.db import redact_url, resolve_db_url

        console = Console(stderr=True)
        url = resolve_db_url(db)
        if host not in _LOOPBACK:
            console.print(
                f"[yellow]warning:[/] binding to {host}: anyone who can reach this address can read "
                "the audit results (no authentication)."
            )
        env = dict(os.environ)
        env["AUDITOR_DB_URL"] = url  # passed by environment so a password never shows in `ps`
        env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
        shown = "localhost" if host in _LOOPBACK else host
        console.print(f"dashboard: http://{shown}:{port}/  (database {redact_url(url)}; Ctrl+C to stop)")
        rc = run_child(streamlit_command(host=host, port=port), env=env)
        raise typer.Exit(rc)


def run_child(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` until it exits; SIGTERM/SIGINT to this process are forwarded to the child
    (so stopping ``auditor dashboard`` never leaves an orphaned Streamlit server)."""
    import signal

    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if proc.poll() is None:  # pragma: no cover - only if wait itself failed
            proc.kill()
            proc.wait()
    # Streamlit exits with -15/143 after a forwarded SIGTERM: a normal stop, not an error.
    return 0 if rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM, -signal.SIGINT) else rc
