"""Verdict: Holm across one audit's detectors, then decision rules that name the cause.

``decide_verdict(results, alpha)`` returns a :class:`Verdict` — one of PASS, QUANTIZATION,
RELAXED_VERIFICATION, SUBSTITUTION, QUANTIZATION_OR_SUBSTITUTION, QUANTIZATION_OR_RELAXED_VERIFICATION,
DECODING_NONCOMPLIANT, INCONCLUSIVE —
with a one-line reason and JSON-able details. The rules (also in docs/detectors.md), applied in order, where "rejects"
means the detector ran and its Holm-adjusted p-value is <= alpha:

0. No detector ran → INCONCLUSIVE (with the budget that would suffice).
1. ``self-greedy`` rejects (T=0 tokens contradict the provider's own reported top-1 by more than
   the noise band) and ``logprob-divergence`` does not → DECODING_NONCOMPLIANT. Never
   RELAXED_VERIFICATION: a relaxed greedy verification changes only near-ties (rule 3n), not
   clear margins — except (1u) when at least UNVERIFIED_MIN_TOKENS of them, and at least half of the
   clear contradictions, lie ``UNVERIFIED_GAP_NATS`` or more below the provider's own top-1 and the
   reference's (``details["n_unverified"]`` of self-greedy): tokens no decoding parameter picks are
   drafts that were never verified → RELAXED_VERIFICATION, rule ``1u-unverified-tokens``, the
   positions named (issue 40 item 3: a real vLLM with ngram speculation, greedy requests batched
   with sampled ones) — or (1s) when a reasoning model's contradictions sit in its reasoning span and
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
      distribution the provider reports) or the argmax excess is positive; otherwise the sampled
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
   effect; a PASS reason ends with "rules out ...; does not rule out ... (power ...)". This does not
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
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, cast

from auditor.detectors import (
    PREFLIGHT_CHECKS,
    REFERENCE_DETECTORS,
    SELF_SAMPLING_DETECTORS,
    DetectorName,
    Mode,
    TestKind,
    detectors_where,
)
from auditor.detectors.base import DetectorResult
from auditor.detectors.logprob import kl_floor_ratio
from auditor.detectors.noise_floor import NoiseFloor
from auditor.detectors.speculation import accepted_by_predictability
from auditor.detectors.stats import holm
from auditor.util import finite as _f
from auditor.util import json_safe, kl_floor_text
from auditor.verdict.cause import (
    DECIDES_SAMPLER,
    SAMPLED_FLIP_MAX_SIGMA,
    blind_near_tie_note,
    emission_cause,
    explained_by_decode_path,
    failure_summary,
    flip_cause,
    implication,
    milder_cause_clause,
    near_tie_blind,
    near_tie_reason,
    no_speculation_seen,
    p_adjusted_text,
    predictability_clause,
    sampled_flip_cause,
    set_aside,
    span_clause,
    span_localized,
    speculation_clause,
    template_note,
)
from auditor.verdict.power import (
    DEFAULT_POWER,
    POWER_FAMILIES,
    POWER_TARGETS,
    _budget,
    power_at,
    power_effect,
    required_positions,
)
from auditor.verdict.rules_out import RULE_OUT_POWER, EffectSizes, rules_out, rules_out_sentence

__all__ = [
    "DEFAULT_ALPHA", "DEFAULT_POWER", "EXIT_CODES", "GREEDY_SERVED_MIN_ARGMAX_RATE",
    "LOGPROBS_CONSISTENT_MAX_RATIO", "MAX_PROVIDER_FAILURE_SHARE", "MILD_DIVERGENCE_MAX_RATIO",
    "POWER_FAMILIES", "POWER_TARGETS", "REFERENCE_DETECTORS", "SUBSTITUTION_MAX_TOP1_AGREEMENT",
    "SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE", "SUBSTITUTION_MIN_FLIP_RATIO", "SUBSTITUTION_MIN_MEAN_KL",
    "TAIL_MISSING_MAX_RATIO", "TRUNCATION_SHAPE_RATIO", "UNDETERMINED_CAUSES", "Verdict", "VerdictKind", "apply_holm",
    "decide_verdict", "holm", "power_at", "power_effect", "required_positions",
]


class VerdictKind(StrEnum):
    PASS = "PASS"
    QUANTIZATION = "QUANTIZATION"
    RELAXED_VERIFICATION = "RELAXED_VERIFICATION"
    SUBSTITUTION = "SUBSTITUTION"
    #: The served weights are not the declared model at its original precision, and the evidence cannot
    #: tell a heavily degraded quantized copy from another model (issue 14 item 5: a third answer rather
    #: than a forced, possibly false, choice between the two).
    QUANTIZATION_OR_SUBSTITUTION = "QUANTIZATION_OR_SUBSTITUTION"
    #: A deviation that is either quantized weights or a lossy greedy verifier, and the evidence cannot tell
    #: which (issue 37 item 2: near-tie flips without the provider's own top_logprobs; rule 3n).
    QUANTIZATION_OR_RELAXED_VERIFICATION = "QUANTIZATION_OR_RELAXED_VERIFICATION"
    #: The sampled tokens deviate (a thinned tail, an over-emitted argmax) and the evidence cannot tell lossy
    #: speculative acceptance from a server-side top-k / top-p / min-p (issue 37 item 8: the emission models'
    #: margin is below DECISIVE_EMISSION_MARGIN, or they lean to acceptance while the speculation fingerprint saw
    #: no speculation).
    RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT = "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT"
    DECODING_NONCOMPLIANT = "DECODING_NONCOMPLIANT"
    INCONCLUSIVE = "INCONCLUSIVE"


#: Unverified greedy tokens (self-greedy ``n_unverified``) from which rule 1u names relaxed verification.
UNVERIFIED_MIN_TOKENS = 3
#: The undetermined verdicts → the two causes each stands for (a deviation was found; which of the two is
#: not established). The one home of this fact: questions, standing, sequential stopping and calibration read it.
UNDETERMINED_CAUSES: Mapping[VerdictKind, tuple[VerdictKind, VerdictKind]] = {
    VerdictKind.QUANTIZATION_OR_SUBSTITUTION: (VerdictKind.QUANTIZATION, VerdictKind.SUBSTITUTION),
    VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION: (VerdictKind.QUANTIZATION, VerdictKind.RELAXED_VERIFICATION),
    VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT: (VerdictKind.RELAXED_VERIFICATION,
                                                                VerdictKind.DECODING_NONCOMPLIANT),
}


#: CLI exit codes (issue 5): 0 PASS, 1 a deviation, 2 INCONCLUSIVE (3 = usage errors, CLI's own).
EXIT_CODES = {
    VerdictKind.PASS: 0,
    VerdictKind.QUANTIZATION: 1,
    VerdictKind.RELAXED_VERIFICATION: 1,
    VerdictKind.SUBSTITUTION: 1,
    VerdictKind.QUANTIZATION_OR_SUBSTITUTION: 1,
    VerdictKind.QUANTIZATION_OR_RELAXED_VERIFICATION: 1,
    VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT: 1,
    VerdictKind.DECODING_NONCOMPLIANT: 1,
    VerdictKind.INCONCLUSIVE: 2,
}

DEFAULT_ALPHA = 0.05

#: Rule 2, quantized copy vs different model: ``logprob-divergence``'s margin-conditioned flip
#: statistic ``confident_flip_ratio`` = (observed + 1) / (expected + 1) flips of the reference argmax
#: at confident positions (reference top-1/top-2 margin > CONFIDENT_MARGIN_SIGMAS x σ̂), the expected
#: count being what an isotropic logit perturbation of the audit's own scale σ̂ produces
#: (``auditor.detectors.logprob.margin_flip_stats``). Above this value the cause is SUBSTITUTION.
#: Calibrated (docs/detectors.md, rule 2) as the maximum of the statistic over every resampled
#: audit of the quantized SmolLM2-135M pools measured so far (int4, fp8; 100 default-suite audits at
#: 300 and 1,000 tokens each: max 3.73, 99th percentile 3.51), rounded up; not tuned on a substituted
#: profile. Re-derive with benchmarks/cause_margin.py when the int8 / kv-fp8 / w8a8 pools exist.
SUBSTITUTION_MIN_FLIP_RATIO = 4.0
#: Far divergence (issue 7, on SmolLM2): mean bucketed KL at or above this (nats) ... Beyond it the flip
#: test's isotropic-noise model is outside the range it was calibrated on (int4, int8, fp8, kv-fp8, w8a8
#: all stay below), and 3-bit weights land there as the layer-pruned model does, so without a flip
#: ratio above SUBSTITUTION_MIN_FLIP_RATIO the cause is QUANTIZATION_OR_SUBSTITUTION (it was SUBSTITUTION
#: until int3 was calibrated).
SUBSTITUTION_MIN_MEAN_KL = 0.25
#: ... together with the provider's reported top-1 agreeing with the reference argmax at most this
#: often. Kept beside the flip test because that test needs confident positions: a divergence this
#: large leaves few (SmolLM2's layer-dropped copy: ~16 in a 300-token audit). It never fires on
#: gemma-3-270m int4 (docs/performance.md) and is model-specific; the flip test is the general one.
SUBSTITUTION_MAX_TOP1_AGREEMENT = 0.7
#: Greedy-only audits: clear-mismatch rate at or above which quantization to production formats no longer
#: explains the mismatches: QUANTIZATION_OR_SUBSTITUTION (3-bit weights and another model both exceed it).
SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE = 0.35
#: Reported logprobs "match the reference" when logprob-divergence did not reject and its mean
#: KL is at most this multiple of the honest floor's.
LOGPROBS_CONSISTENT_MAX_RATIO = 2.0
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

#: Share of failed probes above which the audit is INCONCLUSIVE ("provider failures", issue 13):
#: failures select (long generations fail more often), so the rest is not a fair sample.
MAX_PROVIDER_FAILURE_SHARE = 0.10
#: A significant logprob divergence at most this multiple of the honest floor (with top-1 agreement
#: >= MILD_DIVERGENCE_MIN_TOP1) is worded as reduced-precision computation of the declared weights.
#: llama.cpp's CPU kernels (8-bit activation quantization for the matmuls) sit at ~3-4x on
#: SmolLM2-135M (docs/real-engines.md); weight-only int8 on the simulator lies in the same range.
MILD_DIVERGENCE_MAX_RATIO = 5.0
MILD_DIVERGENCE_MIN_TOP1 = 0.9
# Which detectors compare with the reference (REFERENCE_DETECTORS, set aside on a template mismatch),
# the sampling tests of each kind, the pre-flight checks with the rule each decides
# (PREFLIGHT_CHECKS) and every implication are the registry's (auditor.detectors).


@dataclass
class Verdict:
    """An audit's outcome.

    Attributes:
        verdict: a VerdictKind value (str).
        reason: one sentence naming the deciding detector(s) and numbers.
        details: JSON-able: alpha, detectors (name → ran, p, p_adjusted, effect, n, rejects),
            findings (every rejecting detector with its implication), power (per detector:
            required positions, adequate), suggested_budget_tokens (INCONCLUSIVE), rule (which
            rule decided).
        results: the DetectorResults with ``p_adjusted`` filled in (not serialised in details).
    """

    verdict: str
    reason: str
    details: dict[str, Any]
    results: list[DetectorResult] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[VerdictKind(self.verdict)]


def apply_holm(results: Sequence[DetectorResult]) -> list[DetectorResult]:
    """Copies of results with ``p_adjusted`` = Holm across the detectors that ran (None otherwise)."""
    ps = [r.p_value if (r.ran and r.p_value is not None and not math.isnan(r.p_value)) else math.nan for r in results]
    adj = holm(ps)
    return [r.with_adjusted(None if math.isnan(a) else float(a)) for r, a in zip(results, adj, strict=True)]


# --------------------------------------------------------------------------- decision
def _pick(by: dict[str, DetectorResult], *names: str) -> DetectorResult | None:
    for k in names:
        r = by.get(k)
        if r is not None and r.ran:
            return r
    return None


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
    ctx = _Ctx(by, rejects, details, speculation)
    cause = _primary_cause(ctx)
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
    _explain_findings(details["findings"], cause, secondary, rejects)
    fail = failure_summary(provider_failures)
    if fail is not None:
        details["provider_failures"] = fail
    if fail is not None and fail["share"] > MAX_PROVIDER_FAILURE_SHARE:
        if cause.kind not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE):
            secondary.insert(0, cause)
        kinds = ", ".join(f"{k} {v}" for k, v in fail["kinds"].items()) or "unknown"
        found = "; in the probes that succeeded: " + ", ".join(str(c.kind) for c in secondary) if secondary else ""
        cause = _Cause(
            VerdictKind.INCONCLUSIVE,
            f"provider failures: {fail['failed']} of {fail['total']} probes ({fail['share']:.0%}) failed ({kinds}); "
            f"the rest is not a fair sample and more tokens would fail the same way — fix the provider (or lower "
            f"its concurrency) and audit again{found}",
            "0-provider-failures",
        )
        details["suggested_budget_tokens"] = None
    if cause.kind in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE) and cause.rule != "0-provider-failures":
        ro = rules_out(adj, alpha=alpha, n_tests=n_power, floor=floor, effect_sizes=effect_sizes)
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
    return _tokenizer_substitution(verdict, tokenizer_mismatch) if tokenizer_mismatch else verdict


def _tokenizer_substitution(verdict: Verdict, tm: Mapping[str, Any]) -> Verdict:
    """Rule 2t: SUBSTITUTION when the provider's tokens prove another tokenizer (``tm``, see
    :func:`decide_verdict`): an honest server of the claimed model cannot emit a token outside its
    vocabulary, nor count a completions prompt differently. This holds whatever the statistical
    detectors say (a cross-family model may even align well enough to look like QUANTIZATION); the
    previous verdict is kept as a secondary cause (unless PASS, INCONCLUSIVE or SUBSTITUTION) and in
    ``details["previous_verdict"]``, the evidence in ``details["tokenizer_mismatch"]``."""
    parts = []
    if "foreign_tokens" in tm["established"]:
        ex = ", ".join(repr(t) for t in tm["foreign_tokens"][:6])
        parts.append(f"{tm['n_foreign_distinct']} distinct token strings ({tm['n_foreign']} of {tm['n_checked']} "
                     f"tokens and alternatives) do not exist in the claimed model's vocabulary, e.g. {ex}")
    if "prompt_counts" in tm["established"]:
        ex = ", ".join(f"{a} vs {b}" for a, b in tm["prompt_counts"][:4])
        parts.append(f"the provider counts the prompt tokens differently on {tm['n_prompt_disagree']} of "
                     f"{tm['n_prompt_checked']} completions prompts (provider vs claimed tokenizer: {ex})")
    reason = "the provider uses another tokenizer than the claimed model's, so it serves another model: " + "; ".join(parts)
    details = dict(verdict.details)
    details.pop("rules_out", None)  # a SUBSTITUTION rules nothing out
    secondary = list(details.get("secondary_causes") or [])
    if verdict.verdict not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE, VerdictKind.SUBSTITUTION,
                               VerdictKind.QUANTIZATION_OR_SUBSTITUTION):
        secondary.insert(0, {"verdict": verdict.verdict, "rule": details.get("rule"), "reason": verdict.reason,
                             "evidence": []})
    details.update(secondary_causes=secondary, rule="2t-tokenizer", tokenizer_mismatch=dict(tm), cause_established=True,
                   previous_verdict={"verdict": verdict.verdict, "reason": verdict.reason})
    return replace(verdict, verdict=str(VerdictKind.SUBSTITUTION), reason=reason, details=details)


@dataclass(frozen=True)
class _Cause:
    """One cause with its rule, reason and the detectors that decide it."""

    kind: VerdictKind
    reason: str
    rule: str
    deciding: tuple[str, ...] = ()
    short: str = ""
    by: Mapping[str, DetectorResult] = field(default_factory=dict, compare=False, repr=False)
    #: False when the reason itself says the evidence does not single out this cause (a QUANTIZATION
    #: named as the milder cause, :func:`auditor.verdict.cause.milder_cause_clause`)
    established: bool = True

    def to_dict(self) -> dict[str, Any]:
        ev = []
        for n in self.deciding:
            r = self.by.get(n)
            if r is not None:
                ev.append({"detector": n, "p_adjusted": _f(r.p_adjusted), "p_value": _f(r.p_value),
                           "effect": _f(r.effect), "n": r.n, "implication": implication(n)})
        return {"verdict": str(self.kind), "rule": self.rule, "reason": self.reason, "evidence": ev}


@dataclass
class _Ctx:
    by: dict[str, DetectorResult]
    rejects: Callable[[str], bool]
    details: dict[str, Any]
    speculation: Mapping[str, Any] | None = None

    @property
    def no_speculation(self) -> bool:
        """The speculation fingerprint saw no speculation (``detected`` False)."""
        return no_speculation_seen(self.speculation)

    @property
    def lp(self) -> DetectorResult | None:
        return self.by.get(DetectorName.LOGPROB_DIVERGENCE)

    @property
    def lp_sig(self) -> bool:
        return self.rejects(DetectorName.LOGPROB_DIVERGENCE)

    @property
    def lp_ratio(self) -> float | None:
        lp = self.lp
        return (lp.details or {}).get("ratio_to_floor") if lp is not None and lp.ran else None

    @property
    def lp_consistent(self) -> bool:
        lp, ratio = self.lp, self.lp_ratio
        return bool(lp is not None and lp.ran and not self.lp_sig and ratio is not None
                    and ratio <= LOGPROBS_CONSISTENT_MAX_RATIO
                    and not self.rejects(DetectorName.LOGPROB_HETEROGENEITY))  # some requests' logprobs differ

    def cause(self, kind: VerdictKind, reason: str, rule: str, deciding: Sequence[str], short: str, *,
              established: bool = True) -> _Cause:
        return _Cause(kind, reason, rule, tuple(deciding), short, self.by, established)


def _primary_cause(c: _Ctx) -> _Cause | None:
    """Rules 1-4 and 6 in order (the first that fires), or None when nothing rejects."""
    by, rejects = c.by, c.rejects
    c.details["logprobs_consistent"] = c.lp_consistent
    if rejects(DetectorName.SELF_GREEDY) and not c.lp_sig:
        return _self_greedy(c)
    if c.lp_sig:
        return _logprob_cause(c)
    if rejects(DetectorName.GREEDY_MATCH):
        g = by[DetectorName.GREEDY_MATCH]
        rate = g.effect
        if c.lp_consistent:
            return c.cause(
                VerdictKind.DECODING_NONCOMPLIANT,
                f"greedy tokens differ clearly from the reference argmax at {rate:.1%} of positions while the "
                f"provider's reported logprobs match the reference (geometric-mean KL {_shown_ratio(c.lp)}x the honest floor): the served tokens "
                f"are not the argmax of the distribution it reports (greedy-match p_adj={g.p_adjusted:.3g})",
                "3-greedy-decode-path", [DetectorName.GREEDY_MATCH], f"greedy-match p_adj={g.p_adjusted:.3g}",
            )
        far = rate >= SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE
        kind = VerdictKind.QUANTIZATION_OR_SUBSTITUTION if far else VerdictKind.QUANTIZATION
        return c.cause(
            kind,
            f"greedy tokens differ clearly (beyond the {g.details.get('band', float('nan')):.3g}-nat noise band) from "
            f"the reference argmax at {rate:.1%} of {g.n} positions (greedy-match p_adj={g.p_adjusted:.3g})"
            + (f"; a rate this high ({SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE:.0%} or more) is beyond production "
               "quantization: heavily degraded weights or another model, which greedy tokens alone cannot tell"
               if far else ""),
            "3-greedy-" + ("model-deviation" if far else "quantization"), [DetectorName.GREEDY_MATCH],
            f"greedy-match p_adj={g.p_adjusted:.3g}",
        )
    if rejects(DetectorName.GREEDY_HETEROGENEITY):
        return _mixture_cause(c)
    if rejects(DetectorName.LOGPROB_HETEROGENEITY):
        return _logprob_mixture_cause(c)
    if rejects(DetectorName.GREEDY_NEAR_TIE):
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
    s = _sampling_cause(c, reference=True, record_shape=True)
    if s is not None:
        return s
    for name in PREFLIGHT_CHECKS:
        if rejects(name):
            if name == "preflight-top-p" and (c.speculation or {}).get("detected") is True:
                r = by[name]
                return _sampler_undetermined(
                    c, f"pre-flight: with temperature 1 and top_p=1 the sampled tokens fell among the provider's own "
                    f"least likely tokens {int(r.statistic)} times where "
                    f"{float((r.details or {}).get('expected') or math.nan):.1f} were expected ({name} "
                    f"p_adj={r.p_adjusted:.3g})", [name],
                    f"{speculation_clause(c.speculation)}, and lossy acceptance thins the tail as a truncation does")
            return _preflight_cause(c, name)
    return None


def _mixture_cause(c: _Ctx) -> _Cause:
    """Rule 3h: the per-request scan rejects while the pooled greedy test does not — a minority of
    requests is served differently. The cause follows rule 3 on the outlying requests' pooled
    clear-mismatch rate (DECODING_NONCOMPLIANT when the reported logprobs match the reference)."""
    h = c.by[DetectorName.GREEDY_HETEROGENEITY]
    d = h.details or {}
    k, n_req = int(d.get("outlier_requests") or 0), int(d.get("n_requests") or 0)
    rate = d.get("outlier_clear_rate")
    rate = float(rate) if rate is not None else float(h.effect)
    short = f"greedy-heterogeneity p_adj={h.p_adjusted:.3g}"
    what = (f"{max(k, 1)} of {n_req} requests have greedy tokens that differ clearly from the reference argmax "
            f"(their clear-mismatch rate {rate:.1%}; worst request {d.get('worst_clear')} of "
            f"{d.get('worst_positions')} positions) while the others match: part of the traffic is served "
            f"differently ({short})")
    if c.lp_consistent:
        return c.cause(VerdictKind.DECODING_NONCOMPLIANT,
                       what + "; the reported logprobs match the reference, so those requests' tokens are not the "
                       "argmax of the distribution reported", "3h-mixture-decode-path", [DetectorName.GREEDY_HETEROGENEITY], short)
    far = rate >= SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE
    return c.cause(VerdictKind.QUANTIZATION_OR_SUBSTITUTION if far else VerdictKind.QUANTIZATION,
                   what + ("; a rate this high in those requests is beyond production quantization: a heavily "
                           "degraded replica or another model, which greedy tokens alone cannot tell" if far
                           else "; a degraded (e.g. quantized) replica for those requests"),
                   "3h-mixture-" + ("model-deviation" if far else "quantization"), [DetectorName.GREEDY_HETEROGENEITY], short)


def _logprob_mixture_cause(c: _Ctx) -> _Cause:
    """Rule 3h-logprob: the per-request logprob scan rejects while the pooled logprob test and the greedy tests do
    not — a minority of requests reports another distribution (issue 37 item 4: 10% of requests from an int4 copy).
    QUANTIZATION_OR_SUBSTITUTION when the outlying requests' mean KL is beyond SUBSTITUTION_MIN_MEAN_KL (the range
    where heavily degraded weights and another model look alike), else QUANTIZATION."""
    h = c.by[DetectorName.LOGPROB_HETEROGENEITY]
    d = h.details or {}
    k, n_req = int(d.get("outlier_requests") or 0), int(d.get("n_requests") or 0)
    kl = d.get("outlier_mean_kl")
    kl = float(kl) if kl is not None else float(h.effect)
    ratio = d.get("outlier_ratio_to_floor") or d.get("worst_ratio_to_floor")
    short = f"logprob-heterogeneity p_adj={h.p_adjusted:.3g}"
    far = kl >= SUBSTITUTION_MIN_MEAN_KL
    what = (f"{max(k, 1)} of {n_req} requests report logprobs that diverge from the reference (their mean KL "
            f"{kl:.3g} nats" + (f", {float(ratio):.3g}x the honest floor" if ratio is not None else "")
            + f"; worst request z = {float(d.get('worst_z') or math.nan):.3g}) while the others match: part of the "
              f"traffic is served differently ({short})")
    return c.cause(VerdictKind.QUANTIZATION_OR_SUBSTITUTION if far else VerdictKind.QUANTIZATION,
                   what + ("; a divergence this far in those requests is beyond production quantization: a heavily "
                           "degraded replica or another model" if far
                           else "; a replica computing the declared model in a cheaper numeric format (e.g. quantized "
                                "weights) for those requests"),
                   "3h-logprob-mixture-" + ("model-deviation" if far else "quantization"),
                   [DetectorName.LOGPROB_HETEROGENEITY], short)


def _self_greedy(c: _Ctx) -> _Cause:
    r = c.by[DetectorName.SELF_GREEDY]
    d = r.details or {}
    n_unv, n_clear = int(d.get("n_unverified") or 0), int(d.get("n_clear") or 0)
    if n_unv >= UNVERIFIED_MIN_TOKENS and 2 * n_unv >= n_clear:
        pos = ", ".join(f"{u['prompt_id']}@{u['position']} ({u['gap']:.1f} nats)"
                        for u in list(d.get("unverified_positions") or [])[:4])
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            f"at temperature 0 the provider emitted {n_unv} tokens at least {d.get('unverified_gap_nats', 8.0):g} nats "
            f"below its own reported top-1 (and the reference's), of {n_clear} clear contradictions in {r.n} "
            f"positions (e.g. {pos}): tokens no decoding parameter picks — drafts accepted without strict "
            f"verification (e.g. speculative decoding with greedy requests batched beside sampled ones) "
            f"(self-greedy p_adj={r.p_adjusted:.3g})" + predictability_clause(
                c.speculation, chunks_are_steps=_steps_shown(d, float(c.details["alpha"])), only_flat=True),
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


def _steps_shown(d: Mapping[str, Any], alpha: float) -> bool:
    """Rule 1d's test on self-greedy's details ``d``: its clear contradictions avoid the last token of the streamed
    steps (``d["steps"]``, one-sided binomial p <= ``alpha``) — which also shows the stream's chunks end at the
    target's own token, i.e. are verification steps."""
    st = d.get("steps") or {}
    return bool(st.get("clear")) and float(st.get("p_value", 1.0)) <= alpha


