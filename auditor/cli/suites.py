"""CLI command group ``auditor suites``: the probe suites shipped with the package.

    auditor suites list [--json]
    auditor suites show NAME [--workload W] [--mode M] [--json]

Exit codes: 0 ok, 3 unknown suite or bad filter.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from auditor.cli.common import console, fail
from auditor.cli.options import JsonFlag

suites_app = typer.Typer(help="Probe suites shipped with the package.", no_args_is_help=True)


@suites_app.command("list")
def suites_list(as_json: JsonFlag = False) -> None:
    """List the shipped suites with their version, size and token budget."""
    from probes.suites import list_suites, load_suite

    rows: list[dict[str, Any]] = []  # JSON rows
    for n in list_suites():
        s = load_suite(n)
        rows.append(
            {
                "name": n,
                "version": s.version,
                "digest": s.digest,
                "probes": len(s.probes),
                "requests": s.n_requests(),
                "max_completion_tokens": s.max_completion_tokens(),
                "workloads": sorted({p.workload for p in s.probes}),
                "description": s.description,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table(title="probe suites")
    for col in ("name", "version", "probes", "requests", "max tokens", "workloads"):
        t.add_column(col)
    t.add_column("what it answers", overflow="fold", ratio=1)  # issue 38 item 12: smoke says it is a wire check
    for r in rows:
        t.add_row(r["name"], r["version"], str(r["probes"]), str(r["requests"]), str(r["max_completion_tokens"]),
                  ",".join(r["workloads"]), r["description"])
    console().print(t)


@suites_app.command("show")
def suites_show(
    name: str = typer.Argument(..., help="Suite name (see `auditor suites list`)."),
    workload: list[str] = typer.Option([], "--workload", help="Only this workload (repeatable)."),
    mode: list[str] = typer.Option([], "--mode", help="Only this mode: greedy, logprob, sampling (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the suite JSON."),
) -> None:
    """Show a suite's probes (id, workload, mode, max_tokens, temperature, top_logprobs, samples)."""
    from probes.suites import SuiteError, load_suite

    try:
        s = load_suite(name).filter(workload or None, mode or None)
    except SuiteError as e:
        fail(str(e))
        return
    if as_json:
        typer.echo(s.model_dump_json(indent=1))
        return
    from rich.table import Table

    t = Table(title=f"suite {s.name} v{s.version} ({s.digest}): {len(s.probes)} probes, {s.n_requests()} requests, ≤{s.max_completion_tokens()} completion tokens")
    for col in ("id", "workload", "mode", "max_tokens", "T", "top_logprobs", "samples", "prompt"):
        t.add_column(col)
    for p in s.probes:
        first = (p.chat_messages()[-1]["content"]).replace("\n", " ")
        t.add_row(p.id, p.workload, p.mode, str(p.max_tokens), f"{p.temperature:g}", str(p.top_logprobs if p.top_logprobs is not None else "-"), str(p.n_samples), first[:50] + ("…" if len(first) > 50 else ""))
    console().print(t)


def register(app: typer.Typer) -> None:
    """Attach ``suites`` to the root auditor app."""
    app.add_typer(suites_app, name="suites")


__all__ = ["register"]
