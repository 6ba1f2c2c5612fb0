"""The speculation fingerprint (auditor.detectors.speculation) on synthetic streams.

Streams come from a known process: each verification step drafts ``k`` tokens accepted one by one
with probability ``alpha`` until the first rejection (Leviathan et al. 2023: a step emits
``min(G, k) + 1`` tokens, mean ``(1 - alpha^(k+1)) / (1 - alpha)``), a step takes a lognormal
forward-pass time, and the server chunks the output per step, per token (near-zero gaps inside a
step) or per time interval. Simulator (HTTP) validation lives in tests/speed/.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from auditor.detectors.speculation import (
    MAX_STEP_TOKENS,
    StreamTiming,
    accepted_by_predictability,
    estimate_speculation,
    fit_log_gap_mixture,
    speculation_line,
    timing_from_records,
)


def true_mean(alpha: float, k: int) -> float:
    """Expected tokens per step of the synthetic process."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def make_stream(rng, *, alpha: float, k: int = 4, n_tokens: int = 120, mode: str = "round", fwd_s: float = 0.02,
                jitter: float = 0.25, intra_s: float = 5e-5, interval_s: float = 0.05, workload: str = "chat",
                key: str = "") -> tuple[StreamTiming, int]:
    """One synthetic streamed response and its true number of steps (the first step is the
    prefill's single token, as every engine streams it)."""
    sizes = [1]
    total = 1
    while total < n_tokens:
        g = 0
        while g < k and rng.random() < alpha:
            g += 1
        s = min(g + 1, n_tokens - total)
        sizes.append(s)
        total += s
    step_gaps = fwd_s * rng.lognormal(0.0, jitter, size=len(sizes))  # time to produce each step
    if mode == "round":
        return StreamTiming(list(step_gaps[1:]), sizes, workload, total, key=key), len(sizes)
    if mode == "token":
        gaps, tpc = [], []
        for i, s in enumerate(sizes):
            if i > 0:
                gaps.append(step_gaps[i])
            gaps.extend(intra_s * rng.lognormal(0.0, 1.0, size=s - 1))
            tpc.extend([1] * s)
        return StreamTiming(gaps, tpc, workload, total, key=key), len(sizes)
    # time-batched: flush whatever was produced every interval_s (+ timer jitter)
    t_done = np.cumsum(step_gaps)
    ends = np.cumsum(sizes)
    tpc, arrivals, t, prev = [], [], 0.0, 0
    while prev < total:
        t += interval_s * (1 + 0.02 * rng.standard_normal())
        ready = int(ends[t_done <= t][-1]) if np.any(t_done <= t) else 0
        if ready > prev:
            tpc.append(ready - prev)
            arrivals.append(t)
            prev = ready
    return StreamTiming(list(np.diff(arrivals)), tpc, workload, total, key=key), len(sizes)


def audit(rng, n: int = 10, **kw) -> tuple[list[StreamTiming], float]:
    """``n`` responses and the realised tokens/steps ratio."""
    out, tok, steps = [], 0, 0
    for i in range(n):
        s, st = make_stream(rng, key=f"p{i}", **kw)
        out.append(s)
        tok += sum(s.tokens_per_chunk)
        steps += st
    return out, tok / steps


def test_step_chunks_speculating_detected_and_estimated():
    rng = np.random.default_rng(1)
    streams, realised = audit(rng, alpha=0.7, k=4)
    est = estimate_speculation(streams)
    assert est.evidence["mode"] == "step-chunks"
    assert est.detected is True
    assert est.mean_accepted_tokens_per_step == pytest.approx(realised, rel=1e-9)
    lo, hi = est.ci95
    assert lo < realised < hi
    d = est.to_dict()
    assert set(d) == {"detected", "mean_accepted_tokens_per_step", "ci95", "evidence"}


@pytest.mark.parametrize("mode", ["round", "token"])
def test_plain_decoding_is_no_speculation_in_95_percent(mode):
    rng = np.random.default_rng(2)
    trials = 60 if mode == "round" else 25
    outcomes = [estimate_speculation(audit(rng, n=6, alpha=0.0, mode=mode, n_tokens=64)[0], n_boot=300).detected
                for _ in range(trials)]
    assert sum(o is False for o in outcomes) >= math.ceil(0.95 * trials)


