"""CLI commands: ``auditor providers``, ``auditor suites`` and ``auditor debug``.

    auditor providers list [--config F] [--example]
    auditor providers show NAME [--config F] [--json]
    auditor providers probe NAME [--config F] [--write] [--json]
    auditor suites list [--json]
    auditor suites show NAME [--workload W] [--mode M] [--json]
    auditor debug normalize FILE [--json] [--api chat|completions] [--stream]

Exit codes: 0 ok, 3 usage/config/connection error (as for ``auditor check``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

_CONFIG_HELP = "Providers file (default: ./providers.toml, then the user config dir)."


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(3)


def _console():  # noqa: ANN202 - rich Console
    from rich.console import Console

    return Console()


def _bytes_list(b: bytes | None) -> list[int] | None:
    return None if b is None else list(b)


def normalized_to_dict(norm: Any) -> dict[str, Any]:
    """JSON-ready view of a ``NormalizedResponse`` (bytes as lists of ints)."""
    return {
        "n_tokens": norm.n_tokens,
        "text": norm.text,
        "token_bytes": [_bytes_list(t.bytes) for t in norm.tokens],
        "logprobs": [t.logprob for t in norm.tokens],
        "anomalies": list(norm.anomalies),
        "finish_reason": norm.finish_reason,
        "usage": norm.usage,
        "tokens": [
            {
                "index": t.index,
                "token": t.token,
                "bytes": _bytes_list(t.bytes),
                "logprob": t.logprob,
                "raw_logprob": t.raw_logprob,
                "top_logprobs": [[a, _bytes_list(b), v] for a, b, v in t.top_logprobs],
                "anomalies": list(t.anomalies),
            }
            for t in norm.tokens
        ],
        "echoed_prompt_tokens": len(norm.prompt_tokens),  # echo=True prompt logprobs; usage has the billed count
        "anomaly_details": norm.anomaly_details,
    }


def check_expectations(norm: Any, expect: dict[str, Any]) -> list[str]:
    """Differences between a normalized response and a case's ``expect`` block (empty = matches)."""
    out: list[str] = []
    if "n_tokens" in expect and norm.n_tokens != expect["n_tokens"]:
        out.append(f"n_tokens {norm.n_tokens} != {expect['n_tokens']}")
    if "text" in expect and norm.text != expect["text"]:
        out.append(f"text {norm.text!r} != {expect['text']!r}")
    if "token_bytes" in expect:
        want = [None if b is None else bytes(b) for b in expect["token_bytes"]]
        if [t.bytes for t in norm.tokens] != want:
            out.append("token_bytes differ")
    if "logprobs" in expect:
        got = [t.logprob for t in norm.tokens]
        want = expect["logprobs"]
        if len(got) != len(want) or any((g is None) != (w is None) or (g is not None and abs(g - w) > 1e-12) for g, w in zip(got, want)):
            out.append(f"logprobs {got} != {want}")
    found = set(norm.anomalies)
    for k in expect.get("anomalies_include", []):
        if k not in found:
            out.append(f"missing anomaly {k}")
    for k in expect.get("anomalies_exclude", []):
        if k in found:
            out.append(f"unexpected anomaly {k}")
    if "anomalies_exact" in expect and found != set(expect["anomalies_exact"]):
        out.append(f"anomalies {sorted(found)} != {sorted(expect['anomalies_exact'])}")
    return out


