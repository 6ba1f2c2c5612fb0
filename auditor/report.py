"""Audit reports: the :class:`AuditReport` record and its renderers (text, JSON, Markdown, JUnit XML).

An :class:`AuditReport` is what ``auditor check`` prints and what ``auditor.audit.run_check``
returns. It is built either at the end of the pipeline (``auditor/audit.py``) or re-read from the
audit database (:func:`load_report`, behind ``auditor report RUN_ID``); both paths produce the
same JSON (the test suite checks it), so a stored run can be re-rendered at any time.

Renderers (all pure functions of the report):

- :func:`render_text` — rich console output: verdict, a table (detector, statistic, p, p_adj,
  effect [95% CI], n, outcome) and the cost (tokens, USD);
- :func:`render_json` — the machine-readable report (fields listed in :data:`JSON_FIELDS`);
- :func:`render_markdown` — a self-contained document for a procurement file: facts, verdict and
  reason, detector table, speed/usage, noise floor, and the token-level evidence behind the
  strongest findings (prompt, position, provider token, reference top-5, margin); it lives in
  ``auditor.report_markdown`` and is re-exported here;
- :func:`render_junit` — JUnit XML (one ``testcase`` per detector plus one for the verdict), so a
  CI system shows an audit like a test run: a rejecting detector is a ``failure``, a detector
  that could not run is ``skipped``, an INCONCLUSIVE verdict is an ``error``.

Every renderer opens with the buyer's two questions (issue 14, :mod:`auditor.questions`): "Is the model
served at its original precision?" and "Is speculative verification strict (lossless)?", each
answered yes / no / not tested with its evidence (JSON: the top-level ``questions`` list of
``{key, question, answer, evidence}``; JUnit: ``question.*`` properties and the suite's
``system-out``).

Every renderer shows every cause, not only the primary one (issue 13): the verdict's
``secondary_causes`` with their deciding evidence, the provider failures (share and kinds) when
probes failed, and the parameter-compliance pre-flight checks (``auditor.preflight``; failed ones
named), and the responses excluded whole from the detectors with the reason
(``auditor.observations.excluded_summary``). In JSON they are the top-level ``secondary_causes``,
``provider_failures``, ``preflight_checks`` and ``excluded_responses``; in JUnit one failing ``testcase`` per secondary cause and one ``testcase`` per
pre-flight check (exit codes are unchanged: they follow the primary verdict only).

On PASS and INCONCLUSIVE every renderer shows what the audit rules out (:mod:`auditor.rules_out`:
per deviation class, 95% power against its calibrated effect or not): text, a line after the
verdict; JSON, the top-level ``rules_out`` list; Markdown, a "What this audit rules out" table;
JUnit, a ``rules_out`` property and a system-out line.

Units: log-probabilities and KL in nats, tokens in tokens, money in USD, times in seconds;
timestamps are ISO 8601 UTC strings.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from auditor.detectors import DETECTORS
from auditor.detectors.speculation import speculation_line
from auditor.questions import QuestionAnswer, answer_questions
from auditor.report_junit import render_junit
from auditor.report_markdown import render_markdown
from auditor.rules_out import RULE_OUT_POWER, rules_out_sentence
from auditor.util import fmt_p as _fmt_p
from auditor.verdict import EXIT_CODES

__all__ = [
    "FORMATS",
    "JSON_FIELDS",
    "REPORT_SCHEMA",
    "AuditReport",
    "ReportError",
    "concurrency_line",
    "excluded_line",
    "exit_code_for",
    "load_report",
    "render",
    "render_json",
    "render_junit",
    "render_markdown",
    "render_text",
    "usage_note",
]

#: Identifier of the JSON layout (bump on incompatible changes).
REPORT_SCHEMA = "spec-auditor.report/1"
#: Output formats understood by :func:`render`.
FORMATS = ("text", "json", "markdown", "junit")

#: Verdict → CLI exit code (issue 5), from :data:`auditor.verdict.EXIT_CODES` (its one home).
_EXIT: Mapping[str, int] = {str(k): v for k, v in EXIT_CODES.items()}

#: What a rejecting detector implies (shown in reports next to the finding): the registry's ``finding``.
IMPLICATIONS: Mapping[str, str] = {name: spec.finding for name, spec in DETECTORS.items()}


class ReportError(LookupError):
    """A stored run cannot be rendered (unknown or ambiguous RUN_ID, not an audit); the message names the fix."""


def exit_code_for(verdict: str | None) -> int:
    """CLI exit code of a verdict: 0 PASS, 1 deviation, 2 INCONCLUSIVE (unknown/None → 2)."""
    return _EXIT.get(str(verdict), 2)


@dataclass
class AuditReport:
    """One audit's outcome, as printed, stored and re-rendered.

    Attributes:
        run_id: the ``audit_runs.id`` (RUN_ID).
        provider: provider name (``providers.toml`` key).
        model: model id sent to the provider.
        verdict: PASS | QUANTIZATION | RELAXED_VERIFICATION | SUBSTITUTION | QUANTIZATION_OR_SUBSTITUTION
            | DECODING_NONCOMPLIANT | INCONCLUSIVE.
        verdict_reason: one sentence naming the deciding detector(s) and numbers.
        alpha: family-wise significance level (Holm across the detectors that ran).
        detectors: one dict per detector: ``name``, ``ran``, ``statistic``, ``p_value``,
            ``p_adjusted`` (Holm), ``effect``, ``effect_ci`` ([low, high]), ``n`` (positions),
            ``reason`` (why it did not run, or a note), ``rejects`` (bool), ``evidence`` (the
            strongest positions), ``details`` (detector-specific numbers).
        tokens: ``prompt``, ``completion``, ``total`` (as billed, tokens), ``budget`` (the cap on
            planned completion tokens, None = whole suite), ``scored_positions`` (positions
            compared with the reference), ``aligned_positions``, ``unaligned_positions``.
        cost_usd: spend at the provider's list price (USD).
        suite, suite_version, suite_digest: the probe suite and its pinned version/content hash.
        reference: ``model``, ``revision`` (sha256 prefix of the weights), ``dtype`` and
            ``variants`` (the honest reference variants the provider was compared with).
        started_at, finished_at: ISO 8601 UTC.
        status: run status (completed | failed | interrupted | running).
        api, base_url: how the provider was reached.
        summary: speed and headline figures: ``ttft_median_s``, ``tpot_median_s``,
            ``tokens_per_s``, ``tokens_per_chunk`` (histogram), ``mean_kl`` (nats),
            ``clear_mismatch_rate``, ``noise_floor`` (nats), ``latency_median_s``.
        verdict_details: ``rule`` (which decision rule fired), ``findings``, ``power``,
            ``suggested_budget_tokens``, ``not_run`` ... (see ``auditor.verdict``).
        probes: ``total``, ``ok``, ``failed``, ``attempts``, ``retries``.
        prompts: probe key → prompt text, for the probes the evidence cites.
        noise_floor: summary of the honest noise floor used (band, rates, mean KL per reference).
        code_version: spec-auditor version (+ git sha) that produced the run.
        wall_s: wall-clock seconds of the ``check`` session (None when re-read from the store).
    """

    run_id: str
    provider: str
    model: str | None
    verdict: str
    verdict_reason: str
    alpha: float
    detectors: list[dict] = field(default_factory=list)
    tokens: dict = field(default_factory=dict)
    cost_usd: float = 0.0
    suite: str | None = None
    suite_version: str | None = None
    suite_digest: str | None = None
    reference: dict = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    status: str = "completed"
    api: str | None = None
    base_url: str | None = None
    summary: dict = field(default_factory=dict)
    verdict_details: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)
    prompts: dict = field(default_factory=dict)
    noise_floor: dict = field(default_factory=dict)
    code_version: str | None = None
    wall_s: float | None = None

    @property
    def exit_code(self) -> int:
        """0 PASS, 1 deviation, 2 INCONCLUSIVE."""
        return exit_code_for(self.verdict)

    def detector(self, name: str) -> dict | None:
        """The detector dict called ``name``, or None."""
        return next((d for d in self.detectors if d.get("name") == name), None)

    def p_values(self) -> dict[str, float | None]:
        """``{detector: Holm-adjusted p}`` for the detectors that ran."""
        return {d["name"]: d.get("p_adjusted") for d in self.detectors if d.get("ran")}

    @property
    def secondary_causes(self) -> list[dict]:
        """Every other established cause (``verdict``, ``rule``, ``reason``, ``evidence``), see auditor.verdict."""
        return list((self.verdict_details or {}).get("secondary_causes") or [])

    @property
    def provider_failures(self) -> dict | None:
        """``failed``, ``total``, ``share``, ``kinds`` of the run's probes (None when not recorded)."""
        return (self.verdict_details or {}).get("provider_failures")

    @property
    def preflight_checks(self) -> list[dict]:
        """The parameter-compliance pre-flight checks (``auditor.preflight``), [] when none ran."""
        return list(((self.summary or {}).get("preflight") or {}).get("checks") or [])

    @property
    def rules_out(self) -> list[dict]:
        """Per deviation class, whether the audit had 95% power against it (``auditor.rules_out``);
        [] when not recorded (a rejection, or an audit stored before it was)."""
        return list((self.verdict_details or {}).get("rules_out") or [])

    @property
    def excluded_responses(self) -> dict | None:
        """Responses kept away from every detector (``responses``, ``tokens``, ``reasons``, ...), None if none."""
        return (self.summary or {}).get("excluded_responses") or None

    @property
    def questions(self) -> list[QuestionAnswer]:
        """The buyer's two questions answered from the verdict (:func:`auditor.questions.answer_questions`)."""
        return answer_questions(self.verdict, self.verdict_details)

    def to_dict(self) -> dict:
        """The JSON report (strict JSON: NaN/inf become null); ``questions`` comes first."""
        d = {"questions": [q.to_dict() for q in self.questions], **asdict(self)}
        d["schema"] = REPORT_SCHEMA
        d["exit_code"] = self.exit_code
        d["secondary_causes"] = self.secondary_causes
        d["provider_failures"] = self.provider_failures
        d["preflight_checks"] = self.preflight_checks
        d["rules_out"] = self.rules_out
        d["excluded_responses"] = self.excluded_responses
        d["logprob_defects"] = (self.summary or {}).get("logprob_defects")  # auditor.summary.logprob_defects
        d["deadline"] = (self.summary or {}).get("deadline")  # auditor.runner: the audit deadline and whether it cut
        d["speculation"] = (self.summary or {}).get("speculation")  # auditor.detectors.speculation; evidence only
        return _json_safe(d)

    @classmethod
    def from_dict(cls, d: dict) -> AuditReport:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


