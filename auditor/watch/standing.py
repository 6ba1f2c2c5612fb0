"""A provider's combined standing over its recent audits (issue 13): one verdict for every suite.

``auditor plan`` recommends auditing a provider with several suites (``precision``, then
``verification``); each audit names the causes its own tests establish. The standing puts them
together, so the dashboard's provider row and ``auditor report --provider NAME`` show every cause
found by any recent audit instead of only the newest run's verdict.

Which audits count ("recent"):
    completed audits (``audit_runs.kind = "audit"``, ``status = "completed"``, with a verdict) of
    the provider's model — the model of its newest completed audit unless one is named — started
    within ``window_days`` (default :data:`DEFAULT_WINDOW_DAYS` = 7 days) before the anchor, and of
    those the newest per suite (an older audit of the same suite is superseded). The anchor is the
    newest such audit's start (or ``as_of`` when given), not the wall clock, so a standing does not
    change by itself when no one audits; its date is shown with it. Seven days covers a plan's
    suites run one after another and a weekly schedule, while a cause found before a redeployment a
    month ago no longer counts. Audits outside the window are listed as ignored, with why.

The overall standing (:data:`SEVERITY`, worst first):
    SUBSTITUTION (another model) > QUANTIZATION_OR_SUBSTITUTION (not the declared weights at their
    precision; which of the two undetermined) > QUANTIZATION (the weights or their arithmetic changed) >
    QUANTIZATION_OR_RELAXED_VERIFICATION (one of the two; which undetermined: each undetermined pair sits just
    below the worse of its two causes) > RELAXED_VERIFICATION (lossy speculative decoding) >
    RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT (the sampler deviates; lossy acceptance or a server-side
    truncation, which undetermined) > DECODING_NONCOMPLIANT (the request's decoding
    parameters are not followed) > INCONCLUSIVE > PASS. The standing is the worst of the recent
    audits' verdicts: any accusation wins over PASS and INCONCLUSIVE; INCONCLUSIVE when no audit
    accuses but one did not decide; PASS only when every recent suite passed. Exit codes as for one
    audit (``auditor.report.common.exit_code_for``).

Causes: every primary accusation and every ``secondary_causes`` entry (``auditor.verdict.decide``) of the
recent audits, each with its suite, run id, start time, rule, reason and deciding evidence
(detector, Holm-adjusted p). A cause that an INCONCLUSIVE audit found in the probes that succeeded
(rule ``0-provider-failures``) is listed with ``audit_verdict = "INCONCLUSIVE"`` but does not raise
the standing, as that audit itself did not accuse.

The buyer's two questions (issue 14, :mod:`auditor.verdict.questions`): "Is the model served at its original
precision?" and "Is speculative verification strict (lossless)?", answered per recent audit and
merged by :func:`auditor.verdict.questions.combine_answers` (newest first): a "no" from any recent audit
wins (as any accusation wins the standing), then a "not established", else the newest "yes", else
"not tested". Each answer
names the audit it came from (``run_id``, ``suite``); every renderer opens with them.

Never tested: detectors that no recent audit ran (with the newest stored reason, e.g. no sampling
probes in a ``precision`` audit) and causes that every recent audit names in ``not_tested`` (a
``reference = "none"`` audit).

This module is pure (standard library, the leaf :mod:`auditor.util` and the stdlib-only
:mod:`auditor.verdict.questions`); :mod:`auditor.store.standing_queries` reads the store
(:class:`~auditor.store.standing_queries.AuditRecord`) and :func:`provider_standing` calls :func:`combine_standing` on it; :func:`load_standing` opens a database for the CLI. Renderers:
:func:`render_standing` (text, markdown, json, junit). Times are ISO 8601 UTC strings in outputs.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

from auditor.util import fmt_p as _fmt_p
from auditor.util import json_safe
from auditor.util import md_cell as _md
from auditor.verdict.questions import answer_questions, combine_answers

if TYPE_CHECKING:  # pragma: no cover
    from sqlalchemy.orm import Session

    from auditor.store.models import AuditRun
    from auditor.store.standing_queries import AuditRecord

__all__ = [
    "ACCUSATIONS",
    "DEFAULT_WINDOW_DAYS",
    "SEVERITY",
    "Cause",
    "Standing",
    "check_window_days",
    "combine_standing",
    "load_standing",
    "provider_standing",
    "render_standing",
    "standing_of_runs",
]

#: Days before the anchor (the newest audit, or ``as_of``) within which an audit is recent.
DEFAULT_WINDOW_DAYS = 7.0
#: Verdicts, worst first: the standing is the first of these that a recent audit reached.
SEVERITY = ("SUBSTITUTION", "QUANTIZATION_OR_SUBSTITUTION", "QUANTIZATION", "QUANTIZATION_OR_RELAXED_VERIFICATION",
            "RELAXED_VERIFICATION", "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT", "DECODING_NONCOMPLIANT",
            "INCONCLUSIVE", "PASS")
#: The verdicts that accuse the provider (exit code 1).
ACCUSATIONS = SEVERITY[:-2]  # every verdict but INCONCLUSIVE and PASS
_EXIT = {v: (1 if v in ACCUSATIONS else 2 if v == "INCONCLUSIVE" else 0) for v in SEVERITY}


@dataclass
class Cause:
    """One cause found by one recent audit.

    ``evidence``: ``[{"detector", "p_adjusted", "p_value", "effect", "n", "implication"}]`` (the
    deciding detectors; p-values Holm-adjusted at the audit's alpha). ``primary``: the audit's own
    verdict (else one of its ``secondary_causes``). ``audit_verdict``: that audit's verdict.
    """

    verdict: str
    suite: str | None
    run_id: str
    started_at: str
    rule: str | None
    reason: str
    primary: bool
    audit_verdict: str
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def evidence_line(self) -> str:
        """``"logprob-divergence p_adj=3.0e-09, self-greedy p_adj=1.2e-05"`` ("" when none)."""
        return ", ".join(f"{e.get('detector')} p_adj={_fmt_p(e.get('p_adjusted'))}" for e in self.evidence)


@dataclass
class Standing:
    """A provider's combined standing (see the module docstring for every rule).

    Attributes:
        provider, model: whose standing. standing: the overall verdict (:data:`SEVERITY`), None
            when no completed audit is in the window. reason: one sentence.
        as_of: the anchor (ISO UTC); window_days: the window (days).
        audits: the recent audits, newest first: ``{"suite", "run_id", "started_at", "verdict",
            "reason", "rule", "alpha"}``. causes: every cause, worst first (:class:`Cause`).
        not_tested: ``[{"what", "why"}]`` (detectors no recent audit ran, causes never tested).
        ignored: older audits left out: ``{"suite", "run_id", "started_at", "verdict", "why"}``.
        questions: the buyer's two questions: ``{"key", "question", "answer", "evidence", "run_id",
            "suite"}`` (``run_id``/``suite`` of the audit the answer came from, None when none).
    """

    provider: str
    model: str | None
    standing: str | None
    reason: str
    as_of: str | None
    window_days: float
    audits: list[dict[str, Any]] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    not_tested: list[dict[str, str]] = field(default_factory=list)
    ignored: list[dict[str, Any]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def suites(self) -> list[str]:
        """The suites the recent audits covered (newest audit first)."""
        return [str(a["suite"]) for a in self.audits]

    @property
    def exit_code(self) -> int:
        """0 PASS, 1 an accusation, 2 INCONCLUSIVE or no audit."""
        return _EXIT.get(str(self.standing), 2)

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON data (``schema``, every attribute, ``suites``, ``exit_code``)."""
        d = {"schema": "spec-auditor.standing/1", **asdict(self), "suites": self.suites, "exit_code": self.exit_code}
        return cast(dict[str, Any], json_safe(d))


