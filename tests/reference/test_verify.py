"""The strict verify kernel: exact output law, threshold, saturated/-inf cases, greedy rule."""

from __future__ import annotations

import itertools

import pytest
import torch

import reference.verify as V
from reference.sampling import logits_to_probs
from reference.verify import (
    StrictVerifier,
    Verifier,
    VerifyResult,
    acceptance_prob,
    rejection_dist,
    verify_drafts,
)


def _dist(*xs):
    t = torch.tensor(xs, dtype=torch.float64)
    return t / t.sum()


# hand-built target rows p_0..p_3 and draft rows q_0..q_2 over V=5, with zeros on both sides
P = torch.stack(
    [
        _dist(0.5, 0.2, 0.0, 0.2, 0.1),
        _dist(0.05, 0.05, 0.6, 0.3, 0.0),
        _dist(0.25, 0.25, 0.25, 0.0, 0.25),
        _dist(0.1, 0.2, 0.3, 0.4, 0.0),
    ]
)
Q = torch.stack(
    [
        _dist(0.1, 0.3, 0.4, 0.0, 0.2),  # q(2) > 0 where p(2) = 0; q(3) = 0 where p(3) > 0
        _dist(0.2, 0.2, 0.2, 0.2, 0.2),
        _dist(0.0, 0.0, 0.5, 0.5, 0.0),
    ]
)


def round_law(p: torch.Tensor, q: torch.Tensor | None, k: int, fixed_drafts=None) -> dict[tuple, float]:
    """Exact law of one round's emitted tuple, enumerating drafts (weighted by q) and, analytically,
    the acceptance events (probabilities ``acceptance_prob``) and rejection samples (``rejection_dist``)."""
    Vn = p.shape[1]
    law: dict[tuple, float] = {}

    def add(key, w):
        if w > 0:
            law[key] = law.get(key, 0.0) + w

    seqs = [tuple(fixed_drafts)] if fixed_drafts is not None else itertools.product(range(Vn), repeat=k)
    for ds in seqs:
        w = 1.0
        if q is not None:
            for i, d in enumerate(ds):
                w *= float(q[i, d])
        if w == 0:
            continue
        reach = w
        for i, d in enumerate(ds):
            a = acceptance_prob(p[i], None if q is None else q[i], d)
            r = rejection_dist(p[i], None if q is None else q[i], d)
            for x in range(Vn):
                add(ds[:i] + (x,), reach * (1 - a) * float(r[x]))
            reach *= a
        for x in range(Vn):
            add(tuple(ds) + (x,), reach * float(p[k, x]))
    return law


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_one_step_output_law_equals_p_exactly(k):
    law = round_law(P[: k + 1], Q[:k] if k else None, k)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    first = torch.zeros(5, dtype=torch.float64)
    for key, w in law.items():
        first[key[0]] += w
    assert torch.allclose(first, P[0], atol=1e-9, rtol=0)
    # deeper positions: given the round reached position j (j tokens emitted before), token j ~ p_j
    for j in range(1, k + 1):
        reach = sum(w for key, w in law.items() if len(key) > j)
        cond = torch.zeros(5, dtype=torch.float64)
        for key, w in law.items():
            if len(key) > j:
                cond[key[j]] += w / reach
        assert torch.allclose(cond, P[j], atol=1e-9, rtol=0)


@pytest.mark.parametrize("d", range(5))
def test_one_hot_draft_law_equals_p(d):
    law = round_law(P[:2], None, 1, fixed_drafts=[d])
    first = torch.zeros(5, dtype=torch.float64)
    for key, w in law.items():
        first[key[0]] += w
    assert torch.allclose(first, P[0], atol=1e-9, rtol=0)


def test_broken_rule_law_differs_from_p():
    # sanity of the enumeration as an instrument: accepting every draft gives q, not p
    law = {(d,): float(Q[0, d]) for d in range(5)}
    first = torch.tensor([law.get((x,), 0.0) for x in range(5)], dtype=torch.float64)
    assert (first - P[0]).abs().sum() > 0.5


def test_acceptance_prob_edges():
    assert acceptance_prob(P[0], Q[0], 2) == 0.0  # p(d) = 0 never accepted
    assert acceptance_prob(P[0], Q[0], 3) == 0.0  # q(d) = 0: not a draft q could make
    assert acceptance_prob(P[0], Q[0], 0) == 1.0  # p >= q
    assert acceptance_prob(P[0], Q[0], 1) == pytest.approx(0.2 / 0.3, abs=1e-15)
    assert acceptance_prob(P[0], None, 0) == pytest.approx(0.5)
    r = rejection_dist(P[0], Q[0], 1)
    assert torch.allclose(r, _dist(0.4, 0.0, 0.0, 0.2, 0.0), atol=1e-15)
    # residual all zero (p == q) falls back to p
    assert torch.allclose(rejection_dist(P[0], P[0], 1), P[0])
    # one-hot: p with d removed
    assert torch.allclose(rejection_dist(P[0], None, 0), _dist(0.0, 0.2, 0.0, 0.2, 0.1))


