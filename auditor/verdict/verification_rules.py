"""The verification-side rules of the verdict: does the provider verify its drafts strictly and decode as asked?
Which rules (numbered as in :mod:`auditor.verdict.decide`, which applies them in order):

- rule 1, ``self-greedy`` rejects: the greedy path does not follow the request (DECODING_NONCOMPLIANT), or
  drafts were never verified (1u unverified tokens, 1s inside the reasoning span, 1d inside the streamed steps
  → RELAXED_VERIFICATION) (:func:`self_greedy_cause`); 1u also when logprob-divergence rejects only after the
  unverified tokens (:func:`divergence_after_unverified`);
- rule 3n, near-ties flipped at temperature 0 (:func:`near_tie_cause`);
- rule 4, the sampling tests: greedy-served, truncated, relaxed acceptance, and the mechanism-undetermined
  pair RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT (:func:`sampling_cause`, :func:`sampler_undetermined`);
  its model branch (4d) is :func:`auditor.verdict.model_rules.sampled_model_cause`;
- rule 6, the pre-flight parameter checks (:func:`preflight_cause`, :func:`preflight_primary_cause`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from auditor.detectors import PREFLIGHT_CHECKS, SELF_SAMPLING_DETECTORS, DetectorName, TestKind, detectors_where
from auditor.detectors.base import MIN_POSITIONS, DetectorResult
from auditor.verdict.cause import (
    DECIDES_SAMPLER,
    emission_cause,
    near_tie_blind,
    near_tie_reason,
    own_short,
    p_adjusted_text,
    predictability_clause,
    sampled_self_contradiction,
    sampled_self_text,
    span_clause,
    span_localized,
    speculation_clause,
)
from auditor.verdict.kinds import Cause, RuleContext, VerdictKind
from auditor.verdict.model_rules import sampled_model_cause

__all__ = ["GREEDY_SERVED_MIN_ARGMAX_RATE", "TAIL_MISSING_MAX_RATIO", "TRUNCATION_SHAPE_RATIO", "UNVERIFIED_MIN_TOKENS",
           "divergence_after_unverified", "near_tie_cause", "preflight_cause", "preflight_primary_cause",
           "sampler_undetermined", "sampling_cause", "self_greedy_cause"]

#: Unverified greedy tokens (self-greedy ``n_unverified``) from which rule 1u names relaxed verification.
UNVERIFIED_MIN_TOKENS = 3
#: Argmax emitted at least this often at T > 0 → the request was served greedily.
GREEDY_SERVED_MIN_ARGMAX_RATE = 0.97
#: Rule 4b's fallback for tail results without the emission-model fit (older stored results, α > 0.1):
#: tail observed/expected at or below this → the tail is missing (issue 7: only a tail never sampled;
#: typical acceptance thins the tail to ~0.09 too, hence 0.0 and the shape ratio below).
TAIL_MISSING_MAX_RATIO = 0.0
#: Fallback too: tail deficit per position >= this × argmax excess per position → truncation (truncation
#: spreads the tail's mass pro rata, acceptance gives it to the draft; issue 7: deficit/excess 1.1-1.2 for
#: truncated-sampling, 0.75 typical-acceptance, 0.35-0.4 relaxed-threshold; right in 84-86% at 1,000 tokens).
TRUNCATION_SHAPE_RATIO = 0.9


def _unverified_shown(d: Mapping[str, Any]) -> bool:
    """Rule 1u's condition on self-greedy's details ``d``: at least UNVERIFIED_MIN_TOKENS unverified tokens, and at
    least half of the clear contradictions."""
    n_unv, n_clear = int(d.get("n_unverified") or 0), int(d.get("n_clear") or 0)
    return n_unv >= UNVERIFIED_MIN_TOKENS and 2 * n_unv >= n_clear


def divergence_after_unverified(c: RuleContext) -> str | None:
    """Why logprob-divergence's rejection is rule 1u's, or None (issue 40).

    When self-greedy rejects with rule 1u's condition (:func:`_unverified_shown`) and logprob-divergence rejects, but
    its test on the positions before each response's first unverified token (``details["verified_prefix"]``,
    :func:`auditor.check.run_detectors.verified_prefix`) ran on at least MIN_POSITIONS positions and does not reject
    at alpha (raw p > alpha: no Holm discount, so explaining is the harder side), the divergence sits where the
    responses go on from unverified tokens — contexts the honest floor never saw — and is the verification cause's
    doing, not a model difference. A verified prefix that still diverges (p <= alpha) keeps rule 2: a quantized
    engine that also skips verification is named for both.

    Returns:
        The plain clause ("its divergence sits after unverified tokens: ...") or None when the rule does not apply.
    """
    sg, lp = c.by.get(DetectorName.SELF_GREEDY), c.lp
    if sg is None or lp is None or not (c.rejects(DetectorName.SELF_GREEDY) and c.lp_sig):
        return None
    vp = (lp.details or {}).get("verified_prefix") or {}
    p, n = vp.get("p_value"), int(vp.get("n") or 0)
    if not (_unverified_shown(sg.details or {}) and vp.get("ran") and p is not None and n >= MIN_POSITIONS
            and float(p) > float(c.details["alpha"])):
        return None
    geo = vp.get("geometric_ratio")
    return (f"its divergence sits after unverified tokens: on the {n} positions before each response's first "
            f"unverified token the reported logprobs match the reference (logprob-divergence p={float(p):.3g}"
            + (f", geometric-mean KL {float(geo):.2f}x the honest floor" if geo is not None else "")
            + f"); the {int(vp.get('n_after_unverified') or 0)} positions at or after one continue from tokens the "
            "model did not choose")


def self_greedy_cause(c: RuleContext, *, divergence: str | None = None) -> Cause:
    """Rule 1: ``self-greedy`` rejects → DECODING_NONCOMPLIANT (``1-self-greedy``), or RELAXED_VERIFICATION when the
    contradictions are drafts never verified: tokens far below every top-1 (``1u-unverified-tokens``), localized in
    the reasoning span (``1s-reasoning-span``) or inside the streamed steps (``1d-unverified-drafts``).
    ``divergence``: :func:`divergence_after_unverified`'s clause, appended to rule 1u's reason."""
    r = c.by[DetectorName.SELF_GREEDY]
    d = r.details or {}
    n_unv, n_clear = int(d.get("n_unverified") or 0), int(d.get("n_clear") or 0)
    if _unverified_shown(d):
        pos = ", ".join(f"{u['prompt_id']}@{u['position']} ({u['gap']:.1f} nats)"
                        for u in list(d.get("unverified_positions") or [])[:4])
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            f"at temperature 0 the provider emitted {n_unv} tokens at least {d.get('unverified_gap_nats', 8.0):g} nats "
            f"below its own reported top-1 (and the reference's), of {n_clear} clear contradictions in {r.n} "
            f"positions (e.g. {pos}): tokens no decoding parameter picks — drafts accepted without strict "
            f"verification (e.g. speculative decoding with greedy requests batched beside sampled ones) "
            f"(self-greedy p_adj={r.p_adjusted:.3g})" + predictability_clause(
                c.speculation, chunks_are_steps=_steps_shown(d, float(c.details["alpha"])), only_flat=True)
            + (f"; logprob-divergence rejects (p_adj={_lp_p_adj(c)}), but {divergence}" if divergence else ""),
            "1u-unverified-tokens", [DetectorName.SELF_GREEDY],
            f"{n_unv} unverified greedy tokens, self-greedy p_adj={r.p_adjusted:.3g}",
        )
    if span_localized(d.get("spans"), float(c.details["alpha"])):  # issue 35: a rule that relaxes verification inside <think> only
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            f"at temperature 0 the emitted token contradicts the provider's own reported top-1 at "
            f"{int(r.statistic)} of {r.n} positions{span_clause(d.get('spans'))}: a verification rule that applies "
            f"between <think> and </think> only accepts non-argmax drafts there (relaxed MTP acceptance, "
            f"TensorRT-LLM #3865, ATOM #411) (self-greedy p_adj={r.p_adjusted:.3g})",
            "1s-reasoning-span", [DetectorName.SELF_GREEDY],
            f"greedy tokens not its own top-1 inside the reasoning span, self-greedy p_adj={r.p_adjusted:.3g}",
        )
    st = d.get("steps") or {}
    if _steps_shown(d, float(c.details["alpha"])):  # issue 35: synthetic acceptance
        share = int(st["final_positions"]) / max(int(st["positions"]), 1)
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            f"at temperature 0 the emitted token contradicts the provider's own reported top-1 at "
            f"{int(r.statistic)} of {r.n} positions, and of the {int(st['clear'])} clear contradictions in streamed "
            f"answers only {int(st['clear_final'])} fall on the last token of a streamed step where {share:.0%} of the "
            f"positions are (binomial p={float(st['p_value']):.2g}): the departures are tokens inside each "
            f"speculative step, never the target's own token that closes it — drafts emitted without verification "
            f"(synthetic acceptance: vLLM rejection_sample_method=synthetic, SGLANG_SIMULATE_ACC_LEN, TensorRT-LLM "
            f"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS) (self-greedy p_adj={r.p_adjusted:.3g})"
            + predictability_clause(c.speculation, chunks_are_steps=True),
            "1d-unverified-drafts", [DetectorName.SELF_GREEDY],
            f"greedy tokens not its own top-1 inside the streamed steps only, self-greedy p_adj={r.p_adjusted:.3g}",
        )
    return c.cause(
        VerdictKind.DECODING_NONCOMPLIANT,
        f"at temperature 0 the emitted token contradicts the provider's own reported top-1 at "
        f"{int(r.statistic)} of {r.n} positions by more than the {r.details.get('band', float('nan')):.3g}-nat "
        f"noise band: the greedy path does not follow the request (e.g. a default repetition penalty applied "
        f"before the pick) (self-greedy p_adj={r.p_adjusted:.3g})",
        "1-self-greedy", [DetectorName.SELF_GREEDY], f"greedy tokens are not its own top-1, self-greedy p_adj={r.p_adjusted:.3g}",
    )


def _lp_p_adj(c: RuleContext) -> str:
    lp = c.lp
    return f"{lp.p_adjusted:.3g}" if lp is not None and lp.p_adjusted is not None else "?"


def _steps_shown(d: Mapping[str, Any], alpha: float) -> bool:
    """Rule 1d's test on self-greedy's details ``d``: its clear contradictions avoid the last token of the streamed
    steps (``d["steps"]``, one-sided binomial p <= ``alpha``) — which also shows the stream's chunks end at the
    target's own token, i.e. are verification steps."""
    st = d.get("steps") or {}
    return bool(st.get("clear")) and float(st.get("p_value", 1.0)) <= alpha


