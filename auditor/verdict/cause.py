"""Cause features of the verdict rules (:mod:`auditor.verdict.model_rules`, :mod:`auditor.verdict.verification_rules`,
applied by :mod:`auditor.verdict.decide`) that need no verdict types.

Rule 2: which margin-conditioned flip statistic decides, and its words (:func:`flip_cause`). Rule 3n:
the reason sentence of a ``greedy-near-tie`` rejection (:func:`near_tie_reason`). Findings: the note
beside a greedy-vs-reference finding that the provider's own decode path explains
(:func:`explained_by_decode_path`). The verdict's small formatting helpers (:func:`set_aside`,
:func:`template_note`, :func:`failure_summary`, :func:`implication`, :func:`p_adjusted_text`; finite
numbers through :func:`auditor.util.finite`).

Rule 2 in detail.

``logprob-divergence``'s details carry two measurements of the same statistic
(``auditor.detectors.logprob.margin_flip_stats``): along the provider's own continuations
(``confident_flip_ratio``, ...) and, when the provider returns echo logprobs, along the reference's
own greedy continuations (``reference_path_flip_ratio``, ..., :mod:`auditor.check.reference_path`). The
reference path separates a quantized copy from a different model where the provider path does not
(docs/detectors.md, rule 2), so it decides whenever it is *informative* — enough confident
positions that the ratio could exceed the threshold; else the provider path decides as before.
:func:`flip_cause` returns the decision, the sentence for the verdict's reason and the
``details["cause_confidence"]`` record (``path`` names the statistic that decided).

The cause's confidence (issue 14, item 5). The record also carries the flip rate as a multiple of
the isotropic-noise prediction, observed / expected, with its exact (Garwood) 95% interval
(:func:`flip_rate_interval`), and what that interval separates: ``"quantization"`` when it lies
below the threshold (a different model flipping at the threshold's rate or more is ruled out),
``"substitution"`` when it lies above, else ``"neither"``. Measured on SmolLM2-135M (docs/detectors.md),
int4 flips at 3.3-3.8x the prediction, right under the 4x threshold, with at most ~2 flips predicted even
at 3,000 tokens, so its interval never lies below the threshold (the near-sibling substitute
``substituted:1`` flips at 8-12x): a QUANTIZATION verdict within production quantization's range is the
milder of the two causes — named because no substitution was found, not because another model was ruled
out — and its reason says so (:func:`milder_cause_clause`). A two-sided rule (QUANTIZATION only when the interval rules out the
threshold) was measured and rejected: it left int4 undetermined in every audit at every budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scipy import stats

from auditor.detectors import IMPLICATIONS, PREFLIGHT_CHECKS
from auditor.detectors.base import DetectorName, DetectorResult
from auditor.detectors.speculation import accepted_by_predictability, predictability_text
from auditor.util import finite

__all__ = ["DECIDES_SAMPLER", "DECISIVE_EMISSION_MARGIN", "DECISIVE_WITHOUT_LOGPROBS", "SAMPLED_FLIP_MAX_SIGMA", "SAMPLED_FLIP_TEST_LEVEL",
           "SAMPLED_IMPROBABLE_TEST_LEVEL", "SAMPLED_SELF_TEST_LEVEL", "EmissionCause", "FlipCause",
           "blind_near_tie_note", "emission_cause", "explained_by_decode_path",
           "failure_summary", "flip_cause", "flip_rate_interval", "implication", "milder_cause_clause",
           "near_tie_blind", "near_tie_reason", "no_speculation_seen", "own_short", "p_adjusted_text", "predictability_clause", "sampled_flip_cause", "sampled_self_contradiction", "sampled_self_text", "set_aside",
           "speculation_clause", "template_note"]

#: The greedy-vs-reference detectors whose findings the provider's decode path (self-greedy) can explain.
_DECODE_PATH_EXPLAINS = (DetectorName.GREEDY_MATCH, DetectorName.GREEDY_HETEROGENEITY, DetectorName.GREEDY_NEAR_TIE)


@dataclass(frozen=True)
class FlipCause:
    """Rule 2's flip evidence.

    Attributes:
        substitution: the deciding ratio exceeds the threshold (a different model).
        value: the deciding ratio (None when neither could be computed).
        text: the evidence as a clause of the verdict's reason.
        confidence: ``details["cause_confidence"]`` (None when no ratio exists).
    """

    substitution: bool
    value: float | None
    text: str
    confidence: dict[str, Any] | None


def _informative(ratio: Any, n_conf: Any, expected: Any, threshold: float) -> bool:
    # the ratio can exceed the threshold only if enough confident positions exist
    return ratio is not None and (float(n_conf or 0) + 1.0) / (float(expected or 0.0) + 1.0) > threshold


def flip_rate_interval(observed: int, expected: float, level: float = 0.95) -> tuple[float, float] | None:
    """Exact (Garwood 1936) interval for the flip rate as a multiple of the isotropic-noise prediction.

    Args:
        observed: confident flips counted (>= 0).
        expected: flips the isotropic-noise model predicts (> 0).
        level: two-sided confidence level.

    Returns:
        (low, high): the Poisson mean's interval, chi2(a/2; 2k)/2 and chi2(1 - a/2; 2k + 2)/2, divided by
        ``expected`` (low is 0 for no flips); None when ``expected`` <= 0 or a count is missing.
    """
    if observed is None or expected is None or not float(expected) > 0 or int(observed) < 0:
        return None
    k, a = int(observed), 1.0 - level
    lo = float(stats.chi2.ppf(a / 2, 2 * k)) / 2 if k > 0 else 0.0
    hi = float(stats.chi2.ppf(1 - a / 2, 2 * k + 2)) / 2
    return lo / float(expected), hi / float(expected)


def _separates(ci: tuple[float, float] | None, threshold: float) -> str:
    if ci is None:
        return "neither"
    return "quantization" if ci[1] < threshold else "substitution" if ci[0] > threshold else "neither"


def _record(path: str, stat: str, value: float, threshold: float, obs: Any, exp_: Any, n_conf: Any, sigma: Any,
            p: Any, informative: bool) -> dict[str, Any]:
    ci = flip_rate_interval(obs, exp_) if obs is not None and exp_ is not None else None
    return {"path": path, "statistic": stat, "value": float(value), "threshold": threshold,
            "log_ratio_to_threshold": float(math.log(value / threshold)) if value > 0 else None,
            "observed": obs, "expected": exp_, "n_confident": n_conf, "sigma_hat": sigma, "poisson_p": p,
            "informative": informative,
            "flip_rate_multiple": float(obs) / float(exp_) if ci is not None else None,
            "flip_rate_ci": list(ci) if ci is not None else None, "separates": _separates(ci, threshold)}


def milder_cause_clause(confidence: Mapping[str, Any] | None) -> str:
    """The words a QUANTIZATION reason adds when its flip evidence does not rule out another model
    (``confidence["separates"] != "quantization"``, see the module docstring); "" when it does.

    Example: "; the flip rate is 3.8x the noise prediction (95% CI 1.4-8.3x), which does not rule out a
    different model (threshold 4x): QUANTIZATION is the milder cause within production quantization's
    range, named because no substitution was found; audit more tokens (or with echo) to tell".
    """
    if confidence is not None and confidence.get("separates") == "quantization":
        return ""
    ci = (confidence or {}).get("flip_rate_ci")
    mult = (confidence or {}).get("flip_rate_multiple")
    thr = (confidence or {}).get("threshold")
    head = (f"; the flip rate is {mult:.2g}x the noise prediction (95% CI {ci[0]:.2g}-{ci[1]:.2g}x), which does not "
            f"rule out a different model (threshold {thr:g}x)" if ci is not None and mult is not None and thr is not None
            else "; the flip evidence does not rule out a different model")
    return (head + ": QUANTIZATION is the milder cause within production quantization's range, named because no "
            "substitution was found; audit more tokens (or with echo) to tell")


def flip_cause(d: Mapping[str, Any], threshold: float) -> FlipCause:
    """Rule 2's flip evidence from ``logprob-divergence``'s details ``d`` (see the module docstring)."""
    flip = d.get("confident_flip_ratio")
    obs, exp_, n_conf = d.get("confident_flips"), d.get("confident_flips_expected"), d.get("n_confident", 0)
    c = d.get("confident_margin_sigmas", 3.0)
    prov_inf = _informative(flip, n_conf, exp_, threshold)
    rp = d.get("reference_path_flip_ratio")
    r_obs, r_exp, r_n = d.get("reference_path_flips"), d.get("reference_path_flips_expected"), \
        d.get("reference_path_n_confident", 0)
    ref_inf = _informative(rp, r_n, r_exp, threshold)
    prov_text = (f"along the provider's own continuations, at {n_conf} positions where the reference is confident "
                 f"(top-1/top-2 margin > {c:g}x the measured logit noise {d.get('sigma_hat') or 0:.3g} nats) the "
                 f"reported top-1 left the reference argmax {obs} times where such noise predicts {exp_:.2g} "
                 f"(flip ratio {flip:.3g}, threshold {threshold:g})") if flip is not None else None
    if ref_inf and rp is not None:
        rp = float(rp)
        conf = _record("reference", "reference_path_flip_ratio", rp, threshold, r_obs, r_exp, r_n,
                       d.get("reference_path_sigma_hat"), d.get("reference_path_flip_p"), True)
        if flip is not None:
            conf["provider_path"] = _record("provider", "confident_flip_ratio", float(flip), threshold, obs, exp_,
                                            n_conf, d.get("sigma_hat"), d.get("confident_flip_p"), prov_inf)
        text = (f"measured by teacher-forcing the provider on the reference's own greedy continuations (echo), at "
                f"{r_n} positions where the reference is confident (margin > {c:g}x the measured logit noise "
                f"{d.get('reference_path_sigma_hat') or 0:.3g} nats) the provider's top-1 left the reference argmax "
                f"{r_obs} times where such noise predicts {float(r_exp or 0):.2g} (reference-path flip ratio {rp:.3g}, "
                f"threshold {threshold:g})")
        if prov_text is not None:
            text += f"; {prov_text}, not used for the cause"
        return FlipCause(rp > threshold, rp, text, conf)
    if flip is None:
        return FlipCause(False, None, "the margin-conditioned flip statistic could not be computed (no logit-noise "
                         "scale)", None)
    conf = _record("provider", "confident_flip_ratio", float(flip), threshold, obs, exp_, n_conf, d.get("sigma_hat"),
                   d.get("confident_flip_p"), prov_inf)
    why_not = d.get("reference_path_reason")
    if rp is not None and not why_not:
        why_not = f"the reference-path (echo) test had too few confident positions ({r_n})"
    if why_not:
        conf["reference_path"] = why_not
    text = prov_text or ""
    if not prov_inf:
        text += (" — too few confident positions for this test to tell a heavily quantized copy from a different "
                 "model" + (f" ({why_not})" if why_not else ""))
    return FlipCause(float(flip) > threshold, float(flip), text, conf)


#: Level of rule 4d's test "more confident flips than SUBSTITUTION_MIN_FLIP_RATIO x the isotropic-noise
#: expectation" on the sampled positions (a cause decision after the family-wise rejection, not a family test).
SAMPLED_FLIP_TEST_LEVEL = 0.01
#: Rule 4d: the largest logit-noise scale σ̂ (nats, ``margin_flip_stats`` on the sampled positions) at which the
#: flip test's isotropic-noise model was calibrated: the maximum over the rule-4d audits of the production
#: quantization pools (int4 1.25 at 100 `verification` tokens over 36 audits, median 0.99; fp8, w8a8, kv-fp8
#: <= 0.36), rounded up. Beyond it (int3 1.5-1.7, the layer-pruned substitute alike) the flip test is outside
#: its calibrated range and the cause is QUANTIZATION_OR_SUBSTITUTION, as rule 2's far-divergence cut-offs say
#: on the logprob path.
SAMPLED_FLIP_MAX_SIGMA = 1.3


def sampled_flip_cause(gof: DetectorResult | None, threshold: float) -> FlipCause | None:
    """Rule 4d's flip evidence: the statistic of :func:`flip_cause` measured on the sampled positions' reported
    top_logprobs (``sampling-gof`` ``details["sampled_path"]``, ``auditor.detectors.sampling.sampled_flip_stats``).

    At sampled prefixes a quantized copy's flip ratio runs higher than at greedy ones (int4 on SmolLM2:
    5 confident flips where isotropic noise predicts 1.04; a different model: 18 where it predicts 0.54), so
    the point ratio of rule 2 is not used alone: a different model is named only when the confident flips
    are significantly more than ``threshold`` x the expectation, P(X >= observed | Poisson(threshold x
    expected)) <= SAMPLED_FLIP_TEST_LEVEL.

    Returns None when ``sampling-gof`` did not run or recorded no such statistic (no provider top_logprobs);
    else a FlipCause with ``confidence["path"] == "sampled"`` and ``confidence["substitution_p"]``.
    """
    sp = (gof.details or {}).get("sampled_path") if gof is not None and gof.ran else None
    if not isinstance(sp, Mapping):
        return None
    fc = flip_cause(sp, threshold)
    if fc.confidence is None:
        return FlipCause(False, fc.value, fc.text, None)
    obs, exp_ = int(sp.get("confident_flips") or 0), float(sp.get("confident_flips_expected") or 0.0)
    p_sub = float(stats.poisson.sf(obs - 1, threshold * exp_)) if obs > 0 and exp_ > 0 else (0.0 if obs > 0 else 1.0)
    conf = dict(fc.confidence, path="sampled", substitution_p=p_sub, substitution_test_level=SAMPLED_FLIP_TEST_LEVEL)
    sub = bool(conf.get("informative")) and fc.substitution and p_sub <= SAMPLED_FLIP_TEST_LEVEL
    text = (fc.text.replace("provider's own continuations", "provider's own sampled continuations")
            + f"; P(>= {obs} flips | {threshold:g}x that prediction) = {p_sub:.2g}")
    return FlipCause(sub, fc.value, text, conf)


#: Level of rule 4d's test "the sampled tokens follow the provider's own reported distribution" (``sampling-gof``
#: ``details["sampled_self"]``, a cause decision after the family-wise rejection, not a family test). A model that
#: samples from what it reports — honest, quantized or another model — passes it at this rate whatever its weights,
#: so a weight cause is taken from rule 4d in at most 1% of such audits; below it the samples contradict the
#: distribution the provider computes: its sampler or verifier emits tokens that distribution did not pick.
SAMPLED_SELF_TEST_LEVEL = 0.01
#: Level of rule 4d's second self-consistency test: more sampled tokens at <= -20 nats of the provider's own
#: reported distribution than any sampler drawing from it can emit (``details["sampled_self"]["improbable"]``,
#: ``auditor.detectors.stats.improbable_draws``, a bound valid for every served model). With the PIT test's level
#: a weight cause is lost to rule 4d in at most 1.1% of the audits of a model that samples from what it reports.
#: Found on a real engine: vLLM 0.32 with ngram speculation, one request at a time, emits 5% of its temperature-1
#: tokens at -20 to -50 nats of its own (and the reference's) distribution, too few per audit for the PIT's
#: mean to move (docs/real-engines.md); the verification suite named it QUANTIZATION in 99 of 444 rejections.
SAMPLED_IMPROBABLE_TEST_LEVEL = 0.001


def sampled_self_contradiction(gof: DetectorResult | None) -> Mapping[str, Any] | None:
    """Rule 4d's self-consistency evidence: ``sampling-gof``'s ``details["sampled_self"]`` (the sampled tokens
    tested against the provider's own reported top_logprobs, ``auditor.detectors.sampling.sampled_self_stats``)
    when its PIT p-value is at most SAMPLED_SELF_TEST_LEVEL or its improbable-token p-value at most
    SAMPLED_IMPROBABLE_TEST_LEVEL; None when neither is, when it is absent (no provider top_logprobs, older
    results, or a gof p-value above ``auditor.detectors.sampling.CAUSE_FEATURE_MAX_P``) or ``sampling-gof`` did
    not run."""
    own = (gof.details or {}).get("sampled_self") if gof is not None and gof.ran else None
    if not isinstance(own, Mapping):
        return None
    return own if _pit_contradicts(own) or _improbable_contradicts(own) else None


def _at_most(p: object, level: float) -> bool:
    """A recorded p-value (None or NaN when absent) at most ``level``."""
    return p is not None and math.isfinite(float(p)) and float(p) <= level  # type: ignore[arg-type]


def _pit_contradicts(own: Mapping[str, Any]) -> bool:
    return _at_most(own.get("p_value"), SAMPLED_SELF_TEST_LEVEL)


def _improbable_contradicts(own: Mapping[str, Any]) -> bool:
    imp = own.get("improbable")
    return isinstance(imp, Mapping) and _at_most(imp.get("p_value"), SAMPLED_IMPROBABLE_TEST_LEVEL)


def own_short(own: Mapping[str, Any]) -> str:
    """The short form of :func:`sampled_self_contradiction`'s evidence ``own`` (a cause's one-line summary)."""
    parts = [f"PIT p={float(own['p_value']):.2g}"]
    if _improbable_contradicts(own):
        imp = own["improbable"]
        parts.append(f"{int(imp['count'])} tokens <= -20 nats, p={float(imp['p_value']):.2g}")
    return ", ".join(parts)


def sampled_self_text(own: Mapping[str, Any]) -> str:
    """The clause a rule-4d reason quotes for :func:`sampled_self_contradiction`'s evidence ``own``."""
    found = []
    if _pit_contradicts(own):
        found.append(f"randomized PIT at {int(own.get('n_positions') or 0)} sampled positions, "
                     f"p={float(own['p_value']):.2g} <= {SAMPLED_SELF_TEST_LEVEL:g}, mean PIT "
                     f"{float(own.get('mean_u', math.nan)):.3f}")
    if _improbable_contradicts(own):
        imp = own["improbable"]
        found.append(f"{int(imp['count'])} of {int(imp['positions'])} sampled tokens at <= -20 nats of that "
                     f"distribution, where a sampler drawing from it emits at most {float(imp['bound_per_position']):.1g}"
                     f" per token, p={float(imp['p_value']):.2g} <= {SAMPLED_IMPROBABLE_TEST_LEVEL:g}")
    return (f"nor do they follow the provider's own reported top_logprobs ({'; '.join(found)}): a quantized or "
            f"another model samples from the distribution it computes and reports, so these tokens come from the "
            f"sampler or the verifier (e.g. drafts emitted without verification), not from the weights")