def test_kernel_uses_threshold_exactly(monkeypatch):
    """The kernel accepts iff u < p(d)/q(d): probe u just below and at the threshold."""
    a = 0.2 / 0.3
    p, q, d = P[:2], Q[:1], torch.tensor([1])
    for u, expect in [(a * (1 - 1e-12), 1), (a, 0), (0.0, 1), (0.999999, 0)]:
        draws = iter([u])
        monkeypatch.setattr(V, "uniform", lambda g, _d=draws: next(_d))
        monkeypatch.setattr(V, "sample_from", lambda probs, g: int(torch.argmax(probs)))
        res = verify_drafts(p, q, d, None, greedy=False)
        assert res.n_accepted == expect
        # accepted -> bonus from p_1 (argmax 2); rejected -> residual argmax (token 0)
        assert res.next_token == (2 if expect else 0)


def _saturated(idx: int, V_: int = 6) -> torch.Tensor:
    logits = torch.full((V_,), float("-inf"))
    logits[idx] = 0.0
    return logits_to_probs(logits, temperature=1.0)


def test_saturated_all_accepted_gives_k_plus_1_tokens():
    k = 4
    toks = [3, 1, 4, 1, 5]
    p = torch.stack([_saturated(t) for t in toks])
    q = torch.stack([_saturated(t) for t in toks[:k]])
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        res = verify_drafts(p, q, torch.tensor(toks[:k]), g)
        assert res == VerifyResult(k, 5)
        res1 = verify_drafts(p, None, torch.tensor(toks[:k]), g)
        assert res1 == VerifyResult(k, 5)


@pytest.mark.parametrize("i", [0, 1, 2])
def test_reject_at_i_emits_residual_token(i):
    target = [2, 2, 2, 2]
    drafts = [2, 2, 2]
    drafts[i] = 4  # p(4) = 0 at position i -> must be rejected, residual = p = one-hot(2)
    p = torch.stack([_saturated(t) for t in target])
    q = torch.stack([_saturated(t) for t in drafts])
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        assert verify_drafts(p, q, torch.tensor(drafts), g) == VerifyResult(i, 2)
        assert verify_drafts(p, None, torch.tensor(drafts), g) == VerifyResult(i, 2)


def test_zero_probability_drafts_never_accepted():
    p = torch.stack([_dist(0.0, 0.5, 0.5), _dist(1, 1, 1)]).float()
    q_ok = torch.stack([_dist(0.5, 0.25, 0.25)]).float()
    q_zero = torch.stack([_dist(0.0, 0.5, 0.5)]).float()  # q(d=0) = 0 while drafting 0
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        assert verify_drafts(p, q_ok, torch.tensor([0]), g).n_accepted == 0  # p(d) = 0
        assert verify_drafts(p, None, torch.tensor([0]), g).n_accepted == 0
        assert verify_drafts(p, q_zero, torch.tensor([0]), g).n_accepted == 0  # q(d) = 0
    # and the emitted token never has p = 0
    toks = {verify_drafts(p, q_ok, torch.tensor([0]), g).next_token for _ in range(300)}
    assert toks == {1, 2}


def test_greedy_rule():
    p = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6]])
    assert verify_drafts(p, None, torch.tensor([1, 0]), None, greedy=True) == VerifyResult(2, 2)
    assert verify_drafts(p, None, torch.tensor([1, 1]), None, greedy=True) == VerifyResult(1, 0)
    assert verify_drafts(p, None, torch.tensor([0, 0]), None, greedy=True) == VerifyResult(0, 1)
    assert verify_drafts(p[:1], None, torch.zeros(0, dtype=torch.long), None, greedy=True) == VerifyResult(0, 1)


def test_greedy_consumes_no_randomness():
    g = torch.Generator().manual_seed(7)
    state = g.get_state().clone()
    p = torch.softmax(torch.randn(4, 11), -1)
    verify_drafts(p, None, torch.tensor([1, 2, 3]), g, greedy=True)
    assert torch.equal(g.get_state(), state)


def test_seeded_reproducible():
    p = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(1)), -1)
    q = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(2)), -1)
    d = torch.tensor([3, 4, 5])
    a = [verify_drafts(p, q, d, torch.Generator().manual_seed(s)) for s in range(30)]
    b = [verify_drafts(p, q, d, torch.Generator().manual_seed(s)) for s in range(30)]
    assert a == b
    assert len({(r.n_accepted, r.next_token) for r in a}) > 3


def test_shape_errors():
    with pytest.raises(ValueError, match="k\\+1"):
        verify_drafts(torch.ones(2, 5) / 5, None, torch.tensor([1, 2]), None)
    with pytest.raises(ValueError, match="q must be"):
        verify_drafts(torch.ones(3, 5) / 5, torch.ones(2, 4) / 4, torch.tensor([1, 2]), None)


def test_strict_verifier_is_a_verifier():
    v = StrictVerifier()
    assert isinstance(v, Verifier)
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert v.verify(p, None, torch.tensor([1]), None, False) == VerifyResult(1, 0)
