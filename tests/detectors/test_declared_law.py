"""Issue 35 item 4: sampling tests against a provider's declared law (enforced top_p / top_k):
calibrated when the tokens follow the declared law, powerful when they follow another."""

from __future__ import annotations

import numpy as np

from auditor.detectors import EvidenceBatch
from auditor.detectors.sampling import gof_test, reference_view, tail_test


def _batch(rng, n, top_p, *, sample_top_p, k=20, vocab=40):
    """n positions of Dirichlet laws over ``vocab`` tokens, the reference's top-k listed; tokens drawn
    from the law cut to ``sample_top_p`` (the provider's), the batch declaring ``top_p``."""
    logits = rng.normal(0, 2.0, size=(n, vocab))
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    order = np.argsort(-lp, axis=1)
    toks = np.empty(n, np.int64)
    for i in range(n):
        p = np.exp(lp[i, order[i]])
        keep = np.searchsorted(np.cumsum(p), sample_top_p - 1e-12) + 1
        q = np.zeros_like(p)
        q[:keep] = p[:keep] / p[:keep].sum()
        toks[i] = order[i, rng.choice(vocab, p=q)]
    top = order[:, :k]
    return EvidenceBatch.from_arrays(prompt_ids=[f"p{i // 50}" for i in range(n)], token_ids=toks, temperatures=1.0,
                                     ref_top_ids=top, ref_top_logprobs=np.take_along_axis(lp, top, 1), top_ps=top_p)


def test_gof_under_the_declared_nucleus_is_calibrated() -> None:
    """Tokens sampled from the 0.95 nucleus, tested against the declared 0.95 law: p-values uniform
    (rejection share at 0.05 within its binomial range over 200 seeded batches)."""
    ps = []
    for s in range(200):
        b = _batch(np.random.default_rng(s), 150, 0.95, sample_top_p=0.95)
        ps.append(gof_test(reference_view(b), rng=s)["p_value"])
    ps = np.asarray(ps)
    assert (ps <= 0.05).mean() <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 200), (ps <= 0.05).mean()


def test_tokens_outside_the_declared_nucleus_are_caught() -> None:
    """A provider that samples the whole distribution while declaring top_p = 0.8 emits tokens the
    declared law gives no mass (U = 1): the PIT test rejects in nearly every batch (power)."""
    rej = 0
    for s in range(40):
        b = _batch(np.random.default_rng(1000 + s), 150, 0.8, sample_top_p=1.0)
        rej += gof_test(reference_view(b), rng=s)["p_value"] <= 0.05
    assert rej >= 38, rej


def test_declared_law_cuts_renormalises_and_drops_unknown_rows() -> None:
    probs = np.array([[0.5, 0.3, 0.15, 0.05], [0.3, 0.3, 0.2, 0.1]])  # row 1 lists only 0.9 of its mass
    b = EvidenceBatch.from_arrays(prompt_ids=["a", "b"], token_ids=[3, 0], temperatures=1.0,
                                  ref_top_ids=np.array([[0, 1, 2, 3], [0, 1, 2, 3]]), ref_top_logprobs=np.log(probs),
                                  top_ps=0.95)
    v = reference_view(b)
    assert v.unknown_law == 1 and v.idx.tolist() == [0] and "does not reach" in v.left_out()
    assert np.allclose(v.top_probs[0], [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    assert v.token_rank.tolist() == [-1]  # token 3 lies outside the nucleus: no mass under the law
    assert tail_test(v)["observed"] == 1
    # top-k first (renormalised over the listed top-2), then top-p over that law
    b2 = EvidenceBatch.from_arrays(prompt_ids=["a"], token_ids=[1], temperatures=1.0,
                                   ref_top_ids=np.array([[0, 1, 2, 3]]), ref_top_logprobs=np.log(probs[:1]), top_ks=2)
    v2 = reference_view(b2)
    assert np.allclose(v2.top_probs[0], [0.625, 0.375, 0, 0]) and v2.token_rank.tolist() == [1]
