"""Simulator profiles: declarative recipes for how the provider simulator serves the model.

A profile names exactly one way of serving the reference model: honestly (three numerically
different but statistically faithful variants), with a quantized target, with a lossy speculative
verification rule, with a substituted model, or with a decode path that does not honour the
requested decoding. Every detector is judged against these: honest profiles must never be accused
(false-accusation rate), the others must be named (power, cause).

Sources for each degradation are in ``../shared/REFERENCES.md`` ("Lossy behaviours to simulate"):
SGLang's ``--speculative-accept-threshold-single/acc``; Medusa / vLLM V0 typical acceptance;
greedy verification of sampling requests (a real engine bug class); weight-only RTN quantization
(int8 per output channel, int4 group-wise) and vLLM's online fp8 (E4M3, per-tensor scale
amax/448, ``lm_head`` left unquantized).

The profile is operator-visible only (``auditor serve --expose-profile``); normal responses never
reveal it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

#: Profile families (what is changed) and the verdict the auditor should reach on each.
FAMILIES = ("honest", "quantized", "relaxed", "substituted", "noncompliant")
VERIFIERS = (
    "strict", "relaxed-threshold", "typical-acceptance", "greedy-verify", "decode-noncompliant", "greedy-relaxed",
    "unverified-mixed-batch",
    "relaxed-think",
    "synthetic-acceptance",
)
DTYPES = ("float32", "bfloat16", "float16")
WEIGHT_QUANT = (None, "int8", "int4", "int3", "fp8", "nvfp4")


@dataclass(frozen=True)
class Profile:
    """One serving recipe (frozen; derive variants with :meth:`with_overrides`).

    Attributes:
        name: kebab-case profile name (CLI ``--profile``).
        summary: one line for ``--list-profiles``.
        family: ``honest`` | ``quantized`` | ``relaxed`` | ``substituted`` | ``noncompliant``.
        expected_verdict: the verdict a correct auditor reaches (PASS, QUANTIZATION,
            RELAXED_VERIFICATION, SUBSTITUTION, DECODING_NONCOMPLIANT); used by calibration.
        dtype: weights/activations dtype of the served model (``float32`` | ``bfloat16``).
        weight_quant: weight-only quantization of the decoder's linear layers (``int8`` per output
            channel symmetric; ``int4`` / ``int3`` group-wise affine; ``fp8`` E4M3 per-tensor; ``nvfp4`` NVFP4,
            ``reference.native.nvfp4_fake_quant``) or None.
        group_size: int4/int3 group size (elements along the input dimension; 32..128).
        logit_noise: std (nats) of the kernel/batch-order noise added to every logit (honest-noisy).
            0 disables. The noise is seeded per request and position (see ``engine.NoisyLogitsModel``).
        verifier: speculative verification rule: ``strict`` (Leviathan et al. 2023, lossless),
            ``relaxed-threshold`` (SGLang), ``typical-acceptance`` (Medusa / vLLM V0),
            ``greedy-verify`` (sampling verified greedily), ``decode-noncompliant`` (greedy requests
            emit the 2nd-ranked token at a seeded rate, logprobs true).
        accept_threshold_single: SGLang ``s``: a draft with p(d) >= s is always accepted.
        accept_threshold_acc: SGLang ``a``: otherwise accepted with probability min(1, p(d)/a).
        typical_epsilon: typical acceptance hard threshold epsilon (0.09).
        typical_delta: typical acceptance entropy factor delta (0.3).
        greedy_flip_rate: decode-noncompliant: probability that a greedy position emits the
            2nd-ranked token instead of the argmax.
        forced_top_p: truncated-sampling: the engine's own top-p applied to sampling requests
            (effective top_p = min(requested, forced_top_p)). None = honour the request.
        forced_top_k: likewise for top-k (effective = forced_top_k when the request has none).
        ignore_seed: compliance fault: the request's ``seed`` is ignored (a fresh server seed per
            choice), so equal seeds do not reproduce an answer.
        inject_system_prompt: compliance fault: this text is put in front of every chat prompt
            as a system message (or in front of the request's own system message), as providers
            that add a hidden system prompt do; ``usage.prompt_tokens`` counts it. None = off.
        substitute_layers: substituted: keep only these decoder layer indices of the target (a
            cheaper, different model served under the same name). None = the full model; ``()`` =
            resolved at load time (:func:`default_substitute_keep`, or ``substitute_drop`` layers).
        substitute_drop: ``substituted:K``: drop K decoder layers evenly spaced over the middle of the
            stack (:func:`spread_substitute_keep`) instead of the default four; None = the default.
        default_drafter: drafter spec used when ``--drafter`` is not given (``ngram``, ``self:L``,
            ``none``).
        draft_fallback: for lossy verifiers, what stands in when the drafter proposes nothing:
            ``ideal`` = an ideal draft head whose q equals p (the verifier draws the draft from p
            at no cost; strict verification of such a draft is lossless, so the profile's bias is
            exactly its acceptance rule), or ``none`` (plain sampling step).
        kv_cache_dtype: ``fp8``: keys/values read through fp8 E4M3 with static per-layer scales
            (``reference.native.install_kv_fp8``); None = full precision.
        act_quant: ``int8``: decoder linears' inputs fake-quantized to int8 per token (W8A8 with
            ``weight_quant="int8"``); ``fp8-tile``: to FP8 e4m3 per 1 x T tile, T the model's native block
            (``reference.native.native_block``: DeepSeek-V3's 1x128 activation quantization); ``nvfp4``: to NVFP4
            (FP4 E2M1, an E4M3 scale per 16, a calibrated FP32 scale per linear: ``reference.native.install_act_nvfp4``);
            None = full precision.
        greedy_relaxed_margin: greedy-relaxed: a draft in the target's top-2 within this many nats of
            the argmax is accepted at temperature 0.
        mix_with: ``mix-PROFILE:F``: name of the profile that serves a fraction ``mix_fraction`` of
            requests (chosen per request from the seed, :func:`mix_selects`); None = no mixture.
        mix_fraction: that fraction in [0, 1].
        unverified_rate: unverified-mixed-batch: probability that a greedy verification round shares the
            batch with sampled traffic and emits unverified tokens (``simulator.verifiers.UnverifiedMixedBatchVerifier``).
        synthetic_accept_len: synthetic-acceptance: drafts emitted unverified per step (``synthetic-acceptance:L``,
            ``simulator.verifiers.SyntheticAcceptanceVerifier``).
    """

    name: str
    summary: str
    family: str
    expected_verdict: str
    dtype: str = "float32"
    weight_quant: str | None = None
    group_size: int = 64
    logit_noise: float = 0.0
    verifier: str = "strict"
    accept_threshold_single: float = 0.5
    accept_threshold_acc: float = 1.0
    typical_epsilon: float = 0.09
    typical_delta: float = 0.3
    greedy_flip_rate: float = 0.0
    forced_top_p: float | None = None
    forced_top_k: int | None = None
    ignore_seed: bool = False
    inject_system_prompt: str | None = None
    substitute_layers: tuple[int, ...] | None = None
    substitute_drop: int | None = None
    default_drafter: str = "ngram"
    draft_fallback: str = "ideal"
    kv_cache_dtype: str | None = None
    act_quant: str | None = None
    greedy_relaxed_margin: float = 0.5
    mix_with: str | None = None
    mix_fraction: float = 0.0
    unverified_rate: float = 0.0
    synthetic_accept_len: int = 3
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"profile {self.name!r}: family={self.family!r} must be one of {FAMILIES}")
        if self.verifier not in VERIFIERS:
            raise ValueError(f"profile {self.name!r}: verifier={self.verifier!r} must be one of {VERIFIERS}")
        if self.weight_quant not in WEIGHT_QUANT:
            raise ValueError(f"profile {self.name!r}: weight_quant={self.weight_quant!r} must be one of {WEIGHT_QUANT}")
        if self.dtype not in DTYPES:
            raise ValueError(f"profile {self.name!r}: dtype={self.dtype!r} must be one of {DTYPES}")
        if self.kv_cache_dtype not in (None, "fp8") or self.act_quant not in (None, "int8", "fp8-tile", "nvfp4"):
            raise ValueError(
                f"profile {self.name!r}: kv_cache_dtype={self.kv_cache_dtype!r} must be None or 'fp8', "
                f"act_quant={self.act_quant!r} must be None, 'int8', 'fp8-tile' or 'nvfp4'"
            )
        if self.greedy_relaxed_margin < 0 or not (0.0 <= self.mix_fraction <= 1.0):
            raise ValueError(
                f"profile {self.name!r}: greedy_relaxed_margin={self.greedy_relaxed_margin} must be >= 0 and "
                f"mix_fraction={self.mix_fraction} in [0, 1]"
            )
        if not (32 <= self.group_size <= 128):
            raise ValueError(f"profile {self.name!r}: group_size={self.group_size} must be in 32..128")
        if not (0.0 < self.accept_threshold_single <= 1.0) or not (0.0 < self.accept_threshold_acc <= 1.0):
            raise ValueError(
                f"profile {self.name!r}: accept thresholds must be in (0, 1] "
                f"(got single={self.accept_threshold_single}, acc={self.accept_threshold_acc})"
            )
        if not (0.0 <= self.greedy_flip_rate <= 1.0):
            raise ValueError(f"profile {self.name!r}: greedy_flip_rate={self.greedy_flip_rate} must be in [0, 1]")
        if self.synthetic_accept_len < 1:
            raise ValueError(f"profile {self.name!r}: synthetic_accept_len={self.synthetic_accept_len} must be >= 1")
        if not (0.0 <= self.unverified_rate <= 1.0):
            raise ValueError(f"profile {self.name!r}: unverified_rate={self.unverified_rate} must be in [0, 1]")
        if self.forced_top_p is not None and not (0.0 < self.forced_top_p <= 1.0):
            raise ValueError(f"profile {self.name!r}: forced_top_p={self.forced_top_p} must be in (0, 1]")
        if self.forced_top_k is not None and self.forced_top_k < 1:
            raise ValueError(f"profile {self.name!r}: forced_top_k={self.forced_top_k} must be >= 1")
        if self.logit_noise < 0:
            raise ValueError(f"profile {self.name!r}: logit_noise={self.logit_noise} must be >= 0")
        if self.draft_fallback not in ("ideal", "none"):
            raise ValueError(f"profile {self.name!r}: draft_fallback={self.draft_fallback!r} must be ideal or none")

    @property
    def honest(self) -> bool:
        """True for profiles that must never be accused."""
        return self.family == "honest"

    @property
    def lossy_verifier(self) -> bool:
        """True when the verification rule is not the lossless one."""
        return self.verifier != "strict"

    def with_overrides(self, **kwargs: Any) -> Profile:
        """Return a copy with some fields replaced (``None`` values are ignored).

        Raises:
            ValueError: an unknown field name, or an invalid value (see ``__post_init__``).
        """
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(kwargs) - names)
        if bad:
            raise ValueError(f"unknown profile field(s) {bad}; known: {sorted(names)}")
        return dataclasses.replace(self, **{k: v for k, v in kwargs.items() if v is not None})

    def describe(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (operator view)."""
        d = dataclasses.asdict(self)
        if d.get("substitute_layers") is not None:
            d["substitute_layers"] = list(d["substitute_layers"])
        return d


def default_substitute_keep(n_total: int) -> tuple[int, ...]:
    """Layers kept by the default substitution: drop every 5th layer from ``n_total//3`` to ``n_total-5``.

    For the 30-layer default model this removes layers 10, 15, 20, 25 (26 kept, ~13% cheaper):
    measured mean KL vs fp32 ~1.5 nats and top-1 agreement ~0.45 (coherent text, a different model),
    well beyond int4 (~0.26 nats, 0.70). Pruning more (15 layers) gives gibberish (KL > 10 nats).
    At least one layer is dropped when ``n_total >= 2``.
    """
    drop = set(range(n_total // 3, n_total - 4, 5))
    if not drop and n_total >= 2:
        drop = {n_total // 2}
    return tuple(i for i in range(n_total) if i not in drop)


def spread_substitute_keep(n_total: int, k: int) -> tuple[int, ...]:
    """Layers kept by ``substituted:K``: drop ``k`` layers evenly spaced over ``[n_total//3, n_total-4)``
    (layer ``round(lo + (j + 1/2)(hi - lo)/k)`` for j < k), the span the default substitution prunes.

    For the 30-layer default model ``substituted:1`` drops layer 18 only: a near sibling whose
    divergence from the target is of int4's size (one middle layer removed: mean KL ~0.16-0.25 nats,
    top-1 agreement ~0.77-0.86 on prose and code, measured by teacher forcing), the regime where a
    different model is hardest to tell from a quantized copy by magnitude alone (issue 14 item 5).

    Raises:
        ValueError: ``k`` < 1, or not fewer than the layers of that span (nothing would be left of it).
    """
    lo, hi = n_total // 3, n_total - 4
    if k < 1 or k >= max(hi - lo, 1):
        raise ValueError(f"substituted:{k}: drop count must be in 1..{max(hi - lo - 1, 0)} for a "
                         f"{n_total}-layer model")
    drop = {round(lo + (j + 0.5) * (hi - lo) / k) for j in range(k)}
    return tuple(i for i in range(n_total) if i not in drop)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile(
            "honest-fp32",
            "The reference model in float32, strict (lossless) speculative verification.",
            "honest",
            "PASS",
        ),
        Profile(
            "honest-bf16",
            "The model in bfloat16 (weights and activations); logprobs from it; strict verification.",
            "honest",
            "PASS",
            dtype="bfloat16",
        ),
        Profile(
            "honest-noisy",
            "float32 with per-request batch-order/kernel noise on the logits (std 0.05 nats, the size of "
            "fp32-vs-bf16 differences): greedy near-ties can flip as on real GPUs; strict verification.",
            "honest",
            "PASS",
            logit_noise=0.05,
        ),
        Profile(
            "int8",
            "Weight-only int8 of the decoder linears, symmetric per output channel (RTN, scale=max|w|/127).",
            "quantized",
            "QUANTIZATION",
            weight_quant="int8",
        ),
        Profile(
            "int4",
            "Weight-only int4 of the decoder linears, group-wise affine (group 64, min/max RTN).",
            "quantized",
            "QUANTIZATION",
            weight_quant="int4",
        ),
        Profile(
            "int3",
            "Weight-only int3 of the decoder linears, group-wise affine (group 64, min/max RTN): heavy "
            "quantization, for calibrating the quantized-copy vs different-model attribution.",
            "quantized",
            "QUANTIZATION",
            weight_quant="int3",
        ),
        Profile(
            "fp8",
            "Weight-only fp8 E4M3 of the decoder linears, per-tensor scale amax/448; lm_head unquantized "
            "(vLLM online fp8).",
            "quantized",
            "QUANTIZATION",
            weight_quant="fp8",
        ),
        Profile(
            "relaxed-threshold",
            "SGLang relaxed acceptance: emit draft d if p(d) >= s (0.5) else w.p. min(1, p(d)/a) (a=1.0).",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="relaxed-threshold",
        ),
        Profile(
            "relaxed-think",
            "Relaxed MTP inside <think> (TensorRT-LLM #3865, ATOM #411): on the greedy path accept a draft in "
            "the top-3 with p(d) >= 0.5 p(top-1), reasoning span only (serve with --reasoning); strict elsewhere.",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="relaxed-think",
        ),
        Profile(
            "synthetic-acceptance",
            "Synthetic acceptance (vLLM rejection_sample_method=synthetic, SGLANG_SIMULATE_ACC_LEN, TensorRT-LLM "
            "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS, ATOM --spec-decode-acceptance-length): the drafter's "
            "tokens (an early-exit self:8 head) emitted unverified, 3 per step (synthetic-acceptance:L), every span.",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="synthetic-acceptance",
            default_drafter="self:8",
        ),
        Profile(
            "typical-acceptance",
            "Medusa/vLLM-V0 typical acceptance: accept d iff p(d) > min(0.09, 0.3*exp(-H(p))); "
            "rejection emits argmax p.",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="typical-acceptance",
        ),
        Profile(
            "greedy-verify",
            "Sampling requests verified greedily: every emitted token is the argmax whatever the temperature.",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="greedy-verify",
        ),
        Profile(
            "substituted",
            "A cheaper model behind the same name: the target with every 5th decoder layer from depth/3 "
            "removed (26 of 30 layers for the default model).",
            "substituted",
            "SUBSTITUTION",
            substitute_layers=(),  # resolved against the model's depth at load time
        ),
        Profile(
            "decode-noncompliant",
            "Greedy requests emit the 2nd-ranked token at 10% of positions (seeded) while reporting the "
            "true logprobs.",
            "noncompliant",
            "DECODING_NONCOMPLIANT",
            verifier="decode-noncompliant",
            greedy_flip_rate=0.10,
        ),
        Profile(
            "truncated-sampling",
            "The engine silently applies its own top_p=0.8 to sampling requests (top_p=1 asked); "
            "the low-probability tail is missing.",
            "noncompliant",
            "DECODING_NONCOMPLIANT",
            forced_top_p=0.8,
        ),
        # --- issue 14: subtler deviations real providers ship, and a second honest variant ---
        Profile(
            "honest-fp16",
            "The model in float16 (weights and activations; 10-bit mantissa, rounding unlike bf16); strict.",
            "honest",
            "PASS",
            dtype="float16",
        ),
        Profile(
            "kv-fp8",
            "fp8 E4M3 KV cache (vLLM --kv-cache-dtype fp8): K (post-RoPE) and V rounded with static "
            "per-layer scales amax/448 from a calibration pass; weights and queries float32.",
            "quantized",
            "QUANTIZATION",
            kv_cache_dtype="fp8",
        ),
        Profile(
            "w8a8",
            "W8A8: int8 per-output-channel weights (RTN) and dynamic int8 per-token activations on the "
            "decoder linears' inputs; lm_head full precision.",
            "quantized",
            "QUANTIZATION",
            weight_quant="int8",
            act_quant="int8",
        ),
        Profile(
            "native-fp8",
            "FP8 e4m3 activations per 1xT tile on the decoder linears' inputs (T = the model's native block, "
            "DeepSeek-V3 section 3.3), weights as loaded: served with --model NAME+fp8 it is honest native-FP8 "
            "serving (FP8 weights and activations), which passes against the variant's FP8 card (the reference computes "
            "the card); against a bf16/fp32 card it deviates (the verdict below).",
            "quantized",
            "QUANTIZATION",
            act_quant="fp8-tile",
        ),
        # --- issue 36, item 3: serving below the card (names distinct from issue 35's reasoning profiles) ---
        Profile(
            "native-fp8-int4",
            "Below an FP8 card: the FP8 model re-quantized to int4 weights (group-wise affine, group 64, RTN of the "
            "FP8 weights) with the card's FP8 activation tiles kept (W4A8); serve with --model NAME+fp8.",
            "quantized",
            "QUANTIZATION",
            weight_quant="int4",
            act_quant="fp8-tile",
        ),
        Profile(
            "native-fp8-kv-fp8",
            "Below an FP8 card whose KV cache is full precision: the card's FP8 weights and activation tiles plus "
            "an fp8 E4M3 KV cache (static per-layer scales, as kv-fp8); serve with --model NAME+fp8.",
            "quantized",
            "QUANTIZATION",
            act_quant="fp8-tile",
            kv_cache_dtype="fp8",
        ),
        Profile(
            "native-fp8-nvfp4",
            "Below an FP8 card: the FP8 model re-quantized to NVIDIA's NVFP4, weights and activations (W4A4): FP4 E2M1 "
            "values, one E4M3 scale per 16 input values, one FP32 scale per tensor (calibrated static scales for the "
            "activations, reference.native.nvfp4_fake_quant); serve with --model NAME+fp8.",
            "quantized",
            "QUANTIZATION",
            weight_quant="nvfp4",
            act_quant="nvfp4",
        ),
        Profile(
            "native-int4-int3",
            "Below an INT4 card: the INT4 model re-quantized to int3 weights (group-wise affine, group 32, the "
            "card's group); serve with --model NAME+int4.",
            "quantized",
            "QUANTIZATION",
            weight_quant="int3",
            group_size=32,
        ),
        Profile(
            "greedy-relaxed",
            "At temperature 0 a draft in the target's top-2 within 0.5 nats of the argmax is accepted "
            "(speculation changes greedy output at non-ties); sampling verified strictly.",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="greedy-relaxed",
            greedy_relaxed_margin=0.5,
        ),
        # --- issue 40: a real engine whose speculative path is not lossless ---
        Profile(
            "unverified-mixed-batch",
            "ngram speculation where greedy rounds batched with sampled traffic (10% of rounds) emit "
            "unverified tokens (vLLM 0.32, greedy + temperature-1 requests in one batch); sampling strict.",
            "relaxed",
            "RELAXED_VERIFICATION",
            verifier="unverified-mixed-batch",
            unverified_rate=0.10,
        ),
        Profile(
            "unverified-mixed-batch-int4",
            "unverified-mixed-batch served from int4 weights (group-wise affine, group 64): a quantized engine that "
            "also emits unverified greedy tokens; the weights are the cause to name first (its verified prefix "
            "diverges), the unverified tokens a second finding.",
            "quantized",
            "QUANTIZATION",
            weight_quant="int4",
            verifier="unverified-mixed-batch",
            unverified_rate=0.10,
        ),
    ]
}


def _float_param(name: str, text: str, lo: float, hi: float) -> float:
    try:
        v = float(text)
    except ValueError:
        raise KeyError(f"profile {name!r}: {text!r} is not a number; write e.g. {name.split(':')[0]}:0.7") from None
    if not (lo <= v <= hi):
        raise ValueError(f"profile {name!r}: parameter {v} must be in [{lo}, {hi}]")
    return v


#: Name prefix of a recorded provider (``recorded:NAME``, :func:`parameterized_profile`).
RECORDED_PREFIX = "recorded:"
#: Name prefix of a profile served in reasoning mode (``think:PROFILE``, :func:`parameterized_profile`; issue 35).
THINK_PREFIX = "think:"
#: Reasoning tokens at most before the close tag is forced: the simulator's default thinking budget
#: (``auditor serve --reasoning-budget``, ``simulator.server.create_app``) and the one ``think:PROFILE`` serves with.
DEFAULT_REASONING_BUDGET = 32
_RECORDED_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def reasoning_of(profile: Profile) -> int | None:
    """Reasoning budget (tokens) of a ``think:PROFILE`` profile (served in reasoning mode: the template opens
    ``<think>``, the budget closes it, then the answer; ``simulator.reasoning.generate_reasoning``),
    None for a profile served as plain chat."""
    b = profile.extra.get("reasoning_budget")
    return int(b) if b is not None else None


def recorded_of(profile: Profile) -> str | None:
    """NAME of a ``recorded:NAME`` profile (its outputs come from a recording, not from a served model), else None."""
    rec = profile.extra.get("recorded")
    return str(rec) if rec is not None else None


def parameterized_profile(name: str) -> Profile | None:
    """Resolve a parameterized profile name, or None when ``name`` has no parameter.

    Forms (issue 14): ``relaxed-threshold:S`` (SGLang threshold_single s in (0, 1]),
    ``typical-acceptance:EPS`` (epsilon in [0, 1]), ``greedy-relaxed:M`` (margin in nats >= 0),
    ``substituted:K`` (K >= 1 decoder layers dropped, :func:`spread_substitute_keep`),
    ``synthetic-acceptance:L`` (L >= 1 drafts emitted unverified per step),
    ``mix-PROFILE:F`` (the honest-fp32 model, except a fraction F in [0, 1] of requests served by
    PROFILE, itself possibly parameterized; family and expected verdict are PROFILE's),
    ``recorded:NAME`` (an honest provider whose outputs a real engine recorded,
    ``auditor.calibration.recorded``; ``extra["recorded"]`` = NAME; calibration only, never served),
    ``think:PROFILE`` (PROFILE served in reasoning mode with the default thinking budget,
    ``extra["reasoning_budget"]`` = :data:`DEFAULT_REASONING_BUDGET`, :func:`reasoning_of`; issue 35 item 5:
    ``auditor serve --profile think:PROFILE`` serves it with ``--reasoning field`` unless told otherwise).

    Raises:
        KeyError: unknown base profile or a parameter that is not a number.
        ValueError: a parameter out of range.
    """
    if ":" not in name:
        return None
    if name.startswith(THINK_PREFIX):
        inner = get_profile(name[len(THINK_PREFIX):])
        if reasoning_of(inner) is not None or inner.mix_with is not None or recorded_of(inner) is not None:
            raise ValueError(f"profile {name!r}: think: takes a served profile, not a mixture, a recording or "
                             "another think: profile")
        return dataclasses.replace(
            inner, name=name, extra={**inner.extra, "reasoning_budget": DEFAULT_REASONING_BUDGET},
            summary=f"{inner.name} in reasoning mode: the template opens <think>, at most {DEFAULT_REASONING_BUDGET} "
                    "reasoning tokens, the close tag, then the answer.",
        )
    head, _, arg = name.rpartition(":")
    if head.startswith("mix-"):
        other = head[len("mix-"):]
        alt = get_profile(other)
        if alt.mix_with is not None:
            raise ValueError(f"profile {name!r}: a mixture cannot mix another mixture ({other!r})")
        f = _float_param(name, arg, 0.0, 1.0)
        return dataclasses.replace(
            PROFILES["honest-fp32"], name=name, family=alt.family, expected_verdict=alt.expected_verdict,
            summary=f"honest-fp32, except {f:g} of requests (chosen from the request seed) served as {other}.",
            mix_with=other, mix_fraction=f,
        )
    if head == "relaxed-threshold":
        s = _float_param(name, arg, 1e-9, 1.0)
        return dataclasses.replace(PROFILES[head], name=name, accept_threshold_single=s,
                                   summary=f"SGLang relaxed acceptance with threshold_single s={s:g} (a=1.0).")
    if head == "typical-acceptance":
        e = _float_param(name, arg, 0.0, 1.0)
        return dataclasses.replace(PROFILES[head], name=name, typical_epsilon=e,
                                   summary=f"Typical acceptance with epsilon={e:g} (delta 0.3).")
    if head == "substituted":
        k = _float_param(name, arg, 1.0, 1e6)
        if k != int(k):
            raise ValueError(f"profile {name!r}: the drop count must be a whole number of layers")
        return dataclasses.replace(PROFILES[head], name=name, substitute_drop=int(k),
                                   summary=f"A different model behind the same name: the target with {int(k)} "
                                   "decoder layer(s) evenly spaced over its middle removed.")
    if head + ":" == RECORDED_PREFIX:
        if not _RECORDED_NAME.fullmatch(arg):
            raise ValueError(f"profile {name!r}: a recording's name is 1-64 of a-z, 0-9, '.', '_', '-'")
        return dataclasses.replace(
            PROFILES["honest-fp32"], name=name, extra={"recorded": arg},
            summary=f"Honest outputs recorded from a real engine (auditor/calibration/recorded/{arg}.npz); "
                    "calibration replays them, `auditor serve` cannot serve them.",
        )
    if head == "synthetic-acceptance":
        n = _float_param(name, arg, 1.0, 64.0)
        if n != int(n):
            raise ValueError(f"profile {name!r}: the accepted length must be a whole number of tokens")
        return dataclasses.replace(PROFILES[head], name=name, synthetic_accept_len=int(n),
                                   summary=f"Synthetic acceptance: the drafter's tokens emitted unverified, {int(n)} per step.")
    if head == "greedy-relaxed":
        m = _float_param(name, arg, 0.0, 1e9)
        return dataclasses.replace(PROFILES[head], name=name, greedy_relaxed_margin=m,
                                   summary=f"Greedy drafts accepted in the top-2 within {m:g} nats of the argmax.")
    raise KeyError(f"unknown profile {name!r}; parameterized forms: relaxed-threshold:S, typical-acceptance:EPS, "
                   "greedy-relaxed:M, substituted:K, synthetic-acceptance:L, mix-PROFILE:F, recorded:NAME, think:PROFILE")


def find_profile(name: str) -> Profile | None:
    """:func:`get_profile`, or None where it raises (an unknown or invalid name)."""
    try:
        return get_profile(name)
    except (KeyError, ValueError):
        return None


def list_profiles() -> list[Profile]:
    """All built-in profiles in display order."""
    return list(PROFILES.values())


def get_profile(name: str, **overrides: Any) -> Profile:
    """Look up a built-in profile by name and apply overrides (``None`` values ignored).

    Parameterized names (``relaxed-threshold:0.8``, ``mix-int8:0.2``...) are resolved by
    :func:`parameterized_profile`.

    Raises:
        KeyError: unknown profile name (message lists the known names).
        ValueError: invalid override or parameter.
    """
    try:
        base = PROFILES[name]
    except KeyError:
        if ":" not in name:
            raise KeyError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None
        param = parameterized_profile(name)  # issue 14: relaxed-threshold:S, mix-PROFILE:F, ...
        if param is None:  # unreachable: a name with ':' always resolves or raises
            raise KeyError(f"unknown profile {name!r}") from None
        base = param
    return base.with_overrides(**overrides) if overrides else base


#: Parameterized instances run in calibration (issue 14, item 3 and 4).
for _n in ("relaxed-threshold:0.7", "relaxed-threshold:0.9", "typical-acceptance:0.03", "substituted:1",
           "mix-int4:0.1", "mix-int4:0.05"):
    PROFILES[_n] = get_profile(_n)


def resolve_substitute_layers(profile: Profile, n_total: int) -> tuple[int, ...] | None:
    """Concrete layer indices to keep for a substituted profile on a model with ``n_total`` layers.

    ``substitute_layers == ()`` means the default, :func:`default_substitute_keep`. Returns None when
    the profile keeps the full model.

    Raises:
        ValueError: an index outside ``0..n_total-1``.
    """
    if profile.substitute_layers is None:
        return None
    if len(profile.substitute_layers) == 0:
        if profile.substitute_drop is not None:
            return spread_substitute_keep(n_total, profile.substitute_drop)
        return default_substitute_keep(n_total)
    bad = [i for i in profile.substitute_layers if not (0 <= i < n_total)]
    if bad:
        raise ValueError(f"substitute_layers {bad} outside 0..{n_total - 1}")
    return tuple(sorted(set(profile.substitute_layers)))


def mix_uniform(seed: int) -> float:
    """The request's routing uniform in [0, 1) (BLAKE2b of ``mix:{seed}``, 53 bits)."""
    h = hashlib.blake2b(f"mix:{int(seed)}".encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / float(1 << 53)


def mix_selects(seed: int, fraction: float) -> bool:
    """True when the request with this seed is served by the other profile (probability ``fraction``)."""
    return mix_uniform(seed) < float(fraction)
