"""Metrics of resampled audits and the issue-7 targets.

Per profile × budget: rejection rate (a deviation verdict; on honest profiles the
false-accusation rate, on the others the power) with a Clopper–Pearson 95% interval, verdict
counts, the cause-correct rate among rejections, INCONCLUSIVE rate and per-detector contributions
(:class:`CalibrationRecord`); the smallest budget reaching a power (:func:`tokens_for_power`) and
the targets of issue 7 (:func:`check_targets`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

import numpy as np
from scipy import stats

from auditor.calibration.draws import MODES, AuditMix, AuditOutcome
from auditor.calibration.pool import Pool
from auditor.util import json_safe
from auditor.verdict.kinds import UNDETERMINED_CAUSES, VerdictKind
from simulator.profiles import Profile, find_profile, get_profile

__all__ = [
    "ACCEPTED_CAUSES",
    "MAX_FALSE_ACCUSATION",
    "MAX_FALSE_ACCUSATION_UPPER",
    "MIN_CAUSE_CORRECT",
    "POWER_TARGETS",
    "SPAN_NAMED_TARGETS",
    "TARGET_POWER",
    "CalibrationRecord",
    "check_targets",
    "clopper_pearson",
    "precision_named",
    "record_grid",
    "record_suite",
    "summarize_audits",
    "tokens_for_power",
    "verdict_rates",
]

#: Verdicts that count as "cause named right" per profile, beyond ``Profile.expected_verdict``.
#: ``greedy-verify`` serves sampling requests greedily; the verdict rules (docs/detectors.md,
#: rule 4a) name that DECODING_NONCOMPLIANT while the simulator profile files it under
#: RELAXED_VERIFICATION; both describe the behaviour, so both count.
ACCEPTED_CAUSES: dict[str, tuple[str, ...]] = {
    "greedy-verify": ("RELAXED_VERIFICATION", "DECODING_NONCOMPLIANT"),
}

#: Verdicts that name a deviation (a rejection): every verdict but PASS and INCONCLUSIVE.
_DEVIATIONS = tuple(str(v) for v in VerdictKind if v not in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson 1934) two-sided interval for a binomial proportion k/n.

    Uses ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``; (nan, nan) when n == 0.
    """
    if n <= 0:
        return (math.nan, math.nan)
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return (float(ci.low), float(ci.high))


def verdict_rates(verdicts: Counter[str], profile: Profile) -> dict:
    """Rates of ``n = sum(verdicts.values())`` audits of ``profile`` (n >= 1).

    Returns:
        rejections (audits with a deviation verdict), rejection_rate with its Clopper–Pearson
        95% interval (ci_low, ci_high), cause_correct_rate (share of rejections naming the
        profile's cause or one of :data:`ACCEPTED_CAUSES`; None for honest profiles or without
        rejections), pass_rate, inconclusive_rate, verdicts (verdict → count), in that order.
    """
    n = sum(verdicts.values())
    rej = sum(verdicts[v] for v in _DEVIATIONS)
    lo, hi = clopper_pearson(rej, n)
    accepted = set(ACCEPTED_CAUSES.get(profile.name, ())) | {profile.expected_verdict}
    correct = sum(verdicts[v] for v in _DEVIATIONS if v in accepted)
    return {
        "rejections": int(rej),
        "rejection_rate": rej / n,
        "ci_low": lo,
        "ci_high": hi,
        "cause_correct_rate": None if profile.honest or rej == 0 else correct / rej,
        "pass_rate": verdicts["PASS"] / n,
        "inconclusive_rate": verdicts["INCONCLUSIVE"] / n,
        "verdicts": dict(verdicts),
    }


