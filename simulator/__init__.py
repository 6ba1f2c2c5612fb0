"""The provider simulator: the reference model served over the OpenAI API, honestly or degraded.

Modules:
- ``profiles``: declarative serving recipes (``get_profile``, ``list_profiles``, ``Profile``);
- ``quantize``: weight-only int8/int4/fp8 fake-quant (optimum-quanto, torch RTN fallback);
- ``verifiers``: lossy ``Verifier`` rules (relaxed threshold, typical acceptance, greedy-verify,
  decode-noncompliant) for ``reference.speculative.speculative_generate``;
- ``served_model``: ``build_served_model`` (a profile's served model behind the logit tap; mixtures);
- ``engine``: ``SimulatorEngine`` (served model + drafter + verifier; per-round token delivery);
- ``reasoning``: reasoning mode (``generate_reasoning``: budgeted reasoning span, close tag, answer);
- ``server``: ``create_app`` (FastAPI), ``ServerThread``/``serve_in_thread`` (uvicorn in a thread);
- ``serving_options``: ``create_app``'s option values and checks (``parse_enforce``, ``check_enforce``);
- ``request_handling``: ``SimulatorApp`` (per-request checks, generation jobs, faults, JSON/SSE delivery);
- ``endpoints``: chat and legacy completions (jobs, bodies, stream chunks);
- ``openai_format``: the OpenAI wire pieces (logprob conventions, usage, errors);
- ``faults``: ``FaultInjector`` (seeded 429/500/slow/truncated/malformed);
- ``schemas``: request validation (``parse_request``).

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
    "build_served_model": "served_model",
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
