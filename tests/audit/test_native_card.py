"""The reference computes the model card (issue 36, item 2): ``auditor check`` on native variants of the tiny
model (``tiny+fp8``: FP8 e4m3 32x32 weight blocks, 1x32 activation tiles; ``tiny+int4``: INT4 group 32 — the
recipes of SmolLM2's bundled ``+fp8`` / ``+int4`` cards at the block hidden size 64 divides) against the
simulator serving each honestly and below its card:

- honest native-FP8 serving (profile ``native-fp8``) against the FP8 card → PASS: the reference applies the
  card's FP8 activation tiles and the floor is measured over the card's honest variants
  (``auditor.check.reference_setup.apply_card``);
- the same provider against a bf16 card → QUANTIZATION: the card matters, and the report says which card;
- int4 of the FP8 model (``native-fp8-int4``) and an FP8 KV cache under the FP8 card's fp32 KV cache
  (``native-fp8-kv-fp8``) against the FP8 card → QUANTIZATION;
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


@pytest.mark.parametrize(("variant", "profile", "card", "expected", "code", "budget"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{'bf16card' if c[2] else 'card'}" for c in CASES])
def test_reference_computes_the_card(card_env, variant, profile, card, expected, code, budget) -> None:
    tmp, sims = card_env["tmp"], card_env["sims"][variant]
    name = f"tiny+{variant}"
    url = sims.url(profile)
    cid = f"{variant}-{profile}-{'bf16' if card else 'native'}"
    cfg = tmp / f"{cid}.toml"
    text = providers_toml({"sim": url}, name, reference=name)
    text = text.replace(f'reference = "{name}"\n', f'reference = "{name}"\ncard = {card or CARDS[variant]}\n', 1)
    cfg.write_text(text)
    jpath = tmp / f"{cid}.json"
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["check", "--provider", "sim", "--budget-tokens", str(budget), "--config", str(cfg),
                                   "--db", f"sqlite:///{tmp / 'audits.db'}", "--json", str(jpath), "--no-progress"])
    wall = time.perf_counter() - t0
    sims.stop(profile)
    assert jpath.exists(), res.output
    d = json.loads(jpath.read_text())
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
    assert res.exit_code == code
    assert d["tokens"]["completion"] <= budget
    if expected == "PASS":
        assert not any(x["rejects"] for x in d["detectors"])
    else:
        assert lp["rejects"], lp