def near_tie_cause(c: RuleContext) -> Cause:
    """Rule 3n: ``greedy-near-tie`` rejects → RELAXED_VERIFICATION; QUANTIZATION when most flips are the
    provider's own reported top-1 (``3n-model``); the undetermined pair when no flip came with the provider's
    own top_logprobs (``3n-model-or-verification``)."""
    r = c.by[DetectorName.GREEDY_NEAR_TIE]
    if 2 * int((d := r.details or {}).get("flips_own_top1") or 0) > int(d.get("flips_with_provider_list") or 0) > 0:
        return c.cause(VerdictKind.QUANTIZATION, near_tie_reason(r, own=True), "3n-model", [DetectorName.GREEDY_NEAR_TIE],
                       f"near-ties flipped by the served model, greedy-near-tie p_adj={r.p_adjusted:.3g}")
    if near_tie_blind(r):
        return c.cause(VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION, near_tie_reason(r, blind=True),
                       "3n-model-or-verification", [DetectorName.GREEDY_NEAR_TIE],
                       f"near-ties flipped, quantization or lossy verification, greedy-near-tie "
                       f"p_adj={r.p_adjusted:.3g}", established=False)
    return c.cause(VerdictKind.RELAXED_VERIFICATION, near_tie_reason(r), "3n-greedy-near-tie",
                   [DetectorName.GREEDY_NEAR_TIE], f"near-ties flipped, greedy-near-tie p_adj={r.p_adjusted:.3g}")


