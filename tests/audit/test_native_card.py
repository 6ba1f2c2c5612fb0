"""The reference computes the model card (issue 36, item 2): ``auditor check`` on native variants of the tiny
model (``tiny+fp8``: FP8 e4m3 32x32 weight blocks, 1x32 activation tiles; ``tiny+int4``: INT4 group 32 — the
recipes of SmolLM2's bundled ``+fp8`` / ``+int4`` cards at the block hidden size 64 divides) against the
simulator serving each honestly and below its card:

- honest native-FP8 serving (profile ``native-fp8``) against the FP8 card → PASS: the reference applies the
  card's FP8 activation tiles and the floor is measured over the card's honest variants
  (``auditor.check.reference_setup.apply_card``);
- the same provider against a bf16 card → QUANTIZATION: the card matters, and the report says which card;
- int4 of the FP8 model (``native-fp8-int4``), NVFP4 W4A4 of it (``native-fp8-nvfp4``: FP4 E2M1 weights and
  activations, an E4M3 scale per 16, an FP32 scale per tensor) and an FP8 KV cache under the FP8 card's fp32 KV
  cache (``native-fp8-kv-fp8``) against the FP8 card → QUANTIZATION;
- honest native-INT4 (``honest-fp32`` on ``tiny+int4``) → PASS; int3 of it (``native-int4-int3``) → QUANTIZATION.

Floors: 16 prompts x 16 tokens per honest variant; the floor's own sampling variance enters every logprob
test's null (``KLFloor.null_mean``), so a smaller floor makes the tests more lenient, not less. Budgets:
PASS needs 80% power in every family (``auditor.verdict.decide``), hence 1000 planned tokens as in
test_profiles.py; deviations are rejected at 400. The SmolLM2-135M variants take 15+ minutes per floor on
two shared CPU cores, too long for a test. Run with ``-s`` for the table (verdict, logprob-divergence's
geometric ratio to the floor).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from auditor.cli import app

from .conftest import SimFactory, providers_toml

#: The tiny model's native cards (hidden 64: 32x32 FP8 blocks and 1x32 activation tiles; INT4 group 32), as
#: SmolLM2's bundled +fp8 / +int4 cards at the block the model divides.
CARDS = {
    "fp8": '{ weights = { format = "fp8-block", block_size = [32, 32] }, activations = { format = "fp8", tile = [1, 32] }, '
           'kv_cache = "fp32" }',
    "int4": '{ weights = { format = "int4", group_size = 32 }, kv_cache = "fp32" }',
}
BF16_CARD = '{ weights = { format = "bf16" }, kv_cache = "bf16" }'
CASES = [
    # variant, profile, card (None: the variant's bundled card), expected verdict, exit code, budget
    ("fp8", "native-fp8", None, "PASS", 0, 1000),
    ("fp8", "native-fp8", BF16_CARD, "QUANTIZATION", 1, 400),
    ("fp8", "native-fp8-int4", None, "QUANTIZATION", 1, 400),
    ("fp8", "native-fp8-nvfp4", None, "QUANTIZATION", 1, 400),
    ("fp8", "native-fp8-kv-fp8", None, "QUANTIZATION", 1, 400),
    ("int4", "honest-fp32", None, "PASS", 0, 1000),
    ("int4", "native-int4-int3", None, "QUANTIZATION", 1, 400),
]
_RESULTS: list[dict] = []


def native_tiny(lm, variant: str):
    """The tiny model's native variant: its decoder weights moved onto the card's grid (FP8 e4m3 32x32 blocks,
    or INT4 group 32), so that its float32 weights are the exact dequantization of a native checkpoint."""
    import copy
    from dataclasses import replace

    from reference.native import make_native_weights

    m = copy.deepcopy(lm.model)
    make_native_weights(m, "fp8-block" if variant == "fp8" else "int4", block=(32, 32), group=32)
    return replace(lm, model=m, name=f"tiny+{variant}", revision=f"tiny-llama-seed0+{variant}")


@pytest.fixture(scope="module")
def card_env(tmp_path_factory, tiny_lm):
    from auditor.check import measured_floors as noise
    from auditor.check import reference_setup

    mp = pytest.MonkeyPatch()
    mp.setattr(noise, "FLOOR_PROMPTS", 16)
    mp.setattr(noise, "FLOOR_MAX_NEW_TOKENS", 16)
    lms, sims = {}, {}
    for v in ("fp8", "int4"):
        lms[v] = native_tiny(tiny_lm, v)
        mp.setitem(reference_setup._MODELS, (f"tiny+{v}", "float32"), lms[v])
        sims[v] = SimFactory(lms[v], f"tiny+{v}")
    yield {"sims": sims, "tmp": tmp_path_factory.mktemp("native-card")}
    for f in sims.values():
        f.stop()
    mp.undo()
    if _RESULTS:
        print("\nvariant profile            card     verdict        tokens wall_s  logprob effect/floor")
        for r in _RESULTS:
            print(f"{r['variant']:7s} {r['profile']:18s} {r['card']:8s} {r['verdict']:14s} {r['tokens']:6d} "
                  f"{r['wall_s']:6.1f}  {r['x_floor']}")


def _audit(card_env, variant: str, profile: str, card: str | None, budget: int, *, seed: int = 0,
           suite: str = "default") -> tuple[dict, int, float]:
    """One ``auditor check`` of the simulator serving ``profile`` (simulator and audit seed ``seed``) on the tiny
    native ``variant`` against ``card`` (None: the variant's card, :data:`CARDS`): (JSON report, exit code, wall s)."""
    tmp, sims = card_env["tmp"], card_env["sims"][variant]
    name = f"tiny+{variant}"
    url = sims.url(profile, seed=seed)
    cid = f"{variant}-{profile}-{'bf16' if card else 'native'}-{budget}-{suite}-s{seed}"
    cfg = tmp / f"{cid}.toml"
    text = providers_toml({"sim": url}, name, reference=name)
    text = text.replace(f'reference = "{name}"\n', f'reference = "{name}"\ncard = {card or CARDS[variant]}\n', 1)
    cfg.write_text(text)
    jpath = tmp / f"{cid}.json"
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["check", "--provider", "sim", "--budget-tokens", str(budget), "--config", str(cfg),
                                   "--suite", suite, "--seed", str(seed), "--db", f"sqlite:///{tmp / 'audits.db'}",
                                   "--json", str(jpath), "--no-progress"])
    wall = time.perf_counter() - t0
    sims.stop(profile)
    assert jpath.exists(), res.output
    return json.loads(jpath.read_text()), res.exit_code, wall


