"""What every audit-report renderer shares: the :class:`AuditReport` record and its formatting helpers.

:class:`AuditReport` is what ``auditor check`` prints and ``auditor.check.pipeline.run_check`` returns; the
renderers (``auditor.report.render``: text, JSON and the dispatcher; ``auditor.report.markdown``;
``auditor.report.junit``) all import it and the helpers from here, never from one another, so no
renderer imports its caller. Pure: no store, no rich, no I/O.

Units: log-probabilities and KL in nats, tokens in tokens, money in USD, times in seconds;
timestamps are ISO 8601 UTC strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from auditor.detectors import DETECTORS, DetectorName
from auditor.util import fmt_p as _fmt_p
from auditor.util import json_safe
from auditor.verdict.kinds import EXIT_CODES
from auditor.verdict.precision_estimate import estimate_precision
from auditor.verdict.questions import QuestionAnswer, answer_questions, plain_headline
from auditor.verdict.rules_out import RULE_OUT_POWER, rules_out_sentence

__all__ = [
    "IMPLICATIONS",
    "JSON_FIELDS",
    "REPORT_SCHEMA",
    "AuditReport",
    "cause_flip_line",
    "check_mark",
    "concurrency_line",
    "detector_outcome",
    "evidence_rows",
    "evidence_str",
    "excluded_line",
    "exit_code_for",
    "failure_line",
    "finding_implication",
    "fmt_effect",
    "fmt_num",
    "reason_shown",
    "tok",
    "usage_note",
    "usd",
]

#: Identifier of the JSON layout (bump on incompatible changes).
REPORT_SCHEMA = "spec-auditor.report/1"

#: Verdict → CLI exit code (issue 5), from :data:`auditor.verdict.kinds.EXIT_CODES` (its one home).
_EXIT: Mapping[str, int] = {str(k): v for k, v in EXIT_CODES.items()}

#: What a rejecting detector implies (shown in reports next to the finding): the registry's ``finding``.
IMPLICATIONS: Mapping[str, str] = {name: spec.finding for name, spec in DETECTORS.items()}


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
        reference: ``model``, ``revision`` (sha256 prefix of the weights), ``dtype``, ``variants`` (the
            honest reference variants the provider was compared with), ``card`` (the model card used,
            ``probes.model_card``), ``card_precision`` (its precision label), ``card_recipe`` and ``card_bits`` (its recipe
            and bits per component, what the precision estimate's classes are relative to) and ``claimed_precision``
            (the provider's claimed label, checked by :attr:`precision_estimate`).
        started_at, finished_at: ISO 8601 UTC.
        status: run status (completed | failed | interrupted | running).
        api, base_url: how the provider was reached.
        summary: speed and headline figures: ``ttft_median_s``, ``tpot_median_s``,
            ``tokens_per_s``, ``tokens_per_chunk`` (histogram), ``mean_kl`` (nats),
            ``clear_mismatch_rate``, ``noise_floor`` (nats), ``latency_median_s``.
        verdict_details: ``rule`` (which decision rule fired), ``findings``, ``power``,
            ``suggested_budget_tokens``, ``not_run`` ... (see ``auditor.verdict.decide``).
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
        """Every other established cause (``verdict``, ``rule``, ``reason``, ``evidence``), see auditor.verdict.decide."""
        return list((self.verdict_details or {}).get("secondary_causes") or [])

    @property
    def provider_failures(self) -> dict | None:
        """``failed``, ``total``, ``share``, ``kinds`` of the run's probes (None when not recorded)."""
        return (self.verdict_details or {}).get("provider_failures")

    @property
    def preflight_checks(self) -> list[dict]:
        """The parameter-compliance pre-flight checks (``auditor.check.preflight``), [] when none ran."""
        return list(((self.summary or {}).get("preflight") or {}).get("checks") or [])

    @property
    def rules_out(self) -> list[dict]:
        """Per deviation class, whether the audit had 95% power against it (``auditor.verdict.rules_out``);
        [] when not recorded (a rejection, or an audit stored before it was)."""
        return list((self.verdict_details or {}).get("rules_out") or [])

    @property
    def precision_estimate(self) -> dict | None:
        """Which precision classes the effect is consistent with / rules out, and the claim check
        (:func:`auditor.verdict.precision_estimate.estimate_precision`); None when it does not apply."""
        ref = self.reference or {}
        est = estimate_precision(self.verdict, self.detectors, alpha=self.alpha, claimed=ref.get("claimed_precision"),
                                 card_precision=ref.get("card_precision"), card=ref.get("card"),
                                 rules_out=self.rules_out, card_bits=ref.get("card_bits"),
                                 card_recipe=ref.get("card_recipe"), model=ref.get("model"))
        return est.to_dict() if est is not None else None

    @property
    def findings(self) -> list[dict]:
        """The rejecting detectors with their implications (``verdict_details["findings"]``); one that the
        established cause explains carries ``explained_by`` (the verdict kind) and is no separate cause."""
        return [f for f in (self.verdict_details or {}).get("findings") or [] if isinstance(f, dict)]

    @property
    def explained(self) -> dict[str, str]:
        """Detector → the verdict kind that explains its rejection (findings with ``explained_by``)."""
        return {str(f.get("detector")): str(f["explained_by"]) for f in self.findings if f.get("explained_by")}

    @property
    def excluded_responses(self) -> dict | None:
        """Responses kept away from every detector (``responses``, ``tokens``, ``reasons``, ...), None if none."""
        return (self.summary or {}).get("excluded_responses") or None

    @property
    def questions(self) -> list[QuestionAnswer]:
        """The buyer's two questions answered from the verdict (:func:`auditor.verdict.questions.answer_questions`)."""
        return answer_questions(self.verdict, self.verdict_details)

    @property
    def headline(self) -> str:
        """The verdict in one plain sentence with its deciding figure (:func:`auditor.verdict.questions.plain_headline`)."""
        head = plain_headline(self.verdict, self.detectors, self.verdict_reason,
                              (self.tokens or {}).get("scored_positions"))
        claim = (self.precision_estimate or {}).get("claim") or {}
        if claim.get("outcome") == "does not match":
            est = self.precision_estimate or {}
            head = (f"The provider's claimed precision ({claim.get('claimed')}) does not match what it serves "
                    f"(measured: {est.get('best')}). " + head)
        return head

    def to_dict(self) -> dict:
        """The JSON report (strict JSON: NaN/inf become null); ``questions`` comes first."""
        d = {"questions": [q.to_dict() for q in self.questions], "headline": self.headline, **asdict(self)}
        d["schema"] = REPORT_SCHEMA
        d["exit_code"] = self.exit_code
        d["secondary_causes"] = self.secondary_causes
        d["provider_failures"] = self.provider_failures
        d["preflight_checks"] = self.preflight_checks
        d["rules_out"] = self.rules_out
        d["precision_estimate"] = self.precision_estimate
        d["excluded_responses"] = self.excluded_responses
        d["logprob_defects"] = (self.summary or {}).get("logprob_defects")  # auditor.check.summary.logprob_defects
        d["deadline"] = (self.summary or {}).get("deadline")  # auditor.check.runner: the audit deadline and whether it cut
        d["speculation"] = (self.summary or {}).get("speculation")  # auditor.detectors.speculation; evidence only
        return cast(dict[str, Any], json_safe(d, bytes_encoding="utf-8"))

    @classmethod
    def from_dict(cls, d: dict) -> AuditReport:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


