"""``auditor calibrate --workers N``: the floor, the pools and the audits in N processes.

A cold calibration run on CPU is dominated by model forwards: the noise floor (honest decodes of 52
prompts in every reference precision) and each profile's pool (the provider's outputs and the reference
scored at every position). These are independent of each other, so N processes collect them side by
side; then the profiles' audits, also independent, run the same way. Each process loads the reference
models once (``spawn``: torch and ``fork`` do not mix) and works through a shared queue, the longest
tasks first so that no process idles at the end: the floor, then the honest pools (they hold
``honest_sampling_samples`` = 3x the samples per prompt), then the rest in the given order.
Mixture profiles (``mix-P:F``) are built from their component pools, which are collected first.

Results do not depend on N: pools and the floor go through the same cache files as a one-process run,
and every audit's seed is derived from the run's seed, the budget and the audit index, not from the
process (``auditor.calibration.draws``).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.profiles import get_profile

if TYPE_CHECKING:
    from auditor.calibration.cells import CellSpec, ProfileCells
    from auditor.calibration.pool import PoolConfig
    from auditor.calibration.reference_side import RefModels
    from auditor.check.measured_floors import FloorSet

__all__ = ["FLOOR_TASK", "audit_in_workers", "prebuild_in_workers", "prebuild_tasks"]

#: The noise floor's name in the task queue.
FLOOR_TASK = "(noise floor)"

_REFS: dict[str, Any] = {}
_FLOORS: dict[str, FloorSet] = {}


def _init(load_refs: Callable[[], RefModels], threads: int) -> None:
    """Worker initializer: torch threads, then the reference models (kept for every task of the process)."""
    import torch

    from auditor.calibration.reference_side import as_refs

    torch.set_num_threads(threads)
    _REFS.update(as_refs(load_refs()))


def _say(msg: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')} worker] {msg}\n")
    sys.stderr.flush()


def _collect(task: str, cfg: PoolConfig, cache_dir: Path | None, refresh: bool,
             floor_kwargs: Mapping[str, Any] | None) -> float:
    """One prebuild task in a worker: the floor or one pool, written to the cache. Returns seconds."""
    from auditor.calibration.cells import get_noise_floor
    from auditor.calibration.collect import load_or_collect_pool

    t = time.perf_counter()
    if task == FLOOR_TASK:
        get_noise_floor(_REFS, cache_dir=cache_dir, **dict(floor_kwargs or {}))
    else:
        load_or_collect_pool(task, _REFS, cfg, cache_dir=cache_dir, refresh=refresh)
    return time.perf_counter() - t


def _audit(profile: str, cfg: PoolConfig, spec: CellSpec, n_audits: int, cache_dir: Path | None,
           floor_kwargs: Mapping[str, Any] | None) -> ProfileCells:
    """One profile's cells in a worker (pool and floor from the cache; a mixture built from its components)."""
    from auditor.calibration.cells import get_noise_floor, pool_cells

    if "floors" not in _FLOORS:  # one read of the cached floor per worker
        _FLOORS["floors"] = get_noise_floor(_REFS, cache_dir=cache_dir, **dict(floor_kwargs or {}))
    return pool_cells(profile, _REFS, cfg, _FLOORS["floors"], spec, n_audits=n_audits, cache_dir=cache_dir,
                      progress=_say)


def _executor(workers: int, load_refs: Callable[[], RefModels], threads: int | None) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_init,
                               initargs=(load_refs, threads or 1))


def prebuild_tasks(profiles: Sequence[str], refs: RefModels, cfg: PoolConfig, *, cache_dir: Path | None = None,
                   refresh: bool = False) -> list[str]:
    """The prebuild queue, longest first: :data:`FLOOR_TASK`, then every pool not yet cached (all with
    ``refresh``), honest profiles before the others; a mixture contributes its components, not itself.

    Args:
        profiles: simulator profile names (validated by the caller).
        refs: the reference models (they key the pool cache).
        cfg: pool configuration.
        cache_dir: cache root (None = the default).
        refresh: recollect cached pools too.
    """
    from auditor.calibration.collect import mix_components, pool_path

    base: list[str] = []
    for p in profiles:
        for q in mix_components(p) or (p,):
            if q not in base:
                base.append(q)
    todo = [p for p in base if refresh or not pool_path(p, refs, cfg, cache_dir).is_file()]
    todo.sort(key=lambda p: not get_profile(p).honest)  # stable: the given order within each group
    return [FLOOR_TASK, *todo]


def prebuild_in_workers(
    profiles: Sequence[str],
    refs: RefModels,
    cfg: PoolConfig,
    *,
    load_refs: Callable[[], RefModels],
    workers: int,
    threads: int | None = None,
    cache_dir: Path | None = None,
    refresh: bool = False,
    floor_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Collect the floor and every missing pool (:func:`prebuild_tasks`) in ``workers`` processes.

    ``load_refs`` is a picklable callable (module-level function or ``functools.partial``) that each
    worker calls once for its reference models, e.g. ``partial(load_reference_models, model)``; the pools
    are keyed by ``refs`` (the same models, loaded in the caller).

    With ``refresh`` the mixtures' own cache files are removed too (they are rebuilt from the fresh
    components by the audits). Returns task → seconds (wall, in its worker).

    Raises:
        Whatever a task raised (the first failure, after the running tasks end).
    """
    from auditor.calibration.collect import mix_components, pool_path

    say = progress or (lambda _m: None)
    cache = None if cache_dir is None else Path(cache_dir)
    tasks = prebuild_tasks(profiles, refs, cfg, cache_dir=cache, refresh=refresh)
    if refresh:
        for p in profiles:
            if mix_components(p) is not None:
                pool_path(p, refs, cfg, cache).unlink(missing_ok=True)
    say(f"collecting {len(tasks) - 1} pools and the noise floor in {workers} processes")
    out: dict[str, float] = {}
    with _executor(workers, load_refs, threads) as ex:
        futs = {ex.submit(_collect, t, cfg, cache, refresh, floor_kwargs): t for t in tasks}
        for f in as_completed(futs):
            out[futs[f]] = f.result()
            say(f"{futs[f]}: ready ({out[futs[f]]:.0f}s in its worker; {len(out)}/{len(tasks)})")
    return out


def audit_in_workers(
    profiles: Sequence[str],
    cfg: PoolConfig,
    n_audits: Mapping[str, int],
    spec: CellSpec,
    *,
    load_refs: Callable[[], RefModels],
    workers: int,
    threads: int | None = None,
    cache_dir: Path | None = None,
    floor_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, ProfileCells]:
    """Every profile's cells (:func:`auditor.calibration.cells.profile_cells`) in ``workers`` processes,
    the profiles with the most audits first. Pools and the floor must be cached (:func:`prebuild_in_workers`;
    ``load_refs`` as there).

    Returns profile → ProfileCells.

    Raises:
        Whatever a task raised.
    """
    say = progress or (lambda _m: None)
    cache = None if cache_dir is None else Path(cache_dir)
    order = sorted(profiles, key=lambda p: -n_audits[p])
    out: dict[str, ProfileCells] = {}
    with _executor(workers, load_refs, threads) as ex:
        futs = {ex.submit(_audit, p, cfg, spec, n_audits[p], cache, floor_kwargs): p for p in order}
        for f in as_completed(futs):
            out[futs[f]] = f.result()
            say(f"{futs[f]}: audits done ({out[futs[f]].audits_s + out[futs[f]].sequential_s:.0f}s in its worker; "
                f"{len(out)}/{len(order)})")
    return out
