"""The benchmark's files: ``calibration.json`` (records), ``calibration.meta.json``,
``calibration.md`` (Markdown report; hand-written analysis below :data:`ANALYSIS_MARKER` is
kept) and ``calibration.png`` (rejection rate vs tokens). matplotlib is imported when plotting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from auditor.calibration.metrics import TARGET_POWER, check_targets, record_grid, record_suite
from auditor.util import json_safe
from auditor.verdict.kinds import VerdictKind
from simulator.profiles import DEFAULT_REASONING_BUDGET, find_profile

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap

    from auditor.calibration.benchmark import CalibrationRun

__all__ = ["ANALYSIS_MARKER", "merge_outputs", "render_markdown", "render_plot", "write_outputs", "write_record_files"]

#: Hand-written analysis below this marker in docs/calibration.md survives re-generation.
ANALYSIS_MARKER = "<!-- analysis: text below this line is kept when `auditor calibrate` rewrites the file -->"

METHOD_MD = """## Method

- **Pools** (`auditor/calibration/`): per simulator profile, one temperature-0 continuation of every
  distinct prompt of the shipped suites and several temperature-1 samples per prompt, with the
  provider's top-20 logprobs and the reference's top-20 at the provider's own prefix, in every reference
  precision of `auditor.check.measured_floors.REFERENCE_DTYPES` (float32 by default). Profiles whose verification is lossless at a temperature
  are decoded in batches from the simulator's own served model (`build_served_model`: lossless
  speculative decoding has the output law of plain decoding); `greedy-verify` (sampling) and
  `decode-noncompliant` (greedy) by batched decoding with their verifier's per-position rule;
  `relaxed-threshold`, `typical-acceptance` (sampling) and `greedy-relaxed` (greedy), whose law depends on the drafts, through
  the simulator engine itself (n-gram drafter, ideal-draft fallback, seeds; 32 requests in lock step,
  each with its own drafts, verifier and draws: `reference.speculative_batch`). `recorded:NAME` profiles
  replay a real engine's recorded outputs (`auditor/calibration/recorded/NAME.npz`, `scripts/gpu_pool.py`);
  their reference side is teacher-forced here like every pool's. Pools are cached on disk
  keyed by model revision, profile recipe (a recording's sha256), suite versions/digests and pool configuration.
- **Reasoning mode** (`think:PROFILE`, issue 35 item 5; `auditor/calibration/reasoning.py`): PROFILE served as
  `auditor serve --reasoning` serves it — the template opens the assistant turn with `<think>\\n`, at most 32
  reasoning tokens, the forced `</think>`, then the answer within the request's `max_tokens`. Every position
  keeps its span label (reasoning / close / answer) and, where the simulator engine served it, whether it ends
  its streamed chunk (one per verification step); batched profiles decode reasoning and answer in two phases,
  `relaxed-think` (greedy) and `synthetic-acceptance` (both temperatures) go through the engine. Audits use
  the reasoning and answer tokens with their span labels and leave out the close tag, as `auditor check` does;
  the evidence after normalization is the same for every parser variant that returns the reasoning's logprobs
  (field or inline), which the simulator tests check end to end. Power of `think:relaxed-think` is read
  against the reasoning tokens an audit holds (`extra.reasoning_tokens`).
- **Audits**: each audit draws requests without replacement in the default suite's proportions,
  charging each request its `max_tokens` exactly like `auditor check --budget-tokens`
  (`auditor.check.planning.plan_budget`), and decides with the pipeline's own functions
  (`auditor.check.run_detectors.run_reference_detectors`: every detector against the reference with its noise
  floor — intersection–union when several precisions are configured; then Holm and the rules of `auditor.verdict.decide`).
- **Intervals**: Clopper–Pearson 95% for the rejection rate. Audits resample one finite pool per
  profile; at large budgets they share requests, so the interval understates pool-to-pool spread.
- **Sequential** (`auditor/check/auto_budget.py`): group-sequential looks at 100, 200, 400, … tokens,
  Lan–DeMets α spending, union bound over looks (valid for any dependence between looks).
- **Processes** (`--workers N`, `auditor/calibration/parallel.py`): the noise floor and the pools, then
  the profiles' audits, are spread over N processes, the longest tasks first; the results do not depend
  on N (same cache files, seeds per budget and audit). A cold run on 2 cores: `--workers 2`.
"""


def _pct(x: float | None, nd: int = 1) -> str:
    """``x`` as a percentage with ``nd`` decimals; an en dash for None/NaN."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * float(x):.{nd}f}%"


def render_markdown(run_list: Sequence[dict], meta: dict) -> str:
    """The Markdown report (docs/calibration.md) from the JSON records and the run's meta."""
    all_fixed = [r for r in run_list if r.get("design", "fixed") == "fixed"]
    seq = [r for r in run_list if r.get("design") == "sequential"]
    mix_names = list(dict.fromkeys(record_suite(r) for r in all_fixed))
    primary = mix_names[0] if mix_names else "default"
    fixed = [r for r in all_fixed if record_suite(r) == primary]
    budgets = sorted({r["budget_tokens"] for r in fixed})
    profiles = list(dict.fromkeys(r["profile"] for r in fixed))
    L: list[str] = []
    L.append("# Detection benchmark: false-accusation rate and power per token budget\n")
    L.append(
        f"Model `{meta.get('model')}` (revision `{meta.get('revision')}`), references {', '.join(meta.get('references', []))}; "
        f"{meta.get('audits')} resampled audits per cell"
        + (f" ({meta.get('honest_audits')} on honest profiles)" if meta.get("honest_audits") not in (None, meta.get("audits")) else "")
        + f" at family-wise α = {meta.get('alpha')}; probe mix "
        f"{meta.get('mix', {}).get('description', '')}. Generated by `auditor calibrate` on {meta.get('created_at')} "
        f"({(meta.get('timings') or {}).get('total_s', '?')} s; machine {meta.get('machine', {})})"
        + (f", in {len(meta['parts'])} parts (runs on the same pool cache, joined with "
           f"`auditor calibrate --merge`)" if meta.get("parts") else "") + ".\n"
    )
    L.append("Rejection = the audit names a deviation (QUANTIZATION, RELAXED_VERIFICATION, SUBSTITUTION, "
             "QUANTIZATION_OR_SUBSTITUTION, QUANTIZATION_OR_RELAXED_VERIFICATION, "
             "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT, DECODING_NONCOMPLIANT). On honest "
             "profiles it is the **false-accusation rate**, on the others the **power**. Brackets: Clopper–Pearson 95% "
             "interval; *cause* = share of rejections that name the profile's cause (the undetermined pairs "
             "QUANTIZATION_OR_SUBSTITUTION, QUANTIZATION_OR_RELAXED_VERIFICATION and "
             "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT are not counted as right; the "
             "targets table counts them apart from the wrong causes); *class* = share of rejections whose report's "
             "precision estimate names the precision class the profile serves (`precision_named` in calibration.json, "
             "with the class named instead; profiles serving a known class below the card only), with its "
             "Clopper–Pearson interval and the rejections it is out of.\n")
    L.append("## Rejection rate by profile and budget (completion tokens per audit)\n")
    mixes_meta = {m.get("name"): m for m in (meta.get("mixes") or [meta.get("mix") or {}])}
    for mname in mix_names:
        L.extend(_rate_table([r for r in all_fixed if record_suite(r) == mname], mname,
                             mixes_meta.get(mname) or {}, primary=mname == primary))
    L.append("Mean sampled (temperature-1) tokens per audit (`" + primary + "` suite): " + ", ".join(
        f"{b:,} → {np.mean([r['sampled_tokens'] for r in fixed if r['budget_tokens'] == b]):.0f}" for b in budgets) + ".\n")
    L.append("![power vs tokens](calibration.png)\n")
    L.extend(_rest_of_markdown(run_list, meta, fixed, seq, budgets, profiles))
    return "\n".join(L) + "\n"


def _rate_table(fixed: Sequence[dict], mname: str, mmeta: dict, *, primary: bool) -> list[str]:
    """One Markdown table of rejection rates (profile × budget) for the records of one probe mix."""
    budgets, grid = record_grid(fixed)
    L: list[str] = []
    cap = mmeta.get("max_total")
    L.append(f"### Suite `{mname}`" + (" (primary)" if primary else "") + "\n")
    if mmeta.get("description"):
        L.append(f"{mmeta['description']}" + (f"; the whole suite plans {cap:,} completion tokens" if cap else "")
                 + (" (larger budgets draw more prompts from the pool in the same proportions)." if primary and cap
                    and budgets and budgets[-1] > cap else ".") + "\n")
    hdr = "| profile | expected | " + " | ".join(f"{b:,} tok" for b in budgets) + " |"
    L.append(hdr)
    L.append("|" + "---|" * (2 + len(budgets)))
    for p, recs in grid.items():
        prof = find_profile(p)
        exp = prof.expected_verdict if prof is not None else ""
        L.append(f"| `{p}` | {exp} | " + " | ".join("" if r is None else _rate_cell(r) for r in recs) + " |")
    L.append("")
    return L


def _reasoning_table(run_list: Sequence[dict]) -> list[str]:
    """The reasoning-mode cells (``think:PROFILE``, issue 35 item 5): per suite and budget the mean reasoning / answer /
    close-tag tokens of an audit and, among rejections, the share whose verdict names the reasoning span; [] when the
    run has none (a plain run's report is unchanged)."""
    rows = [r for r in run_list if r.get("design", "fixed") == "fixed" and "reasoning_tokens" in (r.get("extra") or {})]
    if not rows:
        return []
    L = [f"## Reasoning mode (`think:PROFILE`: served with `--reasoning`, at most {DEFAULT_REASONING_BUDGET} reasoning "
         "tokens)\n",
         "| profile | suite | budget | rejection [95% CI] | reasoning / answer / close tokens | verdict names the span |",
         "|---|---|---|---|---|---|"]
    for r in rows:
        sp = r["extra"].get("span_tokens") or {}
        named = r["extra"].get("span_named_rate")
        L.append(f"| `{r['profile']}` | {record_suite(r)} | {r['budget_tokens']:,} | {_pct(r['rejection_rate'])} "
                 f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] | {sp.get('reasoning', 0):.0f} / {sp.get('answer', 0):.0f} / "
                 f"{sp.get('close', 0):.0f} | {'–' if named is None else _pct(named, 0)} |")
    L.append("")
    return L


