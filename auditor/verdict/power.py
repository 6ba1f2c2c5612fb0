"""Power calculations behind the verdict's PASS / INCONCLUSIVE rules (split from auditor.verdict.decide).

The power families (POWER_FAMILIES), their target effects (POWER_TARGETS), the positions each
detector needs for DEFAULT_POWER at the audit's level (``required_positions``, in positions =
tokens), and the suggested token budget ``_budget`` writes into a verdict's details. Every public
name is re-exported by ``auditor.verdict.decide``; callers import them from there.

``required_positions`` and ``power_at`` (a detector's power at n positions against a given effect)
read one power model per test kind (``_PowerModel``), so the positions needed and the power at
the positions used are the same calculation read both ways; ``power_effect`` reads the effect a
detector measured in the unit of its power target (what ``auditor calibrate`` writes into
``auditor/calibration/effect_sizes.json`` and ``auditor.verdict.rules_out`` reads back).

The exact tests' searches and powers are remembered by their arguments (``functools.lru_cache``: the
calibration's resampled audits repeat them), and their binomial / Poisson tails come from
``auditor.detectors.stats`` (scipy.stats' values without its generic argument handling).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import special, stats

from auditor.detectors import DETECTORS, MODES, POWER_FAMILIES, POWER_TARGETS, TestKind
from auditor.detectors.base import DetectorResult
from auditor.detectors.noise_floor import NoiseFloor
from auditor.detectors.stats import binom_isf, binom_sf, poisson_isf  # scipy.stats' tails, bit for bit
from auditor.util import finite

__all__ = ["DEFAULT_POWER", "POWER_FAMILIES", "POWER_TARGETS", "power_at", "power_effect", "required_positions",
           "tokens_per_position"]

DEFAULT_POWER = 0.8

# POWER_TARGETS (the effects an audit should be able to see) and POWER_FAMILIES (PASS needs, for every
# family that ran, one adequately powered detector) are the registry's (``auditor.detectors``: each
# detector's ``power_target`` and ``power_family``), re-exported here.


def _binom_power(n: np.ndarray | int, r0: float, r1: float, alpha: float) -> np.ndarray:
    """Power of the exact one-sided binomial test (level alpha, null rate r0) at rate r1 with n trials."""
    n = np.asarray(n)
    c = binom_isf(alpha, n, r0) + 1  # smallest k with P(X >= k | r0) <= alpha
    return np.asarray(binom_sf(c - 1, n, r1))


def _greedy_required(
    r0: float, r1: float, alpha: float, power: float, n_max: int = 1_000_000
) -> int | None:
    """Smallest n at which the exact one-sided binomial test (level alpha, null r0) has >= power at r1."""
    if r1 <= r0:
        return None
    return _invert(lambda n: _binom_power(n, r0, r1, alpha), power, n_max)


def _tail_power(n: np.ndarray | int, tau: float, ratio: float, alpha: float) -> np.ndarray:
    """Power of the one-sided tail-deficit test at n positions: the tail count is taken as
    Poisson(n·τ) under H0 (τ = mean tail mass per position, the Poisson limit of the
    Poisson-binomial the detector uses) and Poisson(n·τ·ratio) under H1; the test rejects at
    counts c with P(X <= c | H0) <= alpha."""
    n = np.asarray(n, dtype=np.float64)
    lam0 = n * tau
    z = float(special.ndtri(alpha))
    # the largest k with P(X <= k | H0) <= alpha: a Cornish-Fisher start, then exact steps
    c = np.floor(lam0 + z * np.sqrt(lam0) + (z * z - 1) / 6)
    for _ in range(10_000):
        up = special.pdtr(c + 1, lam0) <= alpha
        down = (c >= 0) & (special.pdtr(np.maximum(c, 0), lam0) > alpha)
        if not (up.any() or down.any()):
            break
        c = c + up - down
    c = np.maximum(c, -1)
    return np.where(c >= 0, special.pdtr(np.maximum(c, 0), lam0 * max(ratio, 0.0)), 0.0)


def _near_tie_power(n: np.ndarray | int, bound: float, r1: float, alpha: float) -> np.ndarray:
    """Power of greedy-near-tie's Poisson test (k flips vs Poisson(n · bound), level alpha) when the
    tested positions flip at rate r1: P(Bin(n, r1) >= c), c the smallest k with P(X >= k | H0) <= alpha."""
    n = np.asarray(n)
    c = poisson_isf(alpha, n * bound) + 1
    return np.asarray(binom_sf(c - 1, n, r1))


def _invert(pw: Callable[[np.ndarray], np.ndarray], power: float, n_max: int = 1_000_000, guess: float | None = None) -> int | None:
    """Smallest n in [1, n_max] with ``pw(n) >= power`` (``pw`` vectorised over integer n; assumed
    to grow with n up to the discreteness of exact tests): the first crossing on a geometric grid
    over [1, n_max] (refined around ``guess``, a normal approximation, when given), then every n of
    the bracket found when it holds at most ``_SCAN`` values (exact), else bisection (within the
    saw-tooth of an exact test's power); None when even n_max falls short."""
    if guess is not None and math.isfinite(guess) and 1 <= guess <= n_max:
        grid = np.concatenate([_geomspace(1, n_max, 200), guess * _geomspace(0.7, 1.4, 24)])
        grid = np.unique(np.clip(grid, 1, n_max).astype(np.int64))
    else:
        grid = _base_grid(n_max)
    okg = np.flatnonzero(pw(grid) >= power)
    if not okg.size:
        return None
    hi = int(grid[okg[0]])
    lo = int(grid[okg[0] - 1]) if okg[0] > 0 else 1
    if hi - lo > _SCAN:
        while hi - lo > _SCAN:
            mid = (lo + hi) // 2
            if pw(np.array([mid]))[0] >= power:
                hi = mid
            else:
                lo = mid
    n = np.arange(lo, hi + 1)
    ok2 = np.flatnonzero(pw(n) >= power)
    return int(n[ok2[0]]) if ok2.size else hi


#: Brackets of at most this many n are scanned exhaustively by :func:`_invert`.
_SCAN = 2048


@lru_cache(maxsize=16)
def _geomspace(start: float, stop: float, num: int) -> np.ndarray:
    """``np.geomspace(start, stop, num)``, computed once (read-only)."""
    out = np.geomspace(start, stop, num)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=16)
