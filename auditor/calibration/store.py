"""Calibration results in the audit database (``calibration_results``, read by the dashboard's
Calibration page) and reading them back for ``auditor plan`` (database first, else the committed
``docs/calibration.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import delete

from auditor.store import CalibrationResult, open_store, queries
from auditor.util import committed_calibration_path, committed_card_calibration_paths

if TYPE_CHECKING:
    from auditor.calibration.benchmark import CalibrationRun

__all__ = ["load_calibration", "store_results"]


def store_results(run: CalibrationRun, db_url: str | None = None) -> int:
    """Replace this model's rows for the run's profiles in ``calibration_results`` with the run's.

    Fixed-budget cells are stored under their profile name; sequential records under
    ``"<profile> (sequential)"`` with ``budget_tokens`` = the design's maximum and the mean tokens
    used in ``details``. The dashboard's Calibration page reads this table.

    Returns:
        Rows written.
    """
    store = open_store(db_url)
    model = str(run.meta.get("model"))
    names = set(run.meta.get("profiles") or []) | {f"{p} (sequential)" for p in run.meta.get("profiles") or []}
    n = 0
    with store.session() as s:
        s.execute(delete(CalibrationResult).where(CalibrationResult.model == model, CalibrationResult.profile.in_(names)))
        for r in run.to_json_list():
            seq = r.get("design") == "sequential"
            keep = {k: v for k, v in r.items() if k not in ("profile", "budget_tokens", "audits", "rejection_rate",
                                                             "ci_low", "ci_high", "cause_correct_rate", "model")}
            keep["revision"] = run.meta.get("revision")
            queries.add_calibration_result(
                s,
                model=model,
                profile=f"{r['profile']} (sequential)" if seq else r["profile"],
                budget_tokens=int(r["budget_tokens"]),
                audits=int(r["audits"]),
                rejection_rate=float(r["rejection_rate"]),
                ci_low=r.get("ci_low"),
                ci_high=r.get("ci_high"),
                cause_correct_rate=r.get("cause_correct_rate"),
                details=keep,
            )
            n += 1
    return n


def load_calibration(db_url: str | None = None, *, path: Path | None = None, model: str | None = None) -> tuple[list[dict], str]:
    """Calibration records for ``auditor plan``: from the database when it holds rows for the
    model, else from ``path``, else from the committed ``docs/calibration.json`` or, for a model it does not
    cover, the first committed card calibration that does (``docs/cards/*/calibration.json``, whose ``model`` is a
    card's model such as ``smollm2-135m-instruct+fp8``); all rows of the first file when none is for the model,
    so the caller can say which models are covered.

    Returns:
        (records as dicts with at least profile, budget_tokens, rejection_rate, ci_low, ci_high,
        cause_correct_rate, sampled_tokens, model, design; source description).
    """
    rows: list[dict] = []
    src = ""
    if path is None:
        try:
            store = open_store(db_url)
            with store.session() as s:
                for c in queries.list_calibration_results(s, model=model):
                    d = dict(c.details or {})
                    seq = c.profile.endswith(" (sequential)")
                    d.update({
                        "profile": c.profile.removesuffix(" (sequential)"),
                        "budget_tokens": c.budget_tokens,
                        "audits": c.audits,
                        "rejection_rate": c.rejection_rate,
                        "ci_low": c.ci_low,
                        "ci_high": c.ci_high,
                        "cause_correct_rate": c.cause_correct_rate,
                        "model": c.model,
                        "design": "sequential" if seq else "fixed",
                    })
                    rows.append(d)
            src = "database calibration_results"
        except Exception:
            rows = []
    if not rows:
        # a given file, else the committed float32 file, then the committed card calibrations (docs/cards/*): the
        # first that holds rows for the model; none does: all rows of the first, so the caller says what is covered
        files = [path] if path is not None else [committed_calibration_path(), *committed_card_calibration_paths()]
        for p in (f for f in files if f.is_file()):
            allrows = json.loads(p.read_text(encoding="utf-8"))
            mine = [r for r in allrows if model is None or r.get("model") == model]
            if mine or not rows:
                rows, src = mine or allrows, str(p)
            if mine:
                break
    return rows, src