#: Top-level keys every JSON report carries.
JSON_FIELDS = ("questions",) + tuple(AuditReport.__dataclass_fields__) + (
    "schema", "exit_code", "secondary_causes", "provider_failures", "preflight_checks", "rules_out",
    "excluded_responses", "logprob_defects", "deadline", "speculation")


# ------------------------------------------------------------------------------------------ utils
def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (dt.datetime, dt.date)):
        return x.isoformat()
    if isinstance(x, bytes):
        return x.decode("utf-8", errors="replace")
    try:  # numpy scalars
        import numpy as np

        if isinstance(x, np.generic):
            return _json_safe(x.item())
        if isinstance(x, np.ndarray):
            return _json_safe(x.tolist())
    except ImportError:  # pragma: no cover
        pass
    return str(x)


def _fmt_num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(x):
        return "—"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{max(1, digits - 2)}e}"
    return f"{x:.{digits}g}"


def _fmt_effect(d: dict) -> str:
    eff = _fmt_num(d.get("effect"))
    ci = d.get("effect_ci") or [None, None]
    if ci and ci[0] is not None and ci[1] is not None:
        return f"{eff} [{_fmt_num(ci[0], 3)}, {_fmt_num(ci[1], 3)}]"
    return eff


def _outcome(d: dict, alpha: float) -> str:
    if not d.get("ran"):
        return "not run"
    return "REJECTS" if d.get("rejects") else "ok"


