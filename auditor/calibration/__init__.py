"""Detection benchmark: false-accusation rate and power per simulator profile × token budget.

How it works (issue 7); the modules of this package, in the order they run:

1. **Pools, once per profile** (:func:`collect_pool`; modules ``pool``, ``decoding``, ``collect``).
   For every simulator profile (``simulator.profiles``) the provider's outputs for a fixed set of
   requests are collected once, in-process, and cached on disk under ``<cache>/calibration/pools``
   keyed by (model revision, profile recipe, suite versions and digests, pool config, pool format):
   temperature-0 continuations of every distinct prompt of the shipped suites (the greedy and
   logprob probes; one continuation per prompt — at T = 0 a prompt has only one answer) and ``n``
   temperature-1 samples per prompt (the sampling probes' law). Every position keeps the provider's
   emitted token, its reported logprob and top-20 alternatives, and the reference's top-20 at the
   provider's own prefix (teacher forcing), so any probe mix can be replayed.

   Backends: where a profile serves *plain* decoding of its served model at a temperature
   (strict/lossless verification — honest, quantized, substituted, truncated sampling, and the
   greedy path of the lossy verifiers, which ``simulator.verifiers`` verifies exactly),
   the requests are decoded in batches directly from the simulator's served model
   (``simulator.served_model.build_served_model``): lossless speculative decoding has exactly
   the output law of plain decoding of the target (Leviathan et al. 2023, Thm. 1; tested in
   ``tests/reference``), and batching makes the pool ~8x cheaper on CPU. Where the profile's
   behaviour lives in its verifier at that temperature (``relaxed-threshold``,
   ``typical-acceptance``, ``greedy-verify`` at T > 0; ``decode-noncompliant`` at T = 0) every
   request goes through :class:`simulator.engine.SimulatorEngine` itself (its drafter,
   verifier and seeds) — the very code ``auditor serve`` runs.

2. **Resampled audits** (:func:`run_calibration`; modules ``draws``, ``sequential``,
   ``benchmark``). An audit at budget B draws probes from the pool without replacement in the
   proportions of a probe mix (:class:`AuditMix`; default: the default suite's
   greedy/logprob/sampling token shares and its ``top_logprobs`` widths), truncating the last
   continuation so the audit spends exactly B completion tokens, builds the detectors'
   :class:`~auditor.detectors.EvidenceBatch`, runs every detector, Holm and the verdict rules
   (:func:`audit_verdict`) — the same functions ``auditor check`` runs.

3. **Metrics** per profile × budget (module ``metrics``): rejection rate (a deviation verdict; on
   honest profiles the false-accusation rate, on the others the power) with a Clopper–Pearson 95%
   interval, the verdict confusion counts, cause-correct rate among rejections, INCONCLUSIVE rate,
   and per-detector contributions (how often each ran, rejected after Holm, and which rule
   decided). Written as JSON (:func:`write_outputs`), a Markdown table and a PNG plot
   (``outputs``), and stored in the ``calibration_results`` table (:func:`store_results`,
   ``store``), which the dashboard's Calibration page reads. ``auditor plan`` answers the inverse
   question from them (:func:`make_plan`, ``plan``).

Statistical caveat (stated in docs/calibration.md): audits are resampled from one finite pool
per profile; at budgets close to the pool's size audits overlap, so neighbouring audits are
positively correlated and the binomial interval is optimistic about the pool-to-pool spread.
Pool sizes are reported with every record.
"""

from __future__ import annotations

from auditor.calibration.benchmark import (
    CalibrationRun,
    load_reference_models,
    run_calibration,
)
from auditor.calibration.cells import get_noise_floor, mix_budgets
from auditor.calibration.collect import (
    backend_for,
    collect_pool,
    load_or_collect_pool,
    pool_path,
)
from auditor.calibration.decoding import score_groups, score_prompt_groups
from auditor.calibration.draws import (
    DEFAULT_AUDITS,
    DEFAULT_BUDGETS,
    MODES,
    AuditDraw,
    AuditDrawer,
    AuditMix,
    AuditOutcome,
    audit_verdict,
    default_mix,
    draw_audit,
    evidence_for,
    run_audits,
)
from auditor.calibration.metrics import (
    ACCEPTED_CAUSES,
    MAX_FALSE_ACCUSATION,
    MAX_FALSE_ACCUSATION_UPPER,
    MIN_CAUSE_CORRECT,
    POWER_TARGETS,
    TARGET_POWER,
    CalibrationRecord,
    check_targets,
    clopper_pearson,
    record_grid,
    record_suite,
    summarize_audits,
    tokens_for_power,
)
from auditor.calibration.outputs import (
    ANALYSIS_MARKER,
    merge_outputs,
    render_markdown,
    render_plot,
    write_outputs,
    write_record_files,
)
from auditor.calibration.plan import PLAN_TARGETS, make_plan
from auditor.calibration.pool import (
    POOL_FORMAT,
    PROVIDER_TOP_N,
    REF_TOP_K,
    Pool,
    PoolConfig,
    PoolRequest,
    build_requests,
    calibration_cache_dir,
)
from auditor.calibration.sequential import run_sequential_audits
from auditor.calibration.store import (
    load_calibration,
    store_results,
)

__all__ = [
    "ACCEPTED_CAUSES",
    "ANALYSIS_MARKER",
    "DEFAULT_AUDITS",
    "DEFAULT_BUDGETS",
    "MAX_FALSE_ACCUSATION",
    "MAX_FALSE_ACCUSATION_UPPER",
    "MIN_CAUSE_CORRECT",
    "MODES",
    "PLAN_TARGETS",
    "POOL_FORMAT",
    "POWER_TARGETS",
    "PROVIDER_TOP_N",
    "REF_TOP_K",
    "TARGET_POWER",
    "AuditDraw",
    "AuditDrawer",
    "AuditMix",
    "AuditOutcome",
    "CalibrationRecord",
    "CalibrationRun",
    "Pool",
    "PoolConfig",
    "PoolRequest",
    "audit_verdict",
    "backend_for",
    "build_requests",
    "calibration_cache_dir",
    "check_targets",
    "clopper_pearson",
    "collect_pool",
    "default_mix",
    "draw_audit",
    "evidence_for",
    "get_noise_floor",
    "load_calibration",
    "load_or_collect_pool",
    "load_reference_models",
    "make_plan",
    "merge_outputs",
    "mix_budgets",
    "pool_path",
    "record_grid",
    "record_suite",
    "render_markdown",
    "render_plot",
    "run_audits",
    "run_calibration",
    "run_sequential_audits",
    "score_groups",
    "score_prompt_groups",
    "store_results",
    "summarize_audits",
    "tokens_for_power",
    "write_outputs",
    "write_record_files",
]
