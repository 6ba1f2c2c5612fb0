"""Seeded sampling gives the same tokens with and without a CPU-burning process beside it.

Issue 11 (acceptance) and issue 15 item 3: the draft-length policy decides from acceptance counts,
never from clocks, so the reference loop (``auditor reference generate``) and the simulator
(``auditor serve``) reproduce a seed on a busy machine. A timing-dependent choice of k changes
which random draws verification consumes, hence the sampled tokens: these tests would catch one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from reference.drafters import NgramDrafter
from reference.speculative import GenerationResult, speculative_generate

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n"


@contextmanager
def cpu_burn(n_procs: int | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``n_procs`` (default: one per CPU) busy-looping Python processes; stop exactly those after."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(n_procs or os.cpu_count() or 2)
    ]
    try:
        time.sleep(0.3)  # let them get scheduled
        assert all(p.poll() is None for p in procs), "burner process died"
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


def _quiet_and_loaded(fn: Callable[[], GenerationResult]) -> tuple[GenerationResult, GenerationResult]:
    quiet = fn()
    with cpu_burn():
        loaded = fn()
    return quiet, loaded


def test_reference_loop_seeded_sampling_is_load_independent(tiny_lm):
    ids = tiny_lm.tokenizer(PROMPT)["input_ids"]

    def run() -> GenerationResult:
        return speculative_generate(
            tiny_lm, ids, drafter=NgramDrafter(1, 3), k=6, max_new_tokens=48, temperature=1.0, top_p=0.95,
            seed=1234, eos_token_ids=[],
        )

    quiet, loaded = _quiet_and_loaded(run)
    assert quiet.token_ids == loaded.token_ids
    assert quiet.k_history == loaded.k_history and quiet.rounds == loaded.rounds
    assert quiet.n_drafted > 0  # speculation really ran (the policy drafted at least once)


def test_simulator_seeded_sampling_is_load_independent(tiny_lm):
    """The ``auditor serve`` path: SimulatorEngine.generate with a request seed, n-gram drafter."""
    from simulator.engine import SimulatorEngine
    from simulator.profiles import get_profile

    eng = SimulatorEngine(get_profile("honest-fp32"), tiny_lm, drafter="ngram:1:3", k=6, seed=0)
    ids = eng.encode_text(PROMPT)

    def run() -> list[int]:
        res = eng.generate(ids, max_tokens=40, temperature=1.0, top_p=0.9, seed=99)
        return [t.token_id for t in res.tokens]

    quiet = run()
    with cpu_burn():
        loaded = run()
    assert quiet == loaded and len(quiet) > 0


@pytest.mark.real_model
def test_real_model_seeded_sampling_is_load_independent(real_lm):
    from reference.scoring import encode_prompt

    ids = encode_prompt(real_lm.tokenizer, "Repeat exactly: the quick brown fox jumps over the lazy dog. " * 2, chat=True)

    def run() -> GenerationResult:
        return speculative_generate(
            real_lm, ids, drafter=NgramDrafter(), k=6, max_new_tokens=24, temperature=1.0, seed=7,
        )

    quiet, loaded = _quiet_and_loaded(run)
    assert quiet.token_ids == loaded.token_ids and quiet.k_history == loaded.k_history
