"""The test session says when it measures a noise floor into its own cache (tests/floor_notice.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import floor_notice


class _Capture:
    """Stand-in for pytest's CaptureManager: records whether capture is suspended."""

    def __init__(self) -> None:
        self.suspended = False

    @contextlib.contextmanager
    def global_and_fixture_disabled(self):
        self.suspended = True
        try:
            yield
        finally:
            self.suspended = False


class _Reporter:
    """Stand-in for the terminal reporter: keeps each line with the capture state it was written in."""

    def __init__(self, capman: _Capture) -> None:
        self.capman = capman
        self.lines: list[tuple[str, bool]] = []

    def ensure_newline(self) -> None:
        pass

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append((line, self.capman.suspended))


def _config():
    capman = _Capture()
    reporter = _Reporter(capman)
    plugins = {"capturemanager": capman, "terminalreporter": reporter}
    return SimpleNamespace(pluginmanager=SimpleNamespace(getplugin=plugins.get)), reporter


def test_measurement_into_the_session_dir_is_announced_through_capture(tmp_path: Path) -> None:
    config, reporter = _config()
    seen = []

    def compute(ref_lms, **kw):
        seen.append(kw)
        return "floors"

    wrapped = floor_notice.announcing(compute, config, tmp_path)
    lm = SimpleNamespace(name="smollm2-135m-instruct")
    prompts = [[1, 2]] * 52
    out = wrapped({"float32": lm, "bfloat16": lm}, prompt_names=["p"] * 52, prompts=prompts, max_new_tokens=32,
                  spill_dir=tmp_path)
    assert out == "floors" and len(seen) == 1  # the measurement itself is unchanged
    assert [suspended for _line, suspended in reporter.lines] == [True, True]  # capture off while writing
    start, end = (line for line, _s in reporter.lines)
    for part in ("smollm2-135m-instruct", "52 prompts × 32 tokens", "float32, bfloat16", str(tmp_path), "min"):
        assert part in start, (part, start)
    assert "measured in" in end and "smollm2-135m-instruct" in end


def test_other_measurements_stay_silent(tmp_path: Path) -> None:
    config, reporter = _config()
    wrapped = floor_notice.announcing(lambda ref_lms, **kw: "floors", config, tmp_path / "session")
    lm = SimpleNamespace(name="tiny")
    assert wrapped({"float32": lm}, prompt_names=[], prompts=[], spill_dir=tmp_path / "elsewhere") == "floors"
    assert wrapped({"float32": lm}, prompt_names=[], prompts=[]) == "floors"
    assert reporter.lines == []


def test_a_failed_measurement_says_so(tmp_path: Path) -> None:
    config, reporter = _config()

    def compute(ref_lms, **kw):
        raise MemoryError("no room")

    wrapped = floor_notice.announcing(compute, config, tmp_path)
    with pytest.raises(MemoryError):
        wrapped({"float32": SimpleNamespace(name="m")}, prompts=[[1]], spill_dir=tmp_path)
    assert len(reporter.lines) == 2 and "failed" in reporter.lines[1][0]


def test_session_fixture_announces_floors_measured_into_its_dir(noise_dir: Path, tiny_lm, monkeypatch) -> None:
    """The autouse ``noise_dir`` fixture wraps ``compute_floors``: ``get_floors`` into the session's
    cache says so (a miniature floor, its own cache key), into another folder it does not."""
    from auditor.check import measured_floors

    said: list[str] = []
    monkeypatch.setattr(floor_notice, "say", lambda config, message: said.append(message))
    measured_floors.get_floors({"float32": tiny_lm}, n_prompts=2, max_new_tokens=3, cache_dir=noise_dir, force=True)
    assert len(said) == 2 and tiny_lm.name in said[0] and "measured in" in said[1], said
    assert "seconds for a tiny test model" in said[0] and "7 min" not in said[0], said[0]  # not SmolLM2's time
    said.clear()
    measured_floors.get_floors({"float32": tiny_lm}, n_prompts=2, max_new_tokens=3, cache_dir=noise_dir / "x", force=True)
    assert said == []


def test_a_notice_inside_a_cli_runner_keeps_the_runners_output(pytestconfig) -> None:
    """A floor measured inside ``CliRunner().invoke`` (tests/audit/test_native_card.py measures one there): suspending
    pytest's capture swapped ``sys.stdout`` away from the runner's stream, which was then collected and closed, and
    the invocation ended in "ValueError: I/O operation on closed file"; the notice must leave the runner's streams."""
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()

    @app.command()
    def main() -> None:
        print("before the notice")
        floor_notice.say(pytestconfig, "a notice written while a CliRunner holds sys.stdout")
        print("after the notice")

    res = CliRunner().invoke(app, [])
    assert res.exception is None, repr(res.exception)
    assert res.exit_code == 0
    assert "before the notice" in res.output and "after the notice" in res.output


def test_rough_time_is_the_models_own() -> None:
    """The start line's time is the model's: minutes for the bundled models (their +fp8 / +int4 variants too),
    seconds for the tests' tiny random models (a new user read SmolLM2's "~7 min" before a 15-s tiny floor)."""
    assert "7 min" in floor_notice.rough_time("smollm2-135m-instruct+fp8")
    assert "minutes" in floor_notice.rough_time("gemma-3-270m")
    assert floor_notice.rough_time("tiny+int4") == "seconds for a tiny test model"


def test_xdist_workers_share_one_measurement(tmp_path: Path, monkeypatch) -> None:
    """Under pytest-xdist (``make test``) the session folder is every worker's: a worker asking for a floor another
    one has measured takes that result instead of measuring it again; a different floor is measured."""
    from auditor.check.measured_floors import FloorSet

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    config, reporter = _config()
    calls: list[int] = []

    def compute(ref_lms, **kw):
        calls.append(kw["max_new_tokens"])
        return FloorSet(model="tiny", revision="abc", floors={}, meta={"n": len(calls)})

    wrapped = floor_notice.announcing(compute, config, tmp_path)
    lm = SimpleNamespace(name="tiny", revision="abc")
    first = wrapped({"float32": lm}, prompt_names=["p"], prompts=[[1, 2]], max_new_tokens=3, spill_dir=tmp_path)
    again = wrapped({"float32": lm}, prompt_names=["p"], prompts=[[1, 2]], max_new_tokens=3, spill_dir=tmp_path)
    other = wrapped({"float32": lm}, prompt_names=["p"], prompts=[[1, 2]], max_new_tokens=4, spill_dir=tmp_path)
    assert calls == [3, 4] and again.meta == first.meta == {"n": 1} and other.meta == {"n": 2}
    assert len(reporter.lines) == 4  # start and end of the two measurements, nothing for the reuse
