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



def _fake_reports(verdicts: list[str], tests: list[tuple[str, float]]) -> list:
    """Report stand-ins with what ``render_demo_table`` reads; every test rejects unless the verdict is PASS."""
    from types import SimpleNamespace

    return [SimpleNamespace(verdict=v, run_id=f"{i:012x}", tokens={"total": 1234 + i}, cost_usd=0.00012 * (i + 1),
                            wall_s=300.0 + i,
                            detectors=[{"name": n, "ran": True, "p_adjusted": p, "rejects": v != "PASS"} for n, p in tests])
            for i, v in enumerate(verdicts)]


def _render(res, width: int) -> str:
    from rich.console import Console

    con = Console(width=width, record=True)
    render_demo_table(res, con)
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text, text  # folded or wrapped, never cut
    return text


def test_demo_table_fits_100_columns_and_keeps_every_value() -> None:
    """The final table fits a 100-column console without cutting a cell: every provider, run id,
    expected verdict, verdict, deciding test with its p, tokens, USD and seconds shows whole."""
    profiles = list(demo.DEMO_PROFILES)
    # the longest detector names, several rejecting at once
    tests = [("logprob-heterogeneity", 1.5e-12), ("greedy-heterogeneity", 3e-5), ("logprob-divergence", 0.0021)]
    reports = _fake_reports([demo.EXPECTED[p] for p in profiles], tests)
    res = demo.DemoResult(profiles, reports, 901.0, "sqlite:///x.db")
    lines = _render(res, 100).splitlines()
    for p, r in zip(profiles, reports, strict=True):
        row = next(i for i, line in enumerate(lines) if line.startswith(f"demo-{p} "))
        cells = lines[row].split()
        assert cells[:4] == [f"demo-{p}", demo.EXPECTED[p], r.verdict, "✓"], lines[row]
        assert lines[row + 1].split()[0] == r.run_id
        block = "\n".join(lines[row:row + 2 * len(tests)])
        shown = [n for n, p_adj in tests if n in block.split() and f"p={p_adj:.2g}" in block.split()]
        smallest = min(tests, key=lambda t: t[1])[0]  # a PASS row shows the test with the smallest p
        assert shown == ([smallest] if r.verdict == "PASS" else [n for n, _ in tests]), block
        for number in (str(r.tokens["total"]), f"{r.cost_usd:.5f}", f"{r.wall_s:.0f}"):
            assert number in block.split(), (number, block)


def test_demo_table_breaks_long_verdicts_after_or() -> None:
    """A ``..._OR_...`` verdict (up to 45 characters) breaks after ``_OR_``, each part whole, and an
    unexpected one is marked ✗; the table still fits 100 columns, and folds (never cuts) at 80."""
    profiles = [*demo.DEMO_PROFILES, "mixed"]
    expected = {**demo.EXPECTED, "mixed": "QUANTIZATION_OR_SUBSTITUTION"}
    longest = "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT"
    reports = _fake_reports([*(expected[p] for p in demo.DEMO_PROFILES), longest], [("logprob-divergence", 1e-9)])
    res = demo.DemoResult(profiles, reports, 901.0, "sqlite:///x.db", expected=expected)
    words = _render(res, 100).split()
    for part in [*longest.split("_OR_"), *expected["mixed"].split("_OR_")]:
        assert part in words or part + "_OR_" in words or part + " ✗" in words, part
    assert words.count("✓") == 3 and words.count("✗") == 1
    _render(res, 80)
