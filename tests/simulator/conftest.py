"""Fixtures for the simulator tests.

- ``peaked_lm``: ``tiny_lm`` with its final RMSNorm scaled x4, so its next-token distributions are
  peaked (about 60% of sampled positions have p(argmax) in [0.5, 0.9]) like a real model's —
  needed to see relaxed acceptance and to bin first-token histograms.
- ``client``: factory ``client(app) -> fastapi.testclient.TestClient`` (closed at teardown).
"""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="session")
def peaked_lm(tiny_lm):
    """A tiny model with peaked distributions (see module doc), as a LoadedModel."""
    from reference.models import LoadedModel

    m = copy.deepcopy(tiny_lm.model)
    with torch.no_grad():
        m.model.norm.weight.mul_(4.0)
    return LoadedModel(model=m, tokenizer=tiny_lm.tokenizer, name="tiny-peaked", path="<tiny-peaked>",
                       revision="tiny-peaked", dtype=torch.float32, device=torch.device("cpu"))


@pytest.fixture
def client():
    """Factory of in-process TestClients for simulator apps."""
    from fastapi.testclient import TestClient

    made = []

    def make(app):
        c = TestClient(app)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
