"""CLI command group ``auditor providers``: the endpoints of providers.toml.

    auditor providers list [--config F] [--example]
    auditor providers show NAME [--config F] [--json]
    auditor providers probe NAME [--config F] [--write] [--json]

Exit codes: 0 ok, 3 usage/config/connection error (as for ``auditor check``; ``probe``: also any request that
failed other than by the server refusing an option, with its status and the server's message; nothing is written).
"""

from __future__ import annotations

import json
from typing import Any

import typer

from auditor.cli.common import console, fail
from auditor.cli.options import ConfigOption, JsonFlag

#: The NAME argument of ``providers show`` and ``providers probe``.
_NAME_ARG = typer.Argument(..., help="Provider name ([providers.NAME]).")

providers_app = typer.Typer(help="Provider endpoints from providers.toml: list, show, probe capabilities.", no_args_is_help=True)


@providers_app.command("list")
def providers_list(
    config: ConfigOption = None,
    example: bool = typer.Option(False, "--example", help="Print an example providers.toml and exit."),
    as_json: JsonFlag = False,
) -> None:
    """List the configured providers (the API key is never shown; only whether its env var is set)."""
    import os

    from probes.config import ConfigError
    from probes.providers_file import EXAMPLE_PROVIDERS_TOML, find_config_path, load_providers, user_config_path

    if example:
        typer.echo(EXAMPLE_PROVIDERS_TOML, nl=False)
        return
    try:
        where = find_config_path(config)
        provs = load_providers(config)
    except ConfigError as e:
        fail(str(e))
        return
    rows: list[dict[str, Any]] = [  # JSON rows
        {
            "name": p.name,
            "api": p.api,
            "base_url": p.base_url,
            "model": p.model,
            "reference": p.reference,
            "api_key_env": p.api_key_env,
            "key_set": None if p.api_key_env is None else bool(os.environ.get(p.api_key_env)),
        }
        for p in provs.values()
    ]
    if as_json:
        typer.echo(json.dumps({"file": str(where) if where else None, "providers": rows}, indent=2))
        return
    if where is None:
        typer.echo(
            f"no providers file (looked for ./providers.toml and {user_config_path()}). "
            "Create one: auditor providers list --example > providers.toml"
        )
        return
    from rich.table import Table

    t = Table(title=f"providers in {where}")
    for col in ("name", "api", "base_url", "model", "reference", "key"):
        t.add_column(col)
    for r in rows:
        key = "-" if r["api_key_env"] is None else f"${r['api_key_env']} ({'set' if r['key_set'] else 'NOT SET'})"
        t.add_row(r["name"], r["api"], r["base_url"], r["model"], r["reference"], key)
    console().print(t)


@providers_app.command("show")
def providers_show(
    name: str = _NAME_ARG,
    config: ConfigOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show one provider's full configuration (defaults filled in; secrets redacted)."""
    from probes.config import ConfigError
    from probes.providers_file import get_provider

    try:
        p = get_provider(name, config)
    except ConfigError as e:
        fail(str(e))
        return
    d = p.safe_dump()
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    import tomli_w

    typer.echo(f"[providers.{name}]")
    def _no_none(v: Any) -> Any:  # TOML has no null: unset optional fields are left out
        return {k: _no_none(x) for k, x in v.items() if x is not None} if isinstance(v, dict) else v

    typer.echo(tomli_w.dumps(_no_none({k: v for k, v in d.items() if k != "name"})), nl=False)
    typer.echo(f"# endpoint: {p.endpoint_url()}")


@providers_app.command("probe")
def providers_probe(
    name: str = _NAME_ARG,
    config: ConfigOption = None,
    write: bool = typer.Option(False, "--write", help="Save the discovered capabilities into the providers file."),
    as_json: JsonFlag = False,
) -> None:
    """Discover capabilities by asking (enforced or rejected sampling parameters, top_logprobs 20→5, n=2, seed,
    echo, stream); ~12 tiny requests."""
    import asyncio

    from probes.config import ConfigError
    from probes.discover import discover_capabilities
    from probes.providers_file import get_provider, write_capabilities

    try:
        p = get_provider(name, config)
        rep = asyncio.run(discover_capabilities(p))
    except ConfigError as e:
        fail(str(e))
        return
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "provider": name,
                    "requests": rep.requests,
                    "capabilities": rep.capabilities.model_dump() if rep.capabilities is not None else None,
                    "checks": [c.__dict__ for c in rep.checks],
                    "logprob_convention": rep.convention,
                    "enforced": rep.enforced.model_dump() if rep.enforced is not None else None,
                    "error": rep.error,
                },
                indent=2,
            )
        )
    if rep.capabilities is None:  # a request failed: report nothing unobserved, write nothing
        fail(f"probe of {name!r} at {p.endpoint_url()} failed after {rep.requests} request"
             f"{'' if rep.requests == 1 else 's'}: {rep.error}; nothing written and no capability reported. "
             "Fix: check base_url, model and api_key_env (`auditor providers show " + name + "`), then probe again.")
        return
    if not as_json:
        from rich.table import Table

        t = Table(title=f"capabilities of {name} ({p.endpoint_url()}, {rep.requests} requests)")
        for col in ("capability", "supported", "value", "status", "detail"):
            t.add_column(col)
        for c in rep.checks:
            t.add_row(c.name, "yes" if c.supported else "no", str(c.value), str(c.http_status or "-"), c.detail[:80])
        console().print(t)
    if write:
        try:
            path = write_capabilities(name, rep.capabilities, config, concurrency=rep.safe_concurrency,
                                      enforced=rep.enforced)
        except ConfigError as e:
            fail(str(e))
            return
        typer.echo(f"wrote [providers.{name}.capabilities] to {path}")
        if rep.safe_concurrency is not None:
            typer.echo(f"wrote [providers.{name}.rate_limits] concurrency = {rep.safe_concurrency} (overlapping requests were cut)")
        if rep.enforced is not None and (said := rep.enforced.describe()):
            typer.echo(f"wrote [providers.{name}.enforced]: {said}")
    if rep.enforced is not None and rep.enforced.unknown():
        typer.echo(f"the provider overrides or rejects {', '.join(rep.enforced.unknown())} and its value could not be read: "
                   f"declare it in [providers.{name}.enforced] (the provider's documentation) before an audit")


def register(app: typer.Typer) -> None:
    """Attach ``providers`` to the root auditor app."""
    app.add_typer(providers_app, name="providers")


__all__ = ["register"]
