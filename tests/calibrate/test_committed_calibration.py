"""The committed calibrations keep the product's line: no honest cell above alpha.

``docs/calibration.json`` (float32 reference) and every ``docs/cards/*/calibration.json`` (run under a model card,
issue 36) are what ``auditor plan`` and the reports' power figures read. Issue 36's acceptance for an honest native
provider is at most 5% false accusations with a 95% upper bound at most 8% at every budget and suite; the float32
file is held to the same line. A card calibration's below-card effects must also be in effect_sizes.json, where
the precision estimate finds them (``auditor calibrate --card NAME --effects``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.calibration.effects import EFFECT_SIZES_PATH
from auditor.util import committed_calibration_path, committed_card_calibration_paths

MAX_FALSE_ACCUSATION = 0.05
MAX_UPPER_BOUND = 0.08
FILES = [committed_calibration_path(), *committed_card_calibration_paths()]


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_no_honest_cell_above_the_line(path: Path) -> None:
    rows = json.loads(path.read_text(encoding="utf-8"))
    honest = [r for r in rows if r.get("honest")]
    assert honest, f"{path} holds no honest cell"
    over = [(r["profile"], r.get("mix"), r["budget_tokens"], r.get("design", "fixed"), r["rejection_rate"], r["ci_high"])
            for r in honest if r["rejection_rate"] > MAX_FALSE_ACCUSATION
            or (r.get("design", "fixed") == "fixed" and r["ci_high"] > MAX_UPPER_BOUND)]
    assert not over, over


def test_every_card_calibration_has_its_effects() -> None:
    effects = json.loads(EFFECT_SIZES_PATH.read_text(encoding="utf-8")).get("cards", {})
    assert committed_card_calibration_paths(), "no committed card calibration (docs/cards/*/calibration.json)"
    for path in committed_card_calibration_paths():
        models = {r["model"] for r in json.loads(path.read_text(encoding="utf-8"))}
        assert len(models) == 1, (path, models)
        (model,) = models
        assert model in effects and effects[model].get("classes"), (path, model, sorted(effects))
