"""CLI commands: ``auditor check``, ``auditor report``, ``auditor demo``.

    auditor check --provider NAME [--suite S] [--budget-tokens N|auto] [--alpha A] [--json PATH]
                  [--format text|json|markdown|junit] [--db URL] [--config F] [--resume RUN_ID]
                  [--device auto|cpu|cuda|cuda:N] [--dtype float32|bfloat16|float16]
    auditor report RUN_ID [--format markdown|json|junit|text] [--output PATH] [--db URL]
    auditor report --provider NAME [--window-days D] [--format ...] [--output PATH] [--db URL]
    auditor demo [--json PATH] [--suite S] [--budget-tokens N] [--db URL]

Exit codes of ``check``: 0 PASS, 1 a deviation (QUANTIZATION / RELAXED_VERIFICATION / SUBSTITUTION /
QUANTIZATION_OR_SUBSTITUTION / DECODING_NONCOMPLIANT), 2 INCONCLUSIVE, 3 usage/config/connection error (one line on stderr, no
traceback), 4 internal error (an unexpected exception: one line on stderr, the traceback in a log file or with
``--debug``; the run is stored ``failed`` with the reason), 130 interrupted. ``report``: 0, or 3 for an unknown run or provider, or for both or
neither of RUN_ID and --provider. ``demo``: 0 when every
simulator's cause was named, 1 otherwise, 3 when a simulator did not start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from auditor.cli.common import console as out_console
from auditor.cli.common import internal_error, internal_errors
from auditor.cli.options import CheckConfigOption, CheckDbOption, DebugFlag, ProviderOption, SuiteOption

if TYPE_CHECKING:  # pragma: no cover
    from auditor.check.errors import AuditError

FORMATS = ("text", "json", "markdown", "junit")

#: ``CheckOptions`` field → the ``auditor check`` flag that sets it (for wording library errors).
FLAGS = {
    "suite": "--suite",
    "budget_tokens": "--budget-tokens",
    "alpha": "--alpha",
    "seed": "--seed",
    "resume": "--resume",
    "db_url": "--db",
    "config_path": "--config",
    "device": "--device",
    "dtype": "--dtype",
    "deadline_s": "--deadline",
}


def word_audit_error(exc: AuditError, provider: str | None = None) -> str:
    """A library :class:`~auditor.check.errors.AuditError` worded for the command line: parameter names
    become their flags (``budget_tokens=5`` → ``--budget-tokens 5``), and a stored run that can be
    continued gets the command that continues it."""
    from auditor.check.errors import NothingToAuditError

    msg = str(exc)
    if exc.parameter in FLAGS:
        flag = FLAGS[exc.parameter]
        msg = msg.replace(f"{exc.parameter}=", f"{flag} ")
    if isinstance(exc, NothingToAuditError) and exc.run_id:
        name = exc.provider or provider or "NAME"
        msg = msg.replace("resume the run.", f"`auditor check --provider {name} --resume {exc.run_id}`.")
    return msg


def _fail(message: str, code: int = 3) -> typer.Exit:
    """Print ``error: message`` (one line, no markup) on stderr and return the Exit to raise."""
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code)


def _emit(text: str, output: Path | None, fmt: str = "") -> None:
    """Write ``text`` to ``output``, or to stdout: Markdown is rendered when stdout is a terminal (issue 38,
    item 3), and written as source to a file or a pipe."""
    if output is None and fmt in ("markdown", "md") and (con := out_console()).is_terminal:
        from rich.markdown import Markdown

        con.print(Markdown(text))
    elif output is None:
        typer.echo(text, nl=not text.endswith("\n"))
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")


def check_cmd(
    provider: ProviderOption,
    suite: SuiteOption = "default",
    budget_tokens: str | None = typer.Option(None, "--budget-tokens", help="Cap on planned completion tokens (default: the whole suite), or 'auto': probe in rounds and stop once decisive (auditor/check/auto_budget.py)."),
    alpha: float = typer.Option(0.05, "--alpha", help="Family-wise significance level (Holm across detectors)."),
    json_path: Path | None = typer.Option(None, "--json", help="Also write the JSON report to PATH."),
    fmt: str = typer.Option("text", "--format", "-f", help="Output on stdout: text | json | markdown | junit."),
    db: CheckDbOption = None,
    config: CheckConfigOption = None,
    resume: str | None = typer.Option(None, "--resume", help="Continue the interrupted audit RUN_ID."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars on stderr while probing and scoring."),
    seed: int = typer.Option(0, "--seed", help="Seed of the detectors' randomization (recorded with the run)."),
    device: str | None = typer.Option(None, "--device", help="Where a local reference runs: auto (CUDA when available) | cpu | cuda | cuda:N (default: the reference table's, else cpu)."),
    dtype: str | None = typer.Option(None, "--dtype", help="Reference precision: float32 | bfloat16 | float16 (default: float32 and bfloat16, or the reference table's)."),
    resolve_cause: bool = typer.Option(False, "--resolve-cause/--stop-at-rejection", help="With --budget-tokens auto: after a rejection whose cause is not established (QUANTIZATION_OR_SUBSTITUTION, or a QUANTIZATION named as the milder cause), keep probing up to the cap to tell quantization from another model (default: stop at the first rejection; the precision answer is 'no' either way)."),
    deadline: float | None = typer.Option(None, "--deadline", help="Seconds the audit's requests may take in all (default: the provider's audit_deadline_s, 3600); past it the audit ends with what it has collected and says so."),
    debug: DebugFlag = False,
) -> None:
    """Audit a provider: probe it, compare with the reference, print the verdict and the evidence.

    Exit codes: 0 PASS, 1 a deviation, 2 INCONCLUSIVE, 3 usage/config/connection error, 4 internal
    error (a bug, never a finding: one line on stderr, the traceback in a log file or with --debug;
    the run is stored as failed with the reason), 130 interrupted.
    """
    from rich.console import Console

    from auditor.check.errors import AuditError
    from auditor.check.pipeline import CheckOptions, run_check
    from auditor.report.render import render, render_json

    if fmt not in FORMATS:
        raise _fail(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if not 0 < alpha < 1:
        raise _fail(f"--alpha {alpha}: must be in (0, 1), e.g. 0.05")
    if deadline is not None and not 0 < deadline < float("inf"):
        raise _fail(f"--deadline {deadline}: a positive number of seconds, e.g. 600")
    err = Console(stderr=True)
    auto = budget_tokens is not None and budget_tokens.strip().lower() == "auto"
    budget: int | None = None
    if budget_tokens is not None and not auto:
        try:
            budget = int(budget_tokens)
        except ValueError:
            budget = 0
        if budget < 1:
            raise _fail(f"--budget-tokens {budget_tokens!r}: a positive number of tokens or 'auto'")
    try:
        from auditor.check.reference_setup import check_device

        check_device(device, dtype)  # CUDA asked without a GPU → exit 3 before anything starts
        if auto:  # sequential stopping (group-sequential design, alpha spending): auditor/check/auto_budget.py
            from auditor.check.auto_budget import run_sequential_check

            if resume:
                raise _fail("--budget-tokens auto cannot --resume; resume with a fixed --budget-tokens")
            rep, _seq = run_sequential_check(
                provider, suite=suite, alpha=alpha, resolve_cause=resolve_cause, db_url=db, config_path=str(config) if config else None,
                progress=True if progress else None, console=err, seed=seed, device=device, dtype=dtype,
                on_look=lambda d: err.print(f"look {d.look}: {d.tokens} tokens, alpha_k={d.alpha_look:.2g}: "
                                            f"{d.verdict} ({d.action})" + (
                                                f"; not yet ruled out: {', '.join(d.details['not_ruled_out'])}"
                                                if d.details.get("not_ruled_out") else ""), highlight=False),
            )
        else:
            rep = run_check(provider, CheckOptions(
                suite=suite, budget_tokens=budget, alpha=alpha, db_url=db,
                config_path=str(config) if config else None, resume=resume, progress=True if progress else None,
                console=err, seed=seed, device=device, dtype=dtype, deadline_s=deadline,
            ))
    except AuditError as exc:
        raise _fail(word_audit_error(exc, provider), exc.exit_code) from None
    except KeyboardInterrupt as exc:
        rid = getattr(exc, "run_id", None) or "<RUN_ID>"
        raise _fail(f"interrupted; continue with: auditor check --provider {provider} --resume {rid}", 130) from None
    except typer.Exit:
        raise
    except Exception as exc:
        raise internal_error(exc, "auditor check", debug=debug) from None
    with internal_errors("auditor check", debug=debug):
        if json_path is not None:
            _emit(render_json(rep) + "\n", json_path)
        if fmt == "text":
            render(rep, "text", out_console())
            err.print(f"re-render: auditor report {rep.run_id} --format markdown", highlight=False)
        else:
            out = render(rep, fmt)
            assert out is not None  # only fmt "text" prints instead of returning a string
            _emit(out, None)
    raise typer.Exit(rep.exit_code)


def report_cmd(
    run_id: str | None = typer.Argument(None, help="RUN_ID of a stored audit (a unique prefix is enough)."),
    provider: str | None = typer.Option(None, "--provider", "-p", help="Instead of RUN_ID: the provider's combined standing over its recent audits (every suite, every cause)."),
    window_days: float = typer.Option(7.0, "--window-days", help="With --provider: audits started within this many days before the provider's newest audit count."),
    fmt: str = typer.Option("markdown", "--format", "-f", help="markdown | json | junit | text."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to PATH instead of stdout."),
    db: CheckDbOption = None,
) -> None:
    """Re-render a stored audit (Markdown for a procurement file, JSON, JUnit XML or text), or with
    --provider the provider's combined standing over the newest audit of each suite."""

    from auditor.report.render import ReportError, load_report, render
    from auditor.store import StoreError

    if fmt not in FORMATS and fmt not in ("md", "xml"):
        raise _fail(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if (run_id is None) == (provider is None):
        raise _fail("give exactly one of RUN_ID (one audit) or --provider NAME (its combined standing), "
                    "e.g. `auditor report --provider acme --format markdown`")
    if provider is not None:
        from auditor.watch.standing import load_standing, render_standing

        try:
            standing = load_standing(provider, db, window_days=window_days)
        except ValueError as exc:
            raise _fail(str(exc).replace("window_days=", "--window-days ")) from None
        except StoreError as exc:
            raise _fail(str(exc)) from None
        if standing is None:
            raise _fail(f"no completed audit of provider {provider!r} in this database. Fix: check the name "
                        f"(`auditor providers list`) and --db, or audit it: `auditor check --provider {provider}`.")
        _emit(render_standing(standing, fmt), output, fmt)
        return
    assert run_id is not None  # exactly one of the two (checked above)
    try:
        rep = load_report(run_id, db)
    except (ReportError, StoreError) as exc:
        raise _fail(str(exc)) from None
    if fmt == "text":
        render(rep, "text", out_console(open(output, "w", encoding="utf-8")) if output else out_console())  # noqa: SIM115
        return
    out = render(rep, fmt)
    assert out is not None  # only fmt "text" prints instead of returning a string
    _emit(out, output, fmt)


def demo_cmd(
    json_path: Path | None = typer.Option(None, "--json", help="Write the list of the JSON reports to PATH."),
    suite: str = typer.Option("default", "--suite", "-s", help="Probe suite for every audit."),
    budget_tokens: int = typer.Option(800, "--budget-tokens", min=1, help="Cap on planned completion tokens per audit (the default suite plans ~1.7k)."),
    db: CheckDbOption = None,
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars on stderr."),
) -> None:
    """Start three simulators (honest-bf16, int4, relaxed-threshold) on loopback, audit each, compare."""
    from rich.console import Console

    from auditor.check.errors import AuditError
    from auditor.demo import DemoError, render_demo_table, run_demo

    err = Console(stderr=True)
    try:
        result = run_demo(suite=suite, budget_tokens=budget_tokens, db_url=db, json_path=json_path,
                          progress=progress, console=err)
    except AuditError as exc:
        raise _fail(word_audit_error(exc), exc.exit_code) from None
    except DemoError as exc:
        raise _fail(str(exc), getattr(exc, "exit_code", 3)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; the simulators were shut down", 130) from None
    render_demo_table(result, out_console())
    raise typer.Exit(0 if result.all_expected else 1)


def register(app: typer.Typer) -> None:
    """Attach ``check``, ``report`` and ``demo`` to the root ``auditor`` app."""
    app.command("check")(check_cmd)
    app.command("report")(report_cmd)
    app.command("demo")(demo_cmd)
