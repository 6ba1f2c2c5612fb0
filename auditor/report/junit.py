"""JUnit XML rendering of an :class:`~auditor.report.common.AuditReport` (:func:`auditor.report.render.render` dispatches here).

The buyer's two questions
(:mod:`auditor.verdict.questions`) are ``question.<key>`` (the answer) and ``question.<key>.evidence``
properties, and the suite's ``system-out`` (after the test cases, as the JUnit schema orders it);
estimated token figures and a concurrency the client narrowed are ``usage_estimated`` /
``concurrency`` properties and system-out lines too, and so is what a PASS / INCONCLUSIVE rules out
(``rules_out``, :mod:`auditor.verdict.rules_out`).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from auditor.report.common import (
    AuditReport,
    concurrency_line,
    deadline_line,
    evidence_rows,
    excluded_line,
    failure_line,
    finding_implication,
    fmt_effect,
    logprob_defects_line,
    reason_shown,
    usage_note,
)
from auditor.util import fmt_p as _fmt_p
from auditor.verdict.rules_out import RULE_OUT_POWER, rules_out_sentence

__all__ = ["render_junit"]


def render_junit(report: AuditReport) -> str:
    """JUnit XML: a ``testsuite`` per audit, a ``testcase`` per detector and one for the verdict."""
    r = report
    ran = [d for d in r.detectors if d.get("ran")]
    checks = r.preflight_checks
    causes = r.secondary_causes
    failures = (sum(1 for d in ran if d.get("rejects")) + (1 if r.exit_code == 1 else 0) + len(causes)
                + sum(1 for c in checks if c.get("passed") is False))
    skipped = sum(1 for d in r.detectors if not d.get("ran")) + sum(1 for c in checks if c.get("passed") is None)
    errors = 1 if r.exit_code == 2 else 0
    suites = ET.Element("testsuites", name="spec-auditor")
    ts = ET.SubElement(
        suites,
        "testsuite",
        name=f"spec-auditor.{r.provider}",
        tests=str(len(r.detectors) + 1 + len(causes) + len(checks)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{(r.wall_s or 0.0):.3f}",
        timestamp=str(r.started_at or ""),
    )
    props = ET.SubElement(ts, "properties")
    for k, v in (
        ("run_id", r.run_id),
        ("provider", r.provider),
        ("model", r.model),
        ("verdict", r.verdict),
        ("alpha", r.alpha),
        ("suite", f"{r.suite} v{r.suite_version}"),
        ("reference", f"{(r.reference or {}).get('model')}@{(r.reference or {}).get('revision')}"),
        ("card", (r.reference or {}).get("card")),
        ("tokens", (r.tokens or {}).get("total")),
        ("cost_usd", r.cost_usd),
    ):
        ET.SubElement(props, "property", name=k, value="" if v is None else str(v))
    questions = r.questions
    for q in questions:
        ET.SubElement(props, "property", name=f"question.{q.key}", value=q.answer)
        ET.SubElement(props, "property", name=f"question.{q.key}.plain", value=q.plain)
        ET.SubElement(props, "property", name=f"question.{q.key}.evidence", value=q.evidence)
    ET.SubElement(props, "property", name="headline", value=r.headline)
    cls = f"spec-auditor.{r.provider}"
    for d in r.detectors:
        tc = ET.SubElement(ts, "testcase", classname=cls, name=d["name"], time="0")
        if not d.get("ran"):
            ET.SubElement(tc, "skipped", message=str(d.get("reason") or "not run"))
        elif d.get("rejects"):
            f = ET.SubElement(
                tc,
                "failure",
                type="rejects",
                message=f"p_adjusted={_fmt_p(d.get('p_adjusted'))} <= alpha={r.alpha:g}: {finding_implication(r, d['name'])}",
            )
            f.text = json.dumps(
                {"statistic": d.get("statistic"), "effect": d.get("effect"), "effect_ci": d.get("effect_ci"),
                 "n": d.get("n"), "evidence": evidence_rows(d, 3)},
                ensure_ascii=False,
                default=str,
            )
        else:
            so = ET.SubElement(tc, "system-out")
            so.text = f"p={_fmt_p(d.get('p_value'))} p_adjusted={_fmt_p(d.get('p_adjusted'))} effect={fmt_effect(d)} n={d.get('n')}"
    tc = ET.SubElement(ts, "testcase", classname=cls, name="verdict", time=f"{(r.wall_s or 0.0):.3f}")
    if r.exit_code == 1:
        ET.SubElement(tc, "failure", type=r.verdict, message=reason_shown(r))
    elif r.exit_code == 2:
        ET.SubElement(tc, "error", type=r.verdict, message=reason_shown(r))
    else:
        so = ET.SubElement(tc, "system-out")
        so.text = reason_shown(r)
    for c in causes:
        tc = ET.SubElement(ts, "testcase", classname=cls, name=f"cause:{c.get('verdict')}:{c.get('rule')}", time="0")
        f = ET.SubElement(tc, "failure", type=str(c.get("verdict")), message=str(c.get("reason")))
        f.text = json.dumps(c.get("evidence") or [], ensure_ascii=False, default=str)
    for c in checks:
        tc = ET.SubElement(ts, "testcase", classname=f"{cls}.preflight", name=str(c.get("name")), time="0")
        if c.get("passed") is None:
            ET.SubElement(tc, "skipped", message=str(c.get("summary") or "not run"))
        elif c.get("passed") is False:
            f = ET.SubElement(tc, "failure", type=f"preflight-{c.get('kind')}", message=str(c.get("summary")))
            f.text = json.dumps({k: c.get(k) for k in ("p_value", "statistic", "n", "evidence")}, ensure_ascii=False,
                                default=str)
        else:
            ET.SubElement(tc, "system-out").text = str(c.get("summary"))
    fl = failure_line(r.provider_failures)
    if fl:
        ET.SubElement(props, "property", name="provider_failures", value=fl)
    if (xl := excluded_line(r.excluded_responses)) is not None:
        ET.SubElement(props, "property", name="excluded_responses", value=xl)
    if (ld := logprob_defects_line(r.summary)) is not None:
        ET.SubElement(props, "property", name="logprob_defects", value=ld)
    if (dl := deadline_line(r.summary)) is not None:
        ET.SubElement(props, "property", name="deadline", value=dl)
    # issue 13: estimated token figures and a narrowed concurrency are never silent, in any format
    notes = [n for n in (usage_note(r.summary), concurrency_line(r.summary)) if n]
    if (un := usage_note(r.summary)) is not None:
        ET.SubElement(props, "property", name="usage_estimated", value=un)
    if (cl := concurrency_line(r.summary)) is not None:
        ET.SubElement(props, "property", name="concurrency", value=cl)
    if r.rules_out:
        ro = f"at {RULE_OUT_POWER:.0%} power against the calibrated effect sizes: {rules_out_sentence(r.rules_out)}"
        ET.SubElement(props, "property", name="rules_out", value=ro)
        notes.insert(0, ro)
    if (est := r.precision_estimate) is not None:
        ET.SubElement(props, "property", name="precision_estimate", value=f"measured precision: {est['sentence']}")
        notes.insert(0, f"measured precision: {est['sentence']}")
        if est.get("claim"):
            ET.SubElement(props, "property", name="claimed_precision",
                          value=f"{est['claim'].get('claimed')}: {est['claim'].get('outcome')}")
    # plain words first (issue 38, item 6), then the figures
    ET.SubElement(ts, "system-out").text = "\n".join([q.plain_line() for q in questions] + [r.headline]
                                                      + [q.line() for q in questions] + notes)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
