"""Emission models (auditor.detectors.emission) and rule 4b's use of them (issue 14, item 5).

Seeded simulations on language-model-like distributions: samples drawn through a top-p truncation are
attributed to truncation, samples drawn through typical acceptance or a pro-rata relaxed acceptance to
acceptance; the verdict names the cause the likelihood ratio picks, whatever the shape ratio says.
"""

from __future__ import annotations

import numpy as np
import pytest

from auditor.detectors import DetectorResult
from auditor.detectors.emission import _cuts, _prefix_mass, emission_fit
from auditor.detectors.sampling import SamplingView, tail_result
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind
from benchmarks.emission_margin import K, draw, lm_rows


@pytest.mark.parametrize("mechanism,truncation", [("top-p", True), ("typical", False), ("pro-rata", False),
                                                   ("single", False)])
def test_emission_fit_names_the_mechanism_that_drew_the_samples(mechanism: str, truncation: bool) -> None:
    right = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        rows = lm_rows(rng, 400)
        fit = emission_fit(rows[:, :K], draw(rng, rows, mechanism))
        assert fit is not None and fit["n"] == 400
        right += (fit["log_lik_ratio"] > 0) == truncation
    assert right >= 34, f"{mechanism}: the right family in {right} of 40 simulations"


def test_emission_fit_recovers_the_truncation_parameter() -> None:
    rng = np.random.default_rng(7)
    rows = lm_rows(rng, 3000)
    fit = emission_fit(rows[:, :K], draw(rng, rows, "top-p"))
    assert fit is not None
    assert fit["truncation"]["cut"] == "top-p" and fit["truncation"]["parameter"] == pytest.approx(0.8)
    assert fit["log_lik_truncation"] > fit["log_lik_acceptance"] + 10.0


def test_emission_fit_laws_are_at_least_as_good_as_p_itself_and_handle_edge_rows() -> None:
    rng = np.random.default_rng(3)
    rows = lm_rows(rng, 200)
    fit = emission_fit(rows[:, :K], draw(rng, rows, "honest"))
    assert fit is not None
    # each family contains (nearly) p itself: leak 0.7 with every token kept, λ = 0
    assert fit["log_lik_acceptance"] >= 0.0 and fit["log_lik_truncation"] >= -1.0
    assert emission_fit(np.zeros((0, K)), np.zeros(0, np.int64)) is None
    assert emission_fit(np.zeros((3, 0)), np.zeros(3, np.int64)) is None
    # a row whose emitted token is unlisted (bucket) and a one-token list stay finite
    one = np.array([[0.6] + [0.0] * (K - 1), [0.5, 0.2] + [0.01] * (K - 2)])
    f = emission_fit(one, np.array([-1, 1]))
    assert f is not None and np.isfinite(f["log_lik_ratio"])


def test_cut_masses_read_from_the_prefix_table_are_the_summed_ones_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    rows = lm_rows(rng, 300)
    for k in (1, 2, 5, K):
        p = rows[:, :k].copy()
        p[::7, k // 2:] = 0.0  # zero padding
        rank = np.where(rng.random(300) < 0.2, -1, rng.integers(0, k, 300))
        prefix = _prefix_mass(p)
        assert prefix is not None
        if k > 1:
            assert _prefix_mass(p[:, ::-1]) is None  # rows not sorted: no table, every mass summed
        for family in ("truncation", "acceptance"):
            kept_t, mass_t, names_t = _cuts(p, rank, family, prefix)
            kept_s, mass_s, names_s = _cuts(p, rank, family, None)
            assert names_t == names_s and kept_t.tobytes() == kept_s.tobytes() and mass_t.tobytes() == mass_s.tobytes()


class _Batch:
    """The part of EvidenceBatch that ``tail_result`` reads."""

    def __init__(self, n: int) -> None:
        self.prompt_ids = np.arange(n) // 24

    def evidence_row(self, i: int, **kw: float) -> dict:
        return {"row": i, **kw}


def _tail(rows: np.ndarray, ranks: np.ndarray) -> DetectorResult:
    view = SamplingView(np.arange(rows.shape[0]), rows[:, :K], ranks, "reference")
    r = tail_result(_Batch(rows.shape[0]), view, "sampling-tail", 0, 5, 0.9)  # type: ignore[arg-type]
    r.p_adjusted = r.p_value
    return r


def _quiet(n: int) -> list[DetectorResult]:
    def mk(name: str, p: float, **details: float) -> DetectorResult:
        return DetectorResult(name, 0.0, p, 0.0, (0.0, 0.0), n, [], details=details)

    return [mk("greedy-match", 1.0, r0=1e-3, band=0.2),
            mk("logprob-divergence", 0.6, ratio_to_floor=1.0, top1_agreement=0.99, m=5, n_prompts=40),
            mk("sampling-gof", 1e-6), mk("self-greedy", 1.0, r0=1e-3, band=0.2)]


@pytest.mark.parametrize("mechanism,kind,rule", [
    ("top-p", VerdictKind.DECODING_NONCOMPLIANT, "4b-truncated"),
    ("typical", VerdictKind.RELAXED_VERIFICATION, "4c-relaxed"),
])
def test_rule_4b_follows_the_emission_models(mechanism: str, kind: VerdictKind, rule: str) -> None:
    rng = np.random.default_rng(11)
    rows = lm_rows(rng, 1500)
    tail = _tail(rows, draw(rng, rows, mechanism))
    assert tail.p_value < 1e-3 and "emission" in tail.details
    # an argmax test that rejects with an excess as large as the tail deficit: the shape ratio alone
    # would sit on its cut (deficit/excess 1 vs 0.9); the likelihood ratio decides
    d = float(tail.details["deficit_per_position"])
    arg = DetectorResult("sampling-argmax", 5.0, 1e-8, d, (d, d), 1500, [],
                         details={"excess_per_position": d, "argmax_rate": 0.6, "expected_rate": 0.55})
    v = decide_verdict(_quiet(1500) + [tail, arg])
    assert v.verdict == kind and v.details["rule"] == rule
    conf = v.details["cause_confidence"]
    assert conf["path"] == "emission-models" and (conf["value"] > 0) == (kind == VerdictKind.DECODING_NONCOMPLIANT)
    assert "emission laws" in v.reason


def test_tail_result_skips_the_fit_when_the_tail_test_cannot_reject() -> None:
    rng = np.random.default_rng(5)
    rows = lm_rows(rng, 300)
    assert "emission" not in _tail(rows, draw(rng, rows, "honest")).details
