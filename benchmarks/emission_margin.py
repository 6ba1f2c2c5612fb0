"""Derive the decisive margin of the emission models (verdict rules 4b/4c, issue 37 item 8).

The emission models (:mod:`auditor.detectors.emission`) name the mechanism behind a thinned tail by a
log-likelihood ratio (truncation − acceptance, nats). A small ratio is no evidence: on a few hundred
sampled tokens either family can win by a few nats by chance, or because the real sampler is neither
(llama.cpp's top-k 40 + top-p 0.95 + min-p 0.05 chain at temperature 1 was called truncation by 3.29
nats in one audit and acceptance by 2.17 in the next). This script measures, over seeded simulations of
language-model-like distributions (Gumbel logits with a random scale, 400 tokens, the reference's top 20
listed) and every emission mechanism below, how often the ratio points at the *wrong* family by more than
a margin m, at a given number of sampled positions, and derives the smallest margin on
:data:`MARGIN_GRID` at which no mechanism is called wrongly in more than :data:`MAX_WRONG_RATE` of the
simulations. ``auditor.verdict.cause.DECISIVE_EMISSION_MARGIN`` is that value at 100 positions over 500
seeds (``--seeds 500 --positions 100``); below it the verdict names the undetermined pair
RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT.

Mechanisms (each draws the emitted token's rank from p through one emission law):

- truncation (DECODING_NONCOMPLIANT): ``top-p`` 0.8, ``top-p-0.95``, ``min-p-0.05``, ``min-p-0.1``,
  ``top-k-5``, ``llama-chain`` (top-k 40, top-p 0.95, min-p 0.05 together: llama.cpp's defaults);
- acceptance (RELAXED_VERIFICATION): ``typical`` (Medusa / vLLM-V0 typical acceptance with an ideal draft,
  ε = 0.09, δ = 0.3), ``pro-rata`` (30% of every token's mass to the argmax), ``pro-rata-0.1``,
  ``single`` (SGLang ``threshold_single`` 0.5 with an argmax draft).

The simulations are unconditional (the tail test need not reject), which counts the weak-signal draws a
real audit would not even fit, so the rate is an upper bound for the audits that reach rule 4b.

Usage::

    python3 benchmarks/emission_margin.py [--seeds 500] [--positions 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auditor.detectors.emission import emission_fit

#: Listed reference alternatives (the calibration pools list 20).
K = 20
#: Mechanisms whose samples truncation should explain better, and those acceptance should.
TRUNCATION = ("top-p", "top-p-0.95", "min-p-0.05", "min-p-0.1", "top-k-5", "llama-chain")
ACCEPTANCE = ("typical", "pro-rata", "pro-rata-0.1", "single")
#: Margins tried (nats), ascending.
MARGIN_GRID = tuple(float(x) for x in np.arange(0.0, 10.01, 0.5))
#: Largest share of wrong-family calls beyond the margin, per mechanism.
MAX_WRONG_RATE = 0.01


def lm_rows(rng: np.random.Generator, n: int, vocab: int = 400) -> np.ndarray:
    """[n, vocab] float64 sorted distributions: confident and flat positions alike (Gumbel logits, random scale)."""
    scale = rng.uniform(0.6, 4.0, size=(n, 1))
    logits = rng.gumbel(size=(n, vocab)) * scale
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return -np.sort(-p, axis=1)


def _keep(p: np.ndarray, mechanism: str) -> np.ndarray:
    """[V] bool: the tokens a truncation mechanism keeps of one sorted row ``p``."""
    v = np.arange(p.size)
    top_p = {"top-p": 0.8, "top-p-0.95": 0.95, "llama-chain": 0.95}.get(mechanism, 1.0)
    min_p = {"min-p-0.05": 0.05, "min-p-0.1": 0.1, "llama-chain": 0.05}.get(mechanism, 0.0)
    top_k = {"top-k-5": 5, "llama-chain": 40}.get(mechanism, p.size)
    keep = (v < top_k) & (p >= min_p * p[0])
    if top_p < 1.0:
        keep &= v < int(np.argmax(np.cumsum(p) >= top_p)) + 1
    keep[0] = True
    return keep


def draw(rng: np.random.Generator, rows: np.ndarray, mechanism: str) -> np.ndarray:
    """Emitted ranks [n] int64 (−1 beyond the listed K) under one emission mechanism (module docstring);
    ``"honest"`` samples p itself.

    Raises:
        ValueError: an unknown mechanism.
    """
    if mechanism not in (*TRUNCATION, *ACCEPTANCE, "honest"):
        raise ValueError(f"unknown mechanism {mechanism!r}; known: {TRUNCATION + ACCEPTANCE + ('honest',)}")
    out = np.empty(rows.shape[0], np.int64)
    for i, p in enumerate(rows):
        if mechanism in TRUNCATION:  # survivors renormalised pro rata
            q = np.where(_keep(p, mechanism), p, 0.0)
            out[i] = rng.choice(p.size, p=q / q.sum())
        elif mechanism == "typical":  # ideal draft d ~ p, rejected below min(0.09, 0.3 e^-H) → argmax
            tau = min(0.09, 0.3 * np.exp(-float(-(p * np.log(p)).sum())))
            d = int(rng.choice(p.size, p=p))
            out[i] = d if p[d] > tau else 0
        elif mechanism == "single":  # SGLang threshold_single 0.5 with an argmax draft
            out[i] = 0 if p[0] >= 0.5 else int(rng.choice(p.size, p=p))
        elif mechanism in ("pro-rata", "pro-rata-0.1"):  # relaxed acceptance: λ of every token's mass to the argmax
            lam = 0.3 if mechanism == "pro-rata" else 0.1
            out[i] = 0 if rng.random() < lam else int(rng.choice(p.size, p=p))
        else:
            out[i] = int(rng.choice(p.size, p=p))
    return np.where(out < K, out, -1)


def simulate(seeds: int, positions: int, mechanisms: Sequence[str] = TRUNCATION + ACCEPTANCE, *,
             first_seed: int = 0) -> dict[str, np.ndarray]:
    """mechanism → [seeds] float64 log-likelihood ratios (truncation − acceptance, nats) of ``emission_fit`` on
    ``positions`` sampled tokens, seed s (``first_seed`` ... ``first_seed + seeds − 1``) drawing its rows and
    tokens from ``default_rng([s, mechanism name bytes])``."""
    out: dict[str, np.ndarray] = {}
    for m in mechanisms:
        lr = np.empty(seeds)
        for i, s in enumerate(range(first_seed, first_seed + seeds)):
            rng = np.random.default_rng([s, *m.encode()])
            rows = lm_rows(rng, positions)
            fit = emission_fit(rows[:, :K], draw(rng, rows, m))
            lr[i] = np.nan if fit is None else float(fit["log_lik_ratio"])
        out[m] = lr
    return out


def wrong_rates(ratios: dict[str, np.ndarray], margin: float) -> dict[str, float]:
    """mechanism → share of simulations whose ratio names the wrong family by more than ``margin`` nats
    (a truncation mechanism with ratio < −margin, an acceptance one with ratio > margin)."""
    return {m: float(np.mean(-lr > margin) if m in TRUNCATION else np.mean(lr > margin)) for m, lr in ratios.items()}


def decisive_margin(ratios: dict[str, np.ndarray], max_wrong: float = MAX_WRONG_RATE,
                    grid: Sequence[float] = MARGIN_GRID) -> float | None:
    """The smallest margin of ``grid`` at which every mechanism's wrong-family rate is at most ``max_wrong``;
    None when none is."""
    return next((g for g in grid if max(wrong_rates(ratios, g).values()) <= max_wrong), None)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=500)
    ap.add_argument("--positions", type=int, default=100)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    ratios = simulate(a.seeds, a.positions)
    m = decisive_margin(ratios)
    print(f"{a.seeds} seeds x {a.positions} sampled positions; wrong-family share beyond the margin:")
    print("margin  " + "  ".join(f"{k:>12}" for k in ratios))
    for g in MARGIN_GRID:
        r = wrong_rates(ratios, g)
        print(f"{g:6.1f}  " + "  ".join(f"{r[k]:12.3f}" for k in ratios))
    print("right family (ratio sign) at margin 0: "
          + ", ".join(f"{k} {float(np.mean((lr > 0) == (k in TRUNCATION))):.3f}" for k, lr in ratios.items()))
    print(f"decisive margin (every mechanism <= {MAX_WRONG_RATE:.0%} wrong): {m}")
    if a.json is not None:
        a.json.write_text(json.dumps({"seeds": a.seeds, "positions": a.positions, "decisive_margin": m,
                                      "wrong_rates": {str(g): wrong_rates(ratios, g) for g in MARGIN_GRID},
                                      "quantiles": {k: [float(x) for x in np.nanquantile(lr, [0.01, 0.5, 0.99])]
                                                    for k, lr in ratios.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
