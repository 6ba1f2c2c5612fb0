"""Detectors on synthetic batches whose answer is known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from auditor.detectors import DETECTORS, EvidenceBatch, run_detectors
from auditor.detectors.consistency import self_argmax, self_gof, self_greedy, self_tail
from auditor.detectors.greedy import MIN_HONEST_CLEAR_RATE, greedy_match
from auditor.detectors.logprob import logprob_divergence
from auditor.detectors.noise_floor import DEFAULT_MARGIN_BAND
from auditor.detectors.sampling import sampling_argmax, sampling_gof, sampling_tail


def _fixed_batch(
    n, probs, tokens, temperature, provider_probs=None, provider_ids=None, prompts=5
):
    """n positions sharing one reference distribution `probs` over ids 0..len-1."""
    probs = np.asarray(probs, float)
    ids = np.tile(np.arange(probs.size), (n, 1))
    lp = np.tile(np.log(probs), (n, 1))
    kw = {}
    if provider_probs is not None:
        pp = np.asarray(provider_probs, float)
        pid = np.tile(
            np.arange(pp.size) if provider_ids is None else np.asarray(provider_ids),
            (n, 1),
        )
        kw = {
            "provider_top_ids": pid,
            "provider_top_logprobs": np.tile(np.log(pp), (n, 1)),
        }
    return EvidenceBatch.from_arrays(
        prompt_ids=[f"p{i % prompts}" for i in range(n)],
        token_ids=tokens,
        temperatures=temperature,
        ref_top_ids=ids,
        ref_top_logprobs=lp,
        **kw,
    )


# ----------------------------------------------------------------------------- greedy
def test_greedy_match_counts_clear_and_near_tie_mismatches():
    # argmax 0 (p=.5); token 1 is a near tie (gap log(.5/.49)=0.02), token 2 is clear (gap log(.5/.01)=3.9)
    probs = [0.5, 0.49, 0.01]
    tokens = np.zeros(100, int)
    tokens[:3] = 2
    tokens[3:7] = 1
    r = greedy_match(_fixed_batch(100, probs, tokens, 0.0))
    assert r.ran and r.n == 100
    assert (
        r.statistic == 3
        and r.details["n_near_tie"] == 4
        and r.details["n_mismatch"] == 7
    )
    assert r.details["band"] == DEFAULT_MARGIN_BAND and "no noise floor" in r.reason
    assert r.p_value == pytest.approx(stats.binom.sf(2, 100, MIN_HONEST_CLEAR_RATE))
    assert r.effect == pytest.approx(0.03)
    lo, hi = r.effect_ci
    assert lo < 0.03 < hi
    assert r.details["match_rate"] == pytest.approx(0.93)
    assert [e["clear"] for e in r.evidence[:3]] == [True] * 3
    assert r.evidence[0]["gap"] == pytest.approx(np.log(50), abs=1e-6)
    assert r.evidence[0]["ref_top5"][0][0] == 0


def test_greedy_match_not_run_without_reference_or_data():
    b = EvidenceBatch.from_arrays(
        prompt_ids=["a"] * 20, token_ids=np.zeros(20, int), temperatures=0.0
    )
    assert not greedy_match(b).ran
    few = _fixed_batch(5, [0.6, 0.4], np.zeros(5, int), 0.0)
    r = greedy_match(few)
    assert not r.ran and "too few" in r.reason and math.isnan(r.p_value)
    sampled = _fixed_batch(50, [0.6, 0.4], np.zeros(50, int), 1.0)
    assert not greedy_match(sampled).ran


def test_self_greedy_uses_own_top1_and_bounds_unlisted_tokens():
    # provider reports {0: .6, 1: .3}; emits 1 (gap log 2 = .69 > band .5) at 4, emits 5 (unlisted) at 2
    n = 60
    tokens = np.zeros(n, int)
    tokens[:4] = 1
    tokens[4:6] = 5
    b = _fixed_batch(n, [0.6, 0.3, 0.1], tokens, 0.0, provider_probs=[0.6, 0.3])
    r = self_greedy(b)
    assert r.statistic == 6 and r.details["n_contradiction"] == 6
    gaps = sorted(e["gap"] for e in r.evidence)
    # unlisted: p(5) <= min(p_last=.3, 1-.9=.1) -> gap >= log(.6/.1)
    assert gaps[-1] == pytest.approx(np.log(6), abs=1e-6)
    assert gaps[0] == pytest.approx(np.log(2), abs=1e-6)
    assert r.p_value == pytest.approx(stats.binom.sf(5, n, MIN_HONEST_CLEAR_RATE))
    # a near-tie contradiction is not evidence
    b2 = _fixed_batch(
        n,
        [0.5, 0.49],
        np.r_[np.ones(5, int), np.zeros(n - 5, int)],
        0.0,
        provider_probs=[0.5, 0.49],
    )
    r2 = self_greedy(b2)
    assert r2.statistic == 0 and r2.details["n_near_tie"] == 5 and r2.p_value == 1.0


# ----------------------------------------------------------------------------- logprob
def test_logprob_divergence_zero_for_exact_reports_and_large_for_tempered(synth):
    rng = np.random.default_rng(0)
    floor = synth.make_floor(rng, top_m=(5,))
    g, L = 6, 20
    ref = synth.dirichlet_logprobs(rng, g, L)
    tok = ref.argmax(1)
    exact = synth.make_batch(
        rng, ref, ref, tok, 0.0, synth.prompt_labels(g, L), m_provider=5
    )
    r = logprob_divergence(exact, floor)
    assert r.ran and r.n == g * L and r.details["m"] == 5
    assert r.effect == pytest.approx(0.0, abs=1e-9) and r.p_value > 0.99
    assert r.details["top1_agreement"] == 1.0
    hot = synth.normalise(ref / 0.7)
    r2 = logprob_divergence(
        synth.make_batch(
            rng, ref, hot, tok, 0.0, synth.prompt_labels(g, L), m_provider=5
        ),
        floor,
    )
    assert r2.p_value < 1e-6 and r2.details["ratio_to_floor"] > 10
    lo, hi = r2.effect_ci
    assert lo <= r2.effect <= hi
    assert r2.evidence[0]["kl"] >= r2.evidence[-1]["kl"]


def test_logprob_test_width_option_tests_the_narrower_kl(synth, monkeypatch):
    """TEST_WIDTH (measured, not the default: docs/detectors.md) computes y on the top-1 KL against
    the floor's width-1 record while the effect keeps every listed alternative."""
    import auditor.detectors.logprob as lp

    rng = np.random.default_rng(3)
    floor = synth.make_floor(rng, top_m=(1, 5))
    g, L = 6, 20
    ref = synth.dirichlet_logprobs(rng, g, L)
    hot = synth.normalise(ref / 0.7)
    b = synth.make_batch(rng, ref, hot, ref.argmax(1), 0.0, synth.prompt_labels(g, L), m_provider=5)
    wide = logprob_divergence(b, floor)
    monkeypatch.setattr(lp, "TEST_WIDTH", 1)
    narrow = logprob_divergence(b, floor)
    assert wide.details["test_m"] == 5 and narrow.details["test_m"] == 1 and narrow.details["m"] == 5
    assert narrow.effect == wide.effect  # the effect is the listed width's mean KL
    assert narrow.details["null_mean_y"] == floor.kl_floor(1).null_mean(b.positions)[0]
    assert narrow.statistic != wide.statistic


