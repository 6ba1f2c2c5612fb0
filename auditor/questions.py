"""The buyer's two questions, answered from one audit's verdict (issue 14, item 2).

Every report and the dashboard open with them, each answered ``"yes"``, ``"no"``, ``"undecided"``,
``"not tested"`` or ``"not established"`` with one sentence of evidence (the deciding detector and its
Holm-adjusted p-value for "no"; the positions, the power requirement and the target effect for "yes"; for
"undecided", that the tests ran and found nothing but had too few positions to clear the provider, with the
positions had and needed (issue 38, item 2: underpowered is not "not tested"); why not for "not tested" (a
test that did not run); for "not established", the deviation found, the two causes it may be — one per
question — and what a decisive audit needs):

- :data:`PRECISION_QUESTION` (key ``precision``): "Is the model served at its original precision?"
- :data:`VERIFICATION_QUESTION` (key ``verification``): "Is speculative verification strict (lossless)?"

:func:`answer_questions` reads only the verdict kind and its stored ``details``
(``auditor.verdict.decide_verdict``: ``rule``, ``secondary_causes``, ``detectors``, ``findings``,
``not_run``, ``power``, ``power_families``, ``provider_failures``, ``template_mismatch``,
``tokenizer_mismatch``, ``not_tested``). Rules, in order:

Both questions
    0. **not established** (after rule 1 of each) when QUANTIZATION_OR_RELAXED_VERIFICATION is the verdict
       or a secondary cause: a deviation was found that is either quantized weights or relaxed greedy
       verification, and the evidence cannot tell which (issue 37, item 2).

Precision
    1. **no** when QUANTIZATION, SUBSTITUTION or QUANTIZATION_OR_SUBSTITUTION is the verdict or one of
       ``secondary_causes``
       (evidence: the deciding detectors with their p-values; the tokenizer evidence for rule
       ``2t-tokenizer``, which has no p-value: another vocabulary is a proof, not a test).
    2. **not tested** when the audit is INCONCLUSIVE because of provider failures (rule
       ``0-provider-failures``): the probes that succeeded are not a fair sample.
    3. **not tested** when no ``model``-family test (greedy-match, logprob-divergence) ran: no
       reference (``reference = "none"``), the reference comparisons set aside (another chat
       template), or the stored reasons why each did not run.
    4. **yes** when the ``model`` family ran and is adequate (``details["power_families"]``, or
       for older audits derived from ``details["power"]``): evidence names each adequate test's
       positions, the positions it needed and its target effect (3% clear greedy mismatches /
       a KL three times the honest noise floor), then which precision classes the audit rules out at
       95% power against their calibrated effects (``details["rules_out"]``, auditor.rules_out).
    5. **undecided** otherwise: the model tests ran and found nothing, but with too few positions (with
       the positions had and needed, and the missing positions), or with no power record (audits stored
       before the verdict recorded power on rejections lack it).

Verification
    1. **no** when RELAXED_VERIFICATION is the verdict or one of ``secondary_causes``.
    2. **not tested** on provider failures (as for precision).
    2b. when precision is **no**, the reference's distribution is not the served one: **yes** only
       when self-argmax (the provider's own reported distribution) ran with enough positions and
       did not reject, else **not tested**.
    3. **yes** when the ``acceptance`` family (sampling-argmax, self-argmax) ran and is adequate
       (target: 0.08 extra argmax emissions per sampled position), then which verification classes
       the audit rules out (as for precision).
    4. **not tested** when the provider does not follow the requested decoding
       (DECODING_NONCOMPLIANT as the verdict or a secondary cause): the evidence names the
       non-compliance (served greedily, truncated sampling, ...) and its deciding p-value.
    5. **yes, at temperature 0 only** for a greedy-only audit (no acceptance test ran) that found
       nothing (no accusation, primary or secondary) and whose greedy-match ran with enough
       positions: greedy tokens match the reference argmax, which a lossy greedy verifier would
       break at clear margins; the evidence says that sampled verification was not tested, then which
       verification classes the audit rules out (``greedy-relaxed`` through greedy-near-tie's power).
    6. **not tested** otherwise when no sampled tokens were tested (with the reasons) or the served
       model differs from the reference so its sampling could not be compared with it; **undecided**
       when the acceptance tests ran and found nothing with too few sampled positions (missing
       positions) or no power record.

Missing or malformed keys never raise (old stored audits lack ``power_families``): the answer
is then "not tested" with a reason. :func:`combine_answers` merges the answers of several audits
(a provider's standing, ``auditor.standing``): any "no" wins (the standing is the worst of its
audits, so a "yes" beside an established cause would contradict it), then any "not established", else
the newest "yes", else the newest audit's "undecided" or "not tested".

The detector families, sampling tests and target effects are the registry's
(``auditor.detectors``: ``POWER_FAMILIES``, ``DetectorSpec.power_target``) and the verdict kinds
``auditor.verdict.VerdictKind`` (neither imports torch or httpx, so the store's query modules and
the dashboard may reach this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from auditor.detectors import DETECTORS, POWER_FAMILIES, Mode, PowerFamily, detectors_where
from auditor.rules_out import RULE_OUT_POWER, rules_out_sentence
from auditor.util import finite, fmt_p
from auditor.verdict import DEFAULT_POWER, UNDETERMINED_CAUSES, VerdictKind
from auditor.verdict_cause import DECISIVE_WITHOUT_LOGPROBS

__all__ = [
    "ACCEPTANCE_DETECTORS",
    "MODEL_DETECTORS",
    "PRECISION_QUESTION",
    "QUESTIONS",
    "VERIFICATION_QUESTION",
    "Answer",
    "QuestionAnswer",
    "answer_questions",
    "combine_answers",
]

PRECISION_QUESTION = "Is the model served at its original precision?"
VERIFICATION_QUESTION = "Is speculative verification strict (lossless)?"
#: key → question, in the order every report shows them.
QUESTIONS: Mapping[str, str] = {"precision": PRECISION_QUESTION, "verification": VERIFICATION_QUESTION}

Answer = Literal["yes", "no", "undecided", "not tested", "not established"]

#: The ``model`` and ``acceptance`` power families (the registry's ``POWER_FAMILIES``).
MODEL_DETECTORS: tuple[str, ...] = tuple(str(n) for n in POWER_FAMILIES[str(PowerFamily.MODEL)])
ACCEPTANCE_DETECTORS: tuple[str, ...] = tuple(str(n) for n in POWER_FAMILIES[str(PowerFamily.ACCEPTANCE)])
#: The sampling tests (rule 4 of ``auditor.verdict``): their p-values back a "no" for verification.
_SAMPLING_TESTS: tuple[str, ...] = tuple(str(n) for n in detectors_where(mode=Mode.SAMPLING))


def _target_meaning(name: str) -> str:
    """What the registry's power target of detector ``name`` means (``PowerTarget.meaning``)."""
    s = DETECTORS.get(name)
    return s.power_target.meaning if s is not None and s.power_target is not None else "its target effect"


