"""Calibration under a model card (issue 36): ``auditor calibrate --card NAME`` computes the card in the reference
(the floor and every pool are the card's), and with ``--effects`` writes the below-card profiles' effects into
``effect_sizes.json``'s ``cards`` section through ``auditor.calibration.effects.card_effects_from_records``, where
the reports find them (``auditor.verdict.rules_out.classes_for_card``) instead of falling back to float32.

The tiny model's native-FP8 variant (32x32 FP8 blocks, 1x32 activation tiles, as tests/audit/test_native_card.py)
stands in for SmolLM2's ``+fp8``: its card is registered as a bundled card and its references replace the loader.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from auditor.cli import app


def _tiny_card():
    from probes.model_card import ActivationSpec, ModelCard, WeightsSpec

    return ModelCard(name="tiny+fp8", model="tiny+fp8",
                     weights=WeightsSpec(format="fp8-block", block_size=(32, 32), fp8_format="e4m3"),
                     activations=ActivationSpec(format="fp8", tile=(1, 32)), kv_cache="fp32")


@pytest.fixture(scope="module")
def fp8_refs(tiny_lm):
    """The tiny model's native-FP8 variant in float32 and bfloat16 (weights on the 32x32 FP8 grid)."""
    from reference.models import LoadedModel
    from reference.native import make_native_weights

    m = copy.deepcopy(tiny_lm.model)
    make_native_weights(m, "fp8-block", block=(32, 32))
    f32 = replace(tiny_lm, model=m, name="tiny+fp8", revision="tiny-llama-seed0+fp8")
    bf = LoadedModel(model=copy.deepcopy(m).to(torch.bfloat16), tokenizer=tiny_lm.tokenizer, name=f32.name,
                     path=f32.path, revision=f32.revision, dtype=torch.bfloat16, device=f32.device)
    return {"float32": f32, "bfloat16": bf}


def test_calibrate_card_option_refuses_bad_input(tmp_path) -> None:
    """An unknown card name, or a --model the card does not describe: exit 3 naming --card and the fix, before any
    model loads."""
    res = CliRunner().invoke(app, ["calibrate", "--card", "nope", "--out", "", "--no-store"])
    assert res.exit_code == 3 and "--card" in res.output and "smollm2-135m-instruct+fp8" in res.output, res.output
    res = CliRunner().invoke(app, ["calibrate", "--card", "smollm2-135m-instruct+fp8", "--model", "gemma-3-270m",
                                   "--out", "", "--no-store"])
    assert res.exit_code == 3 and "--model smollm2-135m-instruct+fp8" in res.output, res.output
    res = CliRunner().invoke(app, ["calibrate", "--card", "smollm2-135m-instruct+fp8", "--merge", str(tmp_path),
                                   "--out", str(tmp_path)])
    assert res.exit_code == 3 and "drop --card" in res.output, res.output


def test_calibrate_under_a_card_writes_its_effects(fp8_refs, tmp_path, monkeypatch) -> None:
    """``auditor calibrate --card tiny+fp8 --effects`` on the tiny native-FP8 variant: the references compute the
    card (revision ``+card:act-fp8-1x32``: the floor and pools are the card's), the run records the card, and the
    table's ``cards`` entry holds the below-card classes the run served (int4 weights, NVFP4 W4A4; not the honest
    profile), keyed by the card's recipe, with the float32 classes untouched; the reports then use them."""
    from auditor.calibration import benchmark
    from auditor.calibration import effects as eff
    from auditor.check import measured_floors
    from auditor.verdict.rules_out import classes_for_card, load_effect_sizes
    from probes import model_card

    card = _tiny_card()
    monkeypatch.setitem(model_card.BUNDLED_CARDS, card.name, card)  # type: ignore[index]
    loaded: list[tuple] = []

    def load(model=None, c=None):
        loaded.append((model, c.name if c is not None else None))
        return dict(fp8_refs)

    monkeypatch.setattr(benchmark, "load_reference_models", load)
    from auditor.calibration import draws

    verdict_of, seen = draws.audit_verdict, []

    def audit_verdict(*a, **kw):  # every calibration verdict is decided under the card (its rules-out list)
        v = verdict_of(*a, **kw)
        seen.append((kw.get("card"), v))
        return v

    monkeypatch.setattr(draws, "audit_verdict", audit_verdict)
    monkeypatch.setattr(measured_floors, "FLOOR_PROMPTS", 4)
    monkeypatch.setattr(measured_floors, "FLOOR_MAX_NEW_TOKENS", 8)
    table = tmp_path / "effect_sizes.json"
    table.write_text(eff.EFFECT_SIZES_PATH.read_text())
    monkeypatch.setattr(eff, "EFFECT_SIZES_PATH", table)
    before = json.loads(table.read_text())
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [
        "calibrate", "--card", card.name, "--profiles", "honest-fp32,native-fp8-int4,native-fp8-nvfp4",
        "--budgets", "60,150", "--audits", "4", "--honest-audits", "4", "--no-sequential", "--suites", "default",
        "--max-prompts", "4", "--t0-max-tokens", "12", "--sampling-max-tokens", "8", "--samples", "2",
        "--honest-samples", "2", "--engine-samples", "2", "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
        "--no-store", "--effects", "--json"])
    assert res.exit_code == 0, res.output
    assert loaded == [("tiny+fp8", None)]  # the card's model, then the card computed on it
    meta = json.loads((out / "calibration.meta.json").read_text())
    assert meta["card"]["name"] == "tiny+fp8" and meta["card"]["steps"] == ["act-fp8-1x32"]
    assert meta["card"]["card_bits"] == {"weights": 8, "activations": 8, "kv_cache": 16}
    assert meta["revision"].endswith("+card:act-fp8-1x32")  # the floor and the pools are keyed by the card
    assert seen and all(c is not None and c["card_recipe"] == card.recipe() and c["model"] == "tiny+fp8" for c, _ in seen)
    ro = [r for _, v in seen for r in v.details.get("rules_out") or []]
    assert ro and all(r["key"] not in ("int8", "fp8", "w8a8") for r in ro)  # never the card's own width
    after = json.loads(table.read_text())
    assert after["classes"] == before["classes"]  # the float32 classes are not touched
    entry = after["cards"]["tiny+fp8"]
    assert entry["model"] == "tiny+fp8" and entry["card"] == card.recipe()
    assert set(entry["classes"]) == {"int4", "nvfp4"}
    assert entry["classes"]["nvfp4"]["lowers"] == {"weights": 4, "activations": 4}
    assert entry["classes"]["int4"]["profile"] == "native-fp8-int4"
    for c in entry["classes"].values():
        assert c["effects"]["logprob-divergence"] > 1.0  # below the card: more than its floor
    assert "+card:act-fp8-1x32" in entry["source"]
    t = load_effect_sizes(table)
    cc = classes_for_card(t, card.component_bits(), model="tiny+fp8", recipe=card.recipe())
    assert cc.under_card == {"int4", "nvfp4"} and "int8" not in {c.key for c in cc.classes}


