"""The detector registry is the one home of detector metadata: check it is complete and coherent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from auditor.detectors import (
    DETECTORS,
    IMPLICATIONS,
    MODES,
    POWER_FAMILIES,
    POWER_TARGETS,
    REFERENCE_DETECTORS,
    SELF_SAMPLING_DETECTORS,
    DetectorName,
    EvidenceBatch,
    Mode,
    PowerFamily,
    TestKind,
    detectors_where,
    run_detectors,
    spec,
)
from auditor.verdict import VerdictKind


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
        assert (s.power_family is None) == (s.power_target is None), s.name
        # the omnibus PIT tests have no power calculation; every other test kind has one
        assert (s.test == TestKind.PIT) == (s.power_family is None), s.name
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
    assert detectors_where(mode=Mode.GREEDY) == ("greedy-match", "self-greedy")
    assert detectors_where(test=TestKind.ARGMAX) == ("sampling-argmax", "self-argmax")
    assert detectors_where(mode=Mode.LOGPROB, needs_reference=False) == ()


def test_verdict_tables_agree_with_the_registry() -> None:
    """Until auditor/verdict.py reads the registry, its own tables must say the same thing."""
    import auditor.verdict as v

    assert {k: tuple(m) for k, m in v.POWER_FAMILIES.items()} == {
        k: tuple(m) for k, m in POWER_FAMILIES.items()
    }
    assert dict(v.POWER_TARGETS) == dict(POWER_TARGETS)
    mode_table = getattr(v, "_MODE", None)
    if mode_table is not None:
        assert {k: mode_table.get(k) for k in DETECTORS} == {k: str(m) for k, m in MODES.items()}
    impl = getattr(v, "_IMPLICATION", None)
    if impl is not None:  # (it may also list non-detector results, e.g. preflight-*)
        assert {k: impl.get(k) for k in DETECTORS} == dict(IMPLICATIONS)


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
