"""The command-line options that several commands declare alike, one declaration each (issue 34).

Each alias is an ``Annotated`` type a command's parameter takes, with its default as the parameter's
default (``db: DbOption = None``); the flags and help text live here only. An option one command alone
declares stays in that command's signature. Options of the same meaning whose help texts still differ
between commands (``--db``: :data:`DbOption`, :data:`CheckDbOption`, :data:`MigrationDbOption`) keep
their wording, so that every command's ``--help`` reads as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["CONFIG_HELP", "DB_HELP", "DEBUG_HELP", "CheckConfigOption", "CheckDbOption", "ConfigOption", "DbOption",
           "DebugFlag", "JsonFlag", "MigrationDbOption", "ProgressFlag", "ProviderOption", "SuiteOption"]

CONFIG_HELP = "Providers file (default: ./providers.toml, then the user config dir)."
DB_HELP = "Database URL (SQLAlchemy) or SQLite path; default $AUDITOR_DB_URL or the user data dir file."
DEBUG_HELP = ("On an internal error (exit 4) print the traceback on stderr instead of writing it to a log file "
              "($SPEC_AUDITOR_LOG_DIR, $SPEC_AUDITOR_HOME/logs or the user log dir).")

#: ``--db URL`` (calibrate, plan, schedule, feed, speed); default None.
DbOption = Annotated[str | None, typer.Option("--db", help=DB_HELP)]
#: ``--db URL`` as ``check``, ``report``, ``demo`` and ``probe`` word it; default None.
CheckDbOption = Annotated[
    str | None, typer.Option("--db", help="Database URL (default $AUDITOR_DB_URL or the user data dir SQLite file).")
]
#: ``--db URL`` as the ``db`` migration commands word it; default None.
MigrationDbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database URL (SQLAlchemy); default $AUDITOR_DB_URL or the user data dir SQLite file."),
]
#: ``--config FILE``, the providers file (``providers list|show|probe``); default None.
ConfigOption = Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)]
#: ``--config/-c FILE`` as ``check`` and ``probe`` word it; default None.
CheckConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="providers.toml (default ./providers.toml or the user config dir)."),
]
#: ``--provider/-p NAME``, required (``check``, ``probe``, ``speed``).
ProviderOption = Annotated[str, typer.Option("--provider", "-p", help="Provider name in providers.toml.")]
#: ``--suite/-s NAME|FILE`` (``check``, ``probe``); default ``"default"``.
SuiteOption = Annotated[str, typer.Option("--suite", "-s", help="Packaged suite name or a suite .json file.")]
#: ``--json``: print JSON instead of text; default False.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]
#: ``--progress/--no-progress``: a progress bar on stderr (``probe``, ``speed``); default True.
ProgressFlag = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar (stderr).")]
#: ``--debug``: the traceback of an internal error on stderr (``check``, ``schedule run``); default False.
DebugFlag = Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)]
