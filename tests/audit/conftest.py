"""Fixtures for the audit pipeline tests: simulators served in-process on loopback (uvicorn in a
thread), providers files pointing at them, reference models in both honest precisions, and an
isolated database + noise-floor cache per test session."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def audit_home(tmp_path_factory) -> Path:
    """Session directory for the audit tests' noise-floor cache and databases."""
    return tmp_path_factory.mktemp("audit-home")


def bf16_copy(lm):
    """The same LoadedModel in bfloat16 (a deep copy)."""
    from reference.models import LoadedModel

    m = copy.deepcopy(lm.model).to(torch.bfloat16)
    m.eval()
    return LoadedModel(model=m, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision,
                       dtype=torch.bfloat16, device=lm.device)


@pytest.fixture(scope="session")
def tiny_refs(tiny_lm) -> dict:
    """The tiny model as the reference, in float32 and bfloat16."""
    return {"float32": tiny_lm, "bfloat16": bf16_copy(tiny_lm)}


@pytest.fixture(scope="session")
def real_refs(real_lm) -> dict:
    """The default SmolLM2 model as the reference, in float32 and bfloat16."""
    return {"float32": real_lm, "bfloat16": bf16_copy(real_lm)}


def providers_toml(entries: dict[str, str], model: str, reference: str = "smollm2-135m-instruct",
                   max_top: int = 20, concurrency: int = 2) -> str:
    """A providers file: ``{name: base_url}`` all serving ``model``."""
    out = []
    for name, url in entries.items():
        out.append(
            f'[providers.{name}]\nbase_url = "{url}"\nmodel = "{model}"\napi = "chat"\nreference = "{reference}"\n'
            f"timeout_s = 300\n\n[providers.{name}.capabilities]\nmax_top_logprobs = {max_top}\nlogprobs = true\n"
            f"n = true\nseed = true\nstreaming = true\n\n[providers.{name}.rate_limits]\nconcurrency = {concurrency}\n\n"
            f"[providers.{name}.pricing]\nusd_per_1m_input = 0.5\nusd_per_1m_output = 1.5\n\n"
        )
    return "".join(out)


class SimFactory:
    """Starts in-process simulators (one per profile) sharing a reference LoadedModel; stops them all."""

    def __init__(self, lm, served_name: str):
        self.lm = lm
        self.served_name = served_name
        self.servers: dict[str, object] = {}

    def url(self, profile: str, seed: int = 0, **overrides) -> str:
        """The base URL of a simulator serving ``profile`` with simulator seed ``seed`` (started once per both)."""
        from simulator.server import ServerThread, create_app

        key = profile + repr(sorted(overrides.items())) + ("" if seed == 0 else f"@seed{seed}")
        if key not in self.servers:
            app = create_app(profile, lm=self.lm, served_model_name=self.served_name, seed=seed, **overrides)
            self.servers[key] = ServerThread(app, timeout=120).start()
        return self.servers[key].base_url

    def stop(self, profile: str | None = None) -> None:
        for key in list(self.servers):
            if profile is None or key.startswith(profile + "["):
                self.servers.pop(key).stop()


@pytest.fixture(scope="module")
def tiny_sims(tiny_lm) -> Iterator[SimFactory]:
    f = SimFactory(tiny_lm, "tiny")
    yield f
    f.stop()


@pytest.fixture
def small_floors(monkeypatch, audit_home) -> Path:
    """Make noise floors small (4 prompts x 8 tokens) and cached under the session directory."""
    from auditor.check import measured_floors as noise

    monkeypatch.setattr(noise, "FLOOR_PROMPTS", 4)
    monkeypatch.setattr(noise, "FLOOR_MAX_NEW_TOKENS", 8)
    d = audit_home / "noise-small"
    monkeypatch.setattr(noise, "noise_cache_dir", lambda: d)
    return d
