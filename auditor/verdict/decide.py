"""Verdict: Holm across one audit's detectors, then decision rules that name the cause.

``decide_verdict(results, alpha)`` returns a :class:`Verdict` — one of PASS, QUANTIZATION,
RELAXED_VERIFICATION, SUBSTITUTION, QUANTIZATION_OR_SUBSTITUTION, QUANTIZATION_OR_RELAXED_VERIFICATION,
DECODING_NONCOMPLIANT, INCONCLUSIVE —
with a one-line reason and JSON-able details. This module applies the rules; they live in
:mod:`auditor.verdict.model_rules` (the model side: rules 2, 3, 3h, 3h-logprob, 4d's model branch, 2t) and
:mod:`auditor.verdict.verification_rules` (the verification side: rules 1, 3n, 4, 6), with their thresholds; what a
verdict is (``VerdictKind``, ``Verdict``, ``EXIT_CODES``, ``UNDETERMINED_CAUSES``) in :mod:`auditor.verdict.kinds`.
The rules (also in docs/detectors.md), applied in order, where "rejects" means the detector ran and its Holm-adjusted
p-value is <= alpha:

0. No detector ran → INCONCLUSIVE (with the budget that would suffice).
1. ``self-greedy`` rejects (T=0 tokens contradict the provider's own reported top-1 by more than
   the noise band) and ``logprob-divergence`` does not → DECODING_NONCOMPLIANT. Never
   RELAXED_VERIFICATION: a relaxed greedy verification changes only near-ties (rule 3n), not
   clear margins — except (1u) when at least UNVERIFIED_MIN_TOKENS of them, and at least half of the
   clear contradictions, lie ``UNVERIFIED_GAP_NATS`` or more below the provider's own top-1 and the
   reference's (``details["n_unverified"]`` of self-greedy): tokens no decoding parameter picks are
   drafts that were never verified → RELAXED_VERIFICATION, rule ``1u-unverified-tokens``, the
   positions named (issue 40 item 3: a real vLLM with ngram speculation, greedy requests batched
   with sampled ones). 1u decides before rule 2 also when ``logprob-divergence`` rejects but its test on the
   positions before each response's first unverified token (``details["verified_prefix"]`` of logprob-divergence,
   :func:`auditor.check.run_detectors.verified_prefix`: a cause feature outside the Holm family) ran on at least
   MIN_POSITIONS positions with p > alpha: the divergence sits where the responses continue from unverified tokens,
   contexts the honest floor never saw, so the finding is marked ``explained_by`` RELAXED_VERIFICATION
   (:func:`auditor.verdict.verification_rules.divergence_after_unverified`); a verified prefix that still diverges
   keeps rule 2 with 1u as a secondary cause (a quantized engine that also skips verification) — or (1s) when a reasoning model's contradictions sit in its reasoning span and
   not in its answer (the answer's within their honest expectation, and the reasoning span's rate higher
   by a one-sided Fisher exact test at alpha, ``verdict_cause.span_localized``): a rule that applies only
   between <think> and </think> is a verification rule (relaxed MTP acceptance inside the reasoning
   span, TensorRT-LLM #3865, ATOM #411) → RELAXED_VERIFICATION "inside the reasoning span",
   rule ``1s-reasoning-span`` (``6s-preflight-reasoning-span`` when the pre-flight's greedy-top1 check, rule 6,
   is what shows it) — or (1d) when the clear contradictions avoid the last token of the streamed steps
   (self-greedy ``details["steps"]``: fewer at a chunk's last token than the chunk-final positions' share
   predicts, one-sided exact binomial p <= alpha): a decoding parameter acts on every pick, and under
   verification its departures end a step; departures only inside the steps are drafts emitted before
   the target's own token without being verified (synthetic acceptance: vLLM ``rejection_sample_method:
   synthetic``, SGLang ``SGLANG_SIMULATE_ACC_LEN``) → RELAXED_VERIFICATION, rule ``1d-unverified-drafts``; its reason
   quotes the speculation fingerprint's accepted length per streamed step on repetition against other prompts
   (``details["speculation"]["by_predictability"]``, :func:`auditor.verdict.cause.predictability_clause`): a
   verifier's grows with predictability, synthetic acceptance's does not (1u quotes it too when flat).
2. ``logprob-divergence`` rejects → SUBSTITUTION when the provider's top-1 leaves the reference
   argmax at positions where the reference is confident far more often than a quantization-like
   (isotropic) logit perturbation of the audit's own measured scale explains
   (``confident_flip_ratio`` > SUBSTITUTION_MIN_FLIP_RATIO, calibrated on the quantized
   profiles). Otherwise QUANTIZATION_OR_SUBSTITUTION when the divergence is beyond the range the flip
   test was calibrated on (mean bucketed KL >= SUBSTITUTION_MIN_MEAN_KL *and* top-1 agreement <=
   SUBSTITUTION_MAX_TOP1_AGREEMENT: 3-bit weights and a layer-pruned model both land there, with
   the same KL, top-1 and flip ratios on SmolLM2-135M, docs/calibration.md), else QUANTIZATION. The flip ratio
   measured along the reference's own continuations through echo (``reference_path_flip_ratio``,
   :mod:`auditor.check.reference_path`) decides instead of the provider-path one whenever it is
   informative (:mod:`auditor.verdict.cause`); ``details["cause_confidence"]`` carries the
   statistic, its path, the threshold and their log ratio.
3. ``greedy-match`` rejects → DECODING_NONCOMPLIANT when the provider's logprobs were tested and
   match the reference (logprob-divergence ran, did not reject, ratio to floor <=
   LOGPROBS_CONSISTENT_MAX_RATIO): the served tokens are not the argmax of the distribution it
   reports. Otherwise QUANTIZATION_OR_SUBSTITUTION when the clear-mismatch rate >=
   SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE (a greedy mismatch rate alone cannot tell 3-bit weights from
   another model), else QUANTIZATION.
3h. ``greedy-heterogeneity`` rejects (a per-request scan: some requests mismatch, the pool does not)
   → the rule-3 cause on the outlying requests' clear-mismatch rate: part of the traffic is served
   differently (a mixture such as load-dependent routing to a cheaper replica).
3h-logprob. ``logprob-heterogeneity`` rejects (a per-request scan of the logprob divergence; issue 37 item 4)
   → QUANTIZATION, or QUANTIZATION_OR_SUBSTITUTION when the outlying requests' mean KL is at least
   SUBSTITUTION_MIN_MEAN_KL: a minority of requests reports another distribution.
3n. ``greedy-near-tie`` rejects (greedy-match does not): at T=0 the reference's runner-up is emitted at
   near-ties (margin within the band) more often than honest numeric noise can flip them →
   RELAXED_VERIFICATION (greedy speculative verification accepts non-argmax drafts), unless most flips
   are the provider's own reported top-1 (``3n-model``: its logits differ → QUANTIZATION), or none of the
   flips came with the provider's own top_logprobs (``3n-model-or-verification``: a quantized model moves
   near-ties too, and only its own list tells the two apart → QUANTIZATION_OR_RELAXED_VERIFICATION, the
   undetermined pair; a decisive audit needs the provider's logprobs, or the sampling suite). Rules 1-3h
   come first (a decode-path difference, a quantized or mixed model also moves near-ties), so 3n is
   never a secondary cause of them; it becomes one only under provider failures or rule 2t.
4. A sampling test rejects (reference ``sampling-*`` or, without a reference, ``self-*``):
   a. argmax over-emission rejects and the argmax was emitted at >= GREEDY_SERVED_MIN_ARGMAX_RATE
      of sampled positions → DECODING_NONCOMPLIANT (sampling request served greedily).
   b. tail deficit rejects and truncation explains the sampled tokens better than lossy acceptance
      (:mod:`auditor.detectors.emission`: maximum-likelihood top-p / min-p / top-k laws against typical /
      pro-rata acceptance, log-likelihood ratio > 0; results without the fit: the shape ratio below) →
      DECODING_NONCOMPLIANT (truncated sampling nobody asked for).
   c. argmax over-emission rejects (tail intact or only partly thinned) → RELAXED_VERIFICATION.
   d. only the PIT (or a partial tail) rejects: RELAXED_VERIFICATION when the provider's logprobs
      are consistent with the reference or a self-test rejects (the samples do not follow the
      distribution the provider reports) or the argmax excess is positive — with a reference the
      self-tests do not run, so ``sampling-gof`` records the same test on its sampled positions as a cause
      feature (``details["sampled_self"]``): p <= SAMPLED_SELF_TEST_LEVEL counts as a self-test rejection
      (issue 35: unverified drafts on the ``verification`` suite were named QUANTIZATION; a model, quantized or
      not, samples from the distribution it reports); otherwise the sampled
      distribution is another model's: SUBSTITUTION when rule 2's flip statistic, measured on the
      sampled positions' reported top_logprobs (``sampling-gof`` ``details["sampled_path"]``), is
      informative and significantly above SUBSTITUTION_MIN_FLIP_RATIO (``verdict_cause``), else QUANTIZATION;
      but QUANTIZATION_OR_SUBSTITUTION (``4d-model-deviation``) whenever that statistic's logit-noise scale σ̂
      exceeds SAMPLED_FLIP_MAX_SIGMA, the range the flip test was calibrated on (production quantization).
5. Nothing rejects → PASS when every power family that ran (POWER_FAMILIES: model = greedy-match
   or logprob-divergence; acceptance = sampling-/self-argmax; truncation = sampling-/self-tail;
   decode-path = self-greedy) has a detector with DEFAULT_POWER against its target effect
   (POWER_TARGETS) at the audit's sample size (Bonferroni level alpha/m, m = tests that ran);
   else INCONCLUSIVE with the extra tokens that would suffice. Families that did not run are
   named as "not tested" in the reason (a provider is audited with what it offers).
   PASS and INCONCLUSIVE also record ``details["rules_out"]`` (``auditor.verdict.rules_out``): per deviation
   class of the calibration (int4, int8, fp8, kv-fp8, w8a8, relaxed acceptance at s, truncation,
   substitution) whether some detector that ran had RULE_OUT_POWER (95%) against its measured
   effect; a PASS reason ends with "rules out ...; does not rule out ... (power ...)". Under a model card
   the precision classes are the steps below it (``decide_verdict(card_bits=...)``). This does not
   change the verdict (``--budget-tokens auto`` requires it, ``auditor.check.auto_budget``).
6. A pre-flight parameter check (``auditor.check.preflight``; ``preflight-*`` results in the same Holm
   family) rejects: ``preflight-greedy-top1`` (temperature-0 tokens are not the provider's own
   top-1) or ``preflight-top-p`` (at temperature 1 with ``top_p = 1`` the sampled tokens miss the
   provider's own low-probability region: a server-side top-k / top-p / min-p) →
   DECODING_NONCOMPLIANT. Pre-flight results never count towards the power check. A pre-flight rejection that an
   established cause reads with more information is explained by it, not a cause of its own: ``preflight-top-p``
   by a rule-4 sampler cause, ``preflight-greedy-top1`` by the RELAXED_VERIFICATION of rules 1u / 1s / 1d (the same
   greedy departures, placed by gap, span or streamed step; the pre-flight's answers carry no steps).
2t. ``tokenizer_mismatch`` (keyword, below) establishes another tokenizer → SUBSTITUTION, whatever
   the rules above decided (applied last; the previous verdict becomes a secondary cause).
Every other rejecting detector is listed under details["findings"] with its implication (the
registry's, ``auditor.detectors``).

Every cause, not just the first: ``details["secondary_causes"]`` lists each other cause that its
own tests establish at the same family-wise alpha (each with its rule, reason and deciding
detectors): the decode path (self-greedy, preflight-greedy-top1) and the sampler (rule 4, or
preflight-top-p) next to a logprob divergence. When the primary cause is a model difference
(rules 2 and 3 without consistent logprobs) only the reference-free ``self-*`` sampling tests may
add a sampling cause, since the reference sampling tests are confounded by the model difference —
unless the divergence is mild (at most MILD_DIVERGENCE_MAX_RATIO x the floor with top-1 agreement
>= MILD_DIVERGENCE_MIN_TOP1), where the reference still describes the served distribution closely.

Context that overrides the rules (keyword arguments of :func:`decide_verdict`):

- ``provider_failures``: when more than MAX_PROVIDER_FAILURE_SHARE of the probes failed, the
  verdict is INCONCLUSIVE with reason "provider failures" and the failure kinds (rule
  ``0-provider-failures``); the causes found in the probes that did succeed move to
  ``secondary_causes``. More tokens would fail the same way, so no budget is suggested.
- ``template_mismatch``: the provider's ``usage.prompt_tokens`` differs from the reference's
  rendering of the same prompt (another chat template, an injected system prompt). The
  reference-based detectors then compare different contexts, so they are set aside (not run,
  reason named) and only the reference-free tests decide; the reason says so. A template
  difference is never turned into QUANTIZATION or SUBSTITUTION.
- ``tokenizer_mismatch``: the provider's tokens prove another tokenizer than the claimed model's
  (``auditor.check.evidence.tokenizer_mismatch``; passed only when the reference's tokenizer is the
  claimed one) → SUBSTITUTION, rule ``2t-tokenizer``, with ``details["tokenizer_mismatch"]`` and
  ``details["previous_verdict"]``; the previous verdict (unless PASS, INCONCLUSIVE, SUBSTITUTION or
  QUANTIZATION_OR_SUBSTITUTION, which the tokenizer resolves) is listed first under ``secondary_causes``.
The substitution/shape thresholds are named constants to be calibrated on the simulator's
``substituted``, ``relaxed-threshold`` and truncation profiles (issue 7).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from auditor.detectors import PREFLIGHT_CHECKS, REFERENCE_DETECTORS, DetectorName, Mode, detectors_where
from auditor.detectors.base import DetectorResult
from auditor.detectors.noise_floor import NoiseFloor
from auditor.detectors.speculation import accepted_by_predictability
from auditor.detectors.stats import holm
from auditor.util import finite as _f
from auditor.util import json_safe
from auditor.verdict.cause import (
    blind_near_tie_note,
    explained_by_decode_path,
    failure_summary,
    implication,
    set_aside,
    template_note,
)
from auditor.verdict.kinds import UNDETERMINED_CAUSES, Cause, RuleContext, Verdict, VerdictKind
from auditor.verdict.model_rules import (
    greedy_match_cause,
    logprob_cause,
    logprob_mixture_cause,
    mild_divergence,
    mixture_cause,
    tokenizer_substitution,
)
from auditor.verdict.power import DEFAULT_POWER, _budget
from auditor.verdict.rules_out import RULE_OUT_POWER, EffectSizes, rules_out, rules_out_sentence
from auditor.verdict.verification_rules import (
    divergence_after_unverified,
    near_tie_cause,
    preflight_cause,
    preflight_primary_cause,
    sampling_cause,
    self_greedy_cause,
)

__all__ = ["DEFAULT_ALPHA", "MAX_PROVIDER_FAILURE_SHARE", "apply_holm", "decide_verdict"]

DEFAULT_ALPHA = 0.05

#: Share of failed probes above which the audit is INCONCLUSIVE ("provider failures", issue 13):
#: failures select (long generations fail more often), so the rest is not a fair sample.
MAX_PROVIDER_FAILURE_SHARE = 0.10

# Which detectors compare with the reference (REFERENCE_DETECTORS, set aside on a template mismatch),
# the sampling tests of each kind, the pre-flight checks with the rule each decides
# (PREFLIGHT_CHECKS) and every implication are the registry's (auditor.detectors).


def apply_holm(results: Sequence[DetectorResult]) -> list[DetectorResult]:
    """Copies of results with ``p_adjusted`` = Holm across the detectors that ran (None otherwise)."""
    ps = [r.p_value if (r.ran and r.p_value is not None and not math.isnan(r.p_value)) else math.nan for r in results]
    adj = holm(ps)
    return [r.with_adjusted(None if math.isnan(a) else float(a)) for r, a in zip(results, adj, strict=True)]


# --------------------------------------------------------------------------- decision
def decide_verdict(
    results: Sequence[DetectorResult],
    alpha: float = DEFAULT_ALPHA,
    *,
    floor: NoiseFloor | None = None,
    power: float = DEFAULT_POWER,
    provider_failures: Mapping[str, Any] | None = None,
    template_mismatch: Mapping[str, object] | None = None,
    tokenizer_mismatch: Mapping[str, Any] | None = None,
    effect_sizes: EffectSizes | None = None,
    speculation: Mapping[str, Any] | None = None,
    card_bits: Mapping[str, int] | None = None,
    card_recipe: str | None = None,
    model: str | None = None,
) -> Verdict:
    """Apply Holm at family-wise level ``alpha`` across the detectors that ran, then the rules above.

    Args:
        results: one audit's DetectorResults (from ``auditor.detectors.run_detectors``, plus any
            ``preflight-*`` results from ``auditor.check.preflight``).
        alpha: overall (family-wise) significance level, in (0, 1).
        floor: the noise floor, used for the logprob power calculation.
        power: target power for the PASS/INCONCLUSIVE adequacy check.
        provider_failures: ``{"failed": int, "total": int, "kinds": {kind: count}}`` probes of the
            run (``auditor.check.preflight.provider_failures``); None = not known.
        template_mismatch: ``{"provider_prompt_tokens": int, "reference_prompt_tokens": int, ...}``
            when the provider renders prompts differently from the reference; None = same or unknown.
        tokenizer_mismatch: evidence that the provider uses another tokenizer than the claimed model's
            (``auditor.check.evidence.tokenizer_mismatch``: ``established``, ``foreign_tokens``, ``n_foreign``,
            ``n_foreign_distinct``, ``n_checked``, ``prompt_counts``, ``n_prompt_disagree``,
            ``n_prompt_checked``); pass it only when the reference's tokenizer is the claimed model's.
            None or empty = no such evidence.
        effect_sizes: the calibration's effect sizes per deviation class for ``details["rules_out"]``
            (default: the packaged table, ``auditor.verdict.rules_out.load_effect_sizes``).
        speculation: the audit's speculation fingerprint (``auditor.detectors.speculation.SpeculationEstimate
            .to_dict()``: ``detected`` True / False / None, ``mean_accepted_tokens_per_step``, ...); None = not
            measured. ``detected`` False (no speculation seen) keeps rule 4 from naming RELAXED_VERIFICATION (the
            undetermined pair instead); ``detected`` True makes a pre-flight top-p rejection alone the pair.
        card_bits, card_recipe, model: the model card the reference computes (``ModelCard.component_bits``, its
            ``recipe``) and the reference model: ``details["rules_out"]`` lists the precision classes below the card,
            with the effects measured under it where the table has them (``auditor.verdict.rules_out.classes_for_card``);
            None = the float32 reference.

    Returns:
        Verdict (``results`` carries the Holm-adjusted copies; ``details["secondary_causes"]``
        every other established cause; ``details["rules_out"]`` on PASS and INCONCLUSIVE, except
        on provider failures: per deviation class whether the audit had RULE_OUT_POWER against its
        measured effect, ``auditor.verdict.rules_out``; a PASS reason ends with the rules-out sentence;
        ``details["cause_established"]`` on a deviation verdict: False for QUANTIZATION_OR_SUBSTITUTION and
        for a QUANTIZATION named as the milder cause, whose flips do not rule out another model — what
        ``--budget-tokens auto --resolve-cause`` probes on for).

    Raises:
        auditor.verdict.rules_out.EffectSizesError: the packaged effect-size table is malformed.

    Raises:
        ValueError: if alpha or power is outside (0, 1), or two results share a name.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    names = [r.name for r in results]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate detector names in results: {names}")
    if template_mismatch:
        results = [set_aside(r, template_mismatch) if r.name in REFERENCE_DETECTORS and r.ran else r for r in results]
    adj = apply_holm(results)
    by = {r.name: r for r in adj}
    ran = [r for r in adj if r.ran and r.p_adjusted is not None]

    def rejects(name: str) -> bool:
        r = by.get(name)
        return bool(r is not None and r.ran and r.p_adjusted is not None and r.p_adjusted <= alpha)

    def det(r: DetectorResult) -> dict[str, Any]:
        return {
            "ran": r.ran,
            "p_value": _f(r.p_value),
            "p_adjusted": _f(r.p_adjusted),
            "statistic": _f(r.statistic),
            "effect": _f(r.effect),
            "effect_ci": [_f(r.effect_ci[0]), _f(r.effect_ci[1])] if r.effect_ci else None,
            "n": r.n,
            "rejects": rejects(r.name),
            "reason": r.reason,
        }

    details: dict[str, Any] = {
        "alpha": alpha,
        "n_tests": len(ran),
        "detectors": {r.name: det(r) for r in adj},
        "ran": [r.name for r in ran],
        "not_run": {r.name: r.reason for r in adj if not r.ran},
    }
    details["findings"] = [
        {"detector": r.name, "p_adjusted": r.p_adjusted,
         "implication": implication(r.name) + explained_by_decode_path(r.name, rejects) + blind_near_tie_note(r)}
        for r in ran
        if rejects(r.name)
    ]
    if template_mismatch:
        details["template_mismatch"] = dict(template_mismatch)
    if speculation is not None:
        details["speculation"] = {k: speculation.get(k) for k in ("detected", "mean_accepted_tokens_per_step", "ci95")}
        details["speculation"]["by_predictability"] = accepted_by_predictability(speculation)  # issue 35 item 3
    ctx = RuleContext(by, rejects, details, speculation)
    explained_divergence = divergence_after_unverified(ctx)
    lp_res = by.get(DetectorName.LOGPROB_DIVERGENCE)
    if lp_res is not None and (vp := (lp_res.details or {}).get("verified_prefix")):
        details["verified_prefix"] = {**vp, "explains_divergence": explained_divergence is not None}
    cause = _primary_cause(ctx, explained_divergence)
    n_power = max(1, sum(1 for r in ran if r.name not in PREFLIGHT_CHECKS))
    if cause is None:
        cause = _no_rejection(adj, alpha, power, floor, details, n_power)
    elif any(r.ran and r.p_adjusted is not None for r in adj):
        # a deviation was found: still record each family's power, so that the buyer's other
        # question (auditor.verdict.questions) can be answered; no budget is suggested for a rejection
        scratch: dict[str, Any] = {}
        _budget(adj, alpha, power, floor, scratch, n_tests=n_power)
        details["power"], details["power_families"] = scratch["power"], scratch["power_families"]
    secondary = [c for c in _other_causes(ctx, cause) if c.rule != cause.rule]
    _explain_findings(details["findings"], cause, secondary, rejects, explained_divergence)
    fail = failure_summary(provider_failures)
    if fail is not None:
        details["provider_failures"] = fail
    if fail is not None and fail["share"] > MAX_PROVIDER_FAILURE_SHARE:
        if cause.kind not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE):
            secondary.insert(0, cause)
        kinds = ", ".join(f"{k} {v}" for k, v in fail["kinds"].items()) or "unknown"
        found = "; in the probes that succeeded: " + ", ".join(str(c.kind) for c in secondary) if secondary else ""
        cause = Cause(
            VerdictKind.INCONCLUSIVE,
            f"provider failures: {fail['failed']} of {fail['total']} probes ({fail['share']:.0%}) failed ({kinds}); "
            f"the rest is not a fair sample and more tokens would fail the same way — fix the provider (or lower "
            f"its concurrency) and audit again{found}",
            "0-provider-failures",
        )
        details["suggested_budget_tokens"] = None
    if cause.kind in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE) and cause.rule != "0-provider-failures":
        ro = rules_out(adj, alpha=alpha, n_tests=n_power, floor=floor, effect_sizes=effect_sizes, card_bits=card_bits,
                       card_recipe=card_recipe, model=model)
        details["rules_out"] = [r.to_dict() for r in ro]
        sentence = rules_out_sentence(ro)
        if cause.kind == VerdictKind.PASS and sentence:
            cause = replace(cause, reason=f"{cause.reason}; {sentence} (at {RULE_OUT_POWER:.0%} power against the "
                            "calibrated effect sizes)")
    if template_mismatch:
        cause = replace(cause, reason=cause.reason + "; " + template_note(template_mismatch))
    details["secondary_causes"] = [c.to_dict() for c in secondary]
    details["rule"] = cause.rule
    if cause.kind not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE):
        details["cause_established"] = cause.established and cause.kind not in UNDETERMINED_CAUSES
    reason = cause.reason
    if secondary:
        reason += "; also " + "; ".join(f"{c.kind} ({c.short})" for c in secondary)
    verdict = Verdict(str(cause.kind), reason, cast(dict[str, Any], json_safe(details)), adj)
    return tokenizer_substitution(verdict, tokenizer_mismatch) if tokenizer_mismatch else verdict


