"""vLLM's logprob conventions in the simulator (issue 40, item 2): sampled-first ``top_logprobs`` and
empty-then-whole-character tokens; learned by ``probes.conventions`` and harmless to the pre-flight."""

from __future__ import annotations

import itertools

import pytest

from auditor.check.preflight import run_preflight
from auditor.verdict.decide import decide_verdict
from probes.config import Capabilities, ProviderConfig
from probes.conventions import learn_convention
from probes.normalize import normalize_response
from simulator.profiles import get_profile
from simulator.server import ServerThread, create_app

K = 5


def _chat(client, app, *, stream: bool = False, seed: int = 0, temperature: float = 1.0, max_tokens: int = 48):
    model = client.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Write some maths: √2, ∑ and ∏."}],
            "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "logprobs": True,
            "top_logprobs": K, "stream": stream}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return body, r


@pytest.fixture(scope="module")
def vllm_bodies(tiny_lm):
    from fastapi.testclient import TestClient

    app = create_app("honest-fp32", tiny_lm, seed=0, logprob_convention="vllm")
    with TestClient(app) as c:
        return [_chat(c, app, seed=s) for s in range(6)]


def test_sampled_token_listed_first(vllm_bodies) -> None:
    n_extra = n_low = 0
    for _body, r in vllm_bodies:
        for e in r.json()["choices"][0]["logprobs"]["content"]:
            top = e["top_logprobs"]
            assert top[0]["token"] == e["token"] and top[0]["logprob"] == e["logprob"]
            assert len(top) in (K, K + 1)
            n_extra += len(top) == K + 1
            n_low += top[0]["logprob"] < max(a["logprob"] for a in top[1:])
    assert n_extra > 0 and n_low > 0  # the tiny random model samples outside its top-5 often


def test_partial_characters_empty_then_whole(vllm_bodies) -> None:
    """A character split over tokens: "" (bytes []) tokens, then the whole character; the normalizer
    reproduces the text and the convention is learned."""
    norms, n_empty = [], 0
    for body, r in vllm_bodies:
        content = r.json()["choices"][0]["logprobs"]["content"]
        for a, b in itertools.pairwise(content):
            if a["token"] == "" and a["bytes"] == []:
                n_empty += 1
                assert b["token"] == "" or len(bytes(b["bytes"])) >= 2
        n = normalize_response("chat", body, response=r.json())
        assert "bytes_text_mismatch" not in n.anomalies, n.anomaly_details[:3]
        # the sampled token is always listed: no "chosen not in top" under this convention either
        assert not {"chosen_not_in_top", "mass_exceeds_one", "top_logprobs_short"} & set(n.anomalies), n.anomalies
        norms.append(n)
    assert n_empty > 0
    conv = learn_convention([n.tokens for n in norms], K)
    assert conv.sampled_first and conv.sampled_always_listed and conv.max_entries == K + 1
    assert conv.partial_chars == "empty_then_whole" and conv.certified_m == K


def test_streamed_vllm_chunks_match_non_streamed(tiny_lm) -> None:
    """Streamed chunks carry the same entries, several tokens per chunk (an engine step or a time slice)."""
    import json

    from fastapi.testclient import TestClient

    app = create_app("honest-fp32", tiny_lm, seed=0, logprob_convention="vllm", stream_chunking="time",
                     stream_interval_ms=100.0)
    with TestClient(app) as c:
        body, whole = _chat(c, app, seed=3, max_tokens=96)
        sbody, streamed = _chat(c, app, seed=3, stream=True, max_tokens=96)
    events = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    per_chunk = [len(ch["logprobs"]["content"]) for ev in events for ch in ev["choices"] if ch.get("logprobs")]
    got = [e for ev in events for ch in ev["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert got == whole.json()["choices"][0]["logprobs"]["content"]
    assert max(per_chunk) >= 2  # multi-token chunks (what was ready each 100 ms), each token with its own entry
    ns = normalize_response("chat", sbody, response_text=streamed.text, stream=True)
    nw = normalize_response("chat", body, response=whole.json())
    assert ns.text == nw.text and [t.bytes for t in ns.tokens] == [t.bytes for t in nw.tokens]
    assert "bytes_text_mismatch" not in ns.anomalies, ns.anomaly_details[:3]


def test_openai_convention_is_the_default(tiny_lm) -> None:
    from fastapi.testclient import TestClient

    with TestClient(create_app("honest-fp32", tiny_lm, seed=0)) as c:
        body, r = _chat(c, None, seed=1)
    n = normalize_response("chat", body, response=r.json())
    conv = learn_convention([n.tokens], K)
    assert not conv.sampled_first and conv.max_entries == K and conv.certified_m is None
    with pytest.raises(ValueError, match="logprob_convention"):
        create_app("honest-fp32", tiny_lm, logprob_convention="sglang")


def _preflight(lm, convention: str, **overrides):
    import fastapi.testclient as tc

    app = create_app(get_profile("honest-fp32", **overrides), lm, seed=0, logprob_convention=convention)
    with tc.TestClient(app) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
    with ServerThread(app) as srv:
        cfg = ProviderConfig(name="sim", base_url=srv.base_url, model=model,
                             capabilities=Capabilities(max_top_logprobs=5, seed=True))
        return run_preflight(cfg, lm.tokenizer, max_tokens=64)


def test_preflight_honest_vllm_is_not_decoding_noncompliant(peaked_lm) -> None:
    """Issue 40: an honest vLLM was DECODING_NONCOMPLIANT (0 sampled tokens outside the list, 32 expected)."""
    rep = _preflight(peaked_lm, "vllm")
    tp = rep.check("top-p")
    assert tp.passed is True, tp.summary
    assert tp.evidence["logprob_convention"] == "sampled-first" and tp.evidence["certified_m"] == 5
    assert tp.evidence["expected_unlisted"] > 1 and tp.evidence["observed_unlisted"] > 0
    assert rep.convention["name"] == "sampled-first"
    assert decide_verdict(rep.detector_results()).verdict != "DECODING_NONCOMPLIANT"


def test_preflight_vllm_server_top_k_still_caught(peaked_lm) -> None:
    rep = _preflight(peaked_lm, "vllm", forced_top_k=3)
    c = rep.check("top-p")
    assert c.passed is False and c.p_value < 1e-4, c.summary


@pytest.mark.parametrize("convention", ["openai", "vllm"])
def test_providers_probe_records_the_convention(tiny_lm, convention) -> None:
    """``auditor providers probe`` (discover_capabilities) learns the convention from its seeded answers."""
    import asyncio

    import fastapi.testclient as tc

    from probes.discover import discover_capabilities

    app = create_app("honest-fp32", tiny_lm, seed=0, logprob_convention=convention)
    with tc.TestClient(app) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
    with ServerThread(app) as srv:
        rep = asyncio.run(discover_capabilities(ProviderConfig(name="sim", base_url=srv.base_url, model=model)))
    check = next(c for c in rep.checks if c.name == "logprob_convention")
    want = "sampled-first" if convention == "vllm" else "ranked"
    assert rep.convention is not None and rep.convention["name"] == want and check.value == want, check.detail