def _shown_ratio(lp: DetectorResult | None) -> str:
    """The KL-vs-floor figure a reason quotes: the one every report shows
    (:func:`auditor.detectors.logprob.kl_floor_ratio`, geometric-mean KL / floor), "?" when missing."""
    r = kl_floor_ratio((lp.details or {}) if lp is not None else None)
    return kl_floor_text(r) if r is not None else "?"


def _logprob_cause(c: _Ctx) -> _Cause:
    lp = c.by[DetectorName.LOGPROB_DIVERGENCE]
    d = lp.details or {}
    kl, top1 = lp.effect, d.get("top1_agreement", 1.0)
    ratio = d.get("ratio_to_floor", float("nan"))  # decides "mild"; the reason shows the one reported figure
    shown = _shown_ratio(lp)
    tail = f"(logprob-divergence p_adj={lp.p_adjusted:.3g})"
    short = f"geometric-mean KL {shown}x the honest floor, p_adj={lp.p_adjusted:.3g}"
    fc = flip_cause(d, SUBSTITUTION_MIN_FLIP_RATIO)  # the reference path (echo) decides when informative
    if fc.confidence is not None:
        c.details["cause_confidence"] = fc.confidence
    flips = fc.text
    if fc.substitution and fc.value is not None:
        return c.cause(
            VerdictKind.SUBSTITUTION,
            f"reported logprobs diverge from the reference (mean KL {kl:.3g} nats; geometric-mean KL {shown}x the honest floor, "
            f"top-1 agreement {top1:.0%}) in a way quantization does not explain: {flips}, "
            f"{fc.value / SUBSTITUTION_MIN_FLIP_RATIO:.2g}x the threshold — a different model {tail}",
            "2-logprob-substitution", [DetectorName.LOGPROB_DIVERGENCE], short,
        )
    if kl >= SUBSTITUTION_MIN_MEAN_KL and top1 <= SUBSTITUTION_MAX_TOP1_AGREEMENT:
        return c.cause(
            VerdictKind.QUANTIZATION_OR_SUBSTITUTION,
            f"reported logprobs diverge far beyond production quantization: mean KL {kl:.3g} nats (geometric-mean KL {shown}x the "
            f"honest floor), reported top-1 agrees with the reference argmax at only {top1:.0%} of positions — the "
            f"served model is not the declared one at its original precision, but heavily degraded weights (3-bit "
            f"class) and another model both diverge this far, and the flip test does not single out another model: "
            f"{flips} {tail}",
            "2-logprob-model-deviation", [DetectorName.LOGPROB_DIVERGENCE], short,
        )
    mild = math.isfinite(ratio) and ratio <= MILD_DIVERGENCE_MAX_RATIO and top1 >= MILD_DIVERGENCE_MIN_TOP1
    what = (
        "a mild divergence, what reduced-precision computation of the declared weights produces (e.g. 8-bit "
        "activations or weights); it is not evidence that other weights are served"
        if mild
        else "the declared model computed in a cheaper numeric format (quantized weights or activations), not a "
        "different model"
    )
    milder = "" if mild else milder_cause_clause(fc.confidence)
    return c.cause(
        VerdictKind.QUANTIZATION,
        f"reported logprobs diverge from the reference beyond the honest noise floor: mean KL {kl:.3g} nats, "
        f"geometric-mean KL {shown}x the honest floor, top-1 agreement {top1:.0%} — {what}; {flips}{milder} {tail}",
        "2-logprob-quantization", [DetectorName.LOGPROB_DIVERGENCE], short, established=not milder,
    )