def _primary_cause(c: RuleContext, explained_divergence: str | None = None) -> Cause | None:
    """Rules 1-4 and 6 in order (the first that fires), or None when nothing rejects. ``explained_divergence``:
    :func:`auditor.verdict.verification_rules.divergence_after_unverified`'s clause (rule 1u before rule 2)."""
    rejects = c.rejects
    c.details["logprobs_consistent"] = c.lp_consistent
    if rejects(DetectorName.SELF_GREEDY) and not c.lp_sig:
        return self_greedy_cause(c)
    if explained_divergence is not None:
        return self_greedy_cause(c, divergence=explained_divergence)
    if c.lp_sig:
        return logprob_cause(c)
    if rejects(DetectorName.GREEDY_MATCH):
        return greedy_match_cause(c)
    if rejects(DetectorName.GREEDY_HETEROGENEITY):
        return mixture_cause(c)
    if rejects(DetectorName.LOGPROB_HETEROGENEITY):
        return logprob_mixture_cause(c)
    if rejects(DetectorName.GREEDY_NEAR_TIE):
        return near_tie_cause(c)
    s = sampling_cause(c, reference=True, record_shape=True)
    if s is not None:
        return s
    return preflight_primary_cause(c)


def _other_causes(c: RuleContext, primary: Cause) -> list[Cause]:
    """Every cause other than the primary that its own tests establish (see the module docstring)."""
    if primary.kind in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE):
        return []
    out: list[Cause] = []
    if c.rejects(DetectorName.SELF_GREEDY) and primary.rule not in ("1-self-greedy", "1u-unverified-tokens",
                                                                    "1s-reasoning-span", "1d-unverified-drafts"):
        out.append(self_greedy_cause(c))
    if not primary.rule.startswith("4"):
        s = sampling_cause(c, reference=c.lp_consistent or mild_divergence(c))
        if s is not None:
            out.append(s)
    for name in PREFLIGHT_CHECKS:
        if c.rejects(name) and _preflight_explainer(name, primary, out) is None:
            out.append(preflight_cause(c, name))
    return out