def _iso(t: dt.datetime | None) -> str | None:
    if t is None:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).astimezone(dt.UTC).isoformat()


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _primary_reason(rec: AuditRecord) -> str:
    return (rec.reason or "").split("; also ")[0]


def _primary_evidence(rec: AuditRecord) -> list[dict[str, Any]]:
    """The rejecting detectors (``findings``) that no secondary cause claims, with their numbers."""
    d = rec.details or {}
    claimed = {e.get("detector") for c in d.get("secondary_causes") or [] for e in c.get("evidence") or []}
    found = [f for f in d.get("findings") or [] if isinstance(f, Mapping)]
    if not found and rec.alpha is not None:  # older rows without findings: the stored detector results
        found = [{"detector": x.get("name"), "p_adjusted": x.get("p_adjusted")} for x in rec.detectors
                 if x.get("ran") and isinstance(x.get("p_adjusted"), int | float) and x["p_adjusted"] <= rec.alpha]
    mine = [f for f in found if f.get("detector") not in claimed] or found
    dets = d.get("detectors") or {}
    out = []
    for f in mine:
        x = dets.get(f.get("detector")) or {}
        out.append({"detector": f.get("detector"), "p_adjusted": f.get("p_adjusted"), "p_value": x.get("p_value"),
                    "effect": x.get("effect"), "n": x.get("n"), "implication": f.get("implication") or ""})
    return out


