"""The audit's rich progress bars on a narrow terminal: descriptions and counters whole, the bar shrinks."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from auditor.check.run_progress import ProgressDisplay, RunProgress


def _rows(bar, width: int) -> list[str]:
    """The bar's task rows as a ``width``-column terminal shows them (no live display needed)."""
    out = Console(width=width, record=True, file=io.StringIO())
    out.print(bar.make_tasks_table(bar.tasks))
    return out.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 100])
def test_probe_bar_keeps_name_and_counters_whole(width: int) -> None:
    """The probing bar of the demo's longest provider name: name, done/total and the ok/failed/retries
    counters show whole at 80 and 100 columns (they were cut to ``3…`` and ``0:0…``); the run id is
    said once above the bar."""
    buf = io.StringIO()
    state = RunProgress("3f2a9c8d1e0b", total=120, done=0, ok=0, failed=0, attempts=0, retries=0)
    display = ProgressDisplay(True, state, "demo-relaxed-threshold", Console(file=buf, width=width))
    for outcome in ["done"] * 36 + ["failed"]:
        display.count(outcome)
    state.retries = 3
    display.report()
    rows = _rows(display.bar, width)
    display.stop()
    assert len(rows) == 1 and len(rows[0]) <= width and "…" not in rows[0], rows
    for part in ("demo-relaxed-threshold", f"{state.done}/{state.total}", "ok 36 · failed 1 · retries 3"):
        assert part in rows[0], (part, rows)
    assert "probing demo-relaxed-threshold: run 3f2a9c8d1e0b, 120 of 120 probes to send" in buf.getvalue()


def test_stage_bars_keep_descriptions_whole_at_80_columns() -> None:
    """The noise-floor and scoring bars of ``auditor check`` (``pipeline._Stage``) at 80 columns."""
    from auditor.check.pipeline import _Stage

    stages = [("noise floor: honest-bf16", 10, 52), ("reference scoring (bfloat16)", 7, 240)]
    with _Stage(progress=True, console=Console(file=io.StringIO(), width=80)) as stage:
        for call in stages:
            stage.update(*call)
        rows = _rows(stage._bar, 80)
    assert len(rows) == len(stages), rows
    for row, (name, done, total) in zip(rows, stages, strict=True):
        assert len(row) <= 80 and "…" not in row and name in row and f"{done}/{total}" in row, row