def _sampler_cause(primary: Cause, secondary: Sequence[Cause]) -> Cause | None:
    """The rule-4 cause established for the sampled tokens that the pre-flight top-p check cannot add to:
    RELAXED_VERIFICATION (the emission models prefer acceptance, or the argmax is over-emitted) or the
    undetermined pair. Both thin the tail the pre-flight reads, so its rejection is explained by that cause,
    not a separate DECODING_NONCOMPLIANT (issue 37 item 6)."""
    kinds = (VerdictKind.RELAXED_VERIFICATION, VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT)
    return next((x for x in (primary, *secondary) if x.rule.startswith("4") and x.kind in kinds), None)


def _unverified_greedy_cause(primary: Cause, secondary: Sequence[Cause]) -> Cause | None:
    """The RELAXED_VERIFICATION that ``self-greedy`` establishes (rules 1u, 1s, 1d: its greedy departures from
    the provider's own top-1 placed by gap, span or streamed step). The pre-flight greedy-top1 check reads the
    same departures on a few answers without that information (no stream steps, few positions per span), so
    its rejection is explained by that cause, not a separate DECODING_NONCOMPLIANT (issue 35, issue 37 item 6)."""
    return next((x for x in (primary, *secondary)
                 if x.kind == VerdictKind.RELAXED_VERIFICATION and DetectorName.SELF_GREEDY in x.deciding), None)


