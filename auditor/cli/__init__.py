"""The `auditor` command line (Typer + rich).

Each command (or command group) lives in the module of its name under ``auditor.cli``
(``auditor probe`` in ``probe.py``, ``auditor schedule``/``feed`` in ``schedule.py``, ...) as a
module-level function (``check.check_cmd``, ``schedule.add_cmd``: a place to start reading); a group
is a module-level ``typer.Typer`` (``schedule.schedule_app``). Each module's
``register(app: typer.Typer) -> None`` only attaches its commands to this root app, which collects
them; ``common.py`` holds the helpers they share. Heavy imports (torch, transformers, streamlit) happen inside
command functions so that ``auditor --help`` stays fast and audits can run without a GPU stack.

Exit codes (see ``auditor check``): 0 PASS, 1 deviation found,
2 INCONCLUSIVE, 3 usage/config/connection error, 4 internal error (``auditor.check.errors.INTERNAL_ERROR_EXIT``).
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="auditor",
    help="Audit LLM inference providers: original precision? strict speculative verification?\n\n"
    "Exit codes: 0 PASS, 1 deviation found, 2 INCONCLUSIVE, 3 usage/config/connection error, "
    "4 internal error (a bug: one line, the traceback in a log file; --debug prints it).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

#: Command modules, in help order. Each defines ``register(app)``, which attaches its module-level commands.
COMMAND_MODULES = (
    "check",  # check, report, demo
    "serve",  # serve (provider simulator)
    "models",  # models pull|list
    "reference",  # reference generate|score
    "providers",  # providers list|show|probe
    "suites",  # suites list|show
    "debug",  # debug normalize
    "probe",  # probe (probes-only run, resumable)
    "db",  # db upgrade|downgrade|current
    "dashboard",  # dashboard
    "schedule",  # schedule add|list|remove|run, feed
    "calibrate",  # calibrate, plan
    "speed",  # speed (TTFT/TPOT per workload and load, speculation fingerprint)
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"auditor.cli.{_name}").register(app)


def main() -> None:
    """Console-script entry point for ``auditor``."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