def _preflight_cause(c: _Ctx, name: str) -> _Cause:
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


def _sampling_cause(c: _Ctx, *, reference: bool, record_shape: bool = False) -> _Cause | None:
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
        return _sampler_undetermined(
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
            return _sampler_undetermined(c, f"{what} ({p_adjusted_text(by, arg_names)})", rej,
                                         speculation_clause(c.speculation))
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            f"{what}: the signature of lossy speculative acceptance ({p_adjusted_text(by, arg_names)})",
            "4c-relaxed", rej, f"argmax over-emitted, {p_adjusted_text(by, arg_names)}")
    self_sig = any(rejects(k) for k in SELF_SAMPLING_DETECTORS)
    if c.lp_consistent or self_sig or excess > 0:
        if c.no_speculation:
            return _sampler_undetermined(
                c, f"sampled tokens do not follow the distribution the provider reports "
                f"({p_adjusted_text(by, gof_names + tail_names)}); argmax excess {excess:.3g}/position", rej,
                speculation_clause(c.speculation))
        return c.cause(
            VerdictKind.RELAXED_VERIFICATION,
            "sampled tokens do not follow the distribution the provider reports "
            f"({p_adjusted_text(by, gof_names + tail_names)}); argmax excess {excess:.3g}/position",
            "4d-relaxed", rej, p_adjusted_text(by, gof_names + tail_names))
    return _sampled_model_cause(c, rej, p_adjusted_text(by, gof_names + tail_names))


