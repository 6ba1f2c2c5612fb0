"""Helpers shared by the command modules: the usage-error exit and the rich console."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["CONFIG_HELP", "DB_HELP", "console", "fail", "positive_ints"]

CONFIG_HELP = "Providers file (default: ./providers.toml, then the user config dir)."
DB_HELP = "Database URL (SQLAlchemy) or SQLite path; default $AUDITOR_DB_URL or the user data dir file."


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


def console() -> Console:
    """A rich Console on stdout (rich is imported on first use)."""
    from rich.console import Console

    return Console()
