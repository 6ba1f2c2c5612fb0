"""Teacher-forced scoring: equals one full forward, batched with padding, one forward per batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.scoring import encode_prompt, score_continuations

from ..conftest import make_tiny_model


def _random_items(seed, lens):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 49152, (n,), generator=g).tolist() for n in lens]


def _full_forward_rows(model, prompt, cont):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + cont])).logits[0]
    return torch.log_softmax(logits.double(), -1)[len(prompt) - 1 : -1]


@pytest.fixture(scope="module")
def tiny64():
    return make_tiny_model(dtype=torch.float64)


def test_batched_padded_scoring_equals_single_forward_float64(tiny64):
    prompts = _random_items(0, [5, 30, 12, 1])
    conts = _random_items(1, [20, 3, 9, 6])
    scored = score_continuations(tiny64, prompts, conts, top_k=7, full=True, batch_size=8)
    for pr, co, s in zip(prompts, conts, scored):
        ref = _full_forward_rows(tiny64, pr, co)
        assert s.token_ids == co
        assert np.abs(s.full_logprobs - ref.float().numpy()).max() < 1e-6  # float32 storage
        chosen = ref.gather(1, torch.tensor(co)[:, None]).squeeze(1).numpy()
        assert np.abs(s.logprobs - chosen).max() < 1e-9
        tv, ti = torch.topk(ref, 7, dim=-1)
        assert np.array_equal(s.top_ids, ti.numpy())
        assert np.abs(s.top_logprobs - tv.numpy()).max() < 1e-9


def test_scoring_float32_tiny_within_1e5(tiny_lm):
    prompts = _random_items(2, [4, 17, 9])
    conts = _random_items(3, [11, 2, 25])
    for s, pr, co in zip(score_continuations(tiny_lm, prompts, conts, top_k=3), prompts, conts):
        ref = _full_forward_rows(tiny_lm.model, pr, co)
        chosen = ref.gather(1, torch.tensor(co)[:, None]).squeeze(1).numpy()
        assert np.abs(s.logprobs - chosen).max() < 1e-5


def test_one_forward_per_batch(tiny_lm):
    calls = []
    h = tiny_lm.model.register_forward_hook(lambda m, a, kw, out: calls.append(1), with_kwargs=True)
    try:
        prompts = _random_items(4, [3, 8, 5, 6, 2])
        conts = _random_items(5, [10, 10, 4, 7, 30])
        score_continuations(tiny_lm, prompts, conts, batch_size=8)
        assert len(calls) == 1
        calls.clear()
        score_continuations(tiny_lm, prompts, conts, batch_size=2)
        assert len(calls) == 3
    finally:
        h.remove()


def test_order_preserved_and_empty_continuation(tiny_lm):
    prompts = _random_items(6, [3, 9, 4])
    conts = [_random_items(7, [5])[0], [], _random_items(8, [2])[0]]
    out = score_continuations(tiny_lm, prompts, conts, top_k=4, full=True)
    assert [s.token_ids for s in out] == conts
    assert out[1].logprobs.shape == (0,) and out[1].top_ids.shape == (0, 4) and out[1].full_logprobs.shape[0] == 0
    single = score_continuations(tiny_lm, [prompts[2]], [conts[2]], top_k=4)[0]
    assert np.abs(single.logprobs - out[2].logprobs).max() < 1e-5
    d = out[0].to_dict(tiny_lm.tokenizer)
    assert len(d["positions"]) == 5 and len(d["positions"][0]["top_logprobs"]) == 4
    assert {"token_id", "token", "logprob", "top_logprobs"} <= set(d["positions"][0])
    # top-1 logprob >= chosen logprob
    assert (out[0].top_logprobs[:, 0] >= out[0].logprobs - 1e-6).all()


def test_scoring_errors(tiny_lm):
    with pytest.raises(ValueError, match="differ in length"):
        score_continuations(tiny_lm, [[1]], [[1], [2]])
    with pytest.raises(ValueError, match="prompts\\[0\\] is empty"):
        score_continuations(tiny_lm, [[]], [[1]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        score_continuations(tiny_lm, [[1]], [[49152]])
    with pytest.raises(ValueError, match="batch_size"):
        score_continuations(tiny_lm, [[1]], [[2]], batch_size=0)


def test_encode_prompt_chat_like_vllm(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = encode_prompt(tok, "Hi there", chat=True)
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids2 = encode_prompt(tok, msgs, chat=False)  # a message list implies chat
    assert tok.decode(ids2).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    # completions prompt: plain tokenization
    assert encode_prompt(tok, "Hi there", chat=False) == tok("Hi there")["input_ids"]
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        encode_prompt(tok, [{"content": "x"}], chat=True)
