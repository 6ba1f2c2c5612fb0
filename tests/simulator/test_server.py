"""The OpenAI-compatible server: the official client over real HTTP, wire format, errors, faults."""

from __future__ import annotations

import json
import math
import time

import httpx
import numpy as np
import pytest
from scipy import stats

from simulator.faults import FAULT_KINDS, FaultInjector
from simulator.server import ServerThread, create_app

NAME = "tiny-llama-seed0"
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def relaxed_app(tiny_lm):
    return create_app("relaxed-threshold", tiny_lm, seed=0)


@pytest.fixture(scope="module")
def server(relaxed_app):
    with ServerThread(relaxed_app) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(server):
    from openai import OpenAI

    with OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=60) as c:
        yield c


def test_official_client_chat_logprobs_n_and_seed(oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [NAME]
    r = oai.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, logprobs=True, top_logprobs=5,
                                    n=2, seed=7, temperature=1.0)
    assert len(r.choices) == 2 and r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    for c in r.choices:
        assert c.finish_reason in ("stop", "length")
        content = c.logprobs.content
        assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", errors="replace") == c.message.content
        for t in content:
            assert len(t.top_logprobs) == 5 and t.logprob <= 0
            assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    again = oai.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, n=2, seed=7, temperature=1.0)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    assert r.choices[0].message.content != r.choices[1].message.content
    assert getattr(r, "system_fingerprint", None) is None


def test_official_client_streaming_one_chunk_per_round(oai):
    stream = oai.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, stream=True, logprobs=True,
                                         top_logprobs=2, temperature=0.0, stream_options={"include_usage": True})
    text, n_tok, finish, usage = "", 0, None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                n_tok += len(ch.logprobs.content)
            finish = ch.finish_reason or finish
    assert finish in ("stop", "length") and usage.completion_tokens == n_tok > 0
    full = oai.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, temperature=0.0)
    assert text == full.choices[0].message.content


def test_official_client_completions_echo(oai):
    r = oai.completions.create(model=NAME, prompt="The cat sat on the", max_tokens=3, logprobs=2, echo=True,
                               temperature=0)
    lp = r.choices[0].logprobs
    n_prompt = r.usage.prompt_tokens
    assert r.choices[0].text.startswith("The cat sat on the")
    assert len(lp.tokens) == n_prompt + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None for x in lp.token_logprobs[1:])
    assert all(len(d) in (2, 3) for d in lp.top_logprobs[1:])  # top-2 plus the chosen token
    assert lp.text_offset[:2] == [0, 3]
    s = oai.completions.create(model=NAME, prompt=["a b", "c d"], max_tokens=2, n=2, temperature=0.5, seed=1)
    assert sorted(c.index for c in s.choices) == [0, 1, 2, 3]


def test_stream_chunks_follow_speculative_rounds(tiny_lm, client):
    """Each SSE chunk carries exactly the tokens one target forward emitted."""
    from reference.drafters import SequenceDrafter

    app = create_app("honest-fp32", tiny_lm, k=4, adaptive_k=False)
    eng = app.state.sim.engine
    c = client(app)
    body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 11, "temperature": 0, "logprobs": 0}
    ref = c.post("/v1/completions", json=body).json()
    ids = eng.encode_text("Once upon a time")
    greedy_ids = [t.token_id for t in eng.generate(ids, max_tokens=11, temperature=0.0).tokens]
    eng.drafter = SequenceDrafter(ids + greedy_ids)
    with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    sizes = [len(ch["choices"][0]["logprobs"]["tokens"]) for ch in chunks if ch["choices"][0]["logprobs"]]
    assert sum(sizes) == 11 and sizes.count(5) == 2
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == ref["choices"][0]["text"]


