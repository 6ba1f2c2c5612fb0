"""The model-side rules of the verdict: is the declared model served at its original precision? Which
rules (numbered as in :mod:`auditor.verdict.decide`, which applies them in order):

- rule 2, ``logprob-divergence`` rejects → SUBSTITUTION, QUANTIZATION_OR_SUBSTITUTION or QUANTIZATION
  (:func:`logprob_cause`, the flip statistic of :mod:`auditor.verdict.cause`);
- rule 3, ``greedy-match`` rejects (:func:`greedy_match_cause`);
- rules 3h and 3h-logprob, a minority of requests served differently (:func:`mixture_cause`,
  :func:`logprob_mixture_cause`);
- rule 4d's model branch, sampled tokens that follow another distribution with nothing pointing at acceptance
  (:func:`sampled_model_cause`);
- rule 2t, another tokenizer → SUBSTITUTION, applied last over the verdict (:func:`tokenizer_substitution`).

The thresholds are named constants below, calibrated on the simulator's quantized and substituted profiles
(docs/detectors.md, docs/calibration.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from auditor.detectors import DetectorName
from auditor.detectors.base import DetectorResult
from auditor.detectors.logprob import kl_floor_ratio
from auditor.util import kl_floor_text
from auditor.verdict.cause import SAMPLED_FLIP_MAX_SIGMA, flip_cause, milder_cause_clause, sampled_flip_cause
from auditor.verdict.kinds import Cause, RuleContext, Verdict, VerdictKind

__all__ = ["MILD_DIVERGENCE_MAX_RATIO", "MILD_DIVERGENCE_MIN_TOP1", "SUBSTITUTION_MAX_TOP1_AGREEMENT",
           "SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE", "SUBSTITUTION_MIN_FLIP_RATIO", "SUBSTITUTION_MIN_MEAN_KL",
           "greedy_match_cause", "logprob_cause", "logprob_mixture_cause", "mild_divergence", "mixture_cause",
           "sampled_model_cause", "shown_ratio", "tokenizer_substitution"]

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
#: A significant logprob divergence at most this multiple of the honest floor (with top-1 agreement
#: >= MILD_DIVERGENCE_MIN_TOP1) is worded as reduced-precision computation of the declared weights.
#: llama.cpp's CPU kernels (8-bit activation quantization for the matmuls) sit at ~3-4x on
#: SmolLM2-135M (docs/real-engines.md); weight-only int8 on the simulator lies in the same range.
MILD_DIVERGENCE_MAX_RATIO = 5.0
MILD_DIVERGENCE_MIN_TOP1 = 0.9


def logprob_cause(c: RuleContext) -> Cause:
    """Rule 2: ``logprob-divergence`` rejects → SUBSTITUTION when the flip statistic (the reference path's when
    informative, :func:`auditor.verdict.cause.flip_cause`) is above SUBSTITUTION_MIN_FLIP_RATIO; else
    QUANTIZATION_OR_SUBSTITUTION beyond SUBSTITUTION_MIN_MEAN_KL and SUBSTITUTION_MAX_TOP1_AGREEMENT; else
    QUANTIZATION (worded as a mild divergence within MILD_DIVERGENCE_MAX_RATIO)."""
    lp = c.by[DetectorName.LOGPROB_DIVERGENCE]
    d = lp.details or {}
    kl, top1 = lp.effect, d.get("top1_agreement", 1.0)
    ratio = d.get("ratio_to_floor", float("nan"))  # decides "mild"; the reason shows the one reported figure
    shown = shown_ratio(lp)
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


def shown_ratio(lp: DetectorResult | None) -> str:
    """The KL-vs-floor figure a reason quotes: the one every report shows
    (:func:`auditor.detectors.logprob.kl_floor_ratio`, geometric-mean KL / floor), "?" when missing."""
    r = kl_floor_ratio((lp.details or {}) if lp is not None else None)
    return kl_floor_text(r) if r is not None else "?"


def greedy_match_cause(c: RuleContext) -> Cause:
    """Rule 3: ``greedy-match`` rejects → DECODING_NONCOMPLIANT when the reported logprobs match the reference,
    else QUANTIZATION_OR_SUBSTITUTION at a clear-mismatch rate of SUBSTITUTION_MIN_CLEAR_MISMATCH_RATE or more,
    else QUANTIZATION."""
    g = c.by[DetectorName.GREEDY_MATCH]
    rate = g.effect
    if c.lp_consistent:
        return c.cause(
            VerdictKind.DECODING_NONCOMPLIANT,
            f"greedy tokens differ clearly from the reference argmax at {rate:.1%} of positions while the "
            f"provider's reported logprobs match the reference (geometric-mean KL {shown_ratio(c.lp)}x the honest floor): the served tokens "
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


def mixture_cause(c: RuleContext) -> Cause:
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


def logprob_mixture_cause(c: RuleContext) -> Cause:
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


def sampled_model_cause(c: RuleContext, rej: list[str], pstr: str) -> Cause:
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
    milder = "" if mild_divergence(c) else milder_cause_clause(fc.confidence)
    return c.cause(VerdictKind.QUANTIZATION, f"sampled tokens do not follow the reference distribution ({pstr}); no "
                   f"over-emission of the argmax; {fc.text}{milder}", "4d-quantization", rej, pstr,
                   established=not milder)


def mild_divergence(c: RuleContext) -> bool:
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


def tokenizer_substitution(verdict: Verdict, tm: Mapping[str, Any]) -> Verdict:
    """Rule 2t: SUBSTITUTION when the provider's tokens prove another tokenizer (``tm``, see
    :func:`auditor.verdict.decide.decide_verdict`): an honest server of the claimed model cannot emit a token outside its
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
