"""`auditor schedule add|list|remove|run --once` and `auditor feed` through the real CLI app."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.store.models import Provider, Schedule

cli = CliRunner()


@pytest.fixture
def known(store):
    with store.session() as s:
        s.add(Provider(name="sim-int4", base_url="http://127.0.0.1:1/v1", model="m", api="chat"))


def test_add_list_remove(store, db_url, known, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no ./providers.toml
    r = cli.invoke(app, ["schedule", "add", "--provider", "sim-int4", "--every", "6h", "--suite", "core",
                         "--budget-tokens", "20000", "--db", db_url])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "every 6h" in r.output
    with store.session() as s:
        row = s.scalars(select(Schedule)).one()
        assert (row.provider_name, row.every_seconds, row.suite, row.budget_tokens) == (
            "sim-int4",
            21600,
            "core",
            20000,
        )
    r = cli.invoke(app, ["schedule", "list", "--db", db_url])
    assert r.exit_code == 0 and "sim-int4" in r.output and "6h" in r.output
    r = cli.invoke(app, ["schedule", "remove", str(row.id), "--db", db_url])
    assert r.exit_code == 0
    r = cli.invoke(app, ["schedule", "remove", str(row.id), "--db", db_url])
    assert r.exit_code == 3 and "no schedule" in r.output
    assert "No schedules" in cli.invoke(app, ["schedule", "list", "--db", db_url]).output


def test_add_rejects_unknown_provider_and_bad_interval(db_url, known, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    r = cli.invoke(app, ["schedule", "add", "--provider", "typo", "--every", "6h", "--db", db_url])
    assert r.exit_code == 3 and "unknown provider 'typo'" in r.output and "sim-int4" in r.output
    r = cli.invoke(app, ["schedule", "add", "--provider", "typo", "--every", "6h", "--force", "--db", db_url])
    assert r.exit_code == 0
    r = cli.invoke(app, ["schedule", "add", "--provider", "sim-int4", "--every", "often", "--db", db_url])
    assert r.exit_code == 3 and "--every" in r.output


def test_run_once_uses_the_pipeline_runner(db_url, known, monkeypatch, tmp_path, clock):
    from .conftest import FakeRunner

    monkeypatch.chdir(tmp_path)
    runner = FakeRunner(clock, verdicts=["QUANTIZATION"])
    monkeypatch.setattr("auditor.watch.scheduler.default_runner", runner)
    assert (
        cli.invoke(app, ["schedule", "add", "--provider", "sim-int4", "--every", "1h", "--db", db_url]).exit_code == 0
    )
    r = cli.invoke(app, ["schedule", "run", "--once", "--db", db_url])
    assert r.exit_code == 0, r.output
    assert len(runner.calls) == 1 and "verdict QUANTIZATION" in r.output
    r = cli.invoke(app, ["schedule", "run", "--once", "--db", db_url])
    assert len(runner.calls) == 1 and "nothing due" in r.output


def test_feed_command_writes_atom(db_url, tmp_path):
    out = tmp_path / "feed.xml"
    r = cli.invoke(app, ["feed", "--output", str(out), "--db", db_url])
    assert r.exit_code == 0 and out.exists()
    assert ET.parse(out).getroot().tag.endswith("feed")
    r = cli.invoke(app, ["feed", "--db", db_url])
    assert r.exit_code == 0 and r.output.startswith("<?xml")


def test_run_once_ends_with_exit_4_on_an_internal_error(db_url, known, monkeypatch, tmp_path):
    """Issue 37 item 1: an audit that crashes (a bug) ends ``schedule run --once`` with exit 4 and one line naming
    the log file with the traceback, never 0; an audit that fails for a reason the user can fix does not."""
    from auditor.check.errors import AuditError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEC_AUDITOR_LOG_DIR", str(tmp_path / "logs"))

    def crash(provider_name, **_kw):
        raise RuntimeError("boom in a scheduled audit")

    monkeypatch.setattr("auditor.watch.scheduler.default_runner", crash)
    assert cli.invoke(app, ["schedule", "add", "--provider", "sim-int4", "--every", "1h", "--db", db_url]).exit_code == 0
    r = cli.invoke(app, ["schedule", "run", "--once", "--db", db_url])
    assert r.exit_code == 4, r.output
    line = next(ln for ln in r.output.splitlines() if "boom" in ln)
    assert "RuntimeError: boom in a scheduled audit" in line and "internal error" in line
    logs = list((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 1 and str(logs[0]) in line and "Traceback" in logs[0].read_text()
    assert "Traceback" not in r.output

    def refused(provider_name, **_kw):
        raise AuditError("provider 'sim-int4': connection refused")

    monkeypatch.setattr("auditor.watch.scheduler.default_runner", refused)
    assert cli.invoke(app, ["schedule", "add", "--provider", "sim-int4", "--every", "2h", "--db", db_url]).exit_code == 0
    r = cli.invoke(app, ["schedule", "run", "--once", "--db", db_url])
    assert r.exit_code == 0 and "connection refused" in r.output and "internal error" not in r.output