def test_first_token_histogram_fits_the_reference(peaked_lm, client):
    """honest-fp32 sampling at T=1: first tokens over many seeds fit the reference law (chi-square)."""
    import torch

    app = create_app("honest-fp32", peaked_lm)
    c = client(app)
    eng = app.state.sim.engine
    ids = eng.encode_text("The cat sat on the")
    with torch.inference_mode():
        logits = peaked_lm.model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    p = torch.softmax(logits, -1).numpy()
    n_req, n_per = 25, 16
    order = np.argsort(-p)
    top = [int(t) for t in order if p[t] * n_req * n_per >= 10][:6]
    assert len(top) >= 2
    bin_of = {eng.token_str(t): i for i, t in enumerate(top)}
    counts = np.zeros(len(top) + 1)
    for s in range(n_req):
        r = c.post("/v1/completions", json={"model": "tiny-peaked", "prompt": ids, "max_tokens": 1, "n": n_per,
                                            "seed": s, "temperature": 1.0, "logprobs": 0}).json()
        for ch in r["choices"]:
            counts[bin_of.get(ch["logprobs"]["tokens"][0], len(top))] += 1
    expected = np.append(p[top], 1 - p[top].sum()) * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # power check: the same counts do not fit the T=1.5 law
    p1 = torch.softmax(logits / 1.5, -1).numpy()
    assert stats.chisquare(counts, np.append(p1[top], 1 - p1[top].sum()) * counts.sum()).pvalue < 1e-3


