"""Audit reports: rendering an :class:`~auditor.report.common.AuditReport` (text, JSON, Markdown, JUnit XML).

An :class:`~auditor.report.common.AuditReport` (the record and the helpers every renderer shares live in
:mod:`auditor.report.common`) is what ``auditor check`` prints and what ``auditor.check.pipeline.run_check``
returns. It is built either at the end of the pipeline (``auditor/check/pipeline.py``) or re-read from the
audit database (:func:`load_report`, behind ``auditor report RUN_ID``); both paths produce the
same JSON (the test suite checks it), so a stored run can be re-rendered at any time.

Renderers (all pure functions of the report; :func:`render` dispatches on the format):

- :func:`render_text` — rich console output: verdict, a table (detector, statistic, p, p_adj,
  effect [95% CI], n, outcome) and the cost (tokens, USD);
- :func:`render_json` — the machine-readable report (fields listed in :data:`JSON_FIELDS`);
- ``render_markdown`` — a self-contained document for a procurement file: facts, verdict and
  reason, detector table, speed/usage, noise floor, and the token-level evidence behind the
  strongest findings (prompt, position, provider token, reference top-5, margin); it lives in
  ``auditor.report.markdown``;
- ``render_junit`` (``auditor.report.junit``) — JUnit XML (one ``testcase`` per detector plus one for the verdict), so a
  CI system shows an audit like a test run: a rejecting detector is a ``failure``, a detector
  that could not run is ``skipped``, an INCONCLUSIVE verdict is an ``error``.

Every renderer opens with the buyer's two questions (issue 14, :mod:`auditor.verdict.questions`): "Is the model
served at its original precision?" and "Is speculative verification strict (lossless)?", each
answered in plain words first (``QuestionAnswer.plain``, then the headline; issue 38, item 6) with its
evidence in figures below (JSON: the top-level ``questions`` list of ``{key, question, answer, plain,
evidence}``; JUnit: ``question.*`` properties and the suite's ``system-out``). Each figure and account has
one home (issue 38): the KL-vs-floor ratio is :func:`auditor.detectors.logprob.kl_floor_ratio` everywhere,
"ruled out" comes from the audit's power record (:mod:`auditor.verdict.rules_out`, shown once; the precision estimate
defers to it), and the verdict's reason is quoted once (:func:`auditor.report.common.reason_shown`).

Every renderer shows every cause, not only the primary one (issue 13): the verdict's
``secondary_causes`` with their deciding evidence, the provider failures (share and kinds) when
probes failed, and the parameter-compliance pre-flight checks (``auditor.check.preflight``; failed ones
named), and the responses excluded whole from the detectors with the reason
(``auditor.check.observations.excluded_summary``). In JSON they are the top-level ``secondary_causes``,
``provider_failures``, ``preflight_checks`` and ``excluded_responses``; in JUnit one failing ``testcase`` per secondary cause and one ``testcase`` per
pre-flight check (exit codes are unchanged: they follow the primary verdict only).

On PASS and INCONCLUSIVE every renderer shows what the audit rules out (:mod:`auditor.verdict.rules_out`:
per deviation class, 95% power against its calibrated effect or not): text, a line after the
verdict; JSON, the top-level ``rules_out`` list; Markdown, a "What this audit rules out" table;
JUnit, a ``rules_out`` property and a system-out line.

Units: log-probabilities and KL in nats, tokens in tokens, money in USD, times in seconds;
timestamps are ISO 8601 UTC strings.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Literal

from auditor.detectors.speculation import speculation_line
from auditor.report.common import (
    AuditReport,
    cause_flip_line,
    concurrency_line,
    deadline_line,
    detector_outcome,
    evidence_str,
    excluded_line,
    failure_line,
    fmt_effect,
    fmt_num,
    logprob_defects_line,
    reason_shown,
    usage_note,
    usd,
)
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.util import fmt_p as _fmt_p
from auditor.verdict.rules_out import RULE_OUT_POWER, rules_out_sentence

__all__ = [
    "FORMATS",
    "ReportError",
    "load_report",
    "prompt_text_of",
    "render",
    "render_json",
    "render_text",
    "report_from_store",
]

#: Output formats understood by :func:`render`.
FORMATS = ("text", "json", "markdown", "junit")

class ReportError(LookupError):
    """A stored run cannot be rendered (unknown or ambiguous RUN_ID, not an audit); the message names the fix."""


# ------------------------------------------------------------------------------------------ text
def render_text(report: AuditReport, console: Any | None = None) -> None:
    """Print the report with rich: verdict, detector table, cost. ``console`` defaults to stdout."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    colour = {0: "green", 1: "red", 2: "yellow"}[report.exit_code]
    # issue 38, item 6: the first lines are plain words (the two answers, the headline); statistics below
    questions = report.questions
    for q in questions:
        qc = {"yes": "green", "no": "red", "not established": "magenta", "not tested": "dim"}.get(q.answer, "yellow")
        console.print(f"{q.question} [bold {qc}]{q.answer}[/bold {qc}] — {escape(q.plain or q.evidence)}",
                      highlight=False)
    console.print(f"[bold]In plain words:[/bold] {escape(report.headline)}", highlight=False)
    console.print(
        f"[bold]{report.provider}[/bold] ({report.model}) — run [bold]{report.run_id}[/bold], "
        f"suite {report.suite} v{report.suite_version}, reference {report.reference.get('model')} "
        f"@{report.reference.get('revision')}",
        highlight=False,
    )
    if report.reference.get("card"):
        console.print(f"original precision (model card): {escape(str(report.reference['card']))}", highlight=False)
    console.print("[bold]Why, in figures:[/bold]", highlight=False)
    for q in questions:
        console.print(f"  {q.key}: {escape(q.evidence)}", highlight=False)
    t = Table(title=f"detectors (Holm, family-wise α = {report.alpha:g})", title_justify="left")
    cols: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("detector", "left"), ("statistic", "right"), ("p", "right"), ("p (Holm)", "right"),
        ("effect [95% CI]", "right"), ("n", "right"), ("outcome", "left"))
    for col, just in cols:
        t.add_column(col, justify=just)
    for d in report.detectors:
        out = detector_outcome(d, report.alpha, report.explained)
        style = "red" if out == "REJECTS" else ("dim" if out == "not run" else "")
        if not d.get("ran"):
            t.add_row(d["name"], "", "", "", "", str(d.get("n") or 0), f"not run: {d.get('reason') or ''}", style=style)
            continue
        t.add_row(
            d["name"],
            fmt_num(d.get("statistic")),
            _fmt_p(d.get("p_value")),
            _fmt_p(d.get("p_adjusted")),
            fmt_effect(d),
            str(d.get("n")),
            out,
            style=style,
        )
    console.print(t)
    console.print(f"[bold {colour}]verdict: {report.verdict}[/bold {colour}] — {escape(reason_shown(report))}",
                  highlight=False)
    for c in report.secondary_causes:
        console.print(f"  also [bold red]{c.get('verdict')}[/bold red] ({c.get('rule')}): {c.get('reason')} "
                      f"[{evidence_str(c)}]", highlight=False)
    for f in report.findings:
        if f.get("explained_by"):
            console.print(f"  not a separate cause: {f.get('detector')} — {escape(str(f.get('implication') or ''))}",
                          highlight=False)
    if fl_cause := cause_flip_line(report):
        console.print(f"  {escape(fl_cause)}", highlight=False)
    if report.rules_out:
        console.print(f"at {RULE_OUT_POWER:.0%} power against the calibrated effect sizes: "
                      f"{escape(rules_out_sentence(report.rules_out))}", highlight=False)
    if (pe := report.precision_estimate) is not None:
        console.print(f"measured precision: {escape(str(pe['sentence']))}", highlight=False)
    fl = failure_line(report.provider_failures)
    if fl:
        console.print(f"  [yellow]provider failures: {fl}[/yellow]", highlight=False)
    if xl := excluded_line(report.excluded_responses):
        console.print(f"  [yellow]excluded: {escape(xl)}[/yellow]", highlight=False)
    if ld := logprob_defects_line(report.summary):
        console.print(f"  [yellow]{escape(ld)}[/yellow]", highlight=False)
    if dl := deadline_line(report.summary):
        console.print(f"  [yellow]{escape(dl)}[/yellow]", highlight=False)
    checks = report.preflight_checks
    if checks:
        bad = [c for c in checks if c.get("passed") is False]
        console.print(f"pre-flight: {sum(1 for c in checks if c.get('passed'))} of {len(checks)} parameter checks "
                      f"passed" + (f"; failed: {', '.join(c['name'] for c in bad)}" if bad else ""), highlight=False)
        for c in bad:
            console.print(f"  [red]{c['name']}[/red]: {c.get('summary')}"
                          + (f" (p={_fmt_p(c.get('p_value'))})" if c.get("p_value") is not None else ""), highlight=False)
    tk = report.tokens or {}
    s = report.summary or {}
    speed = []
    if s.get("ttft_median_s") is not None:
        speed.append(f"TTFT median {s['ttft_median_s']:.3f} s")
    if s.get("tpot_median_s") is not None:
        speed.append(f"TPOT median {s['tpot_median_s'] * 1000:.1f} ms")
    if s.get("tokens_per_s") is not None:
        speed.append(f"{s['tokens_per_s']:.1f} tokens/s")
    if s.get("mean_tokens_per_chunk") is not None:
        speed.append(f"{s['mean_tokens_per_chunk']:.2f} tokens/chunk")
    if spec_line := speculation_line(s.get("speculation")):
        speed.append(spec_line)
    if cl := concurrency_line(s):
        console.print(f"  [yellow]{cl}[/yellow]", highlight=False)
    est = usage_note(s)
    console.print(
        f"cost: {tk.get('prompt', 0)} prompt + {tk.get('completion', 0)} completion tokens = {tk.get('total', 0)} tokens, "
        f"{usd(report.cost_usd)}" + (f" ({est})" if est else "")
        + f"; {tk.get('scored_positions', 0)} positions compared with the reference"
        + (f"; {', '.join(speed)}" if speed else "")
        + (f"; wall {report.wall_s:.1f} s" if report.wall_s is not None else ""),
        highlight=False,
    )