def _sampler_undetermined(c: _Ctx, what: str, rej: Sequence[str], why: str) -> _Cause:
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


def _sampled_model_cause(c: _Ctx, rej: list[str], pstr: str) -> _Cause:
    """Rule 4d when nothing points at acceptance: a quantized copy or a different model, decided by rule 2's
    flip statistic on the sampled positions (:func:`auditor.verdict.cause.sampled_flip_cause`)."""
    fc = sampled_flip_cause(c.by.get(DetectorName.SAMPLING_GOF), SUBSTITUTION_MIN_FLIP_RATIO)
    if fc is None:
        return c.cause(VerdictKind.QUANTIZATION, f"sampled tokens do not follow the reference distribution ({pstr}) "
                       "and no logprobs were available to tell more; no over-emission of the argmax",
                       "4d-quantization", rej, pstr)
    if fc.confidence is not None:
        c.details["cause_confidence"] = fc.confidence
    sigma = (fc.confidence or {}).get("sigma_hat")
    if sigma is not None and float(sigma) > SAMPLED_FLIP_MAX_SIGMA:
        return c.cause(VerdictKind.QUANTIZATION_OR_SUBSTITUTION, f"sampled tokens do not follow the reference "
                       f"distribution ({pstr}), and the provider's reported top_logprobs there differ from the "
                       f"reference's by a logit-noise scale of {float(sigma):.3g} nats, beyond the "
                       f"{SAMPLED_FLIP_MAX_SIGMA:g} nats of any production quantization calibrated: not the declared "
                       f"weights at their precision, but heavily degraded weights and another model both reach this, "
                       f"and the flip test is not calibrated there ({fc.text})", "4d-model-deviation", rej, pstr)
    if fc.substitution and fc.value is not None:
        return c.cause(VerdictKind.SUBSTITUTION, f"sampled tokens do not follow the reference distribution ({pstr}), "
                       f"and the provider's reported top_logprobs there disagree with the reference in a way "
                       f"quantization does not explain: {fc.text}, {fc.value / SUBSTITUTION_MIN_FLIP_RATIO:.2g}x the "
                       f"threshold — a different model", "4d-substitution", rej, pstr)
    milder = "" if _mild(c) else milder_cause_clause(fc.confidence)
    return c.cause(VerdictKind.QUANTIZATION, f"sampled tokens do not follow the reference distribution ({pstr}); no "
                   f"over-emission of the argmax; {fc.text}{milder}", "4d-quantization", rej, pstr,
                   established=not milder)


