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


def _with_improbable(count: int, positions: int = 288, self_p: float = 0.4) -> list:
    """``_sampling_only`` whose sampled tokens pass the PIT test but hold ``count`` tokens at <= -20 nats of the
    provider's own distribution (vLLM 0.32's ngram path at one request at a time)."""
    from auditor.detectors.stats import improbable_draws

    lp = np.full(positions, -1.0)
    lp[:count] = -27.0
    res = _sampling_only(self_p)
    res[0].details["sampled_self"]["improbable"] = improbable_draws(lp)
    return res


def test_improbable_tokens_of_the_providers_own_distribution_are_not_a_weight_cause() -> None:
    v = decide_verdict(_with_improbable(7))
    assert v.verdict == VerdictKind.RELAXED_VERIFICATION and v.details["rule"] == "4d-relaxed", v.reason
    assert "7 of 288 sampled tokens at <= -20 nats" in v.reason and "not from the weights" in v.reason
    assert "PIT at" not in v.reason  # the PIT test did not reject: the reason quotes only what did


def test_one_improbable_token_keeps_the_weight_cause() -> None:
    from auditor.detectors.stats import improbable_draws
    from auditor.verdict.cause import SAMPLED_IMPROBABLE_TEST_LEVEL

    one = improbable_draws(np.r_[-27.0, np.full(287, -1.0)])
    assert one["p_value"] > SAMPLED_IMPROBABLE_TEST_LEVEL  # 288 x 5.4e-4: one such token is not rare enough
    v = decide_verdict(_with_improbable(1))
    assert v.verdict == VerdictKind.QUANTIZATION and v.details["rule"] == "4d-quantization", v.reason


def _boundary_draws(rng: np.random.Generator, n: int, vocab: int, eps: float) -> np.ndarray:
    """Log-probabilities of n tokens drawn from the distribution that makes the improbable-draw bound tight:
    vocab - 1 tokens at exactly eps, the rest of the mass on one token."""
    low = rng.random(n) < (vocab - 1) * eps
    return np.where(low, np.log(eps), np.log1p(-(vocab - 1) * eps))


def test_improbable_draws_is_calibrated_where_its_bound_is_tight() -> None:
    """Under H0 (every token drawn from the distribution it is reported from) P(p <= a) <= a, over 4,000 seeded
    audits at the distribution that makes the bound exact (q = vocab x eps, here 5.4e-4 per token, 288 tokens)."""
    from auditor.detectors.stats import IMPROBABLE_LOGPROB, MAX_VOCAB, improbable_draws

    rng = np.random.default_rng(0)
    eps = np.exp(IMPROBABLE_LOGPROB)
    ps = np.array([improbable_draws(_boundary_draws(rng, 288, MAX_VOCAB, eps))["p_value"] for _ in range(4000)])
    for a in (0.001, 0.01, 0.05, 0.2):
        # binomial slack of 3 SDs around a, so the assertion fails for a test whose size exceeds its level
        assert np.mean(ps <= a) <= a + 3 * np.sqrt(a * (1 - a) / ps.size), (a, np.mean(ps <= a))


def test_improbable_draws_finds_unverified_drafts() -> None:
    """Power: 5% of the sampled tokens at -20 to -50 nats (what vLLM's ngram path emitted) → p at most the rule's
    level in >= 99% of 500 seeded audits of 288 sampled tokens (a 300-token ``verification`` audit) and >= 90% of
    130; a real sampler's tokens (none such) → p = 1."""
    from auditor.detectors.stats import improbable_draws
    from auditor.verdict.cause import SAMPLED_IMPROBABLE_TEST_LEVEL

    rng = np.random.default_rng(1)
    for n, want in ((288, 0.99), (130, 0.90)):
        hits = 0
        for _ in range(500):
            lp = -rng.exponential(1.0, n)
            bad = rng.random(n) < 0.05
            lp[bad] = rng.uniform(-50, -20, int(bad.sum()))
            hits += improbable_draws(lp)["p_value"] <= SAMPLED_IMPROBABLE_TEST_LEVEL
        assert hits / 500 >= want, (n, hits)
    clean = improbable_draws(np.r_[-rng.exponential(1.0, 130), np.nan])
    assert clean == {"count": 0, "positions": 130, "bound_per_position": pytest.approx(5.4e-4, rel=0.01),
                     "p_value": 1.0}