def _preflight_explainer(name: str, primary: Cause, secondary: Sequence[Cause]) -> Cause | None:
    """The established cause that explains pre-flight check ``name``'s rejection, or None: the sampler cause
    (:func:`_sampler_cause`) for ``preflight-top-p``, the unverified-greedy cause
    (:func:`_unverified_greedy_cause`) for ``preflight-greedy-top1``."""
    if name == "preflight-top-p":
        return _sampler_cause(primary, secondary)
    if name == "preflight-greedy-top1":
        return _unverified_greedy_cause(primary, secondary)
    return None


#: Primary-cause rules under which a greedy-near-tie rejection is part of the established cause's picture:
#: a decode-path difference, a quantized, other or mixed model also moves near-ties (rules 1-3h come first).
_NEAR_TIE_EXPLAINED = ("1-self-greedy", "2-", "3-", "3h-")  # 3h-logprob-mixture-* included


def _explain_findings(findings: list[dict[str, Any]], primary: Cause, secondary: Sequence[Cause],
                      rejects: Callable[[str], bool], explained_divergence: str | None = None) -> None:
    """Mark in place each finding that the established cause explains: ``explained_by`` (the verdict kind) and
    the implication says so, so that no report lists it as a separate cause (issue 37 item 6). A rejecting
    greedy-near-tie under a decode-path or model cause (rules 1-3h); the pre-flight top-p check under a rule-4
    RELAXED_VERIFICATION or the undetermined sampler pair (:func:`_sampler_cause`); the pre-flight greedy-top1
    check under the RELAXED_VERIFICATION self-greedy establishes (:func:`_unverified_greedy_cause`); the reference sampling tests
    under a model cause that no sampling cause claims (the reference's distribution is not the served one);
    the greedy findings the decode path explains (:func:`auditor.verdict.cause.explained_by_decode_path`); a
    logprob-divergence that rule 1u explains (``explained_divergence``, its verified prefix matches the reference)."""
    causes = (primary, *secondary)
    claimed = {n for x in causes for n in x.deciding}
    model = primary.kind in (VerdictKind.QUANTIZATION, VerdictKind.SUBSTITUTION,
                             VerdictKind.QUANTIZATION_OR_SUBSTITUTION) and primary.rule.startswith(("2-", "3"))
    ref_sampling = {str(n) for n in detectors_where(mode=Mode.SAMPLING, needs_reference=True)}
    for f in findings:
        name = str(f.get("detector"))
        by: VerdictKind | None = None
        why = ""
        if name in claimed:
            continue
        if explained_by_decode_path(name, rejects):
            by = VerdictKind.DECODING_NONCOMPLIANT
        elif (name == DetectorName.LOGPROB_DIVERGENCE and explained_divergence is not None
              and primary.rule == "1u-unverified-tokens"):
            by, why = primary.kind, explained_divergence
        elif name == DetectorName.GREEDY_NEAR_TIE and primary.rule.startswith(_NEAR_TIE_EXPLAINED):
            by, why = primary.kind, ("a decode path that differs and weights that differ (quantized, another or a "
                                     "mixed model) move near-ties too")
        elif (pre := _preflight_explainer(name, primary, secondary)) is not None:
            by, why = pre.kind, (
                "lossy acceptance thins the tail the pre-flight reads, as a truncation does" if name == "preflight-top-p"
                else f"the same greedy departures from the provider's own top-1 that rule {pre.rule} places, read on "
                "the pre-flight's few answers without their stream steps or spans")
        elif model and name in ref_sampling:
            by, why = primary.kind, "the reference's distribution is not the served one, so its sampling tests see the model difference"
        if by is None:
            continue
        f["explained_by"] = str(by)
        if why:
            f["implication"] = (f"{f.get('implication')}; here explained by the established cause ({by}: {why}), "
                                "not a separate cause")