def _sampling_tests(test: TestKind, *, reference: bool) -> tuple[str, ...]:
    """The sampling tests of kind ``test`` in registry order (reference ``sampling-*`` before ``self-*``);
    only the provider-self ones when ``reference`` is False."""
    return tuple(str(n) for n in detectors_where(test=test, needs_reference=None if reference else False))


def _other_causes(c: _Ctx, primary: _Cause) -> list[_Cause]:
    """Every cause other than the primary that its own tests establish (see the module docstring)."""
    if primary.kind in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE):
        return []
    out: list[_Cause] = []
    if c.rejects(DetectorName.SELF_GREEDY) and primary.rule not in ("1-self-greedy", "1u-unverified-tokens",
                                                                    "1s-reasoning-span", "1d-unverified-drafts"):
        out.append(_self_greedy(c))
    if not primary.rule.startswith("4"):
        s = _sampling_cause(c, reference=c.lp_consistent or _mild(c))
        if s is not None:
            out.append(s)
    for name in PREFLIGHT_CHECKS:
        if c.rejects(name) and _preflight_explainer(name, primary, out) is None:
            out.append(_preflight_cause(c, name))
    return out


def _sampler_cause(primary: _Cause, secondary: Sequence[_Cause]) -> _Cause | None:
    """The rule-4 cause established for the sampled tokens that the pre-flight top-p check cannot add to:
    RELAXED_VERIFICATION (the emission models prefer acceptance, or the argmax is over-emitted) or the
    undetermined pair. Both thin the tail the pre-flight reads, so its rejection is explained by that cause,
    not a separate DECODING_NONCOMPLIANT (issue 37 item 6)."""
    kinds = (VerdictKind.RELAXED_VERIFICATION, VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT)
    return next((x for x in (primary, *secondary) if x.rule.startswith("4") and x.kind in kinds), None)