#: Rules 4b/4c (issue 37 item 8): the emission models name a mechanism only when one family's best law explains the
#: sampled tokens better than the other's by at least this many nats (|log-likelihood ratio|); below it the verdict
#: is the undetermined pair RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT. Derived by benchmarks/emission_margin.py
#: (``--seeds 500 --positions 100``): the smallest margin (0.5-nat grid) at which none of ten emission mechanisms —
#: top-p 0.8 / 0.95, min-p 0.05 / 0.1, top-k 5, llama.cpp's top-k 40 + top-p 0.95 + min-p 0.05 chain; typical
#: acceptance, pro-rata 0.3 / 0.1, SGLang's single threshold 0.5 — is called the wrong family in more than 1% of
#: 500 seeded simulations of 100 sampled positions (tests/detectors/test_emission_margin.py re-derives it on fewer
#: seeds). Measured (500 seeds, 100 positions): typical acceptance decides it — called truncation beyond 3 nats in
#: 3.8% of simulations, beyond 5 in 1.2%, beyond 5.5 in 1.0% — while every truncation law and the other acceptance
#: laws stay <= 1.4% beyond 3 nats and <= 0.2% beyond 5.5 (an earlier seeding of the same script gave 6.0: typical
#: 1.2% beyond 5.5). Margins the issue saw on real engines: llama.cpp (no speculation) 3.29 nats towards
#: truncation, then 2.17 towards acceptance; the relaxed independent server 19-32 nats towards acceptance.
DECISIVE_EMISSION_MARGIN = 5.5


