"""Fixtures for the calibration tests: tiny float32/bfloat16 references and a miniature pool config."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_refs(tiny_lm):
    """{"float32": tiny_lm, "bfloat16": the same weights in bfloat16} (LoadedModels)."""
    from reference.models import LoadedModel

    bf = LoadedModel(
        model=copy.deepcopy(tiny_lm.model).to(torch.bfloat16),
        tokenizer=tiny_lm.tokenizer,
        name=tiny_lm.name,
        path=tiny_lm.path,
        revision=tiny_lm.revision,
        dtype=torch.bfloat16,
        device=tiny_lm.device,
    )
    return {"float32": tiny_lm, "bfloat16": bf}


@pytest.fixture(scope="session")
def mini_cfg():
    """A miniature pool: 4 prompts, short continuations, few samples (seconds on CPU)."""
    from auditor.calibration import PoolConfig

    return PoolConfig(max_prompts=4, t0_max_tokens=12, sampling_samples=3, engine_sampling_samples=2, honest_sampling_samples=4,
                      sampling_max_tokens=8)


@pytest.fixture(scope="session")
def pool_cache(tmp_path_factory):
    """One pool cache for the whole session (pools are collected once and shared by the tests)."""
    return tmp_path_factory.mktemp("pool-cache")


@pytest.fixture(scope="session")
def get_pool(tiny_refs, mini_cfg, pool_cache):
    """``get_pool(profile) -> Pool``: the miniature pool of a profile, collected once per session."""
    from auditor.calibration import load_or_collect_pool

    def get(name: str):
        return load_or_collect_pool(name, tiny_refs, mini_cfg, cache_dir=pool_cache)[0]

    return get


@pytest.fixture(scope="session")
def honest_pool(get_pool):
    """honest-fp32 pool of the miniature config on the tiny model."""
    return get_pool("honest-fp32")