def _usd(x: Any) -> str:
    x = float(x or 0.0)
    return f"${x:.4f}" if x >= 0.01 else f"${x:.6f}"


def _tok(s: Any, limit: int = 40) -> str:
    """A token/text shown visibly: JSON-escaped (\\n, \\t, quotes), truncated."""
    if s is None:
        return "?"
    t = json.dumps(str(s), ensure_ascii=False)[1:-1]
    return t if len(t) <= limit else t[: limit - 1] + "…"


def _evidence_str(c: dict) -> str:
    return ", ".join(f"{e.get('detector')} p_adj={_fmt_p(e.get('p_adjusted'))}" for e in c.get("evidence") or [])


def _failure_line(f: dict | None) -> str | None:
    if not f or not f.get("failed"):
        return None
    kinds = ", ".join(f"{k} {v}" for k, v in (f.get("kinds") or {}).items()) or "unknown"
    return f"{f.get('failed')} of {f.get('total')} probes failed ({float(f.get('share') or 0):.0%}): {kinds}"


def usage_note(summary: dict | None) -> str | None:
    """``"estimated: 12 responses came without usage, counted with the reference tokenizer"`` when
    the run's token figures were estimated (summary key ``usage_estimated``, written by
    ``auditor.usage_estimate.UsageEstimates``), else None."""
    s = summary or {}
    if not s.get("usage_estimated"):
        return None
    how = {"tokenizer": "the reference tokenizer", "chars/4": "4 characters per token"}.get(
        str(s.get("usage_prompt_tokens_method")), "an estimate")
    n = s.get("usage_missing_responses")
    return f"estimated: {n if n is not None else 'some'} responses came without usage, counted with {how}"


