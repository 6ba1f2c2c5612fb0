"""Issue 40: a real vLLM with ngram speculation, greedy requests batched beside temperature-1 traffic, emits
unverified draft tokens in its greedy answers; each answer then goes on from a context the model did not choose, and
logprob-divergence over all greedy positions rejects mildly (p_adj 0.026, 1.82x the floor). On the positions before
each answer's first unverified token the reported logprobs match the reference, so the divergence is the unverified
tokens' doing: rule 1u (RELAXED_VERIFICATION) is the cause, not QUANTIZATION. A verified prefix that still diverges
keeps QUANTIZATION (a quantized engine that also skips verification)."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.check.measured_floors import FloorSet
from auditor.check.run_detectors import run_reference_detectors
from auditor.detectors import EvidenceBatch, compute_noise_floor
from auditor.detectors.consistency import at_or_after, first_unverified, self_greedy
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind
from auditor.verdict.questions import answer_questions
from tests.detectors.conftest import make_floor
from tests.verdict_results import mk


def _audit(prefix: dict | None) -> list:
    """The detectors of the vLLM ngram audit (default suite, SmolLM2-135M bf16, other customers' T=1 traffic):
    logprob-divergence's ``verified_prefix`` is ``prefix`` (None: not recorded, results stored before it)."""
    sg = mk("self-greedy", 3.0e-296, n=912, statistic=159, effect=0.174, n_clear=159, n_unverified=156,
            unverified_gap_nats=8.0, band=0.01, r0=1e-3,
            unverified_positions=[{"prompt_id": "code-greedy-55#0", "position": 17, "gap": 34.0, "reference_gap": 30.0}])
    lp = mk("logprob-divergence", 2.6e-3, n=912, effect=6.4e-4, ratio_to_floor=1.15, geometric_ratio=1.82,
            top1_agreement=0.98, m=5, n_prompts=26, confident_flip_ratio=0.825, confident_flips=0,
            confident_flips_expected=0.21, n_confident=837, sigma_hat=0.0517,
            **({"verified_prefix": prefix} if prefix is not None else {}))
    return [mk("greedy-match", 3.0e-296, n=912, statistic=159, effect=0.174, r0=1e-3, band=0.01), lp,
            mk("sampling-gof", 0.2, n=672), mk("sampling-argmax", 1.0, n=672, excess_per_position=-0.01),
            mk("sampling-tail", 1.0, n=672, deficit_per_position=-0.01, tail_ratio=1.0), sg]


def _prefix(p: float, n: int = 136, ran: bool = True) -> dict:
    return {"ran": ran, "p_value": p if ran else None, "n": n, "ratio_to_floor": 0.6, "geometric_ratio": 0.70,
            "top1_agreement": 0.99, "n_after_unverified": 912 - n, "reason": None if ran else "too few positions"}


def test_divergence_after_unverified_tokens_is_the_verification_cause() -> None:
    v = decide_verdict(_audit(_prefix(0.85)))
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION and v.details["rule"] == "1u-unverified-tokens", v.reason
    assert not any(c["verdict"] == "QUANTIZATION" for c in v.details["secondary_causes"])
    lp = next(f for f in v.details["findings"] if f["detector"] == "logprob-divergence")
    assert lp["explained_by"] == "RELAXED_VERIFICATION" and "136 positions before" in lp["implication"]
    assert "its divergence sits after unverified tokens" in v.reason and "p=0.85" in v.reason
    assert v.details["verified_prefix"]["explains_divergence"] is True
    precision, verification = answer_questions(v.verdict, v.details)
    assert verification.answer == "no"
    assert precision.answer in ("yes", "undecided") and "before each response's first unverified token" in precision.evidence


def test_a_verified_prefix_that_diverges_keeps_quantization() -> None:
    v = decide_verdict(_audit(_prefix(0.01)))
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["rule"].startswith("2-"), v.reason
    assert [c["rule"] for c in v.details["secondary_causes"]] == ["1u-unverified-tokens"]
    assert v.details["verified_prefix"]["explains_divergence"] is False
    assert [q.answer for q in answer_questions(v.verdict, v.details)] == ["no", "no"]


@pytest.mark.parametrize("prefix", [None, _prefix(0.85, n=5, ran=False), _prefix(0.85, n=9)])
def test_without_a_usable_verified_prefix_today_s_rule_stands(prefix: dict | None) -> None:
    v = decide_verdict(_audit(prefix))
    assert v.verdict == VerdictKind.QUANTIZATION, v.reason


def test_a_powered_verified_prefix_answers_precision_yes() -> None:
    v = decide_verdict(_audit(_prefix(0.85, n=800)), floor=make_floor(np.random.default_rng(0)))
    assert v.details["power"]["logprob-divergence"]["required_positions"] <= 800
    precision = answer_questions(v.verdict, v.details)[0]
    assert precision.answer == "yes", precision.evidence
    assert "explained by RELAXED_VERIFICATION" in precision.evidence


# ------------------------------------------------------------------------- the stage: which positions are verified
def _stage_batch(diverge_after: float, seed: int = 0) -> tuple[EvidenceBatch, np.ndarray, FloorSet]:
    """20 greedy responses of 10 positions; in the first 10 an unverified token at position 2 (a token 30 logits
    below the rest for provider and reference alike) after which the provider's logits move by ``diverge_after``."""
    rng = np.random.default_rng(seed)
    n, V = 200, 30
    prompts = np.repeat(np.arange(20), 10).astype(str)
    pos = np.tile(np.arange(10), 20)
    ref = rng.normal(size=(n, V)) * 2
    late = (pos >= 2) & (np.repeat(np.arange(20), 10) < 10)
    prov = ref + np.where(late[:, None], rng.normal(size=(n, V)) * diverge_after, 0.0)
    unv = late & (pos == 2)
    ref[unv, 0] = prov[unv, 0] = -40.0
    lp, pv = (x - np.log(np.exp(x).sum(1, keepdims=True)) for x in (ref, prov))
    tok = np.where(unv, 0, pv.argmax(1))
    top = np.argsort(-pv, 1)[:, :5]
    batch = EvidenceBatch.from_arrays(
        prompt_ids=prompts, positions=pos, token_ids=tok, temperatures=np.zeros(n),
        ref_full_logprobs=lp.astype(np.float32), provider_top_ids=top,
        provider_top_logprobs=np.take_along_axis(pv, top, 1), provider_token_logprobs=pv[np.arange(n), tok])
    fl = compute_noise_floor(ref, ref + rng.normal(size=(n, V)) * 0.01, prompt_ids=prompts)
    return batch, late, FloorSet("m", "r", {"a": fl})


def test_positions_at_or_after_the_first_unverified_token_are_marked() -> None:
    batch, late, _ = _stage_batch(0.0)
    assert self_greedy(batch).details["n_unverified"] == 10
    np.testing.assert_array_equal(at_or_after(first_unverified(batch, None), batch), late)
    # another batch's rows are matched by response and position (here: the same rows reversed)
    rev = batch.subset(np.arange(len(batch.token_ids))[::-1])
    np.testing.assert_array_equal(at_or_after(first_unverified(batch, None), rev), late[::-1])
    clean = batch.subset(~late)
    assert not at_or_after(first_unverified(clean, None), clean).any()
    # a sampling-only batch has no greedy position to test: nothing marked, no error (calibration's verification suite)
    sampled = EvidenceBatch.from_arrays(
        prompt_ids=batch.prompt_ids, positions=batch.positions, token_ids=batch.token_ids,
        temperatures=np.ones(len(batch.token_ids)), ref_full_logprobs=batch.ref_full_logprobs,
        provider_top_ids=batch.provider_top_ids, provider_top_logprobs=batch.provider_top_logprobs,
        provider_token_logprobs=batch.provider_token_logprobs)
    assert not at_or_after(first_unverified(sampled, None), sampled).any()


def test_the_stage_tests_the_verified_prefix_beside_the_whole() -> None:
    batch, late, floors = _stage_batch(1.0)
    res = {r.name: r for r in run_reference_detectors({"a": batch}, floors)}
    lp = res["logprob-divergence"]
    assert lp.ran and lp.p_value < 1e-6  # the whole diverges: the answers continue from unverified tokens
    vp = lp.details["verified_prefix"]
    assert vp["ran"] and vp["n"] == int((~late).sum()) and vp["n_after_unverified"] == int(late.sum())
    assert vp["p_value"] > 0.05  # the positions before them match the reference
    # no unverified token: no verified-prefix feature
    clean = {r.name: r for r in run_reference_detectors({"a": batch.subset(~late)}, floors)}
    assert "verified_prefix" not in (clean["logprob-divergence"].details or {})