def _base_grid(n_max: int) -> np.ndarray:
    """:func:`_invert`'s integer grid without a guess, computed once (read-only)."""
    out = np.unique(np.clip(_geomspace(1, n_max, 200), 1, n_max).astype(np.int64))
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class _PowerModel:
    """How one detector's power grows with the number of positions n (one home for
    :func:`required_positions` and :func:`power_at`).

    Attributes:
        test: the detector's test kind.
        var: per-position variance of the statistic (KL: of log-KL, with the floor's within- and
            between-prompt components at the audit's positions per prompt; ARGMAX: mean p(1−p)).
        r0: honest clear-mismatch rate (CLEAR_MISMATCH).
        tau: mean tail mass per position (TAIL).
        bound: mean honest flip bound per tested position, μ / n (NEAR_TIE).
    """

    test: TestKind
    var: float = 0.0
    r0: float = 0.0
    tau: float = 0.0
    bound: float = 0.0

    def power(self, n: np.ndarray | int, effect: float, alpha_test: float) -> np.ndarray:
        """Power at n positions against ``effect`` (the unit of the detector's ``PowerTarget``)."""
        n = np.asarray(n, dtype=np.float64)
        za = -special.ndtri(alpha_test)
        if self.test == TestKind.CLEAR_MISMATCH:
            return _binom_power(n.astype(np.int64), self.r0, min(max(effect, 0.0), 1.0), alpha_test)
        if self.test == TestKind.KL:
            shift = math.log(effect) if effect > 0 else -math.inf
            return np.asarray(special.ndtr(np.sqrt(n) * shift / math.sqrt(self.var) - za))
        if self.test == TestKind.ARGMAX:
            return np.asarray(special.ndtr(np.sqrt(n) * effect / math.sqrt(self.var) - za))
        if self.test == TestKind.NEAR_TIE:
            return _near_tie_power(n.astype(np.int64), self.bound, min(max(effect, 0.0), 1.0), alpha_test)
        return _tail_power(n, self.tau, effect, alpha_test)

    def _guess(self, effect: float, za: float, zb: float) -> float | None:
        """Normal approximation of the required n of the exact tests (a starting bracket)."""
        if self.test == TestKind.CLEAR_MISMATCH:
            r0, r1 = self.r0, min(effect, 1.0)
            sd = za * math.sqrt(r0 * (1 - r0)) + zb * math.sqrt(r1 * (1 - r1))
            return (sd / (r1 - r0)) ** 2 if r1 > r0 else None
        if self.test == TestKind.NEAR_TIE:
            r0, r1 = self.bound, min(effect, 1.0)
            sd = za * math.sqrt(r0) + zb * math.sqrt(r1 * (1 - r1))
            return (sd / (r1 - r0)) ** 2 if r1 > r0 else None
        if self.test == TestKind.TAIL and 0 < effect < 1:
            sd = za * math.sqrt(self.tau) + zb * math.sqrt(self.tau * effect)
            return (sd / (self.tau * (1 - effect))) ** 2
        return None

    def required(self, effect: float, alpha_test: float, power: float, *, guess: bool = True) -> int | None:
        """Smallest n with ``power(n) >= power`` (closed forms for the z-tests, a search for the exact
        tests: ``guess`` starts it at a normal approximation), None when none."""
        za, zb = float(-special.ndtri(alpha_test)), float(special.ndtri(power))
        if self.test == TestKind.KL:
            if effect <= 1:
                return None
            return math.ceil((za + zb) ** 2 * self.var / math.log(effect) ** 2)
        if self.test == TestKind.ARGMAX:
            if effect <= 0:
                return None
            return math.ceil((za + zb) ** 2 * self.var / effect**2)
        if self.test == TestKind.TAIL and effect <= 0:
            return math.ceil(-math.log(alpha_test) / self.tau)  # a missing tail: P(no tail | H0) <= alpha
        if self.test == TestKind.CLEAR_MISMATCH and effect <= self.r0:
            return None
        if self.test == TestKind.NEAR_TIE and effect <= self.bound:
            return None
        if self.test == TestKind.TAIL and effect >= 1:
            return None
        return _exact_required(self, effect, alpha_test, power, guess)  # a search: audits repeat it

    @property
    def exact(self) -> bool:
        """True for the exact (binomial / Poisson) tests, whose power is a search over counts."""
        return self.test in (TestKind.CLEAR_MISMATCH, TestKind.NEAR_TIE, TestKind.TAIL)


