"""Issue 37 item 8: a sampler's mechanism (lossy acceptance vs server-side truncation) is named only on the
calibrated decisive margin of the emission models, read together with the speculation fingerprint and the
pre-flight top-p check; otherwise the verdict is RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT.

The decisive margin itself is re-derived from seeded simulations (benchmarks/emission_margin.py)."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.detectors import DETECTORS, DetectorResult
from auditor.detectors.sampling import SamplingView, tail_result
from auditor.verdict.cause import DECISIVE_EMISSION_MARGIN
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import EXIT_CODES, UNDETERMINED_CAUSES, VerdictKind
from auditor.verdict.questions import answer_questions, plain_headline
from auditor.watch.standing import SEVERITY
from benchmarks.emission_margin import ACCEPTANCE, TRUNCATION, K, decisive_margin, draw, lm_rows, simulate, wrong_rates
from tests.verdict_results import mk, quiet, with_

PAIR = VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT
NO_SPEC = {"detected": False, "mean_accepted_tokens_per_step": 1.0, "ci95": [1.0, 1.0]}
SPEC = {"detected": True, "mean_accepted_tokens_per_step": 2.6, "ci95": [2.3, 2.9]}


def sampler(lr: float, *, argmax: bool = True) -> list[DetectorResult]:
    """A clean audit whose tail test rejects with an emission fit of log-likelihood ratio ``lr`` (truncation −
    acceptance, nats), and whose argmax test rejects too when ``argmax``."""
    tail = mk("sampling-tail", 1e-8, tail_ratio=0.4, deficit_per_position=0.03, mean_tail_mass=0.05,
              emission={"log_lik_ratio": lr, "n": 400, "truncation": {"cut": "top-p", "parameter": 0.95, "leak": 0.05},
                        "acceptance": {"cut": "typical δ=0.3", "parameter": 0.09, "leak": 0.05}})
    res = with_(quiet(), tail)
    if argmax:
        res = with_(res, mk("sampling-argmax", 1e-8, excess_per_position=0.03, argmax_rate=0.65, expected_rate=0.6))
    return res


def test_the_pair_is_a_deviation_everywhere_a_verdict_name_is_listed() -> None:
    assert UNDETERMINED_CAUSES[PAIR] == (VerdictKind.RELAXED_VERIFICATION, VerdictKind.DECODING_NONCOMPLIANT)
    assert EXIT_CODES[PAIR] == 1
    # the standing sits it just below the worse of its two causes
    assert SEVERITY.index(str(PAIR)) == SEVERITY.index("RELAXED_VERIFICATION") + 1
    assert str(PAIR) in DETECTORS["sampling-tail"].causes and str(PAIR) in DETECTORS["sampling-argmax"].causes


@pytest.mark.parametrize("lr", [2.17, -2.17, 3.29, -3.29])
def test_a_margin_below_the_decisive_one_names_the_pair(lr: float) -> None:
    """The llama.cpp margins of the issue (3.29 towards truncation, 2.17 towards acceptance) decide nothing."""
    assert abs(lr) < DECISIVE_EMISSION_MARGIN
    v = decide_verdict(sampler(lr))
    assert v.verdict == PAIR and v.details["rule"] == "4-mechanism-undetermined"
    assert v.details["cause_established"] is False
    assert v.details["cause_confidence"]["decisive"] is False
    assert "not established which" in v.reason and "margin" in v.reason
    assert v.exit_code == 1


def test_a_decisive_margin_names_the_mechanism() -> None:
    m = DECISIVE_EMISSION_MARGIN + 0.5
    v = decide_verdict(sampler(m))
    assert v.verdict == VerdictKind.DECODING_NONCOMPLIANT and v.details["rule"] == "4b-truncated"
    v = decide_verdict(sampler(-m))
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION and v.details["rule"] == "4c-relaxed"
    assert v.details["cause_confidence"]["decisive"] is True
    # speculation seen or unknown: acceptance stands
    assert decide_verdict(sampler(-m), speculation=SPEC).verdict == VerdictKind.RELAXED_VERIFICATION


def test_no_speculation_seen_never_names_relaxed_verification() -> None:
    m = DECISIVE_EMISSION_MARGIN + 0.5
    for lr in (-30.0, -m, -2.17, 2.17):
        v = decide_verdict(sampler(lr), speculation=NO_SPEC)
        assert v.verdict == PAIR, (lr, v.verdict, v.reason)
        assert all(c["verdict"] != "RELAXED_VERIFICATION" for c in v.details["secondary_causes"])
    v = decide_verdict(sampler(-30.0), speculation=NO_SPEC)
    assert "saw no speculation" in v.reason and v.details["speculation"]["detected"] is False
    # a decisive truncation needs no speculation to be named
    assert decide_verdict(sampler(m), speculation=NO_SPEC).verdict == VerdictKind.DECODING_NONCOMPLIANT
    # argmax over-emission alone (tail intact) is lossy acceptance only where speculation may be at work
    res = with_(quiet(), mk("sampling-argmax", 1e-8, excess_per_position=0.09, argmax_rate=0.69, expected_rate=0.6))
    assert decide_verdict(res).verdict == VerdictKind.RELAXED_VERIFICATION
    assert decide_verdict(res, speculation=NO_SPEC).verdict == PAIR


def _tail(rows: np.ndarray, ranks: np.ndarray) -> DetectorResult:
    class _Batch:
        prompt_ids = np.arange(rows.shape[0]) // 24

        def evidence_row(self, i: int, **kw: float) -> dict:
            return {"row": i, **kw}

    view = SamplingView(np.arange(rows.shape[0]), rows[:, :K], ranks, "reference")
    return tail_result(_Batch(), view, "sampling-tail", 0, 5, 0.9)  # type: ignore[arg-type]


def test_a_sampler_that_truncates_at_t1_without_speculating_is_never_relaxed_verification() -> None:
    """llama.cpp's chain (top-k 40, top-p 0.95, min-p 0.05) at temperature 1, not speculating: over seeded audits
    of 150 and 400 sampled tokens the verdict is DECODING_NONCOMPLIANT or the pair, never RELAXED_VERIFICATION
    (before issue 37 item 8 a margin of a few nats towards acceptance named it)."""
    seen = set()
    for seed in range(12):
        rng = np.random.default_rng([37, seed])
        rows = lm_rows(rng, 150 if seed % 2 else 400)
        ranks = draw(rng, rows, "llama-chain")
        tail = _tail(rows, ranks)
        if tail.p_value > 1e-3:
            continue
        arg = mk("sampling-argmax", 1e-6, n=rows.shape[0], excess_per_position=0.03, argmax_rate=0.6,
                 expected_rate=0.55)
        v = decide_verdict(with_(quiet(rows.shape[0]), tail, arg), speculation=NO_SPEC)
        assert v.verdict in (VerdictKind.DECODING_NONCOMPLIANT, PAIR), (seed, v.verdict, v.reason)
        seen.add(v.verdict)
    assert seen, "no simulated audit rejected: the fixture does not exercise rule 4"


def test_preflight_top_p_alone_is_the_pair_when_the_provider_speculates() -> None:
    pre = mk("preflight-top-p", 1e-9, n=150, statistic=0.0, expected=9.4, observed=0)
    v = decide_verdict([*quiet(), pre])
    assert v.verdict == VerdictKind.DECODING_NONCOMPLIANT and v.details["rule"] == "6-preflight-sampling"
    v = decide_verdict([*quiet(), pre], speculation=SPEC)
    assert v.verdict == PAIR and "saw speculation" in v.reason


def test_both_questions_say_what_is_and_is_not_established() -> None:
    v = decide_verdict(sampler(2.17))
    prec, ver = answer_questions(v.verdict, v.details)
    assert ver.answer == "not established"
    assert "lossy speculative acceptance" in ver.evidence and "top-k / top-p / min-p" in ver.evidence
    assert "a decisive audit needs" in ver.evidence
    # precision is answered by its own tests, and says the sampler deviation does not bear on it
    assert prec.answer == "yes" and "does not bear on precision" in prec.evidence
    head = plain_headline(v.verdict, [{"name": r.name, "ran": True, "rejects": r.p_value <= 1e-3,
                                       "p_adjusted": r.p_value, "details": r.details} for r in v.results])
    assert "cannot tell which" in head


def test_the_derived_margin_holds_on_fresh_seeds() -> None:
    """Re-derive the decisive margin on 60 seeds (500 in the benchmark; these seeds are not those): at
    DECISIVE_EMISSION_MARGIN every mechanism is called the wrong family at most 1 + (noise of 60 draws) times,
    while a margin of 0 (the sign alone, the rule before issue 37 item 8) calls several mechanisms wrongly in
    more than 10% of the simulations."""
    ratios = simulate(60, 100, ("typical", "pro-rata-0.1", "top-p-0.95", "llama-chain"), first_seed=10_000)
    at = wrong_rates(ratios, DECISIVE_EMISSION_MARGIN)
    assert max(at.values()) <= 2 / 60, at
    at0 = wrong_rates(ratios, 0.0)
    assert sum(r > 0.10 for r in at0.values()) >= 3, at0
    m = decisive_margin(ratios, max_wrong=2 / 60)
    assert m is not None and m <= DECISIVE_EMISSION_MARGIN
    assert set(TRUNCATION).isdisjoint(ACCEPTANCE)