@dataclass(frozen=True)
class EmissionCause:
    """Rule 4b/4c's evidence: which emission law explains the sampled tokens better.

    Attributes:
        truncation: the truncation family's best law beats the acceptance family's (log-lik ratio > 0).
        decisive: by at least DECISIVE_EMISSION_MARGIN nats (else the mechanism is not established).
        value: the log-likelihood ratio, truncation − acceptance (nats).
        text: the evidence as a clause of the verdict's reason.
        confidence: ``details["cause_confidence"]`` (``path`` "emission-models", the ratio in nats, the
            margin as ``threshold`` and ``decisive``).
    """

    truncation: bool
    decisive: bool
    value: float
    text: str
    confidence: dict[str, Any]


def emission_cause(tail: DetectorResult | None) -> EmissionCause | None:
    """Rule 4b's decision from a tail test's ``details["emission"]`` (:mod:`auditor.detectors.emission`).

    Truncation (a top-p / min-p nobody asked for: survivors renormalised pro rata) against lossy acceptance
    (the cut mass moved to the argmax, or every token's share λ moved to it), each the maximum-likelihood law
    of its family on the audit's sampled tokens; the family with the larger likelihood is the one the evidence
    leans to, and it is *established* only when it wins by DECISIVE_EMISSION_MARGIN nats or more (both
    families have a shape and a leak parameter). Returns None when the fit is absent (older results, or a tail
    p-value above ``auditor.detectors.sampling.CAUSE_FEATURE_MAX_P``): the verdict then uses the shape ratio.
    """
    em = (tail.details or {}).get("emission") if tail is not None and tail.ran else None
    if not isinstance(em, Mapping) or em.get("log_lik_ratio") is None:
        return None
    lr = float(em["log_lik_ratio"])
    tr, ac = dict(em.get("truncation") or {}), dict(em.get("acceptance") or {})
    decisive = abs(lr) >= DECISIVE_EMISSION_MARGIN

    def law(d: Mapping[str, Any]) -> str:
        return f"{d.get('cut')} {float(d.get('parameter') or 0):g}, leak {float(d.get('leak') or 0):g}"

    text = (f"of two emission laws fitted to the {em.get('n')} sampled tokens, truncation ({law(tr)}; survivors "
            f"renormalised) explains them {abs(lr):.3g} nats {'better' if lr > 0 else 'worse'} than lossy acceptance "
            f"({law(ac)}; the mass moved to the argmax)"
            + ("" if decisive else f", less than the {DECISIVE_EMISSION_MARGIN:g}-nat margin that decides"))
    conf = {"path": "emission-models", "statistic": "log_lik_ratio", "value": lr,
            "threshold": DECISIVE_EMISSION_MARGIN, "decisive": decisive,
            "truncation": tr, "acceptance": ac, "n": em.get("n")}
    return EmissionCause(lr > 0, decisive, lr, text, conf)


