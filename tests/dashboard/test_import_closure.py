"""What importing the dashboard loads of the project (docs/ARCHITECTURE.md L8; issue 34).

``dashboard.app`` is imported in a fresh interpreter and the project modules it left in ``sys.modules`` are
compared with what L8 allows: the store's query modules and ``auditor.util``. The buyer's answers, the plain
headline and the provider's standing are stored with each verdict at write time (``auditor.check.stored_figures``),
so ``auditor.store.dashboard_queries`` reads them and applies no rule: no ``auditor.verdict.decide*``,
``auditor.detectors``, ``auditor.check*``, ``auditor.verdict.questions`` or ``auditor.watch.standing`` module is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("auditor", "probes", "reference", "simulator")
#: The auditor modules L8 lets the dashboard reach.
ALLOWED = {"auditor", "auditor.util", "auditor.store", "auditor.store.db", "auditor.store.models",
           "auditor.store.queries", "auditor.store.result_queries", "auditor.store.dashboard_queries",
           "auditor.store.run_detail_queries", "auditor.store.standing_queries"}
#: The rule and pipeline modules the dashboard must never load.
RULES = ("auditor.verdict", "auditor.detectors", "auditor.check", "auditor.watch")


def _loaded_by_dashboard() -> list[str]:
    code = ("import json, sys\nimport dashboard.app  # noqa: F401\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {PROJECT!r})))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def loaded() -> list[str]:
    return _loaded_by_dashboard()


def test_dashboard_loads_no_pipeline_reference_probes_or_simulator(loaded: list[str]) -> None:
    """No probe client, reference model, simulator, CLI or check pipeline behind the dashboard."""
    bad = [m for m in loaded if m.split(".")[0] in ("probes", "reference", "simulator")
           or m.startswith(("auditor.check", "auditor.cli", "auditor.report"))]
    assert {"auditor.store.dashboard_queries", "auditor.store.run_detail_queries"} <= set(loaded)  # the imports happened
    assert bad == []


def test_store_standing_queries_import_no_rules() -> None:
    """The store's standing queries are a leaf: importing them loads no rule module."""
    code = ("import json, sys\nimport auditor.store.standing_queries  # noqa: F401\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('auditor'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300, check=True)
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    assert "auditor.store.standing_queries" in mods
    assert [m for m in mods if m.startswith(RULES)] == []


def test_dashboard_loads_only_store_query_modules_and_util(loaded: list[str]) -> None:
    """L8: of auditor, only the store's query modules and auditor.util (no verdict rules, detectors, questions)."""
    extra = [m for m in loaded if m.split(".")[0] == "auditor" and m not in ALLOWED]
    assert extra == [], extra


def test_dashboard_loads_no_verdict_detector_or_check_module(loaded: list[str]) -> None:
    """Issue 34's acceptance line: no module of ``auditor.verdict.decide*``, ``auditor.detectors`` or ``auditor.check*``
    (nor the question and standing rules) behind the dashboard."""
    assert "auditor.store.dashboard_queries" in loaded
    assert [m for m in loaded if m.startswith(RULES)] == []
