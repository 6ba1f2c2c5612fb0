"""mix-PROFILE:F pools route whole requests between two component pools (the mixture's exact law)."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.calibration.collect import backend_for, mix_pools
from auditor.calibration.pool import Pool
from simulator.profiles import get_profile


def _pool(name: str, n_items: int, mark: int, refs=("float32", "bfloat16")) -> Pool:
    rng = np.random.default_rng(mark)
    lengths = rng.integers(1, 6, n_items)
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(off[-1])
    return Pool(
        profile=name, model="m", revision="r", meta={"pool_format": 1},
        item_keys=np.array([f"p{i // 2}@t1.0#{i % 2}" for i in range(n_items)]),
        item_prompt=np.array([f"p{i // 2}" for i in range(n_items)]),
        item_workload=np.array(["chat"] * n_items), item_temperature=np.ones(n_items), item_offsets=off,
        token_ids=np.full(n, mark, np.int64), prov_logprob=np.full(n, -float(mark)),
        prov_top_ids=np.full((n, 20), mark, np.int64), prov_top_lp=np.full((n, 20), -float(mark)),
        ref_top_ids={r: np.full((n, 20), mark, np.int64) for r in refs},
        ref_top_lp={r: np.zeros((n, 20)) for r in refs}, ref_token_lp={r: np.zeros(n) for r in refs},
        item_prompt_tokens=np.full(n_items, 10 + mark, np.int64),
    )


def test_requests_are_routed_whole_at_the_mixing_fraction():
    base, other = _pool("honest-fp32", 4000, 1), _pool("int4", 4000, 2)
    mixed = mix_pools("mix-int4:0.1", base, other, 0.1, seed=3)
    assert mixed.item_keys.tolist() == base.item_keys.tolist()
    routed = np.array([mixed.token_ids[mixed.item_offsets[i]] == 2 for i in range(len(mixed.item_keys))])
    assert abs(routed.mean() - 0.1) < 0.02 and mixed.meta["mix"]["routed_to_other"] == int(routed.sum())
    for i in range(50):  # every position of an item comes from the same component, with its own length
        a, b = mixed.item_offsets[i], mixed.item_offsets[i + 1]
        src = other if routed[i] else base
        assert np.array_equal(mixed.token_ids[a:b], src.token_ids[src.item_offsets[i]:src.item_offsets[i + 1]])
        assert mixed.item_prompt_tokens[i] == (12 if routed[i] else 11)
    assert set(mixed.ref_top_ids) == {"float32", "bfloat16"}
    again = mix_pools("mix-int4:0.1", base, other, 0.1, seed=3)
    assert np.array_equal(again.token_ids, mixed.token_ids)  # deterministic routing
    assert np.array_equal(mix_pools("x", base, other, 0.0).token_ids, base.token_ids)


def test_only_shared_keys_are_mixed_and_mismatched_pools_are_refused():
    base, other = _pool("honest-fp32", 40, 1), _pool("int4", 10, 2)
    assert len(mix_pools("m", base, other, 0.5).item_keys) == 10
    with pytest.raises(ValueError, match="references"):
        mix_pools("m", base, _pool("int4", 10, 2, refs=("float32",)), 0.5)


def test_mixture_profiles_are_served_by_the_mixed_backend():
    assert backend_for(get_profile("mix-int4:0.1"), 0.0) == "mixed" == backend_for(get_profile("mix-int4:0.1"), 1.0)
