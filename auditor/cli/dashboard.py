"""CLI command ``auditor dashboard``: serve the Streamlit dashboard over the audit database.

The dashboard is read-only. It binds to loopback (127.0.0.1) unless ``--host`` says otherwise: audit
results may be sensitive. Off loopback it requires a login (issue 38, item 8; ``dashboard.auth``): Streamlit's
OIDC login when ``.streamlit/secrets.toml`` configures an identity provider (``[auth]``), a trusted reverse
proxy's header with ``--auth-header``, otherwise an access token (``$SPEC_AUDITOR_DASHBOARD_TOKEN`` or one
generated and printed here).
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


def dashboard_cmd(
    db: str | None = typer.Option(
        None, "--db", help="Database URL or SQLite path (default: $AUDITOR_DB_URL, else the user data dir)."
    ),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, help="TCP port to listen on."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind. Loopback by default (open); any other address requires a login."
    ),
    auth_header: str | None = typer.Option(
        None, "--auth-header", help="Off loopback: trust this header (e.g. X-Forwarded-User) set by an "
        "authenticating reverse proxy that is the only way in, instead of a token."),
) -> None:
    """Serve the read-only dashboard (providers, speed vs fidelity, history, run detail)."""
    from rich.console import Console

    from auditor.store.db import redact_url, resolve_db_url
    from dashboard.auth import ENV_HEADER, ENV_MODE, ENV_TOKEN

    console = Console(stderr=True)
    url = resolve_db_url(db)
    env = dict(os.environ)
    env["AUDITOR_DB_URL"] = url  # passed by environment so a password never shows in `ps`
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    shown = "localhost" if host in _LOOPBACK else host
    login = ""
    if host in _LOOPBACK:
        env[ENV_MODE] = "none"
    elif auth_header:
        env[ENV_MODE], env[ENV_HEADER] = "header", auth_header
        login = f"; login: the {auth_header} header of your authenticating proxy"
    elif oidc_configured():
        env[ENV_MODE] = "oidc"
        login = "; login: OpenID Connect ([auth] in .streamlit/secrets.toml)"
    else:
        import secrets

        token = os.environ.get(ENV_TOKEN) or secrets.token_urlsafe(24)
        env[ENV_MODE], env[ENV_TOKEN] = "token", token
        login = (f"; login: open http://{shown}:{port}/?token={token} once"
                 if not os.environ.get(ENV_TOKEN) else f"; login: the token in ${ENV_TOKEN}")
    console.print(f"dashboard: http://{shown}:{port}/  (database {redact_url(url)}{login}; Ctrl+C to stop)",
                  highlight=False, markup=False, soft_wrap=True)
    rc = run_child(streamlit_command(host=host, port=port), env=env)
    raise typer.Exit(rc)


def register(app: typer.Typer) -> None:
    """Attach ``auditor dashboard`` to the root app."""
    app.command("dashboard")(dashboard_cmd)


def oidc_configured(cwd: Path | None = None) -> bool:
    """Whether Streamlit's OIDC login has an identity provider: an ``[auth]`` table in
    ``.streamlit/secrets.toml`` of the working directory or of the home directory (Streamlit's own
    secrets locations)."""
    import tomllib

    for p in ((cwd or Path.cwd()) / ".streamlit" / "secrets.toml", Path.home() / ".streamlit" / "secrets.toml"):
        try:
            if isinstance(tomllib.loads(p.read_text(encoding="utf-8")).get("auth"), dict):
                return True
        except (OSError, ValueError):
            continue
    return False


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