def _unverified_greedy_cause(primary: _Cause, secondary: Sequence[_Cause]) -> _Cause | None:
    """The RELAXED_VERIFICATION that ``self-greedy`` establishes (rules 1u, 1s, 1d: its greedy departures from
    the provider's own top-1 placed by gap, span or streamed step). The pre-flight greedy-top1 check reads the
    same departures on a few answers without that information (no stream steps, few positions per span), so
    its rejection is explained by that cause, not a separate DECODING_NONCOMPLIANT (issue 35, issue 37 item 6)."""
    return next((x for x in (primary, *secondary)
                 if x.kind == VerdictKind.RELAXED_VERIFICATION and DetectorName.SELF_GREEDY in x.deciding), None)


def _preflight_explainer(name: str, primary: _Cause, secondary: Sequence[_Cause]) -> _Cause | None:
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


def _explain_findings(findings: list[dict[str, Any]], primary: _Cause, secondary: Sequence[_Cause],
                      rejects: Callable[[str], bool]) -> None:
    """Mark in place each finding that the established cause explains: ``explained_by`` (the verdict kind) and
    the implication says so, so that no report lists it as a separate cause (issue 37 item 6). A rejecting
    greedy-near-tie under a decode-path or model cause (rules 1-3h); the pre-flight top-p check under a rule-4
    RELAXED_VERIFICATION or the undetermined sampler pair (:func:`_sampler_cause`); the pre-flight greedy-top1
    check under the RELAXED_VERIFICATION self-greedy establishes (:func:`_unverified_greedy_cause`); the reference sampling tests
    under a model cause that no sampling cause claims (the reference's distribution is not the served one);
    the greedy findings the decode path explains (:func:`auditor.verdict.cause.explained_by_decode_path`)."""
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