def test_token_chunks_steps_recovered_from_gap_mixture():
    rng = np.random.default_rng(3)
    streams, realised = audit(rng, alpha=0.6, k=4, mode="token")
    est = estimate_speculation(streams)
    assert est.evidence["mode"] == "token-chunks"
    assert est.detected is True
    assert abs(est.mean_accepted_tokens_per_step - realised) < 0.15
    assert est.evidence["step_gap_threshold_s"] < 0.02  # between 50 µs and 20 ms


def test_time_batched_says_cannot_tell():
    rng = np.random.default_rng(4)
    for alpha in (0.0, 0.7):
        streams, _ = audit(rng, alpha=alpha, mode="time", fwd_s=0.01)
        est = estimate_speculation(streams)
        assert est.evidence["mode"] == "time-batched", est.evidence
        assert est.detected is None and est.mean_accepted_tokens_per_step is None and est.ci95 is None
        assert est.evidence["batching_interval_s"] == pytest.approx(0.05, rel=0.1)


def test_oversized_chunks_are_not_steps():
    rng = np.random.default_rng(5)
    streams = [StreamTiming(list(rng.uniform(0.01, 0.2, 5)), [30, 2, 25, 1, 40, 3], "chat", 101) for _ in range(4)]
    est = estimate_speculation(streams)
    assert est.detected is None and est.evidence["mode"] == "time-batched"
    assert est.evidence["chunks_over_max_step_fraction"] > 0.05
    assert MAX_STEP_TOKENS < 25


def test_interval_calibration_step_chunks():
    """The bootstrap 95% interval covers the process mean in roughly 95% of audits."""
    rng = np.random.default_rng(6)
    alpha, k = 0.5, 4
    mu = true_mean(alpha, k)
    hits = 0
    trials = 150
    for _ in range(trials):
        streams, _ = audit(rng, n=12, alpha=alpha, k=k, n_tokens=400)
        lo, hi = estimate_speculation(streams, n_boot=500).ci95
        hits += lo <= mu <= hi
    assert 0.88 <= hits / trials <= 0.995


def test_power_for_weak_speculation():
    """A weak drafter (alpha 0.3: 1.43 tokens/step) is detected in >= 80% of 10-response audits."""
    rng = np.random.default_rng(7)
    det = [estimate_speculation(audit(rng, n=10, alpha=0.3, n_tokens=64)[0], n_boot=300).detected for _ in range(40)]
    assert sum(d is True for d in det) >= 32


def test_predictability_contrast_and_basis():
    rng = np.random.default_rng(8)
    rep, _ = audit(rng, n=6, alpha=0.85, workload="repetition")
    chat, _ = audit(rng, n=6, alpha=0.1, workload="chat")
    est = estimate_speculation(rep + chat)
    ev = est.evidence
    assert est.detected is True and ev["decision_basis"] == "predictable"
    assert ev["by_workload"]["repetition"]["mean"] > 2 * ev["by_workload"]["chat"]["mean"]
    assert ev["predictable_over_other"] > 1.5 and ev["predictable_over_other_ci95"][0] > 1.0