def test_logprob_divergence_needs_floor_and_lists(synth):
    rng = np.random.default_rng(1)
    ref = synth.dirichlet_logprobs(rng, 3, 10)
    b = synth.make_batch(
        rng, ref, ref, ref.argmax(1), 0.0, synth.prompt_labels(3, 10), m_provider=5
    )
    r = logprob_divergence(b, None)
    assert not r.ran and "noise floor" in r.reason
    floor20 = synth.make_floor(rng, n_prompts=5, length=10, top_m=(20,))
    r = logprob_divergence(b, floor20)  # provider lists 5, floor only for 20
    assert not r.ran and "no width" in r.reason
    nolp = synth.make_batch(
        rng, ref, ref, ref.argmax(1), 0.0, synth.prompt_labels(3, 10), m_provider=0
    )
    assert not logprob_divergence(nolp, floor20).ran


# ----------------------------------------------------------------------------- sampling
def test_argmax_and_tail_closed_form_when_argmax_always_emitted():
    # p = (.5, .45, .05): nucleus(0.9) = {0, 1}, tail mass .05; argmax always emitted
    n = 100
    b = _fixed_batch(n, [0.5, 0.45, 0.05], np.zeros(n, int), 1.0)
    a = sampling_argmax(b)
    assert a.details["observed"] == n and a.details["expected"] == pytest.approx(50)
    assert a.p_value == pytest.approx(0.5**n, rel=1e-6)
    assert a.effect == pytest.approx(0.5) and a.statistic == pytest.approx(
        50 / np.sqrt(25)
    )
    t = sampling_tail(b)
    assert t.details["observed"] == 0 and t.details["expected"] == pytest.approx(5)
    assert t.p_value == pytest.approx(0.95**n, rel=1e-6)
    assert t.effect == 0.0 and t.details["deficit_per_position"] == pytest.approx(0.05)
    g = sampling_gof(b)
    assert g.p_value < 1e-6 and g.effect < -0.2  # U ~ U(0, .5): mean .25