def _mild(c: _Ctx) -> bool:
    """The logprobs diverge only mildly (<= MILD_DIVERGENCE_MAX_RATIO x the floor, top-1 agreement >=
    MILD_DIVERGENCE_MIN_TOP1): the reference is then close enough to the served distribution for the
    reference sampling tests to speak about the sampler (a KL of a few times the honest floor cannot
    remove a sizeable share of the low-probability tail or add argmax emissions)."""
    lp = c.lp
    if lp is None or not lp.ran:
        return False
    d = lp.details or {}
    ratio, top1 = d.get("ratio_to_floor"), d.get("top1_agreement", 0.0)
    return ratio is not None and ratio <= MILD_DIVERGENCE_MAX_RATIO and top1 >= MILD_DIVERGENCE_MIN_TOP1


def _no_rejection(adj: Sequence[DetectorResult], alpha: float, power: float, floor: NoiseFloor | None,
                  details: dict[str, Any], n_tests: int) -> _Cause:
    """Rule 0 / rule 5: nothing rejects → PASS when powered, else INCONCLUSIVE with a budget."""
    if not any(r.ran and r.p_adjusted is not None for r in adj):
        budget = _budget(adj, alpha, power, floor, details, n_tests=1)
        return _Cause(VerdictKind.INCONCLUSIVE, "no detector had enough usable positions"
                      + (f"; about {budget} tokens would suffice" if budget else ""), "0-nothing-ran")
    budget = _budget(adj, alpha, power, floor, details, n_tests=n_tests)
    fams = details["power_families"]
    tested = {f: v for f, v in fams.items() if v["ran"]}
    weak = [f for f, v in tested.items() if not v["adequate"]]
    n_ran = sum(1 for r in adj if r.ran and r.p_adjusted is not None)
    if tested and not weak:
        untested = [f for f in fams if f not in tested]
        return _Cause(
            VerdictKind.PASS,
            f"no detector rejects at family-wise alpha={alpha} ({n_ran} tests, Holm), with {power:.0%} power "
            f"for the target effects in: {', '.join(tested)}"
            + (f"; not tested: {', '.join(untested)}" if untested else ""),
            "5-pass",
        )
    return _Cause(
        VerdictKind.INCONCLUSIVE,
        f"no detector rejects, but the audit lacks {power:.0%} power for the target effect in: "
        + (", ".join(weak) if weak else "any family")
        + (f"; about {budget} more tokens would suffice" if budget else ""),
        "5-underpowered",
    )
