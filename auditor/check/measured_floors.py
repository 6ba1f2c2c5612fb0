"""Noise-floor calibration per reference model: measured, not assumed, and cached on disk.

An honest provider does not reproduce the reference bit for bit: it may serve the original weights
in bfloat16, and its kernels, batch composition and speculative verification rounds change the
reduction order. The detectors therefore test a provider against the spread of *honest*
deployments, measured here on the real serving path:

- every honest simulator profile of :data:`HONEST_BY_REFERENCE` (``honest-fp32``; ``honest-noisy``,
  logit noise 0.02 nats standing for GPU batch-order/kernel noise; ``honest-bf16``) generates
  greedy continuations of :data:`FLOOR_PROMPTS` prompts (every distinct prompt of the bundled
  suites) through
  ``reference.speculative.speculative_generate`` with its drafter and the strict verifier, which
  returns the full ``[n, V]`` log-softmax the provider would report;
- the reference teacher-forces the same continuations (``reference.scoring.score_continuations``,
  batched exactly like an audit);
- ``auditor.detectors.compute_noise_floor`` turns (reference rows, provider rows) into a
  :class:`~auditor.detectors.NoiseFloor` (greedy near-tie band, honest clear-mismatch rate,
  bucketed-KL null per top_logprobs width M with prompt-level variance components); the floors
  of several variants merge into the most lenient one (:func:`merge_floors`);
- ``cross_kl`` records the full-vocabulary mean KL of every honest variant against every reference.

**Nearest honest reference, measured.** bf16 rounding moves SmolLM2-135M's distribution about as
much as int8 weight-only quantization does (full-vocabulary mean KL vs fp32: bf16 8.4e-4, int8
1.9e-3, fp8 1.2e-2, int4 0.22 nats), so we measured whether comparing a provider with the *nearest*
of an fp32 and a bf16 reference (intersection–union: accuse only if far from both) separates int8
better than one fp32 reference whose floor includes the bf16 deployment. It does not: a bf16
teacher-forced reference and a bf16 server that decodes incrementally differ by 1.2e-3 nats — as
much as bf16 differs from fp32 — because bf16 rounding is re-drawn by any change of computation
order. bf16 is a noise *level*, not a point to compare with, and int8 is about 2.3× that level from
either reference. So the default is one float32 reference whose floor is the most lenient of the
three honest profiles (:data:`REFERENCE_DTYPES`); the intersection–union machinery stays available
(``run_check(reference_dtypes=("float32", "bfloat16"))``), e.g. for a reference served in another
precision. Numbers and the resulting power: docs/detectors.md ("Noise floor in the pipeline").

**Deterministic.** The measurement has no random or timing-dependent choice: the honest variants
decode greedily with a fixed speculation depth (``adaptive_k=False``: the draft-length policy, although
count-based since issue 11, would still change how a continuation is split into verify forwards
as the drafter changes, and a different split changes the float reduction order, hence the
logprob rows), every generator is
seeded (``seed = prompt index``, ``torch.manual_seed(FLOOR_SEED)``, logit-noise nonce = 1000 +
prompt index), and teacher forcing uses a fixed batch size. Two measurements with the same key on
the same machine give identical numbers (``tests/audit/test_noise.py``).

Cache: one JSON file per key under :func:`noise_cache_dir`
(``$SPEC_AUDITOR_NOISE_DIR``, else ``$SPEC_AUDITOR_HOME/noise``, else the platformdirs user cache).
The key (:func:`floor_cache_key`) covers everything the numbers depend on: the method version
(:data:`NOISE_METHOD`), the model revision, the reference precisions, the honest profiles' recipes,
the suite and prompt token ids, the measurement settings (tokens, k, batch size, seed), the torch
and transformers versions and the CPU kernel family (``torch.backends.cpu.get_cpu_capability()``:
bf16 arithmetic differs between AVX2 and AVX-512 machines). It is computed once per model and
machine setup (396 s on 2 quiet CPU cores for the default model, 52 prompts; ~35 min for
gemma-3-270m, whose 262k-token vocabulary makes every forward costly) and re-used by every audit.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from auditor.check.memory import StageNeed, floor_block_rows, floor_need, model_shape, release_freed_memory
from auditor.detectors.noise_floor import FloorAccumulator, KLFloor, NoiseFloor

__all__ = [
    "ENV_NOISE_DIR",
    "FLOOR_BATCH_SIZE",
    "FLOOR_K",
    "FLOOR_MAX_NEW_TOKENS",
    "FLOOR_PROMPTS",
    "FLOOR_SEED",
    "FLOOR_SUITE",
    "HONEST_BY_REFERENCE",
    "NOISE_METHOD",
    "REFERENCE_DTYPES",
    "FloorSet",
    "compute_floors",
    "floor_cache_key",
    "floor_is_cached",
    "floor_memory_need",
    "floor_prompts",
    "get_floors",
    "merge_floors",
    "noise_cache_dir",
]

#: Version of the floor method; part of the cache key (bump when the measurement changes).
NOISE_METHOD = "nearest-honest-reference/5"  # 2: fixed k, seeded, key covers CPU + versions; 3: margin-gain survival; 4: y by position; 5: 52 prompts
#: Precisions the reference is teacher-forced in by default. One (float32) — see the module
#: docstring: bf16 rounding is a noise *level* (bf16 vs bf16 on another computation path diverges
#: as much as bf16 vs fp32), so a second, bf16 reference buys no separation and costs a second
#: scoring pass. ``run_check(reference_dtypes=("float32", "bfloat16"))`` enables it.
REFERENCE_DTYPES = ("float32",)
#: Simulator profiles whose served outputs define the floor of each reference precision.
HONEST_BY_REFERENCE: dict[str, tuple[str, ...]] = {
    "float32": ("honest-fp32", "honest-noisy", "honest-bf16"),
    "bfloat16": ("honest-bf16",),
}
#: Prompts (greedy and logprob probes of :data:`FLOOR_SUITE`, workloads interleaved) the floor is
#: measured on: every one of the bundled suites' 52 distinct prompts. The floor's mean is
#: estimated, and its sampling variance enters every logprob test's null (``KLFloor.null_mean``):
#: on 16 prompts it was as large as the audit's own variance at 500 tokens (docs/detectors.md).
FLOOR_PROMPTS = 52
#: Greedy tokens generated per floor prompt.
FLOOR_MAX_NEW_TOKENS = 32
#: Speculation depth used by the honest variants (the simulator's default), fixed every round.
FLOOR_K = 4
#: Seed of the measurement (``torch.manual_seed``; per prompt the generator seed is the prompt index).
FLOOR_SEED = 0
#: Teacher-forcing batch size of the measurement (sequences per forward; part of the key).
FLOOR_BATCH_SIZE = 8
#: Suite whose greedy/logprob prompts the floor is measured on (``precision``: all 52 prompts of the
#: bundled suites, every workload; ``default`` has 20).
FLOOR_SUITE = "precision"
#: Environment variable naming the floor cache directory (overrides ``$SPEC_AUDITOR_HOME/noise``).
ENV_NOISE_DIR = "SPEC_AUDITOR_NOISE_DIR"


def noise_cache_dir() -> Path:
    """``$SPEC_AUDITOR_NOISE_DIR``, else ``$SPEC_AUDITOR_HOME/noise``, else
    ``<platformdirs user cache>/spec-auditor/noise`` (the tests point the first at a session
    directory, so that no test reads the user's floors)."""
    own = os.environ.get(ENV_NOISE_DIR)
    if own:
        return Path(own).expanduser()
    home = os.environ.get("SPEC_AUDITOR_HOME")
    if home:
        return Path(home).expanduser() / "noise"
    import platformdirs

    return Path(platformdirs.user_cache_dir("spec-auditor")) / "noise"


@dataclass
class FloorSet:
    """The noise floors of one reference model, one per honest reference precision.

    Attributes:
        model: reference model name; revision: its weights revision (sha256 prefix).
        floors: reference dtype (``float32``/``bfloat16``) → :class:`NoiseFloor` measured between
            that reference and the honest providers of the same precision.
        cross_kl: reference dtype → honest profile → mean full-vocabulary KL(reference || variant)
            in nats over the floor positions (documentation of the design; not used by tests).
        key: the cache key it was stored under.
        meta: provenance (prompts, tokens, seconds, torch version, created_at).
    """

    model: str
    revision: str
    floors: dict[str, NoiseFloor]
    cross_kl: dict[str, dict[str, float]] = field(default_factory=dict)
    key: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def references(self) -> list[str]:
        """Reference precisions with a floor, in :data:`REFERENCE_DTYPES` order."""
        return [r for r in REFERENCE_DTYPES if r in self.floors] + [r for r in self.floors if r not in REFERENCE_DTYPES]

    def most_lenient(self) -> NoiseFloor:
        """A floor whose greedy band and honest clear-mismatch rate are the largest over references
        (used by tests that do not depend on a reference, e.g. ``self-greedy``)."""
        fl = list(self.floors.values())
        base = max(fl, key=lambda f: f.margin_band)
        return dataclasses.replace(
            base,
            margin_band=max(f.margin_band for f in fl),
            clear_mismatch_rate=max(f.clear_mismatch_rate for f in fl),
            honest_flip_rate=max(f.honest_flip_rate for f in fl),
        )

    def summary(self) -> dict[str, Any]:
        """A small JSON-able summary for reports: per reference the band, rates and mean KL by M."""
        refs = {}
        for r, f in self.floors.items():
            refs[r] = {
                "variants": list(f.variants),
                "margin_band": f.margin_band,
                "clear_mismatch_rate": f.clear_mismatch_rate,
                "honest_flip_rate": f.honest_flip_rate,
                "mean_kl_by_m": {m: round(v.mean_kl, 8) for m, v in sorted(f.kl.items(), key=lambda kv: int(kv[0]))},
            }
        first = next(iter(self.floors.values())) if self.floors else None
        return {
            "method": NOISE_METHOD,
            "model": self.model,
            "revision": self.revision,
            "key": self.key,
            "variants": sorted({v for f in self.floors.values() for v in f.variants}),
            "n_positions": first.n_positions if first else 0,
            "n_prompts": first.n_prompts if first else 0,
            "margin_band": max((f.margin_band for f in self.floors.values()), default=None),
            "clear_mismatch_rate": max((f.clear_mismatch_rate for f in self.floors.values()), default=None),
            "references": refs,
            "cross_kl": self.cross_kl,
        }

    def to_json(self) -> str:
        """Serialise (floors via ``NoiseFloor.to_dict``)."""
        return json.dumps(
            {
                "model": self.model,
                "revision": self.revision,
                "floors": {r: f.to_dict() for r, f in self.floors.items()},
                "cross_kl": self.cross_kl,
                "key": self.key,
                "meta": self.meta,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, s: str) -> FloorSet:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: malformed record (names the missing field).
        """
        d = json.loads(s)
        for k in ("model", "revision", "floors"):
            if k not in d:
                raise ValueError(f"noise floor file lacks field {k!r}; delete it to recompute")
        return cls(
            model=d["model"],
            revision=d["revision"],
            floors={r: NoiseFloor.from_dict(f) for r, f in d["floors"].items()},
            cross_kl=d.get("cross_kl") or {},
            key=d.get("key", ""),
            meta=d.get("meta") or {},
        )


def merge_floors(floors: Sequence[NoiseFloor]) -> NoiseFloor:
    """Merge floors measured for several honest variants of one precision into the most lenient one.

    Band, flip and clear-mismatch rates: the maximum; per width M: the KL floor with the largest
    mean log-KL (the most lenient null), as ``compute_noise_floor`` does for variants measured on
    the same positions.

    Raises:
        ValueError: on an empty list.
    """
    floors = list(floors)
    if not floors:
        raise ValueError("merge_floors needs at least one NoiseFloor")
    if len(floors) == 1:
        return floors[0]
    kl: dict[str, KLFloor] = {}
    for f in floors:
        for m, rec in f.kl.items():
            prev = kl.get(m)
            if prev is None or rec.log_kl["mean"] > prev.log_kl["mean"]:
                kl[m] = rec
    dq: dict[str, float] = {}
    gs: dict[str, float] = {}
    for f in floors:
        for q, v in f.margin_delta_quantiles.items():
            dq[q] = max(dq.get(q, 0.0), float(v))
        for g, v in f.margin_gain_survival.items():
            gs[g] = max(gs.get(g, 0.0), float(v))
    base = floors[0]
    return NoiseFloor(
        model=base.model,
        variants=[v for f in floors for v in f.variants],
        n_positions=min(f.n_positions for f in floors),
        n_prompts=min(f.n_prompts for f in floors),
        margin_band=max(f.margin_band for f in floors),
        margin_delta_quantiles=dq,
        margin_gain_survival=gs,
        honest_flip_rate=max(f.honest_flip_rate for f in floors),
        clear_mismatch_rate=max(f.clear_mismatch_rate for f in floors),
        kl=kl,
        eps=base.eps,
        meta={"merged": [f.meta for f in floors]},
    )


def floor_prompts(tokenizer: Any, n: int = FLOOR_PROMPTS, suite: str = FLOOR_SUITE) -> tuple[list[str], list[list[int]]]:
    """The floor's prompts: the first ``n`` greedy/logprob probes of ``suite`` (chat template).

    Returns:
        (names [n] probe ids, prompt ids [n] lists of int).
    """
    from probes.suites import load_suite
    from reference.scoring import encode_prompt

    probes = [p for p in load_suite(suite).probes if p.mode in ("greedy", "logprob")]
    # interleave workloads so that a small n still covers code, math, chat and repetition
    by_w: dict[str, list[Any]] = {}
    for p in probes:
        by_w.setdefault(p.workload, []).append(p)
    order: list[Any] = []
    while any(by_w.values()) and len(order) < n:
        for w in list(by_w):
            if by_w[w] and len(order) < n:
                order.append(by_w[w].pop(0))
    chat = bool(getattr(tokenizer, "chat_template", None))
    ids = [encode_prompt(tokenizer, p.chat_messages() if chat else p.prompt_text(), chat=chat) for p in order]
    return [p.id for p in order], ids


def floor_cache_key(
    revision: str,
    prompts: Sequence[Sequence[int]],
    *,
    references: Sequence[str] = REFERENCE_DTYPES,
    honest: Mapping[str, Sequence[str]] = HONEST_BY_REFERENCE,
    max_new_tokens: int = FLOOR_MAX_NEW_TOKENS,
    k: int = FLOOR_K,
    suite: str = FLOOR_SUITE,
    batch_size: int = FLOOR_BATCH_SIZE,
    seed: int = FLOOR_SEED,
) -> str:
    """First 16 hex of the sha256 over everything the floor depends on (see module docstring).

    Args:
        revision: reference weights revision; prompts: [P] prompt token ids (the prompt set).
        references: reference precisions (dtype names) measured; honest: their honest profiles
            (keyed by recipe, ``simulator.profiles.Profile.describe()``).
        max_new_tokens, k, suite, batch_size, seed: measurement settings.
    """
    import torch
    import transformers

    from simulator.profiles import get_profile

    recipes = {r: [get_profile(p).describe() for p in honest[r]] for r in references}
    blob = json.dumps(
        {
            "method": NOISE_METHOD,
            "revision": revision,
            "references": list(references),
            "recipes": recipes,
            "suite": suite,
            "prompts": [[int(t) for t in p] for p in prompts],
            "max_new_tokens": int(max_new_tokens),
            "k": int(k),
            "batch_size": int(batch_size),
            "seed": int(seed),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cpu": _cpu_capability(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cpu_capability() -> str:
    """The CPU kernel family torch dispatches to (``AVX2``, ``AVX512``, ...; bf16 results depend on it)."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # pragma: no cover - old torch
        import platform

        return platform.machine()


def _served(lm: Any, sigma: float) -> Any:
    """``lm`` wrapped as the simulator serves it (logit tap + optional kernel noise), no copy."""
    from reference.models import LoadedModel
    from simulator.served_model import ServedModel

    served = ServedModel(lm.model, sigma=sigma)
    served.eval()
    return LoadedModel(model=served, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision,
                       dtype=lm.dtype, device=lm.device)


def _cast(lm: Any, dtype: str) -> Any:
    """A deep copy of ``lm`` in ``dtype`` (the honest variant's weights).

    Each parameter is cast on its own while the module is copied (tied weights stay tied), so the
    copy costs ``params × bytes(dtype)`` — 0.5 GiB for gemma-3-270m in bfloat16 — and never a second
    float32 copy first (1 GiB more at the floor's peak, benchmarks/memory.py). Same values as
    copying then casting: one rounding of each float32 weight.
    """
    import copy

    import torch

    from reference.models import LoadedModel, parse_dtype

    td = parse_dtype(dtype)
    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach().to(td, copy=True), requires_grad=p.requires_grad)
        for p in lm.model.parameters()
    }
    m = copy.deepcopy(lm.model, memo).to(td)
    m.eval()
    return LoadedModel(model=m, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision, dtype=td,
                       device=lm.device)