def _rate_cell(r: dict) -> str:
    """One cell of :func:`_rate_table`: rejection rate [CI], cause-correct rate, precision-class-named rate [CI] of its
    rejections (``precision_named``; records without it: none) and INCONCLUSIVE rate."""
    c = f"{_pct(r['rejection_rate'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]"
    if r.get("cause_correct_rate") is not None:
        c += f", cause {_pct(r['cause_correct_rate'], 0)}"
    pn = r.get("precision_named") or {}
    if pn.get("rejections"):
        c += f", class {_pct(pn['rate'], 0)} [{_pct(pn['ci_low'], 0)}, {_pct(pn['ci_high'], 0)}] of {pn['rejections']}"
    if r.get("inconclusive_rate"):
        c += f", inconcl. {_pct(r['inconclusive_rate'], 0)}"
    return c


def _rest_of_markdown(run_list: Sequence[dict], meta: dict, fixed: Sequence[dict], seq: Sequence[dict],
                      budgets: Sequence[int], profiles: Sequence[str]) -> list[str]:
    """Targets, sequential audits, verdict/detector tables, pools, timings and the method."""
    L: list[str] = []
    tg = check_targets(run_list)
    if tg:
        L.append("## Targets (issues 7 and 14)\n")
        L.append("| profile | target | measured | met |")
        L.append("|---|---|---|---|")
        for t in tg:
            met = ("yes" if t["met"] else "**no**") + (f" (`{t['best_suite']}`)" if t.get("best_suite") else "")
            L.append(f"| `{t['profile']}` | {t['target']} | {t['measured']} | {met} |")
        L.append("")
    L.extend(_reasoning_table(run_list))
    if seq:
        L.append("## Sequential audits (`auditor check --budget-tokens auto`)\n")
        d = seq[0].get("sequential_design") or {}
        L.append(f"Group-sequential design, looks at {d.get('looks')} tokens, {d.get('spending')} α spending "
                 f"(α per look {[round(a, 5) for a in d.get('look_alphas', [])]}), union bound over looks "
                 "(`auditor/check/auto_budget.py`).\n")
        L.append("| profile | rejection [95% CI] | cause | verdicts | mean tokens | median | saved vs fixed max | fixed-max rejection |")
        L.append("|---|---|---|---|---|---|---|---|")
        for s in seq:
            fx = next((r for r in fixed if r["profile"] == s["profile"] and r["budget_tokens"] == s["max_tokens"]), None)
            L.append(
                f"| `{s['profile']}` | {_pct(s['rejection_rate'])} [{_pct(s['ci_low'])}, {_pct(s['ci_high'])}] | "
                f"{_pct(s.get('cause_correct_rate'), 0)} | {s['verdicts']} | {s['mean_tokens']:.0f} | "
                f"{s['median_tokens']:.0f} | {_pct(s['tokens_saved'], 0)} | {_pct(fx['rejection_rate']) if fx else '–'} |"
            )
        allm = [s["mean_tokens"] for s in seq]
        L.append(f"\nAverage over profiles: {np.mean(allm):.0f} tokens of {seq[0]['max_tokens']} "
                 f"({1 - np.mean(allm) / seq[0]['max_tokens']:.0%} saved).\n")
    if fixed:
        bmax = budgets[-1]
        L.append(f"## Verdicts and deciding detectors at {bmax:,} tokens\n")
        verdict_names = [str(v) for v in VerdictKind]
        L.append("| profile | " + " | ".join(verdict_names) + " |")
        L.append("|" + "---|" * (1 + len(verdict_names)))
        for p in profiles:
            r = next((x for x in fixed if x["profile"] == p and x["budget_tokens"] == bmax), None)
            if r:
                L.append(f"| `{p}` | " + " | ".join(str(r["verdicts"].get(v, 0)) for v in verdict_names) + " |")
        L.append("")
        dets = sorted({k for r in fixed for k in r.get("detectors", {})})
        L.append(f"Per-detector rejection share (Holm-adjusted p ≤ α) at {bmax:,} tokens:\n")
        L.append("| profile | " + " | ".join(dets) + " |")
        L.append("|" + "---|" * (1 + len(dets)))
        for p in profiles:
            r = next((x for x in fixed if x["profile"] == p and x["budget_tokens"] == bmax), None)
            if r:
                L.append(f"| `{p}` | " + " | ".join(_pct(r["detectors"].get(k, {}).get("rejected"), 0) for k in dets) + " |")
        L.append("")
    pools = meta.get("pools") or {}
    if pools:
        L.append("## Pools\n")
        L.append("| profile | T=0 items / tokens | T=1 items / tokens | backend T=0 / T=1 | collect s |")
        L.append("|---|---|---|---|---|")
        for p, m in pools.items():
            L.append(f"| `{p}` | {m.get('t0_items')} / {m.get('t0_tokens')} | {m.get('t1_items')} / {m.get('t1_tokens')} | "
                     f"{m.get('backend_t0')} / {m.get('backend_t1')} | {m.get('collect_s')} |")
        L.append("")
    L.append(f"Timings (s): {meta.get('timings')}.\n")
    L.append(METHOD_MD)
    return L


