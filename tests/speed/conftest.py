"""Fixtures for the speed-profile and speculation-fingerprint tests on the simulator (loopback).

- ``bigram_lm``: ``tiny_lm``'s architecture with an output layer restricted to 4 tokens and the
  attention output zeroed, so greedy decoding is a deterministic chain over 4 tokens that the
  n-gram drafter predicts after a few tokens (about 3.5 tokens per verification step with k=4);
  a real model is far too slow for these tests on a shared CPU (see ``serve_bigram.py``).
- ``sim_urls`` (session): simulators over ``bigram_lm`` in ONE separate process (see
  ``serve_bigram.py``: a client inside the server's process distorts stream timing), keyed
  ``ngram-round``, ``ngram-token``, ``ngram-time`` (50 ms), ``none-round``, ``none-token``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SPECS = ["ngram-round=ngram:round", "ngram-token=ngram:token", "ngram-time=ngram:time:50",
         "none-round=none:round", "none-token=none:token"]


@pytest.fixture(scope="session")
def bigram_lm(smollm2_tokenizer):
    """The 4-token chain model (see module doc) as a LoadedModel."""
    sys.path.insert(0, str(HERE))
    from serve_bigram import build_bigram_lm

    return build_bigram_lm(smollm2_tokenizer)


@pytest.fixture(scope="session")
def sim_urls(smollm2_tokenizer):
    """``{name: base_url}`` of the simulators served by a child process (stopped at teardown)."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(HERE / "serve_bigram.py"), "--forward-ms", "5", *SPECS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"serve_bigram.py exited with {proc.wait(timeout=10)} before serving")
        yield json.loads(line)
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
