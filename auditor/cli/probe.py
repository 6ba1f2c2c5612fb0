"""CLI command: ``auditor probe`` — a probes-only run (resumable), stored in the audit database.

    auditor probe --provider NAME [--suite S|FILE.json] [--config F] [--db URL]
                  [--resume RUN_ID | --new] [--concurrency N] [--max-attempts N] [--no-progress]

Sends every request of the suite to the provider with bounded concurrency and retries, persists
each attempt as it arrives, normalizes the responses, and prints a summary (probes ok/failed,
attempts, retries, tokens, USD). Without ``--resume`` or ``--new`` it continues the newest
unfinished run of the same provider and suite, if any. Exit codes: 0 all probes finished
(some may have failed after retries), 3 usage/config/database error or no probe succeeded,
130 interrupted (resume with ``--resume RUN_ID``; ``--retry-failed`` also resends failed probes).
"""

from __future__ import annotations

import json

import typer

from auditor.cli.common import console as out_console
from auditor.cli.options import CheckConfigOption, CheckDbOption, ProgressFlag, ProviderOption, SuiteOption


def probe_cmd(
    provider: ProviderOption,
    suite: SuiteOption = "default",
    config: CheckConfigOption = None,
    db: CheckDbOption = None,
    resume: str | None = typer.Option(None, "--resume", help="Continue run RUN_ID (pending probes only)."),
    new: bool = typer.Option(False, "--new", help="Start a new run even if an unfinished one exists."),
    concurrency: int | None = typer.Option(None, "--concurrency", min=1, help="Override rate_limits.concurrency."),
    max_attempts: int | None = typer.Option(None, "--max-attempts", min=1, help="Override retry.max_attempts."),
    progress: ProgressFlag = True,
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="When resuming, also resend probes that failed after all retries."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Probes-only run: send a suite to a provider, store every attempt, print a summary."""
    from rich.console import Console

    from auditor.check.errors import AuditError
    from auditor.check.planning import load_suite_spec
    from auditor.check.runner import RunnerError, describe_errors, render_summary, run_probes, summarize_run
    from auditor.store import StoreError, open_store
    from probes.config import ConfigError
    from probes.providers_file import get_provider

    err = Console(stderr=True, soft_wrap=True)  # one message, one line
    if resume and new:
        err.print("error: --resume and --new exclude each other")
        raise typer.Exit(3)
    try:
        cfg = get_provider(provider, config)
        st = load_suite_spec(suite)
        cfg.resolve_api_key()
        store = open_store(db)
    except (AuditError, ConfigError, StoreError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(3) from None

    started: dict[str, str] = {}

    def on_start(rid: str, resumed: bool) -> None:
        started["run_id"] = rid
        err.print(
            f"{'resuming' if resumed else 'starting'} run {rid} ({cfg.name}, suite {st.name} v{st.version}) "
            f"-> {store.display_url}",
            markup=False,
            highlight=False,
        )

    try:
        run_id = run_probes(
            store,
            cfg,
            st,
            run_id=resume,
            resume=not new,
            progress=progress,
            concurrency=concurrency,
            max_attempts=max_attempts,
            console=err,
            on_start=on_start,
            retry_failed=retry_failed,
        )
    except RunnerError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        store.close()
        raise typer.Exit(3) from None
    except KeyboardInterrupt:
        rid = started.get("run_id", "<RUN_ID>")
        err.print(
            f"interrupted; continue with: auditor probe --provider {cfg.name} --suite {suite} --resume {rid}",
            markup=False,
            highlight=False,
        )
        store.close()
        raise typer.Exit(130) from None
    summary = summarize_run(store, run_id)
    store.close()
    if json_out:
        typer.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        render_summary(summary, out_console())
    if summary.status == "failed":
        err.print(
            f"error: no probe succeeded ({describe_errors(summary.error_kinds, summary.error_examples)}). "
            f"Fix the provider's base_url/model/key, then: auditor probe --provider {cfg.name} --suite {suite} "
            f"--resume {run_id} --retry-failed",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    """Attach ``auditor probe`` to the root ``auditor`` app."""
    app.command("probe")(probe_cmd)