def _no_rejection(adj: Sequence[DetectorResult], alpha: float, power: float, floor: NoiseFloor | None,
                  details: dict[str, Any], n_tests: int) -> Cause:
    """Rule 0 / rule 5: nothing rejects → PASS when powered, else INCONCLUSIVE with a budget."""
    if not any(r.ran and r.p_adjusted is not None for r in adj):
        budget = _budget(adj, alpha, power, floor, details, n_tests=1)
        return Cause(VerdictKind.INCONCLUSIVE, "no detector had enough usable positions"
                     + (f"; about {budget} tokens would suffice" if budget else ""), "0-nothing-ran")
    budget = _budget(adj, alpha, power, floor, details, n_tests=n_tests)
    fams = details["power_families"]
    tested = {f: v for f, v in fams.items() if v["ran"]}
    weak = [f for f, v in tested.items() if not v["adequate"]]
    n_ran = sum(1 for r in adj if r.ran and r.p_adjusted is not None)
    if tested and not weak:
        untested = [f for f in fams if f not in tested]
        return Cause(
            VerdictKind.PASS,
            f"no detector rejects at family-wise alpha={alpha} ({n_ran} tests, Holm), with {power:.0%} power "
            f"for the target effects in: {', '.join(tested)}"
            + (f"; not tested: {', '.join(untested)}" if untested else ""),
            "5-pass",
        )
    return Cause(
        VerdictKind.INCONCLUSIVE,
        f"no detector rejects, but the audit lacks {power:.0%} power for the target effect in: "
        + (", ".join(weak) if weak else "any family")
        + (f"; about {budget} more tokens would suffice" if budget else ""),
        "5-underpowered",
    )
