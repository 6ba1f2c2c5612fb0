"""The accept/reject kernel of speculative decoding, in paper notation.

Source: Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling".

Notation: ``p`` target probabilities ``[k+1, V]`` (row i is the target's distribution for the
position of draft i; row k is the bonus position), ``q`` draft probabilities ``[k, V]`` (or None
for a deterministic drafter: one-hot q), ``draft_ids`` ``[k]`` int64.

Strict (lossless) rule, sampling:
  for i in 0..k-1: draw u ~ U[0,1) in float64; accept d_i iff p_i(d_i) > 0 and q_i(d_i) > 0 and
  u < p_i(d_i)/q_i(d_i). At the first rejection emit a token from norm(max(0, p_i - q_i)) (p_i if
  that residual is all zero). If all k are accepted emit a bonus token from p_k.
  One-hot q: accept with probability p_i(d_i); on rejection sample p_i with d_i removed.
Greedy: accept while d_i == argmax p_i; at the first mismatch emit argmax p_i; bonus argmax p_k.

Each call emits ``draft_ids[:n_accepted] + [next_token]``: between 1 and k+1 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reference.sampling import sample_from, uniform


@dataclass
class VerifyResult:
    """Outcome of one verification: the first ``n_accepted`` drafts are kept, then ``next_token``.

    Attributes:
        n_accepted: number of drafts accepted (0..k).
        next_token: the token emitted after them (residual sample on rejection, bonus otherwise).
    """

    n_accepted: int
    next_token: int


@runtime_checkable
class Verifier(Protocol):
    """Pluggable verification rule (the simulator plugs lossy rules into the same loop).

    ``verify(p, q, draft_ids, generator, greedy)``:
      p: ``[k+1, V]`` float target probabilities after sampling processing (when ``greedy`` the
         loop passes softmax of the raw logits, temperature 1, and only argmax must be used by a
         strict rule); q: ``[k, V]`` draft probabilities or None (one-hot); draft_ids: ``[k]`` int64
         (k may be 0: a plain decoding step); generator: ``torch.Generator`` for every random draw.
    Returns a ``VerifyResult``.
    """

    def verify(
        self,
        p: torch.Tensor,
        q: torch.Tensor | None,
        draft_ids: torch.Tensor,
        generator: torch.Generator | None,
        greedy: bool,
    ) -> VerifyResult: ...


def _check_shapes(p: torch.Tensor, q: torch.Tensor | None, draft_ids: torch.Tensor) -> int:
    if p.dim() != 2:
        raise ValueError(f"p must be [k+1, V], got shape {tuple(p.shape)}")
    k = int(draft_ids.numel())
    if p.shape[0] != k + 1:
        raise ValueError(f"p has {p.shape[0]} rows but there are {k} drafts; expected k+1 = {k + 1} rows")
    if q is not None and (q.dim() != 2 or q.shape[0] < k or q.shape[1] != p.shape[1]):
        raise ValueError(f"q must be [k, V] = [{k}, {p.shape[1]}], got shape {tuple(q.shape)}")
    return k


def acceptance_prob(p_i: torch.Tensor, q_i: torch.Tensor | None, d: int) -> float:
    """Probability that the strict rule accepts draft ``d`` at one position (given it is reached).

    ``min(1, p(d)/q(d))`` computed in float64; 0 when ``p(d) == 0`` or ``q(d) == 0`` (a draft that q
    could not have produced is never accepted); ``p(d)`` for a one-hot q (``q_i is None``).

    Args:
        p_i: ``[V]`` target probabilities; q_i: ``[V]`` draft probabilities or None; d: draft id.
    """
    pd = float(p_i[d])
    if q_i is None:
        return min(max(pd, 0.0), 1.0)
    qd = float(q_i[d])
    if not (pd > 0.0 and qd > 0.0):
        return 0.0
    return min(1.0, pd / qd)


def rejection_dist(p_i: torch.Tensor, q_i: torch.Tensor | None, d: int) -> torch.Tensor:
    """Distribution sampled after rejecting draft ``d``: ``norm(max(0, p - q))`` (float64 ``[V]``).

    Falls back to p when the residual is all zero. One-hot q: p with d removed, renormalized
    (p itself when that is empty).
    """
    p64 = p_i.to(torch.float64)
    if q_i is None:
        r = p64.clone()
        r[d] = 0.0
    else:
        r = torch.clamp(p64 - q_i.to(torch.float64), min=0.0)
    s = float(r.sum())
    if not s > 0.0:
        return p64 / p64.sum()
    return r / s


def verify_drafts(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_ids: torch.Tensor,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> VerifyResult:
    """Strict speculative verification (Leviathan et al. 2023, Alg. 1): output law equals p.

    For each draft in order, draw u ~ U[0,1) (float64, from ``generator``) and accept iff
    ``u < acceptance_prob(p_i, q_i, d_i)`` (i.e. u < p(d)/q(d) with p(d) > 0, q(d) > 0); at the first
    rejection emit a sample of ``rejection_dist``; after k acceptances emit a bonus sample of p_k.

    Args:
        p: ``[k+1, V]`` target probabilities (float32/float64), rows summing to 1.
        q: ``[k, V]`` draft probabilities, or None for a deterministic drafter (one-hot q).
        draft_ids: ``[k]`` int64 drafted token ids (k may be 0).
        generator: source of every random draw (float64 uniforms); None = torch global RNG.
        greedy: argmax verification (no randomness consumed).

    Returns:
        VerifyResult(n_accepted, next_token).

    Raises:
        ValueError: inconsistent shapes.
    """
    k = _check_shapes(p, q, draft_ids)
    drafts = [int(x) for x in draft_ids.reshape(-1).tolist()]
    if greedy:
        top = p.argmax(dim=-1).tolist()
        for i, d in enumerate(drafts):
            if d != top[i]:
                return VerifyResult(i, int(top[i]))
        return VerifyResult(k, int(top[k]))
    for i, d in enumerate(drafts):
        qi = None if q is None else q[i]
        a = acceptance_prob(p[i], qi, d)
        u = uniform(generator)
        if u < a:
            continue
        return VerifyResult(i, sample_from(rejection_dist(p[i], qi, d), generator))
    return VerifyResult(k, sample_from(p[k], generator))


class StrictVerifier:
    """The lossless verifier (``Verifier`` protocol) wrapping :func:`verify_drafts`."""

    name = "strict"

    def verify(
        self,
        p: torch.Tensor,
        q: torch.Tensor | None,
        draft_ids: torch.Tensor,
        generator: torch.Generator | None,
        greedy: bool,
    ) -> VerifyResult:
        """See :func:`verify_drafts`."""
        return verify_drafts(p, q, draft_ids, generator, greedy)