@dataclass
class CalibrationRecord:
    """One profile × budget cell of the benchmark (a row of docs/calibration.json).

    Attributes:
        profile, family, expected_verdict: the simulator profile and the verdict it should get.
        honest: True for honest profiles (``rejection_rate`` is then the false-accusation rate).
        budget_tokens: completion tokens per audit; audits: audits run.
        rejections: audits with a deviation verdict (QUANTIZATION, RELAXED_VERIFICATION,
            SUBSTITUTION, QUANTIZATION_OR_SUBSTITUTION, DECODING_NONCOMPLIANT).
        rejection_rate, ci_low, ci_high: rejections/audits with a Clopper–Pearson 95% interval.
        cause_correct_rate: among rejections, the share naming the profile's cause (None for
            honest profiles or without rejections); pass_rate, inconclusive_rate: shares of
            PASS and INCONCLUSIVE verdicts.
        verdicts: verdict → count (the confusion row of this profile).
        detectors: detector → {"ran": share of audits it ran, "rejected": share where it rejected
            after Holm, "effect_median": median effect over the audits it ran in, in the unit of
            its power target (``auditor.verdict.power.power_effect``; None without one)};
            rules: deciding rule → count.
        budget_tokens is the planned budget (Σ max_tokens of the requests, ``--budget-tokens``);
        tokens: mean completion tokens actually returned per mode; completion_tokens: their
        mean total; sampled_tokens: mean T=1 tokens returned; planned_tokens: mean planned total;
        prompt_tokens: mean prompt (input) tokens per audit (for its price).
        reused_rate: share of audits that had to reuse sampling items (pool too small).
        pool: pool sizes; mix: probe-mix name; alpha; model, revision; design: ``fixed``.
        precision_named: for a deviating profile that serves a known precision class below the card (its
            rejections' reports should name it), whether they do (:func:`precision_named`); None otherwise, and in
            records written before it was counted.
    """

    profile: str
    family: str
    expected_verdict: str
    honest: bool
    budget_tokens: int
    audits: int
    rejections: int
    rejection_rate: float
    ci_low: float
    ci_high: float
    cause_correct_rate: float | None
    pass_rate: float
    inconclusive_rate: float
    verdicts: dict[str, int]
    detectors: dict[str, dict[str, float | None]]
    rules: dict[str, int]
    tokens: dict[str, float]
    sampled_tokens: float
    completion_tokens: float
    planned_tokens: float
    prompt_tokens: float
    reused_rate: float
    pool: dict
    mix: str
    alpha: float
    model: str
    revision: str
    design: str = "fixed"
    extra: dict = field(default_factory=dict)
    precision_named: dict | None = None

    def to_dict(self) -> dict:
        """JSON-able dict (non-finite floats → None): one row of docs/calibration.json."""
        return cast(dict, json_safe(asdict(self)))


def summarize_audits(
    outcomes: Sequence[AuditOutcome], pool: Pool, *, mix: AuditMix, alpha: float
) -> list[CalibrationRecord]:
    """Aggregate audit outcomes into one :class:`CalibrationRecord` per budget."""
    prof = get_profile(pool.profile)
    recs = []
    for B in sorted({o.budget for o in outcomes}):
        os_ = [o for o in outcomes if o.budget == B]
        n = len(os_)
        verdicts = Counter(o.verdict for o in os_)
        dets: dict[str, dict[str, float | None]] = {}
        names = sorted({k for o in os_ for k in o.ran} | {k for o in os_ for k in o.rejected})
        for k in names:
            eff = [o.effects[k] for o in os_ if k in o.effects]
            dets[k] = {
                "ran": sum(k in o.ran for o in os_) / n,
                "rejected": sum(k in o.rejected for o in os_) / n,
                # median effect in the power target's unit (auditor.verdict.power.power_effect)
                "effect_median": float(np.median(eff)) if eff else None,
            }
        tokens = {m: float(np.mean([o.tokens.get(m, 0) for o in os_])) for m in MODES}
        extra: dict = {}
        if any(o.spans for o in os_):  # a reasoning-mode pool (think:PROFILE): tokens per span, the span named
            rej = [o for o in os_ if o.verdict in _DEVIATIONS]
            extra = {"span_tokens": {k: float(np.mean([o.spans.get(k, 0) for o in os_]))
                                     for k in sorted({k for o in os_ for k in o.spans})},
                     "reasoning_tokens": float(np.mean([o.spans.get("reasoning", 0) for o in os_])),
                     "span_named_rate": sum(o.span_named for o in rej) / len(rej) if rej else None}
        recs.append(
            CalibrationRecord(
                profile=prof.name,
                family=prof.family,
                expected_verdict=prof.expected_verdict,
                honest=prof.honest,
                budget_tokens=int(B),
                audits=n,
                **verdict_rates(verdicts, prof),
                detectors=dets,
                rules=dict(Counter(o.rule for o in os_)),
                tokens=tokens,
                sampled_tokens=tokens["sampling"],
                completion_tokens=float(np.mean([sum(o.tokens.values()) for o in os_])),
                planned_tokens=float(np.mean([sum(o.planned.values()) for o in os_])),
                prompt_tokens=float(np.mean([o.prompt_tokens for o in os_])),
                reused_rate=sum(o.reused for o in os_) / n,
                pool=pool.summary(),
                mix=mix.name,
                alpha=alpha,
                model=pool.model,
                revision=pool.revision,
                extra=extra,
                precision_named=precision_named(os_),
            )
        )
    return recs


