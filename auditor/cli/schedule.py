"""CLI commands: ``auditor schedule add|list|remove|run`` and ``auditor feed``.

Schedules live in the audit database (``schedules`` table), so a restarted ``schedule run`` loses
none and never runs a slot twice (see :mod:`auditor.watch.scheduler`). ``schedule run --once`` performs
one pass and exits: safe to call from cron, a systemd timer or CI.

Exit codes: 0 success, 3 usage/config/database error, 4 internal error (`schedule run`: see its help).
"""

from __future__ import annotations

import os
from typing import Any

import typer

from auditor.cli.common import console as out_console
from auditor.cli.common import fail, internal_errors
from auditor.cli.options import DbOption, DebugFlag


def _open(db: str | None) -> Any:
    from auditor.store.db import StoreError, open_store

    try:
        return open_store(db)
    except StoreError as exc:
        fail(str(exc))


def known_providers(store: Any, config: str | None) -> tuple[set[str], str | None]:
    """Provider names from providers.toml (if one is found) and the ``providers`` table.

    Returns ``(names, problem)``; ``problem`` is the config error text when the file exists but
    cannot be read (so the caller can show it).
    """
    from sqlalchemy import select

    from auditor.store.models import Provider

    names: set[str] = set()
    problem = None
    try:
        from probes.config import ConfigError
        from probes.providers_file import find_config_path, load_providers

        if config is not None or find_config_path(None) is not None:
            try:
                names.update(load_providers(config))
            except ConfigError as exc:
                problem = str(exc)
    except ImportError:  # pragma: no cover - probes is part of the package
        pass
    with store.session() as s:
        names.update(s.scalars(select(Provider.name)))
    return names, problem


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M UTC")
    return str(value)


schedule_app = typer.Typer(
    help="Scheduled audits kept in the audit database (add, list, remove, run).", no_args_is_help=True
)


@schedule_app.command("add")
def add_cmd(
    provider: str = typer.Option(..., "--provider", help="Provider name (from providers.toml)."),
    every: str = typer.Option(..., "--every", help="Interval: 6h, 30m, 1d, 1h30m (s, m, h, d, w)."),
    suite: str | None = typer.Option(None, "--suite", help="Probe suite (default: the check default)."),
    budget_tokens: int | None = typer.Option(
        None, "--budget-tokens", help="Token budget per audit (default: the check default)."
    ),
    start_in: str | None = typer.Option(
        None, "--start-in", help="Delay before the first run (e.g. 10m); default: run on the next pass."
    ),
    config: str | None = typer.Option(None, "--config", help="providers.toml to validate --provider against."),
    force: bool = typer.Option(False, "--force", help="Accept a provider name that no config or run knows."),
    db: DbOption = None,
) -> None:
    """Add a recurring audit of PROVIDER every EVERY."""
    import datetime as dt

    from auditor.store.models import utcnow
    from auditor.watch.scheduler import add_schedule, format_interval, parse_interval

    try:
        seconds = parse_interval(every)
    except ValueError as exc:
        fail(str(exc))
    try:
        delay = parse_interval(start_in) if start_in else 0
    except ValueError as exc:
        fail(str(exc).replace("--every", "--start-in"))
    store = _open(db)
    try:
        if not force:
            names, problem = known_providers(store, config)
            if provider not in names:
                hint = f"known: {', '.join(sorted(names))}" if names else "no provider is configured yet"
                extra = f" ({problem})" if problem else ""
                fail(
                    f"--provider: unknown provider {provider!r}; {hint}{extra}. Add it to providers.toml "
                    "(see `auditor providers`) or pass --force."
                )
        now = utcnow()
        with store.session() as s:
            sched = add_schedule(
                s,
                provider,
                seconds,
                suite=suite,
                budget_tokens=budget_tokens,
                first_run_at=now + dt.timedelta(seconds=delay),
                now=now,
            )
            sid, nxt = sched.id, sched.next_run_at
        typer.echo(f"schedule {sid}: audit {provider} every {format_interval(seconds)}; first run {_fmt(nxt)}")
        typer.echo("Run the scheduler with `auditor schedule run` (or `auditor schedule run --once` from cron).")
    except ValueError as exc:
        fail(str(exc))
    finally:
        store.close()


@schedule_app.command("list")
def list_cmd(db: DbOption = None) -> None:
    """List schedules with their last and next run."""
    from rich.table import Table

    from auditor.store.dashboard_queries import list_schedules
    from auditor.watch.scheduler import format_interval

    store = _open(db)
    try:
        with store.session() as s:
            rows = list_schedules(s)
    finally:
        store.close()
    if not rows:
        typer.echo("No schedules. Add one with `auditor schedule add --provider NAME --every 6h`.")
        return
    table = Table("ID", "Provider", "Every", "Suite", "Budget", "Enabled", "Last run", "Next run")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["provider_name"],
            format_interval(r["every_seconds"]),
            r["suite"] or "-",
            str(r["budget_tokens"] or "-"),
            "yes" if r["enabled"] else "no",
            _fmt(r["last_run_at"]),
            _fmt(r["next_run_at"]),
        )
    out_console().print(table)


