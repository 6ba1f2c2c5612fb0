"""Drafters: n-gram lookup rules, model drafters' KV-cache sync, early exit, scripted drafters."""

from __future__ import annotations

import pytest
import torch

from reference.drafter_specs import make_drafter
from reference.drafters import (
    Drafter,
    DraftModelDrafter,
    NgramDrafter,
    ScriptedDrafter,
    SelfDrafter,
    SequenceDrafter,
    early_exit_forward,
)
from reference.sampling import SamplingParams


def test_ngram_latest_occurrence_and_longest_match():
    d = NgramDrafter(min_n=1, max_n=3)
    #       0  1  2  3  4  5  6  7  8  9
    ctx = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    # suffix (5,6) occurs at 0 and 4 -> latest (4) -> continue with 8, 2, 5
    ids, q = d.propose(ctx, 3)
    assert ids.tolist() == [8, 2, 5] and q is None
    # longest match wins over a later shorter one: suffix (1,5,6)... only at 3..5 -> propose 8
    ctx2 = [1, 5, 6, 8, 9, 5, 6, 3, 1, 5, 6]
    assert d.find(ctx2, 2) == [8, 9]
    # with max_n = 2 the latest (5,6) occurrence (at 5) wins instead
    assert NgramDrafter(1, 2).find(ctx2, 2) == [3, 1]


def test_ngram_fewer_than_k_and_none():
    d = NgramDrafter(min_n=2, max_n=4)
    nd = NgramDrafter(min_n=2, max_n=4, periodic=False)
    assert nd.find([1, 2, 3, 1, 2], 5) == [3, 1, 2]  # match at 0: the span ends at the suffix
    assert d.find([1, 2, 3, 1, 2], 5) == [3, 1, 2, 3, 1]  # periodic: continue with period 3
    assert d.find([9, 7, 8, 7, 8], 5) == [7, 8, 7, 8, 7]  # (7,8) latest at 1 -> period 2
    assert nd.find([9, 7, 8, 7, 8], 5) == [7, 8]
    ids, q = d.propose([1, 2, 3, 4], 4)
    assert ids.numel() == 0 and q is None
    assert d.find([7], 3) == []
    assert d.find([1, 2, 1, 2], 0) == []
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(0, 2)
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(3, 2)


def test_ngram_min_n_respected():
    assert NgramDrafter(min_n=2, max_n=3).find([4, 9, 9, 4], 2) == []
    assert NgramDrafter(min_n=1, max_n=3).find([4, 9, 9, 4], 2) == [9, 9]


def _fresh_greedy_drafts(model, ctx, k):
    """Reference: plain autoregressive argmax from a full recompute (no cache)."""
    out = []
    seq = list(ctx)
    with torch.no_grad():
        for _ in range(k):
            t = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(t)
            seq.append(t)
    return out


def test_draft_model_cache_sync_matches_fresh_recompute(tiny_lm, tiny_draft_lm):
    d = DraftModelDrafter(tiny_draft_lm)
    assert isinstance(d, Drafter)
    base = [10, 200, 3000, 42, 7]
    contexts = [
        base,
        base + [11, 12],  # grows past the drafted tokens
        base + [11],  # rollback
        [10, 200, 99],  # diverges early
        [10, 200, 99],  # identical context twice
    ]
    for ctx in contexts:
        ids, q = d.propose(ctx, 3)
        assert q is None  # greedy -> one-hot
        assert ids.tolist() == _fresh_greedy_drafts(tiny_draft_lm.model, ctx, 3)


def test_draft_model_sampling_returns_processed_q(tiny_draft_lm):
    d = DraftModelDrafter(tiny_draft_lm)
    sp = SamplingParams(temperature=0.8, top_k=50, top_p=0.9)
    ids, q = d.propose([1, 2, 3], 4, sampling=sp, generator=torch.Generator().manual_seed(0))
    assert ids.shape == (4,) and q.shape == (4, 49152)
    assert torch.allclose(q.sum(-1), torch.ones(4), atol=1e-5)
    assert ((q > 0).sum(-1) <= 50).all()
    assert all(float(q[i, t]) > 0 for i, t in enumerate(ids.tolist()))
    # q row 0 is exactly the processed draft distribution after the context
    from reference.sampling import logits_to_probs

    with torch.no_grad():
        ref = logits_to_probs(tiny_draft_lm.model(torch.tensor([[1, 2, 3]])).logits[0, -1], 0.8, 50, 0.9)
    assert torch.allclose(q[0], ref, atol=1e-6)


def test_self_draft_full_depth_equals_target(tiny_lm):
    n = tiny_lm.model.config.num_hidden_layers
    ctx = [5, 6, 7, 8]
    with torch.no_grad():
        full = tiny_lm.model(torch.tensor([ctx])).logits[0, -1]
        from transformers import DynamicCache

        ee = early_exit_forward(tiny_lm.model, n, torch.tensor([ctx]), DynamicCache(config=tiny_lm.model.config))[0, -1]
    assert torch.allclose(full, ee, atol=1e-4)
    d = SelfDrafter(tiny_lm, n)
    assert d.propose(ctx, 3)[0].tolist() == _fresh_greedy_drafts(tiny_lm.model, ctx, 3)


def test_self_draft_early_exit_matches_truncated_model(tiny_lm):
    """L=1 early exit == a copy of the model with only its first layer."""
    import copy

    trunc = copy.deepcopy(tiny_lm.model)
    trunc.model.layers = trunc.model.layers[:1]
    trunc.config.num_hidden_layers = 1
    d = SelfDrafter(tiny_lm, 1)
    for ctx in ([1, 2, 3], [1, 2, 3, 9, 9], [1, 2]):
        assert d.propose(ctx, 4)[0].tolist() == _fresh_greedy_drafts(trunc, ctx, 4)


def test_self_draft_validation(tiny_lm):
    with pytest.raises(ValueError, match=r"1\.\.2"):
        SelfDrafter(tiny_lm, 3)
    with pytest.raises(ValueError, match=r"1\.\.2"):
        SelfDrafter(tiny_lm, 0)


def test_scripted_and_sequence_drafters():
    s = ScriptedDrafter([[1, 2, 3], ([4], None)])
    assert s.propose([0], 2)[0].tolist() == [1, 2]
    assert s.propose([0], 2)[0].tolist() == [4]
    assert s.propose([0], 2)[0].numel() == 0
    s.reset()
    assert s.calls == 0
    f = ScriptedDrafter(lambda ctx, k: [len(ctx)] * k)
    assert f.propose([0, 0, 0], 2)[0].tolist() == [3, 3]
    seq = SequenceDrafter([9, 8, 7, 6, 5])
    assert seq.propose([9, 8], 2)[0].tolist() == [7, 6]
    assert seq.propose([9, 8, 7, 6], 3)[0].tolist() == [5]
    assert seq.propose([9, 8, 7, 6, 5], 3)[0].numel() == 0


def test_make_drafter_specs(tiny_lm):
    assert make_drafter("none") is None
    assert isinstance(make_drafter("ngram"), NgramDrafter)
    d = make_drafter("ngram:1:3")
    assert (d.min_n, d.max_n) == (1, 3)
    assert isinstance(make_drafter("self:1", tiny_lm), SelfDrafter)
    for bad in ("bogus", "self:x", "ngram:a:b", "model:"):
        with pytest.raises(ValueError, match=r"drafter|model"):
            make_drafter(bad, tiny_lm)
