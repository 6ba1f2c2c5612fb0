"""The ``check`` pipeline: probe a provider, score it against the reference, test, decide, store.

``run_check(provider_name, options)`` — what ``auditor check`` and the scheduler call — is one
sequence of named stages, each in its own module, each entered once on the way down (a stage never
calls back into one already left; tests/audit/test_pipeline.py traces this at run time):

1. **Plan** (:mod:`auditor.check.planning`): the provider from ``providers.toml`` (``provider_config``),
   the suite (``probes.suites``) cut to ``budget_tokens`` planned completion tokens
   (Σ max_tokens × samples) keeping its mix of modes and workloads.
2. **Reference** (:mod:`auditor.check.reference_setup`): device and chat-template checks, then the
   reference (local weights, a trusted vLLM server, or none) — all before any probe is sent.
3. **Probe** (:mod:`auditor.check.runner`, run kind ``audit``): every attempt stored as it arrives, each
   final response **normalized once** (``probes.normalize``) into ``normalized_tokens`` (bytes,
   logprobs, alternatives with their bytes, anomalies); ``resume=RUN_ID`` continues an
   interrupted audit (pending probes only; a finished one is only re-analysed).
4. **Pre-flight** (:mod:`auditor.check.preflight`): the parameter-compliance requests, sent once per run
   with the probes (stored in its summary, re-read on resume), and the run's probe failures: one
   frozen record with the ``preflight-*`` detector results and the verdict's keyword arguments.
4r. **Reference path** (:mod:`auditor.check.reference_path`): for a legacy-completions provider with
   ``capabilities.echo`` and a reference that can generate, the reference's greedy continuations of
   up to 16 temperature-0 prompts sent back with ``echo = true`` (the provider teacher-forced on the
   reference's own text; stored in the run summary, re-read on resume) and the margin-conditioned
   flip ratio along them — the cause feature verdict rule 2 prefers (``reference_path_*`` keys of
   logprob-divergence's details, not a Holm test). Otherwise "not available", with the reason.
   No normalizer runs after this stage.
5. **Noise floor** (:mod:`auditor.check.measured_floors`): measured once per model and machine, deterministic, cached.
6. **Observations** (:mod:`auditor.check.observations`): the stored tokens of each finished probe, aligned
   to the reference tokenizer through bytes (``probes.align``); only positions that map 1:1 are
   compared, alignment failures end a continuation and are counted; the aligned ids to store. A
   response whose tokens do not stand for its text (``UNTRUSTED_RESPONSE_ANOMALIES``, e.g.
   ``bytes_text_mismatch``) is excluded whole, counted and named in the report
   (summary ``excluded_responses``) and counted among the provider failures of the verdict (an
   audit whose every response is excluded ends INCONCLUSIVE, "provider failures").
7. **Reference scoring** (:mod:`auditor.check.reference_scoring`): the reference teacher-forced at the provider's
   own prefixes (float32 by default; more honest precisions with ``reference_dtypes``), batched,
   top-20 alternatives and the emitted token's logprob per position, through ``reference_cache``.
8. **Evidence** (:mod:`auditor.check.evidence`): one ``EvidenceBatch`` per reference precision (the self
   batch without a reference) and, when the reference's tokenizer is the claimed one, the tokenizer
   evidence (``tokenizer_mismatch``, rule 2t).
9. **Detection** (:mod:`auditor.check.run_detectors`): every detector against each batch with that
   precision's floor; intersection–union over the references; ``self-greedy`` on the provider's own
   logprobs; evidence rows given token texts.
10. **Verdict** (``auditor.verdict.decide.decide_verdict``): detectors, pre-flight and probe failures,
    tokenizer evidence → Holm → verdict.
11. **Summary** (:mod:`auditor.check.summary`): speed and headline figures of the run.
12. **Store → report**: detector results, verdict, the run summary and the aligned reference ids
    (``normalized_tokens.ref_token_id``) written in one final transaction (``auditor.store.queries``)
    → :class:`auditor.report.common.AuditReport`. Closing the reference is the teardown.

Errors a user can fix (bad config, unknown suite, unreachable database or provider, too small a
budget) raise :class:`auditor.check.errors.AuditError` (``exit_code`` 3) naming the parameter and the
fix in library terms; ``auditor/cli/check.py`` words them for the command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from auditor.check.errors import AuditError, AuditInterrupted, NothingToAuditError, failure_reason
from auditor.check.evidence import evidence_stage
from auditor.check.observations import aligned_ids, excluded_summary, read_observations
from auditor.check.planning import allowed_tests, impossible_tests, load_suite_spec, plan_budget, provider_config
from auditor.check.reference_scoring import score_observations
from auditor.check.reference_setup import (
    apply_card,
    check_card,
    check_device,
    check_reference_api,
    resolve_reference,
)
from auditor.check.run_detectors import detect
from auditor.check.stream_timing import speed_summary
from auditor.check.summary import summary_stage
from auditor.detectors import DetectorName
from auditor.report.common import AuditReport, deadline_line
from auditor.report.render import report_from_store

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from auditor.check.measured_floors import FloorSet
    from auditor.check.preflight import PreflightContext
    from auditor.check.reference_path import ReferencePath
    from auditor.check.reference_setup import ReferenceSetup
    from auditor.store import Store
    from probes.config import ProviderConfig
    from probes.suites import Suite
    from reference.models import LoadedModel

__all__ = ["AnalysisRecord", "CheckOptions", "analyze_run", "run_check"]

#: ``progress`` values: True (rich bars on stderr), a ``callback(stage, done, total)``, or None.
Progress = bool | Callable[[str, int, int], None] | None


@dataclass(frozen=True)
class CheckOptions:
    """How to run one audit (everything but the provider's name). Defaults are ``auditor check``'s.

    Attributes:
        suite: packaged suite name, suite JSON file, or a ``probes.suites.Suite`` object (a suite planned
            already: ``--budget-tokens auto`` hands each look's plan over this way; None = ``default``).
        budget_tokens: cap on planned completion tokens (None = the whole suite).
        alpha: family-wise significance level, in (0, 1).
        seed: detector randomization seed (recorded in the run summary).
        power: power a PASS needs against the target effects (None: the verdict's default;
            ``--budget-tokens auto`` raises it for early stops, auditor/check/auto_budget.py).
        resume: RUN_ID (or a unique prefix) of an interrupted audit to continue.
        db_url: database URL (default ``$AUDITOR_DB_URL`` or the user data dir SQLite file).
        config_path: providers file (default ``./providers.toml`` or the user config dir).
        provider_config: a ``ProviderConfig`` to use instead of reading ``config_path``.
        reference_dtypes: honest reference precisions (default ``auditor.check.measured_floors.REFERENCE_DTYPES``).
        reference_models: reference dtype → LoadedModel (instead of loading ``config.reference``;
            tests, calibration).
        device: where a ``local`` reference runs: ``auto`` (CUDA when available) | ``cpu`` | ``cuda`` |
            ``cuda:N`` (None: the reference table's, else CPU).
        dtype: one reference precision (``float32`` | ``bfloat16`` | ``float16``) instead of
            ``reference_dtypes``.
        floors_cache_dir: noise-floor cache directory (default ``auditor.check.measured_floors.noise_cache_dir()``).
        progress: True for rich progress bars (stderr), a callback ``(stage, done, total)``, or None.
        console: rich Console for progress output.
        deadline_s: wall-clock bound on the audit's requests, seconds from the start of the check
            (None: the provider's ``audit_deadline_s``, default 3600). Past it the audit ends with
            what it collected: probes in flight are cancelled and stay pending, the pre-flight and
            reference-path requests are not sent, the verdict is computed on the finished probes
            and the report says why (summary ``deadline``; issue 37, item 9).
        on_analysis: when set, stage 12 writes nothing: the :class:`AnalysisRecord` it would write is handed
            to this callback and the returned report is built inside a transaction that is rolled back (a
            look of ``--budget-tokens auto``, whose driver writes the deciding look's record once,
            :func:`auditor.check.auto_budget.run_sequential_check`).
    """

    suite: str | Suite | None = None
    budget_tokens: int | None = None
    alpha: float = 0.05
    seed: int = 0
    power: float | None = None
    resume: str | None = None
    db_url: str | None = None
    config_path: str | None = None
    provider_config: ProviderConfig | None = None
    reference_dtypes: Sequence[str] | None = None
    reference_models: Mapping[str, LoadedModel] | None = None
    device: str | None = None
    dtype: str | None = None
    floors_cache_dir: str | None = None
    progress: Progress = None
    console: Console | None = field(default=None, compare=False)
    deadline_s: float | None = None
    on_analysis: Callable[[AnalysisRecord], None] | None = field(default=None, compare=False)

    def validate(self) -> None:
        """Raises:
        AuditError: ``alpha`` outside (0, 1) or ``power`` outside (0, 1) (``parameter`` names it)."""
        if not 0 < self.alpha < 1:
            raise AuditError(f"alpha={self.alpha}: must be in (0, 1), e.g. 0.05", parameter="alpha")
        if self.power is not None and not 0 < self.power < 1:
            raise AuditError(f"power={self.power}: must be in (0, 1), e.g. 0.8", parameter="power")
        if self.deadline_s is not None and not 0 < self.deadline_s < float("inf"):
            raise AuditError(f"deadline_s={self.deadline_s}: must be a positive number of seconds, e.g. 600",
                             parameter="deadline_s")


# ------------------------------------------------------------------------------------------ progress
#: Said once, before the first audit of a reference model on this machine measures its noise floor
#: (issue 38, item 10): what, why, how long, and that it is cached.
FIRST_FLOOR_NOTE = (
    "measuring the honest noise floor of {model}: how much honest serving varies (float32 vs bf16 vs fp16 "
    "kernels), which every model test compares the provider against. First audit of this model on this "
    "machine only: about 7 minutes on 2 quiet CPU cores for SmolLM2-135M (18-28 minutes measured on busy machines), "
    "longer for larger models; cached in "
    "{path}, later audits reuse it.")


#: Said before probing with a suite too small to decide either question (``Suite.wire_check``; issue 38, item 12).
WIRE_CHECK_NOTE = ("note: suite {suite} is a wire check, not an audit: it shows that the endpoint, logprobs and "
                   "streaming work, but has too few positions to decide either question; for a verdict use "
                   "--suite default, precision or verification.")


@dataclass
class _Stage:
    """A progress reporter: rich progress bar (console) or callback; no-op by default."""

    progress: Progress = None
    console: Console | None = None
    _bar: Any = None
    _tasks: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> _Stage:
        if self.progress is True:
            from auditor.check.run_progress import progress_bar

            self._bar = progress_bar(self.console)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, stage: str, done: int, total: int) -> None:
        if self._bar is not None:
            if stage not in self._tasks:
                self._tasks[stage] = self._bar.add_task(stage, total=total)
            self._bar.update(self._tasks[stage], completed=done, total=total)
        elif callable(self.progress):
            self.progress(stage, done, total)

    def note(self, message: str) -> None:
        """One line of what the audit is doing now, printed above the bars (and into a log, where bars
        do not render until they stop); silent when no progress was asked for."""
        if self._bar is not None:
            self._bar.console.print(message, markup=False, highlight=False)
        elif self.progress is True:
            from rich.console import Console

            (self.console or Console(stderr=True)).print(message, markup=False, highlight=False)
        elif callable(self.progress):
            self.progress(message, 0, 0)

    def reporter(self, stage: str) -> Callable[[int, int], None]:
        """``progress(done, total)`` for one named stage."""
        return lambda done, total: self.update(stage, done, total)


# ------------------------------------------------------------------------------------------ entry point
def run_check(provider_name: str, options: CheckOptions | None = None, /, **overrides: Any) -> AuditReport:
    """Audit one provider end to end (see the module docstring) and return its report.

    Args:
        provider_name: the ``[providers.NAME]`` entry to audit.
        options: :class:`CheckOptions` (default: ``auditor check``'s defaults).
        overrides: single :class:`CheckOptions` fields by name (``run_check(name, budget_tokens=600)``),
            applied on top of ``options``.

    Returns:
        AuditReport (``exit_code``: 0 PASS, 1 deviation, 2 INCONCLUSIVE).

    Raises:
        AuditError: config/suite/database/connection/budget problems (exit code 3; ``parameter``
            names the option at fault when there is one).
        AuditInterrupted: Ctrl-C (a KeyboardInterrupt; the run is marked ``interrupted``; continue with
            ``resume=exc.run_id``).
        TypeError: an unknown option name in ``overrides``.

    Any error once the run exists (these and unexpected ones) leaves the run ``failed`` with the reason
    stored (``audit_runs.failure_reason``, :func:`auditor.check.errors.failure_reason`); an unexpected error
    propagates unchanged, carrying the failed run's id as ``exc.run_id`` when it did not have one.
    """
    from auditor.check.preflight import preflight_stage
    from auditor.check.reference_path import reference_path_stage
    from auditor.store import StoreError, open_store

    opts = dataclasses.replace(options or CheckOptions(), **overrides)
    t0 = time.perf_counter()
    opts.validate()
    cfg = provider_config(provider_name, opts.config_path, opts.provider_config)  # 1. plan
    plan = plan_budget(allowed_tests(load_suite_spec(opts.suite), cfg), opts.budget_tokens)
    impossible = impossible_tests(cfg)  # what the provider's enforced parameters rule out (issue 35 item 4)
    ref = _reference(cfg, opts)  # 2. reference: bad device, chat vs base model, dead vLLM: before any probe
    try:
        try:
            store = open_store(opts.db_url)
        except StoreError as exc:
            raise AuditError(str(exc), parameter="db_url") from None
        try:
            if plan.wire_check:  # issue 38 item 12: said up front, before the probes
                _Stage(opts.progress, opts.console).note(WIRE_CHECK_NOTE.format(suite=plan.name))
            budget_s = opts.deadline_s if opts.deadline_s is not None else cfg.audit_deadline_s
            deadline_at = t0 + budget_s
            src = "--deadline" if opts.deadline_s is not None else f"providers.{cfg.name}.audit_deadline_s"
            said = (f"deadline: {budget_s:g} s for this audit's requests ({src}); past it the audit ends with what it "
                    "has collected")
            # stated up front (issue 37, item 9): always when set explicitly, else with the progress
            if opts.console is not None and (opts.deadline_s is not None or "audit_deadline_s" in cfg.model_fields_set):
                opts.console.print(said, highlight=False)
            else:
                _Stage(opts.progress, opts.console).note(said)
            rid = _probe(store, cfg, plan, opts, deadline_at, budget_s)  # 3. probe
            try:
                more = time.perf_counter() < deadline_at and not _deadline_reached(store, rid)  # else: what it has
                pre = preflight_stage(store, rid, cfg, ref.tokenizer, run_requests=more)  # 4. pre-flight, sent with the probes
                rp = reference_path_stage(store, rid, cfg, ref, run_requests=more)  # 4r. echo on the reference's own continuations
                return analyze_run(store, rid, cfg, opts, wall_start=t0, reference=ref, preflight=pre,
                                   reference_path=rp, impossible=impossible)  # 5.-12.
            except KeyboardInterrupt:
                _set_status(store, rid, "interrupted")
                raise AuditInterrupted(rid) from None
            except BaseException as exc:
                _fail_run(store, rid, exc)
                raise
        finally:
            store.close()
    finally:
        ref.close()  # teardown


def _reference(config: ProviderConfig, opts: CheckOptions) -> ReferenceSetup:
    """Stage 2: the audit's reference (local models, a vLLM backend, or none) from ``config.reference``,
    after refusing a device that is not there (CUDA without a GPU) and a chat audit against a base
    model (no chat template)."""
    check_device(opts.device, opts.dtype)
    if not opts.reference_models:
        check_reference_api(config.reference, config.api, opts.config_path)
    ref = resolve_reference(config.reference, claimed_model=config.model, config_path=opts.config_path,
                            dtypes=[opts.dtype] if opts.dtype else opts.reference_dtypes, device=opts.device,
                            models=opts.reference_models)
    try:
        ref = apply_card(ref, check_card(config, ref))  # issue 36 item 2: the reference computes the card
    except BaseException:
        ref.close()
        raise
    return ref


# ------------------------------------------------------------------------------------------ analysis
def analyze_run(
    store: Store,
    run_id: str,
    config: ProviderConfig,
    options: CheckOptions | None = None,
    /,
    *,
    wall_start: float | None = None,
    reference: ReferenceSetup | None = None,
    preflight: PreflightContext | None = None,
    reference_path: ReferencePath | None = None,
    impossible: Mapping[str, str] | None = None,
    **overrides: Any,
) -> AuditReport:
    """Stages 5–12 of the pipeline on a run whose probes are stored; stores and returns the report.

    Args:
        store: open store; run_id: the run; config: its ProviderConfig.
        options: alpha, seed, power, reference_dtypes/models, floors_cache_dir, progress, console
            are used (:class:`CheckOptions`); ``overrides`` replace single fields.
        wall_start: ``time.perf_counter()`` at the start of the check (for ``wall_s``).
        reference: the reference already set up (:func:`auditor.check.reference_setup.resolve_reference`;
            the caller closes it); None resolves ``config.reference`` (stage 2, closed here).
        preflight: the run's pre-flight (stage 4, :func:`auditor.check.preflight.preflight_stage`); None
            runs that stage first.
        reference_path: the run's reference-path feature (stage 4r,
            :func:`auditor.check.reference_path.reference_path_stage`); None runs that stage first.
        impossible: the tests the provider's enforced parameters make impossible, from the plan stage
            (:func:`auditor.check.planning.impossible_tests`); None computes them here.

    Raises:
        NothingToAuditError: no probe produced tokens (connection/config problem).
        MemoryRefusal: the noise floor or the reference scoring would need more memory than is
            available (``auditor.check.memory``; exit 3, the run stays stored and can be resumed).
        TypeError: an unknown option name in ``overrides``.
    """
    from auditor.check.preflight import preflight_stage
    from auditor.check.reference_path import reference_path_stage

    opts = dataclasses.replace(options or CheckOptions(), **overrides)
    t0 = wall_start if wall_start is not None else time.perf_counter()
    ref = reference if reference is not None else _reference(config, opts)
    try:
        pre = preflight if preflight is not None else preflight_stage(store, run_id, config, ref.tokenizer)
        rp = reference_path if reference_path is not None else reference_path_stage(store, run_id, config, ref)
        imp = impossible if impossible is not None else impossible_tests(config)
        return _analyze(store, run_id, config, opts, ref, pre, rp, t0, imp)
    finally:
        if reference is None:
            ref.close()  # teardown of the reference set up here


def _analyze(store: Store, run_id: str, config: ProviderConfig, opts: CheckOptions, ref: ReferenceSetup,
             pre: PreflightContext, rp: ReferencePath, t0: float, impossible: Mapping[str, str]) -> AuditReport:
    """Stages 5–12: body of :func:`analyze_run` once the reference (``ref``) and the pre-flight
    (``pre``) are there. Each stage module is called in turn and not again."""
    from auditor.check.measured_floors import floor_is_cached, floor_memory_need, get_floors
    from auditor.check.memory import ensure_fits
    from auditor.check.reference_scoring import scoring_memory_need
    from auditor.verdict.decide import decide_verdict
    from auditor.verdict.power import DEFAULT_POWER
    from reference.backends import ReferenceError

    tokenizer = ref.tokenizer
    with _Stage(opts.progress, opts.console) as stage:
        # 5. noise floor, and its summary for the report
        if ref.lms and not (cached := floor_is_cached(ref.lms, opts.floors_cache_dir))[0]:
            stage.note(FIRST_FLOOR_NOTE.format(model=next(iter(ref.lms.values())).name, path=cached[1].parent))
            ensure_fits(floor_memory_need(ref.lms), provider=config.name, run_id=run_id)  # issue 41: refuse, not killed
        floors = get_floors(ref.lms, cache_dir=opts.floors_cache_dir, progress=stage.update) if ref.lms else None
        floor_summary = floors.summary() if floors is not None else None
        # 6. observations, and the aligned ids the final transaction stores
        loaded = read_observations(store, run_id, config, tokenizer)
        observations, excluded = loaded.observations, excluded_summary(loaded.excluded)
        if not observations and excluded is None:
            raise NothingToAuditError(f"run {run_id}: no probe returned any token, nothing to audit. Fix: check the "
                                      f"provider's base_url/model/key, then resume the run.",
                                      run_id=run_id, provider=config.name)
        aligned = aligned_ids(observations)
        # 7. reference scoring
        if ref.lms:
            ensure_fits(scoring_memory_need(next(iter(ref.lms.values())), [(o.prompt_ids, o.ref_ids) for o in observations]),
                        provider=config.name, run_id=run_id)
        try:
            scored = {
                dt: score_observations(store, scorer, observations, progress=stage.reporter(f"reference scoring ({dt})"))
                for dt, scorer in ref.scorers.items()
            }
        except ReferenceError as exc:
            raise AuditError(f"reference {config.reference!r} could not score: {exc}", parameter="reference",
                             provider=config.name) from None
    # 8. evidence; 9. detection
    ev = evidence_stage(observations, scored, tokenizer, api=config.api, tokenizer_is_claimed=ref.tokenizer_is_claimed)
    results = _with_reference_path(detect(ev.batches, floors, observations, tokenizer, seed=opts.seed,
                                          self_batch=ev.self_batch), rp)
    # 9s. stream timing; 10. verdict, read with the speculation fingerprint of the run's streams (rule 4,
    # issue 37 item 8)
    ref0 = next(iter(ref.scorers), ref.dtype_label)
    speed = speed_summary(store, run_id)
    card = ref.card_info  # the rules-out list is below the card (issue 36; set in stage 2)
    verdict = decide_verdict([*results, *pre.detector_results], opts.alpha,
                             floor=_deciding_floor(results, floors, ref0) if floors is not None else None,
                             power=DEFAULT_POWER if opts.power is None else opts.power,
                             tokenizer_mismatch=ev.tokenizer_mismatch, speculation=speed.get("speculation"),
                             card_bits=card["card_bits"], card_recipe=card["card_recipe"], model=config.reference,
                             **_with_excluded(pre.verdict_kwargs, excluded))
    verdict = _mark_not_tested(verdict, ref)
    verdict = _mark_impossible(verdict, impossible)
    # 11. summary
    summary, tokens_extra = summary_stage(store, run_id, verdict.results, floors, ref0, observations, ev.n_positions,
                                          speed=speed)
    if ev.convention:
        summary["logprob_convention"] = ev.convention  # issue 40: how the provider spells its logprobs
    details = dict(verdict.details)
    details["report"] = {
        "detectors": {r.name: {"details": r.details} for r in verdict.results},
        "reference_variants": list(ref.scorers),
        "reference_kind": ref.kind,
        "not_tested": list(ref.not_tested),
        "reference_notes": list(ref.notes or []),
        "noise_floor": floor_summary,
        "tokens_extra": tokens_extra,
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    # 12. store → report
    record = AnalysisRecord(run_id=run_id, aligned=list(aligned), results=list(verdict.results),
                            verdict=verdict.verdict, reason=verdict.reason, details=details,
                            summary={**summary, "seed": opts.seed, "excluded_responses": excluded}, alpha=opts.alpha,
                            reference_model=config.reference, reference_revision=ref.revision,
                            reference_dtype=ref.dtype_label)
    if opts.on_analysis is None:
        with store.session() as s:
            record.write(s)
        with store.session() as s:
            rep = report_from_store(s, run_id)
    else:  # a look of a sequential audit: its driver writes the deciding look's record, once
        opts.on_analysis(record)
        with store.new_session() as s:
            try:
                record.write(s)
                rep = report_from_store(s, run_id)
            finally:
                s.rollback()
    rep.wall_s = details["report"]["wall_s"]
    return rep


def _with_reference_path(results: Sequence[Any], rp: ReferencePath) -> list[Any]:
    """The detector results with the reference-path cause feature (stage 4r) in ``logprob-divergence``'s
    details (``reference_path_*`` keys, :attr:`auditor.check.reference_path.ReferencePath.details`) when it
    ran; the feature is no test of its own and never enters the Holm family."""
    return [dataclasses.replace(r, details={**(r.details or {}), **rp.details})
            if r.name == DetectorName.LOGPROB_DIVERGENCE and r.ran else r for r in results]


def _with_excluded(verdict_kwargs: Mapping[str, Any], excluded: Mapping[str, Any] | None) -> dict[str, Any]:
    """The verdict's keyword arguments with the excluded responses counted among the provider
    failures (kind ``excluded: <reason>``): a response whose tokens cannot be trusted is a sample the
    audit lost, like a failed request, so above ``auditor.verdict.decide.MAX_PROVIDER_FAILURE_SHARE`` the
    verdict is INCONCLUSIVE with reason "provider failures", never "more tokens would suffice"."""
    out = dict(verdict_kwargs)
    f = dict(out.get("provider_failures") or {})
    if not excluded or not f.get("total"):
        return out
    kinds = dict(f.get("kinds") or {})
    for k, n in (excluded.get("reasons") or {}).items():
        kinds[f"excluded: {k}"] = kinds.get(f"excluded: {k}", 0) + int(n)
    out["provider_failures"] = {**f, "failed": int(f.get("failed") or 0) + int(excluded["responses"]), "kinds": kinds}
    return out


def _mark_not_tested(verdict: Any, ref: ReferenceSetup) -> Any:
    """The verdict with the causes this reference cannot test named in its reason and details
    (``reference = "none"``: "QUANTIZATION not tested: no reference; SUBSTITUTION not tested: ...")."""
    causes = [c for c in ref.not_tested if c != verdict.verdict]  # tokenizer evidence can still name SUBSTITUTION
    if not causes:
        return verdict
    note = "; ".join(f"{c} not tested: no reference" for c in causes)
    details = dict(verdict.details)
    details["not_tested"] = dict.fromkeys(causes, "no reference (reference = 'none')")
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; {note}", details=details)


def _mark_impossible(verdict: Any, impossible: Mapping[str, str]) -> Any:
    """The verdict with the questions the provider's enforced parameters made impossible said plainly in
    its reason (``"; not tested: the provider enforces temperature = 1.0 ..."``) and in
    ``details["impossible_tests"]`` (:func:`auditor.check.planning.impossible_tests`; issue 35 item 4)."""
    if not impossible:
        return verdict
    details = {**verdict.details, "impossible_tests": dict(impossible)}
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; not tested: {'; '.join(impossible.values())}",
                               details=details)


def _deciding_floor(results: Sequence[Any], floors: FloorSet, ref0: str) -> Any:
    """The floor the verdict's power calculation uses: logprob-divergence's nearest reference's,
    else the first reference's."""
    lp = next((r for r in results if r.name == DetectorName.LOGPROB_DIVERGENCE and r.ran), None)
    fl = floors.floors.get(lp.details.get("nearest_reference")) if lp is not None else None
    return fl or floors.floors.get(ref0)


@dataclass(frozen=True)
class AnalysisRecord:
    """What stage 12 writes for one analysed run, in one transaction (:meth:`write`).

    Attributes:
        run_id: the run.
        aligned: ``(probe_id, reference token ids)`` rows, the ids aligned to each probe's tokens.
        results: the verdict's detector results (``auditor.detectors.DetectorResult``, Holm-adjusted).
        verdict, reason: the verdict and its one-line reason.
        details: the verdict's details, with the report's extras under ``"report"`` (detector details,
            reference variants, noise floor, extra token counts, ``wall_s``).
        summary: the run-summary keys the analysis sets (merged into the stored summary).
        alpha: the family-wise level the verdict was taken at.
        reference_model, reference_revision, reference_dtype: the reference it was compared with.
    """

    run_id: str
    aligned: list[tuple[int, Sequence[int | None]]]
    results: list[Any]
    verdict: str
    reason: str
    details: dict[str, Any]
    summary: dict[str, Any]
    alpha: float
    reference_model: str | None
    reference_revision: str | None
    reference_dtype: str | None

    def write(self, s: Any, *, decided: tuple[str, str, Mapping[str, Any]] | None = None) -> None:
        """Write aligned ids, detector results, verdict, run summary and status ``completed`` in session ``s``.

        Args:
            s: an open SQLAlchemy session (the caller commits or rolls back).
            decided: ``(verdict, reason, details)`` to store instead of the record's own (a sequential
                audit's decision differs from its deciding look's verdict, auditor/check/auto_budget.py); the
                report's extras (``details["report"]``) are kept.
        """
        from auditor.check.stored_figures import store_figures
        from auditor.store import queries as q

        verdict, reason, details = self.verdict, self.reason, self.details
        if decided is not None:
            verdict, reason = decided[0], decided[1]
            details = {**decided[2], "report": self.details.get("report")}
        q.set_aligned_ref_token_ids(s, self.aligned)
        q.store_detector_results(s, self.run_id, self.results)
        q.store_verdict(s, self.run_id, verdict, reason, details)
        run = q.get_run(s, self.run_id)
        prev = dict((run.summary if run is not None else None) or {})
        prev.pop("runner", None)
        prev.update(self.summary)
        q.update_run(s, self.run_id, alpha=self.alpha, summary=prev, reference_model=self.reference_model,
                     reference_revision=self.reference_revision, reference_dtype=self.reference_dtype)
        q.set_run_status(s, self.run_id, "completed")
        store_figures(s, self.run_id)  # the dashboard's answers, headline and standing (auditor.check.stored_figures)


def _deadline_reached(store: Store, run_id: str) -> bool:
    """Whether the probe stage of ``run_id`` stopped at the audit deadline (summary ``deadline``)."""
    return bool((_run_summary(store, run_id).get("deadline") or {}).get("reached"))


def _probe(store: Store, cfg: ProviderConfig, plan: Any, opts: CheckOptions, deadline_at: float,
           deadline_budget_s: float | None = None) -> str:
    """Stage 3: send (or resume) the planned probes until ``deadline_at`` (``time.perf_counter()``
    seconds); return the run id once at least one succeeded.

    Raises:
        NothingToAuditError: no probe succeeded (names the errors seen).
        AuditInterrupted: Ctrl-C while probing.
    """
    from auditor.check.runner import RunnerError, describe_errors, run_probes, summarize_run
    from auditor.store import queries as q

    started: dict[str, str] = {}
    try:
        rid = run_probes(
            store, cfg, plan, run_id=opts.resume, resume=opts.resume is not None,
            progress=True if opts.progress is True else None, kind="audit", console=opts.console,
            on_start=lambda r, _res: started.setdefault("run_id", r),
            deadline_s=max(0.001, deadline_at - time.perf_counter()), deadline_budget_s=deadline_budget_s,
        )
    except RunnerError as exc:
        raise AuditError(str(exc), parameter="resume" if opts.resume else None, provider=cfg.name) from None
    except KeyboardInterrupt:
        raise AuditInterrupted(started.get("run_id")) from None
    except Exception as exc:  # an unexpected error inside the runner: the run it started fails with the reason
        if "run_id" in started:
            _fail_run(store, started["run_id"], exc)
        raise
    with store.session() as s:
        run = q.get_run(s, rid)
        status = run.status if run is not None else "failed"
        counts = q.probe_counts(s, rid)
        if opts.budget_tokens is not None:
            q.update_run(s, rid, budget_tokens=int(opts.budget_tokens))
        q.update_run(s, rid, alpha=opts.alpha)
    if status == "failed" or not counts.get("done"):
        summ = summarize_run(store, rid)
        what = describe_errors(summ.error_kinds, summ.error_examples)
        late = _deadline_reached(store, rid)
        err = NothingToAuditError(
            f"provider {cfg.name!r} at {cfg.base_url}: no probe succeeded"
            + (f" before the audit deadline ({deadline_line(_run_summary(store, rid))})" if late else "")
            + f" ({what}). Fix: check that the server is running and its base_url/model/api_key_env"
            + (", or give it more time (--deadline / audit_deadline_s)" if late else "")
            + ", then resume the run.", run_id=rid, provider=cfg.name)
        _fail_run(store, rid, err)
        raise err
    _set_status(store, rid, "running")
    return rid


def _run_summary(store: Store, run_id: str) -> dict[str, Any]:
    from auditor.store import queries as q

    with store.session() as s:
        run = q.get_run(s, run_id)
        return dict((run.summary if run is not None else None) or {})


def _set_status(store: Store, run_id: str, status: str, reason: str | None = None) -> None:
    from auditor.store import queries as q

    with contextlib.suppress(Exception), store.session() as s:
        q.set_run_status(s, run_id, status, reason=reason)


def _fail_run(store: Store, run_id: str, exc: BaseException) -> None:
    """Mark ``run_id`` ``failed`` with ``exc``'s reason (:func:`auditor.check.errors.failure_reason`); an exception
    without a ``run_id`` gets this one, so the command line can name the failed run."""
    _set_status(store, run_id, "failed", failure_reason(exc))
    if getattr(exc, "run_id", None) is None:
        with contextlib.suppress(AttributeError, TypeError):
            exc.run_id = run_id  # type: ignore[attr-defined]  # read back with getattr by the command line
