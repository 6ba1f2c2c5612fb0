"""Helpers shared by the command modules: the usage-error exit and the rich console."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["CONFIG_HELP", "DB_HELP", "console", "fail"]

CONFIG_HELP = "Providers file (default: ./providers.toml, then the user config dir)."
DB_HELP = "Database URL (SQLAlchemy) or SQLite path; default $AUDITOR_DB_URL or the user data dir file."


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with code 3 (usage/config/connection error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(3)


def console() -> Console:
    """A rich Console on stdout (rich is imported on first use)."""
    from rich.console import Console

    return Console()