def precision_named(outcomes: Sequence[AuditOutcome]) -> dict | None:
    """Whether the rejections' reports name the precision class the profile serves (issue 36: "the report's precision
    estimate names the right class in >= 90% of rejections").

    A rejection counts as named when its report's precision estimate (``AuditOutcome.estimate``, the estimate's
    ``best``) is the profile's precision class (``AuditOutcome.true_precision``,
    ``auditor.verdict.precision_estimate.profile_precision``); a rejection whose report carries no estimate (a
    verdict other than QUANTIZATION / QUANTIZATION_OR_SUBSTITUTION) counts as not named.

    Args:
        outcomes: the audits of one cell.

    Returns:
        None when the profile has no known precision class (honest, verification or decoding profiles, or a
        class not below the card); else ``{"class", "named", "rejections", "estimated", "rate", "ci_low", "ci_high",
        "instead", "nearest"}``: named / rejections with its Clopper–Pearson 95% interval (rate and interval None
        without rejections), ``estimated`` the rejections whose report has an estimate, ``instead`` best precision
        class → count over the rejections not named (``"none"`` for no estimate), ``nearest`` nearest class key →
        count over the estimated rejections.
    """
    truth = next((o.true_precision for o in outcomes if o.true_precision is not None), None)
    if truth is None:
        return None
    rej = [o for o in outcomes if o.verdict in _DEVIATIONS]
    named = sum(o.estimate == truth for o in rej)
    lo, hi = clopper_pearson(named, len(rej))
    return {
        "class": truth,
        "named": int(named),
        "rejections": len(rej),
        "estimated": sum(o.estimate is not None for o in rej),
        "rate": named / len(rej) if rej else None,
        "ci_low": lo if rej else None,
        "ci_high": hi if rej else None,
        "instead": dict(Counter(o.estimate or "none" for o in rej if o.estimate != truth)),
        "nearest": dict(Counter(o.estimate_class for o in rej if o.estimate_class is not None)),
    }