#: What a decisive audit of a deviating sampler needs (verdict rule ``4-mechanism-undetermined``).
DECIDES_SAMPLER = (f"a decisive audit needs more sampled tokens (--suite verification: the emission models decide at a "
                   f"{DECISIVE_EMISSION_MARGIN:g}-nat margin) and streaming, so that the speculation fingerprint can "
                   "see whether the provider speculates")


def no_speculation_seen(speculation: Mapping[str, Any] | None) -> bool:
    """The audit's speculation fingerprint (``auditor.detectors.speculation``, ``{"detected", ...}``) says the
    provider does not speculate (``detected`` is False); None, "cannot tell" or a detection are not that."""
    return isinstance(speculation, Mapping) and speculation.get("detected") is False


def predictability_clause(speculation: Mapping[str, Any] | None, *, chunks_are_steps: bool,
                          only_flat: bool = False) -> str:
    """The speculation fingerprint's accepted length on predictable against unpredictable prompts as a clause
    of an unverified-drafts reason (rules 1u, 1d; issue 35 item 3), "" when it has no such figures
    (:func:`auditor.detectors.speculation.accepted_by_predictability`), when they are tokens per stream chunk
    and ``chunks_are_steps`` is False (nothing shows the chunks end at verification steps), or when
    ``only_flat`` and the length does move. A strict verifier's accepted length grows where the text is
    predictable (the target agrees with more drafts); synthetic acceptance's is the same on every prompt."""
    fig = accepted_by_predictability(speculation)
    if fig is None or (fig["per"] == "chunk" and not chunks_are_steps) or (only_flat and fig["trend"] != "flat"):
        return ""
    figures = predictability_text(fig, unit="streamed step")
    if fig["trend"] == "flat":
        return (f"; the speculation fingerprint's accepted length does not move with predictability ({figures}): "
                "a strict verifier's accepted length grows where the text is predictable, as the target agrees with "
                "more drafts, while synthetic acceptance emits the same number of drafts per step whatever the text")
    if fig["trend"] == "grows":
        return (f"; the speculation fingerprint's accepted length grows with predictability ({figures}), as a "
                "verifier's does: not a fixed accepted length")
    return f"; the speculation fingerprint's accepted length against predictability is undetermined ({figures})"