def sampling_cause(c: RuleContext, *, reference: bool, record_shape: bool = False) -> Cause | None:
    """Rule 4 on the sampling tests (``reference=False``: only the provider-self tests)."""
    by, rejects = c.by, c.rejects
    arg_names, tail_names, gof_names = (_sampling_tests(t, reference=reference)
                                        for t in (TestKind.ARGMAX, TestKind.TAIL, TestKind.PIT))
    arg_sig = any(rejects(k) for k in arg_names)
    tail_sig = any(rejects(k) for k in tail_names)
    gof_sig = any(rejects(k) for k in gof_names)
    if not (arg_sig or tail_sig or gof_sig):
        return None
    a = _pick(by, *arg_names)
    t = _pick(by, *tail_names)
    excess = float((a.details or {}).get("excess_per_position", 0.0)) if a is not None else 0.0
    arate = float((a.details or {}).get("argmax_rate", 0.0)) if a is not None else 0.0
    tratio = float((t.details or {}).get("tail_ratio", 1.0)) if t is not None else 1.0
    deficit = float((t.details or {}).get("deficit_per_position", 0.0)) if t is not None else 0.0
    em = emission_cause(t) if tail_sig else None
    if record_shape:
        c.details["shape"] = {"argmax_excess_per_position": excess, "argmax_rate": arate, "tail_ratio": tratio,
                              "tail_deficit_per_position": deficit, **({"emission": em.confidence} if em else {})}
    rej = [k for k in arg_names + tail_names + gof_names if rejects(k)]
    if arg_sig and arate >= GREEDY_SERVED_MIN_ARGMAX_RATE:
        return c.cause(
            VerdictKind.DECODING_NONCOMPLIANT,
            f"sampling requests were served greedily: the argmax was emitted at {arate:.1%} of sampled "
            f"positions ({p_adjusted_text(by, arg_names)})", "4a-greedy-served", rej, f"sampled greedily, {p_adjusted_text(by, arg_names)}")
    if em is not None and record_shape:  # emission models decide (issue 14 item 5); else the shape ratio
        c.details["cause_confidence"] = em.confidence
    shape_trunc = tratio <= TAIL_MISSING_MAX_RATIO or deficit >= TRUNCATION_SHAPE_RATIO * max(excess, 0.0)
    em_text = f"; {em.text}" if em else ""
    if tail_sig and em is not None and not em.decisive and (em.truncation or arg_sig):
        return sampler_undetermined(
            c, f"the sampled tokens deviate from the distribution: only {tratio:.0%} of the expected "
            f"low-probability-tail emissions, argmax excess {excess:.3g}/position ({p_adjusted_text(by, rej)}){em_text}",
            rej, "the emission models' margin is below the one that decides")
    if tail_sig and (em.truncation if em is not None else shape_trunc):
        return c.cause(
            VerdictKind.DECODING_NONCOMPLIANT,
            f"sampled tokens follow a truncated distribution nobody asked for: only {tratio:.0%} of the "
            f"expected low-probability-tail emissions (deficit {deficit:.3g}/position vs argmax excess "
            f"{excess:.3g}/position; {p_adjusted_text(by, tail_names)}"
            f"{em_text}) — a server-side top-k / top-p / min-p default",
            "4b-truncated", rej, f"sampling truncated, {tratio:.0%} of the tail, {p_adjusted_text(by, tail_names)}")
    if arg_sig:
        what = (f"sampled tokens over-emit the argmax by {excess:.3g} per position (rate {arate:.1%}) with the "
                f"tail {'intact' if tratio > 0.8 else 'only partly thinned'} ({tratio:.0%} of expected{em_text})")
        if c.no_speculation:
            return sampler_undetermined(c, f"{what} ({p_adjusted_text(by, arg_names)})", rej,
                                         speculation_clause(c.speculation))
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            f"{what}: the signature of lossy speculative acceptance ({p_adjusted_text(by, arg_names)})",
            "4c-relaxed", rej, f"argmax over-emitted, {p_adjusted_text(by, arg_names)}")
    self_sig = any(rejects(k) for k in SELF_SAMPLING_DETECTORS)
    # issue 35: with a reference the self-* tests do not run, so sampling-gof carries the sampled tokens tested
    # against the provider's own reported distribution; tokens that contradict it are no weight cause's doing
    own = sampled_self_contradiction(by.get(DetectorName.SAMPLING_GOF)) if not self_sig else None
    if record_shape and own is not None:
        c.details["shape"]["sampled_self_p"] = float(own["p_value"])
    if c.lp_consistent or self_sig or own is not None or excess > 0:
        what = (f"sampled tokens do not follow the distribution the provider reports "
                f"({p_adjusted_text(by, gof_names + tail_names)}); argmax excess {excess:.3g}/position"
                + (f"; {sampled_self_text(own)}" if own is not None else ""))
        if c.no_speculation:
            return sampler_undetermined(c, what, rej, speculation_clause(c.speculation))
        return c.cause(VerdictKind.RELAXED_VERIFICATION, what, "4d-relaxed", rej,
                       p_adjusted_text(by, gof_names + tail_names)
                       + (f", own-distribution {own_short(own)}" if own is not None else ""))
    return sampled_model_cause(c, rej, p_adjusted_text(by, gof_names + tail_names))


