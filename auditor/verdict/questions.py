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
(``auditor.verdict.decide.decide_verdict``: ``rule``, ``secondary_causes``, ``detectors``, ``findings``,
``not_run``, ``power``, ``power_families``, ``provider_failures``, ``template_mismatch``,
``tokenizer_mismatch``, ``not_tested``, ``verified_prefix``). Rules, in order:

Both questions
    0. **not established** (after rule 1 of each) when QUANTIZATION_OR_RELAXED_VERIFICATION is the verdict
       or a secondary cause: a deviation was found that is either quantized weights or relaxed greedy
       verification, and the evidence cannot tell which (issue 37, item 2).
    0s. RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT (the sampled tokens deviate: lossy speculative acceptance
       or a server-side top-k / top-p / min-p, not established which; issue 37, item 8): verification is **not
       established** (after its rule 1); precision is answered by its own rules and its evidence ends by saying
       that the sampler deviation is not established either way and does not bear on precision.

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
    3u. when logprob-divergence's rejection is explained by unverified tokens (``details["verified_prefix"]``
       ``explains_divergence``, rule 1u of ``auditor.verdict.decide``): the answer rests on logprob-divergence on
       the positions before each response's first unverified token — **yes** with at least the positions its power
       calculation needs (``details["power"]``), else **undecided** — and names the explained rejections.
    4. **yes** when the ``model`` family ran and is adequate (``details["power_families"]``, or
       for older audits derived from ``details["power"]``): evidence names each adequate test's
       positions, the positions it needed and its target effect (3% clear greedy mismatches /
       a KL three times the honest noise floor). Which deviation classes the audit rules out
       (``details["rules_out"]``, auditor.verdict.rules_out) is not repeated here: every report shows that
       account once, in its own part (issue 38, item 3).
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
       (target: 0.08 extra argmax emissions per sampled position).
    4. **not tested** when the provider does not follow the requested decoding
       (DECODING_NONCOMPLIANT as the verdict or a secondary cause): the evidence names the
       non-compliance (served greedily, truncated sampling, ...) and its deciding p-value.
    5. **yes, at temperature 0 only** for a greedy-only audit (no acceptance test ran) that found
       nothing (no accusation, primary or secondary) and whose greedy-match ran with enough
       positions: greedy tokens match the reference argmax, which a lossy greedy verifier would
       break at clear margins; the evidence says that sampled verification was not tested.
    6. **not tested** otherwise when no sampled tokens were tested (with the reasons) or the served
       model differs from the reference so its sampling could not be compared with it; **undecided**
       when the acceptance tests ran and found nothing with too few sampled positions (missing
       positions) or no power record.

Missing or malformed keys never raise (old stored audits lack ``power_families``): the answer
is then "not tested" with a reason. :func:`combine_answers` merges the answers of several audits
(a provider's standing, ``auditor.watch.standing``): any "no" wins (the standing is the worst of its
audits, so a "yes" beside an established cause would contradict it), then any "not established", else
the newest "yes", else the newest audit's "undecided" or "not tested".

