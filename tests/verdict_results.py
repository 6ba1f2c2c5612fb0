"""Synthetic detector results for the verdict-rule tests (``tests/audit/test_one_account.py``,
``tests/detectors/test_sampler_mechanism.py``): a clean, powered audit and a way to swap rejections into it.
Values are in each detector's own units (p-values, per-position rates, KL in nats)."""

from __future__ import annotations

from auditor.detectors import DetectorResult


def mk(name: str, p: float, *, n: int = 2000, statistic: float = 0.0, effect: float = 0.0, **details: object
       ) -> DetectorResult:
    """One detector result: ``name``, raw p-value ``p``, ``n`` positions, ``effect`` (with a zero-width CI)."""
    return DetectorResult(name, statistic, p, effect, (effect, effect), n, [], details=dict(details))


def quiet(n: int = 2000) -> list[DetectorResult]:
    """A clean, powered audit of ``n`` positions per detector: nothing rejects."""
    return [mk("greedy-match", 1.0, n=n, r0=1e-3, band=0.2),
            mk("logprob-divergence", 0.6, n=n, effect=1e-4, ratio_to_floor=1.0, top1_agreement=0.99, m=5, n_prompts=40),
            mk("sampling-gof", 0.5, n=n),
            mk("sampling-argmax", 0.4, n=n, expected_rate=0.6, excess_per_position=0.0, argmax_rate=0.6),
            mk("sampling-tail", 0.5, n=n, mean_tail_mass=0.05, tail_ratio=1.0, deficit_per_position=0.0),
            mk("self-greedy", 1.0, n=n, r0=1e-3, band=0.2)]


def with_(results: list[DetectorResult], *new: DetectorResult) -> list[DetectorResult]:
    """``results`` with each of ``new`` replacing the result of the same detector name (or added)."""
    names = {r.name for r in new}
    return [r for r in results if r.name not in names] + list(new)