#: Power targets on the bundled model (issue 7, tightened and extended by issue 14; the ``think:`` reasoning-mode
#: cells by issue 35 item 5; ``unverified-mixed-batch`` by issue 40): profile → (tokens, unit) where unit is ``tokens`` (audit budget), ``sampled``
#: (temperature-1 tokens within the audit) or ``reasoning`` (reasoning-span tokens within the audit). Met when
#: the best suite reaches TARGET_POWER within the limit.
POWER_TARGETS: dict[str, tuple[int, str]] = {
    "int4": (100, "tokens"),
    "int8": (500, "tokens"),
    "fp8": (2000, "tokens"),
    "w8a8": (500, "tokens"),
    "kv-fp8": (3000, "tokens"),
    "relaxed-threshold": (500, "sampled"),
    "relaxed-threshold:0.7": (2000, "sampled"),
    "typical-acceptance": (500, "sampled"),
    "greedy-relaxed": (300, "tokens"),
    "mix-int4:0.1": (1000, "tokens"),
    "substituted": (100, "tokens"),
    "think:relaxed-think": (1000, "reasoning"),
    "think:synthetic-acceptance:3": (500, "tokens"),
    "unverified-mixed-batch": (500, "tokens"),  # issue 40: unverified greedy tokens of a speculating engine
}
TARGET_POWER = 0.95
#: Reasoning-mode cells whose rejections must also say "inside the reasoning span" (issue 35: the rule relaxes
#: verification there only), in at least MIN_CAUSE_CORRECT of them.
SPAN_NAMED_TARGETS = ("think:relaxed-think",)
MAX_FALSE_ACCUSATION = 0.05
MAX_FALSE_ACCUSATION_UPPER = 0.08
MIN_CAUSE_CORRECT = 0.90


def tokens_for_power(records: Sequence[dict], power: float = TARGET_POWER, *, unit: str = "tokens") -> dict:
    """Smallest budget reaching ``power`` from fixed-budget records of one profile.

    Returns:
        {"grid": first calibrated budget with rejection_rate >= power (None if none),
         "interpolated": log-linear interpolation of the power curve between the grid budgets
         bracketing ``power`` (None if not reached), "unit": tokens|sampled,
         "power_at_max": rejection rate at the largest budget}. With ``unit="sampled"`` the
         x axis is the mean sampled (T=1) tokens per audit, with ``unit="reasoning"`` the mean
         reasoning-span tokens per audit (``extra["reasoning_tokens"]`` of a reasoning-mode cell).
    """
    rs = sorted((r for r in records if r.get("design", "fixed") == "fixed"), key=lambda r: r["budget_tokens"])
    if not rs:
        return {"grid": None, "interpolated": None, "unit": unit, "power_at_max": None}
    xs = [float(r["budget_tokens"] if unit == "tokens" else r.get("sampled_tokens", 0.0) if unit == "sampled"
                else (r.get("extra") or {}).get("reasoning_tokens", 0.0)) for r in rs]
    ys = [float(r["rejection_rate"]) for r in rs]
    grid = interp = None
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if y >= power:
            grid = x
            if i == 0:
                interp = x
            else:
                x0, y0 = xs[i - 1], ys[i - 1]
                if y == y0 or x0 <= 0:
                    interp = x
                else:
                    f = (power - y0) / (y - y0)
                    interp = float(math.exp(math.log(x0) + f * (math.log(x) - math.log(x0))))
            break
    return {"grid": grid, "interpolated": interp, "unit": unit, "power_at_max": ys[-1]}