def test_card_classes_of_keeps_the_steps_below_the_card() -> None:
    """The classes a card calibration writes are those of its below-card profiles that are steps below the card
    (``auditor.verdict.rules_out.lowers_below``): under the INT4 card NVFP4 (activations 4 < 16) and int3 are, int4
    is the card itself; the honest and unknown profiles map to no class."""
    from auditor.calibration.effects import EFFECT_SIZES_PATH, card_classes_of

    raw = json.loads(EFFECT_SIZES_PATH.read_text())
    fp8 = {"weights": 8, "activations": 8, "kv_cache": 16}
    int4 = {"weights": 4, "activations": 16, "kv_cache": 16}
    allp = ["honest-fp32", "native-fp8", "native-fp8-int4", "native-fp8-kv-fp8", "native-fp8-nvfp4",
            "native-int4-int3", "kv-fp8"]
    assert set(card_classes_of(allp, fp8, raw)) == {"int4", "kv-fp8", "nvfp4", "int3"}
    assert card_classes_of(allp, fp8, raw)["kv-fp8"]["profile"] == "native-fp8-kv-fp8"  # the first profile wins
    assert set(card_classes_of(allp, int4, raw)) == {"kv-fp8", "nvfp4", "int3"}
    assert card_classes_of(["honest-fp32", "int8"], fp8, raw) == {}


def test_a_second_run_under_the_same_card_keeps_the_classes_it_did_not_serve(tmp_path) -> None:
    """``--card NAME --effects`` twice with different below-card profiles (e.g. the full-size run without the NVFP4
    profile, after a run that had it): the entry keeps the class the second run did not serve, with its effects and
    the source it came from; the classes it served are replaced; a different recipe under the same key replaces all.
    Records: SmolLM2's committed calibration under its +fp8 card (docs/cards/smollm2-fp8)."""
    from pathlib import Path

    from auditor.calibration.effects import EFFECT_SIZES_PATH, write_card_effects

    run = Path(__file__).resolve().parents[2] / "docs" / "cards" / "smollm2-fp8"
    recs = json.loads((run / "calibration.json").read_text(encoding="utf-8"))
    card = json.loads((run / "calibration.meta.json").read_text(encoding="utf-8"))["card"]
    table = tmp_path / "effect_sizes.json"
    raw = json.loads(Path(EFFECT_SIZES_PATH).read_text(encoding="utf-8"))
    raw.pop("cards", None)
    table.write_text(json.dumps(raw), encoding="utf-8")
    kw = {"key": card["name"], "model": card["model"], "card": card["card_recipe"], "card_bits": card["card_bits"],
          "path": table}
    int4 = [r for r in recs if r["profile"] == "native-fp8-int4"]
    kv = [r for r in recs if r["profile"] == "native-fp8-kv-fp8"]
    write_card_effects(int4, source="first run", **kw)
    _, entry = write_card_effects(kv, source="second run", **kw)
    stored = json.loads(table.read_text(encoding="utf-8"))["cards"][card["name"]]
    assert stored == entry and set(entry["classes"]) == {"int4", "kv-fp8"}
    assert entry["source"].startswith("second run; int4 kept from first run")
    _, again = write_card_effects(int4, source="third run", **kw)  # int4 re-measured, kv-fp8 kept
    assert set(again["classes"]) == {"int4", "kv-fp8"} and again["classes"]["kv-fp8"] == entry["classes"]["kv-fp8"]
    _, other = write_card_effects(kv, source="other recipe", **{**kw, "card": card["card_recipe"] + " (changed)"})
    assert set(other["classes"]) == {"kv-fp8"} and other["source"] == "other recipe"
