"""Logit processing and exact sampling shared by the target (p) and the draft (q).

Processing order follows vLLM's sampler: temperature first, then top-k, then top-p (nucleus).
The *same* function must produce p and q, otherwise speculative sampling is not lossless
(REFERENCES.md: "Known ways implementations broke losslessness").

Sampling uses inverse-CDF with a float64 uniform drawn from an explicit ``torch.Generator``, so
every draw is reproducible from a seed and a zero-probability token can never be drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters applied identically to p (target) and q (draft).

    Attributes:
        temperature: softmax temperature; ``0`` means greedy (argmax).
        top_k: keep the k most likely tokens; ``0`` (or <0) disables.
        top_p: nucleus mass in (0, 1]; ``1.0`` disables.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        """True when decoding is argmax (temperature == 0)."""
        return self.temperature == 0.0


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Check sampling arguments.

    Raises:
        ValueError: temperature < 0, top_p outside (0, 1], or non-integer top_k (message names the field).
    """
    if temperature is None or temperature < 0 or math.isnan(temperature):
        raise ValueError(f"temperature={temperature!r} must be >= 0 (0 = greedy)")
    if top_p is None or not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p={top_p!r} must be in (0, 1]")
    if top_k is None or int(top_k) != top_k:
        raise ValueError(f"top_k={top_k!r} must be an integer (0 disables)")


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Turn raw logits into the sampling distribution (vLLM order: temperature, top-k, top-p).

    Args:
        logits: ``[..., V]`` raw logits (any float dtype); ``-inf`` entries are allowed.
        temperature: ``> 0`` divides the logits; ``0`` returns the one-hot argmax distribution
            (ties broken by the lowest token id, like ``torch.argmax``).
        top_k: keep the ``top_k`` largest logits (ties at the boundary are all kept); ``<= 0`` disables.
        top_p: keep the smallest prefix of the sorted distribution whose mass reaches ``top_p``
            (the most likely token is always kept); ``1.0`` disables.
        dtype: output dtype (float32 default; float64 for exact tests).

    Returns:
        ``[..., V]`` probabilities of ``dtype``, each row summing to 1.

    Raises:
        ValueError: invalid sampling arguments, or a row that is all ``-inf``/NaN.
    """
    validate_sampling(temperature, top_k, top_p)
    x = logits.to(dtype)
    if temperature == 0.0:
        out = torch.zeros_like(x)
        out.scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
        return out
    if temperature != 1.0:
        x = x / temperature
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(x, int(top_k), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        cum = sorted_p.cumsum(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p
        drop_sorted = (cum - sorted_p) >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if not torch.isfinite(probs).all():
        raise ValueError("logits_to_probs: a row has no finite logit (all -inf or NaN)")
    return probs


def uniform(generator: torch.Generator | None) -> float:
    """One float64 draw u ~ U[0, 1) from ``generator`` (global RNG when None)."""
    dev = generator.device if generator is not None else "cpu"
    return float(torch.rand((), dtype=torch.float64, generator=generator, device=dev).item())


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a (possibly unnormalized) non-negative ``[V]`` vector, exactly.

    Inverse CDF in float64 with a single float64 uniform: token i is drawn with probability
    ``probs[i] / probs.sum()`` up to float64 rounding; tokens with zero mass are never drawn.

    Raises:
        ValueError: ``probs`` is not 1-D or sums to zero/NaN (entries must be >= 0; not checked).
    """
    if probs.dim() != 1:
        raise ValueError(f"sample_from expects a [V] vector, got shape {tuple(probs.shape)}")
    cdf = probs.to(torch.float64).cumsum(0)
    total = float(cdf[-1].item())
    if not (total > 0.0) or math.isnan(total):
        raise ValueError("sample_from: probabilities sum to zero (or NaN)")
    u = uniform(generator)
    x = torch.tensor(u * total, dtype=torch.float64, device=cdf.device)
    i = int(torch.searchsorted(cdf, x, right=True).item())
    if i >= cdf.numel() or float(probs[i]) <= 0.0:
        # float64 rounding at the very top: take the last token with positive mass
        nz = torch.nonzero(probs > 0).flatten()
        i = int(nz[-1].item())
    return i
