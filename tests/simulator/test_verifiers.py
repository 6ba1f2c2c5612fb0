"""Lossy verifiers: output laws checked against closed forms (Monte Carlo + chi-square, seeded)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from simulator.verifiers import (
    GreedyVerifyVerifier,
    NoncompliantGreedyVerifier,
    RelaxedThresholdVerifier,
    TypicalAcceptanceVerifier,
    entropy_nats,
)

P = torch.tensor([0.6, 0.2, 0.1, 0.06, 0.04], dtype=torch.float64)
EMPTY = torch.zeros(0, dtype=torch.long)


def _draw(verifier, p, n, seed=0, drafts=EMPTY, greedy=False):
    g = torch.Generator().manual_seed(seed)
    rows = p.unsqueeze(0).repeat(drafts.numel() + 1, 1)
    out = np.zeros(p.numel())
    for _ in range(n):
        r = verifier.verify(rows, None, drafts, g, greedy)
        out[r.next_token if r.n_accepted == 0 else int(drafts[0])] += 1
    return out


def relaxed_law(p: np.ndarray, s: float, a: float) -> np.ndarray:
    """Closed-form one-step law of relaxed acceptance with a draft d ~ p (ideal draft head)."""
    acc = np.where(p >= s, 1.0, np.minimum(1.0, p / a))
    law = p * acc
    for d in range(len(p)):
        rest = p.copy()
        rest[d] = 0.0
        law += p[d] * (1 - acc[d]) * rest / rest.sum()
    return law


def chisq_p(counts: np.ndarray, law: np.ndarray) -> float:
    exp = law / law.sum() * counts.sum()
    keep = exp > 0
    return float(stats.chisquare(counts[keep], exp[keep]).pvalue)


def test_relaxed_threshold_law_matches_closed_form_and_overemits_argmax():
    v = RelaxedThresholdVerifier(0.5, 1.0)
    counts = _draw(v, P, 3000, seed=1)
    law = relaxed_law(P.numpy(), 0.5, 1.0)
    assert law[0] == pytest.approx(0.6 * (2 - 0.6))  # p_a (2 - p_a) when only the argmax clears s
    assert chisq_p(counts, law) > 1e-3
    assert chisq_p(counts, P.numpy()) < 1e-6  # not the target law
    assert counts[0] / counts.sum() > 0.8


def test_relaxed_thresholds_of_one_are_lossless():
    v = RelaxedThresholdVerifier(1.0, 1.0)
    counts = _draw(v, P, 3000, seed=2)
    assert chisq_p(counts, P.numpy()) > 1e-3


def test_relaxed_single_draft_acceptance_probabilities():
    v = RelaxedThresholdVerifier(0.5, 0.5)
    # p(d) = 0.6 >= s: always accepted
    counts = _draw(v, P, 200, seed=3, drafts=torch.tensor([0]))
    assert counts[0] == 200
    # p(d) = 0.2 < s: accepted w.p. min(1, 0.2/0.5) = 0.4
    g = torch.Generator().manual_seed(4)
    rows = P.unsqueeze(0).repeat(2, 1)
    acc = sum(v.verify(rows, None, torch.tensor([1]), g, False).n_accepted for _ in range(2000))
    assert stats.binomtest(acc, 2000, 0.4).pvalue > 1e-3
    assert v.accept_probability(0.0) == 0.0


def test_relaxed_greedy_requests_stay_strict():
    v = RelaxedThresholdVerifier(0.01, 0.01)
    rows = P.unsqueeze(0).repeat(2, 1)
    r = v.verify(rows, None, torch.tensor([3]), torch.Generator().manual_seed(0), True)
    assert (r.n_accepted, r.next_token) == (0, 0)


def test_typical_acceptance_law():
    v = TypicalAcceptanceVerifier(0.09, 0.3)
    thr = min(0.09, 0.3 * np.exp(-entropy_nats(P)))
    p = P.numpy()
    law = np.where(p > thr, p, 0.0)
    law[0] += p[p <= thr].sum()
    counts = _draw(v, P, 3000, seed=5)
    assert chisq_p(counts, law) > 1e-3
    assert counts[3] == 0 and counts[4] == 0  # tail below threshold never emitted
    # a rejected draft emits argmax p; all accepted -> bonus sampled from p
    rows = P.unsqueeze(0).repeat(2, 1)
    r = v.verify(rows, None, torch.tensor([4]), torch.Generator().manual_seed(0), False)
    assert (r.n_accepted, r.next_token) == (0, 0)
    r = v.verify(rows, None, torch.tensor([1]), torch.Generator().manual_seed(0), False)
    assert r.n_accepted == 1


def test_greedy_verify_returns_argmax_for_sampling_requests():
    v = GreedyVerifyVerifier()
    counts = _draw(v, P, 200, seed=6)
    assert counts[0] == 200
    rows = P.unsqueeze(0).repeat(3, 1)
    r = v.verify(rows, None, torch.tensor([0, 2]), torch.Generator(), False)
    assert (r.n_accepted, r.next_token) == (1, 0)


def test_noncompliant_greedy_flips_to_second_ranked_at_rate():
    v = NoncompliantGreedyVerifier(0.2)
    counts = _draw(v, P, 2000, seed=7, greedy=True)
    assert set(np.nonzero(counts)[0]) <= {0, 1}
    assert stats.binomtest(int(counts[1]), 2000, 0.2).pvalue > 1e-3
    # sampling requests are verified strictly (law p)
    counts = _draw(NoncompliantGreedyVerifier(0.9), P, 3000, seed=8)
    assert chisq_p(counts, P.numpy()) > 1e-3


def test_invalid_parameters_raise():
    with pytest.raises(ValueError, match="thresholds"):
        RelaxedThresholdVerifier(0.0, 1.0)
    with pytest.raises(ValueError, match="flip_rate"):
        NoncompliantGreedyVerifier(1.5)
    with pytest.raises(ValueError, match="k\\+1"):
        RelaxedThresholdVerifier().verify(P.unsqueeze(0), None, torch.tensor([1]), None, False)