def speculation_clause(speculation: Mapping[str, Any] | None) -> str:
    """The fingerprint as a clause of a verdict's reason, e.g. "the speculation fingerprint saw no speculation
    (1.00 tokens per verification step)"; "" without a fingerprint that decided."""
    if not isinstance(speculation, Mapping) or speculation.get("detected") is None:
        return ""
    m = speculation.get("mean_accepted_tokens_per_step")
    per = f" ({float(m):.2f} tokens per verification step)" if isinstance(m, int | float) else ""
    return ("the speculation fingerprint saw no speculation" if speculation.get("detected") is False
            else "the speculation fingerprint saw speculation") + per


#: What an audit of a provider without top_logprobs needs to tell quantization from lossy greedy verification.
DECISIVE_WITHOUT_LOGPROBS = ("a decisive audit needs the provider's top_logprobs (capabilities.logprobs = true, if it "
                             "offers them) or the sampling suite (--suite verification: lossy acceptance over-emits "
                             "the argmax at temperature 1, quantized weights do not)")


def near_tie_blind(r: DetectorResult) -> bool:
    """``r`` (a ``greedy-near-tie`` result) counted its flips without any of the provider's own top_logprobs
    (``flips_with_provider_list`` recorded and 0): the flips cannot tell a model whose argmax moved from a
    lossy greedy verifier (rule ``3n-model-or-verification``). Results without the count (stored before it
    existed) are not called blind."""
    listed = (r.details or {}).get("flips_with_provider_list")
    return listed is not None and int(listed) == 0


