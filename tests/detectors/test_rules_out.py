"""What a PASS rules out (issue 14, item 2): power at n, the effect-size table, the verdict's record."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest

from auditor.detectors import DetectorResult, not_run
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind
from auditor.verdict.power import power_at, power_effect, required_positions
from auditor.verdict.rules_out import (
    EFFECT_SIZES_PATH,
    RULE_OUT_POWER,
    EffectSizesError,
    load_effect_sizes,
    parse_effect_sizes,
    rules_out,
    rules_out_rows,
    rules_out_sentence,
    tokens_to_rule_out,
)
from tests.effect_table import effect_table


def mk(name, p=0.5, *, effect=0.0, n=1000, **details):
    return DetectorResult(name, 0.0, p, effect, (effect, effect), n, [], details=details)


def _floor(sigma_w2=1.0, sigma_b2=0.02):
    """A stand-in NoiseFloor: only the KL power model's variance components are read."""
    comps = SimpleNamespace(sigma_w2=sigma_w2, sigma_b2=sigma_b2)
    return SimpleNamespace(kl_floor=lambda m: SimpleNamespace(components=comps))


def _table(**classes):
    raw = {"source": "test", "model": "m", "generated": "2025-01-01T00:00:00Z",
           "classes": {k: {"label": k, "question": q, "profile": k, "effects": e} for k, (q, e) in classes.items()}}
    return parse_effect_sizes(raw, "test.json")


CASES = [
    # detector result, effect in its power-target unit
    (mk("greedy-match", r0=1e-3), 0.03),
    (mk("greedy-match", r0=5e-3), 0.02),
    (mk("self-greedy", r0=1e-3), 0.05),
    (mk("logprob-divergence", m=5, n=400, n_prompts=20), 2.3),
    (mk("logprob-divergence", m=5, n=400, n_prompts=20), 12.0),
    (mk("sampling-argmax", var_per_position=0.2), 0.06),
    (mk("self-argmax", expected_rate=0.6), 0.12),
    (mk("sampling-tail", mean_tail_mass=0.05), 0.0),
    (mk("sampling-tail", mean_tail_mass=0.05), 0.5),
    (mk("self-tail", mean_tail_mass=0.08), 0.22),
    (mk("greedy-near-tie", n=80, mean_bound=0.02, n_greedy=600), 0.12),
    (mk("greedy-near-tie", n=80, expected=0.4, n_greedy=600), 0.05),
]


@pytest.mark.parametrize(("result", "effect"), CASES, ids=[f"{r.name}-{e}" for r, e in CASES])
@pytest.mark.parametrize("power", [0.8, 0.95])
@pytest.mark.parametrize("alpha_test", [0.05, 0.005])
def test_power_at_n_inverts_required_positions(result, effect, power, alpha_test):
    """required_positions is the smallest n at which power_at reaches the power (one model, two ways)."""
    fl = _floor()
    n = required_positions(result, alpha_test=alpha_test, power=power, floor=fl, effect=effect)
    assert n is not None and n >= 1
    assert power_at(result, effect=effect, alpha_test=alpha_test, n=n, floor=fl) >= power
    if n > 1:
        assert power_at(result, effect=effect, alpha_test=alpha_test, n=n - 1, floor=fl) < power
    # power grows with n (far beyond the requirement it is ~1)
    assert power_at(result, effect=effect, alpha_test=alpha_test, n=50 * n, floor=fl) > 0.999


