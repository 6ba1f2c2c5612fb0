"""The reference-scoring stage behind its seam: any ``Scorer`` (revision, dtype, score) plugs in;
results are cached in ``reference_cache`` per revision + dtype + ids + top-k and come back in order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from auditor.check.evidence import Observation
from auditor.check.reference_scoring import LocalScorer, score_observations
from auditor.store import open_store
from reference.scoring import ScoredContinuation


@dataclass
class CountingScorer:
    """A Scorer whose logprob at position t of a continuation is -(first prompt id + t) / 10."""

    revision: str = "rev-a"
    dtype: str = "float32"
    calls: list[int] = field(default_factory=list)

    def score(self, prompts, continuations, *, top_k):
        self.calls.append(len(prompts))
        out = []
        for p, c in zip(prompts, continuations, strict=True):
            t = np.arange(len(c))
            lp = -(p[0] + t) / 10.0
            ids = np.tile(np.arange(top_k, dtype=np.int64), (len(c), 1))
            out.append(ScoredContinuation(list(c), lp, ids, np.tile(lp[:, None], (1, top_k)), None, np.full(len(c), 0.5)))
        return out


def _obs(i: int, n: int) -> Observation:
    return Observation(probe_id=i, probe_key=f"p{i}#0", mode="greedy", workload="chat", temperature=0.0, top_p=1.0,
                       request={}, prompt_ids=[i + 1, 7], tokens=[], ref_ids=list(range(5, 5 + n)),
                       spans=[], one_to_one=[])


def test_scoring_goes_through_the_cache_in_order(tmp_path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    obs = [_obs(i, n) for i, n in enumerate([3, 0, 5, 1])]
    sc = CountingScorer()
    first = score_observations(store, sc, obs, top_k=4, batch_size=2)
    assert sc.calls == [2, 1]  # the empty continuation is not sent; batches of 2, shortest first
    assert [len(r.token_ids) for r in first] == [3, 0, 5, 1]
    assert first[2].logprobs.tolist() == [-0.3, -0.4, -0.5, -0.6, -0.7]
    again = score_observations(store, sc, obs, top_k=4, batch_size=2)
    assert sc.calls == [2, 1]  # all from the cache
    for a, b in zip(first, again, strict=True):
        assert a.token_ids == b.token_ids and np.array_equal(a.top_ids, b.top_ids)
        assert np.array_equal(a.logprobs, b.logprobs) and np.array_equal(a.tail_mass, b.tail_mass)
    # another precision or revision is another cache entry
    score_observations(store, CountingScorer(dtype="bfloat16", calls=sc.calls), obs, top_k=4, batch_size=8)
    assert sc.calls == [2, 1, 3]
    store.close()


def test_local_scorer_matches_direct_scoring(tiny_lm) -> None:
    from reference.scoring import score_continuations

    s = LocalScorer(tiny_lm, "float32", batch_size=2)
    assert s.revision == tiny_lm.revision
    prompts, conts = [[1, 2, 3], [4, 5]], [[6, 7], [8]]
    a = s.score(prompts, conts, top_k=3)
    b = score_continuations(tiny_lm, prompts, conts, top_k=3, batch_size=2)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.top_ids, y.top_ids) and np.allclose(x.logprobs, y.logprobs)
