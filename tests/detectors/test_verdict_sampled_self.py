"""Rule 4d's self-consistency evidence (issue 35, ``think:synthetic-acceptance:3`` on the ``verification`` suite):
an audit whose only evidence is sampled has no logprob test (it runs at T = 0) and, with a reference, no ``self-*``
tests, so ``sampling-gof`` carries the sampled tokens tested against the provider's own reported top_logprobs
(``details["sampled_self"]``). Tokens that contradict the distribution the provider itself reports are no weight
cause's doing — a quantized or another model samples from what it computes — so rule 4d names the verification
side (RELAXED_VERIFICATION, or the undetermined sampler pair without speculation), never QUANTIZATION."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.detectors.sampling import CAUSE_FEATURE_MAX_P, sampling_argmax, sampling_gof, sampling_tail
from auditor.verdict.cause import SAMPLED_SELF_TEST_LEVEL
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import VerdictKind
from tests.detectors.conftest import dirichlet_logprobs, make_batch, normalise, prompt_labels, sample_rows
from tests.verdict_results import mk

#: The sampled path of the failing audit (``think:synthetic-acceptance:3``, ``verification``, 300 tokens, audit 0 of
#: seed 0): the provider's top_logprobs are the reference's (σ̂ 6e-6 nats; int4's 0.85-1.03), no confident flip.
FAITHFUL_PATH = {"confident_flip_ratio": 1.0, "confident_flips": 0, "confident_flips_expected": 0.0,
                 "n_confident": 288, "sigma_hat": 6.4e-6, "confident_margin_sigmas": 3.0, "confident_flip_p": 1.0,
                 "margin_bins": [], "n_positions": 288}


def _sampling_only(self_p: float | None) -> list:
    """The detectors of a ``verification``-suite audit (sampling only, top_logprobs 5) whose ``sampling-gof``
    rejects with the argmax under-emitted and the tail intact — ``think:synthetic-acceptance:3`` at 300 tokens —
    and whose sampled tokens tested against the provider's own list give ``self_p`` (None: not recorded)."""
    own = None if self_p is None else {"n_positions": 288, "p_value": self_p, "statistic": 2.94, "mean_u": 0.588,
                                       "frac_u_below_0.1": 0.08, "frac_u_above_0.9": 0.17}
    gof = mk("sampling-gof", 1.8e-9, n=288, sampled_path=FAITHFUL_PATH, **({"sampled_self": own} if own else {}))
    return [gof,
            mk("sampling-argmax", 0.99, n=288, excess_per_position=-0.108, argmax_rate=0.17, expected_rate=0.28),
            mk("sampling-tail", 0.99, n=288, mean_tail_mass=0.1, tail_ratio=1.44, deficit_per_position=-0.16)]


def test_tokens_against_the_providers_own_distribution_are_not_a_weight_cause() -> None:
    v = decide_verdict(_sampling_only(1.8e-7))
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION and v.details["rule"] == "4d-relaxed", v.reason
    assert "own reported top_logprobs" in v.reason and "not from the weights" in v.reason
    assert v.details["shape"]["sampled_self_p"] == pytest.approx(1.8e-7)
    assert v.details["cause_established"] is True


def test_self_consistent_samples_keep_the_weight_cause() -> None:
    """A quantized copy samples from the distribution it reports: the weight cause stands (and so it did
    before the evidence existed: older results without ``sampled_self``)."""
    for p in (None, 0.4, SAMPLED_SELF_TEST_LEVEL * 1.1):
        v = decide_verdict(_sampling_only(p))
        assert v.verdict == VerdictKind.QUANTIZATION and v.details["rule"] == "4d-quantization", (p, v.reason)


def test_without_speculation_the_sampler_pair_is_named() -> None:
    v = decide_verdict(_sampling_only(1e-7), speculation={"detected": False, "mean_accepted_tokens_per_step": 1.0})
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT, v.reason
    assert v.details["rule"] == "4-mechanism-undetermined"


def test_honest_audits_stay_pass() -> None:
    """The evidence names a cause only after a rejection: it never makes one."""
    res = _sampling_only(1e-7)
    res[0] = mk("sampling-gof", 0.5, n=288, sampled_path=FAITHFUL_PATH,
                sampled_self={"n_positions": 280, "p_value": 1e-7, "mean_u": 0.58})
    assert decide_verdict(res).verdict in (VerdictKind.PASS, VerdictKind.INCONCLUSIVE)


def _world(kind: str, seed: int = 3, g: int = 40, length: int = 12):
    """Sampled positions (T = 1, provider top_logprobs 5) of a provider that reports its target's logprobs and
    emits ``drafts``: at 3 of 4 positions a token of a flatter drafter, unverified; or ``quantized``: samples
    what it reports, a model flatter than the reference (its logits / 1.5)."""
    rng = np.random.default_rng(seed)
    ref = dirichlet_logprobs(rng, g, length, alpha_range=(0.05, 0.5))
    if kind == "drafts":
        served = ref
        drafter = normalise(ref * 0.5 + rng.normal(0, 1.0, ref.shape))
        tok = np.where(np.arange(ref.shape[0]) % 4 != 3, sample_rows(rng, drafter), sample_rows(rng, ref))
    else:
        served = normalise(ref / 1.5)
        tok = sample_rows(rng, served)
    return make_batch(rng, ref, served, tok, 1.0, prompt_labels(g, length), m_provider=5)


WEIGHT_CAUSES = (VerdictKind.QUANTIZATION, VerdictKind.QUANTIZATION_OR_SUBSTITUTION, VerdictKind.SUBSTITUTION)


@pytest.mark.parametrize(("kind", "want"), [("drafts", (VerdictKind.RELAXED_VERIFICATION,)),
                                            ("quantized", WEIGHT_CAUSES)])
def test_sampling_gof_records_the_samples_against_the_providers_own_list(kind: str, want: tuple) -> None:
    b = _world(kind)
    gof = sampling_gof(b)
    assert gof.p_value <= CAUSE_FEATURE_MAX_P
    own = gof.details["sampled_self"]
    assert own["n_positions"] == gof.n
    assert (own["p_value"] <= SAMPLED_SELF_TEST_LEVEL) is (kind == "drafts"), own
    v = decide_verdict([gof, sampling_argmax(b), sampling_tail(b)])
    assert v.verdict in want and v.details["rule"].startswith("4d"), v.reason


def test_no_record_without_provider_logprobs_or_a_small_gof_p() -> None:
    rng = np.random.default_rng(1)
    ref = dirichlet_logprobs(rng, 40, 12)
    labels = prompt_labels(40, 12)
    honest = sampling_gof(make_batch(rng, ref, ref, sample_rows(rng, ref), 1.0, labels, m_provider=5))
    assert honest.p_value > CAUSE_FEATURE_MAX_P and "sampled_self" not in honest.details
    flat = normalise(ref * 0.3)
    no_lists = sampling_gof(make_batch(rng, ref, ref, sample_rows(rng, flat), 1.0, labels, m_provider=0))
    assert no_lists.p_value <= CAUSE_FEATURE_MAX_P and "sampled_self" not in no_lists.details