def test_required_positions_default_is_the_registry_target():
    """Without ``effect`` the registry target is used, as before the refactor (greedy: >= 2 r0)."""
    g = mk("greedy-match", r0=1e-3)
    assert required_positions(g, alpha_test=0.01) == required_positions(g, alpha_test=0.01, effect=0.03)
    g5 = mk("greedy-match", r0=0.02)  # target 2·r0; an explicit effect starts the search at a normal
    # approximation, which may find an earlier crossing of the exact test's saw-toothed power
    a, b = required_positions(g5, alpha_test=0.01), required_positions(g5, alpha_test=0.01, effect=0.04)
    assert b <= a and b >= 0.9 * a and power_at(g5, effect=0.04, alpha_test=0.01, n=b) >= 0.8
    lp = mk("logprob-divergence", m=5, n=400, n_prompts=20)
    assert required_positions(lp, alpha_test=0.01, floor=_floor()) == required_positions(
        lp, alpha_test=0.01, floor=_floor(), effect=3.0)
    # effects on the null side are never reachable; no power model for the PIT tests
    assert required_positions(g, alpha_test=0.01, effect=5e-4) is None
    assert required_positions(lp, alpha_test=0.01, floor=_floor(), effect=0.9) is None
    assert power_at(mk("sampling-gof"), effect=1.0, alpha_test=0.01) is None
    assert power_at(lp, effect=3.0, alpha_test=0.01) is None  # a KL test's power needs the floor


def test_power_effect_reads_each_unit():
    assert power_effect(mk("greedy-match", effect=0.08)) == 0.08
    assert power_effect(mk("logprob-divergence", effect=0.1, geometric_ratio=11.5)) == 11.5
    assert power_effect(mk("logprob-divergence", effect=0.1)) is None
    assert power_effect(mk("sampling-argmax", effect=0.12)) == 0.12
    assert power_effect(mk("self-tail", effect=0.2)) == 0.2
    assert power_effect(mk("sampling-gof", effect=0.3)) is None
    assert power_effect(not_run("greedy-match", "too few")) is None


def test_packaged_table_loads_with_every_class():
    t = load_effect_sizes()
    keys = [c.key for c in t.classes]
    for k in ("int4", "int8", "fp8", "kv-fp8", "w8a8", "relaxed-threshold", "relaxed-threshold:0.7",
              "relaxed-threshold:0.9", "typical-acceptance", "greedy-relaxed", "truncated-sampling", "substituted"):
        assert k in keys
    assert {c.question for c in t.classes} == {"precision", "verification", "decoding"}
    raw = json.loads(EFFECT_SIZES_PATH.read_text())
    assert set(raw) >= {"source", "model", "generated", "classes"}


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda r: r["classes"]["int4"]["effects"].update({"greedy-match": "big"}), "classes.int4.effects.greedy-match"),
    (lambda r: r["classes"]["int4"]["effects"].update({"sampling-gof": 0.1}), "classes.int4.effects.sampling-gof"),
    (lambda r: r["classes"]["int4"].update(question="speed"), "classes.int4.question"),
    (lambda r: r["classes"]["int4"].pop("label"), "classes.int4.label"),
    (lambda r: r.pop("classes"), "classes"),
    (lambda r: r.update(provisional="yes"), "provisional"),
])
def test_loader_rejects_a_malformed_file_naming_the_field(tmp_path, mutate, field):
    raw = json.loads(EFFECT_SIZES_PATH.read_text())
    mutate(raw)
    p = tmp_path / "effect_sizes.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(EffectSizesError) as e:
        load_effect_sizes(p)
    assert str(p) in str(e.value) and repr(field) in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EffectSizesError, match="not valid JSON"):
        load_effect_sizes(bad)


def greedy_audit(n):
    """A clean greedy-only audit (greedy-match and self-greedy, honest rate 1e-3) on n positions."""
    return [mk("greedy-match", 1.0, n=n, r0=1e-3, band=0.2), mk("self-greedy", 1.0, n=n, r0=1e-3, band=0.2)]