_POWER = f"the audit's target power ({DEFAULT_POWER:.0%} by default)"
_PRECISION_KINDS = (str(VerdictKind.QUANTIZATION), str(VerdictKind.SUBSTITUTION),
                    str(VerdictKind.QUANTIZATION_OR_SUBSTITUTION))
_VERIFICATION_KINDS = (str(VerdictKind.RELAXED_VERIFICATION),)
#: Undetermined verdicts whose two causes answer different questions: each question is then "not established".
_SPLIT = tuple(str(k) for k, pair in UNDETERMINED_CAUSES.items()
               if {str(pair[0]), str(pair[1])} & set(_PRECISION_KINDS) and {str(pair[0]), str(pair[1])} & set(_VERIFICATION_KINDS))
#: What each cause of an undetermined pair means, in the evidence of "not established".
_MEANS = {str(VerdictKind.QUANTIZATION): "quantized weights (the precision question)",
          str(VerdictKind.RELAXED_VERIFICATION): "relaxed greedy verification (the verification question)",
          str(VerdictKind.SUBSTITUTION): "another model"}
_ACCUSATIONS = tuple(str(k) for k in VerdictKind if k not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE))
#: rule prefix → the detectors that decide a primary cause of that rule (``auditor.verdict``).
_RULE_DETECTORS = (
    ("2-", ("logprob-divergence",)),
    ("3-", ("greedy-match",)),
    ("4", _SAMPLING_TESTS),
    ("1-self-greedy", ("self-greedy",)),
    ("1u-unverified-tokens", ("self-greedy",)),
    ("1s-reasoning-span", ("self-greedy",)),
    ("1d-unverified-drafts", ("self-greedy",)),
    ("6-preflight-greedy", ("preflight-greedy-top1",)),
    ("6s-preflight-reasoning-span", ("preflight-greedy-top1",)),
    ("6-preflight-sampling", ("preflight-top-p",)),
)
#: rule → what the decoding non-compliance is, for a verification "not tested".
_NONCOMPLIANCE = {
    "4a-greedy-served": "sampling requests were served greedily",
    "4b-truncated": "sampled tokens follow a truncated distribution (server-side top-k / top-p / min-p)",
    "6-preflight-sampling": "the server applies its own top-k / top-p / min-p at temperature 1",
    "1-self-greedy": "temperature-0 tokens contradict the provider's own reported top-1",
    "6-preflight-greedy": "temperature-0 tokens are not the provider's own reported top-1",
    "3-greedy-decode-path": "the served greedy tokens are not the argmax of the distribution it reports",
}


