"""The whole detection benchmark: noise floors, pools (cached), fixed-budget and sequential audits.

:func:`run_calibration` is what ``auditor calibrate`` runs; its :class:`CalibrationRun` is written
by :mod:`auditor.calibration.outputs` and stored by :mod:`auditor.calibration.store`.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from auditor.calibration.cells import CellSpec, ProfileCells, get_noise_floor, pool_cells
from auditor.calibration.draws import (
    DEFAULT_AUDITS,
    DEFAULT_BUDGETS,
    AuditMix,
    default_mix,
)
from auditor.calibration.metrics import CalibrationRecord
from auditor.calibration.pool import POOL_FORMAT, PoolConfig
from auditor.calibration.reference_side import as_refs
from auditor.check.auto_budget import AUTO_ACCEPT_POWER, AUTO_SPENDING, SequentialDesign
from auditor.check.measured_floors import REFERENCE_DTYPES
from simulator.profiles import get_profile

if TYPE_CHECKING:
    from auditor.calibration.reference_side import RefModels
    from probes.model_card import ModelCard
    from reference.models import LoadedModel

__all__ = [
    "CalibrationRun", "card_references", "default_profiles", "load_reference_models", "run_calibration",
]

#: Profiles a plain ``auditor calibrate`` runs: the ones docs/calibration.md covers (issue 14 added
#: honest-fp16, kv-fp8, w8a8, relaxed-threshold:0.7/0.9, typical-acceptance:0.03, greedy-relaxed and
#: the mixtures mix-int4:0.1 / mix-int4:0.05; int3 and the near-sibling substitute substituted:1
#: for item 5's heavier quantization and second substitute). Any other profile of
#: :data:`simulator.profiles.PROFILES` runs when named with ``--profiles``.
DEFAULT_PROFILES: tuple[str, ...] = (
    "honest-fp32", "honest-bf16", "honest-noisy", "honest-fp16", "int8", "int4", "int3", "fp8", "kv-fp8", "w8a8",
    "relaxed-threshold", "relaxed-threshold:0.7", "relaxed-threshold:0.9", "typical-acceptance",
    "typical-acceptance:0.03", "greedy-verify", "greedy-relaxed", "substituted", "substituted:1",
    "decode-noncompliant",
    "truncated-sampling", "mix-int4:0.1", "mix-int4:0.05",
)


def default_profiles(cfg: PoolConfig | None = None) -> list[str]:
    """The profiles a plain ``auditor calibrate`` runs: :data:`DEFAULT_PROFILES`, then every committed recording
    of a real engine (``recorded:NAME``, :mod:`auditor.calibration.recorded`) when ``cfg`` (default
    ``PoolConfig()``) asks for the requests the recordings hold (``recorded.replays_with``; a miniature run with
    ``--max-prompts`` or other budgets leaves them out)."""
    from auditor.calibration.recorded import recorded_profiles, replays_with

    return [*DEFAULT_PROFILES, *(recorded_profiles() if replays_with(cfg or PoolConfig()) else [])]


@dataclass
class CalibrationRun:
    """Everything one benchmark run produced.

    Attributes:
        records: fixed-budget cells (:class:`CalibrationRecord`), profile-major.
        sequential: sequential-audit records (see :func:`run_sequential_audits`), may be empty.
        meta: model, revision, budgets, audits, alpha, mix, pool config, floor summary, pools
            (sizes, backends, seconds, cache hits), timings (seconds per stage), machine.
    """

    records: list[CalibrationRecord]
    sequential: list[dict]
    meta: dict

    def to_json_list(self) -> list[dict]:
        """docs/calibration.json content: a list of records (fixed first, then sequential)."""
        out = [r.to_dict() for r in self.records]
        for s in self.sequential:
            d = dict(s)
            d.update(
                {
                    "design": "sequential",
                    "sequential_design": s["design"],
                    "budget_tokens": s["max_tokens"],
                    "model": self.meta.get("model"),
                    "revision": self.meta.get("revision"),
                }
            )
            out.append(d)
        return out


def load_reference_models(model: str | None = None, card: ModelCard | None = None) -> dict[str, LoadedModel]:
    """The reference in every honest precision (``auditor.check.measured_floors.REFERENCE_DTYPES``); with ``card``
    the reference computing it (:func:`card_references`). Picklable with ``functools.partial`` (``--workers``).

    Raises:
        auditor.check.errors.AuditError: ``parameter="card"``: the card cannot be computed on this model.
    """
    from reference.models import DEFAULT_MODEL, load_model  # torch

    name = model or DEFAULT_MODEL
    refs = {dt: load_model(name, dtype=dt) for dt in REFERENCE_DTYPES}
    return refs if card is None else card_references(refs, card)[0]


def card_references(refs: RefModels, card: ModelCard) -> tuple[dict[str, LoadedModel], tuple[str, ...]]:
    """The references of a calibration under a model card (issue 36): the card's checkpoint (``refs``, e.g. the
    native ``NAME+fp8`` variant) computing the card as ``auditor check`` computes it
    (``auditor.check.reference_setup.card_models``: FP8 activation tiles, an FP8 KV cache ...), so that the
    noise floor is the card's (keyed by the ``+card:`` revision) and every profile's pool is served from and
    scored against the card. Returns (dtype → model, the card's steps; () = the loaded weights are the card's).

    Each profile is served from the card-computing model (``auditor.calibration.collect.collect_pool`` builds the
    served model from the float32 reference): a profile's own FP8 activation tiles then repeat the card's (FP8
    rounding at one scale is idempotent), and NVFP4 activations (``native-fp8-nvfp4``) are rounded from the card's
    FP8 tiles, an error about 1/16 of NVFP4's own.

    Raises:
        auditor.check.errors.AuditError: ``parameter="card"``: the card cannot be computed on this model.
    """
    from auditor.check.reference_setup import card_models

    return card_models(as_refs(refs), card)


def run_calibration(
    profiles: Sequence[str] | None = None,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    audits: int = DEFAULT_AUDITS,
    *,
    ref_lms: RefModels | None = None,
    model: str | None = None,
    pool_cfg: PoolConfig | None = None,
    mix: AuditMix | Sequence[AuditMix] | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    cache_dir: Path | None = None,
    refresh: bool = False,
    sequential: SequentialDesign | Literal["auto"] | None = "auto",
    sequential_audits: int | None = None,
    honest_audits: int | None = None,
    fixed: bool = True,
    floor_kwargs: dict[str, Any] | None = None,
    workers: int = 1,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
    card: ModelCard | None = None,
) -> CalibrationRun:
    """Run the detection benchmark: pools (cached), resampled fixed-budget audits, sequential audits.

    Args:
        profiles: simulator profiles (default: all).
        budgets: completion-token budgets per audit.
        audits: resampled audits per profile × budget.
        ref_lms: reference dtype → LoadedModel (default: :func:`load_reference_models`).
        model: reference model name when ``ref_lms`` is None.
        pool_cfg: pool configuration.
        mix: probe mix, or several (default: the default suite's). With several, the first is the
            primary one (every budget; the sequential simulation); each further mix (a targeted
            suite such as ``precision`` or ``verification``) runs at the budgets it can spend
            (``budget <= mix.max_total``, plus ``max_total`` itself when a budget exceeds it), and
            its records carry its name in ``mix``.
        alpha: family-wise level of every audit.
        seed: base seed (pools use ``pool_cfg.seed``).
        cache_dir: cache root (pools under ``pools/``, floors under ``noise/``); default
            :func:`calibration_cache_dir` for pools and ``auditor.check.measured_floors``'s cache for floors.
        refresh: recollect pools even when cached.
        sequential: a ``SequentialDesign``, None (skip), or "auto" (geometric looks from the
            smallest budget to the largest with the spending and early-acceptance power of
            ``auditor check --budget-tokens auto``).
        sequential_audits: audits per profile for the sequential simulation (default ``audits``).
        honest_audits: audits per budget on honest profiles (default ``audits``): the
            false-accusation bound needs more audits than power does (issue 14: 400 per honest cell,
            so that a Clopper–Pearson upper bound of 8% is reachable at a 5% rate).
        fixed: run the fixed-budget audits (False: only the sequential simulation, e.g. after the
            effect-size table it depends on was refreshed from a fixed-budget run; join the two with
            ``auditor calibrate --merge``).
        floor_kwargs: extra arguments of ``auditor.check.measured_floors.get_floors`` (CI miniatures only).
        workers: processes for the floor, the pools and the audits (:mod:`auditor.calibration.parallel`;
            1 = all in this process). Needs the default CPU references (``ref_lms`` None): each worker
            loads its own.
        threads: torch CPU threads per worker process (default 1 when ``workers`` > 1).
        progress: callback for one-line status messages.
        card: calibrate under this model card (issue 36): the references compute it (:func:`card_references`,
            applied to ``ref_lms`` or to the loaded ``model``, the card's checkpoint), so that the floor is the
            card's and each profile's effects are relative to it; ``meta["card"]`` records its name, recipe, bits
            and steps (``auditor.calibration.effects.card_effects_entry`` turns the records into the effect-size
            table's ``cards`` entry). None = the float32 reference.

    Returns:
        CalibrationRun.

    Raises:
        KeyError: unknown profile name.
        ValueError: empty budgets, audits < 1, or ``workers`` > 1 with ``ref_lms`` given.
        auditor.check.errors.AuditError: ``parameter="card"``: the card cannot be computed on this model.
    """
    say = progress or (lambda _m: None)
    profiles = list(profiles or default_profiles(pool_cfg))
    for p in profiles:
        get_profile(p)
    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 1:
        raise ValueError(f"budgets must be positive token counts, got {budgets}")
    if audits < 1 or (honest_audits is not None and honest_audits < 1):
        raise ValueError(f"audits={audits} and honest_audits={honest_audits} must be >= 1")
    if workers > 1 and ref_lms is not None:
        raise ValueError("workers > 1 loads the default CPU references in each worker: leave ref_lms (--device/--dtype) unset")
    t_all = time.perf_counter()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    refs = as_refs(ref_lms) if ref_lms is not None else load_reference_models(model)
    steps: tuple[str, ...] = ()
    if card is not None:
        refs, steps = card_references(refs, card)
    timings["load_models_s"] = time.perf_counter() - t
    first = refs["float32"]
    mixes = [default_mix()] if mix is None else ([mix] if isinstance(mix, AuditMix) else list(mix))
    if not mixes:
        raise ValueError("mix: give at least one probe mix")
    mix = mixes[0]
    cfg = pool_cfg or PoolConfig()
    if sequential == "auto":
        sequential = SequentialDesign.geometric(max(budgets), first=min(budgets), alpha=alpha, spending=AUTO_SPENDING,
                                                accept_power=AUTO_ACCEPT_POWER)
    records: list[CalibrationRecord] = []
    seq_records: list[dict] = []
    pools_meta: dict[str, dict] = {}
    t_pools = t_audits = t_seq = 0.0
    n_for = {p: honest_audits if honest_audits is not None and get_profile(p).honest else audits for p in profiles}
    card_info: dict[str, Any] | None = None
    if card is not None:
        from auditor.check.reference_setup import card_fields

        card_info = {"name": card.name, "model": model or card.model, "steps": list(steps),
                     **card_fields(card, str(first.revision))}
    spec = CellSpec(tuple(mixes), tuple(budgets), alpha, seed, fixed, sequential, sequential_audits or audits, card_info)
    done: dict[str, ProfileCells] = {}
    if workers > 1:
        from functools import partial

        from auditor.calibration.parallel import audit_in_workers, prebuild_in_workers

        load_refs = partial(load_reference_models, model, card)
        t = time.perf_counter()
        prebuild_in_workers(profiles, refs, cfg, load_refs=load_refs, workers=workers, threads=threads,
                            cache_dir=cache_dir, refresh=refresh, floor_kwargs=floor_kwargs, progress=say)
        timings["parallel_pools_s"] = time.perf_counter() - t
        refresh = False  # collected just now
        t = time.perf_counter()
        done = audit_in_workers(profiles, cfg, n_for, spec, load_refs=load_refs, workers=workers, threads=threads,
                                cache_dir=cache_dir, floor_kwargs=floor_kwargs, progress=say)
        timings["parallel_audits_s"] = time.perf_counter() - t
    t = time.perf_counter()
    floors = get_noise_floor(refs, cache_dir=cache_dir, progress=say, **(floor_kwargs or {}))
    timings["noise_floor_s"] = time.perf_counter() - t
    say(f"noise floor ready ({'cached' if floors.meta.get('cached') else 'computed'}, {timings['noise_floor_s']:.0f}s)")
    for p in profiles:
        if p not in done:
            done[p] = pool_cells(p, refs, cfg, floors, spec, n_audits=n_for[p], refresh=refresh, progress=say,
                                 cache_dir=None if cache_dir is None else Path(cache_dir))
            t_pools += float(done[p].pool_meta["seconds"])
        cells = done[p]
        pools_meta[p] = cells.pool_meta
        records.extend(cells.records)
        t_audits += cells.audits_s
        if cells.sequential is not None:
            seq_records.append(cells.sequential)
            t_seq += cells.sequential_s
    timings.update({"pools_s": t_pools, "audits_s": t_audits, "sequential_s": t_seq,
                    "total_s": time.perf_counter() - t_all})
    import torch  # the reference models are loaded: torch is imported already

    meta = {
        "model": str(first.name),
        "revision": str(first.revision),
        "references": sorted(refs),
        "profiles": profiles,
        "budgets": budgets,
        "audits": audits,
        "honest_audits": honest_audits if honest_audits is not None else audits,
        "sequential_audits": (sequential_audits or audits) if sequential is not None else 0,
        "alpha": alpha,
        "seed": seed,
        "mix": mix.to_dict(),
        "mixes": [m.to_dict() for m in mixes],
        "pool_config": cfg.key_dict(),
        "pool_format": POOL_FORMAT,
        "pools": pools_meta,
        "noise_floor": floors.summary(),
        "sequential_design": sequential.to_dict() if sequential is not None else None,
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "card": card_info,
    }
    return CalibrationRun(records, seq_records, meta)
