"""Fixtures for the simulator tests.

- ``peaked_lm``: ``tiny_lm`` with its final RMSNorm scaled x4, so its next-token distributions are
  peaked (about 60% of sampled positions have p(argmax) in [0.5, 0.9]) like a real model's —
  needed to see relaxed acceptance and to bin first-token histograms.
- ``client``: factory ``client(app) -> fastapi.testclient.TestClient`` (closed at teardown).
"""

from __future__ import annotations

import pytest


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