@dataclass(frozen=True)
class QuestionAnswer:
    """One of the buyer's questions, answered.

    Attributes:
        key: ``"precision"`` or ``"verification"``.
        question: the question, verbatim (:data:`QUESTIONS`).
        answer: ``"yes"``, ``"no"`` or ``"not tested"``.
        evidence: one sentence: the deciding detector and p-value ("no"), the power and target
            effect ("yes"), or why the audit could not answer ("not tested").
    """

    key: str
    question: str
    answer: Answer
    evidence: str

    def to_dict(self) -> dict[str, str]:
        """``{"key", "question", "answer", "evidence"}`` (strings, JSON-ready)."""
        return {"key": self.key, "question": self.question, "answer": self.answer, "evidence": self.evidence}

    def line(self) -> str:
        """``"Is ...? yes — evidence"``, for plain-text output."""
        return f"{self.question} {self.answer} — {self.evidence}"


# ------------------------------------------------------------------------------------------ reading details
def _map(x: object) -> Mapping[str, object]:
    return x if isinstance(x, Mapping) else {}


def _list(x: object) -> list[object]:
    return list(x) if isinstance(x, list | tuple) else []


def _det(d: Mapping[str, object], name: str) -> Mapping[str, object]:
    return _map(_map(d.get("detectors")).get(name))


def _ran(d: Mapping[str, object], name: str) -> bool:
    return bool(_det(d, name).get("ran"))


def _p_adj(d: Mapping[str, object], name: str) -> object:
    p = _det(d, name).get("p_adjusted")
    if p is None:
        for f in _list(d.get("findings")):
            if _map(f).get("detector") == name:
                return _map(f).get("p_adjusted")
    return p


def _n(x: object) -> str:
    v = finite(x)
    return f"{int(v):,}" if v is not None else "?"


def _p_text(name: str, p: object) -> str:
    return f"{name} (Holm-adjusted p = {fmt_p(p)})"


def _family(d: Mapping[str, object], fam: str, members: Sequence[str]) -> Mapping[str, object] | None:
    """``{"ran", "adequate", "missing_positions"}`` of a power family: ``details["power_families"]``,
    else derived from ``details["power"]`` (older audits); None when neither is recorded."""
    f = _map(d.get("power_families")).get(fam)
    if isinstance(f, Mapping):
        return f
    power = _map(d.get("power"))
    if not power:
        return None
    entries = {m: _map(power.get(m)) for m in members if m in power}
    return {"ran": any(_ran(d, m) for m in members),
            "adequate": any(bool(e.get("adequate")) and _ran(d, m) for m, e in entries.items()),
            "missing_positions": None}


