"""Lossy verification rules for the simulator, pluggable into ``speculative_generate(verifier=...)``.

Each class implements the reference ``Verifier`` protocol (``reference/verify.py``)::

    verify(p [k+1, V], q [k, V] | None, draft_ids [k] int64, generator, greedy) -> VerifyResult

``p`` is the target distribution after the request's sampling processing (temperature, top-k,
top-p); for greedy requests the loop passes softmax of the raw logits. Every random draw comes
from ``generator`` (float64 uniforms via ``reference.sampling``), so outputs are reproducible.

The rules (``../shared/REFERENCES.md``, "Lossy behaviours to simulate"):

- :class:`RelaxedThresholdVerifier` — SGLang ``--speculative-accept-threshold-single`` (s) and
  ``--speculative-accept-threshold-acc`` (a), target-only chain verification: emit draft d with
  probability 1 if p(d) >= s, else with probability min(1, p(d)/a); on rejection emit y != d with
  probability proportional to p(y). Greedy requests are verified strictly (argmax).
- :class:`TypicalAcceptanceVerifier` — Medusa (Cai et al. 2024) / vLLM V0
  ``TypicalAcceptanceSampler``: accept d iff p(d) > min(epsilon, delta * exp(-H(p))); at the first
  rejection emit argmax p; the bonus token (all drafts accepted) is sampled from p.
- :class:`GreedyVerifyVerifier` — sampling requests verified greedily (an engine bug class):
  the output is the argmax chain whatever the temperature.
- :class:`GreedyRelaxedVerifier` — at temperature 0 a draft is accepted when it is in the target's
  top-2 and within ``margin`` nats of the argmax (what public reports show when speculation
  changes greedy output at non-ties; issue 14); sampling requests are verified strictly.
- :class:`NoncompliantGreedyVerifier` — greedy requests emit the 2nd-ranked token at a seeded
  rate instead of the argmax (a decode path unlike the scoring path); sampling is strict. The loop
  still reports the true target logprobs.
- :class:`UnverifiedMixedBatchVerifier` — greedy requests get unverified draft tokens in rounds
  that share the batch with sampled traffic (issue 40 item 3, a real vLLM with ngram speculation);
  sampling is strict. The loop still reports the true target logprobs.

Draft fallback ("ideal draft head"): when the drafter proposes nothing (k = 0: the n-gram found no
match), the relaxed and typical rules can draw a stand-in draft d ~ p themselves — an ideal draft
head whose q equals p (what EAGLE/MTP heads approximate), costing no forward pass. Under the
strict rule such a draft is always accepted (lossless), so the output law then differs from p
exactly by the lossy acceptance rule. This keeps relaxed acceptance active on every sampling step
(measurable on chat prompts where prompt lookup rarely fires). ``ideal_fallback=False`` turns it off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from reference.sampling import sample_from, uniform
from reference.verify import VerifyResult, verify_drafts

if TYPE_CHECKING:
    from reference.verify import Verifier
    from simulator.profiles import Profile


def _drafts(draft_ids: torch.Tensor) -> list[int]:
    return [int(x) for x in draft_ids.reshape(-1).tolist()]


def _check(p: torch.Tensor, drafts: list[int]) -> None:
    if p.dim() != 2 or p.shape[0] != len(drafts) + 1:
        raise ValueError(f"p must be [k+1, V] with k={len(drafts)} drafts, got shape {tuple(p.shape)}")


def _sample_without(pi: torch.Tensor, d: int, generator: torch.Generator | None) -> int:
    """Sample y != d with probability proportional to p(y) (p itself if d carries all the mass)."""
    rest = pi.clone()
    rest[d] = 0.0
    if float(rest.sum()) <= 0.0:
        return int(d)
    return sample_from(rest, generator)


def _relaxed_verify(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_ids: torch.Tensor,
    generator: torch.Generator | None,
    greedy: bool,
    *,
    rule_applies: bool,
    ideal_fallback: bool,
    accept: Callable[[torch.Tensor, int], bool],
    on_reject: Callable[[torch.Tensor, int], int],
    bonus: Callable[[torch.Tensor], int],
) -> VerifyResult:
    """Verify a draft chain under a relaxed rule, or strictly where the rule does not apply.

    The ``verify`` shared by the lossy verifiers (``Verifier`` protocol arguments first).

    Args:
        p: target distribution ``[k+1, V]`` float.
        q: draft distribution ``[k, V]`` or None (used by the strict path of sampling requests).
        draft_ids: the k draft token ids ``[k]`` int64.
        generator: source of every random draw.
        greedy: the request is greedy (T = 0).
        rule_applies: False: verify strictly (``reference.verify.verify_drafts``) instead.
        ideal_fallback: with k = 0, draw a stand-in draft d ~ p[0] and test it like a real one.
        accept: ``(p_i [V], d) -> bool``, whether draft d is accepted at position i.
        on_reject: ``(p_i [V], d) -> token`` emitted at the first rejection.
        bonus: ``p_k [V] -> token`` emitted after every draft was accepted.

    Returns:
        ``VerifyResult(accepted drafts, emitted token)``; calls are made in chain order, so every
        random draw comes from ``generator`` in the same order as a hand-written loop.

    Raises:
        ValueError: ``p`` is not ``[k+1, V]``.
    """
    drafts = _drafts(draft_ids)
    _check(p, drafts)
    if not rule_applies:
        return verify_drafts(p, None if greedy else q, draft_ids, generator, greedy=greedy)
    if not drafts and ideal_fallback:
        d = sample_from(p[0], generator)
        return VerifyResult(0, d if accept(p[0], d) else on_reject(p[0], d))
    for i, d in enumerate(drafts):
        if not accept(p[i], d):
            return VerifyResult(i, on_reject(p[i], d))
    return VerifyResult(len(drafts), bonus(p[len(drafts)]))


class RelaxedThresholdVerifier:
    """SGLang-style relaxed acceptance (``Verifier`` protocol); see the module docstring.

    Args:
        threshold_single: s in (0, 1]; drafts with p(d) >= s are always accepted (SGLang default
            1.0 = lossless; the simulator's profile default is 0.5).
        threshold_acc: a in (0, 1]; otherwise accept with probability min(1, p(d)/a).
        ideal_fallback: draw a stand-in draft d ~ p when no draft was proposed (k = 0).

    Raises:
        ValueError: thresholds outside (0, 1].
    """

    name = "relaxed-threshold"

    def __init__(self, threshold_single: float = 0.5, threshold_acc: float = 1.0, ideal_fallback: bool = True):
        if not (0.0 < threshold_single <= 1.0) or not (0.0 < threshold_acc <= 1.0):
            raise ValueError(
                f"accept thresholds must be in (0, 1]: single={threshold_single}, acc={threshold_acc}"
            )
        self.s = float(threshold_single)
        self.a = float(threshold_acc)
        self.ideal_fallback = bool(ideal_fallback)

    def accept_probability(self, pd: float) -> float:
        """Probability of emitting a draft whose target probability is ``pd``."""
        if pd <= 0.0:
            return 0.0
        if pd >= self.s:
            return 1.0
        return min(1.0, pd / self.a)

    def _one(self, pi: torch.Tensor, d: int, generator: torch.Generator | None) -> bool:
        u = uniform(generator)
        return u < self.accept_probability(float(pi[d]))

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """Relaxed verification of a chain of drafts (q is ignored: SGLang's target-only rule)."""
        return _relaxed_verify(
            p, q, draft_ids, generator, greedy,
            rule_applies=not greedy,
            ideal_fallback=self.ideal_fallback,
            accept=lambda pi, d: self._one(pi, d, generator),
            on_reject=lambda pi, d: _sample_without(pi, d, generator),
            bonus=lambda pi: sample_from(pi, generator),
        )


def entropy_nats(pi: torch.Tensor) -> float:
    """Shannon entropy (nats) of a ``[V]`` probability vector (0 log 0 = 0)."""
    x = pi.to(torch.float64)
    nz = x[x > 0]
    return float(-(nz * nz.log()).sum())


class TypicalAcceptanceVerifier:
    """Typical acceptance (Medusa; vLLM V0), ``Verifier`` protocol; see the module docstring.

    Args:
        epsilon: hard threshold (0.09).
        delta: entropy factor (0.3); threshold = min(epsilon, delta * exp(-H(p))) with H in nats.
        ideal_fallback: draw a stand-in draft d ~ p when no draft was proposed (k = 0).
    """

    name = "typical-acceptance"

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3, ideal_fallback: bool = True):
        if not (0.0 <= epsilon <= 1.0) or delta < 0.0:
            raise ValueError(f"typical acceptance needs 0 <= epsilon <= 1 and delta >= 0 (got {epsilon}, {delta})")
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.ideal_fallback = bool(ideal_fallback)

    def threshold(self, pi: torch.Tensor) -> float:
        """min(epsilon, delta * exp(-H(p_i)))."""
        return min(self.epsilon, self.delta * math.exp(-entropy_nats(pi)))

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """Typical acceptance of a chain: deterministic accept test, argmax on rejection, bonus ~ p."""
        return _relaxed_verify(
            p, q, draft_ids, generator, greedy,
            rule_applies=not greedy,
            ideal_fallback=self.ideal_fallback,
            accept=lambda pi, d: float(pi[d]) > self.threshold(pi),
            on_reject=lambda pi, d: int(pi.argmax()),
            bonus=lambda pi: sample_from(pi, generator),
        )


class GreedyVerifyVerifier:
    """Verifies every request greedily (argmax chain), ignoring temperature/top-p (``Verifier``)."""

    name = "greedy-verify"

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """Greedy verification whatever ``greedy`` says (p's argmax is temperature-invariant)."""
        _check(p, _drafts(draft_ids))
        return verify_drafts(p, None, draft_ids, generator, greedy=True)


class NoncompliantGreedyVerifier:
    """Greedy requests emit the 2nd-ranked token with probability ``flip_rate`` per position.

    At each verified position i the "decode path" token is ``argmax p_i`` or, when a coin
    u ~ U[0,1) from ``generator`` falls below ``flip_rate``, the 2nd-ranked token of p_i. Drafts are
    accepted while they equal that token (as in greedy verification). Sampling requests are verified
    strictly. Logprobs reported by the loop stay the true target's.

    Args:
        flip_rate: probability in [0, 1] of emitting the 2nd-ranked token at a greedy position.
    """

    name = "decode-noncompliant"

    def __init__(self, flip_rate: float = 0.1):
        if not (0.0 <= flip_rate <= 1.0):
            raise ValueError(f"flip_rate={flip_rate} must be in [0, 1]")
        self.flip_rate = float(flip_rate)
        self.n_flipped = 0
        self.n_greedy_positions = 0

    def _decode_token(self, pi: torch.Tensor, generator: torch.Generator | None) -> int:
        top2 = torch.topk(pi, 2).indices.tolist()
        self.n_greedy_positions += 1
        if uniform(generator) < self.flip_rate:
            self.n_flipped += 1
            return int(top2[1])
        return int(top2[0])

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """Greedy: chain of decode-path tokens (see class doc); sampling: strict."""
        drafts = _drafts(draft_ids)
        _check(p, drafts)
        if not greedy:
            return verify_drafts(p, q, draft_ids, generator, greedy=False)
        for i, d in enumerate(drafts):
            t = self._decode_token(p[i], generator)
            if d != t:
                return VerifyResult(i, t)
        return VerifyResult(len(drafts), self._decode_token(p[len(drafts)], generator))


class _GreedyPathRule:
    """The verification both greedy-path relaxed rules share (``Verifier`` protocol): on a greedy
    request each draft is accepted when :meth:`accepts` says so; the first rejection and the bonus
    emit the argmax. Sampling requests are verified strictly. Subclasses set ``ideal_fallback`` and
    define ``accepts(pi [V] float, d) -> bool``."""

    ideal_fallback: bool

    def accepts(self, pi: torch.Tensor, d: int) -> bool:
        raise NotImplementedError

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """Relaxed greedy chain for greedy requests (see class doc); strict for sampling."""
        return _relaxed_verify(
            p, q, draft_ids, generator, greedy,
            rule_applies=greedy,
            ideal_fallback=self.ideal_fallback,
            accept=self.accepts,
            on_reject=lambda pi, d: int(pi.argmax()),
            bonus=lambda pi: int(pi.argmax()),
        )


class GreedyRelaxedVerifier(_GreedyPathRule):
    """Greedy verification that also accepts a near-argmax 2nd-ranked draft (``Verifier`` protocol).

    Greedy requests: at position i with log-probabilities ``l = log p_i``, draft d is accepted iff
    d == argmax, or d is the 2nd-ranked token and ``l[argmax] - l[d] <= margin`` (nats). At the
    first rejection the argmax is emitted; the bonus token is the argmax. When the drafter proposed
    nothing and ``ideal_fallback`` is on, a stand-in draft d ~ p_0 is drawn (an ideal draft head,
    q = p) and judged by the same rule, so the rule acts at every greedy step. Sampling requests
    are verified strictly (lossless).

    Args:
        margin: acceptance margin in nats (>= 0; issue 14 uses 0.5).
        ideal_fallback: draw a stand-in draft when none was proposed.

    Raises:
        ValueError: negative margin.
    """

    name = "greedy-relaxed"

    def __init__(self, margin: float = 0.5, ideal_fallback: bool = True):
        if margin < 0:
            raise ValueError(f"greedy-relaxed margin={margin} must be >= 0 nats")
        self.margin = float(margin)
        self.ideal_fallback = bool(ideal_fallback)
        self.n_relaxed = 0  # drafts accepted that were not the argmax

    def accepts(self, pi: torch.Tensor, d: int) -> bool:
        """True when draft ``d`` is the argmax of ``pi`` ``[V]``, or its 2nd-ranked token within the margin."""
        top = torch.topk(pi.to(torch.float64), 2)
        i1, i2 = int(top.indices[0]), int(top.indices[1])
        if d == i1:
            return True
        if d != i2 or float(top.values[1]) <= 0.0:
            return False
        ok = math.log(float(top.values[0])) - math.log(float(top.values[1])) <= self.margin
        self.n_relaxed += int(ok)
        return ok


class UnverifiedMixedBatchVerifier:
    """Greedy rounds batched with sampled traffic emit unverified tokens (``Verifier`` protocol).

    Issue 40, item 3, measured on vLLM 0.32 (CPU build) with ngram speculation: when greedy and
    temperature-1 requests share a batch (the auditor's own mix, or other customers' traffic on a
    shared endpoint), the greedy responses carry tokens the target rejects (``<|endoftext|>`` at
    logprob −16.0 where its own top-1 is −0.52, ' TType' at −38.8; 4–44 per 64-token response); all-greedy
    batches or one request at a time carry none. Here each greedy verification round shares the batch
    with sampled requests with probability ``rate`` (a seeded coin from ``generator``): such a round keeps
    its drafts unverified and then emits a token drawn uniformly from the vocabulary (a draft checked
    against another request's row). Other greedy rounds and every sampling request are verified strictly.

    Args:
        rate: probability in [0, 1] that a greedy round shares the batch with sampled traffic.

    Raises:
        ValueError: ``rate`` outside [0, 1].
    """

    name = "unverified-mixed-batch"

    def __init__(self, rate: float = 0.1):
        if not (0.0 <= rate <= 1.0):
            raise ValueError(f"unverified rate={rate} must be in [0, 1]")
        self.rate = float(rate)
        self.n_unverified = 0

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """Greedy: strict, or (w.p. ``rate``) drafts kept unverified + one uniform token; sampling: strict."""
        drafts = _drafts(draft_ids)
        _check(p, drafts)
        if not greedy or uniform(generator) >= self.rate:
            return verify_drafts(p, q, draft_ids, generator, greedy=greedy)
        self.n_unverified += 1
        v = int(p.shape[1])
        return VerifyResult(len(drafts), min(int(uniform(generator) * v), v - 1))


class RelaxedThinkVerifier(_GreedyPathRule):
    """Relaxed MTP acceptance inside the reasoning span, on the greedy path (``Verifier`` protocol).

    The rule TensorRT-LLM (PR #3865, DeepSeek-R1 MTP) and AMD's ATOM (PR #411,
    ``ATOM_ENABLE_RELAXED_MTP=1``) apply between ``<think>`` and ``</think>``: on a greedy request a
    draft d is accepted when it is among the target's top-3 and p(d) >= ``ratio`` * p(top-1)
    (ratio 0.5); the first rejection emits the argmax, as does the bonus. Sampling requests, and
    every position outside the reasoning span (:func:`make_verifier` gives those a
    ``StrictVerifier``), are verified strictly.

    Args:
        top_n: the draft must be among the target's ``top_n`` tokens (3).
        ratio: p(d) >= ratio * p(top-1) (0.5), in (0, 1].
        ideal_fallback: draw a stand-in draft d ~ p when none was proposed.

    Raises:
        ValueError: top_n < 1 or ratio outside (0, 1].
    """

    name = "relaxed-think"

    def __init__(self, top_n: int = 3, ratio: float = 0.5, ideal_fallback: bool = True):
        if top_n < 1 or not 0.0 < ratio <= 1.0:
            raise ValueError(f"relaxed-think top_n={top_n} must be >= 1 and ratio={ratio} in (0, 1]")
        self.top_n = int(top_n)
        self.ratio = float(ratio)
        self.ideal_fallback = bool(ideal_fallback)
        self.n_relaxed = 0  # drafts accepted that were not the argmax

    def accepts(self, pi: torch.Tensor, d: int) -> bool:
        """True when draft ``d`` is among the top ``top_n`` of ``pi`` ``[V]`` with p(d) >= ratio * p(top-1)."""
        top = torch.topk(pi.to(torch.float64), min(self.top_n, int(pi.shape[-1])))
        ids = [int(x) for x in top.indices]
        if d == ids[0]:
            return True
        ok = d in ids and float(pi[d]) >= self.ratio * float(top.values[0])
        self.n_relaxed += int(ok)
        return ok


class SyntheticAcceptanceVerifier:
    """Synthetic acceptance: the drafter's tokens emitted unverified, ``accept_len`` per step (``Verifier``
    protocol; issue 35 item 3).

    Every major engine has a benchmarking switch that fixes the accepted length instead of verifying: vLLM's
    ``rejection_sample_method: synthetic``, SGLang's ``SGLANG_SIMULATE_ACC_LEN``, TensorRT-LLM's
    ``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS``, ATOM's ``--spec-decode-acceptance-length``. Here each
    step accepts the first ``min(accept_len, k)`` drafts without looking at p, then emits the target's own
    token at the next position (the argmax on a greedy request, a sample of p there otherwise), in every
    span and at every temperature. The drafts come from the engine's drafter (the profile's
    ``self:8`` early-exit head); a step with no draft is an ordinary target step.

    Args:
        accept_len: drafts accepted per step, >= 1.

    Raises:
        ValueError: ``accept_len`` < 1.
    """

    name = "synthetic-acceptance"

    def __init__(self, accept_len: int = 3):
        if accept_len < 1:
            raise ValueError(f"synthetic-acceptance accepted length L={accept_len} must be >= 1")
        self.accept_len = int(accept_len)
        self.n_unverified = 0  # drafts emitted without verification

    def verify(self, p, q, draft_ids, generator, greedy) -> VerifyResult:
        """The first ``accept_len`` drafts accepted unchecked, then the target's token (see class doc)."""
        drafts = _drafts(draft_ids)
        _check(p, drafts)
        n = min(self.accept_len, len(drafts))
        self.n_unverified += n
        return VerifyResult(n, int(p[n].argmax()) if greedy else sample_from(p[n], generator))


def make_verifier(profile: Profile, request_seed: int | None = None, span: str | None = None) -> Verifier:
    """Build the ``Verifier`` a profile asks for (``reference.verify.StrictVerifier`` for strict).

    Args:
        profile: a ``simulator.profiles.Profile``.
        request_seed: the request's (choice) seed; for a mixture profile (``mix_with``) it decides
            whether this request gets the other profile's verifier (``simulator.profiles.mix_selects``).
        span: the span being generated (``reasoning`` inside the simulator's reasoning mode,
            else None): ``relaxed-think`` relaxes only there, strict elsewhere.

    Raises:
        ValueError: unknown verifier name.
    """
    from reference.verify import StrictVerifier

    mix_with = getattr(profile, "mix_with", None)
    if mix_with is not None and request_seed is not None:
        from simulator.profiles import get_profile, mix_selects

        if mix_selects(request_seed, profile.mix_fraction):
            return make_verifier(get_profile(mix_with))

    ideal = profile.draft_fallback == "ideal"
    if profile.verifier == "strict":
        return StrictVerifier()
    if profile.verifier == "relaxed-threshold":
        return RelaxedThresholdVerifier(profile.accept_threshold_single, profile.accept_threshold_acc, ideal)
    if profile.verifier == "typical-acceptance":
        return TypicalAcceptanceVerifier(profile.typical_epsilon, profile.typical_delta, ideal)
    if profile.verifier == "greedy-verify":
        return GreedyVerifyVerifier()
    if profile.verifier == "decode-noncompliant":
        return NoncompliantGreedyVerifier(profile.greedy_flip_rate)
    if profile.verifier == "greedy-relaxed":
        return GreedyRelaxedVerifier(profile.greedy_relaxed_margin, ideal)
    if profile.verifier == "unverified-mixed-batch":
        return UnverifiedMixedBatchVerifier(profile.unverified_rate)
    if profile.verifier == "synthetic-acceptance":
        return SyntheticAcceptanceVerifier(profile.synthetic_accept_len)
    if profile.verifier == "relaxed-think":
        return RelaxedThinkVerifier(ideal_fallback=ideal) if span == "reasoning" else StrictVerifier()
    raise ValueError(f"unknown verifier {profile.verifier!r}")
