"""Shared fixtures.

- ``tiny_lm``: a tiny randomly initialised Llama (2 layers, hidden 64, vocab 49152) wrapped as a
  ``LoadedModel`` with the real SmolLM2 tokenizer, so other areas can run real text through a
  model in milliseconds. Deterministic (seeded init); logits are scaled up (``initializer_range``)
  so that greedy decoding is not dominated by near-ties.
- ``tiny_draft_lm``: a second tiny model (different seed, same tokenizer) usable as a draft model.
- ``real_lm``: session fixture that pulls (converts once) and loads the default SmolLM2-135M-Instruct.
  Tests using it must be marked ``@pytest.mark.real_model``.
- ``make_tiny_model(vocab_size, seed, ...)``: helper to build tiny causal LMs from a config.
- ``noise_dir`` (session, autouse): hermetic noise floors. ``$SPEC_AUDITOR_NOISE_DIR`` points at a
  directory of this test session (inherited by subprocesses), so no test reads or writes the
  user's floor cache (``~/.cache/spec-auditor/noise`` or ``$SPEC_AUDITOR_HOME/noise``); a floor
  is measured at most once per session (``auditor.check.measured_floors`` is deterministic, so every session on
  the same machine measures the same numbers). Models stay shared. For local development only,
  ``$SPEC_AUDITOR_TEST_NOISE_DIR`` names a persistent directory to use instead (so repeated targeted
  runs measure the floor once); CI and ``make test`` never set it. A measurement into it prints one
  line when it starts and one when it ends, visible through pytest's output capture.
- ``quant_dir`` (session, autouse): the same for the quantized-weight cache (``$SPEC_AUDITOR_QUANT_DIR``;
  ``$SPEC_AUDITOR_TEST_QUANT_DIR`` for a persistent local one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

#: Environment variable that turns the ``calibration_loop`` tests on (see :func:`pytest_collection_modifyitems`).
ENV_CALIBRATION_LOOPS = "SPEC_AUDITOR_CALIBRATION_LOOPS"


def pytest_collection_modifyitems(config, items):
    """Skip the ``calibration_loop`` tests (tens to hundreds of whole audits: too long for the README's
    ``make test`` within CI's 90 minutes) unless ``SPEC_AUDITOR_CALIBRATION_LOOPS=1``; the skip says how
    to run them. The ``slow`` marker is not skipped: it marks long tests that still fit ``make test``."""
    if os.environ.get(ENV_CALIBRATION_LOOPS) == "1":
        return
    skip = pytest.mark.skip(reason=f"a calibration loop of many audits; run with {ENV_CALIBRATION_LOOPS}=1")
    for item in items:
        if "calibration_loop" in item.keywords:
            item.add_marker(skip)


def _session_dir(tmp_path_factory, env: str, local_env: str, name: str) -> Iterator[Path]:
    """Point ``$env`` at a folder of this test session (``$local_env`` names a persistent one instead,
    for repeated local runs; CI and ``make test`` never set it) and restore ``$env`` afterwards."""
    shared = os.environ.get(local_env)
    if shared:
        d = Path(shared)
        d.mkdir(parents=True, exist_ok=True)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        # ``make test`` runs pytest-xdist workers: one folder for the whole run (the workers' temporary folders
        # share this parent), so a floor or quantized model one worker made is the others' too (tests/floor_notice.py
        # has the second wait for the first instead of measuring the same floor beside it)
        d = tmp_path_factory.getbasetemp().parent / name
        d.mkdir(parents=True, exist_ok=True)
    else:
        d = tmp_path_factory.mktemp(name)
    old = os.environ.get(env)
    os.environ[env] = str(d)
    yield d
    if old is None:
        os.environ.pop(env, None)
    else:
        os.environ[env] = old


@pytest.fixture(scope="session", autouse=True)
def noise_dir(tmp_path_factory, pytestconfig) -> Iterator[Path]:
    """This session's noise-floor cache directory (``$SPEC_AUDITOR_NOISE_DIR``, see module docstring).

    A floor measured into it (the first audit of a model this session, ~7 min for SmolLM2-135M) says
    so on the terminal when it starts and ends, through output capture (``tests/floor_notice.py``)."""
    from auditor.check import measured_floors
    from tests.floor_notice import announcing

    with pytest.MonkeyPatch.context() as mp:
        for d in _session_dir(tmp_path_factory, measured_floors.ENV_NOISE_DIR, "SPEC_AUDITOR_TEST_NOISE_DIR",
                              "noise-floors"):
            mp.setattr(measured_floors, "compute_floors", announcing(measured_floors.compute_floors, pytestconfig, d))
            yield d


@pytest.fixture(scope="session", autouse=True)
def quant_dir(tmp_path_factory) -> Iterator[Path]:
    """This session's quantized-weight cache (``$SPEC_AUDITOR_QUANT_DIR``): an engine that loads a model
    itself caches its quantized weights there, never in the user's ``models/quantized`` (tests load tiny
    models from temporary folders, whose cache files would pile up there). ``$SPEC_AUDITOR_TEST_QUANT_DIR``
    names a persistent folder instead, for repeated local runs."""
    from simulator.quantize import ENV_QUANT_DIR

    yield from _session_dir(tmp_path_factory, ENV_QUANT_DIR, "SPEC_AUDITOR_TEST_QUANT_DIR", "quantized-weights")


def make_tiny_model(
    vocab_size: int = 49152,
    seed: int = 0,
    hidden_size: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    initializer_range: float = 0.3,
    dtype: torch.dtype = torch.float32,
    eos_token_id: int | None = 2,
):
    """A tiny random ``LlamaForCausalLM`` built from a config (no download), in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
        bos_token_id=1 if vocab_size > 2 else None,
        eos_token_id=eos_token_id,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(dtype)
    model.eval()
    model.generation_config.eos_token_id = eos_token_id
    return model


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (from the converted default model dir)."""
    from transformers import AutoTokenizer

    from reference.models import pull_default_model

    return AutoTokenizer.from_pretrained(str(pull_default_model()))


def _wrap(model, tokenizer, name):
    from reference.models import LoadedModel

    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        path=f"<{name}>",
        revision=name,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


@pytest.fixture(scope="session")
def tiny_lm(smollm2_tokenizer):
    """Tiny random Llama (2 layers, hidden 64, vocab 49152) + real SmolLM2 tokenizer, as a LoadedModel."""
    return _wrap(make_tiny_model(seed=0), smollm2_tokenizer, "tiny-llama-seed0")


@pytest.fixture(scope="session")
def tiny_draft_lm(smollm2_tokenizer):
    """A second tiny random Llama (1 layer, different seed) sharing the tokenizer: a draft model."""
    return _wrap(make_tiny_model(seed=1, n_layers=1), smollm2_tokenizer, "tiny-llama-seed1")


@pytest.fixture(scope="session")
def real_lm():
    """The default SmolLM2-135M-Instruct (float32, CPU), pulled and converted once per machine."""
    from reference.models import load_model

    return load_model()


@pytest.fixture(scope="session")
def peaked_lm(tiny_lm):
    """The tiny model with peaked distributions (final norm × 4, like a real model's), as a LoadedModel."""
    import copy

    from reference.models import LoadedModel

    m = copy.deepcopy(tiny_lm.model)
    with torch.no_grad():
        m.model.norm.weight.mul_(4.0)
    return LoadedModel(model=m, tokenizer=tiny_lm.tokenizer, name="tiny-peaked", path="<tiny-peaked>",
                       revision="tiny-peaked", dtype=torch.float32, device=torch.device("cpu"))