def sampler_undetermined(c: RuleContext, what: str, rej: Sequence[str], why: str) -> Cause:
    """Rule ``4-mechanism-undetermined``: the sampled tokens deviate, but the evidence does not establish whether
    lossy speculative acceptance or a server-side truncation is the cause (``why``: the emission models'
    margin is below DECISIVE_EMISSION_MARGIN, or the speculation fingerprint saw no speculation) →
    RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT (issue 37 item 8)."""
    return c.cause(
        VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT,
        f"{what}: lossy speculative acceptance or a server-side top-k / top-p / min-p nobody asked for, but not "
        f"established which — {why}; {DECIDES_SAMPLER}",
        "4-mechanism-undetermined", rej,
        f"sampler deviates, relaxed acceptance or truncation undetermined, {p_adjusted_text(c.by, rej)}",
        established=False)


def preflight_cause(c: RuleContext, name: str) -> Cause:
    """Rule 6: the pre-flight check ``name`` rejects → DECODING_NONCOMPLIANT (the rule the registry names), or
    RELAXED_VERIFICATION when the greedy-top1 check's contradictions sit in the reasoning span (``6s``)."""
    r = c.by[name]
    d = r.details or {}
    if name == "preflight-greedy-top1":
        text = (f"pre-flight: at temperature 0 the provider emitted a token other than its own reported top-1 at "
                f"{int(r.statistic)} of {r.n} positions")
        if span_localized(d.get("spans"), float(c.details["alpha"])):  # rule 1s on the pre-flight's answers
            return c.cause(VerdictKind.RELAXED_VERIFICATION,
                           f"{text}{span_clause(d.get('spans'))}: a verification rule that applies between <think> "
                           f"and </think> only accepts non-argmax drafts there (relaxed MTP acceptance, TensorRT-LLM "
                           f"#3865, ATOM #411) ({name} p_adj={r.p_adjusted:.3g})",
                           "6s-preflight-reasoning-span", [name], f"{name} p_adj={r.p_adjusted:.3g}, reasoning span")
        text += ": its greedy path does not follow the request"
    else:
        text = (f"pre-flight: with temperature 1 and top_p=1 the sampled tokens fell among the provider's own "
                f"least likely tokens {int(r.statistic)} times where {d.get('expected', float('nan')):.1f} were "
                f"expected from its reported probabilities: the server applies its own top-k / top-p / min-p "
                f"nobody asked for")
    return c.cause(VerdictKind.DECODING_NONCOMPLIANT, f"{text} ({name} p_adj={r.p_adjusted:.3g})",
                   PREFLIGHT_CHECKS[name].rule, [name], f"{name} p_adj={r.p_adjusted:.3g}")