def _causes_of(rec: AuditRecord) -> list[Cause]:
    at = _iso(rec.started_at) or ""
    out = []
    if rec.verdict in ACCUSATIONS:
        out.append(Cause(rec.verdict, rec.suite, rec.run_id, at, (rec.details or {}).get("rule") or "—",
                         _primary_reason(rec), True, rec.verdict, _primary_evidence(rec)))
    for c in (rec.details or {}).get("secondary_causes") or []:
        if isinstance(c, Mapping) and c.get("verdict") in ACCUSATIONS:
            out.append(Cause(str(c["verdict"]), rec.suite, rec.run_id, at, c.get("rule") or "—", str(c.get("reason") or ""),
                             False, rec.verdict, [dict(e) for e in c.get("evidence") or [] if isinstance(e, Mapping)]))
    return out


def _not_tested(recent: Sequence[AuditRecord]) -> list[dict[str, str]]:
    ran = {d.get("name") for r in recent for d in r.detectors if d.get("ran")}
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for r in recent:  # newest first: the newest reason wins
        for d in r.detectors:
            name = str(d.get("name"))
            if name not in ran and name not in seen:
                seen.add(name)
                out.append({"what": name, "why": f"not run by any recent audit ({r.suite}: {d.get('reason') or 'no reason recorded'})"})
    causes = [dict((r.details or {}).get("not_tested") or {}) for r in recent]
    if causes and all(causes):
        for cause in [c for c in causes[0] if all(c in x for x in causes)]:
            out.append({"what": cause, "why": f"not tested by any recent audit: {causes[0][cause]}"})
    return out


def _all_ran_line(st: Standing) -> str:
    """The "Not tested" section when every detector ran: it must not read as "all clear" beside answers
    that are "undecided" or "not tested" (issue 38, item 2)."""
    open_qs = [q for q in st.questions if q.get("answer") in ("undecided", "not tested")]
    if not open_qs:
        return "- Every detector ran in some recent audit."
    return ("- Every detector ran in some recent audit, but " + "; ".join(
        f"{_md(str(q['question']))} is still **{q['answer']}**" for q in open_qs)
        + " (see the answers above: more positions are needed).")


def check_window_days(window_days: float) -> float:
    """``window_days`` itself when it is a positive, finite number of days.

    Raises:
        ValueError: otherwise (the message names the fix).
    """
    if isinstance(window_days, bool) or not (
        isinstance(window_days, int | float) and math.isfinite(window_days) and 0 < window_days <= 36500
    ):
        raise ValueError(f"window_days={window_days!r}: must be a positive number of days (at most 36500), e.g. 7")
    return float(window_days)


