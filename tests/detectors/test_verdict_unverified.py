"""Rule 1u (issue 40 item 3): self-greedy contradictions far below the own top-1 are unverified tokens
(RELAXED_VERIFICATION); small gaps (a penalty, a 2nd-ranked pick) stay DECODING_NONCOMPLIANT."""

from __future__ import annotations

import numpy as np

from auditor.detectors.base import EvidenceBatch
from auditor.detectors.consistency import UNVERIFIED_GAP_NATS, self_greedy
from auditor.verdict.decide import decide_verdict


def _batch(gap: float, n: int = 400, n_contra: int = 40, seed: int = 0, ref_gap: float | None = None) -> EvidenceBatch:
    """Greedy positions: provider top-2 = ids (1, 2); ``n_contra`` positions emit id 2 at ``gap`` nats below
    (the reference, when ``ref_gap`` is given, ranks the same two ids ``ref_gap`` nats apart)."""
    rng = np.random.default_rng(seed)
    tok = np.ones(n, np.int64)
    contra = rng.choice(n, n_contra, replace=False)
    tok[contra] = 2
    lp1 = np.full(n, -0.3)
    ids = np.tile(np.array([[1, 2]], np.int64), (n, 1))
    lps = np.stack([lp1, lp1 - gap], 1)
    p_tok = np.where(tok == 1, lp1, lp1 - gap)
    rl1 = np.full(n, -0.7)  # the reference top-1 (its two listed ids stay within mass 1)
    ref = {} if ref_gap is None else {"ref_top_ids": ids, "ref_top_logprobs": np.stack([rl1, rl1 - ref_gap], 1),
                                      "ref_token_logprobs": np.where(tok == 1, rl1, rl1 - ref_gap)}
    return EvidenceBatch.from_arrays(
        prompt_ids=np.array([f"p{i // 40}" for i in range(n)], object), positions=np.arange(n) % 40,
        token_ids=tok, temperatures=np.zeros(n), provider_top_ids=ids, provider_top_logprobs=lps,
        provider_token_logprobs=p_tok, provider_trusted=np.ones(n, bool), **ref,
    )


def test_far_contradictions_are_unverified_tokens() -> None:
    r = self_greedy(_batch(gap=UNVERIFIED_GAP_NATS + 6))
    assert r.details["n_unverified"] == 40 and len(r.details["unverified_positions"]) == 20
    v = decide_verdict([r])
    assert v.verdict == "RELAXED_VERIFICATION" and v.details["rule"] == "1u-unverified-tokens", v.reason
    assert "unverified" in v.reason or "without strict verification" in v.reason


def test_near_contradictions_stay_decoding_noncompliant() -> None:
    r = self_greedy(_batch(gap=2.0))
    assert r.details["n_unverified"] == 0
    v = decide_verdict([r])
    assert v.verdict == "DECODING_NONCOMPLIANT" and v.details["rule"] == "1-self-greedy", v.reason


def test_the_reference_must_agree_that_the_token_is_far_down() -> None:
    """Far below the provider's own top-1 but a near-tie for the reference: not counted as unverified."""
    assert self_greedy(_batch(gap=UNVERIFIED_GAP_NATS + 6, ref_gap=1.0)).details["n_unverified"] == 0
    r = self_greedy(_batch(gap=UNVERIFIED_GAP_NATS + 6, ref_gap=UNVERIFIED_GAP_NATS + 2))
    assert r.details["n_unverified"] == 40
    assert r.details["unverified_positions"][0]["reference_gap"] >= UNVERIFIED_GAP_NATS


def test_a_few_unverified_among_many_near_contradictions_stay_decoding_noncompliant() -> None:
    near, far = _batch(gap=2.0, n_contra=40), _batch(gap=UNVERIFIED_GAP_NATS + 6, n_contra=40, seed=1)
    r = self_greedy(EvidenceBatch.from_arrays(
        prompt_ids=np.concatenate([near.prompt_ids, far.prompt_ids[:40]]),
        positions=np.concatenate([near.positions, far.positions[:40]]),
        token_ids=np.concatenate([near.token_ids, far.token_ids[:40]]),
        temperatures=np.zeros(440),
        provider_top_ids=np.concatenate([near.provider_top_ids, far.provider_top_ids[:40]]),
        provider_top_logprobs=np.concatenate([near.provider_top_logprobs, far.provider_top_logprobs[:40]]),
        provider_token_logprobs=np.concatenate([near.provider_token_logprobs, far.provider_token_logprobs[:40]]),
        provider_trusted=np.ones(440, bool),
    ))
    assert 0 < r.details["n_unverified"] < r.details["n_clear"] / 2
    assert decide_verdict([r]).verdict == "DECODING_NONCOMPLIANT"