The detector families, sampling tests and target effects are the registry's
(``auditor.detectors``: ``POWER_FAMILIES``, ``DetectorSpec.power_target``) and the verdict kinds
``auditor.verdict.kinds.VerdictKind`` (neither imports torch or httpx, so the store's query modules and
the dashboard may reach this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from auditor.detectors import DETECTORS, POWER_FAMILIES, DetectorName, Mode, PowerFamily, detectors_where
from auditor.detectors.logprob import LOGPROB_POSITIONS, kl_floor_ratio
from auditor.util import finite, fmt_p, kl_floor_text
from auditor.verdict.cause import DECIDES_SAMPLER, DECISIVE_WITHOUT_LOGPROBS
from auditor.verdict.kinds import UNDETERMINED_CAUSES, VerdictKind
from auditor.verdict.power import DEFAULT_POWER

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
#: The sampling tests (rule 4 of ``auditor.verdict.decide``): their p-values back a "no" for verification.
_SAMPLING_TESTS: tuple[str, ...] = tuple(str(n) for n in detectors_where(mode=Mode.SAMPLING))


def _target_meaning(name: str) -> str:
    """What the registry's power target of detector ``name`` means (``PowerTarget.meaning``)."""
    s = DETECTORS.get(name)
    return s.power_target.meaning if s is not None and s.power_target is not None else "its target effect"


_POWER = f"the audit's target power ({DEFAULT_POWER:.0%} by default)"
_PRECISION_KINDS = (str(VerdictKind.QUANTIZATION), str(VerdictKind.SUBSTITUTION),
                    str(VerdictKind.QUANTIZATION_OR_SUBSTITUTION))
_VERIFICATION_KINDS = (str(VerdictKind.RELAXED_VERIFICATION),)
#: Undetermined verdicts whose causes do not all answer a question "no" → the questions one of its causes answers:
#: each is then "not established" (QUANTIZATION_OR_SUBSTITUTION answers precision "no" with either cause).
_OPEN: Mapping[str, frozenset[str]] = {
    str(k): frozenset(q for q, kinds in (("precision", _PRECISION_KINDS), ("verification", _VERIFICATION_KINDS))
                      if {str(pair[0]), str(pair[1])} & set(kinds))
    for k, pair in UNDETERMINED_CAUSES.items() if not {str(pair[0]), str(pair[1])} <= set(_PRECISION_KINDS)}
#: What each cause of an undetermined pair means, in the evidence of "not established" (per pair where it differs).
_MEANS = {str(VerdictKind.QUANTIZATION): "quantized weights (the precision question)",
          str(VerdictKind.RELAXED_VERIFICATION): "relaxed greedy verification (the verification question)",
          str(VerdictKind.SUBSTITUTION): "another model"}
_SAMPLER_PAIR = str(VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT)
_MEANS_IN = {_SAMPLER_PAIR: {
    str(VerdictKind.RELAXED_VERIFICATION): "lossy speculative acceptance (verification is not strict)",
    str(VerdictKind.DECODING_NONCOMPLIANT): ("a server-side top-k / top-p / min-p nobody asked for (decoding "
                                             "non-compliance, which says nothing about verification)")}}
#: rule of an undetermined cause → what a decisive audit needs.
_NEEDS = {"3n-model-or-verification": DECISIVE_WITHOUT_LOGPROBS, "4-mechanism-undetermined": DECIDES_SAMPLER}
_ACCUSATIONS = tuple(str(k) for k in VerdictKind if k not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE))
#: rule prefix → the detectors that decide a primary cause of that rule (``auditor.verdict.decide``).
_RULE_DETECTORS = (
    ("2-", (DetectorName.LOGPROB_DIVERGENCE,)),
    ("3-", (DetectorName.GREEDY_MATCH,)),
    ("4", _SAMPLING_TESTS),
    ("1-self-greedy", (DetectorName.SELF_GREEDY,)),
    ("1u-unverified-tokens", (DetectorName.SELF_GREEDY,)),
    ("1s-reasoning-span", (DetectorName.SELF_GREEDY,)),
    ("1d-unverified-drafts", (DetectorName.SELF_GREEDY,)),
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
        answer: ``"yes"``, ``"no"``, ``"undecided"``, ``"not tested"`` or ``"not established"``.
        evidence: one sentence: the deciding detector and p-value ("no"), the power and target
            effect ("yes"), or why the audit could not answer ("not tested").
        plain: the answer in plain words, no statistic (issue 38, item 6: what a report's first lines say;
            ``evidence`` follows below them), e.g. "it serves the model at reduced precision (quantized)." after the answer "no" ("" only for answers built by hand).
    """

    key: str
    question: str
    answer: Answer
    evidence: str
    plain: str = ""

    def to_dict(self) -> dict[str, str]:
        """``{"key", "question", "answer", "plain", "evidence"}`` (strings, JSON-ready)."""
        return {"key": self.key, "question": self.question, "answer": self.answer, "plain": self.plain,
                "evidence": self.evidence}

    def line(self) -> str:
        """``"Is ...? yes — evidence"``, for plain-text output."""
        return f"{self.question} {self.answer} — {self.evidence}"

    def plain_line(self) -> str:
        """``"Is ...? no — it serves the model at reduced precision (quantized)."``: a report's first lines."""
        return f"{self.question} {self.answer} — {self.plain or self.evidence}"


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


def _not_established(verdict: str, d: Mapping[str, object], key: str) -> str | None:
    """The evidence of "not established" for question ``key`` when the verdict or a secondary cause is an
    undetermined pair one of whose causes answers it (:data:`_OPEN`), else None."""
    for kind, primary, cause in _causes(verdict, d):
        if key in _OPEN.get(kind, ()):
            means = _MEANS_IN.get(kind, _MEANS)
            a, b = (means.get(str(c), str(c)) for c in UNDETERMINED_CAUSES[VerdictKind(kind)])
            rule = str(d.get("rule") if primary else cause.get("rule"))
            need = f"; {_NEEDS[rule]}" if rule in _NEEDS else ""
            return (f"a deviation was found, but not established which: {a} or {b} — "
                    + _cause_evidence(kind, d, primary, cause) + need)
    return None


def _sampler_note(verdict: str, d: Mapping[str, object]) -> str:
    """What the precision answer adds when the sampler pair (RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT) was
    found: it is not established either way and does not bear on precision; "" otherwise."""
    if not any(k == _SAMPLER_PAIR for k, _, _ in _causes(verdict, d)):
        return ""
    return (f"; separately, the sampled tokens deviate ({_SAMPLER_PAIR}: lossy speculative acceptance or a "
            "server-side top-k / top-p / min-p, not established which — see the verification question), which does "
            "not bear on precision")


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


# ------------------------------------------------------------------------------------------ the two answers
def _answer(key: str, answer: Answer, evidence: str) -> QuestionAnswer:
    return QuestionAnswer(key, QUESTIONS[key], answer, evidence, _plain(key, answer, evidence))


#: (question key, answer) → the answer in plain words (no statistic, no detector name); "no" on precision
#: names its cause (:data:`_PLAIN_NO_PRECISION`).
_PLAIN_ANSWERS: Mapping[tuple[str, str], str] = {
    ("precision", "yes"): "its probabilities match the original model's as closely as honest serving does.",
    ("precision", "no"): "it does not serve the declared model at its original precision.",
    ("verification", "yes"): ("its sampled tokens follow the model's own probabilities, as strict "
                              "verification requires."),
    ("verification", "no"): ("it accepts draft tokens that strict verification would reject, so its output "
                             "differs from what the model itself would produce."),
}
#: The precision cause a "no" names, in plain words (the verdict kind is the first word of the evidence).
_PLAIN_NO_PRECISION: Mapping[str, str] = {
    str(VerdictKind.QUANTIZATION): "it serves the model at reduced precision (quantized).",
    str(VerdictKind.SUBSTITUTION): "it serves a different model.",
    str(VerdictKind.QUANTIZATION_OR_SUBSTITUTION): "it serves a heavily quantized copy or a different model.",
}


def _plain(key: str, answer: str, evidence: str) -> str:
    """The answer in plain words (:attr:`QuestionAnswer.plain`), from the answer and its evidence's first word."""
    if answer == "no" and key == "precision":
        kind = evidence.split(" ", 1)[0].rstrip(":")
        return _PLAIN_NO_PRECISION.get(kind, _PLAIN_ANSWERS[(key, answer)])
    if answer == "yes" and key == "verification" and evidence.startswith("at temperature 0 only"):
        return ("for greedy (temperature 0) output only: its tokens are the model's own top choices; sampled "
                "output was not tested.")
    if (key, answer) in _PLAIN_ANSWERS:
        return _PLAIN_ANSWERS[(key, answer)]
    if answer == "not tested" and evidence.startswith("the served model differs from the reference"):
        return "the served model already differs from the original, so its verification could not be checked on its own."
    if answer == "not established":
        return ("something deviates, but it may be reduced precision or relaxed verification, and "
                "this audit cannot say which.")
    if answer == "undecided":
        return "the tests found nothing wrong, but the audit was too small to clear the provider."
    return "this audit could not check it (the reason is below)."


def _settled(key: str, verdict: str, d: Mapping[str, object], kinds: Sequence[str]) -> QuestionAnswer | None:
    """The answer to question ``key`` when the verdict alone settles it, checked in this order: "no" (the
    verdict names one of ``kinds``), "not established" (an undetermined pair), "not tested" (rule
    0-provider-failures); None when the detectors must be read."""
    if (no := _no(verdict, d, kinds)) is not None:
        return _answer(key, "no", no)
    if (which := _not_established(verdict, d, key)) is not None:
        return _answer(key, "not established", which)
    if (fail := _failures(d)) is not None:
        return _answer(key, "not tested", fail)
    return None


def _precision(verdict: str, d: Mapping[str, object]) -> QuestionAnswer:
    if (settled := _settled("precision", verdict, d, _PRECISION_KINDS)) is not None:
        return settled
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
    if _map(d.get("verified_prefix")).get("explains_divergence"):
        return _verified_prefix_precision(d)
    fam = _family(d, "model", MODEL_DETECTORS)
    if fam is None:
        return _answer("precision", "undecided", "the model tests " + _no_power(d, MODEL_DETECTORS))
    if fam.get("adequate"):
        return _answer("precision", "yes", "no model difference found: " + _adequate_text(d, MODEL_DETECTORS)
                       )
    return _answer("precision", "undecided", "the model tests ran and found nothing, but had "
                   + _shortfall_text(d, MODEL_DETECTORS, fam))


def _verified_prefix_precision(d: Mapping[str, object]) -> QuestionAnswer:
    """Precision rule 3u: the model tests reject only where the verification cause explains them — logprob-divergence
    after unverified tokens (``details["verified_prefix"]``, rule 1u of :mod:`auditor.verdict.decide`), the greedy tests
    by the decode path — so the evidence on precision is logprob-divergence on the verified prefix: **yes** when it had
    the positions logprob-divergence's power calculation needs, else **undecided** (positions had and needed)."""
    vp = _map(d.get("verified_prefix"))
    lp = str(DetectorName.LOGPROB_DIVERGENCE)
    n, need = finite(vp.get("n")), finite(_map(_map(d.get("power")).get(lp)).get("required_positions"))
    geo = finite(vp.get("geometric_ratio"))
    where = (f"logprob-divergence on the {_n(n)} greedy positions before each response's first unverified token finds "
             f"no difference (p = {fmt_p(vp.get('p_value'))}" + (f", geometric-mean KL {geo:.2f}x the honest floor"
                                                                 if geo is not None else "") + ")")
    explained = [f"{name} (Holm-adjusted p = {fmt_p(_map(f).get('p_adjusted'))}, explained by {_map(f).get('explained_by')})"
                 for f in _list(d.get("findings"))
                 if (name := str(_map(f).get("detector"))) in MODEL_DETECTORS and _map(f).get("explained_by")]
    tail = ("; the model tests' rejections over all positions are the unverified tokens' doing, not a model difference: "
            + ", ".join(explained)) if explained else ""
    power = f"{_n(need)} needed for {_POWER} against {_target_meaning(lp)}"
    if n is not None and need is not None and n >= need:
        return _answer("precision", "yes", f"no model difference found where the tokens were verified: {where} "
                       f"({power}){tail}")
    return _answer("precision", "undecided", f"no model difference found where the tokens were verified, but too few "
                   f"positions to clear the provider: {where} ({power}){tail}")


def _verification(verdict: str, d: Mapping[str, object], precision: QuestionAnswer) -> QuestionAnswer:
    if (settled := _settled("verification", verdict, d, _VERIFICATION_KINDS)) is not None:
        return settled
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
                       )
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
        g = _map(_map(d.get("power")).get(DetectorName.GREEDY_MATCH))
        if not accused and _ran(d, DetectorName.GREEDY_MATCH) and not _det(d, DetectorName.GREEDY_MATCH).get("rejects") and g.get("adequate"):
            return _answer("verification", "yes", (
                f"at temperature 0 only: greedy tokens match the reference argmax (greedy-match Holm-adjusted p = "
                f"{fmt_p(_p_adj(d, DetectorName.GREEDY_MATCH))} on {_n(_det(d, DetectorName.GREEDY_MATCH).get('n'))} positions, "
                f"{_n(g.get('required_positions'))} needed for {_POWER} against {_target_meaning(DetectorName.GREEDY_MATCH)}), which "
                "a greedy verifier accepting non-argmax drafts at clear margins would break; sampled verification was "
                "not tested (no sampling probes)"))
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
        verdict: the audit's verdict (``auditor.verdict.kinds.VerdictKind`` value; unknown values are
            treated as no accusation).
        details: the verdict's details as stored (``Verdict.details``); None, missing keys or
            malformed values give "not tested" answers with a reason, never an exception.

    Returns:
        ``[precision, verification]`` as :class:`QuestionAnswer`.
    """
    d = _map(details)
    try:
        precision = _precision(str(verdict), d)
        if precision.answer != "no" and (note := _sampler_note(str(verdict), d)):
            precision = replace(precision, evidence=precision.evidence + note)
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
    str(VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT): (
        "The sampled tokens deviate: relaxed speculative verification or the provider's own truncation of sampling, "
        "the evidence cannot tell which"),
    str(VerdictKind.DECODING_NONCOMPLIANT): (
        "The provider does not decode as requested, so its sampled tokens cannot show whether verification is strict"),
    str(VerdictKind.INCONCLUSIVE): "No decision",
}


def _figure(det: Mapping[str, object], scored: object = None) -> str | None:
    """The one deciding figure of a detector that ran, in plain words; None when it has none. ``scored``: the
    audit's positions compared with the reference (``tokens["scored_positions"]``), named beside the KL
    figure's own positions."""
    name = det.get("name")
    details = _map(det.get("details"))
    effect = finite(det.get("effect"))
    n = _n(det.get("n"))
    if name == DetectorName.LOGPROB_DIVERGENCE and (r := kl_floor_ratio(details)) is not None:
        return (f"the reported probabilities differ from the original model's {kl_floor_text(r)} times as much as "
                + (f"honest serving varies (over {n} of the {_n(scored)} positions compared)" if finite(scored)
                   else f"honest serving varies (over {n} {LOGPROB_POSITIONS})"))
    if name == DetectorName.GREEDY_MATCH and effect is not None:
        return f"greedy tokens differ from the original model's where it is confident at {effect:.1%} of {n} positions"
    if name in (DetectorName.SAMPLING_ARGMAX, DetectorName.SELF_ARGMAX) and effect is not None:
        return (f"the most likely token is emitted {effect:.2f} times more per sampled token than the model's own "
                f"distribution allows (over {n} sampled tokens)")
    if name == DetectorName.GREEDY_NEAR_TIE and effect is not None:
        return f"greedy tokens flip to the runner-up at near-ties at a rate of {effect:.2f} (over {n} near-ties)"
    return None


