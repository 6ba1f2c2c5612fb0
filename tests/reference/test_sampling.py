"""logits_to_probs (vLLM order) and exact inverse-CDF sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from reference.sampling import SamplingParams, logits_to_probs, sample_from, sample_rows


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 1.0]])
    p = logits_to_probs(logits, temperature=0.0)
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_temperature_scales_logits():
    logits = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    p = logits_to_probs(logits, temperature=0.5, dtype=torch.float64)
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1), atol=1e-15)


def test_top_k_then_top_p():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    assert torch.allclose(
        logits_to_probs(logits, 1.0, top_k=2, dtype=torch.float64), torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64)
    )
    # top_p = 0.6: 0.4 alone < 0.6, keep 0.4+0.3 = 0.7
    assert torch.allclose(
        logits_to_probs(logits, 1.0, top_p=0.6, dtype=torch.float64), torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64)
    )
    # top_p tiny keeps the top token only
    assert torch.equal(logits_to_probs(logits, 1.0, top_p=1e-6), torch.tensor([1.0, 0, 0, 0]))
    # top_k applied before top_p: with top_k=3 renormalised [4/9,3/9,2/9], top_p=0.7 keeps 2 tokens
    p = logits_to_probs(logits, 1.0, top_k=3, top_p=0.7, dtype=torch.float64)
    assert torch.allclose(p, torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64))


def test_top_k_keeps_boundary_ties():
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0])
    p = logits_to_probs(logits, 1.0, top_k=2)
    assert (p > 0).tolist() == [True, True, True, False]


def test_neg_inf_logits_and_errors():
    logits = torch.tensor([float("-inf"), 0.0, float("-inf")])
    assert torch.equal(logits_to_probs(logits, 0.7), torch.tensor([0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="no finite"):
        logits_to_probs(torch.full((3,), float("-inf")), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        logits_to_probs(logits, -1.0)
    with pytest.raises(ValueError, match="top_p"):
        logits_to_probs(logits, 1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(1.0, 0, 1.5)


def test_sample_from_never_draws_zero_mass_and_matches_law():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    g = torch.Generator().manual_seed(123)
    draws = np.array([sample_from(probs, g) for _ in range(4000)])
    assert set(np.unique(draws)) <= {1, 3, 4}
    obs = np.array([(draws == i).sum() for i in (1, 3, 4)])
    p = stats.chisquare(obs, 4000 * np.array([0.5, 0.3, 0.2])).pvalue
    assert p > 1e-3
    # unnormalised input is fine
    assert sample_from(torch.tensor([0.0, 0.0, 7.0]), g) == 2
    with pytest.raises(ValueError):
        sample_from(torch.zeros(3), g)


def test_sample_rows_matches_the_law_row_by_row_and_never_draws_zero_mass():
    # two different rows, unnormalized; each row's draws follow its own law
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [7.0, 0.0, 0.0, 0.0, 0.0, 3.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(7)
    draws = torch.stack([sample_rows(probs, g) for _ in range(4000)]).numpy()  # [4000, 2]
    assert set(np.unique(draws[:, 0])) <= {1, 3, 4} and set(np.unique(draws[:, 1])) <= {0, 5}
    obs0 = np.array([(draws[:, 0] == i).sum() for i in (1, 3, 4)], dtype=float)
    assert stats.chisquare(obs0, 4000 * np.array([0.5, 0.3, 0.2])).pvalue > 1e-3
    assert stats.binomtest(int((draws[:, 1] == 0).sum()), 4000, 0.7).pvalue > 1e-3
    # a one-token row, and float64 rounding at the top never lands on a zero-mass tail token
    assert sample_rows(torch.tensor([[0.0, 1.0, 0.0]]), g).tolist() == [1]
    tiny_last = torch.tensor([[1.0, 1e-30, 0.0, 0.0]], dtype=torch.float64)
    assert all(sample_rows(tiny_last, g).item() in (0, 1) for _ in range(200))
    with pytest.raises(ValueError, match="sum to zero"):
        sample_rows(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), g)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample_rows(torch.ones(3), g)


def test_logits_to_probs_rejects_a_nan_logit_in_one_row_only():
    logits = torch.zeros(3, 5)
    logits[1, 2] = float("nan")
    with pytest.raises(ValueError, match="no finite logit"):
        logits_to_probs(logits, 1.0)


def _top_p_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The textbook nucleus filter with a full descending sort (the rule ``_top_p_filter`` must match)."""
    sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
    drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    drop_sorted[..., 0] = False
    out = probs.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted), 0.0)
    return out / out.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0])  # flat (nucleus past 64 tokens, the topk grows), mid, peaked
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_partial_sort_equals_full_sort(scale, top_p):
    gen = torch.Generator().manual_seed(int(scale * 10) + int(top_p * 1000))
    logits = torch.randn(5, 49152, generator=gen) * scale  # continuous draws: no ties
    for dtype in (torch.float32, torch.float64):
        got = logits_to_probs(logits, 1.0, top_p=top_p, dtype=dtype)
        want = _top_p_full_sort(torch.softmax(logits.to(dtype), -1), top_p)
        assert torch.equal(got > 0, want > 0)
        assert torch.allclose(got, want, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6)