def blind_near_tie_note(r: DetectorResult) -> str:
    """The note beside a rejecting ``greedy-near-tie`` finding whose flips came without the provider's top_logprobs
    (:func:`near_tie_blind`); "" for any other result."""
    if r.name != DetectorName.GREEDY_NEAR_TIE or not near_tie_blind(r):
        return ""
    return ("; without the provider's own top_logprobs this cannot tell a lossy greedy verifier from quantized "
            "weights, which move near-ties too")


def near_tie_reason(r: DetectorResult, *, own: bool = False, blind: bool = False) -> str:
    """Rule 3n's reason from a rejecting ``greedy-near-tie`` result ``r`` (p_adjusted set); ``own``: most flips
    are the provider's own reported top-1 (rule ``3n-model``: a model whose logits differ); ``blind``: no flip
    came with the provider's top_logprobs (rule ``3n-model-or-verification``: not established which)."""
    d = r.details or {}
    if blind:
        return (f"at temperature 0 the provider emits the reference's runner-up at near-ties {int(r.statistic)} times "
                f"in {r.n} positions where honest numeric noise allows at most {float(d.get('expected', math.nan)):.2g} "
                f"(margins within the {float(d.get('band', math.nan)):.3g}-nat band): the served model or its "
                "verification deviates — quantized weights (whose argmax moves at near-ties) or a greedy verifier "
                "accepting non-argmax drafts — but not established which: the provider returned no top_logprobs, "
                f"which alone tell the two apart; {DECISIVE_WITHOUT_LOGPROBS} (greedy-near-tie p_adj={r.p_adjusted:.3g})")
    if own:
        return (f"at temperature 0 the provider emits the reference's runner-up at near-ties {int(r.statistic)} times "
                f"in {r.n} positions where honest numeric noise allows at most {float(d.get('expected', math.nan)):.2g}, "
                f"and at {d.get('flips_own_top1')} of the {d.get('flips_with_provider_list')} flips with reported "
                f"top_logprobs the emitted token is its own reported top-1: the served model's logits differ from the "
                f"reference's (quantization or another model), not lossy verification (greedy-near-tie "
                f"p_adj={r.p_adjusted:.3g})")
    return (f"at temperature 0 the provider emits the reference's runner-up at near-ties {int(r.statistic)} times "
            f"in {r.n} positions where honest numeric noise allows at most {float(d.get('expected', math.nan)):.2g} "
            f"(margins within the {float(d.get('band', math.nan)):.3g}-nat band): greedy verification accepts "
            f"non-argmax drafts{span_clause(d.get('spans'))} (greedy-near-tie p_adj={r.p_adjusted:.3g})")


