"""Browser test: `auditor dashboard` served on loopback, opened in headless Debian chromium.

Needs /usr/bin/chromium (``apt-get install -y chromium``; .ci/run installs it) and the
``playwright`` Python package (its own browser downloads are not used). Saves the screenshot to
``artifacts/dashboard.png`` (a CI artefact); with ``SPEC_AUDITOR_UPDATE_DOCS=1`` also to
``docs/`` (dashboard.png, dashboard-speed.png, dashboard-run.png).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reference.loopback import free_port
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


@pytest.fixture
def dashboard_server(seeded, tmp_path):
    """`python -m auditor dashboard --db URL --port P` in a subprocess; yields the base URL."""
    url, _ = seeded
    port = free_port()
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


PAGES = ("providers", "speed", "history", "run", "calibration")


def test_hostile_provider_text_is_shown_as_text_on_every_page(dashboard_server, seeded):
    """Issue 38 item 9: tokens that are HTML or Markdown (a script, a remote image, a javascript: link,
    an onerror image, an event handler) are shown escaped on every page: nothing executes, nothing is
    fetched, no such element or link exists in the document."""
    _, summary = seeded
    run_id = summary["runs"]["sim-relaxed"][-1]
    fetched: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("request", lambda r: fetched.append(r.url))
            page.on("dialog", lambda d: (fetched.append(f"dialog:{d.message}"), d.dismiss()))
            for slug in PAGES:
                page.goto(f"{dashboard_server}/?page={slug}" + (f"&run={run_id}" if slug == "run" else ""),
                          timeout=60_000)
                page.locator("[data-testid='stMain']").first.wait_for(timeout=60_000)
                page.wait_for_timeout(2500)
                if slug == "run":
                    page.get_by_text("Strongest evidence", exact=True).wait_for(timeout=60_000)
                    page.get_by_text("window.__pwned=1").first.wait_for(timeout=30_000)  # shown as text
                    page.wait_for_timeout(1500)
                assert page.evaluate("() => window.__pwned") is None, slug
                assert page.locator("img[src='x'], img[src*='pwned']").count() == 0, slug
                assert page.locator("a[href^='javascript']").count() == 0, slug
                assert page.locator("b[onmouseover]").count() == 0, slug
                assert page.locator("script:has-text('__pwned')").count() == 0, slug
            assert not [u for u in fetched if "pwned" in u or u.startswith("dialog:")], fetched
        finally:
            browser.close()


@pytest.fixture
def dashboard_off_loopback(seeded, tmp_path):
    """`auditor dashboard --host 0.0.0.0` with a known token (from the environment); yields (base URL, token)."""
    url, _ = seeded
    port = free_port()
    token = "browser-test-token-0123456789"
    log = open(tmp_path / "streamlit.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "auditor", "dashboard", "--db", url, "--port", str(port), "--host", "0.0.0.0"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "SPEC_AUDITOR_DASHBOARD_TOKEN": token},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(proc, f"{base}/_stcore/health", timeout_s=90, log=(tmp_path / "streamlit.log").read_text)
        yield base, token
    finally:
        stop_process(proc)
        log.close()


def test_off_loopback_the_dashboard_asks_for_a_login_first(dashboard_off_loopback, seeded):
    """Issue 38 item 8: bound beyond loopback, no page shows data without the token; with it, all do."""
    base, token = dashboard_off_loopback
    _, summary = seeded
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for slug in ("providers", "run", "calibration"):
                page.goto(f"{base}/?page={slug}", timeout=60_000)
                page.get_by_text("Access token").first.wait_for(timeout=60_000)
                page.wait_for_timeout(1000)
                body = page.inner_text("body")
                assert not any(name in body for name in summary["latest_verdicts"]), slug
            page.get_by_label("Access token").fill("wrong")
            page.get_by_role("button", name="Open").click()
            page.get_by_text("Wrong token.").wait_for(timeout=30_000)
            page.goto(f"{base}/?page=providers&token={token}", timeout=60_000)
            table = page.locator("table").filter(has_text="Provider").first
            table.wait_for(timeout=60_000)
            assert all(name in table.inner_text() for name in summary["latest_verdicts"])
            assert "token=" not in page.url  # the token does not stay in the address bar
        finally:
            browser.close()

