"""The command line's shape (issue 34, item 4): every command is a module-level function of its
``auditor.cli`` module (a place to start reading, not a closure inside ``register``), and each
command's ``--help`` still lists the options it listed before the commands moved to module level."""

from __future__ import annotations

import inspect
import re
import sys

import pytest
import typer
from typer.testing import CliRunner

from auditor.cli import app

#: Every leaf command (``group sub``) → its parameters in declaration order: an option as its flags
#: joined by "/" (secondary flags last), an argument as its name. Recorded on main before the move.
EXPECTED_OPTIONS: dict[str, tuple[str, ...]] = {
    "calibrate": (
        "--profiles", "--budgets", "--audits", "--suites", "--out", "--db", "--store/--no-store", "--model", "--alpha",
        "--seed", "--samples", "--honest-samples", "--engine-samples", "--max-prompts", "--t0-max-tokens",
        "--sampling-max-tokens", "--sequential/--no-sequential", "--fixed/--no-fixed", "--sequential-audits",
        "--honest-audits", "--spending", "--accept-power", "--resolve-cause/--stop-at-rejection", "--refresh",
        "--effects/--no-effects", "--merge", "--export-requests", "--cache-dir", "--threads", "--workers", "--json",
        "--device", "--dtype", "--card",
    ),
    "check": (
        "--provider/-p", "--suite/-s", "--budget-tokens", "--alpha", "--json", "--format/-f", "--db", "--config/-c",
        "--resume", "--progress/--no-progress", "--seed", "--device", "--dtype", "--resolve-cause/--stop-at-rejection",
        "--deadline", "--debug",
    ),
    "dashboard": ("--db", "--port", "--host", "--auth-header"),
    "db current": ("--db",),
    "db downgrade": ("revision", "--db", "--yes/-y"),
    "db upgrade": ("revision", "--db"),
    "debug normalize": ("file", "--json", "--api", "--stream"),
    "demo": ("--json", "--suite/-s", "--budget-tokens", "--db", "--progress/--no-progress"),
    "feed": ("--output/-o", "--serve", "--port", "--host", "--provider", "--limit", "--db"),
    "models list": ("--json",),
    "models pull": ("name", "--force", "--install/--no-install", "--json"),
    "plan": ("--provider", "--model", "--target", "--power", "--config", "--db", "--calibration", "--json"),
    "probe": (
        "--provider/-p", "--suite/-s", "--config/-c", "--db", "--resume", "--new", "--concurrency", "--max-attempts",
        "--progress/--no-progress", "--retry-failed", "--json",
    ),
    "providers list": ("--config", "--example", "--json"),
    "providers probe": ("name", "--config", "--write", "--json"),
    "providers show": ("name", "--config", "--json"),
    "reference generate": (
        "--prompt", "--chat", "--max-new-tokens", "--drafter", "--k", "--temperature", "--top-p", "--top-k", "--seed",
        "--fixed-k", "--model", "--dtype", "--device", "--device-map", "--json",
    ),
    "reference score": (
        "--prompt", "--continuation", "--chat", "--top-k", "--model", "--dtype", "--device", "--device-map", "--json",
    ),
    "report": ("run_id", "--provider/-p", "--window-days", "--format/-f", "--output/-o", "--db"),
    "schedule add": (
        "--provider", "--every", "--suite", "--budget-tokens", "--start-in", "--config", "--force", "--db",
    ),
    "schedule list": ("--db",),
    "schedule remove": ("schedule_id", "--db"),
    "schedule run": ("--once", "--webhook", "--poll", "--db", "--debug"),
    "serve": (
        "--profile", "--host", "--port", "--model", "--served-model-name", "--drafter", "--k", "--seed", "--faults",
        "--fault-delay", "--accept-threshold-single", "--accept-threshold-acc", "--greedy-flip-rate", "--forced-top-p",
        "--logit-noise", "--ignore-seed", "--server-top-k", "--inject-system-prompt", "--max-tokens-default",
        "--expose-profile", "--list-profiles", "--log-level", "--stream-chunking", "--stream-interval-ms",
        "--reasoning", "--reasoning-logprobs", "--reasoning-budget", "--device", "--logprob-convention", "--enforce",
        "--reject",
    ),
    "speed": (
        "--provider/-p", "--workloads", "--concurrency", "--requests-per-cell", "--max-tokens", "--budget-tokens",
        "--config/-c", "--db", "--store/--no-store", "--logprobs/--no-logprobs", "--json", "--progress/--no-progress",
    ),
    "suites list": ("--json",),
    "suites show": ("name", "--workload", "--mode", "--json"),
}


def _commands() -> dict[str, object]:
    """Leaf command path ("db upgrade") → its click command, walked from the root app."""
    out: dict[str, object] = {}

    def walk(cmd: object, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            out[" ".join(path)] = cmd
            return
        for name, sub in subs.items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


def _declared(cmd: object) -> tuple[str, ...]:
    return tuple(p.name if p.param_type_name == "argument" else "/".join([*p.opts, *p.secondary_opts])
                 for p in cmd.params)  # type: ignore[attr-defined]


def test_every_command_is_known() -> None:
    """The table above covers every command and no removed one (a new command adds its row)."""
    assert sorted(COMMANDS) == sorted(EXPECTED_OPTIONS)


@pytest.mark.parametrize("path", sorted(EXPECTED_OPTIONS))
def test_command_is_a_module_level_function(path: str) -> None:
    """The callback is reachable by its name in its ``auditor.cli`` module (no ``<locals>`` closure)."""
    cb = inspect.unwrap(COMMANDS[path].callback)  # type: ignore[attr-defined]  # typer wraps it
    assert cb.__module__.startswith("auditor.cli."), (path, cb.__module__)
    assert "<locals>" not in cb.__qualname__ and cb.__qualname__ == cb.__name__, (path, cb.__qualname__)
    assert getattr(sys.modules[cb.__module__], cb.__name__) is cb, path


@pytest.mark.parametrize("path", sorted(EXPECTED_OPTIONS))
def test_help_lists_the_same_options(path: str) -> None:
    """Same parameters in the same order, and each flag printed by ``auditor PATH --help``."""
    assert _declared(COMMANDS[path]) == EXPECTED_OPTIONS[path]
    res = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, res.output
    text = re.sub(r"\x1b\[[0-9;]*m", "", res.output)
    for decl in EXPECTED_OPTIONS[path]:
        for flag in decl.split("/"):
            assert flag in text, (path, flag)
