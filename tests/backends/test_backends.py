"""Reference backends: local vs vllm (through the simulator's vLLM extensions) agree; none refuses;
config tables resolve; devices resolve (the CUDA branch exercised on CPU through the same code)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from probes.config import ConfigError, ReferenceConfig
from probes.providers_file import get_reference, parse_providers, parse_references
from reference.backends import NoReferenceError, ReferenceError, make_backend
from reference.backends.local import LocalBackend
from reference.backends.none import NoneBackend
from reference.backends.vllm import VLLMBackend, api_key_from_env
from reference.models import resolve_device
from simulator.server import create_app, serve_in_thread


def _items(seed, lens, V=49152):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, V, (n,), generator=g).tolist() for n in lens]


@pytest.fixture(scope="module")
def sim_tiny(tiny_lm):
    srv = serve_in_thread(create_app("honest-fp32", tiny_lm, seed=0))
    try:
        yield srv
    finally:
        srv.stop()


def _vllm(srv, lm, **kw):
    return VLLMBackend(srv.base_url, "tiny", tokenizer=lm.tokenizer, **kw)


def test_local_and_vllm_agree_within_1e4_nats(sim_tiny, tiny_lm):
    local = LocalBackend(tiny_lm, token_budget=64)
    remote = _vllm(sim_tiny, tiny_lm, max_prompts=2, concurrency=2)
    remote.model = _served_name(sim_tiny)
    prompts = _items(0, [5, 17, 3, 9])
    conts = _items(1, [12, 4, 20, 0])
    a = local.score(prompts, conts, top_k=5)
    b = remote.score(prompts, conts, top_k=5)
    for x, y, co in zip(a, b, conts, strict=True):
        assert x.token_ids == y.token_ids == co
        if not co:
            continue
        assert np.abs(x.logprobs - y.logprobs).max() < 1e-4
        assert np.array_equal(x.top_ids, y.top_ids)
        assert np.abs(x.top_logprobs - y.top_logprobs).max() < 1e-4
        assert np.abs(x.tail_mass - y.tail_mass).max() < 1e-4
        # the chosen token is usually outside the top-5 of a random model: its rank came from the server
        assert (x.top_logprobs[:, 0] >= x.logprobs - 1e-6).all()
    remote.close()


def test_vllm_greedy_matches_local(sim_tiny, tiny_lm):
    local = LocalBackend(tiny_lm)
    remote = _vllm(sim_tiny, tiny_lm)
    remote.model = _served_name(sim_tiny)
    pr = _items(2, [7])[0]
    g_local = local.greedy(pr, 6, stop_at_eos=False)
    g_remote = remote.greedy(pr, 6, stop_at_eos=False)
    assert len(g_local) == 6 and g_remote == g_local
    # teacher forcing the greedy tokens: each is the reference argmax
    sc = local.score([pr], [g_local], top_k=1)[0]
    assert list(sc.top_ids[:, 0]) == g_local


def test_vllm_check_and_errors(sim_tiny, tiny_lm):
    remote = _vllm(sim_tiny, tiny_lm)
    remote.model = _served_name(sim_tiny)
    remote.check()
    dead = VLLMBackend("http://127.0.0.1:9/v1", "m", retries=1, timeout_s=2)
    with pytest.raises(ReferenceError, match="does not answer"):
        dead.score([[1, 2]], [[3]], top_k=1)
    wrong = _vllm(sim_tiny, tiny_lm)
    wrong.model = "not-served"
    with pytest.raises(ReferenceError, match="refused the request"):
        wrong.check()

    # an OpenAI-compatible server without vLLM's prompt_logprobs
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"index": 0, "text": "x", "logprobs": None}]})

    plain = VLLMBackend("http://x/v1", "m", client=httpx.Client(transport=httpx.MockTransport(handler)))
    with pytest.raises(ReferenceError, match="prompt_logprobs"):
        plain.check()
    with pytest.raises(ReferenceError, match="prompt_logprobs"):
        plain.score([[1, 2]], [[3]], top_k=1)

    # hostile replies: wrong length, missing own token → named errors, never a crash
    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"index": 0, "prompt_logprobs": [None]}]})

    bad = VLLMBackend("http://x/v1", "m", client=httpx.Client(transport=httpx.MockTransport(short)))
    with pytest.raises(ReferenceError, match="entries for a prompt of 3"):
        bad.score([[1, 2]], [[3]], top_k=1)

    def no_own(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"index": 0, "prompt_logprobs": [
            None, {"5": {"logprob": -0.1, "rank": 1}}]}]})

    bad2 = VLLMBackend("http://x/v1", "m", client=httpx.Client(transport=httpx.MockTransport(no_own)))
    with pytest.raises(ReferenceError, match="lacks the prompt token 3"):
        bad2.score([[1]], [[3]], top_k=1)


def test_api_key_env(monkeypatch):
    monkeypatch.delenv("H5_TEST_KEY", raising=False)
    assert api_key_from_env(None) is None
    with pytest.raises(ReferenceError, match="H5_TEST_KEY"):
        api_key_from_env("H5_TEST_KEY")
    monkeypatch.setenv("H5_TEST_KEY", "k")
    assert api_key_from_env("H5_TEST_KEY") == "k"


def test_none_backend_refuses_clearly():
    nb = make_backend(ReferenceConfig(name="none", kind="none"))
    assert isinstance(nb, NoneBackend) and not nb.available
    with pytest.raises(NoReferenceError, match="only the reference-free tests run"):
        nb.score([[1]], [[2]])
    with pytest.raises(NoReferenceError):
        nb.greedy([1], 3)
    assert get_reference("none").kind == "none"


def test_reference_tables_resolve_and_errors():
    data = {
        "providers": {"p": {"base_url": "http://127.0.0.1:8000/v1", "model": "m", "reference": "big"}},
        "references": {
            "big": {"kind": "local", "model": "/models/x", "dtype": "bfloat16", "device_map": "auto",
                    "max_memory": {"0": "70GiB", "cpu": "100GiB"}},
            "trusted": {"kind": "vllm", "model": "m", "base_url": "http://10.0.0.5:8000/v1/", "api_key_env": "K"},
        },
    }
    provs = parse_providers(data, "f.toml")
    refs = parse_references(data, "f.toml")
    assert provs["p"].reference == "big" and refs["big"].device_map == "auto"
    assert refs["trusted"].base_url == "http://10.0.0.5:8000/v1"
    bad = {
        "references": {
            "a": {"kind": "vllm", "model": "m"},
            "b": {"kind": "local", "model": "m", "device": "gpu0"},
            "c": {"kind": "local", "model": "m", "max_memory": {"0": "70GiB"}},
            "d": {"kind": "local"},
            "e": {"kind": "local", "model": "m", "dtype": "int4"},
            "f": {"kind": "local", "model": "m", "api_key": "secret"},
        }
    }
    with pytest.raises(ConfigError) as ei:
        parse_providers(bad, "f.toml")
    msg = str(ei.value)
    for needle in ("references.a: kind = 'vllm' needs base_url", "references.b.device", "max_memory needs device_map",
                   "references.d: kind = 'local' needs model", "references.e.dtype", "references.f.api_key"):
        assert needle in msg, needle


@pytest.mark.parametrize("device,count,expect", [
    ("auto", 0, "cpu"), ("auto", 2, "cuda:0"), ("cpu", 2, "cpu"), ("cuda", 1, "cuda:0"), ("cuda:1", 2, "cuda:1"),
])
def test_resolve_device(device, count, expect):
    assert str(resolve_device(device, cuda_count=count)) == expect


@pytest.mark.parametrize("device,count,needle", [
    ("cuda", 0, "no CUDA GPU is visible"), ("cuda:2", 2, "only 2 CUDA GPU"), ("tpu", 0, "not supported"),
])
def test_resolve_device_errors(device, count, needle):
    with pytest.raises(ValueError, match=needle):
        resolve_device(device, cuda_count=count)


def test_cuda_without_gpu_is_a_reference_error(monkeypatch):
    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        pytest.skip("this machine has a GPU; the error path is covered by test_resolve_device_errors")
    cfg = ReferenceConfig(name="r", kind="local", model="smollm2-135m-instruct", device="cuda")
    with pytest.raises(ReferenceError, match="no CUDA GPU is visible"):
        make_backend(cfg)


def test_unloadable_model_is_a_reference_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ReferenceError, match="cannot be loaded"):
        make_backend(ReferenceConfig(name="r", kind="local", model=str(tmp_path), device="cpu"))


def _served_name(srv) -> str:
    return httpx.get(srv.base_url + "/models").json()["data"][0]["id"]
