"""CLI commands: run (module owned by its issue; see docs/ARCHITECTURE.md)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root ``auditor`` app."""