def test_accepted_length_moves_with_predictability_under_a_verifier_only():
    """Issue 35 item 3: a verifier accepts more drafts on repetition than on chat (acceptance 0.85 vs 0.3), so its
    accepted length grows with predictability; synthetic acceptance (3 drafts per step emitted unverified: every
    step 4 tokens) shows the same length on both. The fingerprint cannot tell fixed-size chunks from a stream
    flushed by token count (time-batched), so the fixed length is read per chunk."""
    rng = np.random.default_rng(13)
    strict = audit(rng, n=6, alpha=0.85, workload="repetition")[0] + audit(rng, n=6, alpha=0.3, workload="chat")[0]
    fixed = audit(rng, n=6, alpha=1.0, k=3, workload="repetition")[0] + audit(rng, n=6, alpha=1.0, k=3, workload="chat")[0]
    s = accepted_by_predictability(estimate_speculation(strict).to_dict())
    assert s is not None and s["per"] == "step" and s["trend"] == "grows", s
    assert s["by_workload"]["repetition"] > 2 * s["by_workload"]["chat"] and s["ci95"][0] > 1.0
    d = estimate_speculation(fixed).to_dict()
    f = accepted_by_predictability(d)
    assert f is not None and f["per"] == "chunk" and f["trend"] == "flat", f
    assert f["by_workload"]["repetition"] == pytest.approx(f["by_workload"]["chat"], rel=0.05)
    assert "3.87 tokens per chunk on repetition prompts, 3.87 on chat (repetition / other 1.00" in speculation_line(d)
    # two answers of a kind give the interval (a short audit streams few repetition answers); one kind only: none
    two = accepted_by_predictability(estimate_speculation(fixed[4:8]).to_dict())
    assert two is not None and two["n_predictable"] == 2 and two["n_other"] == 2 and two["trend"] == "flat", two
    assert accepted_by_predictability(estimate_speculation(strict[:6]).to_dict()) is None
    assert accepted_by_predictability({"detected": None, "evidence": {"mode": "insufficient"}}) is None
    assert accepted_by_predictability(None) is None


def test_malformed_streams_are_rejected_not_raised():
    rng = np.random.default_rng(9)
    good, _ = audit(rng, n=4, alpha=0.0)
    bad = [
        StreamTiming([0.01], [1, 1, 1], key="short-gaps"),
        StreamTiming([-0.5, 0.01], [1, 1, 1], key="negative"),
        StreamTiming([0.01, float("nan")], [1, 1, 1], key="nan"),
        StreamTiming([0.01], [0, 1], key="zero-tokens"),
        StreamTiming(["x"], [1, 1], key="text"),  # type: ignore[list-item]
        StreamTiming([0.01], [1, 1], n_tokens=1, key="usage-too-small"),
    ]
    est = estimate_speculation(good + bad)
    assert est.evidence["n_rejected"] == len(bad)
    assert {r["key"] for r in est.evidence["rejected"]} == {s.key for s in bad}
    assert est.detected is False


def test_too_little_data_is_insufficient():
    est = estimate_speculation([StreamTiming([0.01, 0.01], [1, 2, 1])])
    assert est.detected is None and est.evidence["mode"] == "insufficient"
    assert "usable" in est.evidence["reason"]
    est = estimate_speculation([StreamTiming([0.01], [1, 2]), StreamTiming([0.01], [2, 1])])
    assert est.detected is None and "gaps" in est.evidence["reason"]


def test_inexact_chunk_counts_use_usage_totals():
    """Without logprobs each chunk counts 1; usage's completion_tokens gives the true total."""
    rng = np.random.default_rng(10)
    streams, realised = audit(rng, alpha=0.8)
    blind = [StreamTiming(s.gaps_s, [1] * len(s.tokens_per_chunk), s.workload, s.n_tokens) for s in streams]
    est = estimate_speculation(blind)
    assert est.evidence["tokens_per_chunk_exact"] is False
    assert est.mean_accepted_tokens_per_step == pytest.approx(realised)
    assert est.detected is True


def test_mixture_fit_separates_modes():
    rng = np.random.default_rng(11)
    gaps = np.concatenate([rng.lognormal(math.log(5e-5), 0.5, 300), rng.lognormal(math.log(0.02), 0.2, 200)])
    fit = fit_log_gap_mixture(gaps)
    assert fit["median_gap_s"][0] == pytest.approx(5e-5, rel=0.2)
    assert fit["median_gap_s"][1] == pytest.approx(0.02, rel=0.1)
    assert fit["weights"][0] == pytest.approx(0.6, abs=0.05)
    assert 5e-5 < fit["threshold_s"] < 0.02 and fit["ashman_d"] > 4 and fit["bic_2"] < fit["bic_1"]
    with pytest.raises(ValueError, match="at least 4"):
        fit_log_gap_mixture(np.array([0.1, 0.2]))


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="threshold"):
        estimate_speculation([], threshold=1.0)
    with pytest.raises(ValueError, match="n_boot"):
        estimate_speculation([], n_boot=10)