def test_argmax_test_counts_only_positions_with_a_large_argmax_probability():
    """Excess where p(argmax) < ARGMAX_TEST_MIN_P is not tested (no relaxed rule accepts there);
    the same excess where p(argmax) is large is; the reported effect covers every position."""
    from auditor.detectors.sampling import ARGMAX_TEST_MIN_P, SamplingView, argmax_test

    n = 200
    low = np.tile([0.2, 0.2, 0.2, 0.2, 0.2], (n, 1))  # p(argmax) 0.2 < 0.3
    high = np.tile([0.6, 0.2, 0.1, 0.05, 0.05], (n, 1))
    rng = np.random.default_rng(0)
    honest_high = (rng.random(n) >= 0.6).astype(int)  # argmax with probability 0.6
    view = SamplingView(np.arange(2 * n), np.vstack([low, high]), np.concatenate([np.zeros(n, int), honest_high]), "reference")
    t = argmax_test(view, 0)
    assert pytest.approx(0.3) == ARGMAX_TEST_MIN_P and t["n_tested"] == n
    assert t["p_value"] > 0.01 and t["effect"] > 0.3  # excess only at low p(argmax): not tested, but reported
    all_pos = argmax_test(view, 0, min_p=0.0)
    assert all_pos["n_tested"] == 2 * n and all_pos["p_value"] < 1e-10
    view2 = SamplingView(np.arange(n), high, np.zeros(n, int), "reference")  # always the argmax at p = 0.6
    assert argmax_test(view2, 0)["p_value"] < 1e-10


def test_sampling_exact_draws_pass(synth):
    rng = np.random.default_rng(2)
    g, L = 10, 30
    ref = synth.dirichlet_logprobs(rng, g, L)
    tok = synth.sample_rows(rng, ref)
    b = synth.make_batch(
        rng, ref, ref, tok, 1.0, synth.prompt_labels(g, L), m_provider=5
    )
    for fn in (
        sampling_gof,
        sampling_argmax,
        sampling_tail,
        self_gof,
        self_argmax,
        self_tail,
    ):
        r = fn(b, None, rng=3)
        assert r.ran and r.n == g * L, r.name
        assert r.p_value > 1e-3, (r.name, r.p_value)


