"""Margin-conditioned flip statistic straight from the simulator's served models (no server, no pool).

For a reference model (e.g. ``gemma-3-270m``, which has no calibration pool) and simulator profiles
(e.g. ``int4,substituted``): the default suite's first N T=0 prompts (completions text), greedy
continuations of T tokens decoded by the reference, then one teacher-forced forward of the
reference (float32) and of the served model (``simulator.served_model.build_served_model``) over
prompt+continuation.
At every continuation position the provider's top-M (``--top``, the suite's 5) and the reference's
top-20 give ``auditor.detectors.logprob.margin_flip_stats`` (the statistic of verdict rule 2), the
bucketed KL and the top-1 agreement, pooled over the prompts, and per prompt-resample (bootstrap
over prompts) the statistic's spread.

Usage (single thread; a few minutes for gemma-3-270m)::

    OMP_NUM_THREADS=1 python3 benchmarks/cause_margin_direct.py --model gemma-3-270m \
        --profiles int4,substituted --prompts 12 --tokens 32 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auditor.detectors.logprob import margin_flip_stats
from auditor.detectors.stats import bucketed_kl
from auditor.verdict.model_rules import SUBSTITUTION_MIN_FLIP_RATIO


def prompts_of(tokenizer, n: int) -> list[list[int]]:
    """Token ids of the default suite's first n temperature-0 prompts (completions text)."""
    from probes.suites import load_suite

    out, seen = [], set()
    for p in load_suite("default").probes:
        if p.temperature != 0 or p.prompt_text() in seen:
            continue
        seen.add(p.prompt_text())
        out.append(list(tokenizer(p.prompt_text())["input_ids"]))
        if len(out) == n:
            break
    return out


def score(model, ids: list[int]):
    """[L, V] float32 torch log-softmax of one sequence's next-token logits."""
    import torch

    with torch.no_grad():
        lg = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(lg, -1)


def greedy(model, ids: list[int], n: int, eos: set[int]) -> list[int]:
    """n greedy tokens of the reference (transformers ``generate`` with its KV cache; stops at EOS).

    The positions are then scored by both models; which model chose the prefix barely matters
    for a position-level statistic, and the reference's cached decoding is ~30x cheaper than
    decoding the served wrapper step by step on a shared CPU."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0])
    return [int(t) for t in out[0, len(ids):]]


def rows_for(ref, prov, prompt: list[int], cont: list[int], top: int, k: int = 20) -> dict[str, np.ndarray]:
    """Per continuation position: the arrays margin_flip_stats and bucketed_kl need (float64)."""
    seq = prompt + cont
    R = score(ref, seq)[len(prompt) - 1:len(seq) - 1]
    P = score(prov, seq)[len(prompt) - 1:len(seq) - 1]
    r_lp, rt = R.topk(k, dim=-1)
    p_lp, pt = P.topk(top, dim=-1)
    return {"ref_top_lp": r_lp.double().numpy(), "ref_top1": rt[:, 0].numpy(), "prov_top1": pt[:, 0].numpy(),
            "prov_lp": p_lp.double().numpy(), "ref_at_prov": R.gather(1, pt).double().numpy()}


def stat(rows: list[dict[str, np.ndarray]]) -> dict:
    """margin_flip_stats + mean bucketed KL + top-1 agreement over the given prompts' positions."""
    cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    d = margin_flip_stats(cat["ref_top_lp"], cat["ref_top1"], cat["prov_top1"], cat["prov_lp"], cat["ref_at_prov"])
    kl, _, _ = bucketed_kl(cat["ref_at_prov"], cat["prov_lp"])
    d["mean_kl"] = float(kl.mean())
    d["top1_agreement"] = float(np.mean(cat["ref_top1"] == cat["prov_top1"]))
    d["n"] = int(kl.size)
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--profiles", default="int4,substituted")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--resample-prompts", type=int, default=0,
                    help="prompts per resampled audit (default: as many as scored; 16 = the echo stage's default)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import torch

    from reference.models import load_model
    from simulator.profiles import get_profile
    from simulator.served_model import build_served_model

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ref_lm = load_model(a.model)
    prompts = prompts_of(ref_lm.tokenizer, a.prompts)
    eos = set(ref_lm.eos_token_ids)
    conts = [greedy(ref_lm.model, p, a.tokens, eos) or [0] for p in prompts]
    print(f"{len(prompts)} prompts, {sum(map(len, conts))} continuation tokens in {time.perf_counter() - t0:.0f}s",
          flush=True)
    res = {}
    for name in [p for p in a.profiles.split(",") if p]:
        t = time.perf_counter()
        served, _ = build_served_model(get_profile(name), ref_lm, copy_model=True)
        rows = [rows_for(ref_lm.model, served.model, p, c, a.top) for p, c in zip(prompts, conts, strict=True)]
        d = stat(rows)
        rng = np.random.default_rng(0)
        k = a.resample_prompts or len(rows)
        boots = [stat([rows[i] for i in rng.integers(0, len(rows), k)]) for _ in range(a.boot)]
        boot = [b["confident_flip_ratio"] for b in boots if b["confident_flip_ratio"] is not None]
        d["ratio_boot_q05_q50_q95"] = [float(np.quantile(boot, q)) for q in (0.05, 0.5, 0.95)] if boot else None
        # rule 2's view of each resampled audit of k prompts: informative, and named SUBSTITUTION
        inf = [b["confident_flip_ratio"] for b in boots if b["confident_flip_ratio"] is not None
               and (b["n_confident"] + 1.0) / (b["confident_flips_expected"] + 1.0) > SUBSTITUTION_MIN_FLIP_RATIO]
        d["resampled"] = {
            "prompts": k, "resamples": a.boot, "informative_share": len(inf) / max(a.boot, 1),
            "ratio_q50_q95_q99_max": [float(np.quantile(inf, q)) for q in (0.5, 0.95, 0.99)] + [float(max(inf))]
            if inf else None,
            "substitution_share": float(np.mean([r > SUBSTITUTION_MIN_FLIP_RATIO for r in inf])) if inf else None,
        }
        d["seconds"] = time.perf_counter() - t
        res[name] = d
        print(f"{a.model} {name:14s} n={d['n']} ratio={d['confident_flip_ratio']} boot={d['ratio_boot_q05_q50_q95']} "
              f"obs={d['confident_flips']} exp={d['confident_flips_expected']:.2f} nconf={d['n_confident']} "
              f"sigma={d['sigma_hat']:.3f} kl={d['mean_kl']:.3f} top1={d['top1_agreement']:.2f} "
              f"resampled={d['resampled']} ({d['seconds']:.0f}s)", flush=True)
        del served
    print(f"total {time.perf_counter() - t0:.0f}s")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