def compute_floors(
    ref_lms: Mapping[str, Any],
    *,
    prompt_names: Sequence[str],
    prompts: Sequence[Sequence[int]],
    honest: Mapping[str, Sequence[str]] = HONEST_BY_REFERENCE,
    max_new_tokens: int = FLOOR_MAX_NEW_TOKENS,
    k: int = FLOOR_K,
    batch_size: int = FLOOR_BATCH_SIZE,
    seed: int = FLOOR_SEED,
    progress: Callable[[str, int, int], None] | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
) -> FloorSet:
    """Measure the noise floor of every reference precision in ``ref_lms`` (see module docstring).

    Memory is bounded by blocks, not by vocabulary × positions (issue 41: the old measurement kept
    every variant's ``[positions, V]`` rows and their float64 copies, 23 GB for gemma-3-270m). Per
    honest variant: its continuations are generated one prompt at a time (``[max_new_tokens, V]``
    float32 rows) and the rows are appended to a temporary file (:class:`_RowSpill`, ``positions ×
    V × 4`` bytes of *disk*, 1.7 GB for gemma-3-270m's 1,664 positions, deleted after the
    variant); the reference then teacher-forces the continuations in the same batches as before
    (``reference.scoring.score_continuations`` with a ``row_sink``: ``2 × logit_rows × V × 4``
    bytes, 512 MiB at any V), and each chunk of reference rows meets the variant's rows read back
    from the file in a :class:`~auditor.detectors.noise_floor.FloorAccumulator`, ``block_rows`` at
    a time (``64 × block_rows × V`` bytes). What is kept is ~1.2 KB per position and variant.
    The numbers are bit-identical to reducing all rows at once (tests/audit/test_noise_memory.py).

    Args:
        ref_lms: reference dtype (``float32``, ``bfloat16``) → ``reference.models.LoadedModel`` of
            the same weights in that precision.
        prompt_names, prompts: [P] names and prompt token ids.
        honest: reference dtype → honest simulator profile names of that precision.
        max_new_tokens: greedy tokens per prompt and variant.
        k: speculation depth of the honest variants, used every round (no adaptive depth).
        batch_size: teacher-forcing batch size.
        seed: ``torch.manual_seed`` of the measurement; prompt ``i`` decodes with seed ``seed + i``.
        progress: ``progress(stage, done, total)`` after each prompt decoded: one stage
            ``"noise floor: VARIANT"`` per honest variant, ``done`` of its ``total = len(prompts)`` prompts
            (each stage ends at ``done == total``).
        spill_dir: directory of the temporary row file (default: the system's temporary directory;
            :func:`get_floors` passes the floor cache directory, on disk rather than a tmpfs).

    Returns:
        FloorSet (``key`` and cache fields left to :func:`get_floors`).

    Raises:
        ValueError: an honest profile needs a precision not in ``ref_lms``; no prompts.
    """
    import torch

    from reference.drafter_specs import make_drafter
    from reference.speculative import speculative_generate
    from reference.verify import StrictVerifier
    from simulator.profiles import get_profile

    if not prompts:
        raise ValueError("compute_floors needs at least one prompt")
    refs = list(ref_lms)
    variants: dict[str, Any] = {}
    for r in refs:
        for name in honest.get(r, ()):
            variants[name] = get_profile(name)
    models = dict(ref_lms)

    def model_in(dtype: str) -> Any:
        if dtype not in models:
            if "float32" not in models:
                raise ValueError(f"an honest profile is {dtype}; pass ref_lms['float32'] or ref_lms[{dtype!r}]")
            models[dtype] = _cast(models["float32"], dtype)
        return models[dtype]

    torch.manual_seed(int(seed))
    t0 = time.perf_counter()
    per_ref: dict[str, list[NoiseFloor]] = {r: [] for r in refs}
    cross: dict[str, dict[str, float]] = {r: {} for r in refs}
    n_pos: dict[str, int] = {}
    order = list(variants.items())
    for idx, (name, prof) in enumerate(order):
        base = model_in(prof.dtype)
        served = _served(base, prof.logit_noise)
        drafter = make_drafter(prof.default_drafter, base.model)
        eos = list(base.eos_token_ids)
        cs: list[list[int]] = []
        gs: list[str] = []
        ps: list[int] = []  # per row: its 0-based position in the continuation
        with _RowSpill(int(base.model.config.vocab_size), spill_dir) as spill:
            for i, ids in enumerate(prompts):
                served.model.nonce = 1_000 + i
                res = speculative_generate(
                    served, list(ids), drafter=drafter, k=k, max_new_tokens=max_new_tokens, temperature=0.0,
                    eos_token_ids=eos, verifier=StrictVerifier(), return_logprobs=True, seed=int(seed) + i,
                    adaptive_k=False,  # a fixed depth: one split into verify forwards, whatever the policy
                )
                toks = list(res.token_ids)
                lp = res.logprobs
                if lp is None or not toks:
                    cs.append([])
                else:
                    cs.append(toks)
                    spill.append(lp.float().numpy()[: len(toks)])
                    gs.extend([prompt_names[i]] * len(toks))
                    ps.extend(range(len(toks)))
                del res, lp
                if progress is not None:  # counted per variant: each stage's bar ends at its own total
                    progress(f"noise floor: {name}", i + 1, len(prompts))
            n_pos[name] = spill.rows
            # issue 41: a cast copy (e.g. the bf16 honest copy of a float32 reference) is dropped once
            # the last variant in its dtype has decoded, before scoring: scoring uses the references
            # only, so the copy's params × 2 bytes are not resident beside the scoring block.
            if prof.dtype not in ref_lms and all(p.dtype != prof.dtype for _, p in order[idx + 1:]):
                models.pop(prof.dtype, None)
            del base, served, drafter
            gc.collect()
            release_freed_memory()  # the dropped copy's per-layer weights, kept in the C heap otherwise
            for r in refs:
                acc = _score_against(ref_lms[r], name, prompts, cs, spill, batch_size)
                cross[r][name] = acc.mean_full_kl(name)
                if name in honest.get(r, ()):
                    per_ref[r].append(acc.finish(
                        prompt_ids=np.asarray(gs, dtype=object), positions=np.asarray(ps, dtype=np.int64),
                        model=f"{ref_lms[r].name}@{ref_lms[r].revision}/{r}", meta={"reference_dtype": r, "variant": name},
                    ))
                del acc
    floors = {r: merge_floors(per_ref[r]) for r in refs}
    first = next(iter(ref_lms.values()))
    return FloorSet(
        model=str(first.name),
        revision=str(first.revision),
        floors=floors,
        cross_kl=cross,
        meta={
            "prompts": list(prompt_names),
            "max_new_tokens": int(max_new_tokens),
            "k": int(k),
            "adaptive_k": False,
            "seed": int(seed),
            "batch_size": int(batch_size),
            "cpu": _cpu_capability(),
            "positions": n_pos,
            "seconds": round(time.perf_counter() - t0, 2),
            "torch": torch.__version__,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "honest": {r: list(honest.get(r, ())) for r in refs},
        },
    )