@schedule_app.command("remove")
def remove_cmd(
    schedule_id: int = typer.Argument(..., help="Schedule id (see `auditor schedule list`)."),
    db: DbOption = None,
) -> None:
    """Remove schedule ID."""
    from auditor.watch.scheduler import remove_schedule

    store = _open(db)
    try:
        with store.session() as s:
            ok = remove_schedule(s, schedule_id)
    finally:
        store.close()
    if not ok:
        fail(f"no schedule with id {schedule_id} (see `auditor schedule list`)")
    typer.echo(f"removed schedule {schedule_id}")


@schedule_app.command("run")
def run_cmd(
    once: bool = typer.Option(False, "--once", help="Run what is due now, then exit (cron-friendly)."),
    webhook: str | None = typer.Option(
        None, "--webhook", help="POST verdict-change alerts as JSON here (default $AUDITOR_WEBHOOK_URL)."
    ),
    poll: float = typer.Option(60.0, "--poll", min=1.0, help="Longest sleep between passes, seconds."),
    db: DbOption = None,
    debug: DebugFlag = False,
) -> None:
    """Run due audits: a long-running scheduler (Ctrl+C to stop) or one pass with --once.

    Exit codes: 0 done, 3 usage/config/database error, 4 internal error (an unexpected error of the
    scheduler, or with --once of an audit it ran: one line each, the traceback in a log file; the
    audit's run is stored as failed with the reason), 130 stopped by SIGTERM / Ctrl-C during an
    audit (its run is stored interrupted with the reason, its slot is not counted as done, and the
    next `schedule run` resumes it). The long-running scheduler reports a failed audit and goes on
    with the next; Ctrl+C between audits stops it after the current pass.
    """
    import signal
    import threading

    from auditor.check.errors import INTERNAL_ERROR_EXIT
    from auditor.watch.alerts import WEBHOOK_ENV
    from auditor.watch.scheduler import AuditScheduler

    store = _open(db)
    hook = webhook or os.environ.get(WEBHOOK_ENV) or None
    sched = AuditScheduler(store, webhook_url=hook, echo=lambda m: typer.echo(m))
    stop = threading.Event()

    def on_term(*_: object) -> None:
        # SIGTERM (systemd, docker stop, kill): checkpoint the audit in progress now — the scheduler
        # marks its run interrupted and gives the slot back, the next `schedule run` resumes it
        stop.set()
        raise KeyboardInterrupt("SIGTERM")

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_term)}
    try:
        if once:
            with internal_errors("auditor schedule run", debug=debug):
                outcomes = sched.run_due()
            if not outcomes:
                nxt = sched.next_due_at()
                typer.echo(f"nothing due; next run {_fmt(nxt)}" if nxt else "no schedules")
            if any(o.internal for o in outcomes):
                raise typer.Exit(INTERNAL_ERROR_EXIT)
            return
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: stop.set())
        typer.echo(f"scheduler running on {store.display_url} (Ctrl+C to stop)")
        with internal_errors("auditor schedule run", debug=debug):
            sched.run_forever(stop=stop, poll_s=poll)
        typer.echo("scheduler stopped")
    except KeyboardInterrupt:
        if sched.interrupted is None:  # between audits: nothing was cut
            typer.echo("scheduler stopped")
            return
        typer.echo("scheduler stopped during an audit"
                   + (f"; run {sched.interrupted} is stored as interrupted" if sched.interrupted else "")
                   + "; the next `auditor schedule run` resumes it")
        raise typer.Exit(130) from None
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        store.close()


def feed_cmd(
    output: str | None = typer.Option(None, "--output", "-o", help="Write the Atom feed to this file."),
    serve: bool = typer.Option(False, "--serve", help="Serve the feed over HTTP (loopback) until Ctrl+C."),
    port: int = typer.Option(8502, "--port", min=0, max=65535, help="Port for --serve."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address for --serve (loopback by default)."),
    provider: str | None = typer.Option(None, "--provider", help="Only this provider's changes."),
    limit: int = typer.Option(100, "--limit", min=1, help="Newest N changes."),
    db: DbOption = None,
) -> None:
    """Atom feed of verdict changes: print it, write it to a file (--output) or serve it (--serve)."""
    from auditor.watch.feed import feed_from_store, make_feed_server, write_feed

    store = _open(db)
    try:
        if output:
            path = write_feed(store, output, provider_name=provider, limit=limit)
            typer.echo(f"wrote {path}")
        if serve:
            server = make_feed_server(store, host, port, provider_name=provider, limit=limit)
            addr = server.server_address
            assert isinstance(addr, tuple)  # an AF_INET HTTP server: (host, port)
            h, p = addr[:2]
            h = h.decode() if isinstance(h, bytes | bytearray) else h
            typer.echo(f"serving the feed at http://{h}:{p}/feed.atom (Ctrl+C to stop)")
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
            finally:
                server.server_close()
        if not output and not serve:
            typer.echo(feed_from_store(store, provider_name=provider, limit=limit), nl=False)
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    """Attach ``schedule`` (group) and ``feed`` to the root app."""
    app.add_typer(schedule_app, name="schedule")
    app.command("feed")(feed_cmd)