def render_plot(run_list: Sequence[dict], path: Path, *, alpha: float = 0.05) -> None:
    """PNG: rejection rate vs tokens (log x), one line per profile (honest dashed), α and 95% marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_fixed = [r for r in run_list if r.get("design", "fixed") == "fixed"]
    mix_names = list(dict.fromkeys(record_suite(r) for r in all_fixed)) or ["default"]
    profiles = list(dict.fromkeys(r["profile"] for r in all_fixed))
    fig, axes = plt.subplots(1, len(mix_names), figsize=(7.5 + 5 * (len(mix_names) - 1) + 2.5, 5.5), dpi=110,
                             squeeze=False, sharey=True)
    cmap = plt.get_cmap("tab20")
    for mi, (mname, ax) in enumerate(zip(mix_names, axes[0], strict=True)):
        fixed = [r for r in all_fixed if record_suite(r) == mname]
        _plot_mix(ax, fixed, profiles, cmap, alpha=alpha, title=f"suite {mname!r}", ylabel=mi == 0,
                  legend=mi == len(mix_names) - 1)
    fig.suptitle("Detection benchmark on the simulator: rejection rate vs token budget")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _plot_mix(ax: Axes, fixed: Sequence[dict], profiles: Sequence[str], cmap: Colormap, *, alpha: float,
              title: str, ylabel: bool, legend: bool = True) -> None:
    """One panel of :func:`render_plot`: the records of one probe mix."""
    for i, p in enumerate(profiles):
        rs = sorted((r for r in fixed if r["profile"] == p), key=lambda r: r["budget_tokens"])
        if not rs:
            continue
        x = [r["budget_tokens"] for r in rs]
        y = [r["rejection_rate"] for r in rs]
        lo = [r["rejection_rate"] - r["ci_low"] for r in rs]
        hi = [r["ci_high"] - r["rejection_rate"] for r in rs]
        prof = find_profile(p)
        honest = prof.honest if prof is not None else False
        ax.errorbar(x, y, yerr=[lo, hi], label=p + (" (honest)" if honest else ""), color=cmap(i % 20),
                    linestyle="--" if honest else "-", marker="o", ms=4, capsize=2, lw=1.4)
    ax.axhline(alpha, color="red", lw=1, ls=":", label=f"α = {alpha}")
    ax.axhline(TARGET_POWER, color="gray", lw=1, ls=":", label=f"{TARGET_POWER:.0%} power")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("completion tokens per audit")
    if ylabel:
        ax.set_ylabel("rejection rate (power; false accusation for honest)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if legend:  # outside the panel, right of it: the curves stay visible
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), borderaxespad=0.0)


def write_outputs(run: CalibrationRun, out_dir: Path | str) -> dict[str, Path]:
    """Write ``calibration.json`` (list of records), ``calibration.meta.json``, ``calibration.md``
    and ``calibration.png`` into ``out_dir``.

    Returns:
        name → path of each file written.
    """
    return write_record_files(run.to_json_list(), run.meta, out_dir)


def write_record_files(records: Sequence[dict], meta: dict, out_dir: Path | str) -> dict[str, Path]:
    """:func:`write_outputs` for records already in their JSON form (``CalibrationRun.to_json_list``).

    The analysis below ``ANALYSIS_MARKER`` in an existing ``calibration.md`` is kept.

    Returns:
        name → path of each file written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    paths = {
        "json": out / "calibration.json",
        "meta": out / "calibration.meta.json",
        "markdown": out / "calibration.md",
        "png": out / "calibration.png",
    }
    paths["json"].write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    paths["meta"].write_text(json.dumps(json_safe(meta), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    kept = ""
    if paths["markdown"].is_file():
        old = paths["markdown"].read_text(encoding="utf-8")
        if ANALYSIS_MARKER in old:
            kept = old[old.index(ANALYSIS_MARKER) + len(ANALYSIS_MARKER):]
    paths["markdown"].write_text(render_markdown(records, meta) + "\n" + ANALYSIS_MARKER + kept, encoding="utf-8")
    render_plot(records, paths["png"], alpha=float(meta.get("alpha", 0.05)))
    return paths


def _record_key(r: dict) -> tuple[str, str, int, str]:
    return (str(r.get("profile")), record_suite(r), int(r.get("budget_tokens") or 0), str(r.get("design", "fixed")))


def merge_outputs(dirs: Sequence[Path | str]) -> tuple[list[dict], dict]:
    """Merge the files of several ``auditor calibrate --out DIR`` runs into one record list and meta.

    A long calibration can run as parts (profile subsets in parallel processes, sharing the pool
    cache); this joins them. Records are keyed by (profile, suite, budget, design): a later
    directory's record replaces an earlier one's. A directory that is itself a merge (its meta has
    ``parts``, e.g. ``docs/`` when a few cells are re-run and merged into it) contributes its parts, not itself. The runs must share model, revision, alpha and
    seed (the meta of the first run is the base; profiles, pools and timings are joined).

    Raises:
        ValueError: a directory without calibration.json / calibration.meta.json, or runs that
            disagree on model, revision, alpha or seed (name the field and both values).
    """
    if not dirs:
        raise ValueError("merge: give at least one directory written by `auditor calibrate --out DIR`")
    merged: dict[tuple[str, str, int, str], dict] = {}
    base: dict | None = None
    parts = []
    for d in dirs:
        jp, mp = Path(d) / "calibration.json", Path(d) / "calibration.meta.json"
        if not jp.is_file() or not mp.is_file():
            raise ValueError(f"merge: {d} lacks calibration.json or calibration.meta.json (write it with --out {d})")
        meta = json.loads(mp.read_text(encoding="utf-8"))
        if base is None:
            base = dict(meta)
            base["profiles"] = list(meta.get("profiles") or [])
            base["pools"] = dict(meta.get("pools") or {})
            base["timings"] = dict(meta.get("timings") or {})
        else:
            for k in ("model", "revision", "alpha", "seed"):
                if meta.get(k) != base.get(k):
                    raise ValueError(f"merge: {d} has {k}={meta.get(k)!r}, the first run {base.get(k)!r}")
            base["profiles"] += [p for p in meta.get("profiles") or [] if p not in base["profiles"]]
            base["pools"].update(meta.get("pools") or {})
            for k, v in (meta.get("timings") or {}).items():
                base["timings"][k] = round(float(base["timings"].get(k, 0.0)) + float(v), 1)
        if meta.get("parts"):  # a merge itself (e.g. docs/): its own parts, so a re-merge keeps where each came from
            parts.extend(meta["parts"])
        else:
            parts.append({"dir": str(d), "profiles": meta.get("profiles"), "audits": meta.get("audits"),
                          "honest_audits": meta.get("honest_audits"), "created_at": meta.get("created_at"),
                          "timings": meta.get("timings")})
        for r in json.loads(jp.read_text(encoding="utf-8")):
            merged[_record_key(r)] = r
    assert base is not None
    base["parts"] = parts
    fixed = [r for r in merged.values() if r.get("design", "fixed") == "fixed"]
    seq = [r for r in merged.values() if r.get("design", "fixed") != "fixed"]
    order = {p: i for i, p in enumerate(base["profiles"])}
    fixed.sort(key=lambda r: (order.get(str(r.get("profile")), 1 << 30), record_suite(r), int(r.get("budget_tokens") or 0)))
    seq.sort(key=lambda r: order.get(str(r.get("profile")), 1 << 30))
    return fixed + seq, base
