"""Synthetic audit worlds with known truth for the detector tests (numpy only, vectorised).

A "world" is a set of prompts × positions with reference log-probabilities drawn from random
Dirichlet distributions (one concentration per prompt, so positions within a prompt are alike —
the dependence the detectors must handle). A provider *profile* turns reference rows into the
tokens it emits and the top_logprobs it reports:

- honest-exact: samples/argmaxes the reference itself (H0 of the sampling and greedy tests).
- honest-noisy: reference logits + N(0, sigma_honest) numeric noise (bf16-like), reported as is.
- quantized: logits + N(0, sigma_q) noise, or tempered logits (logits / tau); reported as served.
- substituted: an unrelated Dirichlet draw.
- relaxed: SGLang threshold acceptance of an argmax draft (emit d w.p. 1 if p(d) >= s, else
  w.p. p(d); otherwise y != d pro rata) — not at each prompt's first position (no draft yet).
- truncated: top-p nucleus sampling nobody asked for.
- greedy-served: sampling requests answered with the argmax.
- decode-mismatch: at T = 0 emits the runner-up at a fraction of positions, reports true logprobs.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy.special import logsumexp

from auditor.detectors import EvidenceBatch, compute_noise_floor

V = 48
K_REF = 20


def dirichlet_logprobs(rng, n_prompts, length, v=V, alpha_range=(0.01, 0.5)):
    """[n_prompts*length, v] float64 log-probs, Dirichlet(alpha_g) rows with alpha_g per prompt."""
    la = rng.uniform(np.log(alpha_range[0]), np.log(alpha_range[1]), size=n_prompts)
    alpha = np.repeat(np.exp(la), length)[:, None] * np.ones((1, v))
    g = rng.gamma(alpha)
    g = np.maximum(g, 1e-300)
    lp = np.log(g)
    lp = lp - logsumexp(lp, axis=1, keepdims=True)
    lp = np.maximum(lp, -60.0)
    return lp - logsumexp(lp, axis=1, keepdims=True)


def prompt_labels(n_prompts, length, prefix="p"):
    return np.repeat(
        np.array([f"{prefix}{i}" for i in range(n_prompts)], dtype=object), length
    )


def first_positions(n_prompts, length):
    f = np.zeros(n_prompts * length, bool)
    f[::length] = True
    return f


def normalise(x):
    return x - logsumexp(x, axis=1, keepdims=True)


def sample_rows(rng, lp):
    """One categorical draw per row of log-probs lp [N, V] (inverse CDF)."""
    p = np.exp(lp)
    c = np.cumsum(p, axis=1)
    u = rng.random(lp.shape[0]) * c[:, -1]
    return np.minimum((c < u[:, None]).sum(1), lp.shape[1] - 1)


def top_k(lp, k):
    idx = np.argsort(-lp, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(lp, idx, 1)


def served_rows(rng, ref, profile, **kw):
    """Log-probs the provider's model computes (and reports), per profile."""
    if profile in (
        "honest-exact",
        "relaxed",
        "truncated",
        "greedy-served",
        "decode-mismatch",
    ):
        sigma = kw.get("sigma_honest", 0.0)
        return normalise(ref + rng.normal(0, sigma, ref.shape)) if sigma > 0 else ref
    if profile == "honest-noisy":
        return normalise(ref + rng.normal(0, kw.get("sigma_honest", 0.02), ref.shape))
    if profile == "quantized":
        if "tau" in kw:
            return normalise(ref / kw["tau"])
        return normalise(ref + rng.normal(0, kw.get("sigma_q", 0.3), ref.shape))
    if profile == "substituted-related":
        # a related model (same family, other weights): close to the reference (noise sigma_q) but
        # its argmax differs at a share `swap` of positions whatever the reference's margin
        out = ref + rng.normal(0, kw.get("sigma_q", 0.3), ref.shape)
        for i in np.flatnonzero(rng.random(ref.shape[0]) < kw.get("swap", 0.2)):
            order = np.argsort(-out[i])
            j = order[rng.integers(1, ref.shape[1])]
            out[i, [order[0], j]] = out[i, [j, order[0]]]
        return normalise(out)
    if profile == "substituted":
        n = ref.shape[0]
        return dirichlet_logprobs(rng, n, 1, v=ref.shape[1])
    raise ValueError(profile)