# ------------------------------------------------------------------------------------------ json
def render_json(report: AuditReport, indent: int | None = 2) -> str:
    """The JSON report as a string (strict JSON)."""
    return json.dumps(report.to_dict(), indent=indent, sort_keys=False, ensure_ascii=False)


def render(report: AuditReport, fmt: str = "text", console: Any | None = None) -> str | None:
    """Render in ``fmt`` (one of :data:`FORMATS`). ``text`` prints to ``console`` and returns None.

    Raises:
        ValueError: unknown format (lists the known ones).
    """
    if fmt == "text":
        render_text(report, console)
        return None
    if fmt == "json":
        return render_json(report)
    if fmt in ("markdown", "md"):
        return render_markdown(report)
    if fmt in ("junit", "xml"):
        return render_junit(report)
    raise ValueError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")


# ------------------------------------------------------------------------------------------ stored runs
def _iso(x: Any) -> str | None:
    return x.isoformat() if isinstance(x, dt.datetime) else (None if x is None else str(x))


def prompt_text_of(request: dict | None) -> str:
    """The prompt of a stored request: the last user message (chat) or the prompt (completions)."""
    if not isinstance(request, dict):
        return ""
    msgs = request.get("messages")
    if isinstance(msgs, list) and msgs:
        users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"] or [m for m in msgs if isinstance(m, dict)]
        return str(users[-1].get("content", "")) if users else ""
    p = request.get("prompt")
    if isinstance(p, list):
        return str(p[0]) if p else ""
    return str(p or "")


