"""Engine logprob conventions (probes.conventions) and vLLM's partial characters in alignment and the
tokenizer rule (issue 40, item 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from probes.align import _byte_vocab, align_to_reference
from probes.conventions import RANKED, LogprobConvention, certified_top, learn_convention, requested_top_logprobs
from probes.records import TokenRecord


def _tok(i: int, s: str, lp: float, alts: list[tuple[str, float]], b: bytes | None = None) -> TokenRecord:
    return TokenRecord(index=i, token=s, bytes=s.encode() if b is None else b, logprob=lp,
                       top_logprobs=[(a, a.encode(), v) for a, v in alts])


def _draws(k: int, capped: bool, n: int = 400, seed: int = 0) -> tuple[list[list[TokenRecord]], list[int]]:
    """vLLM-style lists over a fixed 30-token distribution; returns the tokens and the true ranks drawn."""
    rng = np.random.default_rng(seed)
    p = np.sort(rng.dirichlet(np.full(30, 0.5)))[::-1]
    names = [f"t{j}" for j in range(30)]
    toks, ranks = [], []
    for i in range(n):
        r = int(rng.choice(30, p=p))
        others = [(names[j], math.log(p[j])) for j in range(30) if j != r][: (k - 1 if capped else k)]
        alts = [(names[r], math.log(p[r]))] + others
        toks.append(_tok(i, names[r], math.log(p[r]), alts[: k if capped else k + 1]))
        ranks.append(r)
    return [toks], ranks


@pytest.mark.parametrize("capped", [False, True])
def test_sampled_first_learned_and_certified_top_is_the_true_top_m(capped) -> None:
    k = 5
    resp, ranks = _draws(k, capped)
    conv = learn_convention(resp, k)
    assert conv.sampled_first and conv.sampled_always_listed
    m = k - 1 if capped else k
    assert conv.certified_m == m
    for t, r in zip(resp[0], ranks, strict=True):
        top = certified_top(t.top_logprobs, conv)
        assert [a[0] for a in top] == [f"t{j}" for j in range(m)]  # whatever was sampled
        assert (t.token in {a[0] for a in top}) == (r < m)
    assert LogprobConvention.from_dict(conv.to_dict()) == conv


def test_ranked_lists_are_left_whole() -> None:
    toks = [_tok(0, "b", -1.2, [("a", -0.5), ("b", -1.2), ("c", -2.0)]), _tok(1, "z", -6.0, [("a", -0.1), ("c", -3.0)])]
    conv = learn_convention([toks], 3)
    assert not conv.sampled_first and not conv.sampled_always_listed and conv.certified_m is None
    assert [a[0] for a in certified_top(toks[0].top_logprobs, conv)] == ["a", "b", "c"]
    assert LogprobConvention.from_dict(None) == RANKED
    assert requested_top_logprobs({"messages": [], "logprobs": True, "top_logprobs": 7}) == 7
    assert requested_top_logprobs({"prompt": "x", "logprobs": 3}) == 3
    assert requested_top_logprobs({"prompt": "x", "logprobs": True}) is None


def test_greedy_only_lists_are_not_called_sampled_first() -> None:
    """At T = 0 the sampled token is the top-1: first in either convention, so nothing is learned."""
    toks = [_tok(i, "a", -0.3, [("a", -0.3), ("b", -1.5)]) for i in range(20)]
    assert not learn_convention([toks], 2).sampled_first


# ------------------------------------------------------------------------------------------ partial characters
def _vllm_sqrt(tok) -> list[TokenRecord]:
    """'x = √2' as vLLM returns SmolLM2's tokens: ' √' is two ids (' ' E2 88, then 9A): "" then ' √'."""
    ids = tok.encode("x = √2", add_special_tokens=False)
    bv = _byte_vocab(tok)
    assert [bv.id_bytes[i] for i in ids][2:4] == [b" \xe2\x88", b"\x9a"]  # the split this test is about
    out, pending = [], b""
    for i, tid in enumerate(ids):
        b = pending + bv.id_bytes[tid]
        try:
            s = b.decode()
        except UnicodeDecodeError:
            out.append(TokenRecord(index=i, token="", bytes=b"", logprob=-0.5, top_logprobs=[]))
            pending = b
            continue
        alts = [(a, a.encode(), v) for a, v in ((s, -0.5), (" ∏", -2.0), (" ∑", -2.5))] if pending else []
        out.append(TokenRecord(index=i, token=s, bytes=b, logprob=-0.5, top_logprobs=alts))
        pending = b""
    return out


