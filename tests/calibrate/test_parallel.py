"""``--workers``: the floor, the pools and the audits in worker processes give what one process gives."""

from __future__ import annotations

import pytest

from tests.calibrate._tiny_refs import load_tiny_refs

FLOOR_KW = {"n_prompts": 4, "max_new_tokens": 8}


def test_prebuild_queue_puts_the_floor_and_honest_pools_first(tiny_refs, mini_cfg, tmp_path):
    from auditor.calibration.parallel import FLOOR_TASK, prebuild_tasks

    q = prebuild_tasks(["int4", "mix-int4:0.1", "honest-bf16"], tiny_refs, mini_cfg, cache_dir=tmp_path)
    assert q == [FLOOR_TASK, "honest-fp32", "honest-bf16", "int4"]  # the mixture brings its components


@pytest.mark.slow
def test_workers_reproduce_the_one_process_cells(tiny_refs, mini_cfg, tmp_path):
    from auditor.calibration import default_mix
    from auditor.calibration.cells import CellSpec, get_noise_floor, profile_cells
    from auditor.calibration.collect import load_or_collect_pool, pool_path
    from auditor.calibration.parallel import audit_in_workers, prebuild_in_workers

    profiles = ["honest-fp32", "int4", "mix-int4:0.1"]
    spec = CellSpec((default_mix(),), (60, 150), 0.05, 0, True, None, 1)
    n = dict.fromkeys(profiles, 3)
    secs = prebuild_in_workers(profiles, tiny_refs, mini_cfg, load_refs=load_tiny_refs, workers=2, threads=1,
                               cache_dir=tmp_path, floor_kwargs=FLOOR_KW)
    assert set(secs) == {"(noise floor)", "honest-fp32", "int4"}
    assert all(pool_path(p, tiny_refs, mini_cfg, tmp_path).is_file() for p in ("honest-fp32", "int4"))
    par = audit_in_workers(profiles, mini_cfg, n, spec, load_refs=load_tiny_refs, workers=2, threads=1,
                           cache_dir=tmp_path, floor_kwargs=FLOOR_KW)
    floors = get_noise_floor(tiny_refs, cache_dir=tmp_path, **FLOOR_KW)
    assert floors.meta.get("cached")  # the worker's floor, reused
    for p in profiles:
        pool, cached = load_or_collect_pool(p, tiny_refs, mini_cfg, cache_dir=tmp_path)
        assert cached
        one = profile_cells(pool, floors, spec, n_audits=n[p])
        assert [r.to_dict()["verdicts"] for r in par[p].records] == [r.to_dict()["verdicts"] for r in one.records]
        assert [r.rejection_rate for r in par[p].records] == [r.rejection_rate for r in one.records]
        assert par[p].pool_meta["t1_tokens"] == one.pool_meta["t1_tokens"] > 0
