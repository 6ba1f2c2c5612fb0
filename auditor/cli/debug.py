"""CLI command group ``auditor debug``: tools to reproduce a provider's odd answer.

    auditor debug normalize FILE [--json] [--api chat|completions] [--stream]

Exit codes: 0 ok, 3 unreadable or malformed input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from auditor.cli.common import console, fail
from auditor.cli.options import JsonFlag


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
        if len(got) != len(want) or any((g is None) != (w is None) or (g is not None and abs(g - w) > 1e-12) for g, w in zip(got, want, strict=True)):
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


debug_app = typer.Typer(help="Tools to reproduce a provider's odd answer.", no_args_is_help=True)


@debug_app.command("normalize")
def debug_normalize(
    file: Path = typer.Argument(..., help="A case file (../shared/cases format), a raw JSON body, or a raw SSE body."),
    as_json: JsonFlag = False,
    api: str = typer.Option("chat", "--api", help="API of a raw body: chat or completions (case files carry their own)."),
    stream: bool = typer.Option(False, "--stream", help="A raw body is an SSE stream (case files carry their own)."),
) -> None:
    """Normalize a provider response and print n_tokens, text, token_bytes, logprobs, anomalies."""
    from probes.normalize import normalize_response

    try:
        raw = file.read_text(encoding="utf-8")
    except OSError as e:
        fail(f"{file}: cannot read: {e}")
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
        fail(f"{file}: api must be 'chat' or 'completions', got {case['api']!r}")
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
        console().print(t)
    if diffs is not None:
        typer.echo("expect: matches" if not diffs else "expect: DIFFERS: " + "; ".join(diffs))


def register(app: typer.Typer) -> None:
    """Attach ``debug`` to the root auditor app."""
    app.add_typer(debug_app, name="debug")


__all__ = ["check_expectations", "normalized_to_dict", "register"]