def test_empty_then_whole_character_aligns_to_the_claimed_ids(smollm2_tokenizer) -> None:
    toks = _vllm_sqrt(smollm2_tokenizer)
    al = align_to_reference(toks, smollm2_tokenizer)
    assert not al.failures and al.aligned_prefix == len(toks)
    assert al.ref_ids == smollm2_tokenizer.encode("x = √2", add_special_tokens=False)
    empty = next(i for i, t in enumerate(toks) if t.token == "")
    assert al.spans[empty] == (al.spans[empty][0], al.spans[empty][0])  # no id of its own
    assert al.ref_token_ids[empty] is None and al.ref_token_ids[empty + 1] is None  # 1:2, not compared
    conv = learn_convention([toks], 3)
    assert conv.partial_chars == "empty_then_whole"


def test_lost_bytes_stop_the_alignment(smollm2_tokenizer) -> None:
    toks = _vllm_sqrt(smollm2_tokenizer)
    empty = next(i for i, t in enumerate(toks) if t.token == "")
    toks[empty + 1] = TokenRecord(index=empty + 1, token="\ufffd2", bytes="\ufffd2".encode(), logprob=-9.0)
    al = align_to_reference(toks, smollm2_tokenizer)
    assert al.failures[0].reason == "unknown_bytes" and al.aligned_prefix == empty


def test_whole_characters_are_not_foreign(smollm2_tokenizer) -> None:
    bv = _byte_vocab(smollm2_tokenizer)
    for ch in ("√", "∏", "∑", "∛", " √", " ∏"):
        assert ch.encode() not in bv.by_bytes, ch  # a string outside the vocabulary, producible by its ids
        assert bv.whole_character_ids(ch.encode()) is not None, ch
    assert bv.whole_character_ids(b"plain ascii") is None
    assert bv.whole_character_ids("▁hello".encode()) is None  # gemma's word pieces stay foreign


def test_tokenizer_rule_never_calls_whole_characters_or_lost_bytes_foreign(smollm2_tokenizer) -> None:
    """Issue 40: '√', '∏', '∑', '∛' (vLLM's whole characters) and U+FFFD strings (an orphan partial character
    of garbage ids) were "a proof" of SUBSTITUTION; another family's word pieces still are."""
    from types import SimpleNamespace

    from auditor.check.evidence import tokenizer_mismatch

    def obs(strings: list[str]) -> SimpleNamespace:
        toks = [TokenRecord(index=i, token=s, bytes=s.encode(), logprob=-1.0,
                            top_logprobs=[(a, a.encode(), -2.0) for a in ("∏", "∑", "∛")]) for i, s in enumerate(strings)]
        return SimpleNamespace(anomalies=[], tokens=toks, provider_prompt_tokens=None, prompt_ids=[])

    honest = obs(["√", " √", "\ufffd TType", "\ufffd Shop", " � Afghan"])
    assert tokenizer_mismatch([honest], smollm2_tokenizer, "chat") is None
    other = obs(["▁hello", "▁world", "▁again", "▁there"])  # SentencePiece pieces: no SmolLM2 id spells them
    tm = tokenizer_mismatch([honest, other], smollm2_tokenizer, "chat")
    assert tm is not None and "foreign_tokens" in tm["established"] and tm["n_foreign_distinct"] == 4
    assert tm["n_whole_or_lost"] > 0