def _adequate_text(d: Mapping[str, object], members: Sequence[str]) -> str:
    """The adequately powered members: positions, positions needed, target, p."""
    power = _map(d.get("power"))
    parts = []
    for m in members:
        e = _map(power.get(m))
        if _ran(d, m) and e.get("adequate"):
            target = _target_meaning(m)
            parts.append(f"{m} on {_n(_det(d, m).get('n', e.get('n')))} positions ({_n(e.get('required_positions'))} "
                         f"needed for {_POWER} against {target}; Holm-adjusted p = {fmt_p(_p_adj(d, m))})")
    return "; ".join(parts) or "the family's tests had enough positions for " + _POWER


def _shortfall_text(d: Mapping[str, object], members: Sequence[str], fam: Mapping[str, object]) -> str:
    """Positions each member that ran had and needed, and the family's missing positions."""
    power = _map(d.get("power"))
    parts = [f"{m} {_n(_det(d, m).get('n'))} of {_n(_map(power.get(m)).get('required_positions'))} needed"
             for m in members if _ran(d, m) and m in power]
    missing = fam.get("missing_positions")
    more = f"; about {_n(missing)} more positions would reach it" if finite(missing) else ""
    return "too few positions for " + _POWER + (f" ({', '.join(parts)})" if parts else "") + more


def _why_not_run(d: Mapping[str, object], members: Sequence[str]) -> str:
    """Why each of ``members`` did not run (stored reasons); members absent from the audit are named so."""
    dets = _map(d.get("detectors"))
    if not dets:
        return "this audit's details record no detector results"
    not_run = _map(d.get("not_run"))
    parts = [f"{m}: {not_run.get(m) or _det(d, m).get('reason') or 'not run'}" for m in members if m in dets]
    return "; ".join(parts) or f"{' and '.join(members)} are not part of this audit"


def _causes(verdict: str, d: Mapping[str, object]) -> list[tuple[str, bool, Mapping[str, object]]]:
    """(kind, primary, cause dict) for the verdict and each secondary cause (``verdict`` or ``kind`` key)."""
    out: list[tuple[str, bool, Mapping[str, object]]] = [(str(verdict), True, {})]
    for c in _list(d.get("secondary_causes")):
        m = _map(c)
        kind = m.get("verdict", m.get("kind"))
        if kind is not None:
            out.append((str(kind), False, m))
    return out


def _primary_deciding(d: Mapping[str, object]) -> list[str]:
    """The primary cause's deciding detectors with their p-values (rule-based, else the findings no
    secondary cause claims)."""
    rule = str(d.get("rule") or "")
    findings = [str(_map(f).get("detector")) for f in _list(d.get("findings")) if _map(f).get("detector")]
    names: list[str] = []
    for prefix, dets in _RULE_DETECTORS:
        if rule.startswith(prefix):
            names = [n for n in dets if n in findings or _det(d, n).get("rejects")]
            break
    if not names:
        claimed = {_map(e).get("detector") for c in _list(d.get("secondary_causes"))
                   for e in _list(_map(c).get("evidence"))}
        names = [f for f in findings if f not in claimed] or findings
    return [_p_text(n, _p_adj(d, n)) for n in names]


def _deciding(d: Mapping[str, object], primary: bool, cause: Mapping[str, object]) -> tuple[list[str], str]:
    """(deciding detectors with their p-values, rule) of the primary cause or of a secondary one."""
    if primary:
        return _primary_deciding(d), str(d.get("rule") or "—")
    ev = [_p_text(str(_map(e).get("detector")), _map(e).get("p_adjusted")) for e in _list(cause.get("evidence"))]
    return ev, str(cause.get("rule") or "—")