def combine_standing(
    provider: str,
    records: Sequence[AuditRecord],
    *,
    model: str | None = None,
    window_days: float = DEFAULT_WINDOW_DAYS,
    as_of: dt.datetime | None = None,
) -> Standing:
    """Combine completed audits of ``provider`` into its :class:`Standing` (rules: module docstring).

    Args:
        provider: provider name. records: its completed audits (any order; other models' audits
            are ignored when ``model`` is given, else the newest audit's model is used).
        window_days: the recency window (days, > 0). as_of: anchor (aware UTC; None = the newest audit).

    Raises:
        ValueError: ``window_days`` not a positive number.
    """
    check_window_days(window_days)
    recs = sorted(records, key=lambda r: (_aware(r.started_at), r.run_id), reverse=True)
    if as_of is not None:
        as_of = _aware(as_of)
        recs = [r for r in recs if _aware(r.started_at) <= as_of]
    if model is None and recs:
        model = recs[0].model
    recs = [r for r in recs if r.model == model]
    anchor = as_of or (_aware(recs[0].started_at) if recs else None)
    recent: list[AuditRecord] = []
    ignored: list[dict[str, Any]] = []
    for r in recs:
        assert anchor is not None  # recs is non-empty here
        why = None
        if _aware(r.started_at) < anchor - dt.timedelta(days=window_days):
            why = f"older than the {window_days:g}-day window"
        elif any(x.suite == r.suite for x in recent):
            why = f"superseded by a newer audit of suite {r.suite}"
        if why is None:
            recent.append(r)
        else:
            ignored.append({"suite": r.suite, "run_id": r.run_id, "started_at": _iso(r.started_at),
                            "verdict": r.verdict, "why": why})
    causes = [c for r in recent for c in _causes_of(r)]
    rank = {v: i for i, v in enumerate(SEVERITY)}
    causes.sort(key=lambda c: (rank.get(c.verdict, len(SEVERITY)), not c.primary))
    standing = min((r.verdict for r in recent), key=lambda v: rank.get(v, rank["INCONCLUSIVE"]), default=None)
    if standing is not None and standing not in rank:
        standing = "INCONCLUSIVE"  # an unknown stored verdict never reads as PASS
    audits = [{"suite": r.suite, "run_id": r.run_id, "started_at": _iso(r.started_at), "verdict": r.verdict,
               "reason": r.reason, "rule": (r.details or {}).get("rule") or "—", "alpha": r.alpha} for r in recent]
    return Standing(provider, model, standing, _reason(standing, recent, causes, window_days), _iso(anchor),
                    float(window_days), audits, causes, _not_tested(recent), ignored, _questions(recent))


def _questions(recent: Sequence[AuditRecord]) -> list[dict[str, Any]]:
    """The two answers merged over the recent audits (newest first), each with its source audit."""
    merged = combine_answers([(f"suite {r.suite}, run {r.run_id}", answer_questions(r.verdict, r.details))
                              for r in recent])
    return [{**a.to_dict(), "run_id": recent[i].run_id if i is not None else None,
             "suite": recent[i].suite if i is not None else None} for a, i in merged]


def _reason(standing: str | None, recent: Sequence[AuditRecord], causes: Sequence[Cause], window: float) -> str:
    if standing is None:
        return f"no completed audit within {window:g} days"
    audits = ", ".join(f"{r.suite} {r.verdict}" for r in recent)
    head = f"worst of {len(recent)} recent audit{'s' if len(recent) != 1 else ''} ({audits})"
    if not causes:
        return head + ("; every recent suite passed" if standing == "PASS" else "; no cause established")
    names: dict[str, list[str]] = {}
    for c in causes:
        names.setdefault(c.verdict, [])
        if str(c.suite) not in names[c.verdict]:
            names[c.verdict].append(str(c.suite))
    return head + "; causes found: " + "; ".join(f"{v} ({', '.join(s)})" for v, s in names.items())


def standing_of_runs(
    session: Session,
    provider: str,
    runs: Sequence[AuditRun],
    *,
    model: str | None = None,
    window_days: float = DEFAULT_WINDOW_DAYS,
    as_of: dt.datetime | None = None,
) -> Standing:
    """The standing of ``provider`` over the given runs (e.g. the dashboard's filtered runs): their
    completed audits read by :func:`auditor.store.standing_queries.audit_records`, then
    :func:`combine_standing`.

    Raises:
        ValueError: ``window_days`` not a positive number of days.
    """
    from auditor.store.standing_queries import audit_records

    return combine_standing(provider, audit_records(session, runs), model=model, window_days=window_days, as_of=as_of)


