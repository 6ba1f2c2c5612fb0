"""The detector registry is the one home of detector metadata: check it is complete and coherent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from auditor.detectors import (
    DETECTORS,
    MODES,
    POWER_FAMILIES,
    POWER_TARGETS,
    PREFLIGHT_CHECKS,
    REFERENCE_DETECTORS,
    SELF_SAMPLING_DETECTORS,
    DetectorName,
    DetectorResult,
    EvidenceBatch,
    Mode,
    PowerFamily,
    TestKind,
    detectors_where,
    run_detectors,
    spec,
)
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind
from auditor.verdict.power import required_positions


def test_every_name_has_exactly_one_spec_in_enum_order() -> None:
    assert list(DETECTORS) == [n.value for n in DetectorName]
    for key, s in DETECTORS.items():
        assert type(key) is str and key == s.name
        assert spec(s.name) is s and spec(key) is s


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="greedy-match"):
        spec("greedy-mtach")


def test_causes_are_verdicts_and_never_pass_or_inconclusive() -> None:
    deviations = {k.value for k in VerdictKind} - {"PASS", "INCONCLUSIVE"}
    for s in DETECTORS.values():
        assert s.causes, s.name
        assert set(s.causes) <= deviations, s.name
        assert len(set(s.causes)) == len(s.causes), s.name


def test_power_family_and_target_go_together() -> None:
    for s in DETECTORS.values():
        # a family needs a target; the near-tie test has a target (a power model for the rules-out list:
        # greedy-relaxed) but no family (a greedy audit's PASS is not held back by it)
        assert s.power_family is None or s.power_target is not None, s.name
        assert (s.power_target is None) == (s.test in (TestKind.PIT, TestKind.SCAN)), s.name
        # the omnibus PIT tests, the per-request scan and the near-tie test are in no power family
        assert (s.test in (TestKind.PIT, TestKind.SCAN, TestKind.NEAR_TIE)) == (s.power_family is None), s.name
        if s.power_target is not None:
            assert POWER_TARGETS[s.power_target.key] == s.power_target.value
    # every family has a member and every member is in its family
    assert set(POWER_FAMILIES) == {f.value for f in PowerFamily}
    for fam, members in POWER_FAMILIES.items():
        assert members, fam
        assert all(DETECTORS[m].power_family == fam for m in members)


def test_self_tests_need_top_logprobs_and_no_reference() -> None:
    for s in DETECTORS.values():
        if not s.needs_reference:
            assert s.needs_top_logprobs, s.name
    assert set(SELF_SAMPLING_DETECTORS) == {"self-gof", "self-argmax", "self-tail"}
    assert set(REFERENCE_DETECTORS) == {k for k, s in DETECTORS.items() if s.needs_reference}
    assert detectors_where(mode=Mode.GREEDY) == ("greedy-match", "self-greedy", "greedy-heterogeneity",
                                                 "greedy-near-tie")
    assert detectors_where(test=TestKind.ARGMAX) == ("sampling-argmax", "self-argmax")
    assert detectors_where(mode=Mode.LOGPROB, needs_reference=False) == ()


def _result(name: str, p: float) -> DetectorResult:
    """A result of ``name`` with enough details for every verdict rule (nothing extreme)."""
    return DetectorResult(name, 3.0, p, 0.01, (0.01, 0.01), 2000, [],
                          details={"r0": 1e-3, "band": 0.2, "ratio_to_floor": 1.0, "top1_agreement": 0.99,
                                   "m": 5, "n_prompts": 40, "expected_rate": 0.6, "argmax_rate": 0.6,
                                   "excess_per_position": 0.0, "tail_ratio": 1.0, "deficit_per_position": 0.0,
                                   "mean_tail_mass": 0.05, "expected": 30.0})


def _all_quiet() -> list[DetectorResult]:
    return [_result(k, 0.5) for k in DETECTORS]


@pytest.mark.parametrize("name", [*DETECTORS, *PREFLIGHT_CHECKS])
def test_verdict_findings_carry_the_registry_implication(name: str) -> None:
    res = [r if r.name != name else _result(name, 1e-12) for r in _all_quiet()]
    if name in PREFLIGHT_CHECKS:
        res.append(_result(name, 1e-12))
    v = decide_verdict(res)
    want = PREFLIGHT_CHECKS[name].implication if name in PREFLIGHT_CHECKS else spec(name).implication
    assert v.details["findings"] == [{"detector": name, "p_adjusted": pytest.approx(1e-12 * len(res)),
                                      "implication": want}]
    causes = spec(name).causes if name in DETECTORS else ("DECODING_NONCOMPLIANT",)
    assert want and v.verdict in causes


@pytest.mark.parametrize("name", list(PREFLIGHT_CHECKS))
def test_preflight_rejection_decides_its_registry_rule_and_never_counts_for_power(name: str) -> None:
    v = decide_verdict([*_all_quiet(), _result(name, 1e-12)])
    assert v.verdict == "DECODING_NONCOMPLIANT" and v.details["rule"] == PREFLIGHT_CHECKS[name].rule
    quiet = decide_verdict([*_all_quiet(), _result(name, 0.5)])
    assert quiet.details["n_tests"] == len(DETECTORS) + 1 and quiet.details["rule"] in ("5-pass", "5-underpowered")
    assert name not in quiet.details["power"]
    assert quiet.details["power"] == decide_verdict(_all_quiet()).details["power"]  # same Bonferroni m


def test_template_mismatch_sets_aside_exactly_the_reference_detectors() -> None:
    v = decide_verdict(_all_quiet(), template_mismatch={"provider_prompt_tokens": 61, "reference_prompt_tokens": 31})
    assert set(v.details["not_run"]) == set(REFERENCE_DETECTORS) == {
        k for k, s in DETECTORS.items() if s.needs_reference
    }
    assert set(v.details["ran"]) == {k for k, s in DETECTORS.items() if not s.needs_reference}


def test_verdict_power_follows_the_registry() -> None:
    v = decide_verdict(_all_quiet())
    power = v.details["power"]
    # a power calculation exactly for the detectors with a power target (the KL test also needs the noise
    # floor, not given here), tagged with their probe mode
    powered = {k for k, s in DETECTORS.items() if s.power_target is not None and s.test != TestKind.KL}
    assert set(power) == powered
    assert {k: p["mode"] for k, p in power.items()} == {k: str(MODES[k]) for k in power}
    assert list(v.details["power_families"]) == list(POWER_FAMILIES) == [f.value for f in PowerFamily]
    for r in _all_quiet():
        assert (required_positions(r, alpha_test=0.01) is not None) == (r.name in powered), r.name
    # tests of one kind share the kind's calculation and target
    for kind in (TestKind.CLEAR_MISMATCH, TestKind.ARGMAX, TestKind.TAIL):
        reqs = {required_positions(_result(k, 0.5), alpha_test=0.01) for k in detectors_where(test=kind)}
        assert len(reqs) == 1 and None not in reqs, kind


def test_sampling_rules_read_the_test_kind_from_the_registry() -> None:
    """Rule 4 groups the sampling tests by kind: a self-tail rejection alone (no reference) is truncation,
    a self-argmax rejection alone is relaxed acceptance."""
    own = [_result(k, 0.5) for k in SELF_SAMPLING_DETECTORS]
    tail = detectors_where(test=TestKind.TAIL, needs_reference=False)[0]
    arg = detectors_where(test=TestKind.ARGMAX, needs_reference=False)[0]
    res = [r if r.name != tail else _result(tail, 1e-12) for r in own]
    res = [r if r.name != tail else DetectorResult(tail, 0.0, 1e-12, 0.0, (0.0, 0.0), 2000, [],
                                                   details={"tail_ratio": 0.0, "deficit_per_position": 0.05})
           for r in res]
    assert decide_verdict(res).details["rule"] == "4b-truncated"
    res = [r if r.name != arg else DetectorResult(arg, 0.0, 1e-12, 0.1, (0.1, 0.1), 2000, [],
                                                  details={"excess_per_position": 0.1, "argmax_rate": 0.7})
           for r in own]
    assert decide_verdict(res).details["rule"] == "4c-relaxed"


def test_results_carry_plain_string_names_and_serialise() -> None:
    rng = np.random.default_rng(3)
    n, k = 40, 5
    lp = np.log(rng.dirichlet(np.ones(k), size=n))
    ids = np.tile(np.arange(k), (n, 1))
    batch = EvidenceBatch.from_arrays(
        prompt_ids=[f"p{i // 10}" for i in range(n)],
        token_ids=lp.argmax(1),
        temperatures=0.0,
        ref_top_ids=ids,
        ref_top_logprobs=lp,
    )
    results = run_detectors(batch, None)
    assert [r.name for r in results] == [k for k in DETECTORS if k not in SELF_SAMPLING_DETECTORS]
    for r in results:
        assert type(r.name) is str
        d = r.to_dict()
        assert json.loads(json.dumps(d, allow_nan=False))["name"] == r.name