def _alpha(d: Mapping[str, object]) -> str:
    a = finite(d.get("alpha"))
    return f"{a:g}" if a is not None else "?"


def _cause_evidence(verdict: str, d: Mapping[str, object], primary: bool, cause: Mapping[str, object]) -> str:
    """One sentence: the cause, its rule and its deciding evidence."""
    if primary and str(d.get("rule")) == "2t-tokenizer":
        tm = _map(d.get("tokenizer_mismatch"))
        what = (f"{_n(tm.get('n_foreign_distinct'))} distinct token strings outside the claimed model's vocabulary"
                if tm.get("n_foreign_distinct") else "prompt token counts the claimed tokenizer cannot produce")
        return (f"{verdict}: the provider's tokens come from another tokenizer than the claimed model's ({what}), "
                "so another model is served (rule 2t-tokenizer; a proof, no p-value)")
    ev, rule = _deciding(d, primary, cause)
    where = "" if primary else (" in the probes that succeeded" if str(d.get("rule")) == "0-provider-failures"
                                else " (secondary cause)")
    return (f"{verdict} established{where} by " + (", ".join(ev) if ev else "its rule")
            + f" at family-wise alpha = {_alpha(d)} (rule {rule})")


def _no(verdict: str, d: Mapping[str, object], kinds: Sequence[str]) -> str | None:
    for kind, primary, cause in _causes(verdict, d):
        if kind in kinds:
            return _cause_evidence(kind, d, primary, cause)
    return None


def _not_established(verdict: str, d: Mapping[str, object]) -> str | None:
    """The evidence of "not established" when the verdict or a secondary cause is an undetermined pair whose
    two causes answer different questions (QUANTIZATION_OR_RELAXED_VERIFICATION), else None."""
    for kind, primary, cause in _causes(verdict, d):
        if kind in _SPLIT:
            a, b = (_MEANS.get(str(c), str(c)) for c in UNDETERMINED_CAUSES[VerdictKind(kind)])
            rule = str(d.get("rule") if primary else cause.get("rule"))
            need = f"; {DECISIVE_WITHOUT_LOGPROBS}" if rule == "3n-model-or-verification" else ""
            return (f"a deviation was found, but not established which: {a} or {b} — "
                    + _cause_evidence(kind, d, primary, cause) + need)
    return None


def _failures(d: Mapping[str, object]) -> str | None:
    if str(d.get("rule")) != "0-provider-failures":
        return None
    f = _map(d.get("provider_failures"))
    share = finite(f.get("share"))
    kinds = ", ".join(f"{k} {v}" for k, v in _map(f.get("kinds")).items()) or "unknown kinds"
    return (f"{_n(f.get('failed'))} of {_n(f.get('total'))} probes failed"
            + (f" ({share:.0%})" if share is not None else "") + f" ({kinds}), so the probes that succeeded "
            "are not a fair sample (rule 0-provider-failures)")


def _no_power(d: Mapping[str, object], members: Sequence[str]) -> str:
    ps = ", ".join(_p_text(m, _p_adj(d, m)) for m in members if _ran(d, m))
    return (f"{ps} ran without establishing a deviation, but this audit records no power calculation for them "
            "(it is computed only when no detector rejects, and older audits lack it), so a clean result cannot "
            "be claimed")


def _rules_out_note(d: Mapping[str, object], question: str) -> str:
    """"; at 95% power against the calibrated effects: rules out ...; does not rule out ... (power ...)"
    for the tested deviation classes of ``question`` (``details["rules_out"]``, auditor.rules_out); ""
    when none is recorded."""
    recs = [_map(r) for r in _list(d.get("rules_out"))]
    mine = [r for r in recs if r.get("question") == question and r.get("status") in ("ruled out", "not ruled out")]
    try:
        text = rules_out_sentence(mine)
    except (TypeError, ValueError):  # a malformed stored record
        return ""
    return f"; at {RULE_OUT_POWER:.0%} power against the calibrated effect sizes it {text}" if text else ""