def report_from_store(session: Any, run_id: str) -> AuditReport:
    """Rebuild the :class:`AuditReport` of a stored audit run from the database (no model needed).

    Args:
        session: an open SQLAlchemy session on the audit database.
        run_id: the RUN_ID or a unique prefix of it.

    Raises:
        ReportError: unknown/ambiguous id, or the run has no verdict yet (not finished or not an audit; a
            ``failed`` run's message carries its stored failure reason).
    """
    from auditor.check.reference_setup import card_fields
    from auditor.store import queries as q
    from probes.model_card import card_description, stored_card

    try:
        run = q.find_run(session, run_id)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    if run is None:
        raise ReportError(f"no run {run_id!r} in this database. Fix: check the RUN_ID (dashboard, or `auditor check` output) and --db.")
    det = q.run_detail(session, run.id)
    assert det is not None  # the run exists (found above)
    vrow = det.verdict
    if vrow is None and run.status == "failed":
        why = run.failure_reason or "no reason was stored (runs from before reasons were kept)"
        raise ReportError(
            f"run {run.id} ({run.kind}) failed and has no verdict: {why}. Fix: remove the cause (an internal error "
            f"is a bug: report it with its log file), then continue the run with "
            f"`auditor check --provider {run.provider_name} --resume {run.id}`."
        )
    if vrow is None:
        raise ReportError(
            f"run {run.id} ({run.kind}, {run.status}) has no verdict yet. Fix: finish it with "
            f"`auditor check --provider {run.provider_name} --resume {run.id}`."
        )
    vd = dict(vrow.details or {})
    extra = vd.pop("report", {}) or {}
    dets_extra = extra.get("detectors", {}) or {}
    detectors: list[dict[str, Any]] = []
    for row in det.detector_results:
        d = {
            "name": row.name,
            "ran": bool(row.ran),
            "statistic": row.statistic,
            "p_value": row.p_value,
            "p_adjusted": row.p_adjusted,
            "effect": row.effect,
            "effect_ci": [row.effect_ci_low, row.effect_ci_high],
            "n": int(row.n or 0),
            "reason": row.reason,
            "rejects": bool(row.ran and row.p_adjusted is not None and run.alpha is not None and row.p_adjusted <= run.alpha),
            "evidence": list(row.evidence or []),
            "details": dict((dets_extra.get(row.name) or {}).get("details") or {}),
        }
        detectors.append(d)
    summary = dict(run.summary or {})
    summary.pop("runner", None)
    if isinstance(summary.get("preflight"), dict):  # the raw exchanges stay in the store, not in reports
        summary["preflight"] = {k: v for k, v in summary["preflight"].items() if k != "exchanges"}
    pt, ct = int(run.prompt_tokens or 0), int(run.completion_tokens or 0)
    tokens = {"prompt": pt, "completion": ct, "total": pt + ct, "budget": run.budget_tokens}
    tokens.update(extra.get("tokens_extra") or {})
    cited = {str(e.get("prompt_id")) for d in detectors for e in d["evidence"] if isinstance(e, dict)}
    prompts = {}
    for p in q.list_probes(session, run.id):
        if p.probe_key in cited:
            prompts[p.probe_key] = prompt_text_of(p.request_json)
    snap = run.config_snapshot or {}
    prov = snap.get("provider") or {}
    suite_snap = snap.get("suite") or {}
    return AuditReport(
        run_id=run.id,
        provider=run.provider_name,
        model=run.model,
        verdict=vrow.verdict,
        verdict_reason=vrow.reason or "",
        alpha=float(run.alpha if run.alpha is not None else vd.get("alpha", 0.05)),
        detectors=detectors,
        tokens=tokens,
        cost_usd=float(run.cost_usd or 0.0),
        suite=run.suite,
        suite_version=run.suite_version,
        suite_digest=suite_snap.get("digest"),
        reference={
            "model": run.reference_model,
            "revision": run.reference_revision,
            "dtype": run.reference_dtype,
            "card": card_description(prov.get("card"), run.reference_model, run.reference_dtype),
            **card_fields(stored_card(prov.get("card"), run.reference_model), run.reference_revision),
            "claimed_precision": prov.get("claimed_precision"),
            **({"variants": extra["reference_variants"]} if extra.get("reference_variants") else {}),
        },
        started_at=_iso(run.started_at),
        finished_at=_iso(run.finished_at),
        status=run.status,
        api=prov.get("api"),
        base_url=prov.get("base_url"),
        summary=summary,
        verdict_details=vd,
        probes={
            "total": det.n_probes,
            "ok": det.probe_counts.get("done", 0),
            "failed": det.probe_counts.get("failed", 0),
            "attempts": det.n_attempts,
            "retries": det.n_retries,
        },
        prompts=prompts,
        noise_floor=dict(extra.get("noise_floor") or {}),
        code_version=run.code_version,
        wall_s=extra.get("wall_s"),
    )


def load_report(run_id: str, db_url: str | None = None) -> AuditReport:
    """Open the audit database (``--db`` / ``$AUDITOR_DB_URL`` / default) and rebuild a run's report.

    Raises:
        ReportError: see :func:`report_from_store`.
        auditor.store.StoreError: the database cannot be opened.
    """
    from auditor.store import open_store

    store = open_store(db_url)
    try:
        with store.session() as s:
            return report_from_store(s, run_id)
    finally:
        store.close()
