"""The KV-cache loop on a hybrid sliding-window model (tiny random Gemma3, no real model needed).

Gemma 2/3 mix sliding-window layers (``DynamicSlidingWindowLayer``) with full-attention ones. Once a
sliding layer has seen ``sliding_window`` tokens it drops older keys, and ``DynamicCache.crop`` then
raises unless the cache records the past (``activate_past_recording``), so every rejected draft
past the window crashed the loop (gemma-3-270m: prompts over 512 tokens). These tests run prompts
and generations well past a window of 4 with drafts that are often rejected, and check that greedy
speculative == plain greedy == argmax of the teacher-forced logits, with logprobs within 1e-4 nats.
"""

from __future__ import annotations

import pytest
import torch

from reference.drafters import NgramDrafter, SequenceDrafter
from reference.speculative import autoregressive_generate, speculative_generate

WINDOW = 4
N_NEW = 40


@pytest.fixture(scope="module")
def gemma_tiny():
    """Random 3-layer Gemma3 (sliding, full, sliding; window 4), float32, eval mode."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256, sliding_window=WINDOW,
        initializer_range=0.3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )
    torch.manual_seed(3)
    return Gemma3ForCausalLM(cfg).float().eval()


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 512, (max(n // 3, 1),), generator=g).tolist()
    return (base * 4)[:n]  # repeats: the n-gram drafter finds matches


def _teacher_forced(model, prompt: list[int], cont: list[int]) -> torch.Tensor:
    """``[len(cont), V]`` float32 log-softmax rows predicting each continuation token (one forward)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + cont]), use_cache=False).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(cont)]


def _corrupt(seq: list[int], start: int, every: int = 3) -> list[int]:
    """``seq`` with every ``every``-th token after ``start`` replaced (drafts rejected there)."""
    return [(t + 1) % 512 if i >= start and (i - start) % every == 1 else t for i, t in enumerate(seq)]


@pytest.mark.parametrize("prompt_len", [2, 3, 11])
def test_plain_greedy_matches_teacher_forcing(gemma_tiny, prompt_len):
    """Plain decoding past the window: tokens = argmax of teacher forcing, logprobs within 1e-4."""
    prompt = _prompt(prompt_len, seed=prompt_len)
    res = autoregressive_generate(gemma_tiny, prompt, max_new_tokens=N_NEW, eos_token_ids=[], return_logprobs=True)
    tf = _teacher_forced(gemma_tiny, prompt, res.token_ids)
    assert len(res.token_ids) == N_NEW
    assert res.token_ids == tf.argmax(-1).tolist()
    assert (res.logprobs - tf).abs().max().item() < 1e-4


@pytest.mark.parametrize("prompt_len", [2, 3, 11])
@pytest.mark.parametrize("drafter_kind", ["ngram", "sequence-corrupted", "sequence-oracle"])
@pytest.mark.parametrize("adaptive_k", [False, True])
def test_speculative_greedy_equals_plain_and_teacher_forcing(gemma_tiny, prompt_len, drafter_kind, adaptive_k):
    """Rejections past the sliding window (crop of recorded sliding layers) keep the loop exact."""
    prompt = _prompt(prompt_len, seed=prompt_len)
    plain = autoregressive_generate(gemma_tiny, prompt, max_new_tokens=N_NEW, eos_token_ids=[], return_logprobs=True)
    full = prompt + plain.token_ids
    if drafter_kind == "ngram":
        drafter = NgramDrafter()
    elif drafter_kind == "sequence-oracle":
        drafter = SequenceDrafter(full)
    else:
        drafter = SequenceDrafter(_corrupt(full, len(prompt)))
    res = speculative_generate(gemma_tiny, prompt, drafter=drafter, k=4, max_new_tokens=N_NEW, eos_token_ids=[],
                               return_logprobs=True, adaptive_k=adaptive_k)
    tf = _teacher_forced(gemma_tiny, prompt, res.token_ids)
    assert res.token_ids == plain.token_ids
    assert res.token_ids == tf.argmax(-1).tolist()
    assert res.logprobs is not None and res.logprobs.shape == tf.shape
    assert (res.logprobs - tf).abs().max().item() < 1e-4
    assert (res.logprobs - plain.logprobs).abs().max().item() < 1e-4
    if drafter_kind == "sequence-corrupted" and not adaptive_k:
        # the scenario under test actually happened: drafts rejected after the window was full
        assert res.n_drafted > res.n_accepted > 0
        assert len(prompt) + len(res.token_ids) > 2 * WINDOW


def test_scoring_agrees_with_loop(gemma_tiny):
    """``score_continuations`` (the audit's teacher forcing) on the loop's tokens: same logprobs."""
    from reference.scoring import score_continuations

    prompt = _prompt(11, seed=7)
    res = speculative_generate(gemma_tiny, prompt, drafter=SequenceDrafter(_corrupt(prompt * 5, len(prompt))), k=4,
                               max_new_tokens=N_NEW, eos_token_ids=[], return_logprobs=True, adaptive_k=False)
    (s,) = score_continuations(gemma_tiny, [prompt], [res.token_ids], top_k=1)
    chosen = res.logprobs.gather(1, torch.tensor(res.token_ids)[:, None]).squeeze(1).numpy()
    assert abs(s.logprobs - chosen).max() < 1e-4
    assert s.top_ids[:, 0].tolist() == res.token_ids