def plain_headline(verdict: str, detectors: Sequence[Mapping[str, object]], reason: str = "",
                   scored: object = None) -> str:
    """One plain sentence with the one deciding figure: what the report opens with after the two
    questions (issue 38, item 1); the statistics follow it.

    Args:
        verdict: the verdict kind.
        detectors: the report's detector dicts (``name``, ``ran``, ``rejects``, ``p_adjusted``, ``effect``,
            ``n``, ``details``), as stored.
        reason: the verdict's reason sentence; its first clause is the headline of an INCONCLUSIVE audit.
        scored: the audit's positions compared with the reference (``tokens["scored_positions"]``), or None.

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
        fig = next((f for d in dets if d.get("name") == DetectorName.LOGPROB_DIVERGENCE and (f := _figure(d, scored))), None)
        return f"{lead}; {fig}." if fig else f"{lead}."
    rejecting = sorted((d for d in dets if d.get("rejects")),
                       key=lambda d: p if (p := finite(d.get("p_adjusted"))) is not None else 1.0)
    fig = next((f for d in rejecting if (f := _figure(d, scored))), None)
    if fig is None and rejecting:
        d = rejecting[0]
        fig = f"{d.get('name')} found it (Holm-adjusted p = {fmt_p(d.get('p_adjusted'))})"
    return f"{lead}: {fig}." if fig else f"{lead}."
