"""Power calculations behind the verdict's PASS / INCONCLUSIVE rules (split from auditor.verdict).

The power families (POWER_FAMILIES), their target effects (POWER_TARGETS), the positions each
detector needs for DEFAULT_POWER at the audit's level (``required_positions``, in positions =
tokens), and the suggested token budget ``_budget`` writes into a verdict's details. Every public
name is re-exported by ``auditor.verdict``; callers import them from there.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from auditor.detectors import DETECTORS, MODES, POWER_FAMILIES, POWER_TARGETS, TestKind
from auditor.detectors.base import DetectorResult
from auditor.detectors.noise_floor import NoiseFloor

__all__ = ["DEFAULT_POWER", "POWER_FAMILIES", "POWER_TARGETS", "power_effect", "required_positions"]

DEFAULT_POWER = 0.8

# POWER_TARGETS (the effects an audit should be able to see) and POWER_FAMILIES (PASS needs, for every
# family that ran, one adequately powered detector) are the registry's (``auditor.detectors``: each
# detector's ``power_target`` and ``power_family``), re-exported here.


def power_effect(result: DetectorResult) -> float | None:
    """The effect ``result`` measured, in the unit of its registry power target (``PowerTarget.unit``).

    Clear-mismatch tests (greedy-match, self-greedy): ``effect`` (fraction of greedy positions with
    a clear mismatch); logprob-divergence: ``details["geometric_ratio"]`` (geometric-mean KL / honest
    floor, the scale its z-test works on); ``*-argmax``: ``effect`` (extra argmax emissions per
    sampled position); ``*-tail``: ``effect`` (observed / expected tail emissions). None when the
    detector did not run, has no power target (PIT tests, pre-flight checks) or the value is not finite.
    Calibration records the median of this per profile (``auditor.calibration``), which is what an
    audit's power is computed against.
    """
    powered = _powered(result.name)
    if powered is None or not result.ran:
        return None
    v = (result.details or {}).get("geometric_ratio") if powered[0] == TestKind.KL else result.effect
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _greedy_required(
    r0: float, r1: float, alpha: float, power: float, n_max: int = 1_000_000
) -> int | None:
    """Smallest n at which the exact one-sided binomial test (level alpha, null r0) has >= power at r1."""
    if r1 <= r0:
        return None

    def pw(n: np.ndarray) -> np.ndarray:
        c = stats.binom.isf(alpha, n, r0) + 1  # smallest k with P(X >= k | r0) <= alpha
        return stats.binom.sf(c - 1, n, r1)

    grid = np.unique(np.geomspace(1, n_max, 200).astype(np.int64))
    ok = np.flatnonzero(pw(grid) >= power)
    if not ok.size:
        return None
    hi = int(grid[ok[0]])
    lo = int(grid[ok[0] - 1]) if ok[0] > 0 else 1
    n = np.arange(lo, hi + 1)
    ok2 = np.flatnonzero(pw(n) >= power)
    return int(n[ok2[0]]) if ok2.size else hi


def required_positions(
    result: DetectorResult,
    *,
    alpha_test: float,
    power: float = DEFAULT_POWER,
    floor: NoiseFloor | None = None,
) -> int | None:
    """Positions this detector needs for ``power`` against its registry target effect (``power_target``,
    one of POWER_TARGETS) at level alpha_test; the calculation follows its test kind.

    Simple normal/binomial calculations (one-sided): greedy tests — exact binomial against the
    honest rate r0 vs target rate; logprob — z-test on mean log-KL with the floor's variance
    components at the audit's prompt size; argmax — z-test with the audit's mean p(1−p);
    tail — n with P(no tail emission | H0) <= alpha_test, i.e. n >= −ln(alpha_test)/mean τ.
    Returns None when no calculation applies (e.g. the omnibus PIT tests) or inputs are missing.
    """
    d = result.details or {}
    powered = _powered(result.name)
    if powered is None:
        return None
    test, target = powered
    za = stats.norm.isf(alpha_test)
    zb = stats.norm.ppf(power)
    if test == TestKind.CLEAR_MISMATCH:
        r0 = float(d.get("r0", 1e-3))
        return _greedy_required(r0, max(target, 2 * r0), alpha_test, power)
    if test == TestKind.KL:
        if floor is None or "m" not in d:
            return None
        vc = floor.kl_floor(int(d["m"])).components
        per_prompt = max(1.0, result.n / max(1, int(d.get("n_prompts", 1))))
        var = vc.sigma_w2 + vc.sigma_b2 * per_prompt
        shift = math.log(target)
        return math.ceil((za + zb) ** 2 * var / shift**2)
    if test == TestKind.ARGMAX:
        if not result.ran or result.n <= 0:
            return None
        var_pos = d.get("var_per_position")
        if var_pos is None:
            er = float(d.get("expected_rate", 0.5))
            var_pos = er * (1 - er)  # upper bound on mean p(1-p)
        var_pos = max(float(var_pos), 0.05)
        return math.ceil((za + zb) ** 2 * var_pos / target**2)
    if test == TestKind.TAIL:
        tau = float(d.get("mean_tail_mass", 0.0) or 0.0)
        if tau <= 0:
            return None
        return math.ceil(-math.log(alpha_test) / tau)
    return None


def _powered(name: str) -> tuple[TestKind, float] | None:
    """(test kind, target effect) of ``name`` from the registry; None when it has no power target
    (the PIT tests, pre-flight checks, unknown names)."""
    s = DETECTORS.get(name)
    return (s.test, s.power_target.value) if s is not None and s.power_target is not None else None


def _budget(adj, alpha, power, floor, details, n_tests: int) -> int | None:
    """Fill details['power'], details['power_families'] and details['suggested_budget_tokens']
    (extra tokens that would make every tested family adequate — or, when nothing ran, the
    smallest budget for a greedy or sampling audit); return the latter."""
    alpha_test = alpha / max(1, n_tests)
    pw: dict[str, dict] = {}
    for r in adj:
        req = (
            required_positions(r, alpha_test=alpha_test, power=power, floor=floor)
            if r.ran
            else None
        )
        if req is None and not r.ran:
            req = _required_default(r.name, alpha_test, power)
        if req is None:
            continue
        pw[r.name] = {
            "required_positions": req,
            "n": r.n,
            "adequate": bool(r.ran and r.n >= req),
            "mode": str(MODES[r.name]) if r.name in MODES else None,
        }
    details["power"] = pw
    ran_names = {r.name for r in adj if r.ran}
    fams: dict[str, dict] = {}
    for fam, members in POWER_FAMILIES.items():
        ran_m = [m for m in members if m in ran_names and m in pw]
        with_req = [m for m in members if m in pw]
        missing = [
            max(0, pw[m]["required_positions"] - (pw[m]["n"] if m in ran_m else 0))
            for m in with_req
        ]
        fams[fam] = {
            "ran": any(m in ran_names for m in members),
            "adequate": any(pw[m]["adequate"] for m in ran_m),
            "missing_positions": min(missing) if missing else None,
        }
    details["power_families"] = fams
    tested = [f for f, v in fams.items() if v["ran"]]
    if tested:
        extra = [
            fams[f]["missing_positions"] or 0 for f in tested if not fams[f]["adequate"]
        ]
        budget = int(sum(extra)) if extra else None
    else:
        reqs = [v["required_positions"] for v in pw.values()]
        budget = min(reqs) if reqs else None
    details["suggested_budget_tokens"] = budget
    return budget


def _required_default(name: str, alpha_test: float, power: float) -> int | None:
    """Budget guess for a detector that did not run (no data to plug in)."""
    powered = _powered(name)
    if powered is None:
        return None
    test, target = powered
    if test == TestKind.CLEAR_MISMATCH:
        return _greedy_required(1e-3, target, alpha_test, power)
    if test == TestKind.ARGMAX:
        za, zb = stats.norm.isf(alpha_test), stats.norm.ppf(power)
        return math.ceil((za + zb) ** 2 * 0.2 / target**2)
    return None
