"""Lock-step batched speculative decoding (reference.speculative_batch) against the sequential loop."""

from __future__ import annotations

import pytest
import torch

from reference.drafters import Drafter, NgramDrafter, Proposal
from reference.speculative import autoregressive_generate, speculative_generate
from reference.speculative_batch import batchable, speculative_generate_batch
from reference.suffix import SuffixDrafter
from reference.verify import StrictVerifier
from simulator.verifiers import RelaxedThresholdVerifier

TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "one two three one two three one two",
    "The cat sat on the mat. The cat sat on the",
    "[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2",
    "a b",
]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def prompts(tiny_lm):
    out = [tiny_lm.tokenizer(t)["input_ids"] for t in TEXTS]
    assert len({len(p) for p in out}) > 2 and min(len(p) for p in out) >= 2  # lengths differ: left padding is exercised
    return out


class OracleDrafter(Drafter):
    """Stateless: proposes the plain greedy continuation of whichever prompt the context extends, with
    every third proposal wrong (so rounds accept 0..k drafts); elsewhere the last token repeated."""

    def __init__(self, plain: dict[tuple[int, ...], list[int]], vocab: int):
        self.plain, self.vocab = plain, vocab

    def _draft(self, context_ids, k, sampling, generator):
        ctx = list(context_ids)
        for prompt, cont in self.plain.items():
            if tuple(ctx[: len(prompt)]) == prompt and ctx[len(prompt):] == cont[: len(ctx) - len(prompt)]:
                pos = len(ctx) - len(prompt)
                out = list(cont[pos : pos + k])
                if out and pos % 3 == 0:
                    out[-1] = (out[-1] + 1) % self.vocab
                return Proposal(torch.tensor(out, dtype=torch.long), None)
        return Proposal(torch.tensor([ctx[-1]] * k, dtype=torch.long), None)


def _oracle(lm, prompts, n=40):
    plain = {tuple(p): autoregressive_generate(lm, p, max_new_tokens=n, eos_token_ids=[]).token_ids for p in prompts}
    return OracleDrafter(plain, int(lm.model.config.vocab_size))


def _gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_greedy_strict_batch_equals_plain_greedy(tiny_lm, prompts):
    """Lossless: strict verification at T = 0 in a batch emits each row's plain argmax chain, and the
    logits it reports for each emitted token are the model's at that prefix (the masked cache is right)."""
    rows: dict[int, list[torch.Tensor]] = {}

    def on_round(b, ids, logits):
        assert len(ids) == logits.shape[0] >= 1
        rows.setdefault(b, []).extend(logits)

    n = [30, 12, 25, 30, 8]
    res = speculative_generate_batch(
        tiny_lm, prompts, drafter=_oracle(tiny_lm, prompts), k=4, max_new_tokens=n, temperature=0.0, top_k=0, top_p=1.0,
        generators=_gens(range(5)), verifiers=[StrictVerifier() for _ in prompts], eos_token_ids=[], on_round=on_round,
    )
    assert sum(r.n_accepted for r in res) > 20  # multi-token rounds were batched
    assert any(c > 0 for r in res for c in r.accept_counts[:-1])  # ... and rejections masked out of the cache
    for b, (p, r) in enumerate(zip(prompts, res, strict=True)):
        plain = autoregressive_generate(tiny_lm, p, max_new_tokens=n[b], eos_token_ids=[])
        assert r.token_ids == plain.token_ids
        full = torch.tensor([list(p) + r.token_ids[:-1]])
        with torch.inference_mode():
            ref = tiny_lm.model(input_ids=full).logits[0, len(p) - 1 :]
        got = torch.stack(rows[b])
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("adaptive", [True, False])
def test_relaxed_sampling_batch_matches_sequential(tiny_lm, prompts, adaptive):
    """A draft-dependent lossy verifier at T = 1: each row of the batch is the sequential loop's request
    (same drafts, same draws in the same order; only float rounding across batch shapes may differ)."""
    seeds = [11, 12, 13, 14, 15]
    n = [20, 20, 16, 20, 10]
    drafter = _oracle(tiny_lm, prompts)
    res = speculative_generate_batch(
        tiny_lm, prompts, drafter=drafter, k=4, max_new_tokens=n, temperature=1.0, top_k=0, top_p=1.0,
        generators=_gens(seeds), verifiers=[RelaxedThresholdVerifier(0.3, 0.5) for _ in prompts], eos_token_ids=[],
        adaptive_k=adaptive,
    )
    assert sum(r.n_drafted for r in res) > 20
    same = 0
    for b, p in enumerate(prompts):
        seq = speculative_generate(
            tiny_lm, p, drafter=drafter, k=4, max_new_tokens=n[b], temperature=1.0,
            generator=torch.Generator().manual_seed(seeds[b]), verifier=RelaxedThresholdVerifier(0.3, 0.5),
            eos_token_ids=[], adaptive_k=adaptive,
        )
        assert len(res[b].token_ids) == n[b]
        same += res[b].token_ids == seq.token_ids and res[b].k_history == seq.k_history
    assert same >= len(prompts) - 1


def test_eos_ends_a_row_and_the_batch_shrinks(tiny_lm, prompts):
    """A row that emits EOS stops (EOS excluded) while the others go on to their caps."""
    plain = autoregressive_generate(tiny_lm, prompts[0], max_new_tokens=20, eos_token_ids=[])
    eos = plain.token_ids[5]
    res = speculative_generate_batch(
        tiny_lm, prompts[:3], drafter=_oracle(tiny_lm, prompts[:3]), k=3, max_new_tokens=[20, 20, 20], temperature=0.0, top_k=0,
        top_p=1.0, generators=_gens([0, 1, 2]), verifiers=[StrictVerifier() for _ in range(3)], eos_token_ids=[eos],
    )
    assert res[0].finish_reason == "stop" and res[0].token_ids == plain.token_ids[: plain.token_ids.index(eos)]
    for b in (1, 2):
        ref = autoregressive_generate(tiny_lm, prompts[b], max_new_tokens=20, eos_token_ids=[eos])
        assert res[b].token_ids == ref.token_ids


def test_refuses_what_it_cannot_batch(tiny_lm, prompts):
    assert batchable(tiny_lm, NgramDrafter()) is None and batchable(tiny_lm, None) is None
    why = batchable(tiny_lm, SuffixDrafter())
    assert why is not None and "SuffixDrafter" in why
    kw = dict(k=2, max_new_tokens=[4], temperature=0.0, top_k=0, top_p=1.0, generators=_gens([0]),
              verifiers=[StrictVerifier()])
    with pytest.raises(ValueError, match="cannot batch"):
        speculative_generate_batch(tiny_lm, prompts[:1], drafter=SuffixDrafter(), **kw)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        speculative_generate_batch(tiny_lm, [[5]], drafter=NgramDrafter(), **kw)
    with pytest.raises(ValueError, match="one max_new_tokens"):
        speculative_generate_batch(tiny_lm, prompts[:2], drafter=NgramDrafter(), **kw)
