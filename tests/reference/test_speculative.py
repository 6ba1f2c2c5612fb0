"""The speculative loop on tiny models: greedy equality, limits, callbacks, logprobs, the law at T>0."""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from scipy import stats

from reference.drafters import (
    DraftModelDrafter,
    NgramDrafter,
    ScriptedDrafter,
    SelfDrafter,
    SequenceDrafter,
)
from reference.sampling import sample_from
from reference.speculative import (
    CostModel,
    DraftLengthPolicy,
    autoregressive_generate,
    speculative_generate,
)
from reference.verify import VerifyResult, rejection_dist

from ..conftest import make_tiny_model

PROMPT_TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster (and steadier on a shared 2-core box) on one thread."""
    with one_thread():
        yield


@contextmanager
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def prompt_ids(tiny_lm):
    return tiny_lm.tokenizer(PROMPT_TEXT)["input_ids"]


@pytest.fixture(scope="module")
def plain(tiny_lm, prompt_ids):
    return autoregressive_generate(tiny_lm, prompt_ids, max_new_tokens=40, eos_token_ids=[])


def test_plain_baseline_stats(plain):
    assert len(plain.token_ids) == 40 and plain.finish_reason == "length"
    assert plain.rounds == [1] * 40 and plain.accept_counts == [40]
    assert plain.mean_accepted_length == 1.0 and plain.tokens_per_s > 0 and plain.text


def test_plain_matches_full_recompute_argmax(tiny_lm, prompt_ids, plain):
    seq = list(prompt_ids)
    with torch.no_grad():
        for _ in range(10):
            seq.append(int(tiny_lm.model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert plain.token_ids[:10] == seq[len(prompt_ids) :]


def _drafters(tiny_lm, tiny_draft_lm, prompt_ids, plain):
    wrong = list(prompt_ids) + [(t + 1) if i % 3 == 1 else t for i, t in enumerate(plain.token_ids)]
    return {
        "ngram": NgramDrafter(1, 3),
        "self:1": SelfDrafter(tiny_lm, 1),
        "draft-model": DraftModelDrafter(tiny_draft_lm),
        "oracle": SequenceDrafter(list(prompt_ids) + plain.token_ids),
        "corrupted": SequenceDrafter(wrong),
    }


@pytest.mark.parametrize(("k", "adaptive"), [(4, False), (2, True)])
def test_greedy_speculative_equals_plain_tiny(tiny_lm, tiny_draft_lm, prompt_ids, plain, k, adaptive):
    for name, d in _drafters(tiny_lm, tiny_draft_lm, prompt_ids, plain).items():
        res = speculative_generate(
            tiny_lm, prompt_ids, drafter=d, k=k, max_new_tokens=40, eos_token_ids=[], adaptive_k=adaptive
        )
        assert res.token_ids == plain.token_ids, name
        assert sum(res.rounds) == 40 and len(res.rounds) == sum(res.accept_counts)
        assert len(res.accept_counts) == k + 1
        assert all(1 <= r <= k + 1 for r in res.rounds)
        if name == "oracle" and not adaptive:
            assert res.accept_counts[k] >= (40 // (k + 1)) - 1  # every round fully accepted
            assert res.acceptance_rate == 1.0


def test_oracle_drafts_cut_forward_count(tiny_lm, prompt_ids, plain):
    res = speculative_generate(
        tiny_lm, prompt_ids, drafter=SequenceDrafter(list(prompt_ids) + plain.token_ids), k=4,
        max_new_tokens=40, eos_token_ids=[], adaptive_k=False,
    )
    assert len(res.rounds) == 8 and res.mean_accepted_length == 5.0


@pytest.mark.parametrize("max_new", [1, 2, 5, 7])
def test_never_exceeds_max_new_tokens(tiny_lm, prompt_ids, plain, max_new):
    d = SequenceDrafter(list(prompt_ids) + plain.token_ids)
    res = speculative_generate(tiny_lm, prompt_ids, drafter=d, k=4, max_new_tokens=max_new, eos_token_ids=[])
    assert res.token_ids == plain.token_ids[:max_new] and res.finish_reason == "length"


def test_eos_stops_and_is_excluded(tiny_lm, prompt_ids, plain):
    eos = plain.token_ids[6]
    first = plain.token_ids.index(eos)
    d = SequenceDrafter(list(prompt_ids) + plain.token_ids)
    seen: list[list[int]] = []
    res = speculative_generate(
        tiny_lm, prompt_ids, drafter=d, k=4, max_new_tokens=40, eos_token_ids=[eos], on_round=seen.append,
        adaptive_k=False,
    )
    assert res.finish_reason == "stop" and res.stop_token_id == eos
    assert res.token_ids == plain.token_ids[:first]
    assert list(itertools.chain.from_iterable(seen)) == res.token_ids
    assert sum(res.rounds) == first + 1  # the EOS was emitted by the last round


def test_on_round_streams_each_round(tiny_lm, prompt_ids, plain):
    chunks: list[list[int]] = []
    res = speculative_generate(
        tiny_lm, prompt_ids, drafter=SequenceDrafter(list(prompt_ids) + plain.token_ids), k=3,
        max_new_tokens=20, eos_token_ids=[], on_round=chunks.append, adaptive_k=False,
    )
    assert [len(c) for c in chunks] == res.rounds
    assert list(itertools.chain.from_iterable(chunks)) == res.token_ids


def test_return_logprobs_are_raw_target_rows(tiny_lm, prompt_ids):
    res = speculative_generate(
        tiny_lm, prompt_ids, drafter=NgramDrafter(1, 3), k=3, max_new_tokens=12, temperature=0.8, top_k=20,
        seed=0, eos_token_ids=[], return_logprobs=True,
    )
    assert res.logprobs.shape == (12, tiny_lm.model.config.vocab_size) and res.logprobs.dtype == torch.float32
    with torch.no_grad():
        full = torch.log_softmax(tiny_lm.model(torch.tensor([list(prompt_ids) + res.token_ids])).logits[0].float(), -1)
    ref = full[len(prompt_ids) - 1 : -1]
    assert torch.allclose(res.logprobs, ref, atol=1e-4)
    # the sampled tokens lie inside top-k of the raw distribution
    chosen_rank = (ref > ref.gather(1, torch.tensor(res.token_ids)[:, None])).sum(-1)
    assert (chosen_rank < 20).all()


def test_sampling_is_seeded(tiny_lm, tiny_draft_lm, prompt_ids):
    kw = dict(k=3, max_new_tokens=15, temperature=1.0, top_p=0.95, eos_token_ids=[])
    a = speculative_generate(tiny_lm, prompt_ids, drafter=DraftModelDrafter(tiny_draft_lm), seed=5, **kw)
    b = speculative_generate(tiny_lm, prompt_ids, drafter=DraftModelDrafter(tiny_draft_lm), seed=5, **kw)
    c = speculative_generate(tiny_lm, prompt_ids, drafter=DraftModelDrafter(tiny_draft_lm), seed=6, **kw)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_verifier_plug_sees_every_step(tiny_lm, prompt_ids, plain):
    calls = []

    class RejectAll:
        def verify(self, p, q, draft_ids, generator, greedy):
            calls.append(int(draft_ids.numel()))
            return VerifyResult(0, int(p[0].argmax()))

    res = speculative_generate(
        tiny_lm, prompt_ids, drafter=NgramDrafter(1, 3), k=4, max_new_tokens=20, eos_token_ids=[],
        verifier=RejectAll(), adaptive_k=False,
    )
    assert res.token_ids == plain.token_ids[:20]  # greedy argmax either way
    assert len(calls) == 20 and res.accept_counts[0] == 20
    assert res.n_accepted == 0 and res.n_drafted == sum(calls)

    class Liar:
        def verify(self, p, q, draft_ids, generator, greedy):
            return VerifyResult(int(draft_ids.numel()) + 1, 0)

    with pytest.raises(RuntimeError, match="n_accepted"):
        speculative_generate(tiny_lm, prompt_ids, drafter=NgramDrafter(1, 3), max_new_tokens=5, verifier=Liar())


def test_bad_arguments(tiny_lm):
    with pytest.raises(ValueError, match="input_ids"):
        speculative_generate(tiny_lm, [], drafter=None)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(tiny_lm, [1, 2], drafter=None, max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(tiny_lm, [1, 2], drafter=None, temperature=-1)
    with pytest.raises(ValueError, match="k="):
        speculative_generate(tiny_lm, [1, 2], drafter=NgramDrafter(), k=-1)


def test_single_token_prompt_and_empty_drafts(tiny_lm):
    res = speculative_generate(tiny_lm, [42], drafter=ScriptedDrafter([]), max_new_tokens=4, eos_token_ids=[])
    ref = autoregressive_generate(tiny_lm, [42], max_new_tokens=4, eos_token_ids=[])
    assert res.token_ids == ref.token_ids and res.n_drafted == 0


def test_draft_length_policy_cost_model():
    a = DraftLengthPolicy(k_max=6)
    for _ in range(30):
        a.observe(0, 4)  # drafts always rejected
    assert a.truncate(6) == 0 and a.plan(6) == 0
    for _ in range(30):
        a.observe(4, 4)  # drafts always accepted
    assert a.truncate(6) >= 5 and a.plan(6) >= 5  # long drafts (the n = 7 step may make 5 the best)
    expensive = DraftLengthPolicy(k_max=6, cost=CostModel(draft_cost=1.0))
    for _ in range(30):
        expensive.observe(2, 4)
    assert expensive.plan(6) == 0  # drafting as costly as a target step never pays at a ~ 0.6
    assert a.plan(0) == 0
    with pytest.raises(ValueError, match="k_max"):
        DraftLengthPolicy(k_max=-1)
    with pytest.raises(ValueError, match="forward_costs"):
        CostModel(forward_costs=(1.0, 1.5, 1.2))  # decreasing
    with pytest.raises(ValueError, match="forward_costs"):
        CostModel(forward_costs=())
    with pytest.raises(ValueError, match="extra_per_token"):
        CostModel(extra_per_token=-0.1)
    with pytest.raises(ValueError, match="overhead"):
        CostModel.linear(-0.5, 0.1)


def test_cost_model_prices_the_measured_forward_table():
    """Verifying k drafts costs the measured forward over k+1 tokens: short verifies are nearly free
    (n = 2: 1.08), the GEMM step sits at n = 4, and the table extends linearly (issue 15)."""
    c = CostModel()
    assert c.round_cost(0) == 1.0 and c.round_cost(1) == pytest.approx(1.08)
    assert c.round_cost(2) < 1.2 < 1.5 < c.round_cost(3)
    assert c.round_cost(9) == pytest.approx(c.round_cost(8) + c.extra_per_token)
    assert CostModel(draft_cost=0.5).round_cost(2) == pytest.approx(c.round_cost(2) + 1.0)
    assert c.round_cost(2, include_draft=False) == CostModel(draft_cost=0.5).round_cost(2, include_draft=False)
    prior = DraftLengthPolicy(k_max=8)
    assert prior.truncate(1) == 1  # 1.6 expected tokens for 1.08 forwards pays
    stepped = DraftLengthPolicy(k_max=8, cost=CostModel.linear(0.6, 0.08))
    assert stepped.truncate(1) == 0  # the former 1.68-forward price refused it
    assert CostModel.linear(0.6, 0.08).round_cost(3) == pytest.approx(1.84)
    poor = DraftLengthPolicy(k_max=8)
    for _ in range(30):
        poor.observe(0, 1)  # lone drafts always rejected: even at 1.08 forwards they stop
    assert poor.truncate(1) == 0
    sure = DraftLengthPolicy(k_max=8)
    for _ in range(30):
        sure.observe(3, 3)
    assert sure.truncate(1) == 1 and sure.plan(8) == 8


def test_policy_falls_back_to_plain_and_probes_again(tiny_lm, prompt_ids, plain):
    """Drafts that are always wrong: k drops to 0 within a few rounds; later probes are rare and short."""
    wrong = ScriptedDrafter(lambda ctx, k: [(plain.token_ids[len(ctx) - len(prompt_ids)] + 1) % 49152] * k
                            if len(ctx) - len(prompt_ids) < len(plain.token_ids) else [])
    res = speculative_generate(tiny_lm, prompt_ids, drafter=wrong, k=8, max_new_tokens=40, eos_token_ids=[])
    assert res.token_ids == plain.token_ids and res.n_accepted == 0
    first_plain = res.k_history.index(0)
    # shrinking probes until the decayed estimate drops below one-draft break-even (~8 %): at 1.08
    # forwards a rejected lone draft wastes 0.08, so the whole descent costs about one forward
    assert first_plain <= 12, res.k_history
    wasted = sum(CostModel().round_cost(x) - 1.0 for x in res.k_history[:first_plain])
    assert wasted < 1.5, res.k_history
    assert res.k_history[first_plain:first_plain + 4] == [0, 0, 0, 0]  # a backoff of 4 plain rounds
    probes = [x for x in res.k_history[first_plain:] if x > 0]
    assert probes and max(probes) <= 2  # later probes are short (the prior's k at the n = 4 step)
    all_wasted = sum(CostModel().round_cost(x) - 1.0 for x in res.k_history)
    assert all_wasted <= 0.1 * len(res.k_history), res.k_history  # at most ~10 % over plain
    assert res.draft_policy.startswith("counts(") and res.to_dict()["k_history"] == res.k_history
    # a drafter that is always right keeps drafting at full depth
    good = speculative_generate(
        tiny_lm, prompt_ids, drafter=SequenceDrafter(list(prompt_ids) + plain.token_ids), k=8,
        max_new_tokens=40, eos_token_ids=[],
    )
    assert good.token_ids == plain.token_ids and 8 in good.k_history and good.mean_accepted_length > 4


def test_policy_is_a_function_of_counts_only(tiny_lm, prompt_ids, plain):
    """The same generation twice, with the clock made erratic in between, picks the same k every round."""
    import time as _time

    from reference import speculative as spec

    kw = dict(drafter=NgramDrafter(1, 3), k=6, max_new_tokens=30, temperature=1.0, seed=3, eos_token_ids=[])
    a = speculative_generate(tiny_lm, prompt_ids, **kw)
    calls = itertools.count()
    real = _time.perf_counter
    try:
        spec.time.perf_counter = lambda: real() + 10.0 * (next(calls) % 3)  # type: ignore[attr-defined]
        b = speculative_generate(tiny_lm, prompt_ids, **kw)
    finally:
        spec.time.perf_counter = real  # type: ignore[attr-defined]
    assert a.token_ids == b.token_ids and a.k_history == b.k_history
    assert speculative_generate(tiny_lm, prompt_ids, adaptive_k=False, **kw).draft_policy == "fixed"
    assert plain.draft_policy == "plain"


# ---- the output law at temperature > 0: chi-square over seeded draws on tiny small-vocab models ----
VSMALL = 6
PROMPT_SMALL = [0, 1, 2]


def _tiny_small(seed):
    return make_tiny_model(
        vocab_size=VSMALL, seed=seed, hidden_size=16, n_layers=1, n_heads=2, n_kv_heads=1,
        initializer_range=1.0, eos_token_id=None,
    )


@pytest.fixture(scope="module")
def small_pair():
    tgt, drf = _tiny_small(3), _tiny_small(4)
    seqs = list(itertools.product(range(VSMALL), repeat=3))
    with torch.no_grad():
        x = torch.tensor([PROMPT_SMALL + list(s) for s in seqs])
        lp = torch.log_softmax(tgt(x).logits.double(), -1)
        n = len(PROMPT_SMALL)
        ll = sum(lp[:, n - 1 + j].gather(1, x[:, n + j : n + j + 1]).squeeze(1) for j in range(3))
    return tgt, drf, seqs, ll.exp().numpy()


class BrokenThreshold:
    """Deliberately lossy: accept iff p(d) >= 0.3 (no u draw); otherwise the strict residual."""

    def verify(self, p, q, draft_ids, generator, greedy):
        for i, d in enumerate(draft_ids.tolist()):
            if float(p[i, d]) >= 0.3:
                continue
            return VerifyResult(i, sample_from(rejection_dist(p[i], None if q is None else q[i], d), generator))
        return VerifyResult(int(draft_ids.numel()), sample_from(p[-1], generator))


def _chisquare_pvalue(small_pair, verifier, n_draws):
    tgt, drf, seqs, exact = small_pair
    index = {s: i for i, s in enumerate(seqs)}
    counts = np.zeros(len(seqs))
    drafter = DraftModelDrafter(drf)
    with one_thread():
        for s in range(n_draws):
            r = speculative_generate(
                tgt, PROMPT_SMALL, drafter=drafter, k=2, max_new_tokens=3, temperature=1.0, seed=s,
                eos_token_ids=[], adaptive_k=False, verifier=verifier,
            )
            counts[index[tuple(r.token_ids)]] += 1
    expected = exact * n_draws
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_chisquare_strict_sampling_matches_target_law(small_pair):
    """Joint law of 3 tokens (k=2: first round exercises accept, residual and bonus rows) equals p."""
    assert abs(small_pair[3].sum() - 1) < 1e-9
    assert _chisquare_pvalue(small_pair, None, 800) > 1e-3


def test_chisquare_rejects_broken_acceptance_rule(small_pair):
    assert _chisquare_pvalue(small_pair, BrokenThreshold(), 300) < 1e-3


def test_output_reaches_the_drafter_even_when_on_round_stops_generation(tiny_lm, prompt_ids):
    from reference.suffix import SuffixDrafter

    class Stop(Exception):
        pass

    def stop_after_5(ids: list[int], seen: list[int] = []) -> None:  # noqa: B006 - a per-test counter
        seen.extend(ids)
        if len(seen) >= 5:
            raise Stop

    d = SuffixDrafter()
    with pytest.raises(Stop):
        speculative_generate(tiny_lm, prompt_ids, drafter=d, k=4, max_new_tokens=40, eos_token_ids=[], on_round=stop_after_5)
    assert d.cache.n_outputs == 1 and len(d.cache) >= 1 + 5 + 1
    with pytest.raises(ValueError, match="n_max"):
        CostModel.linear(0.6, 0.08, n_max=1)
    assert "+0.1/token" in DraftLengthPolicy(k_max=4).describe()
