"""The provider simulator: the reference model served over the OpenAI API, honestly or degraded.

Modules:
- ``profiles``: declarative serving recipes (``get_profile``, ``list_profiles``, ``Profile``);
- ``quantize``: weight-only int8/int4/fp8 fake-quant (optimum-quanto, torch RTN fallback);
- ``verifiers``: lossy ``Verifier`` rules (relaxed threshold, typical acceptance, greedy-verify,
  decode-noncompliant) for ``reference.speculative.speculative_generate``;
- ``engine``: ``SimulatorEngine`` (served model + drafter + verifier; per-round token delivery);
- ``server``: ``create_app`` (FastAPI), ``ServerThread``/``serve_in_thread`` (uvicorn in a thread);
- ``faults``: ``FaultInjector`` (seeded 429/500/slow/truncated/malformed);
- ``schemas``: request validation.

Names are imported lazily so that ``from simulator import get_profile`` stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Profile": "profiles",
    "get_profile": "profiles",
    "list_profiles": "profiles",
    "PROFILES": "profiles",
    "SimulatorEngine": "engine",
    "build_served_model": "engine",
    "create_app": "server",
    "serve_in_thread": "server",
    "ServerThread": "server",
    "FaultInjector": "faults",
    "make_verifier": "verifiers",
}

__all__ = [
    "PROFILES",
    "FaultInjector",
    "Profile",
    "ServerThread",
    "SimulatorEngine",
    "build_served_model",
    "create_app",
    "get_profile",
    "list_profiles",
    "make_verifier",
    "serve_in_thread",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"simulator.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
