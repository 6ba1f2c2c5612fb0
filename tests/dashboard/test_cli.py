"""`auditor dashboard`: the Streamlit command line it runs (loopback, packaged app)."""

from __future__ import annotations

from pathlib import Path

from auditor.cli.dashboard import app_path, streamlit_command


def test_streamlit_command_defaults_to_loopback_and_packaged_app():
    cmd = streamlit_command(port=9999)
    assert cmd[1:4] == ["-m", "streamlit", "run"]
    assert Path(cmd[4]) == app_path() and app_path().name == "app.py" and app_path().exists()
    opts = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert opts["--server.address"] == "127.0.0.1"
    assert opts["--server.port"] == "9999"
    assert opts["--server.headless"] == "true"
    assert opts["--browser.gatherUsageStats"] == "false"


def test_dashboard_help_lists_options():
    from typer.testing import CliRunner

    from auditor.cli import app

    r = CliRunner().invoke(app, ["dashboard", "--help"])
    assert r.exit_code == 0 and "--db" in r.output and "--port" in r.output
