"""CLI commands: ``auditor db upgrade|downgrade|current [--db URL]``.

The database URL comes from ``--db``, else ``$AUDITOR_DB_URL``, else the default SQLite file
(see :mod:`auditor.store.db`). Every other command upgrades the database automatically; these
commands are for operators (explicit upgrades of a shared PostgreSQL, rollbacks, inspection).
Exit code 3 on a usage/connection/migration error.
"""

from __future__ import annotations

import typer

from auditor.cli.options import MigrationDbOption

db_app = typer.Typer(help="Audit database: migrations and status.", no_args_is_help=True)


@db_app.command("upgrade")
def upgrade_cmd(
    revision: str = typer.Argument("head", help="Target revision (default: head)."),
    db: MigrationDbOption = None,
) -> None:
    """Run migrations up to REVISION (default head)."""
    from auditor.store import db as sdb

    engine = _engine(db)
    try:
        before = sdb.current_revision(engine)
        sdb.upgrade(engine, revision)
        after = sdb.current_revision(engine)
    except Exception as exc:
        _fail(f"upgrade failed: {exc}")
    finally:
        engine.dispose()
    typer.echo(f"{engine.url.render_as_string(hide_password=True)}: {before or 'base'} -> {after or 'base'}")


@db_app.command("downgrade")
def downgrade_cmd(
    revision: str = typer.Argument("-1", help="Target revision: 'base' drops every table, '-1' one step."),
    db: MigrationDbOption = None,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation when going to base."),
) -> None:
    """Undo migrations down to REVISION (default: one step back). Data in dropped tables is lost."""
    from auditor.store import db as sdb

    engine = _engine(db)
    try:
        before = sdb.current_revision(engine)
        if revision == "base" and not yes:
            typer.confirm(
                f"Drop every table of {engine.url.render_as_string(hide_password=True)}?",
                abort=True,
            )
        sdb.downgrade(engine, revision)
        after = sdb.current_revision(engine)
    except typer.Abort:
        raise
    except Exception as exc:
        _fail(f"downgrade failed: {exc}")
    finally:
        engine.dispose()
    typer.echo(f"{engine.url.render_as_string(hide_password=True)}: {before or 'base'} -> {after or 'base'}")


@db_app.command("current")
def current_cmd(db: MigrationDbOption = None) -> None:
    """Print the database URL, its revision and the newest revision shipped (head)."""
    from auditor.store import db as sdb

    engine = _engine(db)
    try:
        cur = sdb.current_revision(engine)
    except Exception as exc:
        _fail(f"cannot read the revision: {exc}")
    finally:
        engine.dispose()
    head = sdb.head_revision()
    state = "up to date" if cur == head else ("empty" if cur is None else "needs `auditor db upgrade`")
    typer.echo(f"url: {engine.url.render_as_string(hide_password=True)}")
    typer.echo(f"current: {cur or 'base'}")
    typer.echo(f"head: {head}")
    typer.echo(f"state: {state}")


def register(app: typer.Typer) -> None:
    """Attach the ``db`` command group to the root ``auditor`` app."""
    app.add_typer(db_app, name="db")


def _engine(db: str | None):
    from auditor.store.db import StoreError, make_engine

    try:
        return make_engine(db)
    except StoreError as exc:
        _fail(str(exc))


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(3)