def test_many_positions_rule_out_int4_but_not_an_effect_it_cannot_see():
    t = _table(int4=("precision", {"greedy-match": 0.08}), tiny=("precision", {"greedy-match": 8e-4}),
               relaxed=("verification", {"sampling-argmax": 0.12}))
    ro = {r.key: r for r in rules_out(greedy_audit(5000), alpha=0.05, effect_sizes=t)}
    assert ro["int4"].ruled_out and ro["int4"].power >= RULE_OUT_POWER and ro["int4"].detector == "greedy-match"
    assert ro["int4"].missing_positions == 0
    # an effect below the honest rate: no number of positions reaches it
    assert ro["tiny"].status == "not ruled out" and ro["tiny"].power < 0.05
    assert ro["tiny"].missing_positions is None and tokens_to_rule_out(list(ro.values())) is None
    # no sampling test ran: the acceptance class is not tested
    assert ro["relaxed"].status == "not tested" and ro["relaxed"].power is None
    s = rules_out_sentence(list(ro.values()))
    assert s.startswith("rules out int4; does not rule out tiny (power ") and "; not tested: relaxed; " in s
    # issue 37 item 5: a PASS states its resolution: what is within the honest floor cannot be distinguished
    from auditor.verdict.rules_out import BELOW_RESOLUTION

    assert s.endswith("; cannot be distinguished at any budget: " + BELOW_RESOLUTION) and "8-bit KV cache" in s
    only_verification = [r for r in ro.values() if r.question != "precision"]
    assert "cannot be distinguished" not in rules_out_sentence(only_verification)


def test_underpowered_audit_rules_out_nothing():
    t = effect_table()
    ro = rules_out(greedy_audit(5), alpha=0.05, effect_sizes=t)  # (at 15 positions the substituted model's 36% is already seen)
    assert not any(r.ruled_out for r in ro)
    tested = [r for r in ro if r.status != "not tested"]
    assert tested and all(r.power < RULE_OUT_POWER for r in tested)
    assert {r.key for r in ro if r.status == "not tested"} >= {"relaxed-threshold", "truncated-sampling"}
    need = tokens_to_rule_out(ro)
    # positions that would rule out every tested greedy class (int4 needs far fewer than kv-fp8)
    assert need is not None and need > 0
    more = rules_out(greedy_audit(5 + need), alpha=0.05, effect_sizes=t)
    assert all(r.ruled_out for r in more if r.status != "not tested")


def test_kl_power_rules_out_with_the_floor_and_level_alpha_over_m():
    t = _table(int8=("precision", {"logprob-divergence": 2.3}))
    lp = mk("logprob-divergence", 0.5, n=20, m=5, n_prompts=2)
    fl = _floor()
    one = rules_out([lp], alpha=0.05, effect_sizes=t, floor=fl)[0]
    many = rules_out([lp], alpha=0.05, n_tests=8, effect_sizes=t, floor=fl)[0]
    assert many.power < one.power  # alpha / m
    assert one.power == pytest.approx(power_at(lp, effect=2.3, alpha_test=0.05, floor=fl))
    assert rules_out([lp], alpha=0.05, effect_sizes=t)[0].status == "not tested"  # no floor: no KL power


def test_verdict_records_rules_out_on_pass_and_inconclusive_only():
    t = effect_table()
    v = decide_verdict(greedy_audit(20_000), effect_sizes=t)
    assert v.verdict == VerdictKind.PASS
    recs = {r["key"]: r for r in v.details["rules_out"]}
    assert recs["int4"]["status"] == "ruled out" and recs["substituted"]["status"] == "ruled out"
    assert recs["relaxed-threshold"]["status"] == "not tested"
    assert "rules out int4 weights" in v.reason and "power against the calibrated effect sizes" in v.reason
    json.dumps(v.details, allow_nan=False)
    small = decide_verdict(greedy_audit(12), effect_sizes=t)
    assert small.verdict == VerdictKind.INCONCLUSIVE and "rules_out" in small.details
    assert [r["key"] for r in small.details["rules_out"] if r["ruled_out"]] == ["substituted"]  # 36% mismatches
    bad = decide_verdict([mk("greedy-match", 1e-9, n=2000, effect=0.2, r0=1e-3, band=0.2)], effect_sizes=t)
    assert bad.verdict == VerdictKind.QUANTIZATION and "rules_out" not in bad.details


def test_rules_out_power_grows_with_positions():
    t = _table(int8=("precision", {"greedy-match": 0.015}))
    pw = [rules_out(greedy_audit(n), alpha=0.05, effect_sizes=t)[0].power for n in (100, 400, 1600, 6400)]
    assert all(b >= a for a, b in itertools.pairwise(pw)) and pw[-1] > 0.99 > pw[0]
    assert np.isfinite(pw).all()