def concurrency_line(summary: dict | None) -> str | None:
    """One line when the client narrowed its concurrency during the run (summary key
    ``concurrency``, ``probes.concurrency.AdaptiveConcurrency.stats``), e.g. ``"concurrency reduced
    8→1 after 4 truncated_stream failures"``; None when the width never changed."""
    c = (summary or {}).get("concurrency")
    if not isinstance(c, dict) or not c.get("changes"):
        return None
    return str(c.get("summary") or f"concurrency changed {c.get('configured')}→{c.get('current')} during the run")


def excluded_line(excluded: dict | None) -> str | None:
    """``"2 responses (57 tokens) excluded from every detector: bytes_text_mismatch 2 (the tokens'
    bytes do not reproduce ...)"`` from a summary's ``excluded_responses``; None when none was excluded."""
    if not isinstance(excluded, dict) or not excluded.get("responses"):
        return None
    expl = excluded.get("explanations") or {}
    why = "; ".join(f"{k} {n}" + (f" ({expl[k]})" if expl.get(k) else "") for k, n in (excluded.get("reasons") or {}).items())
    keys = ", ".join(str(k) for k in excluded.get("probe_keys") or [])
    n = excluded["responses"]
    return (f"{n} response{'s' if n != 1 else ''} ({excluded.get('tokens', 0)} tokens) excluded from every detector: "
            f"{why or 'untrusted'}" + (f" [{keys}]" if keys else ""))


def deadline_line(summary: dict | None) -> str | None:
    """``"audit deadline 600 s reached after 600.1 s: 7 of 16 probes finished (7 answered, 0 failed), 9
    not sent or cut off; the verdict uses what was collected"`` from the summary's ``deadline``
    (``auditor.runner.run_probes``, issue 37 item 9); None when the deadline was not reached."""
    d = (summary or {}).get("deadline")
    if not isinstance(d, dict) or not d.get("reached"):
        return None
    done, failed, pending = (int(d.get(k) or 0) for k in ("done", "failed", "pending"))
    el = d.get("elapsed_s")
    return (f"audit deadline {float(d.get('deadline_s') or 0):g} s reached"
            + (f" after {float(el):.1f} s" if el is not None else "")
            + f": {done + failed} of {done + failed + pending} probes finished ({done} answered, {failed} failed), "
            f"{pending} not sent or cut off; the verdict uses what was collected")


def logprob_defects_line(summary: dict | None) -> str | None:
    """``"provider logprobs: 40 tokens with NaN, ±Infinity or null logprobs (nonfinite_logprob, in 8
    responses); ..."`` from the summary's ``logprob_defects`` (:func:`auditor.summary.logprob_defects`),
    None when the store counted none. Such positions never reach a detector as numbers."""
    from auditor.summary import LOGPROB_DEFECT_KINDS

    d = (summary or {}).get("logprob_defects")
    if not isinstance(d, dict) or not d.get("tokens"):
        return None
    resp = d.get("responses") or {}
    parts = []
    for k, n in d["tokens"].items():
        r = resp.get(k)
        parts.append(f"{n} token{'s' if n != 1 else ''} with {LOGPROB_DEFECT_KINDS.get(k, k)} ({k}"
                     + (f", in {r} response{'s' if r != 1 else ''}" if r else "") + ")")
    return "provider logprobs: " + "; ".join(parts)


