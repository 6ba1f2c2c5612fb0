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
    for pr, co, s in zip(prompts, conts, scored, strict=True):
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
    for s, pr, co in zip(score_continuations(tiny_lm, prompts, conts, top_k=3), prompts, conts, strict=True):
        ref = _full_forward_rows(tiny_lm.model, pr, co)
        chosen = ref.gather(1, torch.tensor(co)[:, None]).squeeze(1).numpy()
        assert np.abs(s.logprobs - chosen).max() < 1e-5


def test_one_forward_per_batch(tiny_lm):
    calls = []
    h = tiny_lm.model.model.register_forward_hook(lambda m, a, kw, out: calls.append(1), with_kwargs=True)
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


# ---------------------------------------------------------------- memory-bounded scoring (issue 12)
from reference.scoring import (  # noqa: E402
    HIDDEN_HEAD_MODEL_TYPES,
    _uses_hidden_head,
    logit_rows_for,
    plan_batches,
)


def test_plan_batches_respects_budget_and_covers_all():
    lengths = [5, 40, 7, 100, 3, 3, 60, 12]
    for budget in (1, 20, 64, 150, 10_000):
        for mb in (1, 3, 64):
            batches = plan_batches(lengths, budget, mb)
            assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
            for b in batches:
                assert len(b) <= mb
                padded = len(b) * max(lengths[i] for i in b)
                assert padded <= budget or len(b) == 1  # an over-long item goes alone
    with pytest.raises(ValueError, match="token_budget"):
        plan_batches([1], 0, 4)


def test_logit_rows_bound():
    assert logit_rows_for(262144, 256 << 20) == 256
    assert logit_rows_for(49152, 1) == 1


def _gemma3_tiny(dtype=torch.float64, softcap=None):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                           sliding_window=8, final_logit_softcapping=softcap, initializer_range=0.3)
    torch.manual_seed(3)
    return Gemma3ForCausalLM(cfg).to(dtype).eval()


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_hidden_head_path_equals_model_logits_gemma3(softcap):
    """The chunked lm_head path (+ soft-capping) reproduces Gemma3ForCausalLM's own logits."""
    m = _gemma3_tiny(softcap=softcap)
    assert m.config.model_type in HIDDEN_HEAD_MODEL_TYPES and _uses_hidden_head(m)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 14, 6)]
    conts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (9, 2, 12)]
    out = score_continuations(m, prompts, conts, top_k=4, full=True, token_budget=24, logit_rows=5)
    for pr, co, s in zip(prompts, conts, out, strict=True):
        ref = _full_forward_rows(m, pr, co)
        assert np.abs(s.full_logprobs - ref.float().numpy()).max() < 1e-6
        chosen = ref.gather(1, torch.tensor(co)[:, None]).squeeze(1).numpy()
        assert np.abs(s.logprobs - chosen).max() < 1e-9
        tv, ti = torch.topk(ref, 4, dim=-1)
        assert np.array_equal(s.top_ids, ti.numpy())
        assert np.abs(s.tail_mass - (1 - tv.exp().sum(-1)).numpy()).max() < 1e-9


def test_fallback_path_for_unknown_architectures(tiny64, monkeypatch):
    """A model type outside the allow-list uses the model's own logits: same numbers."""
    import reference.scoring as S

    prompts = _random_items(10, [4, 11])
    conts = _random_items(11, [7, 3])
    fast = score_continuations(tiny64, prompts, conts, top_k=3, logit_rows=2)
    monkeypatch.setattr(S, "HIDDEN_HEAD_MODEL_TYPES", frozenset())
    assert not S._uses_hidden_head(tiny64)
    slow = score_continuations(tiny64, prompts, conts, top_k=3, logit_rows=2)
    for a, b in zip(fast, slow, strict=True):
        assert np.abs(a.logprobs - b.logprobs).max() < 1e-9 and np.array_equal(a.top_ids, b.top_ids)


def test_logits_reduced_in_chunks_of_logit_rows(tiny_lm, monkeypatch):
    """No reduction ever sees more than ``logit_rows`` rows: no [batch, T, V] float32 tensor."""
    import reference.scoring as S

    seen = []
    real = S._reduce_rows

    def spy(logits, *a, **k):
        seen.append(tuple(logits.shape))
        return real(logits, *a, **k)

    monkeypatch.setattr(S, "_reduce_rows", spy)
    prompts = _random_items(12, [6, 9, 4, 20])
    conts = _random_items(13, [30, 25, 40, 10])
    out = score_continuations(tiny_lm, prompts, conts, top_k=2, logit_rows=16, token_budget=80)
    assert seen and max(r for r, _ in seen) <= 16
    assert sum(r for r, _ in seen) == sum(len(c) for c in conts)
    ref = score_continuations(tiny_lm, prompts, conts, top_k=2)
    for a, b in zip(out, ref, strict=True):
        assert np.abs(a.logprobs - b.logprobs).max() < 1e-5


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_scoring_device_branch(device, monkeypatch, tiny_lm):
    """The device path is the same code for CPU and CUDA: inputs go to the input embedding's device.

    Without a GPU the 'cuda' case runs the identical code with the embedding device reported as
    cuda and tensors moved by a recording ``.to`` (nothing is skipped); on a GPU machine it runs for real.
    """
    import reference.scoring as S

    if device == "cuda" and torch.cuda.is_available():  # pragma: no cover - GPU machines
        import copy

        m = copy.deepcopy(tiny_lm.model).to("cuda")
        out = score_continuations(m, [[1, 2, 3]], [[4, 5]], top_k=2)
        ref = score_continuations(tiny_lm, [[1, 2, 3]], [[4, 5]], top_k=2)
        assert np.abs(out[0].logprobs - ref[0].logprobs).max() < 1e-4
        return
    moved: list[str] = []
    real_to = torch.Tensor.to

    def rec_to(self, *a, **k):
        if a and isinstance(a[0], torch.device):
            moved.append(str(a[0]))
            return self  # stay on CPU: the model lives on CPU here
        return real_to(self, *a, **k)

    monkeypatch.setattr(S, "input_device", lambda model: torch.device(device))
    monkeypatch.setattr(torch.Tensor, "to", rec_to)
    out = score_continuations(tiny_lm, [[1, 2, 3], [7]], [[4, 5], [8, 9, 10]], top_k=2)
    monkeypatch.setattr(torch.Tensor, "to", real_to)
    monkeypatch.setattr(S, "input_device", lambda model: torch.device("cpu"))
    # input_ids, attention_mask, position_ids of the one batch go to the embedding's device
    assert moved[:3] == [device] * 3
    ref = score_continuations(tiny_lm, [[1, 2, 3], [7]], [[4, 5], [8, 9, 10]], top_k=2)
    for a, b in zip(out, ref, strict=True):
        assert np.abs(a.logprobs - b.logprobs).max() < 1e-6