def test_full_rows_allow_other_temperatures(synth):
    rng = np.random.default_rng(4)
    g, L = 6, 30
    ref = synth.dirichlet_logprobs(rng, g, L)
    t = 0.7
    tok = synth.sample_rows(rng, synth.normalise(ref / t))
    b = synth.make_batch(
        rng, ref, ref, tok, t, synth.prompt_labels(g, L), m_provider=0, full=True
    )
    r = sampling_argmax(b)
    assert r.ran and r.n == g * L and r.p_value > 1e-3
    # the same tokens judged as if T=1 (top-K only) would not run at T=0.7
    b2 = synth.make_batch(
        rng, ref, ref, tok, t, synth.prompt_labels(g, L), m_provider=0
    )
    assert not sampling_argmax(b2).ran


def test_self_tests_skip_untrusted_and_other_temperatures(synth):
    rng = np.random.default_rng(5)
    ref = synth.dirichlet_logprobs(rng, 4, 10)
    tok = synth.sample_rows(rng, ref)
    b = synth.make_batch(rng, ref, ref, tok, 1.0, synth.prompt_labels(4, 10))
    b.provider_trusted[:] = False
    assert not self_gof(b).ran and "trusted" in self_gof(b).reason
    b0 = synth.make_batch(rng, ref, ref, tok, 0.5, synth.prompt_labels(4, 10))
    assert not self_argmax(b0).ran


# ----------------------------------------------------------------------------- registry
def test_run_detectors_selection_and_reproducibility(synth):
    rng = np.random.default_rng(6)
    floor = synth.make_floor(rng, top_m=(5,))
    b = synth.audit(rng, "honest-noisy")
    res = run_detectors(b, floor, seed=7)
    names = [r.name for r in res]
    assert (
        "self-gof" not in names and "self-greedy" in names and "greedy-match" in names
    )
    again = run_detectors(b, floor, seed=7)
    assert [r.p_value for r in res] == [r.p_value for r in again]
    all_names = [r.name for r in run_detectors(b, floor, self_consistency=True)]
    assert all_names == list(DETECTORS)
    b_noref = EvidenceBatch.from_arrays(
        prompt_ids=b.prompt_ids,
        token_ids=b.token_ids,
        temperatures=b.temperatures,
        provider_top_ids=b.provider_top_ids,
        provider_top_logprobs=b.provider_top_logprobs,
        provider_token_logprobs=b.provider_token_logprobs,
    )
    res2 = {r.name: r for r in run_detectors(b_noref, floor)}
    assert res2["self-gof"].ran and not res2["greedy-match"].ran
    with pytest.raises(KeyError, match="known"):
        run_detectors(b, floor, names=["nope"])


def test_empty_and_per_position_paths_end_to_end(synth):
    from auditor.detectors import PositionEvidence
    from auditor.verdict.decide import decide_verdict
    from auditor.verdict.kinds import VerdictKind

    empty = EvidenceBatch.from_positions([])
    res = run_detectors(empty, None)
    assert not any(r.ran for r in res)
    assert decide_verdict(res).verdict == VerdictKind.INCONCLUSIVE
    # per-position records, as the pipeline builds them, for a greedy provider serving the runner-up
    rng = np.random.default_rng(9)
    ref = synth.dirichlet_logprobs(rng, 6, 20)
    order = np.argsort(-ref, axis=1)
    items = []
    for i, row in enumerate(ref):
        tok = int(order[i, 1] if i % 4 == 0 else order[i, 0])
        top = order[i, :20]
        items.append(
            PositionEvidence(
                prompt_id=f"p{i // 20}",
                position=i % 20,
                token_id=tok,
                temperature=0.0,
                ref_top_ids=top,
                ref_top_logprobs=row[top],
                ref_token_logprob=float(row[tok]),
                provider_top={int(t): float(row[t]) for t in order[i, :5]},
            )
        )
    b = EvidenceBatch.from_positions(items)
    floor = synth.make_floor(rng, top_m=(5,))
    v = decide_verdict(run_detectors(b, floor), floor=floor)
    assert v.verdict == VerdictKind.DECODING_NONCOMPLIANT