BAD = [
    ({"model": "gpt-4", "messages": CHAT}, "model"),
    ({"model": NAME, "messages": CHAT, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"model": NAME, "messages": CHAT, "max_tokens": -5}, "max_tokens"),
    ({"model": NAME, "messages": CHAT, "max_tokens": "5"}, "max_tokens"),
    ({"model": NAME, "messages": CHAT, "temperature": "hot"}, "temperature"),
    ({"model": NAME, "messages": CHAT, "temperature": 3}, "temperature"),
    ({"model": NAME, "messages": CHAT, "top_p": 0}, "top_p"),
    ({"model": NAME, "messages": CHAT, "n": 0}, "n"),
    ({"model": NAME, "messages": "hello"}, "messages"),
    ({"model": NAME, "messages": []}, "messages"),
    ({"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"model": NAME, "messages": CHAT, "top_logprobs": 3}, None),
    ({"model": NAME, "messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": NAME, "messages": CHAT, "presence_penalty": 1.0}, None),
    ({"model": NAME, "messages": CHAT, "max_tokens": 10**6}, "max_tokens"),
    ({"messages": CHAT}, "model"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_chat_requests_get_openai_400(relaxed_app, client, body, param):
    r = client(relaxed_app).post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param:
        assert err["param"] == param


@pytest.mark.parametrize(
    "raw,path",
    [
        (b"{not json", "/v1/chat/completions"),
        (b"[1, 2]", "/v1/chat/completions"),
        (b"", "/v1/completions"),
        (json.dumps({"model": NAME, "prompt": "x", "logprobs": 6}).encode(), "/v1/completions"),
        (json.dumps({"model": NAME, "prompt": "x", "max_tokens": -1}).encode(), "/v1/completions"),
        (json.dumps({"model": NAME, "prompt": [10**7]}).encode(), "/v1/completions"),
        (json.dumps({"model": NAME, "prompt": []}).encode(), "/v1/completions"),
        (json.dumps({"model": NAME, "prompt": "x", "echo": "yes"}).encode(), "/v1/completions"),
    ],
)
def test_malformed_bodies_get_400(relaxed_app, client, raw, path):
    r = client(relaxed_app).post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_unknown_route_and_method_are_openai_errors(relaxed_app, client):
    c = client(relaxed_app)
    assert c.get("/v1/nope").status_code == 404 and "error" in c.get("/v1/nope").json()
    r = c.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_profile_hidden_unless_exposed(tiny_lm, client):
    hidden = client(create_app("int4", tiny_lm))
    r = hidden.post("/v1/chat/completions", json={"model": NAME, "messages": CHAT, "max_tokens": 2})
    assert "x-simulator-profile" not in r.headers
    blob = (r.text + hidden.get("/v1/models").text).lower()
    for word in ("int4", "quant", "profile", "simulator", "relaxed", "fingerprint"):
        assert word not in blob
    shown = client(create_app("int4", tiny_lm, expose_profile=True, served_model_name="gpt-x"))
    r = shown.post("/v1/chat/completions", json={"model": "gpt-x", "messages": CHAT, "max_tokens": 2})
    assert r.headers["x-simulator-profile"] == "int4" and r.json()["system_fingerprint"].startswith("fp_")
    card = shown.get("/v1/models").json()["data"][0]
    assert card["id"] == "gpt-x" and card["simulator"]["profile"]["name"] == "int4"
    assert card["simulator"]["build"]["quant"]["scheme"] == "int4"


def test_fault_injector_is_seeded_and_hits_its_rate():
    inj1, inj2 = FaultInjector(0.3, seed=5), FaultInjector(0.3, seed=5)
    seq1 = [inj1.draw() for _ in range(400)]
    assert seq1 == [inj2.draw() for _ in range(400)]
    assert seq1 != [FaultInjector(0.3, seed=6).draw() for _ in range(400)]
    n = sum(x is not None for x in seq1)
    assert stats.binomtest(n, 400, 0.3).pvalue > 1e-3
    assert set(seq1) - {None} == set(FAULT_KINDS)
    with pytest.raises(ValueError, match="rate"):
        FaultInjector(1.5)


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind(tiny_lm, client, kind):
    inj = FaultInjector(1.0, seed=0, delay_s=0.3, kinds=(kind,))
    c = client(create_app("honest-fp32", tiny_lm, faults=inj, expose_profile=True))
    body = {"model": NAME, "messages": CHAT, "max_tokens": 4, "temperature": 0}
    t0 = time.perf_counter()
    r = c.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - t0
    assert r.headers.get("x-simulator-fault") == kind
    if kind == "rate_limit":
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "error" in r.json()
    elif kind == "server_error":
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    elif kind == "slow":
        assert r.status_code == 200 and elapsed >= 0.3 and r.json()["choices"]
    else:
        with pytest.raises(json.JSONDecodeError):
            json.loads(r.text)
    with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        lines = [ln for ln in s.iter_lines() if ln]
    if kind == "truncated":
        assert "data: [DONE]" not in lines and not any(_bad_json(ln) for ln in lines)
    elif kind == "malformed":
        assert sum(_bad_json(ln) for ln in lines) == 1
    elif kind in ("rate_limit", "server_error"):
        assert s.status_code in (429, 500)
    else:
        assert lines[-1] == "data: [DONE]" and not any(_bad_json(ln) for ln in lines)
    assert inj.counts[kind] == 2


def _bad_json(line: str) -> bool:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False
    try:
        json.loads(line[6:])
        return False
    except json.JSONDecodeError:
        return True


def test_slow_fault_trips_a_client_timeout(tiny_lm):
    inj = FaultInjector(1.0, seed=0, delay_s=3.0, kinds=("slow",))
    body = {"model": NAME, "messages": CHAT, "max_tokens": 2}
    with ServerThread(create_app("honest-fp32", tiny_lm, faults=inj)) as srv, pytest.raises(httpx.TimeoutException):
        httpx.post(srv.base_url + "/chat/completions", json=body, timeout=0.5)


def test_usage_and_max_tokens_zero_echo_scoring(relaxed_app, client):
    c = client(relaxed_app)
    r = c.post("/v1/completions", json={"model": NAME, "prompt": "Hello there world", "max_tokens": 0,
                                        "echo": True, "logprobs": 1}).json()
    ch = r["choices"][0]
    assert ch["text"] == "Hello there world" and r["usage"]["completion_tokens"] == 0
    assert len(ch["logprobs"]["tokens"]) == r["usage"]["prompt_tokens"]
    assert all(math.isfinite(x) for x in ch["logprobs"]["token_logprobs"][1:])


def test_concurrent_requests_are_served_and_models_stays_responsive(server):
    """Generations are serialized, but the event loop is never blocked by a running one."""
    from concurrent.futures import ThreadPoolExecutor

    body = {"model": NAME, "messages": CHAT, "max_tokens": 24, "temperature": 1.0}
    with ThreadPoolExecutor(3) as ex:
        futs = [ex.submit(httpx.post, server.base_url + "/chat/completions", json=body, timeout=120) for _ in range(3)]
        time.sleep(0.2)
        t0 = time.perf_counter()
        assert httpx.get(server.base_url + "/models", timeout=10).status_code == 200
        models_latency = time.perf_counter() - t0
        results = [f.result() for f in futs]
    assert all(r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None for r in results)
    assert models_latency < 2.0