def register(app: typer.Typer) -> None:
    """Attach ``providers``, ``suites`` and ``debug`` to the root auditor app."""
    providers_app = typer.Typer(help="Provider endpoints from providers.toml: list, show, probe capabilities.", no_args_is_help=True)
    suites_app = typer.Typer(help="Probe suites shipped with the package.", no_args_is_help=True)
    debug_app = typer.Typer(help="Tools to reproduce a provider's odd answer.", no_args_is_help=True)
    app.add_typer(providers_app, name="providers")
    app.add_typer(suites_app, name="suites")
    app.add_typer(debug_app, name="debug")

    # -- providers ----------------------------------------------------------------------
    @providers_app.command("list")
    def providers_list(
        config: Path | None = typer.Option(None, "--config", help=_CONFIG_HELP),
        example: bool = typer.Option(False, "--example", help="Print an example providers.toml and exit."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """List the configured providers (the API key is never shown; only whether its env var is set)."""
        import os

        from probes.config import EXAMPLE_PROVIDERS_TOML, ConfigError, find_config_path, load_providers, user_config_path

        if example:
            typer.echo(EXAMPLE_PROVIDERS_TOML, nl=False)
            return
        try:
            where = find_config_path(config)
            provs = load_providers(config)
        except ConfigError as e:
            _fail(str(e))
            return
        rows = [
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
        _console().print(t)

    @providers_app.command("show")
    def providers_show(
        name: str = typer.Argument(..., help="Provider name ([providers.NAME])."),
        config: Path | None = typer.Option(None, "--config", help=_CONFIG_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Show one provider's full configuration (defaults filled in; secrets redacted)."""
        from probes.config import ConfigError, get_provider

        try:
            p = get_provider(name, config)
        except ConfigError as e:
            _fail(str(e))
            return
        d = p.safe_dump()
        if as_json:
            typer.echo(json.dumps(d, indent=2))
            return
        import tomli_w

        typer.echo(f"[providers.{name}]")
        typer.echo(tomli_w.dumps({k: v for k, v in d.items() if k != "name" and v is not None}), nl=False)
        typer.echo(f"# endpoint: {p.endpoint_url()}")

    @providers_app.command("probe")
    def providers_probe(
        name: str = typer.Argument(..., help="Provider name ([providers.NAME])."),
        config: Path | None = typer.Option(None, "--config", help=_CONFIG_HELP),
        write: bool = typer.Option(False, "--write", help="Save the discovered capabilities into the providers file."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Discover capabilities by asking (top_logprobs 20→5, n=2, seed, echo, stream); ~8 tiny requests."""
        import asyncio

        from probes.config import ConfigError, get_provider, write_capabilities
        from probes.discover import discover_capabilities

        try:
            p = get_provider(name, config)
            rep = asyncio.run(discover_capabilities(p))
        except ConfigError as e:
            _fail(str(e))
            return
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "provider": name,
                        "requests": rep.requests,
                        "capabilities": rep.capabilities.model_dump(),
                        "checks": [c.__dict__ for c in rep.checks],
                    },
                    indent=2,
                )
            )
        else:
            from rich.table import Table

            t = Table(title=f"capabilities of {name} ({p.endpoint_url()}, {rep.requests} requests)")
            for col in ("capability", "supported", "value", "status", "detail"):
                t.add_column(col)
            for c in rep.checks:
                t.add_row(c.name, "yes" if c.supported else "no", str(c.value), str(c.http_status or "-"), c.detail[:80])
            _console().print(t)
            if not any(c.http_status for c in rep.checks):
                typer.echo("warning: no HTTP response at all; is the endpoint up?", err=True)
        if write:
            try:
                path = write_capabilities(name, rep.capabilities, config)
            except ConfigError as e:
                _fail(str(e))
                return
            typer.echo(f"wrote [providers.{name}.capabilities] to {path}")
        if not any(c.http_status for c in rep.checks):
            raise typer.Exit(3)

    # -- suites -------------------------------------------------------------------------
    @suites_app.command("list")
    def suites_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """List the shipped suites with their version, size and token budget."""
        from probes.suites import list_suites, load_suite

        rows = []
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
        for r in rows:
            t.add_row(r["name"], r["version"], str(r["probes"]), str(r["requests"]), str(r["max_completion_tokens"]), ",".join(r["workloads"]))
        _console().print(t)

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
            _fail(str(e))
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
        _console().print(t)

    # -- debug --------------------------------------------------------------------------
    @debug_app.command("normalize")
    def debug_normalize(
        file: Path = typer.Argument(..., help="A case file (../shared/cases format), a raw JSON body, or a raw SSE body."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        api: str = typer.Option("chat", "--api", help="API of a raw body: chat or completions (case files carry their own)."),
        stream: bool = typer.Option(False, "--stream", help="A raw body is an SSE stream (case files carry their own)."),
    ) -> None:
        """Normalize a provider response and print n_tokens, text, token_bytes, logprobs, anomalies."""
        from probes.normalize import normalize_response

        try:
            raw = file.read_text(encoding="utf-8")
        except OSError as e:
            _fail(f"{file}: cannot read: {e}")
            return
        case: dict[str, Any] | None = None
        try:
            obj = json.loads(raw)
            if isinstance(obj, dict) and "api" in obj and ("response" in obj or "response_text" in obj):
                case = obj
            else:
                case = {"api": api, "request": {}, "response": obj if not stream else None, "response_text": raw if stream else None, "stream": stream}
        except ValueError:
            case = {"api": api, "request": {}, "response_text": raw, "stream": stream or raw.lstrip().startswith("data:")}
        if case["api"] not in ("chat", "completions"):
            _fail(f"{file}: api must be 'chat' or 'completions', got {case['api']!r}")
            return
        norm = normalize_response(
            case["api"], case.get("request") or {}, response=case.get("response"), response_text=case.get("response_text"), stream=bool(case.get("stream"))
        )
        d = normalized_to_dict(norm)
        diffs = check_expectations(norm, case["expect"]) if isinstance(case.get("expect"), dict) else None
        if as_json:
            if diffs is not None:
                d["expect_ok"] = not diffs
                d["expect_diffs"] = diffs
            typer.echo(json.dumps(d, indent=1, ensure_ascii=False))
            return
        typer.echo(f"n_tokens: {d['n_tokens']}")
        typer.echo(f"text: {d['text']!r}")
        typer.echo(f"token_bytes: {json.dumps(d['token_bytes'])}")
        typer.echo(f"logprobs: {json.dumps(d['logprobs'])}")
        typer.echo(f"anomalies: {json.dumps(d['anomalies'])}")
        if norm.tokens:
            from rich.table import Table

            t = Table()
            for col in ("#", "token", "bytes", "logprob", "raw", "alternatives", "anomalies"):
                t.add_column(col)
            for tok in norm.tokens:
                alts = ", ".join(f"{a!r}:{'-' if v is None else f'{v:.4g}'}" for a, _, v in tok.top_logprobs[:5])
                t.add_row(
                    str(tok.index), repr(tok.token), "?" if tok.bytes is None else tok.bytes.hex(" "),
                    "null" if tok.logprob is None else f"{tok.logprob:.6g}", "" if tok.raw_logprob is None else f"{tok.raw_logprob:.6g}",
                    alts, ",".join(tok.anomalies),
                )
            _console().print(t)
        if diffs is not None:
            typer.echo("expect: matches" if not diffs else "expect: DIFFERS: " + "; ".join(diffs))
