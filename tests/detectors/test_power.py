"""POWER: under known alternatives the detectors reject and the verdict names the right cause.

Each profile is audited N_POWER times with independent seeds at a moderate budget; at least
MIN_CORRECT of them must get the intended verdict (and the deciding detector must reject).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from auditor.detectors import EvidenceBatch, run_detectors
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind

N_POWER = 20
MIN_CORRECT = 0.9


@pytest.fixture(scope="module")
def floor(synth):
    return synth, synth.make_floor(
        np.random.default_rng(99),
        n_prompts=80,
        length=24,
        sigma_honest=0.02,
        top_m=(5,),
    )


CASES = [
    # id, profile, profile kwargs, audit kwargs, expected verdict, detector that must reject
    (
        "int-noise",
        "quantized",
        {"sigma_q": 0.3},
        {},
        VerdictKind.QUANTIZATION,
        "logprob-divergence",
    ),
    (
        "tempered",
        "quantized",
        {"tau": 0.8},
        {},
        VerdictKind.QUANTIZATION,
        "logprob-divergence",
    ),
    (
        # an unrelated model (independent Dirichlet rows): the divergence is so large that no
        # position is confident relative to it, so rule 2's flip test cannot name the cause
        # (details["cause_confidence"]["informative"] is False); the far divergence (mean KL >=
        # SUBSTITUTION_MIN_MEAN_KL with top-1 agreement <= SUBSTITUTION_MAX_TOP1_AGREEMENT) establishes that the
        # declared weights are not served at their precision, not which cause: QUANTIZATION_OR_SUBSTITUTION
        "substituted-unrelated",
        "substituted",
        {},
        {},
        VerdictKind.QUANTIZATION_OR_SUBSTITUTION,
        "logprob-divergence",
    ),
    (
        "substituted",
        "substituted-related",
        {"sigma_q": 0.3, "swap": 0.2},
        {},
        VerdictKind.SUBSTITUTION,
        "logprob-divergence",
    ),
    (
        "greedy-only-quantized",
        "quantized",
        {"sigma_q": 0.3},
        {"with_logprobs": False, "n_sampling": 0},
        VerdictKind.QUANTIZATION,
        "greedy-match",
    ),
    (
        "greedy-only-substituted",
        "substituted",
        {},
        {"with_logprobs": False, "n_sampling": 0},
        VerdictKind.QUANTIZATION_OR_SUBSTITUTION,  # greedy tokens alone cannot tell 3-bit weights from another model
        "greedy-match",
    ),
    (
        "relaxed-threshold",
        "relaxed",
        {"s": 0.5},
        {"n_greedy": 2, "n_sampling": 40},
        VerdictKind.RELAXED_VERIFICATION,
        "sampling-argmax",
    ),
    (
        "truncated-top-p",
        "truncated",
        {"top_p": 0.9},
        {"n_greedy": 2, "n_sampling": 30},
        VerdictKind.DECODING_NONCOMPLIANT,
        "sampling-tail",
    ),
    (
        "greedy-served",
        "greedy-served",
        {},
        {"n_greedy": 2, "n_sampling": 4},
        VerdictKind.DECODING_NONCOMPLIANT,
        "sampling-argmax",
    ),
    (
        "decode-mismatch",
        "decode-mismatch",
        {"mismatch_frac": 0.1},
        {"n_greedy": 8},
        VerdictKind.DECODING_NONCOMPLIANT,
        "self-greedy",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_alternative_detected_and_cause_named(floor, case):
    mod, fl = floor
    _, profile, pkw, akw, want, detector = case
    rng = np.random.default_rng(zlib.crc32(case[0].encode()))
    correct, rejected = 0, 0
    seen = []
    for i in range(N_POWER):
        b = mod.audit(rng, profile, **pkw, **akw)
        v = decide_verdict(run_detectors(b, fl, seed=i), floor=fl)
        seen.append(v.details["rule"])
        correct += v.verdict == want
        rejected += any(f["detector"] == detector for f in v.details["findings"])
    assert correct >= MIN_CORRECT * N_POWER, (
        f"{case[0]}: verdict right in {correct}/{N_POWER}; rules {seen}"
    )
    assert rejected >= MIN_CORRECT * N_POWER, (
        f"{case[0]}: {detector} rejected in {rejected}/{N_POWER}"
    )


def _strip_reference(b: EvidenceBatch) -> EvidenceBatch:
    return EvidenceBatch.from_arrays(
        prompt_ids=b.prompt_ids,
        token_ids=b.token_ids,
        temperatures=b.temperatures,
        provider_top_ids=b.provider_top_ids,
        provider_top_logprobs=b.provider_top_logprobs,
        provider_token_logprobs=b.provider_token_logprobs,
    )


@pytest.mark.parametrize(
    "profile, pkw, akw, want",
    [
        (
            "relaxed",
            {"s": 0.5},
            {"n_greedy": 2, "n_sampling": 40},
            VerdictKind.RELAXED_VERIFICATION,
        ),
        (
            "decode-mismatch",
            {"mismatch_frac": 0.1},
            {"n_greedy": 8, "n_sampling": 2},
            VerdictKind.DECODING_NONCOMPLIANT,
        ),
        ("honest-noisy", {}, {"n_greedy": 8, "n_sampling": 30}, VerdictKind.PASS),
    ],
    ids=["relaxed", "decode-mismatch", "honest"],
)
def test_self_consistency_without_reference(floor, profile, pkw, akw, want):
    """No reference model at all: the provider's own logprobs still name the cause."""
    mod, fl = floor
    rng = np.random.default_rng(5)
    good = 0
    for i in range(N_POWER // 2):
        b = _strip_reference(mod.audit(rng, profile, **pkw, **akw))
        res = run_detectors(b, fl, seed=i)
        assert {r.name for r in res if r.ran} <= {
            "self-gof",
            "self-argmax",
            "self-tail",
            "self-greedy",
        }
        good += decide_verdict(res, floor=fl).verdict == want
    assert good >= MIN_CORRECT * (N_POWER // 2)


def test_effect_sizes_order_with_severity(floor):
    """Stronger degradation -> larger effect: KL ratio for noise, argmax excess for threshold."""
    mod, fl = floor
    rng = np.random.default_rng(8)
    kl = []
    for sq in (0.05, 0.2, 0.8):
        b = mod.audit(rng, "quantized", sigma_q=sq, n_greedy=6, n_sampling=0)
        kl.append(
            {r.name: r for r in run_detectors(b, fl)}["logprob-divergence"].effect
        )
    assert kl[0] < kl[1] < kl[2]
    exc = []
    for s in (0.9, 0.5, 0.2):
        b = mod.audit(rng, "relaxed", s=s, n_greedy=0, n_sampling=40)
        exc.append({r.name: r for r in run_detectors(b, fl)}["sampling-argmax"].effect)
    assert exc[0] < exc[1] < exc[2]