def cause_flip_line(report: AuditReport) -> str | None:
    """Rule 2's cause feature in one line: the margin-conditioned flip ratio along the provider's own
    continuations and along the reference's (echo, ``auditor.reference_path``), and which decided;
    None when logprob-divergence did not run."""
    lp = report.detector("logprob-divergence")
    d = (lp or {}).get("details") or {}
    if not lp or not lp.get("ran") or "confident_flip_ratio" not in d:
        return None

    def part(ratio: Any, obs: Any, exp_: Any, n: Any) -> str:
        return (f"{ratio:.3g} ({obs} flips vs {float(exp_ or 0):.2g} expected at {n} confident positions)"
                if ratio is not None else "not computed")

    out = ("flip ratio (rule 2, threshold 4): provider's continuations "
           + part(d.get("confident_flip_ratio"), d.get("confident_flips"), d.get("confident_flips_expected"),
                  d.get("n_confident")))
    if d.get("reference_path_available"):
        out += ("; reference's continuations via echo "
                + part(d.get("reference_path_flip_ratio"), d.get("reference_path_flips"),
                       d.get("reference_path_flips_expected"), d.get("reference_path_n_confident"))
                + f" of {d.get('reference_path_n_positions')} positions")
    elif "reference_path_available" in d:
        out += f"; reference's continuations via echo: not available ({d.get('reference_path_reason')})"
    path = ((report.verdict_details or {}).get("cause_confidence") or {}).get("path")
    return out + (f"; decided by the {path} path" if path in ("provider", "reference", "sampled") else "")


def _check_mark(c: dict) -> str:
    return {True: "pass", False: "FAIL", None: "not run"}[c.get("passed")]


# ------------------------------------------------------------------------------------------ text
def render_text(report: AuditReport, console: Any | None = None) -> None:
    """Print the report with rich: verdict, detector table, cost. ``console`` defaults to stdout."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    colour = {0: "green", 1: "red", 2: "yellow"}[report.exit_code]
    console.print(
        f"[bold]{report.provider}[/bold] ({report.model}) — run [bold]{report.run_id}[/bold], "
        f"suite {report.suite} v{report.suite_version}, reference {report.reference.get('model')} "
        f"@{report.reference.get('revision')}",
        highlight=False,
    )
    for q in report.questions:
        qc = {"yes": "green", "no": "red", "not established": "magenta"}.get(q.answer, "yellow")
        console.print(f"{q.question} [bold {qc}]{q.answer}[/bold {qc}] — {escape(q.evidence)}", highlight=False)
    t = Table(title=f"detectors (Holm, family-wise α = {report.alpha:g})", title_justify="left")
    cols: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("detector", "left"), ("statistic", "right"), ("p", "right"), ("p (Holm)", "right"),
        ("effect [95% CI]", "right"), ("n", "right"), ("outcome", "left"))
    for col, just in cols:
        t.add_column(col, justify=just)
    for d in report.detectors:
        out = _outcome(d, report.alpha)
        style = "red" if out == "REJECTS" else ("dim" if out == "not run" else "")
        if not d.get("ran"):
            t.add_row(d["name"], "", "", "", "", str(d.get("n") or 0), f"not run: {d.get('reason') or ''}", style=style)
            continue
        t.add_row(
            d["name"],
            _fmt_num(d.get("statistic")),
            _fmt_p(d.get("p_value")),
            _fmt_p(d.get("p_adjusted")),
            _fmt_effect(d),
            str(d.get("n")),
            out,
            style=style,
        )
    console.print(t)
    console.print(f"[bold {colour}]verdict: {report.verdict}[/bold {colour}] — {report.verdict_reason}", highlight=False)
    for c in report.secondary_causes:
        console.print(f"  also [bold red]{c.get('verdict')}[/bold red] ({c.get('rule')}): {c.get('reason')} "
                      f"[{_evidence_str(c)}]", highlight=False)
    if fl_cause := cause_flip_line(report):
        console.print(f"  {escape(fl_cause)}", highlight=False)
    if report.rules_out:
        console.print(f"at {RULE_OUT_POWER:.0%} power against the calibrated effect sizes: "
                      f"{escape(rules_out_sentence(report.rules_out))}", highlight=False)
    fl = _failure_line(report.provider_failures)
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
        f"{_usd(report.cost_usd)}" + (f" ({est})" if est else "")
        + f"; {tk.get('scored_positions', 0)} positions scored against the reference"
        + (f"; {', '.join(speed)}" if speed else "")
        + (f"; wall {report.wall_s:.1f} s" if report.wall_s is not None else ""),
        highlight=False,
    )


# ------------------------------------------------------------------------------------------ json
def render_json(report: AuditReport, indent: int | None = 2) -> str:
    """The JSON report as a string (strict JSON)."""
    return json.dumps(report.to_dict(), indent=indent, sort_keys=False, ensure_ascii=False)


# ------------------------------------------------------------------------------------------ markdown
def _evidence_rows(d: dict, limit: int) -> list[dict]:
    return [e for e in (d.get("evidence") or []) if isinstance(e, dict)][:limit]


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
    from auditor.store import queries as q

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