def emit(rng, served, temperature, profile, first, **kw):
    """Emitted token ids [N] for the profile."""
    n = served.shape[0]
    if temperature == 0:
        tok = served.argmax(1)
        if profile == "decode-mismatch":
            frac = kw.get("mismatch_frac", 0.1)
            second = np.argsort(-served, axis=1)[:, 1]
            hit = rng.random(n) < frac
            tok = np.where(hit, second, tok)
        return tok
    if profile == "greedy-served":
        return served.argmax(1)
    if profile == "truncated":
        top_p = kw.get("top_p", 0.9)
        order = np.argsort(-served, axis=1)
        sp = np.take_along_axis(np.exp(served), order, 1)
        cum = np.cumsum(sp, 1)
        keep_sorted = (cum - sp) < top_p  # nucleus: smallest prefix reaching top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, 1)
        return sample_rows(rng, normalise(np.where(keep, served, -np.inf)))
    y = sample_rows(rng, served)
    if profile == "relaxed":
        s = kw.get("s", 0.5)
        d = served.argmax(1)
        pd = np.exp(served[np.arange(n), d])
        force = (pd >= s) & ~first
        y = np.where(force, d, y)
    return y


def make_batch(
    rng,
    ref,
    served,
    tok,
    temperature,
    prompt_ids,
    m_provider=5,
    reported=None,
    full=False,
):
    """EvidenceBatch from rows: reference top-K, provider top-M of `reported` (default served)."""
    n = ref.shape[0]
    rep = served if reported is None else reported
    r_ids, r_lp = top_k(ref, K_REF)
    kw = {}
    if m_provider:
        p_ids, p_lp = top_k(rep, m_provider)
        kw = {
            "provider_top_ids": p_ids,
            "provider_top_logprobs": p_lp,
            "provider_token_logprobs": rep[np.arange(n), tok],
        }
    return EvidenceBatch.from_arrays(
        prompt_ids=prompt_ids,
        token_ids=tok,
        temperatures=np.full(n, float(temperature)),
        ref_top_ids=r_ids,
        ref_top_logprobs=r_lp,
        ref_token_logprobs=ref[np.arange(n), tok],
        ref_full_logprobs=ref.astype(np.float32) if full else None,
        **kw,
    )


def concat(batches):
    """Concatenate EvidenceBatches with equal K and M widths."""
    b0 = batches[0]

    def cat(name):
        vals = [getattr(b, name) for b in batches]
        return None if vals[0] is None else np.concatenate(vals)

    return EvidenceBatch(**{f: cat(f) for f in b0.__dataclass_fields__})


def make_floor(rng, n_prompts=60, length=20, sigma_honest=0.02, top_m=(1, 5, 20)):
    ref = dirichlet_logprobs(rng, n_prompts, length)
    hon = normalise(ref + rng.normal(0, sigma_honest, ref.shape))
    return compute_noise_floor(
        ref,
        hon,
        prompt_ids=prompt_labels(n_prompts, length, "f"),
        variant_names=["noisy"],
        top_m=top_m,
    )


def audit(
    rng,
    profile,
    *,
    n_greedy=4,
    n_sampling=8,
    length=24,
    m_provider=5,
    with_logprobs=True,
    **kw,
):
    """One simulated audit: greedy prompts (T=0) + sampling prompts (T=1) of the profile."""
    parts = []
    for temp, g, tag in ((0.0, n_greedy, "g"), (1.0, n_sampling, "s")):
        if g == 0:
            continue
        ref = dirichlet_logprobs(rng, g, length)
        served = served_rows(rng, ref, profile, **kw)
        tok = emit(rng, served, temp, profile, first_positions(g, length), **kw)
        parts.append(
            make_batch(
                rng,
                ref,
                served,
                tok,
                temp,
                prompt_labels(g, length, tag),
                m_provider=m_provider if with_logprobs else 0,
            )
        )
    return concat(parts) if len(parts) > 1 else parts[0]


def bulk_batch(
    rng,
    n_audits,
    g,
    length,
    *,
    profile="honest-exact",
    temperature=1.0,
    m_provider=5,
    **kw,
):
    """One EvidenceBatch holding n_audits audits of g prompts x length positions (sliced per audit)."""
    ref = dirichlet_logprobs(rng, n_audits * g, length)
    served = served_rows(rng, ref, profile, **kw)
    tok = emit(
        rng, served, temperature, profile, first_positions(n_audits * g, length), **kw
    )
    b = make_batch(
        rng,
        ref,
        served,
        tok,
        temperature,
        prompt_labels(n_audits * g, length),
        m_provider=m_provider,
    )
    return b, ref, served, tok


def audit_slices(n_audits, g, length):
    step = g * length
    return [slice(a * step, (a + 1) * step) for a in range(n_audits)]


@pytest.fixture(scope="session")
def synth():
    """The helpers above as one namespace (stateless, so session-scoped)."""
    return SimpleNamespace(
        V=V,
        dirichlet_logprobs=dirichlet_logprobs,
        prompt_labels=prompt_labels,
        first_positions=first_positions,
        normalise=normalise,
        sample_rows=sample_rows,
        top_k=top_k,
        served_rows=served_rows,
        emit=emit,
        make_batch=make_batch,
        concat=concat,
        make_floor=make_floor,
        audit=audit,
        bulk_batch=bulk_batch,
        audit_slices=audit_slices,
    )
