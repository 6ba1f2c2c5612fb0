"""CLI command: ``auditor speed`` — TTFT, TPOT and tokens/s per workload and concurrency, with the
speculation fingerprint per cell.

    auditor speed --provider NAME [--workloads code,math,chat,repetition] [--concurrency 1,4,16]
                  [--requests-per-cell N] [--max-tokens T] [--budget-tokens B] [--config F] [--db URL]
                  [--no-store] [--json] [--yes]

The plan (requests, token budget and its cost at the provider's list prices) is printed before
anything is sent. Results are stored as an ``audit_runs`` row of kind ``speed`` and shown on the
dashboard's Speed vs fidelity page. Exit codes: 0 done, 3 usage/config/connection error or no
response at all. See ``auditor.speed`` and docs/speculation.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from auditor.cli.common import console as out_console
from auditor.cli.common import fail, positive_ints
from auditor.cli.options import CONFIG_HELP, DbOption, ProgressFlag, ProviderOption


def speed_cmd(
    provider: ProviderOption,
    workloads: str = typer.Option("code,math,chat,repetition", "--workloads", help="Comma-separated workload suites."),
    concurrency: str = typer.Option("1,4,16", "--concurrency", help="Concurrency levels (capped by the provider's rate_limits.concurrency)."),
    requests_per_cell: int | None = typer.Option(None, "--requests-per-cell", min=2, help="Requests per cell at least (default 4; a cell sends at least its concurrency level)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=8, max=4096, help="Completion tokens per request."),
    budget_tokens: int | None = typer.Option(None, "--budget-tokens", min=1, help="Cap on prompt + completion tokens; requests per cell shrink to fit."),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    db: DbOption = None,
    store: bool = typer.Option(True, "--store/--no-store", help="Store the run (kind 'speed')."),
    logprobs: bool | None = typer.Option(None, "--logprobs/--no-logprobs", help="Ask logprobs for exact tokens per chunk (default: the provider's capability)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    progress: ProgressFlag = True,
) -> None:
    """Measure speed per workload and load; fingerprint speculation in each cell."""
    from rich.console import Console
    from rich.table import Table

    from auditor.check.run_progress import progress_bar
    from auditor.speed import SpeedError, measure_speed, plan_speed, store_speed
    from auditor.store import StoreError
    from probes.config import ConfigError
    from probes.providers_file import get_provider

    out = out_console()
    err = Console(stderr=True)
    try:
        cfg = get_provider(provider, config)
        plan = plan_speed(cfg, workloads=[w.strip() for w in workloads.split(",") if w.strip()],
                          concurrency=positive_ints(concurrency, "--concurrency", "1,4,16"), requests_per_cell=requests_per_cell,
                          max_tokens=max_tokens, budget_tokens=budget_tokens)
    except (ConfigError, SpeedError) as e:
        fail(str(e))
    pd = plan.to_dict()
    err.print(
        f"plan: {pd['requests']} requests ({len(plan.workloads)} workloads × concurrency {list(plan.concurrency)}), "
        f"≤ {plan.max_tokens} completion tokens each; budget ≤ {plan.budget_tokens} tokens "
        f"(~{plan.prompt_tokens_est} prompt + ≤ {plan.completion_tokens_max} completion) = "
        f"≤ ${plan.cost_usd_max:.4f} at {cfg.name}'s list prices", highlight=False)
    for n in plan.notes:
        err.print(f"note: {n}", highlight=False)
    bar = progress_bar(err, transient=True, disable=not progress)
    with bar:
        task = bar.add_task("speed", total=plan.requests)
        report = measure_speed(plan, cfg, logprobs=logprobs, on_request=lambda r: bar.advance(task))
    if all(c.n_ok == 0 for c in report.cells):
        errs = sorted({e for c in report.cells for e in c.errors})[:3]
        fail(f"no successful streamed response from {cfg.name}: {'; '.join(errs) or 'unknown error'}")
    if store:
        try:
            store_speed(report, cfg, db)
        except (StoreError, ValueError) as e:
            fail(f"could not store the run: {e}")
    d = report.to_dict()
    if report.run_id:
        d["run_id"] = report.run_id
    if json_out:
        typer.echo(json.dumps(d, indent=2, default=str))
        return
    t = Table(title=f"speed profile: {cfg.name} ({cfg.model})")
    for col in ("workload", "conc.", "ok/failed", "TTFT s", "TPOT ms", "tok/s (req)", "tok/s (all)",
                "TPOT chat/this", "tokens/step [95% CI]", "speculates"):
        t.add_column(col, justify="right" if col not in ("workload", "speculates") else "left")
    for c in report.cells:
        sp = c.speculation
        m, ci = sp.get("mean_accepted_tokens_per_step"), sp.get("ci95")
        t.add_row(c.workload, str(c.concurrency), f"{c.n_ok}/{c.n_failed}",
                  f"{c.ttft_median_s:.3f}" if c.ttft_median_s is not None else "—",
                  f"{c.tpot_median_s * 1e3:.1f}" if c.tpot_median_s is not None else "—",
                  f"{c.tokens_per_s_median:.1f}" if c.tokens_per_s_median is not None else "—",
                  f"{c.throughput_tokens_per_s:.1f}" if c.throughput_tokens_per_s is not None else "—",
                  f"{c.tpot_ratio_vs_chat:.2f}" if c.tpot_ratio_vs_chat is not None else "—",
                  (f"{m:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if m is not None and ci else "—"),
                  {True: "yes", False: "no", None: "cannot tell"}[sp.get("detected")])
    out.print(t)
    sp = report.speculation
    out.print(f"speculation (concurrency {min(plan.concurrency)}, all workloads): "
              f"{ {True: 'detected', False: 'not detected', None: 'cannot tell'}[sp.get('detected')]}"
              f" — {sp.get('evidence', {}).get('reason', '')}", highlight=False, markup=False)
    out.print(f"spent {report.prompt_tokens + report.completion_tokens} tokens "
              f"({report.prompt_tokens} prompt + {report.completion_tokens} completion) = ${report.cost_usd:.4f}; "
              f"announced ≤ {plan.budget_tokens} tokens = ≤ ${plan.cost_usd_max:.4f}"
              + (f"; run {report.run_id}" if report.run_id else ""), highlight=False)


def register(app: typer.Typer) -> None:
    """Attach ``auditor speed`` to the root ``auditor`` app."""
    app.command("speed")(speed_cmd)