class _RowSpill:
    """A temporary file of float32 ``[rows, V]`` log-prob rows: appended in order, read back by row.

    Holds one honest variant's rows while the reference is teacher-forced (no mapping, so neither
    RSS nor the address space grows with it); the file is deleted on close.

    Args:
        vocab_size: V; directory: where the file lives (None: the system's temporary directory).
    """

    def __init__(self, vocab_size: int, directory: str | os.PathLike[str] | None = None) -> None:
        import tempfile

        self.v = int(vocab_size)
        self.rows = 0
        self._f = tempfile.TemporaryFile(prefix="floor-rows-", dir=directory)  # noqa: SIM115  # closed by __exit__

    def __enter__(self) -> _RowSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def append(self, rows: np.ndarray) -> None:
        """Append ``[n, V]`` rows (written as float32).

        Raises:
            ValueError: a row width other than V.
        """
        a = np.ascontiguousarray(rows, dtype=np.float32)
        if a.ndim != 2 or a.shape[1] != self.v:
            raise ValueError(f"rows {a.shape} must be [n, V={self.v}]")
        self._f.seek(0, os.SEEK_END)
        a.tofile(self._f)
        self.rows += a.shape[0]

    def read(self, start: int, n: int) -> np.ndarray:
        """Rows ``start .. start + n - 1`` as a ``[n, V]`` float32 array.

        Raises:
            ValueError: rows beyond what was appended.
        """
        if start < 0 or n < 0 or start + n > self.rows:
            raise ValueError(f"rows {start}..{start + n - 1} outside 0..{self.rows - 1}")
        self._f.flush()
        self._f.seek(start * self.v * 4)
        return np.fromfile(self._f, dtype=np.float32, count=n * self.v).reshape(n, self.v)