def test_near_tie_missing_positions_are_counted_in_greedy_tokens():
    """greedy-near-tie tests only near-ties: the positions it still lacks cost n_greedy / n greedy tokens each."""
    nt = mk("greedy-near-tie", 1.0, n=20, mean_bound=0.02, n_greedy=200)
    t = _table(**{"greedy-relaxed": ("verification", {"greedy-near-tie": 0.15})})
    (rec,) = rules_out([nt], alpha=0.05, effect_sizes=t)
    req = required_positions(nt, alpha_test=0.05, power=RULE_OUT_POWER, effect=0.15)
    assert rec.status == "not ruled out" and rec.detector == "greedy-near-tie" and req > 20
    assert rec.missing_positions == int(np.ceil((req - 20) * 10.0))
    assert tokens_to_rule_out([rec]) == rec.missing_positions
    # enough near-ties rule it out; an effect at the honest bound never does
    big = mk("greedy-near-tie", 1.0, n=10 * req, mean_bound=0.02, n_greedy=100 * req)
    assert rules_out([big], alpha=0.05, effect_sizes=t)[0].status == "ruled out"
    assert required_positions(nt, alpha_test=0.05, effect=0.02) is None
    assert power_effect(mk("greedy-near-tie", effect=0.2, mean_bound=0.02)) == 0.2


#: An FP8 card's recipe and bits (``probes.model_card.ModelCard.recipe`` / ``component_bits``: weights and
#: activations 8, KV cache float).
FP8_RECIPE = "weights fp8-block 128x128 e4m3, activations fp8 per 1x128, KV cache fp32"
FP8_BITS = {"weights": 8, "activations": 8, "kv_cache": 16}


def _with_card_effects(int4_kl: float):
    """The test table plus effects measured under the FP8 card on model ``m`` (int4 only: kv-fp8 falls back)."""
    raw = json.loads(json.dumps({
        "source": "t", "model": "test", "generated": "2026-01-01T00:00:00Z",
        "classes": {r.key: {"label": r.label, "question": r.question, "profile": r.profile, "effects": dict(r.effects),
                            **({"lowers": dict(r.lowers)} if r.lowers else {})} for r in effect_table().classes},
    }))
    raw["cards"] = {"m+fp8": {"model": "m", "card": FP8_RECIPE, "source": "t", "generated": "2026-01-01T00:00:00Z",
                              "classes": {"int4": {"label": "int4 weights", "question": "precision", "profile": "native-fp8-int4",
                                                   "lowers": {"weights": 4},
                                                   "effects": {"logprob-divergence": int4_kl}}}}}
    return parse_effect_sizes(raw, "card.json")


def _kl_audit(n=4000, n_prompts=40):
    return [mk("logprob-divergence", 1.0, n=n, m=5, n_prompts=n_prompts)]


def test_rules_out_under_an_fp8_card_lists_only_the_steps_below_it():
    """Issue 36: under an FP8 card 8-bit weights are the card itself, not a deviation below it: the PASS's
    rules-out list never names them, and says the float32 effects stand in where no card calibration exists."""
    t = effect_table()
    plain = {r.key for r in rules_out(greedy_audit(20_000), alpha=0.05, effect_sizes=t)}
    assert "int8" in plain
    recs = rules_out(greedy_audit(20_000), alpha=0.05, effect_sizes=t, card_bits=FP8_BITS, card_recipe=FP8_RECIPE,
                     model="m")
    by = {r.key: r for r in recs}
    assert "int8" not in by and {"int4", "kv-fp8", "substituted", "relaxed-threshold"} <= set(by)
    assert by["int4"].card == FP8_RECIPE and by["int4"].under_card is False
    assert by["substituted"].card is None and by["relaxed-threshold"].card is None  # not steps below the card
    s = rules_out_sentence(recs)
    assert "int8" not in s and "int4 weights" in s
    assert f"steps below the card ({FP8_RECIPE})" in s
    assert "the effects of int4 weights, fp8 KV cache are the float32 reference's, not measured under this card" in s
    rows = {row[0] for row in rules_out_rows(recs)}
    assert "int4 weights (float32 effect: not calibrated under the card)" in rows and "a different model" in rows
    # a float card (bf16) is the float32 reference: the same classes as no card, no card sentence
    flt = rules_out(greedy_audit(20_000), alpha=0.05, effect_sizes=t, card_bits=dict.fromkeys(FP8_BITS, 16),
                    card_recipe="weights bf16, activations bf16, KV cache bf16", model="m")
    assert [r.key for r in flt] == [r.key for r in rules_out(greedy_audit(20_000), alpha=0.05, effect_sizes=t)]
    assert "steps below the card" not in rules_out_sentence(flt)


