"""One profile's share of the detection benchmark: the noise floor, the profile's pool and its audit cells.

What :func:`auditor.calibration.benchmark.run_calibration` runs per profile, in its own process or in each
worker of :mod:`auditor.calibration.parallel` (both import it from here, so neither imports the other).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.calibration.collect import load_or_collect_pool
from auditor.calibration.draws import AuditMix, run_audits
from auditor.calibration.metrics import CalibrationRecord, summarize_audits
from auditor.calibration.pool import Pool, PoolConfig
from auditor.calibration.reference_side import as_refs
from auditor.calibration.sequential import run_sequential_audits
from auditor.check.auto_budget import SequentialDesign
from auditor.check.measured_floors import FloorSet, get_floors

if TYPE_CHECKING:
    from auditor.calibration.reference_side import RefModels

__all__ = ["CellSpec", "ProfileCells", "get_noise_floor", "mix_budgets", "pool_cells", "profile_cells"]


def get_noise_floor(
    ref_lms: RefModels,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    **floor_kwargs: Any,
) -> FloorSet:
    """The pipeline's noise floors for the reference (``auditor.check.measured_floors.get_floors``; cached on disk).

    Args:
        ref_lms: reference dtype → LoadedModel (``float32`` and usually ``bfloat16``).
        cache_dir: cache root (floors under ``noise/``); None = ``auditor.check.measured_floors``'s own cache,
            shared with ``auditor check``.
        floor_kwargs: passed to ``get_floors`` (``n_prompts``, ``max_new_tokens``: miniatures only —
            the benchmark must use the floor ``auditor check`` uses, i.e. the defaults).

    Returns:
        ``auditor.check.measured_floors.FloorSet`` (``.floors``: dtype → NoiseFloor).
    """
    refs = as_refs(ref_lms)
    cb = None
    if progress is not None:
        def cb(stage: str, done: int, total: int) -> None:
            if done == total or done % 8 == 0:
                progress(f"{stage} {done}/{total}")
    return get_floors(refs, cache_dir=None if cache_dir is None else Path(cache_dir) / "noise", progress=cb,
                      **floor_kwargs)


@dataclass(frozen=True)
class CellSpec:
    """What every profile's cells share (arguments of :func:`run_calibration`; picklable for ``--workers``).

    Attributes:
        mixes: probe mixes (the first is the primary one: every budget, and the sequential simulation).
        budgets: completion-token budgets (sorted).
        alpha: family-wise level of every audit.
        seed: base seed of the resampling and the detectors.
        fixed: run the fixed-budget audits.
        sequential: the sequential design, or None (skip).
        sequential_audits: audits per profile of the sequential simulation.
        card: a calibration under a model card: ``{"card_bits", "card_recipe", "model"}`` for every verdict
            (``auditor.calibration.draws.audit_verdict``); None = the float32 reference.
    """

    mixes: tuple[AuditMix, ...]
    budgets: tuple[int, ...]
    alpha: float
    seed: int
    fixed: bool
    sequential: SequentialDesign | None
    sequential_audits: int
    card: Mapping[str, Any] | None = None


@dataclass
class ProfileCells:
    """One profile's share of a run (what :func:`profile_cells` returns; picklable for ``--workers``).

    Attributes:
        pool_meta: the pool's sizes and provenance (``meta["pools"][profile]``).
        records: fixed-budget cells, mix-major then budget.
        sequential: the sequential-audit record, or None.
        audits_s, sequential_s: seconds spent (wall, in the process that ran them).
    """

    pool_meta: dict
    records: list[CalibrationRecord]
    sequential: dict | None
    audits_s: float
    sequential_s: float


def profile_cells(
    pool: Pool, floors: FloorSet, spec: CellSpec, *, n_audits: int, progress: Callable[[str], None] | None = None
) -> ProfileCells:
    """Every cell of one profile: fixed-budget audits on each mix (the first mix at every budget, the others
    at :func:`mix_budgets`), then the sequential simulation on the first mix; ``n_audits`` per fixed-budget
    cell (the honest or the deviating count of :func:`run_calibration`)."""
    say = progress or (lambda _m: None)
    mixes, alpha, seed, sequential = spec.mixes, spec.alpha, spec.seed, spec.sequential
    p = pool.profile
    t = time.perf_counter()
    recs: list[CalibrationRecord] = []
    for mi, m in enumerate(mixes if spec.fixed else ()):
        bl = mix_budgets(m, spec.budgets, primary=mi == 0)
        outs = run_audits(pool, floors, budgets=bl, audits=n_audits, mix=m, alpha=alpha, seed=seed, progress=say,
                          card=spec.card)
        for r in summarize_audits(outs, pool, mix=m, alpha=alpha):
            r.extra["suite_max_tokens"] = m.max_total
            recs.append(r)
    t_audits = time.perf_counter() - t
    for r in recs:
        say(
            f"{p} [{r.mix}] @ {r.budget_tokens}: rejection {r.rejection_rate:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] "
            f"cause {r.cause_correct_rate if r.cause_correct_rate is None else round(r.cause_correct_rate, 3)} "
            + (f"class {pn['named']}/{pn['rejections']} (instead {pn['instead']}) " if (pn := r.precision_named) else "")
            + f"{r.verdicts}"
        )
    sr, t_seq = None, 0.0
    if sequential is not None:
        t = time.perf_counter()
        sr = run_sequential_audits(pool, floors, sequential, audits=spec.sequential_audits, mix=mixes[0], seed=seed,
                                   card=spec.card)
        t_seq = time.perf_counter() - t
        say(f"{p} sequential: rejection {sr['rejection_rate']:.3f}, mean tokens {sr['mean_tokens']:.0f} "
            f"(saved {sr['tokens_saved']:.0%}) {sr['verdicts']}")
    meta = {**pool.summary(), "collect_s": pool.meta.get("total_s"), "backends": pool.meta.get("backends"),
            "backend_t0": pool.meta.get("backend_t0"), "backend_t1": pool.meta.get("backend_t1")}
    return ProfileCells(meta, recs, sr, t_audits, t_seq)


def pool_cells(
    profile: str,
    refs: RefModels,
    cfg: PoolConfig,
    floors: FloorSet,
    spec: CellSpec,
    *,
    n_audits: int,
    cache_dir: Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ProfileCells:
    """:func:`profile_cells` on ``profile``'s pool, loaded or collected first (``load_or_collect_pool``); the
    pool's ``cached`` flag and seconds are added to ``pool_meta``. What one process and each worker run."""
    say = progress or (lambda _m: None)
    t = time.perf_counter()
    pool, cached = load_or_collect_pool(profile, refs, cfg, cache_dir=cache_dir, refresh=refresh, progress=say)
    dt = time.perf_counter() - t
    say(f"{profile}: pool ready ({'cache' if cached else 'collected'}, {dt:.0f}s) {pool.summary()}")
    cells = profile_cells(pool, floors, spec, n_audits=n_audits, progress=say)
    cells.pool_meta.update(cached=cached, seconds=round(dt, 1))
    return cells


def mix_budgets(mix: AuditMix, budgets: Sequence[int], *, primary: bool = False) -> list[int]:
    """The budgets a mix is calibrated at: all of them for the primary mix; for the others those
    its suite can spend (``<= mix.max_total``), plus ``max_total`` itself when some budget exceeds it."""
    bl = sorted({int(b) for b in budgets})
    if primary or mix.max_total is None:
        return bl
    keep = [b for b in bl if b <= mix.max_total]
    if any(b > mix.max_total for b in bl):
        keep.append(int(mix.max_total))
    return sorted(set(keep))