def _score_against(ref_lm: Any, name: str, prompts: Sequence[Sequence[int]], conts: Sequence[Sequence[int]],
                   spill: _RowSpill, batch_size: int) -> FloorAccumulator:
    """Teacher-force the non-empty ``conts`` with ``ref_lm`` and reduce each chunk of its rows with the
    variant ``name``'s rows (``spill``, rows in prompt order) in a :class:`FloorAccumulator`
    (``full_kl=True``); memory: see :func:`compute_floors`."""
    from reference.scoring import score_continuations

    keep = [j for j, c in enumerate(conts) if c]
    first_row = np.concatenate([[0], np.cumsum([len(conts[j]) for j in keep])]).astype(int)
    acc = FloorAccumulator(spill.rows, spill.v, [name], full_kl=True, block_rows=floor_block_rows())

    def sink(item: int, t0: int, rows: Any) -> None:
        start = int(first_row[item]) + t0
        ref_rows = rows.numpy()
        for s in range(0, ref_rows.shape[0], acc.block_rows):
            e = min(ref_rows.shape[0], s + acc.block_rows)
            acc.add(start + s, ref_rows[s:e], [spill.read(start + s, e - s)])

    score_continuations(ref_lm, [prompts[j] for j in keep], [conts[j] for j in keep], top_k=0, full=True,
                        batch_size=batch_size, row_sink=sink)
    return acc