@pytest.mark.parametrize(("variant", "profile", "card", "expected", "code", "budget"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{'bf16card' if c[2] else 'card'}" for c in CASES])
def test_reference_computes_the_card(card_env, variant, profile, card, expected, code, budget) -> None:
    d, exit_code, wall = _audit(card_env, variant, profile, card, budget)
    by = {x["name"]: x for x in d["detectors"]}
    lp = by["logprob-divergence"]
    _RESULTS.append({"variant": variant, "profile": profile, "card": "bf16" if card else "native", "verdict": d["verdict"],
                     "tokens": d["tokens"]["total"], "wall_s": wall,
                     "x_floor": (lp.get("details") or {}).get("geometric_ratio")})
    # the report says which card was used, and the reference computed it
    ref = d["reference"]
    if card is None:
        assert f"weights {'fp8-block 32x32' if variant == 'fp8' else 'int4 group 32'}" in ref["card"], ref["card"]
    else:
        assert "weights bf16" in ref["card"]
    computed = "+card:act-fp8-1x32" in ref["revision"]
    assert computed == (variant == "fp8" and card is None), ref["revision"]
    assert d["verdict"] == expected, d["verdict_reason"]
    assert exit_code == code
    assert d["tokens"]["completion"] <= budget
    if expected == "PASS":
        assert not any(x["rejects"] for x in d["detectors"])
        # what the PASS rules out is below the card: never the card's own width (8-bit weights under FP8, 4-bit
        # weights under INT4), and it says so (auditor.verdict.rules_out.classes_for_card)
        keys = {r["key"] for r in d["rules_out"]}
        at_card = {"fp8": {"int8", "fp8", "w8a8"}, "int4": {"int4", "int8", "fp8", "w8a8"}}[variant]
        assert keys and not keys & at_card, keys
        assert "steps below the card" in d["verdict_reason"], d["verdict_reason"]
    else:
        assert lp["rejects"], lp


#: Seeds, budgets and suites of the honest native-FP8 false-accusation count (issue 36 acceptance: <= 5% false
#: accusations with a one-sided 95% Clopper-Pearson upper bound <= 8% at every budget and suite: 0 of >= 37).
HONEST_SEEDS = range(1, 41)
HONEST_BUDGETS = (400, 1000)
HONEST_SUITES = ("default", "precision")
#: Verdicts that accuse the provider of nothing (INCONCLUSIVE: too little evidence, no accusation).
NOT_ACCUSED = ("PASS", "INCONCLUSIVE")


def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper confidence bound of a binomial rate with k of n (Clopper-Pearson, exact)."""
    from scipy import stats

    return 1.0 if k >= n else float(stats.beta.ppf(level, k + 1, n - k))


@pytest.mark.slow
@pytest.mark.calibration_loop
def test_honest_native_fp8_is_not_accused_at_any_budget_or_suite(card_env) -> None:
    """Honest native-FP8 serving (``native-fp8`` on ``tiny+fp8``) against its FP8 card, seeds 1..40 (simulator and
    audit seed), budgets 400 and 1000, suites default and precision: at most 5% false accusations with a one-sided
    95% upper bound of at most 8% per cell. ~25 min on two shared CPU cores; run with ``-s`` for the table."""
    cells: dict[tuple[int, str], list[str]] = {}
    for suite in HONEST_SUITES:
        for budget in HONEST_BUDGETS:
            for seed in HONEST_SEEDS:
                d, _, _ = _audit(card_env, "fp8", "native-fp8", None, budget, seed=seed, suite=suite)
                cells.setdefault((budget, suite), []).append(d["verdict"])
    print("\nhonest native-fp8 under the FP8 card: budget suite  seeds  PASS  INCONCLUSIVE  accused  upper95")
    bad = []
    for (budget, suite), verdicts in sorted(cells.items()):
        n, k = len(verdicts), sum(v not in NOT_ACCUSED for v in verdicts)
        up = clopper_pearson_upper(k, n)
        print(f"  {budget:5d} {suite:9s} {n:5d} {verdicts.count('PASS'):5d} {verdicts.count('INCONCLUSIVE'):13d} "
              f"{k:8d} {up:8.3f}  {sorted({v for v in verdicts if v not in NOT_ACCUSED})}")
        if k / n > 0.05 or up > 0.08:
            bad.append((budget, suite, k, n, up))
    assert not bad, bad


#: The below-card profiles of each tiny card and the precision class the estimate must name for each (issue 36
#: item 4: the estimate's classes are steps below the card, with effects measured under it). The classes themselves
#: (label, what they lower) are the package's: ``auditor.calibration.effects.card_classes_of``.
BELOW_CARD = {
    # int4 weights and NVFP4 W4A4 are both 4-bit steps below the FP8 card: one precision class, named by what the
    # card's 4-bit classes lower
    "fp8": {"native-fp8-int4": "4-bit weights or activations", "native-fp8-nvfp4": "4-bit weights or activations",
            "native-fp8-kv-fp8": "8-bit KV cache"},
    "int4": {"native-int4-int3": "3-bit weights", "kv-fp8": "8-bit KV cache"},
}
#: Seeds of the calibration audits that measure the effects under each card (disjoint from the evaluation's).
CALIBRATION_SEEDS = (101, 102)
CALIBRATION_BUDGET = 1000


def _card(variant: str):
    import tomllib

    from probes.model_card import ModelCard

    return ModelCard.model_validate(tomllib.loads("c = " + CARDS[variant])["c"])


def _recipe(variant: str) -> str:
    return _card(variant).recipe()


@pytest.fixture(scope="module")
def card_effects(card_env, tmp_path_factory):
    """The packaged effect-size table plus the effects measured under each tiny card by the calibration code
    (``auditor.calibration.effects.card_effects_from_records``: audits of each below-card profile against the
    card's reference at 1000 tokens, seeds :data:`CALIBRATION_SEEDS`), installed as the table reports read."""
    import statistics

    from auditor.calibration.effects import card_classes_of, card_effects_from_records
    from auditor.verdict import rules_out

    raw = json.loads(rules_out.EFFECT_SIZES_PATH.read_text())
    cards = {}
    for variant, profiles in BELOW_CARD.items():
        records = []
        for profile in profiles:
            ratios = []
            for seed in CALIBRATION_SEEDS:
                d, _, _ = _audit(card_env, variant, profile, None, CALIBRATION_BUDGET, seed=seed)
                lp = next(x for x in d["detectors"] if x["name"] == "logprob-divergence")
                if lp.get("ran") and (lp.get("details") or {}).get("geometric_ratio"):
                    ratios.append(lp["details"]["geometric_ratio"])
            records.append({"profile": profile, "design": "fixed", "budget_tokens": CALIBRATION_BUDGET,
                            "detectors": {"logprob-divergence": {
                                "effect_median": statistics.median(ratios) if ratios else None,
                                "ran": len(ratios) / len(CALIBRATION_SEEDS)}}})
        cards[f"tiny+{variant}"] = card_effects_from_records(
            records, model=f"tiny+{variant}", card=_recipe(variant), source="tests/audit/test_native_card.py",
            classes=card_classes_of(list(profiles), _card(variant).component_bits(), raw))
    path = tmp_path_factory.mktemp("card-effects") / "effect_sizes.json"
    path.write_text(json.dumps({**raw, "cards": cards}, indent=1))
    mp = pytest.MonkeyPatch()
    mp.setattr(rules_out, "EFFECT_SIZES_PATH", path)
    yield cards
    mp.undo()


@pytest.mark.parametrize("n_seeds", [2, pytest.param(10, marks=[pytest.mark.slow, pytest.mark.calibration_loop])])
def test_precision_estimate_names_the_step_below_the_card(card_env, card_effects, n_seeds: int) -> None:
    """Below the card (issue 36 acceptance): int4 and NVFP4 W4A4 of the FP8 model, an FP8 KV cache under the FP8 card
    and int3 of the INT4 model are rejected at 400 tokens in >= 95% of seeds, and the report's precision estimate
    names the step below the card (4-bit, 8-bit KV cache, 3-bit weights) in >= 90% of rejections, relative to the card and
    with the effects measured under it. Before the estimate's classes were relative to the card, int4 of the FP8
    model was named "8-bit" (its ratio to the card's lenient floor, 5x, is an 8-bit step's against float32)."""
    from auditor.verdict.precision_estimate import estimate_precision
    from auditor.verdict.rules_out import parse_effect_sizes

    packaged = json.loads((Path(__file__).resolve().parents[2] / "auditor/calibration/effect_sizes.json").read_text())
    plain = parse_effect_sizes({**packaged, "cards": {}}, "packaged")
    rows = []
    for variant, profiles in BELOW_CARD.items():
        for profile, group in profiles.items():
            if profile == "kv-fp8":
                continue  # the INT4 card's 8-bit KV class is calibrated, not an acceptance case
            verdicts, named, plain_named = [], [], []
            for seed in range(1, n_seeds + 1):
                d, _, _ = _audit(card_env, variant, profile, None, 400, seed=seed)
                verdicts.append(d["verdict"])
                if d["verdict"] in NOT_ACCUSED:
                    continue
                est = d["precision_estimate"]
                assert _recipe(variant) in est["relative_to"] and "measured under this card" in est["relative_to"]
                assert est["card_calibrated"], est
                named.append(est["best"])
                ref = d["reference"]
                old = estimate_precision(d["verdict"], d["detectors"], effect_sizes=plain, card_bits=ref["card_bits"],
                                         card_recipe=ref["card_recipe"], model=ref["model"])
                plain_named.append(old.best if old is not None else None)
            rows.append((variant, profile, group, verdicts, named, plain_named))
    print(f"\nprecision estimate below the card ({n_seeds} seeds, 400 tokens; effects measured under the card: "
          f"{ {k: {c: v['effects']['logprob-divergence'] for c, v in e['classes'].items()} for k, e in card_effects.items()} })")
    for variant, profile, group, verdicts, named, plain_named in rows:
        rej = len(named)
        print(f"  tiny+{variant:4s} {profile:18s} rejected {rej}/{len(verdicts)}  named {group!r} "
              f"{named.count(group)}/{rej}  (float32 effects: {sorted(set(map(str, plain_named)))})")
    for _variant, profile, group, verdicts, named, _ in rows:
        assert len(named) >= 0.95 * len(verdicts), (profile, verdicts)
        assert named.count(group) >= 0.90 * len(named), (profile, group, named)


#: The DeepSeek-V3 checkpoint's own quantization_config (config.json).
DEEPSEEK_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


@pytest.mark.parametrize(("card", "qc", "field", "fix"), [
    ('{ weights = { format = "fp7" } }', None, "providers.sim.card.weights.format", "use one of 'bf16'"),
    ('{ weights = { format = "fp8-block", block_size = [48, 48] } }', None, "weights.block_size",
     "use the block size the checkpoint was quantized with"),
    ('{ weights = { format = "int4", group_size = 32 } }', DEEPSEEK_QC, "weights.format",
     "make the card say what the checkpoint's config.json quantization_config declares"),
], ids=["unknown-format", "block-does-not-divide", "contradicts-quantization-config"])
def test_bad_card_is_exit_3_naming_the_field_and_the_fix(tiny_lm, tmp_path, card, qc, field, fix) -> None:
    """Bad input (issue 36 acceptance): ``auditor check`` with an unknown format name, a block size that does not
    divide the tiny model's weights (hidden 64), or a card the checkpoint's quantization_config contradicts exits 3
    before any probe, naming the field and the fix."""
    from dataclasses import replace

    from auditor.check import reference_setup

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if qc is not None:
        (ckpt / "config.json").write_text(json.dumps({"quantization_config": qc}))
    mp = pytest.MonkeyPatch()
    mp.setitem(reference_setup._MODELS, ("tiny+ckpt", "float32"), replace(tiny_lm, path=str(ckpt), name="tiny+ckpt"))
    try:
        text = providers_toml({"sim": "http://127.0.0.1:9/v1"}, "tiny+ckpt", reference="tiny+ckpt")
        cfg = tmp_path / "p.toml"
        cfg.write_text(text.replace('reference = "tiny+ckpt"\n', f'reference = "tiny+ckpt"\ncard = {card}\n', 1))
        res = CliRunner().invoke(app, ["check", "--provider", "sim", "--budget-tokens", "400", "--config", str(cfg),
                                       "--db", f"sqlite:///{tmp_path / 'a.db'}", "--no-progress"])
    finally:
        mp.undo()
    out = " ".join(res.output.split())
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    assert field in out and "Fix:" in out and fix in out, out