def test_rules_out_uses_the_effects_measured_under_the_card():
    """With the table's ``cards`` entry for the card and model, the power is against the card's effect (an int4
    step under the FP8 card's lenient floor: 1.5x, not the float32 table's 12x), and a class without one falls back."""
    fl = _floor()
    t = _with_card_effects(1.5)
    recs = {r.key: r for r in rules_out(_kl_audit(20, 2), alpha=0.05, floor=fl, effect_sizes=t, card_bits=FP8_BITS,
                                        card_recipe=FP8_RECIPE, model="m")}
    assert recs["int4"].effect == 1.5 and recs["int4"].under_card is True
    assert recs["kv-fp8"].effect == 1.3 and recs["kv-fp8"].under_card is False
    f32 = {r.key: r for r in rules_out(_kl_audit(20, 2), alpha=0.05, floor=fl, effect_sizes=t)}
    assert f32["int4"].effect == 12.0 and recs["int4"].power < f32["int4"].power
    s = rules_out_sentence(list(recs.values()))
    assert "effects measured under it where calibrated" in s and "the effects of fp8 KV cache are the float32" in s
    # another model's card entry is not this one's
    other = {r.key: r for r in rules_out(_kl_audit(20, 2), alpha=0.05, floor=fl, effect_sizes=t, card_bits=FP8_BITS,
                                         card_recipe=FP8_RECIPE, model="other")}
    assert other["int4"].effect == 12.0 and other["int4"].under_card is False


def test_rules_out_and_the_precision_estimate_share_the_below_card_rule():
    """One rule: the precision classes a PASS rules out under a card are the precision estimate's classes (which,
    with effects measured under the card, keeps only those: the float32 ones are on another floor's scale)."""
    from auditor.verdict.precision_estimate import NATIVE, card_classes

    for t in (effect_table(), _with_card_effects(3.0)):
        for bits in (None, FP8_BITS, {"weights": 4, "activations": 16, "kv_cache": 16}):
            recipe = None if bits is None else FP8_RECIPE
            measured = t.for_card("m", recipe) is not None
            est = {k for k, *_ in card_classes(t, bits, model="m", recipe=recipe).classes} - {NATIVE}
            ro = [r for r in rules_out(_kl_audit(), alpha=0.05, floor=_floor(), effect_sizes=t, card_bits=bits,
                                       card_recipe=recipe, model="m") if r.question == "precision"]
            assert est == {r.key for r in ro if not measured or r.under_card}, (bits, est, ro)
            if bits is not None and bits["weights"] < 16:
                assert not {r.key for r in ro} & {"int8", f"int{bits['weights']}"}  # at the card's width: the card


def test_pass_reason_under_a_card_does_not_rule_out_the_card_itself():
    t = effect_table()
    v = decide_verdict(greedy_audit(20_000), effect_sizes=t, card_bits=FP8_BITS, card_recipe=FP8_RECIPE, model="m")
    assert v.verdict == VerdictKind.PASS
    assert "int8" not in v.reason and "rules out int4 weights" in v.reason and "steps below the card" in v.reason
    assert "int8" not in {r["key"] for r in v.details["rules_out"]}
    assert "rules out int4 weights, int8 weights" in decide_verdict(greedy_audit(20_000), effect_sizes=t).reason
