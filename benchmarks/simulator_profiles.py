"""Per-profile distance of the simulator's served distribution from the float32 reference.

For a fixed prompt set (chat prompts, greedy float32 continuations of ``--tokens`` tokens),
every profile's served model is teacher-forced on the same prompt + continuation and compared
with the float32 reference at every continuation position:

- ``mean_kl``: mean KL(p_fp32 || p_profile) in nats (full vocabulary);
- ``top1``: fraction of positions where the argmax agrees;
- ``max_abs_dlogp``: mean over positions of max |Δ logprob| on the reference's top-20.

Relaxed/noncompliant profiles serve the float32 model unchanged (their deviation is in the
sampling law, not in p), so their KL is 0 by construction; the row says so. The script also
reports each profile's build time (quantization seconds) and the process RSS after building.

Usage: ``python benchmarks/simulator_profiles.py [--tokens 32] [--prompts 6] [--profiles a,b]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

PROMPTS = [
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "What is 17 times 23? Show your work.",
    "Give three tips for writing clear emails.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "List the planets of the solar system in order.",
]


def rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def full_logprobs(model, prompt_ids: list[int], cont: list[int], nonce: int = 0) -> torch.Tensor:
    """``[T, V]`` float64 log-softmax of ``model`` at the continuation positions (teacher forcing)."""
    if hasattr(model, "nonce"):
        model.nonce = nonce
    ids = torch.tensor([prompt_ids + cont])
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
    rows = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(cont)]
    return torch.log_softmax(rows, dim=-1)


def main() -> None:
    from reference.models import load_model
    from reference.speculative import autoregressive_generate
    from simulator.profiles import get_profile, list_profiles
    from simulator.served_model import build_served_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--profiles", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    lm = load_model()
    tok = lm.tokenizer
    from reference.scoring import encode_prompt

    prompts = [encode_prompt(tok, [{"role": "user", "content": p}], chat=True) for p in PROMPTS[: args.prompts]]
    conts = [
        autoregressive_generate(lm, p, max_new_tokens=args.tokens, temperature=0.0, eos_token_ids=[]).token_ids
        for p in prompts
    ]
    refs = [full_logprobs(lm.model, p, c) for p, c in zip(prompts, conts, strict=True)]
    names = [n for n in args.profiles.split(",") if n] or [p.name for p in list_profiles()]
    rows = []
    for name in names:
        prof = get_profile(name)
        t0 = time.perf_counter()
        served, info = build_served_model(prof, lm, copy_model=True)
        build_s = time.perf_counter() - t0
        kls, top1, dmax = [], [], []
        for i, (p, c, ref) in enumerate(zip(prompts, conts, refs, strict=True)):
            lp = full_logprobs(served.model, p, c, nonce=1000 + i)
            kl = (ref.exp() * (ref - lp)).sum(-1)
            kls.append(kl)
            top1.append((ref.argmax(-1) == lp.argmax(-1)).double())
            ti = torch.topk(ref, 20, dim=-1).indices
            dmax.append((ref.gather(1, ti) - lp.gather(1, ti)).abs().max(-1).values)
        kl = torch.cat(kls)
        row = {
            "profile": name,
            "family": prof.family,
            "mean_kl": float(kl.mean()),
            "p95_kl": float(kl.quantile(0.95)),
            "top1": float(torch.cat(top1).mean()),
            "mean_max_abs_dlogp_top20": float(torch.cat(dmax).mean()),
            "n_positions": int(kl.numel()),
            "build_s": round(build_s, 2),
            "quant_s": (info.quant or {}).get("seconds"),
            "quant_backend": (info.quant or {}).get("backend"),
            "layers": info.layers,
            "peak_rss_mib": round(rss_mib(), 1),
            "note": "p unchanged; the sampling law deviates" if prof.family == "relaxed" or prof.forced_top_p
            else "p unchanged; greedy tokens deviate" if prof.verifier == "decode-noncompliant" else "",
        }
        rows.append(row)
        del served
    hdr = f"{'profile':22s} {'mean KL (nats)':>14s} {'p95 KL':>10s} {'top-1':>7s} {'max|dlogp|':>10s} {'build s':>8s}"
    print(f"{len(prompts)} prompts x {args.tokens} tokens = {rows[0]['n_positions']} positions; reference fp32")
    print(hdr)
    for r in rows:
        print(
            f"{r['profile']:22s} {r['mean_kl']:14.3e} {r['p95_kl']:10.2e} {r['top1']:7.3f} "
            f"{r['mean_max_abs_dlogp_top20']:10.4f} {r['build_s']:8.2f}  {r['note']}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
