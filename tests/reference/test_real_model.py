"""The real SmolLM2-135M-Instruct: conversion, greedy losslessness for every drafter, scoring."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from reference.drafters import DraftModelDrafter, NgramDrafter, SelfDrafter
from reference.models import DEFAULT_MODEL, list_models, pull_default_model
from reference.scoring import encode_prompt, score_continuations
from reference.speculative import autoregressive_generate, speculative_generate

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Rewrite the following passage, fixing the typos, and keep everything else identical:\n"
    "The quick brwn fox jumps over the lazy dog. The dog sleeps in the sun all day long, "
    "and the fox runs arround the farm looking for food. At night the fox returns to its den.",
    "Write a Python function that returns the n-th Fibonacci number.",
]


def test_default_model_converted_cache(real_lm):
    path = pull_default_model()
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["name"] == DEFAULT_MODEL and manifest["dtype"] == "float32"
    assert abs(manifest["n_params"] - 134.5e6) < 0.1e6
    assert len(manifest["source_sha256"]) == 64 and len(manifest["revision"]) == 16
    cfg = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is True
    assert real_lm.revision == manifest["revision"]
    assert real_lm.model.lm_head.weight.data_ptr() == real_lm.model.model.embed_tokens.weight.data_ptr()
    assert real_lm.tokenizer.eos_token == "<|im_end|>" and real_lm.tokenizer.chat_template
    assert real_lm.tokenizer.convert_tokens_to_ids("<|im_end|>") in real_lm.eos_token_ids
    assert any(r["name"] == DEFAULT_MODEL and r["status"] == "cached" for r in list_models())


@pytest.fixture(scope="module")
def greedy_refs(real_lm):
    out = []
    for text in PROMPTS:
        ids = encode_prompt(real_lm.tokenizer, text, chat=True)
        ref = autoregressive_generate(real_lm, ids, max_new_tokens=64, eos_token_ids=[])
        out.append((ids, ref))
    return out


@pytest.mark.parametrize("drafter_name", ["ngram", "self:8", "draft-model"])
def test_greedy_speculative_equals_plain_real(real_lm, tiny_draft_lm, greedy_refs, drafter_name):
    for ids, ref in greedy_refs:
        assert len(ref.token_ids) == 64
        drafter = {
            "ngram": lambda: NgramDrafter(),
            "self:8": lambda: SelfDrafter(real_lm, 8),
            "draft-model": lambda: DraftModelDrafter(tiny_draft_lm),  # shares the SmolLM2 tokenizer
        }[drafter_name]()
        # fixed k (no adaptive fallback) so every round really verifies drafts; the early-exit and
        # tiny draft models are rarely accepted, so they get k=2 to keep the test short
        res = speculative_generate(
            real_lm, ids, drafter=drafter, k=4 if drafter_name == "ngram" else 2, max_new_tokens=64,
            eos_token_ids=[], adaptive_k=False,
        )
        assert res.token_ids == ref.token_ids, drafter_name
    if drafter_name == "ngram":  # the edit prompt repeats the passage: drafts get accepted
        assert res.n_drafted > 0


def test_scoring_matches_full_forward_real(real_lm, greedy_refs):
    (ids, ref), (ids2, ref2) = greedy_refs
    cont, cont2 = ref.token_ids[:40], ref2.token_ids[:17]
    # single item: memory-bounded scoring applies the LM head to continuation positions only, in
    # vocabulary chunks, so its GEMM shapes (hence float32 reduction order) differ from the full
    # forward's: agreement within float32 noise (measured 1.7e-5 nats; the batched check below
    # bounds it by the float32 forward's own distance from float64)
    s = score_continuations(real_lm, [ids], [cont], top_k=5, full=True)[0]
    with torch.no_grad():
        full32 = torch.log_softmax(real_lm.model(torch.tensor([ids + cont])).logits[0].float(), -1)[len(ids) - 1 : -1]
    assert np.abs(s.full_logprobs - full32.numpy()).max() < 1e-4
    # batched with left padding: agrees with the float32 forward within the float32 noise floor,
    # measured here as the float32 forward's own distance from a float64 forward
    batch = score_continuations(real_lm, [ids, ids2], [cont, cont2], top_k=5, full=True)
    m64 = copy.deepcopy(real_lm.model).double()
    for pr, co, sc in zip([ids, ids2], [cont, cont2], batch, strict=True):
        with torch.no_grad():
            f32 = torch.log_softmax(real_lm.model(torch.tensor([pr + co])).logits[0].float(), -1)[len(pr) - 1 : -1]
            f64 = torch.log_softmax(m64(torch.tensor([pr + co])).logits[0], -1)[len(pr) - 1 : -1]
        noise = (f32.double() - f64).abs().max().item()
        assert noise < 2e-4
        assert np.abs(sc.full_logprobs - f64.numpy()).max() < 2 * noise + 1e-5
        assert np.abs(sc.logprobs - f64.gather(1, torch.tensor(co)[:, None]).squeeze(1).numpy()).max() < 2 * noise + 1e-5
    # greedy tokens are the scored top-1 everywhere
    assert (s.top_ids[:, 0] == np.array(cont)).all()