# ------------------------------------------------------------------------------------------ the two answers
def _answer(key: str, answer: Answer, evidence: str) -> QuestionAnswer:
    return QuestionAnswer(key, QUESTIONS[key], answer, evidence)


def _precision(verdict: str, d: Mapping[str, object]) -> QuestionAnswer:
    no = _no(verdict, d, _PRECISION_KINDS)
    if no is not None:
        return _answer("precision", "no", no)
    if (which := _not_established(verdict, d)) is not None:
        return _answer("precision", "not established", which)
    if (fail := _failures(d)) is not None:
        return _answer("precision", "not tested", fail)
    if not any(_ran(d, m) for m in MODEL_DETECTORS):
        nt = _map(d.get("not_tested"))
        if any(k in nt for k in _PRECISION_KINDS):
            why = str(nt.get("QUANTIZATION") or nt.get("SUBSTITUTION"))
            return _answer("precision", "not tested", f"the audit had no reference model to compare with: {why}")
        tm = _map(d.get("template_mismatch"))
        if tm:
            return _answer("precision", "not tested", (
                f"the reference comparisons were set aside: the provider counts {tm.get('provider_prompt_tokens')} "
                f"prompt tokens where the reference renders {tm.get('reference_prompt_tokens')} (another chat "
                "template or an injected system prompt)"))
        return _answer("precision", "not tested",
                       "the model tests did not run (" + _why_not_run(d, MODEL_DETECTORS) + ")")
    fam = _family(d, "model", MODEL_DETECTORS)
    if fam is None:
        return _answer("precision", "undecided", "the model tests " + _no_power(d, MODEL_DETECTORS))
    if fam.get("adequate"):
        return _answer("precision", "yes", "no model difference found: " + _adequate_text(d, MODEL_DETECTORS)
                       + _rules_out_note(d, "precision"))
    return _answer("precision", "undecided", "the model tests ran and found nothing, but had "
                   + _shortfall_text(d, MODEL_DETECTORS, fam))


def _verification(verdict: str, d: Mapping[str, object], precision: QuestionAnswer) -> QuestionAnswer:
    no = _no(verdict, d, _VERIFICATION_KINDS)
    if no is not None:
        return _answer("verification", "no", no)
    if (which := _not_established(verdict, d)) is not None:
        return _answer("verification", "not established", which)
    if (fail := _failures(d)) is not None:
        return _answer("verification", "not tested", fail)
    fam = _family(d, "acceptance", ACCEPTANCE_DETECTORS)
    ran = any(_ran(d, m) for m in ACCEPTANCE_DETECTORS)
    if precision.answer == "no":
        # the reference's distribution is not the served one: only a test against the provider's own
        # reported distribution still isolates the acceptance rule
        own = [m for m in ACCEPTANCE_DETECTORS if not DETECTORS[m].needs_reference]
        pw = _map(d.get("power"))
        if any(_ran(d, m) and _map(pw.get(m)).get("adequate") and not _det(d, m).get("rejects") for m in own):
            return _answer("verification", "yes", "no relaxed acceptance against the provider's own distribution: "
                           + _adequate_text(d, tuple(own)))
        return _answer("verification", "not tested", (
            "the served model differs from the reference (see precision), so its sampled tokens could not be "
            "compared with the reference's distribution to isolate the acceptance rule"))
    if ran and fam is not None and fam.get("adequate"):
        return _answer("verification", "yes", "no relaxed acceptance found: " + _adequate_text(d, ACCEPTANCE_DETECTORS)
                       + _rules_out_note(d, "verification"))
    for kind, primary, cause in _causes(verdict, d):
        if kind == "DECODING_NONCOMPLIANT":
            ev, rule = _deciding(d, primary, cause)
            what = _NONCOMPLIANCE.get(rule, f"rule {rule}")
            return _answer("verification", "not tested", (
                f"the provider does not follow the requested decoding ({kind}: {what}; "
                + (", ".join(ev) or "no p-value recorded") + "), so its sampled tokens cannot show whether "
                "speculative verification is strict"))
    accused = any(k in _ACCUSATIONS for k, _, _ in _causes(verdict, d))
    if not ran:
        g = _map(_map(d.get("power")).get("greedy-match"))
        if not accused and _ran(d, "greedy-match") and not _det(d, "greedy-match").get("rejects") and g.get("adequate"):
            return _answer("verification", "yes", (
                f"at temperature 0 only: greedy tokens match the reference argmax (greedy-match Holm-adjusted p = "
                f"{fmt_p(_p_adj(d, 'greedy-match'))} on {_n(_det(d, 'greedy-match').get('n'))} positions, "
                f"{_n(g.get('required_positions'))} needed for {_POWER} against {_target_meaning('greedy-match')}), which "
                "a greedy verifier accepting non-argmax drafts at clear margins would break; sampled verification was "
                "not tested (no sampling probes)") + _rules_out_note(d, "verification"))
        return _answer("verification", "not tested",
                       "no sampled tokens were tested (" + _why_not_run(d, ACCEPTANCE_DETECTORS) + ")")
    if fam is None:
        return _answer("verification", "undecided",
                       "the acceptance tests " + _no_power(d, ACCEPTANCE_DETECTORS))
    return _answer("verification", "undecided",
                   "the acceptance tests ran and found nothing, but had " + _shortfall_text(d, ACCEPTANCE_DETECTORS, fam))