def span_clause(spans: Any) -> str:
    """`` inside the reasoning span (...)`` when a reasoning model's near-tie flips sit in its
    reasoning span and not beyond the answer's honest expectation (issue 35: engines relax
    verification inside ``<think>`` only); ``""`` otherwise or without span figures
    (``greedy-near-tie`` details ``spans``)."""
    if not isinstance(spans, dict) or "reasoning" not in spans:
        return ""
    r, a = spans.get("reasoning") or {}, spans.get("answer") or {}
    rf, af = int(r.get("flips", 0)), int(a.get("flips", 0))
    if rf == 0 or af > max(1.0, 2.0 * float(a.get("expected", 0.0))):
        return ""
    return (f" inside the reasoning span ({rf} of {rf + af} flips there, in {int(r.get('positions', 0))} of its "
            f"near-tie positions; {af} in {int(a.get('positions', 0))} answer positions)")


def span_localized(spans: Any, alpha: float) -> bool:
    """Whether a reasoning model's greedy departures are confined to its reasoning span (issue 35): the
    answer's are within their honest expectation (:func:`span_clause`) *and* the reasoning span's rate is
    higher than the answer's by a one-sided Fisher exact test at ``alpha`` — the answer had positions
    enough to show the difference. ``spans``: ``{"reasoning"|"answer": {positions, flips, expected}}``."""
    if not span_clause(spans):
        return False
    r, a = spans["reasoning"], spans.get("answer") or {}
    rn, rf = int(r.get("positions", 0)), int(r.get("flips", 0))
    an, af = int(a.get("positions", 0)), int(a.get("flips", 0))
    if an == 0:
        return False
    p = stats.fisher_exact([[rf, rn - rf], [af, an - af]], alternative="greater").pvalue
    return bool(p <= alpha)