#: Top-level keys every JSON report carries.
JSON_FIELDS = ("questions", "headline") + tuple(AuditReport.__dataclass_fields__) + (
    "schema", "exit_code", "secondary_causes", "provider_failures", "preflight_checks", "rules_out",
    "precision_estimate", "excluded_responses", "logprob_defects", "deadline", "speculation")


# ------------------------------------------------------------------------------------------ helpers
def fmt_num(x: Any, digits: int = 4) -> str:
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


def fmt_effect(d: dict) -> str:
    eff = fmt_num(d.get("effect"))
    ci = d.get("effect_ci") or [None, None]
    if ci and ci[0] is not None and ci[1] is not None:
        return f"{eff} [{fmt_num(ci[0], 3)}, {fmt_num(ci[1], 3)}]"
    return eff


def detector_outcome(d: dict, alpha: float, explained: Mapping[str, str] | None = None) -> str:
    """"not run", "ok", "REJECTS" or, for a rejection the established cause explains (``explained``:
    detector → verdict kind, :attr:`AuditReport.explained`), "REJECTS (explained by KIND)"."""
    if not d.get("ran"):
        return "not run"
    if not d.get("rejects"):
        return "ok"
    by = (explained or {}).get(str(d.get("name")))
    return f"REJECTS (explained by {by})" if by else "REJECTS"


def usd(x: Any) -> str:
    x = float(x or 0.0)
    return f"${x:.4f}" if x >= 0.01 else f"${x:.6f}"


