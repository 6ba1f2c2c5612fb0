"""Suffix drafter (prompt lookup + a cache of earlier outputs): lookup rules, capacity, losslessness."""

from __future__ import annotations

import pytest

from reference.drafter_specs import make_drafter
from reference.speculative import autoregressive_generate, speculative_generate
from reference.suffix import OutputCache, SuffixDrafter


def test_cache_votes_for_the_most_frequent_continuation_then_the_most_recent():
    c = OutputCache(min_n=2, max_n=8, max_tokens=64)
    c.add([1, 2, 3, 4, 5])
    c.add([9, 2, 3, 7, 8])
    c.add([2, 3, 7, 6])
    # (2, 3) is followed by 4 once and by 7 twice -> 7; after (2, 3, 7): 8 and 6 tie -> the latest, 6
    assert c.match([0, 2, 3], 4) == (2, [7, 6])
    # the longest suffix wins: (9, 2, 3) occurs once -> its own continuation, to the end of that output
    assert c.match([9, 2, 3], 4) == (3, [7, 8])
    assert c.match([5], 4) == (0, [])  # shorter than min_n
    assert c.match([42, 43], 3) == (0, [])  # never seen
    assert c.match([4, 5], 3) == (0, [])  # an output's end has no continuation (separator)
    assert c.match([0, 2, 3], 0) == (0, [])


def test_cache_capacity_keeps_the_newest_outputs():
    c = OutputCache(min_n=2, max_n=4, max_tokens=40)
    c.add([1, 2, 3])
    for i in range(30):
        c.add([100 + i, 101 + i, 102 + i])
        assert len(c) <= 40
    assert c.n_outputs == 31
    assert c.match([128, 129], 2) == (2, [130])  # recent output kept
    assert c.match([1, 2], 2) == (0, [])  # the oldest was dropped
    c.add(list(range(200, 300)))  # longer than half the capacity: its tail is kept
    assert len(c) <= 40 and c.match([297, 298], 1) == (2, [299])
    c.clear()
    assert len(c) == 1 and c.match([297, 298], 1) == (0, [])


def test_cache_copy_is_independent_and_validation():
    c = OutputCache(max_tokens=64)
    c.add([1, 2, 3])
    d = c.copy()
    d.add([1, 2, 9, 9, 9])
    d.add([1, 2, 9])
    assert c.match([1, 2], 1) == (2, [3]) and d.match([1, 2], 1) == (2, [9])
    with pytest.raises(ValueError, match="token ids"):
        c.add([1, -5])
    for kw in ({"min_n": 0}, {"min_n": 3, "max_n": 2}, {"max_tokens": 4}, {"max_votes": 0}):
        with pytest.raises(ValueError, match="OutputCache needs"):
            OutputCache(**kw)


def test_suffix_drafter_takes_the_longer_match_and_learns_outputs():
    d = SuffixDrafter(min_n=2, max_n=8)
    ctx = [50, 1, 2, 60, 7, 1, 2]  # prompt lookup: (1, 2) -> 60
    assert d.propose(ctx, 2).ids.tolist() == [60, 7]
    d.observe_output([0], [7, 1, 2, 33, 34])  # the cache matches (7, 1, 2): longer than the context's (1, 2)
    assert d.propose(ctx, 2).ids.tolist() == [33, 34] and d.n_from_cache == 1
    d.observe_output([0], [5, 1, 2, 44])  # cache match (1, 2) only: a tie -> the current request wins
    assert d.propose([9, 1, 2, 61, 8, 1, 2], 1).ids.tolist() == [61]
    assert d.propose([9, 1, 2, 61, 5, 1, 2], 1).ids.tolist() == [44]  # (5, 1, 2) is in the cache: longer
    assert d.propose([70, 71], 3).ids.tolist() == []


def test_suffix_speculation_is_lossless_and_gets_faster_on_a_seen_answer(tiny_lm):
    prompt = [12, 345, 678, 9, 1011, 12, 345]
    plain = autoregressive_generate(tiny_lm, prompt, max_new_tokens=40, eos_token_ids=[])
    d = SuffixDrafter()
    first = speculative_generate(tiny_lm, prompt, drafter=d, k=8, max_new_tokens=40, eos_token_ids=[])
    assert first.token_ids == plain.token_ids
    assert d.cache.n_outputs == 1  # the loop handed the finished output to the drafter
    again = speculative_generate(tiny_lm, prompt, drafter=d, k=8, max_new_tokens=40, eos_token_ids=[])
    assert again.token_ids == plain.token_ids
    # the cache holds this very answer: far fewer target forwards than the first time
    assert len(again.rounds) < len(first.rounds) and again.mean_accepted_length > 2.0
    other = [77, 88, 99, 111, 222]
    assert (
        speculative_generate(tiny_lm, other, drafter=d, k=8, max_new_tokens=30, eos_token_ids=[]).token_ids
        == autoregressive_generate(tiny_lm, other, max_new_tokens=30, eos_token_ids=[]).token_ids
    )
    sampled = speculative_generate(tiny_lm, prompt, drafter=d, k=8, max_new_tokens=20, eos_token_ids=[],
                                   temperature=1.0, seed=3)
    assert len(sampled.token_ids) == 20 and all(0 <= t < 49152 for t in sampled.token_ids)


def test_make_drafter_suffix_specs():
    d = make_drafter("suffix")
    assert isinstance(d, SuffixDrafter) and (d.lookup.min_n, d.lookup.max_n) == (2, 8)
    d = make_drafter("suffix:3:6")
    assert isinstance(d, SuffixDrafter) and (d.cache.min_n, d.cache.max_n) == (3, 6)
    with pytest.raises(ValueError, match="suffix"):
        make_drafter("suffix:a")


def test_a_match_that_ends_an_output_does_not_hide_a_shorter_one_with_a_continuation():
    c = OutputCache(2, 8, 64)
    c.add([9, 2, 3])  # (9, 2, 3) ends this output: nothing to propose after it
    c.add([2, 3, 7])
    assert c.match([9, 2, 3], 2) == (2, [7])
    c = OutputCache(2, 8, 64, max_votes=1)
    c.add([5, 2, 3, 7])
    c.add([9, 2, 3])  # the most recent occurrence ends an output
    assert c.match([9, 2, 3], 2) == (2, [7])


def test_ids_the_int32_buffer_cannot_hold():
    c = OutputCache(1, 4, 64)
    c.add([5, 6, 7])
    c.add([8, 9])
    with pytest.raises(ValueError, match="token ids"):
        c.add([1, 2**32 - 1, 3])
    assert c.match([-1], 3) == (0, [])  # a negative context id never matches a separator
    assert OutputCache(2, 4, 64).match([7, -1], 3) == (0, [])
    assert c.match([2**31, 5], 2) == (1, [6, 7])  # a huge id neither crashes nor matches