def test_timing_from_records():
    recs = [
        {"chunk_gaps_s": [0.01, 0.02], "tokens_per_chunk": [1, 3, 2], "workload": "code",
         "usage": {"completion_tokens": 6}, "ttft_s": 0.1, "probe_key": "a#0"},
        {"chunk_gaps_s": None, "tokens_per_chunk": None},  # not streamed: skipped
    ]
    out = timing_from_records(recs)
    assert len(out) == 1 and out[0].n_tokens == 6 and out[0].workload == "code" and out[0].key == "a#0"


def test_speculation_line():
    from auditor.detectors.speculation import speculation_line

    rng = np.random.default_rng(12)
    d = estimate_speculation(audit(rng, alpha=0.8)[0]).to_dict()
    line = speculation_line(d)
    assert line.startswith("speculation: detected") and f"{d['mean_accepted_tokens_per_step']:.2f}" in line
    assert speculation_line({"detected": None, "evidence": {"mode": "time-batched"}}) == "speculation: cannot tell (time-batched)"
    assert speculation_line(None) is None and speculation_line({"x": 1}) is None


def test_fast_steady_stream_flushed_by_time_is_not_steps():
    """A fast plain decoder flushed every 50 ms sends 9-13 tokens per chunk at regular gaps (CI's
    quiet machine: 10-11 tokens per chunk, 30% at the largest size); step sizes would fall off
    from 1, these peak below the largest size, so the fingerprint must say "cannot tell"."""
    for alpha, fwd_s in ((0.0, 0.005), (0.0, 0.004), (0.0, 0.01), (0.5, 0.004)):
        for seed in range(10):
            rng = np.random.default_rng(seed)
            streams, _ = audit(rng, n=6, alpha=alpha, mode="time", fwd_s=fwd_s, jitter=0.05, n_tokens=96,
                               workload="repetition")
            est = estimate_speculation(streams, n_boot=200)
            if est.evidence["mode"] == "insufficient":
                continue
            assert est.evidence["mode"] == "time-batched", (alpha, fwd_s, seed, est.evidence)
            assert est.detected is None


def test_depth_dependent_acceptance_is_still_steps():
    """Tree drafters accept the first drafts more often than the deep ones (EAGLE-2/3): step sizes
    then do not fall off from 1, and the interior-peak rule must tolerate it."""
    accs = [0.97, 0.95, 0.93, 0.9, 0.88, 0.85, 0.8, 0.75]
    for seed in range(10):
        rng = np.random.default_rng(seed)
        streams = []
        for i in range(10):
            sizes, total = [1], 1  # the prefill's token, then verification steps
            while total < 120:
                g = 0
                while g < len(accs) and rng.random() < accs[g]:
                    g += 1
                sizes.append(min(g + 1, 120 - total))
                total += sizes[-1]
            streams.append(StreamTiming(list(0.02 * rng.lognormal(0, 0.1, len(sizes) - 1)), sizes, "chat", total,
                                        key=f"p{i}"))
        est = estimate_speculation(streams, n_boot=200)
        assert est.evidence["mode"] == "step-chunks", est.evidence
        assert est.detected is True


def test_steady_equal_chunks_after_a_gathered_first_chunk_are_time_batched():
    """A server flushing by time at a steady rate sends equal chunks (every chunk 'at the largest
    size', nothing for the interior-peak rule to see) -- but its first chunk already holds several
    tokens, which a step-flushed stream never does (the prefill emits one token)."""
    rng = np.random.default_rng(3)
    streams = [StreamTiming(list(0.05 * rng.lognormal(0, 0.02, 8)), [7] + [11] * 7 + [5], "repetition", 89,
                            key=f"p{i}") for i in range(6)]
    est = estimate_speculation(streams, n_boot=200)
    assert est.evidence["mode"] == "time-batched" and est.detected is None, est.evidence
    assert est.evidence["first_chunk_multi_token_responses"] == 6
    # the same chunk sizes behind the prefill's single token are steps of an always-accepted drafter
    steps = [StreamTiming(list(0.05 * rng.lognormal(0, 0.02, 9)), [1, 11, 11, 11, 11, 11, 11, 11, 11, 5], "repetition",
                          94, key=f"q{i}") for i in range(6)]
    est = estimate_speculation(steps, n_boot=200)
    assert est.evidence["mode"] == "step-chunks" and est.detected is True, est.evidence