def explained_by_decode_path(name: str, rejects: Callable[[str], bool]) -> str:
    """The note beside a greedy-vs-reference finding when ``self-greedy`` also rejects: the provider's
    T=0 tokens are not its own reported top-1 either (e.g. llama.cpp's default repetition penalty
    before the greedy pick, docs/real-engines.md), so those mismatches need no other model."""
    if name in _DECODE_PATH_EXPLAINS and rejects(DetectorName.SELF_GREEDY):
        return ("; here explained by the provider's decode path (self-greedy rejects: its greedy tokens are not its "
                "own reported top-1 either)")
    return ""


def set_aside(r: DetectorResult, template: Mapping[str, object]) -> DetectorResult:
    """``r`` as not run: its reference was scored on a prompt the provider did not see (a template mismatch)."""
    return replace(r, ran=False, p_adjusted=None, reason=(
        "set aside: the provider's prompt differs from the reference rendering "
        f"({template.get('provider_prompt_tokens')} vs {template.get('reference_prompt_tokens')} prompt tokens)"),
        details={**(r.details or {}), "set_aside_p_value": finite(r.p_value)})


def template_note(t: Mapping[str, object]) -> str:
    """The clause a verdict's reason ends with when the provider's prompt rendering differs from the reference's."""
    return (f"the provider counts {t.get('provider_prompt_tokens')} prompt tokens where the reference renders "
            f"{t.get('reference_prompt_tokens')} (a different chat template or an injected system prompt), so only "
            "the reference-free tests were scored; the reference comparisons were set aside, not counted against it")


def failure_summary(f: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``{"failed", "total", "share", "kinds"}`` of a run's failed probes (kinds by count, descending), or None
    when nothing is known (``f`` empty or no probe counted)."""
    if not f:
        return None
    total = int(f.get("total") or 0)
    failed = int(f.get("failed") or 0)
    if total <= 0:
        return None
    kinds = dict(sorted(dict(f.get("kinds") or {}).items(), key=lambda kv: -int(kv[1])))
    return {"failed": failed, "total": total, "share": failed / total, "kinds": kinds}


def implication(name: str) -> str:
    """Short cause-naming phrase of a rejecting detector or pre-flight check (registry), "" if unknown."""
    pre = PREFLIGHT_CHECKS.get(name)
    return pre.implication if pre is not None else IMPLICATIONS.get(name, "")


def p_adjusted_text(by: Mapping[str, DetectorResult], names: Sequence[str]) -> str:
    """"name p_adj=..." for each of ``names`` that ran with an adjusted p-value, comma-separated."""
    parts = []
    for k in names:
        r = by.get(k)
        if r is not None and r.ran and r.p_adjusted is not None:
            parts.append(f"{k} p_adj={r.p_adjusted:.3g}")
    return ", ".join(parts)