def preflight_primary_cause(c: RuleContext) -> Cause | None:
    """Rule 6 as the primary cause: the first rejecting pre-flight check (registry order), or None. A top-p
    rejection while the speculation fingerprint saw speculation is the undetermined sampler pair
    (:func:`sampler_undetermined`): lossy acceptance thins the tail as a truncation does."""
    by, rejects = c.by, c.rejects
    for name in PREFLIGHT_CHECKS:
        if rejects(name):
            if name == "preflight-top-p" and (c.speculation or {}).get("detected") is True:
                r = by[name]
                return sampler_undetermined(
                    c, f"pre-flight: with temperature 1 and top_p=1 the sampled tokens fell among the provider's own "
                    f"least likely tokens {int(r.statistic)} times where "
                    f"{float((r.details or {}).get('expected') or math.nan):.1f} were expected ({name} "
                    f"p_adj={r.p_adjusted:.3g})", [name],
                    f"{speculation_clause(c.speculation)}, and lossy acceptance thins the tail as a truncation does")
            return preflight_cause(c, name)
    return None


def _pick(by: dict[str, DetectorResult], *names: str) -> DetectorResult | None:
    """The first of ``names`` that ran, or None."""
    for k in names:
        r = by.get(k)
        if r is not None and r.ran:
            return r
    return None


def _sampling_tests(test: TestKind, *, reference: bool) -> tuple[str, ...]:
    """The sampling tests of kind ``test`` in registry order (reference ``sampling-*`` before ``self-*``);
    only the provider-self ones when ``reference`` is False."""
    return tuple(str(n) for n in detectors_where(test=test, needs_reference=None if reference else False))