def _floor_file(
    ref_lms: Mapping[str, Any], n_prompts: int | None, max_new_tokens: int | None,
    cache_dir: str | os.PathLike[str] | None,
) -> tuple[list[str], list[list[int]], str, Path]:
    """``(prompt names, prompt ids, cache key, cache file)`` of a floor measurement (see :func:`get_floors`)."""
    n_prompts = FLOOR_PROMPTS if n_prompts is None else int(n_prompts)
    max_new_tokens = FLOOR_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    first = next(iter(ref_lms.values()))
    names, prompts = floor_prompts(first.tokenizer, n_prompts)
    key = floor_cache_key(first.revision, prompts, references=list(ref_lms), max_new_tokens=max_new_tokens)
    d = Path(cache_dir) if cache_dir is not None else noise_cache_dir()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(first.name))[-60:]
    return names, prompts, key, d / f"{safe}-{first.revision}-{key}.json"


def floor_is_cached(
    ref_lms: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None = None, *,
    n_prompts: int | None = None, max_new_tokens: int | None = None,
) -> tuple[bool, Path]:
    """Whether :func:`get_floors` with the same arguments will read the floor from its cache (no
    measurement), and the cache file it reads or writes."""
    *_, path = _floor_file(ref_lms, n_prompts, max_new_tokens, cache_dir)
    return path.is_file(), path


