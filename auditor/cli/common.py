"""Helpers shared by the command modules: the usage-error exit, the internal-error exit and the rich console
(the options several commands declare alike: :mod:`auditor.cli.options`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["PIPE_WIDTH", "console", "fail", "internal_error", "internal_errors", "positive_ints"]


def internal_error(exc: BaseException, command: str, *, debug: bool = False) -> typer.Exit:
    """Report an unexpected error of ``command`` and return the Exit (code 4,
    :data:`auditor.check.errors.INTERNAL_ERROR_EXIT`) to raise.

    One line on stderr: ``error: internal error in auditor CMD: <type>: <message>``, the failed run when the
    exception names one (``exc.run_id``, set by ``auditor.check.pipeline.run_check``), and where the traceback is: a new
    log file (:func:`auditor.check.errors.write_error_log`), or on stderr after the line with ``debug``.
    """
    import traceback

    from auditor.check.errors import INTERNAL_ERROR_EXIT, failure_reason, write_error_log

    what = failure_reason(exc).removeprefix("internal error: ")
    rid = getattr(exc, "run_id", None)
    run = f"; run {rid} is stored as failed with this reason" if isinstance(rid, str) and rid else ""
    if debug:
        where = "traceback below"
    else:
        path = write_error_log(exc, command)
        where = (f"traceback in {path}" if path is not None else "the traceback could not be written to a log file")
        where += "; rerun with --debug to print it"
    typer.echo(f"error: internal error in {command} (a bug in spec-auditor, not a finding about the provider): "
               f"{what}{run}; {where}", err=True)
    if debug:
        typer.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
    return typer.Exit(INTERNAL_ERROR_EXIT)


@contextlib.contextmanager
def internal_errors(command: str, *, debug: bool = False) -> Iterator[None]:
    """Turn any unexpected exception raised inside the block into :func:`internal_error`'s one line and
    exit 4; the command's own exits (``typer.Exit``, usage errors) and Ctrl-C pass through."""
    import click

    try:
        yield
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise internal_error(exc, command, debug=debug) from None


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 3 (usage/config/connection error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(3)


def positive_ints(text: str, option: str, example: str) -> list[int]:
    """Parse an option's comma-separated list of positive integers (``"1,4,16"`` → ``[1, 4, 16]``).

    Args:
        text: the option's value; blanks around items and empty items are ignored.
        option: the option's name for the message (``"--budgets"``).
        example: a valid value to show in the message.

    Exits with code 3 (:func:`fail`, naming the option and the example) on a non-integer item,
    an empty list or a value below 1.
    """
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{option} must be a comma-separated list of integers, got {text!r} (e.g. {example})")
    if not vals or min(vals) < 1:
        fail(f"{option} must hold positive integers, got {text!r} (e.g. {example})")
    return vals


#: Width of a console whose output is not a terminal (a file, a pipe, a CI log): wide enough that no
#: table cell (detector names, p-values, the speed table) is ever cut or folded (issue 38, item 3).
#: Tables are not expanded, so they stay as wide as their content; ``$COLUMNS`` still overrides.
PIPE_WIDTH = 1000


def console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A rich Console on stdout (or ``file``, or stderr); rich is imported on first use.

    On a terminal it takes the terminal's width. Written to a file or a pipe (``> report.txt``, a CI
    log), rich would assume 80 columns and cut table cells (``logprob-dive…``); this console is then
    :data:`PIPE_WIDTH` wide unless ``$COLUMNS`` is set, so names and numbers stay whole.
    """
    import os

    from rich.console import Console

    c = Console(file=file, stderr=stderr)
    if c.is_terminal or os.environ.get("COLUMNS"):
        return c
    return Console(file=file, stderr=stderr, width=PIPE_WIDTH)