def answer_questions(verdict: str, details: Mapping[str, object] | None) -> list[QuestionAnswer]:
    """The two answers (precision, then verification) for one audit (rules: module docstring).

    Args:
        verdict: the audit's verdict (``auditor.verdict.VerdictKind`` value; unknown values are
            treated as no accusation).
        details: the verdict's details as stored (``Verdict.details``); None, missing keys or
            malformed values give "not tested" answers with a reason, never an exception.

    Returns:
        ``[precision, verification]`` as :class:`QuestionAnswer`.
    """
    d = _map(details)
    try:
        precision = _precision(str(verdict), d)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # malformed stored details
        precision = _answer("precision", "not tested", f"the stored verdict details could not be read ({exc})")
    try:
        verification = _verification(str(verdict), d, precision)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        verification = _answer("verification", "not tested", f"the stored verdict details could not be read ({exc})")
    return [precision, verification]


def combine_answers(
    audits: Sequence[tuple[str, Sequence[QuestionAnswer]]],
) -> list[tuple[QuestionAnswer, int | None]]:
    """Merge several audits' answers (newest first) into one per question, for a provider's standing.

    Args:
        audits: ``(label, answers)`` per audit, newest first; ``label`` (e.g. "suite precision, run
            abc123") prefixes the chosen answer's evidence.

    Returns:
        ``[(answer, index of the audit it came from, or None)]`` for precision and verification: the
        newest "no" (any established cause wins, as in the standing), else the newest "not established"
        (a deviation that may be this question's is not cleared by another audit's "yes"), else the newest
        "yes", else "not tested" (with the newest audit's reason, or "no completed audit").
    """
    out: list[tuple[QuestionAnswer, int | None]] = []
    for key in QUESTIONS:
        mine = [(i, label, a) for i, (label, answers) in enumerate(audits) for a in answers if a.key == key]
        pick = (next(((i, lb, a) for i, lb, a in mine if a.answer == "no"), None)
                or next(((i, lb, a) for i, lb, a in mine if a.answer == "not established"), None)
                or next(((i, lb, a) for i, lb, a in mine if a.answer == "yes"), None))
        if pick is not None:
            i, label, a = pick
            out.append((replace(a, evidence=f"{label}: {a.evidence}"), i))
        elif mine:
            i, label, a = mine[0]
            out.append((replace(a, evidence=f"no recent audit answers it; newest ({label}): {a.evidence}"), i))
        else:
            out.append((_answer(key, "not tested", "no completed audit"), None))
    return out