def floor_memory_need(ref_lms: Mapping[str, Any], *, n_prompts: int | None = None,
                      max_new_tokens: int | None = None) -> StageNeed:
    """Upper bound of the extra memory :func:`get_floors` needs to measure the floor of ``ref_lms``
    (``auditor.check.memory.floor_need``: one block of rows at a time; a bf16 copy when the reference is
    float32 only and a bf16 honest profile is measured)."""
    n = FLOOR_PROMPTS if n_prompts is None else int(n_prompts)
    t = FLOOR_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    from simulator.profiles import get_profile

    first = next(iter(ref_lms.values()))
    bf16 = "bfloat16" not in ref_lms and any(
        get_profile(name).dtype == "bfloat16" for r in ref_lms for name in HONEST_BY_REFERENCE.get(r, ()))
    return floor_need(model_shape(first), n_positions=n * t, max_new_tokens=t, needs_bf16_copy=bf16)


def get_floors(
    ref_lms: Mapping[str, Any],
    *,
    n_prompts: int | None = None,
    max_new_tokens: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> FloorSet:
    """The reference model's floors, from the disk cache or measured now (then cached).

    Args:
        ref_lms: reference dtype → LoadedModel (same weights); see :func:`compute_floors`.
        n_prompts, max_new_tokens: size of the measurement (part of the cache key; default
            :data:`FLOOR_PROMPTS` and :data:`FLOOR_MAX_NEW_TOKENS`, read at call time).
        cache_dir: where floor files live (default :func:`noise_cache_dir`).
        force: recompute even when cached.
        progress: ``progress(stage, done, total)``.

    Returns:
        FloorSet with ``key`` set and ``meta["cached"]`` telling whether it came from the cache.
    """
    names, prompts, key, path = _floor_file(ref_lms, n_prompts, max_new_tokens, cache_dir)
    d = path.parent
    if path.is_file() and not force:
        try:
            fs = FloorSet.from_json(path.read_text(encoding="utf-8"))
            fs.meta["cached"] = True
            fs.meta["path"] = str(path)
            return fs
        except (ValueError, KeyError, TypeError):
            pass  # corrupt: recompute
    max_new_tokens = FLOOR_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    d.mkdir(parents=True, exist_ok=True)
    fs = compute_floors(ref_lms, prompt_names=names, prompts=prompts, max_new_tokens=max_new_tokens, progress=progress,
                        spill_dir=d)
    fs.key = key
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(fs.to_json(), encoding="utf-8")
    tmp.replace(path)
    fs.meta["cached"] = False
    fs.meta["path"] = str(path)
    return fs
