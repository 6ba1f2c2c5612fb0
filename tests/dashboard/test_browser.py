"""Browser test: `auditor dashboard` served on loopback, opened in headless Debian chromium.

Needs /usr/bin/chromium (``apt-get install -y chromium``; .ci/run installs it) and the
``playwright`` Python package (its own browser downloads are not used). Saves the screenshot to
``artifacts/dashboard.png`` (a CI artefact); with ``SPEC_AUDITOR_UPDATE_DOCS=1`` also to
``docs/`` (dashboard.png, dashboard-speed.png, dashboard-run.png).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_process import stop_process, wait_until_up

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not installed (apt-get install -y chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dashboard_server(seeded, tmp_path):
    """`python -m auditor dashboard --db URL --port P` in a subprocess; yields the base URL."""
    url, _ = seeded
    port = _free_port()
    log = open(tmp_path / "streamlit.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "auditor", "dashboard", "--db", url, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(proc, f"{base}/_stcore/health", timeout_s=90, log=(tmp_path / "streamlit.log").read_text)
        yield base
    finally:
        stop_process(proc)
        log.close()


def test_provider_table_in_headless_chromium(dashboard_server, seeded):
    _, summary = seeded
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1800, "height": 1150})
            page.goto(f"{dashboard_server}/?page=providers", timeout=60_000)
            table = page.locator("table").filter(has_text="Provider").first
            table.wait_for(timeout=60_000)
            text = table.inner_text()
            for name, verdict in summary["latest_verdicts"].items():
                row = table.locator("tr").filter(has_text=name)
                assert row.count() == 1, name
                assert verdict in row.inner_text(), (name, verdict)
            assert "QUANTIZATION" in text and "RELAXED_VERIFICATION" in text and "PASS" in text
            page.wait_for_timeout(1000)
            shot = artifacts / "dashboard.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000

            # Speed vs fidelity: the Altair scatter is drawn.
            page.goto(f"{dashboard_server}/?page=speed", timeout=60_000)
            page.locator(".vega-embed").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(artifacts / "dashboard-speed.png"))

            # Provider-controlled token text is shown as text, never parsed as HTML.
            run_id = summary["runs"]["sim-relaxed"][-1]
            page.goto(f"{dashboard_server}/?page=run&run={run_id}", timeout=60_000)
            heading = page.get_by_text("Strongest evidence", exact=True)
            heading.wait_for(timeout=60_000)
            page.get_by_text("onerror=alert(1)>").first.wait_for(timeout=30_000)
            assert page.locator("img[src='x']").count() == 0
            heading.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(artifacts / "dashboard-run.png"))
            if os.environ.get("SPEC_AUDITOR_UPDATE_DOCS") == "1":
                for name in ("dashboard.png", "dashboard-speed.png", "dashboard-run.png"):
                    shutil.copy(artifacts / name, ROOT / "docs" / name)
        finally:
            browser.close()