def tok(s: Any, limit: int = 40) -> str:
    """A token/text shown visibly: JSON-escaped (\\n, \\t, quotes), truncated."""
    if s is None:
        return "?"
    t = json.dumps(str(s), ensure_ascii=False)[1:-1]
    return t if len(t) <= limit else t[: limit - 1] + "…"


def evidence_str(c: dict) -> str:
    return ", ".join(f"{e.get('detector')} p_adj={_fmt_p(e.get('p_adjusted'))}" for e in c.get("evidence") or [])


def failure_line(f: dict | None) -> str | None:
    if not f or not f.get("failed"):
        return None
    kinds = ", ".join(f"{k} {v}" for k, v in (f.get("kinds") or {}).items()) or "unknown"
    return f"{f.get('failed')} of {f.get('total')} probes failed ({float(f.get('share') or 0):.0%}): {kinds}"


def usage_note(summary: dict | None) -> str | None:
    """``"estimated: 12 responses came without usage, counted with the reference tokenizer"`` when
    the run's token figures were estimated (summary key ``usage_estimated``, written by
    ``auditor.check.usage_estimate.UsageEstimates``), else None."""
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
    (``auditor.check.runner.run_probes``, issue 37 item 9); None when the deadline was not reached."""
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
    responses); ..."`` from the summary's ``logprob_defects`` (:func:`auditor.check.summary.logprob_defects`),
    None when the store counted none. Such positions never reach a detector as numbers."""
    from auditor.check.summary import LOGPROB_DEFECT_KINDS

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
    continuations and along the reference's (echo, ``auditor.check.reference_path``), and which decided;
    None when logprob-divergence did not run."""
    lp = report.detector(DetectorName.LOGPROB_DIVERGENCE)
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


#: What a rejecting greedy-near-tie saw, without a cause: the registry's finding names the verifier, which a
#: verdict may not (issue 38, item 4).
_NEAR_TIE_SEEN = ("at temperature 0 the provider emits the reference's runner-up at near-ties more often than honest "
                  "numeric noise can flip them")


def finding_implication(report: AuditReport, name: str, stored: str | None = None) -> str:
    """What a rejecting detector's finding implies, as every report shows it: the stored implication
    (``verdict_details["findings"][i]["implication"]``) or the registry's (:data:`IMPLICATIONS`); for
    ``greedy-near-tie`` when the audit's verification answer is neither "no" nor "not established", the
    flips without a cause and a plain statement that the finding does not accuse the verifier (the verdict
    attributes them to the served model), so a near-tie finding never reads as an accusation the two
    answers do not make. ``stored`` defaults to the implication of ``name``'s finding in
    :attr:`AuditReport.findings` (which says so when the established cause explains it, issue 37 item 6)."""
    if stored is None:
        f = next((f for f in report.findings if f.get("detector") == name), None)
        stored = str(f.get("implication")) if f is not None and f.get("implication") else None
    base = IMPLICATIONS.get(name, "")
    text = stored or base
    if name != DetectorName.GREEDY_NEAR_TIE or name in report.explained:
        return text  # an explained finding's stored text already says which cause explains it (issue 37 item 6)
    ver = next((q for q in report.questions if q.key == "verification"), None)
    if ver is None or ver.answer in ("no", "not established"):
        return text
    extra = text[len(base):] if base and text.startswith(base) else ""
    causes = [report.verdict] if report.exit_code == 1 else []
    causes += [str(c.get("verdict")) for c in report.secondary_causes if c.get("verdict")]
    why = (f"the audit attributes the flips to {' and '.join(causes)} (the served model's own probabilities move "
           "at near-ties)" if causes else "the audit does not attribute the flips to verification")
    return (f"{_NEAR_TIE_SEEN}{extra}; this finding does not accuse the verifier: {why}, and its answer to "
            f"\"{ver.question}\" is {ver.answer}")


def reason_shown(report: AuditReport) -> str:
    """The verdict's reason as reports quote it: the stored reason without the rules-out sentence a PASS reason
    ends with (``auditor.verdict.decide`` appends it), since every report shows that account once, in its own
    rules-out part (issue 38, item 3: the same paragraph was printed three times)."""
    reason = report.verdict_reason or ""
    if report.rules_out:
        tail = f"; {rules_out_sentence(report.rules_out)} (at {RULE_OUT_POWER:.0%} power against the calibrated effect sizes)"
        if reason.endswith(tail):
            return reason[: -len(tail)]
    return reason


def check_mark(c: dict) -> str:
    return {True: "pass", False: "FAIL", None: "not run"}[c.get("passed")]


def evidence_rows(d: dict, limit: int) -> list[dict]:
    return [e for e in (d.get("evidence") or []) if isinstance(e, dict)][:limit]
