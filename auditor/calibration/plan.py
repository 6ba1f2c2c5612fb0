"""``auditor plan``: how many tokens (and USD) an audit needs for a power against a deviation.

Answered from calibration records (:func:`auditor.calibration.store.load_calibration`): the
smallest *calibrated* budget whose measured rejection rate reaches the power, per suite; when no
one suite reaches every deviation of the target, one audit per suite that does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from auditor.calibration.metrics import TARGET_POWER, record_suite, tokens_for_power
from auditor.verdict.cause import DECISIVE_WITHOUT_LOGPROBS
from simulator.profiles import THINK_PREFIX

if TYPE_CHECKING:
    from probes.config import Capabilities, Pricing

__all__ = ["PLAN_TARGETS", "make_plan", "target_profiles"]

#: ``auditor plan --target`` names → simulator profiles. ``any`` is every deviation class the calibration holds for
#: the model served as plain chat (:func:`target_profiles`: mixtures, kv-fp8, w8a8, greedy-relaxed, ... included;
#: issue 37 item 4 — it used to list six of them, and a 10% int4 mixture passed at the budget it advised);
#: ``reasoning`` every deviation calibrated in reasoning mode (``think:PROFILE`` cells, issue 35 item 5), for a
#: reasoning model's audit.
PLAN_TARGETS: dict[str, tuple[str, ...]] = {
    "int8": ("int8",),
    "int4": ("int4",),
    "fp8": ("fp8",),
    "relaxed": ("relaxed-threshold",),
    "typical": ("typical-acceptance",),
    "substituted": ("substituted",),
    "relaxed-think": (THINK_PREFIX + "relaxed-think",),
    "synthetic-acceptance": (THINK_PREFIX + "synthetic-acceptance:3",),
    "unverified": ("unverified-mixed-batch",),
    "any": (),
    "reasoning": (),
}


def target_profiles(target: str, rows: Sequence[dict]) -> tuple[str, ...]:
    """The profiles a plan for ``target`` must reach: :data:`PLAN_TARGETS`, or for ``any`` (``reasoning``) every
    plain-chat (reasoning-mode, ``think:``) profile of ``rows`` (one model's calibration records) that is not honest
    (``honest`` false and an expected verdict other than PASS), in the records' order.

    Raises:
        KeyError: unknown target.
    """
    if target not in PLAN_TARGETS:
        raise KeyError(f"unknown target {target!r}; choose one of {list(PLAN_TARGETS)}")
    if target not in ("any", "reasoning"):
        return PLAN_TARGETS[target]
    return tuple(dict.fromkeys(str(r["profile"]) for r in rows
                               if not r.get("honest") and r.get("expected_verdict", "") != "PASS"
                               and _reasoning_mode(str(r["profile"])) == (target == "reasoning")))


def _reasoning_mode(profile: str) -> bool:
    """Whether a calibration cell's profile is served in reasoning mode (``think:PROFILE``)."""
    return profile.startswith(THINK_PREFIX)

def make_plan(
    rows: Sequence[dict],
    *,
    model: str,
    target: str = "any",
    power: float = TARGET_POWER,
    pricing: Pricing | None = None,
    capabilities: Capabilities | None = None,
) -> dict:
    """Answer "how many tokens for this power against this deviation?" from calibration records.

    The recommended budget is the smallest *calibrated* budget whose measured rejection rate
    reaches ``power`` (a measured point, not an extrapolation); the log-linear interpolation of
    the power curve is given as an estimate beside it. For ``target="any"`` every deviation of
    :func:`target_profiles` (every calibrated deviation class) must reach the power (the largest of their budgets).

    Args:
        rows: calibration records (:func:`load_calibration`).
        model: reference model name the provider is compared with.
        target: a key of :data:`PLAN_TARGETS`.
        power: wanted rejection rate in (0, 1).
        pricing: ``probes.config.Pricing`` (USD per 1M input/output tokens) or None.
        capabilities: ``probes.config.Capabilities`` or None (notes when the provider offers less
            than the calibrated probe mix asks for).

    Returns:
        JSON-able dict: covered, reached, message, suite (the calibrated suite that reaches the
        power with the fewest tokens, counting only budgets that suite can spend), alternatives
        (the other suites), rows (per profile: tokens, estimate, prompt_tokens, usd,
        power_at_grid, false_accusation), budget_tokens, usd, command, notes.

    Raises:
        KeyError: unknown target.
    """
    fixed = [r for r in rows if r.get("design", "fixed") == "fixed"]
    models = sorted({str(r.get("model")) for r in fixed})
    mine = [r for r in fixed if str(r.get("model")) == str(model)]
    profiles = target_profiles(target, mine)
    plan: dict[str, Any] = {"model": model, "target": target, "power": power, "covered": bool(mine), "reached": False,
                            "rows": [], "notes": [], "budget_tokens": None, "usd": None, "command": None}
    if not mine:
        plan["message"] = (
            f"The calibration does not cover model {model!r} (calibrated: {', '.join(models) or 'nothing yet'}). "
            f"Token budgets measured on another model do not transfer; run `auditor calibrate --model {model}` first."
        )
        return plan
    mixes = list(dict.fromkeys(record_suite(r) for r in mine))
    options: list[dict[str, Any]] = []
    for m in mixes:
        usable = [r for r in mine if record_suite(r) == m and (_suite_cap(r) is None or r["budget_tokens"] <= _suite_cap(r))]
        rows_m = _plan_rows(usable, profiles, power, pricing)
        ok = bool(rows_m) and all(r["tokens"] is not None for r in rows_m) and \
            {r["profile"] for r in rows_m} == {p for p in profiles if any(x["profile"] == p for x in mine)}
        worst = max((r["tokens"] for r in rows_m), default=None) if ok else None
        options.append({"suite": m, "rows": rows_m, "reached": ok, "budget_tokens": worst})
    for p in profiles:
        if not any(r["profile"] == p for r in mine):
            plan["notes"].append(f"profile {p!r} is not in the calibration")
    good = [o for o in options if o["reached"]]
    if not good and len(options) > 1:
        combo = _combine_suites(options, [p for p in profiles if any(x["profile"] == p for x in mine)])
        if combo is not None:
            return _capability_notes(_combined_plan(plan, combo, target, power, model), capabilities)
    best = min(good, key=lambda o: (o["budget_tokens"], mixes.index(o["suite"]))) if good else options[0]
    mix = best["suite"]
    out_rows = best["rows"]
    plan["suite"] = mix
    plan["alternatives"] = [{"suite": o["suite"], "reached": o["reached"], "budget_tokens": o["budget_tokens"]}
                            for o in options if o is not best]
    plan["rows"] = out_rows
    reached = [r for r in out_rows if r["tokens"] is not None]
    plan["reached"] = bool(out_rows) and len(reached) == len(out_rows) and best["reached"]
    if plan["reached"]:
        worst = max(out_rows, key=lambda r: r["tokens"])
        plan["budget_tokens"] = worst["tokens"]
        plan["usd"] = worst["usd"]
        fa = worst["false_accusation_max"]
        fa_hi = worst.get("false_accusation_upper")
        plan["message"] = (
            f"To detect {target} with {power:.0%} power on {model}: a budget of {worst['tokens']:,} completion tokens "
            f"per audit with the {mix!r} suite (--suite {mix} --budget-tokens {worst['tokens']})"
            + (f" (~${worst['usd']:.4f} at the provider's prices)" if worst["usd"] is not None
               else " (cost: no prices configured)")
            + (f"; false-accusation rate measured at that budget: at most {fa:.1%} over the honest profiles"
               + (f" (95% upper bound {fa_hi:.1%})" if fa_hi is not None else "") if fa is not None else "")
            + "."
        )
        plan["command"] = f"auditor check --suite {mix} --budget-tokens {worst['tokens']}"
        for o in plan["alternatives"]:
            plan["notes"].append(
                f"suite {o['suite']!r}: " + (f"{o['budget_tokens']:,} tokens" if o["reached"] else
                                            f"does not reach {power:.0%} within the budgets it can spend")
            )
    else:
        missing = [r["profile"] for r in out_rows if r["tokens"] is None]
        plan["message"] = (
            f"The calibration of {model} never reaches {power:.0%} power against {', '.join(missing) or target} within the "
            f"calibrated budgets any one suite can spend (largest {max((r['max_budget'] for r in out_rows), default=0):,} "
            "tokens). Calibrate larger budgets (`auditor calibrate --budgets ...`) or use a probe mix with more "
            "logprob/sampling tokens."
        )
    return _capability_notes(plan, capabilities)


def _capability_notes(plan: dict, capabilities: Capabilities | None) -> dict:
    """Notes where the provider offers less than the calibrated suites ask for."""
    if capabilities is not None:
        if not capabilities.logprobs:
            plan["notes"].append(
                "this provider returns no logprobs: the calibration assumes top_logprobs 5; "
                "without them only greedy-match and the sampling tests run, so more tokens are needed than shown"
            )
            plan["notes"].append(
                "without the provider's own top_logprobs, greedy near-tie flips cannot tell quantized weights from "
                "a lossy greedy verifier: such an audit may end QUANTIZATION_OR_RELAXED_VERIFICATION (a deviation, "
                f"not established which); {DECISIVE_WITHOUT_LOGPROBS}"
            )
        elif capabilities.max_top_logprobs < 5:
            plan["notes"].append(
                f"this provider lists at most {capabilities.max_top_logprobs} top_logprobs; the calibration used up to 5"
            )
    return plan


def _combine_suites(options: Sequence[dict], profiles: Sequence[str]) -> list[dict] | None:
    """When no one suite reaches the power against every profile: give each profile the suite that
    reaches it with the fewest tokens; one audit per suite used, at the largest budget its profiles
    need. None when some profile is reached by no suite."""
    cands: dict[str, list[tuple[str, dict]]] = {}
    for p in profiles:
        cands[p] = [(o["suite"], r) for o in options for r in o["rows"] if r["profile"] == p and r["tokens"] is not None]
        if not cands[p]:
            return None
    # suites some profile needs (the only one reaching it) are run anyway: give them what they reach
    needed = {c[0][0] for c in cands.values() if len(c) == 1}
    pick: dict[str, tuple[str, dict]] = {}
    for p in profiles:
        mine = [c for c in cands[p] if c[0] in needed] or cands[p]
        pick[p] = min(mine, key=lambda c: c[1]["tokens"])
        needed.add(pick[p][0])
    audits: dict[str, dict] = {}
    for p, (suite, row) in pick.items():
        a = audits.setdefault(suite, {"suite": suite, "budget_tokens": 0, "usd": 0.0, "profiles": [], "rows": []})
        a["profiles"].append(p)
        a["rows"].append({**row, "suite": suite})
    for a in audits.values():
        a["worst"] = max(a["rows"], key=lambda r: r["tokens"])  # the row that sets the audit's budget
        a["budget_tokens"], a["usd"] = a["worst"]["tokens"], a["worst"]["usd"]
    return list(audits.values())


def _combined_plan(plan: dict, audits: list[dict], target: str, power: float, model: str) -> dict:
    plan["reached"] = True
    plan["suite"] = None
    plan["audits"] = [{k: v for k, v in a.items() if k not in ("rows", "worst")} for a in audits]
    plan["rows"] = [r for a in audits for r in a["rows"]]
    plan["budget_tokens"] = sum(a["budget_tokens"] for a in audits)
    usd = [a["usd"] for a in audits]
    plan["usd"] = None if any(u is None for u in usd) else float(sum(usd))
    def _fa(a: dict) -> str:
        w = a["worst"]
        if w.get("false_accusation_max") is None:
            return ""
        hi = w.get("false_accusation_upper")
        return f"; false accusations measured {w['false_accusation_max']:.1%}" + (f", 95% upper bound {hi:.1%}" if hi is not None else "")

    parts = [f"--suite {a['suite']} --budget-tokens {a['budget_tokens']} (for {', '.join(a['profiles'])}{_fa(a)})"
             for a in audits]
    plan["message"] = (
        f"No one suite detects every deviation of {target!r} with {power:.0%} power on {model} within what it can spend; "
        f"{len(audits)} audits do, {plan['budget_tokens']:,} completion tokens in all"
        + (f" (~${plan['usd']:.4f} at the provider's prices)" if plan["usd"] is not None
           else " (cost: no prices configured)")
        + ": " + "; ".join(parts) + "."
    )
    plan["command"] = " && ".join(f"auditor check --suite {a['suite']} --budget-tokens {a['budget_tokens']}" for a in audits)
    return plan


def _suite_cap(r: dict) -> int | None:
    """Planned tokens of the record's whole suite (what ``auditor check --suite`` can spend), if known."""
    cap = (r.get("extra") or {}).get("suite_max_tokens", r.get("suite_max_tokens"))
    return None if cap is None else int(cap)


def _plan_rows(mine: Sequence[dict], profiles: Sequence[str], power: float, pricing: Pricing | None) -> list[dict]:
    """Per target profile of one probe mix: the smallest calibrated budget reaching ``power``."""
    honest = [r for r in mine if r.get("honest")]
    out_rows = []
    for p in profiles:
        # the false accusations that matter: the honest cells served the same way (plain chat / reasoning mode)
        honest_p = [r for r in honest if _reasoning_mode(str(r["profile"])) == _reasoning_mode(p)]
        rs = sorted((r for r in mine if r["profile"] == p), key=lambda r: r["budget_tokens"])
        if not rs:
            continue
        tp = tokens_for_power(rs, power)
        grid = None if tp["grid"] is None else int(tp["grid"])
        at = next((r for r in rs if r["budget_tokens"] == grid), rs[-1])
        prompt = float(at.get("prompt_tokens") or 0.0)
        usd = None
        # a provider without prices (both 0.0, the config's default) has no cost to state: "no prices configured"
        priced = pricing is not None and (pricing.usd_per_1m_input > 0 or pricing.usd_per_1m_output > 0)
        if pricing is not None and priced and grid is not None:
            usd = float(pricing.cost_usd(round(prompt), grid))
        at_b = [r for r in honest_p if r["budget_tokens"] == (grid or rs[-1]["budget_tokens"])]
        fa = [r["rejection_rate"] for r in at_b]
        fa_hi = [r["ci_high"] for r in at_b if r.get("ci_high") is not None]
        out_rows.append({
            "profile": p,
            "tokens": grid,
            "estimate": None if tp["interpolated"] is None else math.ceil(tp["interpolated"]),
            "power_at_grid": at["rejection_rate"],
            "power_ci": [at.get("ci_low"), at.get("ci_high")],
            "cause_correct_rate": at.get("cause_correct_rate"),
            "sampled_tokens": at.get("sampled_tokens"),
            "prompt_tokens": prompt,
            "usd": usd,
            "max_budget": rs[-1]["budget_tokens"],
            "power_at_max": rs[-1]["rejection_rate"],
            "false_accusation_max": max(fa) if fa else None,
            "false_accusation_upper": max(fa_hi) if fa_hi else None,
        })
    return out_rows
