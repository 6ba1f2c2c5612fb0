"""``auditor demo`` orchestration: simulator subprocesses on loopback, audits, JSON list, and the
servers always shut down (tiny model served from a directory, so it runs in seconds)."""

from __future__ import annotations

import json

import pytest

from auditor import demo
from auditor.demo import DemoError, SimulatorProcess, render_demo_table, run_demo


@pytest.fixture(scope="module")
def tiny_dir(tiny_lm, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-model")
    tiny_lm.model.save_pretrained(str(d))
    tiny_lm.tokenizer.save_pretrained(str(d))
    return d


@pytest.fixture
def tracked(monkeypatch):
    """Record every SimulatorProcess started and stopped."""
    seen: list[SimulatorProcess] = []
    orig = SimulatorProcess.start

    def start(self):
        seen.append(self)
        return orig(self)

    monkeypatch.setattr(SimulatorProcess, "start", start)
    return seen


def test_demo_audits_three_simulators_and_stops_them(tiny_dir, small_floors, tmp_path, tracked) -> None:
    from rich.console import Console

    out = tmp_path / "demo.json"
    res = run_demo(suite="smoke", budget_tokens=48, db_url=f"sqlite:///{tmp_path / 'd.db'}", json_path=out,
                   progress=False, serve_args=["--model", str(tiny_dir)], reference=str(tiny_dir))
    assert [s.profile for s in tracked] == list(demo.DEMO_PROFILES)
    assert all(s.proc is not None and s.proc.poll() is not None for s in tracked)  # all shut down
    assert len({s.port for s in tracked}) == 3
    reports = json.loads(out.read_text())
    assert [r["provider"] for r in reports] == [f"demo-{p}" for p in demo.DEMO_PROFILES]
    assert all(r["verdict"] in demo.EXPECTED.values() or r["verdict"] == "INCONCLUSIVE" for r in reports)
    assert [r.run_id for r in res.reports] == [r["run_id"] for r in reports]
    con = Console(width=200, record=True)
    render_demo_table(res, con)
    text = con.export_text()
    assert "auditor dashboard --db sqlite:///" in text and "demo-int4" in text and "QUANTIZATION" in text


def test_demo_stops_servers_when_one_fails(tiny_dir, tmp_path, tracked) -> None:
    with pytest.raises(DemoError, match="no-such-profile"):
        run_demo(profiles=("honest-fp32", "no-such-profile"), suite="smoke", db_url=f"sqlite:///{tmp_path / 'd.db'}",
                 progress=False, serve_args=["--model", str(tiny_dir)], reference=str(tiny_dir))
    assert len(tracked) == 2
    assert all(s.proc.poll() is not None for s in tracked)