def check_targets(records: Sequence[dict]) -> list[dict]:
    """Evaluate the issue-7 targets on fixed-budget records (one row per target, with ``met``); records that count
    whether the precision estimate named the profile's class (``precision_named``) add one row per profile and suite
    (issue 36)."""
    fixed = [r for r in records if r.get("design", "fixed") == "fixed"]
    by: dict[str, list[dict]] = {}
    for r in fixed:
        by.setdefault(r["profile"], []).append(r)
    rows = []
    mix_names = list(dict.fromkeys(record_suite(r) for r in fixed))
    for p, rs_all in by.items():
        prof = find_profile(p)
        if prof is not None and prof.honest:
            for mname in mix_names:  # one row per suite: each is a way to audit, each must hold
                rs = [r for r in rs_all if record_suite(r) == mname]
                if not rs:
                    continue
                worst = max(rs, key=lambda r: (r["rejection_rate"], r["ci_high"]))
                rows.append({
                    "profile": p,
                    "suite": mname,
                    "target": f"false accusation <= {MAX_FALSE_ACCUSATION} (upper CI <= {MAX_FALSE_ACCUSATION_UPPER}) at every "
                              f"budget, suite `{mname}`",
                    "measured": f"max {worst['rejection_rate']:.3f} [{worst['ci_low']:.3f}, {worst['ci_high']:.3f}] at "
                                f"{worst['budget_tokens']} tokens; mean {np.mean([r['rejection_rate'] for r in rs]):.3f} over "
                                f"{len(rs)} budgets",
                    "met": all(r["rejection_rate"] <= MAX_FALSE_ACCUSATION and r["ci_high"] <= MAX_FALSE_ACCUSATION_UPPER
                               for r in rs),
                })
    for p, (limit, unit) in POWER_TARGETS.items():
        if p not in by:
            continue
        per_mix: dict[str, list[dict]] = {}
        for r in by[p]:
            per_mix.setdefault(record_suite(r), []).append(r)
        found = {m: tokens_for_power(rs, TARGET_POWER, unit=unit) for m, rs in per_mix.items()}
        parts = []
        for m, tp in found.items():
            x = tp["interpolated"]
            parts.append(f"`{m}`: " + (f"{x:.0f} {unit} (grid {tp['grid']:.0f})" if x is not None
                                        else f"not reached ({tp['power_at_max']:.2f} at its largest budget)"))
        reached = {m: tp["interpolated"] for m, tp in found.items() if tp["interpolated"] is not None}
        best = min(reached, key=lambda m: reached[m]) if reached else None
        rows.append({
            "profile": p,
            "target": f">= {TARGET_POWER:.0%} power at <= {limit} "
                      + {"sampled": "sampled tokens", "reasoning": "reasoning tokens"}.get(unit, "tokens"),
            "measured": "; ".join(parts),
            "best_suite": best,
            "met": best is not None and reached[best] <= limit,
        })
        if best is not None and p in SPAN_NAMED_TARGETS:  # issue 35: "the verdict names the reasoning span"
            named, n_rej = _span_named_counts(per_mix[best])
            if n_rej:
                rows.append({
                    "profile": p,
                    "suite": best,
                    "target": f"verdict names the reasoning span in >= {MIN_CAUSE_CORRECT:.0%} of rejections, "
                              f"best suite `{best}`",
                    "measured": f"{named / n_rej:.3f} ({named}/{n_rej})",
                    "met": named / n_rej >= MIN_CAUSE_CORRECT,
                })
        if best is not None:  # the acceptance's "with the cause right": that profile, its best suite, all budgets
            ok, und, n_rej = _cause_counts(per_mix[best])
            if n_rej:
                rows.append({
                    "profile": p,
                    "suite": best,
                    "target": f"cause named right in >= {MIN_CAUSE_CORRECT:.0%} of rejections, best suite `{best}`",
                    "measured": _cause_text(ok, und, n_rej),
                    "met": ok / n_rej >= MIN_CAUSE_CORRECT,
                })
    for (p, mname), (named, n_rej, cls) in _precision_named_counts(fixed).items():
        rows.append({  # issue 36: "the report's precision estimate names the right class in >= 90% of rejections"
            "profile": p,
            "suite": mname,
            "target": f"precision estimate names {cls} in >= {MIN_CAUSE_CORRECT:.0%} of rejections, suite `{mname}`",
            "measured": f"{named / n_rej:.3f} ({named}/{n_rej}) over every budget",
            "met": named / n_rej >= MIN_CAUSE_CORRECT,
        })
    for mname in mix_names:
        rej = [r for r in fixed if record_suite(r) == mname
               and not ((q := find_profile(r["profile"])) is not None and q.honest)]
        n_ok, n_und, n_rej = _cause_counts(rej)
        if n_rej:
            rows.append({
                "profile": "all deviating profiles",
                "suite": mname,
                "target": f"cause named right in >= {MIN_CAUSE_CORRECT:.0%} of rejections, suite `{mname}`",
                "measured": _cause_text(n_ok, n_und, n_rej),
                "met": n_ok / n_rej >= MIN_CAUSE_CORRECT,
            })
    return rows


