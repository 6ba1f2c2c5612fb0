"""The speculation fingerprint against the simulator's own statistics (HTTP on loopback).

The simulator (operator mode) puts each choice's true tokens per speculative round in its final
stream chunk (``simulator.step_stats``); the fingerprint sees only what any client sees: chunk
arrival times and tokens per chunk.
"""

from __future__ import annotations

import asyncio

import pytest

from auditor.detectors.speculation import StreamTiming, estimate_speculation
from probes.client import ProbeClient
from probes.config import ProviderConfig

PROMPTS = [
    "Repeat the following exactly: the quick brown fox jumps over the lazy dog.",
    "Copy this line: alpha beta gamma delta epsilon.",
    "Write a short poem about the sea.",
    "What is 17 times 23?",
]


def collect(base_url: str, n: int, max_tokens: int = 48, workload: str = "repetition"):
    """``n`` streamed greedy chat responses: (StreamTiming list, server tokens, server steps)."""
    cfg = ProviderConfig(name="sim", base_url=base_url, model="sim")

    async def go():
        out = []
        async with ProbeClient(cfg) as c:
            for i in range(n):
                body = {"model": "sim", "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                        "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                out.append(await c.send(body, key=f"p{i}"))
        return out

    res = asyncio.run(go())
    assert all(r.success for r in res), [r.error for r in res]
    timings, tok, steps = [], 0, 0
    for r in res:
        stats = [ch["simulator"] for ch in r.json if isinstance(ch, dict) and ch.get("simulator")]
        assert len(stats) == 1
        tok += sum(stats[0]["tokens_per_step"])
        steps += stats[0]["steps"]
        timings.append(StreamTiming(r.chunk_gaps_s, r.tokens_per_chunk, workload, r.usage["completion_tokens"],
                                    r.ttft_s, r.key))
    return timings, tok, steps


@pytest.mark.parametrize("chunking", ["round", "token"])
def test_ngram_detected_within_half_a_token_of_server_stats(sim_urls, chunking):
    timings, tok, steps = collect(sim_urls[f"ngram-{chunking}"], 6)
    truth = tok / steps
    assert truth > 2.0  # the chain model is predictable: the drafter wins
    est = estimate_speculation(timings)
    assert est.evidence["mode"] == ("step-chunks" if chunking == "round" else "token-chunks"), est.evidence
    assert est.detected is True, est.evidence
    assert abs(est.mean_accepted_tokens_per_step - truth) <= 0.5, (est.to_dict(), truth)


@pytest.mark.parametrize("chunking", ["round", "token"])
def test_no_drafter_is_no_speculation_in_95_percent(sim_urls, chunking):
    trials = 20
    calls = []
    for _ in range(trials):
        timings, tok, steps = collect(sim_urls[f"none-{chunking}"], 4, max_tokens=24)
        assert tok == steps  # plain decoding: one token per round
        calls.append(estimate_speculation(timings, n_boot=300).detected)
    assert sum(c is False for c in calls) >= 19, calls


def test_time_batched_chunks_cannot_tell(sim_urls):
    timings, _, _ = collect(sim_urls["ngram-time"], 6, max_tokens=96)
    est = estimate_speculation(timings)
    assert est.detected is None and est.evidence["mode"] == "time-batched", est.evidence
    assert est.mean_accepted_tokens_per_step is None


def test_server_rejects_unknown_chunking(bigram_lm):
    from simulator.server import create_app

    with pytest.raises(ValueError, match="stream_chunking"):
        create_app("honest-fp32", bigram_lm, stream_chunking="bytes")
    with pytest.raises(ValueError, match="stream_interval_ms"):
        create_app("honest-fp32", bigram_lm, stream_chunking="time", stream_interval_ms=0)