#: Remembered exact-test results per argument list (the calibration's audits repeat the same rates and budgets).
_EXACT_CACHE = 100_000


@lru_cache(maxsize=_EXACT_CACHE, typed=True)
def _exact_required(model: _PowerModel, effect: float, alpha_test: float, power: float, guess: bool) -> int | None:
    """:meth:`_PowerModel.required`'s search for the exact tests (after its closed forms and null-side checks)."""
    za, zb = float(-special.ndtri(alpha_test)), float(special.ndtri(power))
    return _invert(lambda n: model.power(n, effect, alpha_test), power,
                   guess=model._guess(effect, za, zb) if guess else None)


@lru_cache(maxsize=_EXACT_CACHE, typed=True)
def _exact_power(model: _PowerModel, n: int, effect: float, alpha_test: float) -> float:
    """``float(model.power(n, effect, alpha_test))`` for the exact tests, remembered."""
    return float(model.power(n, effect, alpha_test))


def _power_model(result: DetectorResult, floor: NoiseFloor | None) -> _PowerModel | None:
    """The power model of ``result``'s detector from its details (and the floor for a KL test);
    None when no calculation applies (PIT tests, unknown names) or inputs are missing."""
    powered = _powered(result.name)
    if powered is None:
        return None
    test = powered[0]
    d = result.details or {}
    if test == TestKind.CLEAR_MISMATCH:
        return _PowerModel(test, r0=float(d.get("r0", 1e-3)))
    if test == TestKind.KL:
        if floor is None or "m" not in d:
            return None
        vc = floor.kl_floor(int(d.get("test_m", d["m"]))).components
        per_prompt = max(1.0, result.n / max(1, int(d.get("n_prompts", 1))))
        return _PowerModel(test, var=vc.sigma_w2 + vc.sigma_b2 * per_prompt)
    if test == TestKind.ARGMAX:
        if not result.ran or result.n <= 0:
            return None
        var_pos = d.get("var_per_position")
        if var_pos is None:
            er = float(d.get("expected_rate", 0.5))
            var_pos = er * (1 - er)  # upper bound on mean p(1-p)
        return _PowerModel(test, var=max(float(var_pos), 0.05))
    if test == TestKind.TAIL:
        tau = float(d.get("mean_tail_mass", 0.0) or 0.0)
        return _PowerModel(test, tau=tau) if tau > 0 else None
    if test == TestKind.NEAR_TIE:
        bound = d.get("mean_bound")
        if bound is None and result.n > 0 and d.get("expected") is not None:
            bound = float(d["expected"]) / result.n
        return _PowerModel(test, bound=float(bound)) if bound is not None and 0 < float(bound) < 1 else None
    return None


def tokens_per_position(result: DetectorResult) -> float:
    """Completion tokens per position of ``result``'s statistic: 1 for tests on every position of their
    mode; greedy-near-tie tests only the near-ties among its greedy positions (n_greedy / n), so the
    positions it still lacks cost that many greedy tokens each."""
    powered = _powered(result.name)
    if powered is None or powered[0] != TestKind.NEAR_TIE or result.n <= 0:
        return 1.0
    return max(1.0, float((result.details or {}).get("n_greedy", result.n)) / result.n)


