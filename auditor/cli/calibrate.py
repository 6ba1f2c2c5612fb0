"""CLI commands: ``auditor calibrate`` (the detection benchmark) and ``auditor plan`` (budget planner).

``auditor calibrate`` measures, on the provider simulator where the truth is known, how often the
audit accuses an honest provider and how many tokens it needs to catch each kind of cheating
(``auditor/calibration/``); it writes docs/calibration.{json,md,png} (``--out``) and stores the
cells in the ``calibration_results`` table (the dashboard's Calibration page).

``auditor plan`` answers the inverse question from that calibration: how many tokens (and USD at
the provider's prices) an audit needs for a given power against a given deviation.

Exit codes: 0 success; 2 (plan) the calibration does not cover the model or never reaches the
power; 3 usage/config/database error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from auditor.cli.common import console as out_console
from auditor.cli.common import fail
from auditor.cli.options import DbOption


def _ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        fail(f"{name} must be a comma-separated list of integers, got {text!r} (e.g. 100,300,1000,3000)")
    if not vals or min(vals) < 1:
        fail(f"{name} must hold positive integers, got {text!r}")
    return vals


def calibrate_cmd(
    profiles: str | None = typer.Option(
        None, "--profiles",
        help="Comma-separated simulator profiles (see `auditor serve --list-profiles`) and recorded real-engine "
             "providers recorded:NAME (auditor/calibration/recorded/NAME.npz); default: all of both."
    ),
    budgets: str = typer.Option("100,300,1000,3000", "--budgets", help="Completion-token budgets per audit."),
    audits: int = typer.Option(200, "--audits", min=1, help="Resampled audits per profile and budget."),
    suites: str = typer.Option(
        "default,precision,verification", "--suites",
        help="Probe mixes to calibrate, by suite name; the first is the primary one (all budgets, sequential).",
    ),
    out_arg: str = typer.Option(
        "docs", "--out", help="Directory for calibration.json/.md/.png (empty string: do not write)."
    ),
    db: DbOption = None,
    store: bool = typer.Option(True, "--store/--no-store", help="Store the cells in calibration_results."),
    model: str | None = typer.Option(None, "--model", help="Reference model (default: the bundled SmolLM2-135M)."),
    alpha: float = typer.Option(0.05, "--alpha", min=1e-6, max=0.5, help="Family-wise level of each audit."),
    seed: int = typer.Option(0, "--seed", help="Seed of the resampling and the detectors."),
    samples: int = typer.Option(4, "--samples", min=1, help="Temperature-1 samples per prompt in each pool."),
    honest_samples: int = typer.Option(
        12, "--honest-samples", min=1, help="Samples per prompt in honest profiles' pools (false accusations need big pools)."
    ),
    engine_samples: int = typer.Option(
        2, "--engine-samples", min=1, help="Samples per prompt where the simulator engine must run (lossy verifiers)."
    ),
    max_prompts: int | None = typer.Option(None, "--max-prompts", min=1, help="Use only N distinct prompts (quick runs)."),
    t0_max_tokens: int = typer.Option(64, "--t0-max-tokens", min=1, help="Max tokens of a temperature-0 request."),
    sampling_max_tokens: int = typer.Option(24, "--sampling-max-tokens", min=1, help="Max tokens of a sampling request."),
    sequential: bool = typer.Option(True, "--sequential/--no-sequential", help="Also simulate --budget-tokens auto."),
    fixed: bool = typer.Option(
        True, "--fixed/--no-fixed",
        help="Run the fixed-budget audits (--no-fixed: only the sequential simulation; join runs with --merge)."),
    sequential_audits: int | None = typer.Option(None, "--sequential-audits", min=1, help="Audits per profile (default --audits)."),
    honest_audits: int | None = typer.Option(
        None, "--honest-audits", min=1,
        help="Resampled audits per budget on honest profiles (default --audits; 400 lets the false-accusation upper bound reach 8%)."),
    spending: str = typer.Option("pocock", "--spending", help="α spending: pocock (auto's) | obrien-fleming | linear."),
    accept_power: float = typer.Option(
        0.99, "--accept-power", min=0.5, max=0.9999, help="Power an early PASS needs in the sequential simulation (auto's: 0.99)."
    ),
    resolve_cause: bool = typer.Option(
        False, "--resolve-cause/--stop-at-rejection",
        help="Sequential simulation: probe on after a rejection whose cause is not established (auditor check --resolve-cause)."),
    refresh: bool = typer.Option(False, "--refresh", help="Recollect pools even when cached."),
    effects: bool = typer.Option(
        False, "--effects/--no-effects",
        help="Also refresh the package's effect-size table (auditor/calibration/effect_sizes.json), which a "
             "PASS's 'rules out' list is computed against, from these records (use for the committed calibration)."),
    merge: str | None = typer.Option(
        None, "--merge",
        help="Comma-separated directories of earlier `calibrate --out DIR` runs (e.g. profile subsets run in "
             "parallel): join their records (later ones win) and write them to --out; runs nothing."),
    export_requests: Path | None = typer.Option(
        None, "--export-requests",
        help="Write requests.json (an honest pool's requests: prompt token ids, budgets, seeds) and manifest.json "
             "(sha256 of the reference's float32 tensors) into DIR for scripts/gpu_pool.py, which records a real "
             "engine's outputs as a recorded:NAME profile (auditor/calibration/recorded.py); runs nothing else."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Cache root for pools and the noise floor (default: the user cache dir; a new root measures the floor again)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch CPU threads (default: torch's choice; 1 per worker with --workers)."),
    workers: int = typer.Option(
        1, "--workers", min=1, help="Processes for the noise floor, the pools and the audits (a cold run on 2 cores: --workers 2)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the records as JSON instead of a table."),
    device: str | None = typer.Option(None, "--device", help="Where the reference (and the simulated engines) run: auto (CUDA when available) | cpu | cuda | cuda:N (default: cpu)."),
    dtype: str | None = typer.Option(None, "--dtype", help="One reference precision: float32 | bfloat16 | float16 (default: float32 and bfloat16)."),
    card: str | None = typer.Option(
        None, "--card",
        help="Calibrate under a bundled model card (e.g. smollm2-135m-instruct+fp8; docs/model-cards.md): the reference "
             "computes the card and the floor is the card's; --model defaults to the card's model. With --effects the "
             "below-card profiles' effects (e.g. --profiles native-fp8-int4,native-fp8-kv-fp8,native-fp8-nvfp4) go into "
             "effect_sizes.json's cards section, not the float32 classes."),
) -> None:
    """Detection benchmark: false-accusation rate and power per simulator profile and token budget."""
    from auditor import calibration as cal
    from auditor.check.errors import AuditError

    # a str option: Path("") would read as "." and write into the working directory
    out: Path | None = Path(out_arg) if out_arg.strip() else None
    if merge is not None:
        if card is not None:
            fail("--merge joins float32 runs only; drop --card (calibrate under the card in one run)")
        _merge_runs(merge, out, effects=effects, as_json=as_json)
        return
    the_card, model = _card(card, model)
    # options → configuration (each check exits 3 naming its option, before any model loads)
    cfg = cal.PoolConfig(
        sampling_samples=samples,
        honest_sampling_samples=honest_samples,
        engine_sampling_samples=engine_samples,
        max_prompts=max_prompts,
        t0_max_tokens=t0_max_tokens,
        sampling_max_tokens=sampling_max_tokens,
    )
    names = _profile_names(profiles, cfg)
    _check_device(device, dtype)
    bl = _ints(budgets, "--budgets")
    design = _sequential_design(bl, sequential=sequential, alpha=alpha, spending=spending, accept_power=accept_power,
                                resolve_cause=resolve_cause)
    if threads:
        import torch

        torch.set_num_threads(threads)
    if export_requests is not None:
        _export_requests(export_requests, model, cfg)
        return
    say = _clock()
    mixes = _suite_mixes(suites)
    ref_lms = _reference_models(model, device, dtype, workers)
    # running
    try:
        run = cal.run_calibration(
            names, bl, audits, ref_lms=ref_lms, model=model, pool_cfg=cfg, alpha=alpha, seed=seed, cache_dir=cache_dir, mix=mixes,
            refresh=refresh, sequential=design, sequential_audits=sequential_audits, honest_audits=honest_audits, fixed=fixed,
            workers=workers, threads=threads, progress=say, card=the_card,
        )
    except (KeyError, ValueError) as exc:
        fail(str(exc))
    except AuditError as exc:
        fail(f"--{exc.parameter}: {exc}")
    # rendering: files, database rows, the tables
    _save_run(run, out, store=store, db=db, effects=effects and the_card is None, say=say)
    if effects and the_card is not None:
        _refresh_card_effects(run, str(model), say)
    _print_records(run.to_json_list(), run.meta, as_json=as_json)


def _merge_runs(merge: str, out: Path | None, *, effects: bool, as_json: bool) -> None:
    """``--merge``: join the records of earlier ``calibrate --out DIR`` runs into ``out`` and print them."""
    from auditor import calibration as cal

    if out is None or not str(out):
        fail("--merge needs --out DIR (where the joined files are written)")
    try:
        recs, meta = cal.merge_outputs([x.strip() for x in merge.split(",") if x.strip()])
    except ValueError as exc:
        fail(f"--merge: {exc}")
    paths = cal.write_record_files(recs, meta, out)
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()), err=True)
    _refresh_effects(recs, effects)
    _print_records(recs, meta, as_json=as_json)


def _card(name: str | None, model: str | None) -> tuple[Any, str | None]:
    """``--card NAME`` as (the bundled card, the reference model: ``--model`` or the card's); (None, ``model``)
    without it. Exits 3 on an unknown card name or a ``--model`` the card does not describe."""
    if name is None:
        return None, model
    from probes.model_card import BUNDLED_CARDS

    card = BUNDLED_CARDS.get(name)
    if card is None:
        fail(f"--card: no bundled card named {name!r} (known: {', '.join(sorted(BUNDLED_CARDS))}). Fix: use one of "
             "these (docs/model-cards.md).")
    if model is not None and card.model is not None and model != card.model:
        fail(f"--card {name} describes the model {card.model!r}, not --model {model!r}. Fix: drop --model or give "
             f"--model {card.model}.")
    return card, model or card.model


def _refresh_card_effects(run: Any, model: str, say: Callable[[str], None]) -> None:
    """``--card NAME --effects``: write the below-card profiles' effects into effect_sizes.json's ``cards`` section
    (:func:`auditor.calibration.effects.write_card_effects`); exits 3 when no profile run serves a class below it."""
    from auditor.calibration import effects as eff

    c = run.meta["card"]
    try:
        path, entry = eff.write_card_effects(
            run.to_json_list(), key=c["name"], model=model, card=c["card_recipe"], card_bits=c["card_bits"],
            path=eff.EFFECT_SIZES_PATH,
            source=f"auditor calibrate --card {c['name']} ({len(run.meta['profiles'])} profiles, budgets "
                   f"{run.meta['budgets']}, {run.meta['audits']} audits, revision {run.meta['revision']})")
    except ValueError as exc:
        fail(f"--effects: {exc}")
    from auditor.detectors import DetectorName

    lp = {k: v["effects"].get(str(DetectorName.LOGPROB_DIVERGENCE)) for k, v in entry["classes"].items()}
    say(f"wrote the effects under card {c['name']} into {path} (logprob-divergence ratio to the card's floor: {lp})")


def _profile_names(profiles: str | None, cfg: Any) -> list[str]:
    """``--profiles`` as a list of profile names (default: :func:`auditor.calibration.benchmark.default_profiles`);
    exits 3 on an unknown profile or a ``recorded:NAME`` whose recording is missing."""
    from auditor.calibration.benchmark import default_profiles
    from auditor.calibration.recorded import recorded_name, recorded_profiles, recording_sha256
    from simulator.profiles import PROFILES, find_profile

    names = [p.strip() for p in profiles.split(",") if p.strip()] if profiles else default_profiles(cfg)
    bad = [p for p in names if find_profile(p) is None]  # parameterized names resolve too
    if bad:
        fail(f"--profiles: unknown profile(s) {bad}; choose from {', '.join([*PROFILES, *recorded_profiles()])}")
    for p in names:
        rec = recorded_name(p)
        if rec is not None:
            try:
                recording_sha256(rec)  # before the models load and the floor is measured
            except FileNotFoundError as exc:
                fail(f"--profiles: {p}: {exc}")
    return names


def _check_device(device: str | None, dtype: str | None) -> None:
    """Exit 3 when ``--device``/``--dtype`` ask for what is not there (CUDA without a GPU), before any work."""
    from auditor.check.errors import AuditError
    from auditor.check.reference_setup import check_device

    try:
        check_device(device, dtype)
    except AuditError as exc:
        fail(f"--{exc.parameter}: {exc}")


def _sequential_design(budgets: list[int], *, sequential: bool, alpha: float, spending: str, accept_power: float,
                       resolve_cause: bool) -> Any:
    """The simulated ``--budget-tokens auto`` design (geometric looks from the smallest to the largest budget),
    or None without ``--sequential`` or with a single budget; exits 3 on an unknown ``--spending``."""
    from auditor.check.auto_budget import SPENDING_FUNCTIONS, SequentialDesign

    if spending not in SPENDING_FUNCTIONS:
        fail(f"--spending must be one of {', '.join(SPENDING_FUNCTIONS)}, got {spending!r}")
    if not sequential or max(budgets) <= min(budgets):
        return None
    return SequentialDesign.geometric(max(budgets), first=min(budgets), alpha=alpha, spending=spending,
                                      accept_power=accept_power, resolve_cause=resolve_cause)


def _export_requests(directory: Path, model: str | None, cfg: Any) -> None:
    """``--export-requests DIR``: write an honest pool's requests and the reference's manifest for
    scripts/gpu_pool.py (:func:`auditor.calibration.recorded.export_requests`)."""
    from auditor.calibration.recorded import export_requests
    from reference.models import DEFAULT_MODEL, ModelNotAvailableError, load_model

    try:
        written = export_requests(directory, load_model(model or DEFAULT_MODEL, dtype="float32"), cfg)
    except (ModelNotAvailableError, OSError) as exc:
        fail(f"--export-requests: {exc}")
    typer.echo("wrote " + ", ".join(str(p) for p in written), err=True)


def _clock() -> Callable[[str], None]:
    """A progress printer: ``[   12s] message`` on stderr, seconds since this call."""
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        typer.echo(f"[{time.perf_counter() - t0:7.0f}s] {msg}", err=True)

    return say


def _suite_mixes(suites: str) -> list[Any]:
    """``--suites`` as probe mixes (:func:`auditor.calibration.default_mix`); exits 3 on an unknown suite or none."""
    from auditor import calibration as cal
    from probes.suites import SuiteError

    try:
        mixes = [cal.default_mix(x.strip()) for x in suites.split(",") if x.strip()]
    except (SuiteError, KeyError, ValueError, OSError) as exc:
        fail(f"--suites: {exc}")
    if not mixes:
        fail("--suites: give at least one suite name (e.g. default)")
    return mixes


def _reference_models(model: str | None, device: str | None, dtype: str | None, workers: int) -> dict[str, Any] | None:
    """The reference models on ``--device``/``--dtype`` (None: the calibration loads its default CPU
    references, in each worker); exits 3 when they cannot load or with ``--workers`` > 1."""
    if workers > 1 and (device is not None or dtype is not None):
        fail("--workers > 1 runs the default CPU references in each worker: drop --device/--dtype, or use --workers 1")
    if device is None and dtype is None:
        return None
    from auditor.check.measured_floors import REFERENCE_DTYPES
    from reference.models import DEFAULT_MODEL, ModelNotAvailableError, load_model

    try:
        return {dt: load_model(model or DEFAULT_MODEL, dtype=dt, device=device or "cpu")
                for dt in ([dtype] if dtype else REFERENCE_DTYPES)}
    except (ModelNotAvailableError, ValueError, OSError) as exc:
        fail(f"--model/--device/--dtype: {exc}")


def _save_run(run: Any, out: Path | None, *, store: bool, db: str | None, effects: bool,
              say: Callable[[str], None]) -> None:
    """Write the run's files into ``out`` (and with ``--effects`` the effect-size table) and, with
    ``--store``, its cells into ``calibration_results`` (a database error is a warning: the files are written)."""
    from auditor import calibration as cal

    if out is not None and str(out):
        paths = cal.write_outputs(run, out)
        say("wrote " + ", ".join(str(p) for p in paths.values()))
        _refresh_effects(run.to_json_list(), effects)
    if store:
        try:
            n = cal.store_results(run, db)
            say(f"stored {n} rows in calibration_results")
        except Exception as exc:  # report it: the files are written already
            typer.echo(f"warning: could not store results in the database: {exc}", err=True)


def _print_records(records: list[dict], meta: dict, *, as_json: bool) -> None:
    """The records as JSON (``--json``) or as the rejection-rate tables."""
    if as_json:
        typer.echo(json.dumps(records, indent=1))
    else:
        _print_table(records, meta)


def plan_cmd(
    provider: str | None = typer.Option(None, "--provider", help="Provider name (providers.toml): its reference model (under a model card, the card's model: its cells in docs/cards/) and prices."),
    model: str | None = typer.Option(None, "--model", help="Reference model name (instead of --provider)."),
    target: str = typer.Option("any", "--target", help="int8 | int4 | fp8 | relaxed | typical | substituted | relaxed-think | synthetic-acceptance | unverified (unverified greedy tokens of a speculating engine) | any (every calibrated deviation class served as plain chat) | reasoning (every one calibrated in reasoning mode, think:PROFILE: for a reasoning model)."),
    power: float = typer.Option(0.95, "--power", min=0.01, max=0.999, help="Wanted power (rejection rate)."),
    config: str | None = typer.Option(None, "--config", help="providers.toml path."),
    db: DbOption = None,
    calibration: Path | None = typer.Option(
        None, "--calibration", help="Calibration JSON to read instead of the database / docs/calibration.json."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """How many tokens (and USD) an audit needs for the wanted power, from the stored calibration."""
    from auditor import calibration as cal

    if (provider is None) == (model is None):
        fail("give exactly one of --provider NAME or --model M")
    if target not in cal.PLAN_TARGETS:
        fail(f"--target must be one of {', '.join(cal.PLAN_TARGETS)}, got {target!r}")
    pricing = None
    caps = None
    if provider is not None:
        from probes.config import ConfigError, provider_card
        from probes.providers_file import get_provider

        try:
            pc = get_provider(provider, config)
            card = provider_card(pc)
        except ConfigError as exc:
            fail(str(exc))
        # under a card the audit's floor and effects are the card's: plan from the cells calibrated under it
        # (`auditor calibrate --card NAME` records the card's model), where they exist
        model = card.model if card is not None and card.model else pc.reference
        pricing = pc.pricing
        caps = pc.capabilities
    if calibration is not None and not calibration.is_file():
        fail(f"--calibration {calibration} does not exist")
    rows, src = cal.load_calibration(db, path=calibration, model=str(model))
    plan = cal.make_plan(rows, model=str(model), target=target, power=power, pricing=pricing, capabilities=caps)
    plan["source"] = src
    plan["provider"] = provider
    if provider is not None and plan.get("command"):  # a line the user can paste as it is
        who = f"auditor check --provider {provider}" + (f" --config {config}" if config else "")
        plan["command"] = plan["command"].replace("auditor check", who)
    if as_json:
        typer.echo(json.dumps(plan, indent=1))
    else:
        _print_plan(plan)
    raise typer.Exit(0 if plan["covered"] and plan["reached"] else 2)


def register(app: typer.Typer) -> None:
    """Attach ``calibrate`` and ``plan`` to the root app."""
    app.command("calibrate")(calibrate_cmd)
    app.command("plan")(plan_cmd)


def _refresh_effects(records: list[dict], enabled: bool) -> None:
    """With ``--effects``: rewrite auditor/calibration/effect_sizes.json from ``records``."""
    if not enabled:
        return
    from auditor.calibration.effects import write_effect_sizes

    p = write_effect_sizes(records)
    typer.echo(f"refreshed {p}" if p is not None else "no effect-size table to refresh", err=True)


def _print_table(records: list[dict], meta: dict) -> None:
    from rich.table import Table

    fixed = [r for r in records if r.get("design", "fixed") == "fixed"]
    from auditor.calibration import record_suite

    for m in dict.fromkeys(record_suite(r) for r in fixed):
        _print_mix_table([r for r in fixed if record_suite(r) == m], meta, m)
    seq = [r for r in records if r.get("design") == "sequential"]
    if seq:
        s = Table(title="Sequential audits (--budget-tokens auto)")
        for c in ("profile", "rejection", "mean tokens", "saved"):
            s.add_column(c)
        for r in seq:
            s.add_row(r["profile"], f"{r['rejection_rate']:.2f}", f"{r['mean_tokens']:.0f}", f"{r['tokens_saved']:.0%}")
        out_console(sys.stdout).print(s)


def _print_mix_table(fixed: list[dict], meta: dict, mix: str) -> None:
    from rich.table import Table

    from auditor.calibration import record_grid

    budgets, grid = record_grid(fixed)
    t = Table(title=f"Rejection rate (95% CI), suite {mix!r} — {meta.get('model')} @ {meta.get('revision')}, "
                    f"α={meta.get('alpha')}")
    t.add_column("profile")
    t.add_column("expected")
    for b in budgets:
        t.add_column(f"{b} tok", justify="right")
    for p, recs in grid.items():
        cells = [
            "" if r is None else f"{r['rejection_rate']:.2f} [{r['ci_low']:.2f},{r['ci_high']:.2f}]"
            + ("" if r.get("cause_correct_rate") is None else f" c{r['cause_correct_rate']:.0%}")
            for r in recs
        ]
        exp = next(x["expected_verdict"] for x in fixed if x["profile"] == p)
        t.add_row(p, exp, *cells)
    out_console(sys.stdout).print(t)


def _print_plan(plan: dict) -> None:
    typer.echo(plan["message"])
    for row in plan.get("rows", []):
        if row.get("tokens") is None:
            typer.echo(f"  {row['profile']:<20} not reached ({row['power_at_max']:.0%} at {row['max_budget']} tokens)")
        elif row.get("suite"):
            typer.echo(f"  {row['profile']:<20} suite {row['suite']!r}: {row['tokens']:>6,} tokens, measured power "
                       f"{row['power_at_grid']:.0%}")
        else:
            usd = f", ~${row['usd']:.4f}" if row.get("usd") is not None else ""
            est = (f"; the power curve crosses {plan['power']:.0%} at ~{row['estimate']:,} tokens (interpolated "
                   "between calibrated budgets)" if row.get("estimate") is not None else "")
            typer.echo(
                f"  {row['profile']:<20} {row['tokens']:>6,} tokens (~{row['prompt_tokens']:.0f} prompt tokens{usd}): "
                f"measured power {row['power_at_grid']:.0%}{est}"
            )
    for n in plan.get("notes", []):
        typer.echo(f"note: {n}")
    if plan.get("command"):
        typer.echo(f"run: {plan['command']}")
    if plan.get("source"):
        typer.echo(f"(calibration: {plan['source']})")


__all__ = ["register"]
