"""Distribution of the margin-conditioned flip statistic (verdict rule 2) over resampled audits.

Reads calibration pools (``auditor.calibration.pool.Pool`` ``.npz`` files, never writes them) and
the cached noise floor (``FloorSet`` JSON under ``<cache>/noise``), draws audits of the default
suite's mix at each budget exactly as the calibration does (``draw_audit`` with
``SeedSequence([seed, B, j])``, ``evidence_for`` float32 rows) and runs ``logprob_divergence``;
per profile and budget it prints the quantiles of ``confident_flip_ratio`` (see
``auditor.detectors.logprob.margin_flip_stats``), σ̂, confident positions, mean KL, top-1
agreement and the share of audits in which logprob-divergence rejects at α = 0.05.

Usage::

    python3 benchmarks/cause_margin.py --pools /work/calibcache/pools --noise /work/calibcache/noise \
        [--profiles int4,int8,substituted] [--budgets 300,1000] [--audits 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auditor.calibration.draws import default_mix, draw_audit, evidence_for
from auditor.calibration.pool import Pool
from auditor.check.measured_floors import FloorSet
from auditor.detectors.logprob import logprob_divergence

QUANTILES = (0.0, 0.05, 0.5, 0.95, 0.99, 1.0)


def audit_stats(pool: Pool, floors: FloorSet, budgets: list[int], audits: int, seed: int = 0) -> dict:
    """budget → list of per-audit dicts (ratio, sigma, n_confident, observed, expected, kl, top1, p)."""
    mix = default_mix()
    fl = floors.floors["float32"]
    out: dict[int, list[dict]] = {}
    for B in budgets:
        rows = []
        for j in range(audits):
            rng = np.random.default_rng(np.random.SeedSequence([seed, int(B), j]))
            d = draw_audit(pool, int(B), mix, rng)
            r = logprob_divergence(evidence_for(pool, d, mix, "float32"), fl, n_boot=20, rng=j)
            if not r.ran:
                continue
            x = r.details
            rows.append({"ratio": x["confident_flip_ratio"], "sigma": x["sigma_hat"], "n_conf": x["n_confident"],
                         "obs": x["confident_flips"], "exp": x["confident_flips_expected"], "kl": r.effect,
                         "top1": x["top1_agreement"], "p": r.p_value, "n": r.n,
                         "bins": [(b["n"], b["flips"], round(b["expected"], 4)) for b in x["margin_bins"]]})
        out[B] = rows
    return out


def summarize(rows: list[dict]) -> dict:
    """Quantiles of the ratio and medians of the rest (audits with a defined ratio)."""
    ok = [r for r in rows if r["ratio"] is not None]
    if not ok:
        return {"audits": len(rows)}
    ratio = np.array([r["ratio"] for r in ok])
    med = {k: float(np.median([r[k] for r in ok])) for k in ("sigma", "n_conf", "obs", "exp", "kl", "top1", "n")}
    return {"audits": len(ok), "reject_share": float(np.mean([r["p"] <= 0.05 for r in ok])),
            "ratio_q": {str(q): float(np.quantile(ratio, q)) for q in QUANTILES}, "median": med}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pools", type=Path, required=True)
    ap.add_argument("--noise", type=Path, required=True)
    ap.add_argument("--profiles", default="")
    ap.add_argument("--budgets", default="300,1000")
    ap.add_argument("--audits", type=int, default=100)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    floors = FloorSet.from_json(next(a.noise.glob("smollm2*.json")).read_text())
    want = [p for p in a.profiles.split(",") if p]
    budgets = [int(b) for b in a.budgets.split(",")]
    res = {}
    for f in sorted(a.pools.glob("*.npz")):
        pool = Pool.load(f)
        if want and pool.profile not in want:
            continue
        stats = audit_stats(pool, floors, budgets, a.audits)
        res[pool.profile] = {str(B): {"summary": summarize(rows), "rows": rows} for B, rows in stats.items()}
        for B in budgets:
            s = res[pool.profile][str(B)]["summary"]
            q = s.get("ratio_q", {})
            m = s.get("median", {})
            print(f"{pool.profile:24s} B={B:5d} n={s['audits']:4d} rej={s.get('reject_share', 0):.2f} "
                  + " ".join(f"q{k}={v:.2f}" for k, v in q.items())
                  + f" | sigma={m.get('sigma', 0):.3f} nconf={m.get('n_conf', 0):.0f} obs={m.get('obs', 0):.0f} "
                  f"exp={m.get('exp', 0):.2f} kl={m.get('kl', 0):.3f} top1={m.get('top1', 0):.2f}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