def provider_standing(
    session: Session,
    provider: str,
    *,
    model: str | None = None,
    window_days: float = DEFAULT_WINDOW_DAYS,
    as_of: dt.datetime | None = None,
) -> Standing | None:
    """The standing of ``provider`` (its newest audit's model unless ``model`` is given) from its
    completed audits started within ``window_days`` before the anchor (``as_of``, else its newest
    completed audit); None when it has no completed audit (of ``model``).

    Raises:
        ValueError: ``window_days`` not a positive number of days.
    """
    from auditor.store.standing_queries import recent_audit_runs

    check_window_days(window_days)
    found = recent_audit_runs(session, provider, model=model, window_days=window_days, as_of=as_of)
    if found is None:
        return None
    runs, newest_model = found
    return standing_of_runs(session, provider, runs, model=model or newest_model, window_days=window_days, as_of=as_of)


def load_standing(
    provider: str,
    db_url: str | None = None,
    *,
    model: str | None = None,
    window_days: float = DEFAULT_WINDOW_DAYS,
    as_of: dt.datetime | None = None,
) -> Standing | None:
    """Open the audit database (``--db`` / ``$AUDITOR_DB_URL`` / default) and compute the standing.

    Returns None when the provider has no completed audit in the database.

    Raises:
        ValueError: bad ``window_days``. auditor.store.StoreError: the database cannot be opened.
    """
    from auditor.store import open_store

    store = open_store(db_url)
    try:
        with store.session() as s:
            return provider_standing(s, provider, model=model, window_days=window_days, as_of=as_of)
    finally:
        store.close()


# ------------------------------------------------------------------------------------------ renderers
def _text(st: Standing) -> str:
    lines = [f"{st.provider} ({st.model}) — combined standing over recent audits (window {st.window_days:g} days "
             f"to {st.as_of}): {st.standing or 'no audit'}"]
    # plain words first (issue 38, item 6), then the figures
    lines += [f"  {q['question']} {q['answer']} — {q.get('plain') or q['evidence']}" for q in st.questions]
    lines += [f"  why ({q['key']}): {q['evidence']}" for q in st.questions if q.get("plain")]
    lines.append(f"  {st.reason}")
    for a in st.audits:
        lines.append(f"  suite {a['suite']}: {a['verdict']} — run {a['run_id']} at {a['started_at']} (rule {a['rule']})")
    for c in st.causes:
        tag = "primary" if c.primary else f"also, in a {c.audit_verdict} audit"
        lines.append(f"  cause {c.verdict} ({tag}; suite {c.suite}, run {c.run_id}, {c.started_at}, rule {c.rule}): "
                     f"{c.reason}" + (f" [{c.evidence_line()}]" if c.evidence else ""))
    for n in st.not_tested:
        lines.append(f"  not tested: {n['what']} — {n['why']}")
    for i in st.ignored:
        lines.append(f"  ignored: run {i['run_id']} ({i['suite']}, {i['verdict']}, {i['started_at']}): {i['why']}")
    return "\n".join(lines) + "\n"