#: The undetermined answers (``auditor.verdict.kinds.UNDETERMINED_CAUSES``): a deviation whose cause is one of two, which
#: one undetermined. Neither right nor wrong for a profile whose expected verdict is one of its two causes, and
#: counted apart.
_UNDETERMINED = {str(v): {str(c) for c in pair} for v, pair in UNDETERMINED_CAUSES.items()}


def _cause_counts(records: Sequence[dict]) -> tuple[int, dict[str, int], int]:
    """(cause named right, undetermined per undetermined verdict, rejections) summed over ``records``; the
    undetermined verdicts (``auditor.verdict.kinds.UNDETERMINED_CAUSES``) are counted for
    profiles whose expected verdict is one of that verdict's two causes."""
    ok = n = 0
    und: dict[str, int] = {}
    for r in records:
        k = int(r.get("rejections") or 0)
        if not k:
            continue
        n += k
        ok += round(k * (r.get("cause_correct_rate") or 0.0))
        verdicts = r.get("verdicts") or {}
        for v, pair in _UNDETERMINED.items():
            if r.get("expected_verdict") in pair and verdicts.get(v):
                und[v] = und.get(v, 0) + int(verdicts[v])
    return ok, und, n


def _precision_named_counts(records: Sequence[dict]) -> dict[tuple[str, str], tuple[int, int, str]]:
    """(profile, suite) → (rejections whose report named the profile's precision class, rejections, that class) summed
    over the budgets of ``records`` that carry ``precision_named`` (:func:`precision_named`) and have rejections."""
    out: dict[tuple[str, str], tuple[int, int, str]] = {}
    for r in records:
        pn = r.get("precision_named") or {}
        if not pn.get("rejections"):
            continue
        key = (str(r["profile"]), record_suite(r))
        k, n, _ = out.get(key, (0, 0, ""))
        out[key] = (k + int(pn["named"]), n + int(pn["rejections"]), str(pn["class"]))
    return out


def _span_named_counts(records: Sequence[dict]) -> tuple[int, int]:
    """(rejections whose verdict names the reasoning span, rejections) summed over reasoning-mode ``records``
    (``extra["span_named_rate"]``, :func:`summarize_audits`)."""
    named = n = 0
    for r in records:
        k = int(r.get("rejections") or 0)
        rate = (r.get("extra") or {}).get("span_named_rate")
        if k and rate is not None:
            n += k
            named += round(k * float(rate))
    return named, n


def _cause_text(ok: int, und: dict[str, int], n: int) -> str:
    wrong = n - ok - sum(und.values())
    return (f"{ok / n:.3f} ({ok}/{n})" + "".join(f"; undetermined {v.lower().replace('_', '-')} {u / n:.3f} ({u})"
                                                for v, u in und.items()) + f"; wrong cause {wrong / n:.3f} ({wrong})")


def record_suite(r: dict) -> str:
    """The suite (probe mix) of a calibration record; records written before suites existed are ``default``."""
    return str(r.get("mix") or "default")



def record_grid(fixed: Sequence[dict]) -> tuple[list[int], dict[str, list[dict | None]]]:
    """Fixed-budget records of one suite laid out as a profile × budget table.

    Returns:
        (budgets ascending, profile (first-seen order) → its record at each budget, None where
        it has none; the first record of a repeated cell).
    """
    budgets = sorted({r["budget_tokens"] for r in fixed})
    at: dict[tuple[str, int], dict] = {}
    for r in fixed:
        at.setdefault((r["profile"], r["budget_tokens"]), r)
    profiles = dict.fromkeys(r["profile"] for r in fixed)
    return budgets, {p: [at.get((p, b)) for b in budgets] for p in profiles}