def required_positions(
    result: DetectorResult,
    *,
    alpha_test: float,
    power: float = DEFAULT_POWER,
    floor: NoiseFloor | None = None,
    effect: float | None = None,
) -> int | None:
    """Positions this detector needs for ``power`` against its registry target effect (``power_target``,
    one of POWER_TARGETS) — or against ``effect`` when given, in the same unit — at level alpha_test;
    the calculation follows its test kind.

    Simple normal/binomial calculations (one-sided): greedy tests — exact binomial against the
    honest rate r0 vs target rate (the registry target, at least 2·r0); logprob — z-test on mean
    log-KL with the floor's variance components at the audit's prompt size; argmax — z-test with
    the audit's mean p(1−p); tail — against a missing tail, n with P(no tail emission | H0) <=
    alpha_test, i.e. n >= −ln(alpha_test)/mean τ (a partial deficit: the Poisson test of
    :func:`power_at`). :func:`power_at` is the same model read the other way round.
    Returns None when no calculation applies (e.g. the omnibus PIT tests), inputs are missing or the
    effect is on the null side.
    """
    model = _power_model(result, floor)
    if model is None:
        return None
    if effect is None:  # the registry target: the full search, as the verdict's budgets always had
        return model.required(_target_effect(result, model), alpha_test, power, guess=False)
    return model.required(effect, alpha_test, power)


def power_at(
    result: DetectorResult,
    *,
    effect: float,
    alpha_test: float,
    n: int | None = None,
    floor: NoiseFloor | None = None,
) -> float | None:
    """Power of this detector at ``n`` positions (default: the positions it used, ``result.n``)
    against ``effect`` (the unit of its registry ``PowerTarget``, as :func:`power_effect` reads it) at
    level alpha_test; the model of :func:`required_positions`. None when no calculation applies."""
    return _power_at_model(_power_model(result, floor), result.n if n is None else n, effect, alpha_test)


def _power_at_model(model: _PowerModel | None, n: int, effect: float, alpha_test: float) -> float | None:
    """:func:`power_at` for a power model already read from the result (``_power_model``)."""
    if model is None or n <= 0:
        return None if model is None else 0.0
    n = int(n)
    if not model.exact:
        return float(model.power(n, effect, alpha_test))
    return _exact_power(model, n, effect, alpha_test)


def power_effect(result: DetectorResult) -> float | None:
    """The effect ``result`` measured, in the unit of its detector's registry power target
    (``PowerTarget.unit``): clear-mismatch tests (greedy-match, self-greedy) — ``effect``, the rate of
    clear mismatches; logprob-divergence — ``details["geometric_ratio"]`` (geometric-mean KL / honest
    floor); argmax tests — ``effect`` (extra argmax emissions per sampled position); tail tests —
    ``effect`` (observed / expected tail emissions, < 1 a deficit). None when the detector did not
    run, has no power target (PIT tests, pre-flight checks) or the value is missing / not finite.
    ``auditor calibrate`` uses it to write ``auditor/calibration/effect_sizes.json``."""
    powered = _powered(result.name)
    if powered is None or not result.ran:
        return None
    x = (result.details or {}).get("geometric_ratio") if powered[0] == TestKind.KL else result.effect
    return finite(x)


def _target_effect(result: DetectorResult, model: _PowerModel) -> float:
    """The registry target effect of ``result``'s detector (clear mismatches: at least 2·r0)."""
    powered = _powered(result.name)
    target = powered[1] if powered is not None else math.nan
    return max(target, 2 * model.r0) if model.test == TestKind.CLEAR_MISMATCH else target


def _powered(name: str) -> tuple[TestKind, float] | None:
    """(test kind, target effect) of ``name`` from the registry; None when it has no power target
    (the PIT tests, pre-flight checks, unknown names)."""
    s = DETECTORS.get(name)
    return (s.test, s.power_target.value) if s is not None and s.power_target is not None else None


def _budget(adj: Sequence[DetectorResult], alpha: float, power: float, floor: NoiseFloor | None,
            details: dict[str, Any], n_tests: int) -> int | None:
    """Fill details['power'], details['power_families'] and details['suggested_budget_tokens']
    (extra tokens that would make every tested family adequate — or, when nothing ran, the
    smallest budget for a greedy or sampling audit); return the latter."""
    alpha_test = alpha / max(1, n_tests)
    pw: dict[str, dict[str, Any]] = {}
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
    fams: dict[str, dict[str, Any]] = {}
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


@lru_cache(maxsize=1024, typed=True)
def _required_default(name: str, alpha_test: float, power: float) -> int | None:
    """Budget guess for a detector that did not run (no data to plug in)."""
    powered = _powered(name)
    if powered is None:
        return None
    test, target = powered
    if test == TestKind.CLEAR_MISMATCH:
        return _greedy_required(1e-3, target, alpha_test, power)
    if test == TestKind.ARGMAX:
        za, zb = float(stats.norm.isf(alpha_test)), float(stats.norm.ppf(power))
        return math.ceil((za + zb) ** 2 * 0.2 / target**2)
    return None