# ------------------------------------------------------------------------------------------ the headline
#: The verdict in plain words (issue 38, item 1): what a procurement reviewer reads first, before any statistic.
_PLAIN: Mapping[str, str] = {
    str(VerdictKind.PASS): "Served as declared: no sign of lower precision or relaxed verification",
    str(VerdictKind.QUANTIZATION): "Not at its original precision",
    str(VerdictKind.SUBSTITUTION): "Not the declared model",
    str(VerdictKind.QUANTIZATION_OR_SUBSTITUTION): (
        "Not the declared model at its original precision (a heavily quantized copy or another model)"),
    str(VerdictKind.RELAXED_VERIFICATION): "Speculative verification is not strict",
    str(VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION): (
        "A deviation was found: quantized weights or relaxed verification, the evidence cannot tell which"),
    str(VerdictKind.DECODING_NONCOMPLIANT): (
        "The provider does not decode as requested, so its sampled tokens cannot show whether verification is strict"),
    str(VerdictKind.INCONCLUSIVE): "No decision",
}


def _times(r: float) -> str:
    return f"{r:.0f}" if r >= 10 else f"{r:.1f}"


def _figure(det: Mapping[str, object]) -> str | None:
    """The one deciding figure of a detector that ran, in plain words; None when it has none."""
    name = det.get("name")
    details = _map(det.get("details"))
    effect = finite(det.get("effect"))
    n = _n(det.get("n"))
    if name == "logprob-divergence" and (r := finite(details.get("ratio_to_floor"))) is not None:
        return (f"the reported probabilities differ from the original model's {_times(r)} times as much as honest "
                f"serving varies (over {n} positions)")
    if name == "greedy-match" and effect is not None:
        return f"greedy tokens differ from the original model's where it is confident at {effect:.1%} of {n} positions"
    if name in ("sampling-argmax", "self-argmax") and effect is not None:
        return (f"the most likely token is emitted {effect:.2f} times more per sampled token than the model's own "
                f"distribution allows (over {n} sampled tokens)")
    if name == "greedy-near-tie" and effect is not None:
        return f"greedy tokens flip to the runner-up at near-ties at a rate of {effect:.2f} (over {n} near-ties)"
    return None


def plain_headline(verdict: str, detectors: Sequence[Mapping[str, object]], reason: str = "") -> str:
    """One plain sentence with the one deciding figure: what the report opens with after the two
    questions (issue 38, item 1); the statistics follow it.

    Args:
        verdict: the verdict kind.
        detectors: the report's detector dicts (``name``, ``ran``, ``rejects``, ``p_adjusted``, ``effect``,
            ``n``, ``details``), as stored.
        reason: the verdict's reason sentence; its first clause is the headline of an INCONCLUSIVE audit.

    Returns:
        e.g. "Not at its original precision: the reported probabilities differ from the original model's
        161 times as much as honest serving varies (over 480 positions)." Never raises on malformed input.
    """
    lead = _PLAIN.get(verdict, verdict)
    dets = [_map(d) for d in detectors if isinstance(d, Mapping) and d.get("ran")]
    if verdict == str(VerdictKind.INCONCLUSIVE):
        first = reason.split(";")[0].strip().rstrip(".")
        return f"{lead}: {first[:200]}." if first else f"{lead}."
    if verdict == str(VerdictKind.PASS):
        fig = next((f for d in dets if d.get("name") == "logprob-divergence" and (f := _figure(d))), None)
        return f"{lead}; {fig}." if fig else f"{lead}."
    rejecting = sorted((d for d in dets if d.get("rejects")),
                       key=lambda d: p if (p := finite(d.get("p_adjusted"))) is not None else 1.0)
    fig = next((f for d in rejecting if (f := _figure(d))), None)
    if fig is None and rejecting:
        d = rejecting[0]
        fig = f"{d.get('name')} found it (Holm-adjusted p = {fmt_p(d.get('p_adjusted'))})"
    return f"{lead}: {fig}." if fig else f"{lead}."