def _markdown(st: Standing) -> str:
    out = [f"# Provider standing: {_md(st.provider)} — **{st.standing or 'no audit'}**", "",
           "| Question | Answer | In plain words |", "|---|---|---|"]
    out += [f"| {q['question']} | **{q['answer']}** | {_md(q.get('plain') or q['evidence'])} |" for q in st.questions]
    out += ["", "## Why, in figures", ""] + [f"- **{q['key']}** ({q['answer']}): {_md(q['evidence'])}"
                                              for q in st.questions]
    out += ["", f"> {_md(st.reason)}", "",
           f"Model `{_md(st.model)}`; the newest audit per suite within {st.window_days:g} days up to {st.as_of}.", "",
           "## Recent audits", "", "| suite | verdict | run | started | rule |", "|---|---|---|---|---|"]
    out += [f"| {_md(a['suite'])} | **{a['verdict']}** | `{a['run_id']}` | {a['started_at']} | `{_md(a['rule'])}` |"
            for a in st.audits]
    out += ["", "## Every cause found", ""]
    for c in st.causes:
        tag = "primary" if c.primary else f"also, in a {c.audit_verdict} audit"
        out.append(f"- **{c.verdict}** ({tag}; suite `{_md(c.suite)}`, run `{c.run_id}`, {c.started_at}, rule "
                   f"`{_md(c.rule)}`): {_md(c.reason)}" + (f" — deciding evidence: {_md(c.evidence_line())}" if c.evidence else ""))
    if not st.causes:
        out.append("- No cause established by any recent audit.")
    out += ["", "## Not tested", ""]
    out += [f"- {_md(n['what'])}: {_md(n['why'])}" for n in st.not_tested] or [_all_ran_line(st)]
    if st.ignored:
        out += ["", "## Older audits left out", ""]
        out += [f"- `{i['run_id']}` ({_md(i['suite'])}, {i['verdict']}, {i['started_at']}): {_md(i['why'])}" for i in st.ignored]
    out += ["", "Re-render one audit with `auditor report RUN_ID --format markdown`.", ""]
    return "\n".join(out)


def _junit(st: Standing) -> str:
    """One ``testcase`` per recent suite: an accusing audit is a ``failure`` (every cause it found
    in the message), an INCONCLUSIVE one an ``error``."""
    by_run: dict[str, list[Cause]] = {}
    for c in st.causes:
        by_run.setdefault(c.run_id, []).append(c)
    root = ET.Element("testsuites", name="spec-auditor")
    n_fail = sum(1 for a in st.audits if a["verdict"] in ACCUSATIONS)
    n_err = sum(1 for a in st.audits if a["verdict"] not in ACCUSATIONS and a["verdict"] != "PASS")
    ts = ET.SubElement(root, "testsuite", name=f"spec-auditor.standing.{st.provider}", tests=str(len(st.audits)),
                       failures=str(n_fail), errors=str(n_err), skipped="0", time="0", timestamp=str(st.as_of or ""))
    props = ET.SubElement(ts, "properties")
    for k, v in (("provider", st.provider), ("model", st.model), ("standing", st.standing), ("window_days", st.window_days)):
        ET.SubElement(props, "property", name=k, value="" if v is None else str(v))
    for q in st.questions:
        ET.SubElement(props, "property", name=f"question.{q['key']}", value=str(q["answer"]))
        ET.SubElement(props, "property", name=f"question.{q['key']}.plain", value=str(q.get("plain") or ""))
        ET.SubElement(props, "property", name=f"question.{q['key']}.evidence", value=str(q["evidence"]))
    for a in st.audits:
        tc = ET.SubElement(ts, "testcase", classname=f"spec-auditor.standing.{st.provider}", name=f"suite {a['suite']}", time="0")
        msg = "; ".join(f"{c.verdict} ({c.rule}: {c.evidence_line() or c.reason})" for c in by_run.get(a["run_id"], []))
        if a["verdict"] in ACCUSATIONS:
            ET.SubElement(tc, "failure", type=a["verdict"], message=msg or a["reason"])
        elif a["verdict"] != "PASS":
            ET.SubElement(tc, "error", type=str(a["verdict"]), message=(a["reason"] or "") + (f"; {msg}" if msg else ""))
        ET.SubElement(tc, "system-out").text = f"run {a['run_id']} at {a['started_at']}: {a['reason']}"
    ET.SubElement(ts, "system-out").text = "\n".join(f"not tested: {n['what']} — {n['why']}" for n in st.not_tested)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def render_standing(st: Standing, fmt: str = "text") -> str:
    """``st`` as ``text`` | ``markdown`` (``md``) | ``json`` | ``junit`` (``xml``).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "text":
        return _text(st)
    if fmt in ("markdown", "md"):
        return _markdown(st)
    if fmt == "json":
        return json.dumps(st.to_dict(), indent=2, ensure_ascii=False) + "\n"
    if fmt in ("junit", "xml"):
        return _junit(st)
    raise ValueError(f"--format {fmt!r}: use one of text, json, markdown, junit")
