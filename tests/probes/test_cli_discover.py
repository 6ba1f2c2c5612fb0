"""Capability discovery against a fake provider, and the providers/suites/debug CLI."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from auditor.cli import app
from probes.config import ProviderConfig
from probes.discover import discover_capabilities

CASES = Path(os.environ.get("SPEC_AUDITOR_SHARED_CASES") or Path(__file__).parents[2].parent / "shared" / "cases") / "normalizer"
runner = CliRunner()


def fake_provider(max_top: int, supports_n: bool, honours_seed: bool, streams: bool):
    """An OpenAI-compatible chat endpoint with the given limits."""
    calls: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        k = body.get("top_logprobs", 0) if body.get("logprobs") else 0
        if k > max_top:
            return httpx.Response(400, json={"error": {"message": f"top_logprobs must be <= {max_top}"}})
        seed = body.get("seed") if honours_seed else None
        rng = random.Random(seed) if seed is not None else random.Random()
        n = body.get("n", 1) if supports_n else 1

        def choice(i: int) -> dict:
            words = [rng.choice(["a", "b", "c", "d", "e", "f"]) for _ in range(body.get("max_tokens", 4))]
            ch = {"index": i, "message": {"role": "assistant", "content": "".join(words)}, "finish_reason": "length"}
            if body.get("logprobs"):
                ch["logprobs"] = {"content": [
                    {"token": w, "logprob": -0.5, "bytes": list(w.encode()),
                     "top_logprobs": [{"token": w, "logprob": -0.5, "bytes": list(w.encode())}] + [
                         {"token": f"x{j}", "logprob": -5.0 - j, "bytes": list(f"x{j}".encode())} for j in range(k - 1)]}
                    for w in words]}
            return ch

        choices = [choice(i) for i in range(n)]
        if body.get("stream"):
            if not streams:
                return httpx.Response(400, json={"error": {"message": "stream unsupported"}})
            text = "".join(
                "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": c}}]}) + "\n\n" for c in choices[0]["message"]["content"]
            ) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"choices": choices, "usage": {"prompt_tokens": 5, "completion_tokens": 4}})

    return handler, calls


@pytest.mark.parametrize(
    ("max_top", "n", "seed", "stream"),
    [(20, True, True, True), (5, False, False, True), (0, True, True, False)],
)
def test_discover_capabilities(max_top: int, n: bool, seed: bool, stream: bool) -> None:
    handler, calls = fake_provider(max_top, n, seed, stream)
    cfg = ProviderConfig(name="fake", base_url="http://fake.test/v1", model="m")
    rep = asyncio.run(asyncio.wait_for(discover_capabilities(cfg, transport=httpx.MockTransport(handler)), 30))
    caps = rep.capabilities
    assert caps.max_top_logprobs == max_top
    assert caps.logprobs is True
    assert caps.n is n and caps.seed is seed and caps.streaming is stream and caps.echo is False
    assert rep.requests == len(calls) <= 12
    names = {"logprobs", "max_top_logprobs", "n", "seed", "echo", "streaming", "concurrency", "temperature_0"}
    assert {c.name for c in rep.checks} == names | ({"logprob_convention"} if max_top else set())
    assert (rep.convention is not None) == (max_top > 0)
    assert caps.concurrent_streams_ok is True and rep.safe_concurrency is None  # the fake takes overlap
    # the fake draws random words whatever the temperature: with alternatives its tokens are its own top-1
    # (the logprobs say greedy: not overridden); without them the differing texts are all there is to read
    assert rep.enforced is not None and rep.enforced.rejected == []
    assert rep.enforced.overridden == ([] if max_top else ["temperature"]) + ([] if seed else ["seed"])


# -- CLI ------------------------------------------------------------------------------------

def test_cli_suites() -> None:
    r = runner.invoke(app, ["suites", "list", "--json"])
    assert r.exit_code == 0
    rows = json.loads(r.output)
    assert rows[0]["name"] == "default" and rows[0]["requests"] > 0
    r = runner.invoke(app, ["suites", "show", "default", "--mode", "greedy", "--workload", "code", "--json"])
    assert r.exit_code == 0
    suite = json.loads(r.output)
    assert suite["probes"] and {p["mode"] for p in suite["probes"]} == {"greedy"}
    assert runner.invoke(app, ["suites", "show", "nope"]).exit_code == 3


def test_cli_providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text('[providers.sim]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\napi_key_env = "SIM_TEST_KEY"\n')
    monkeypatch.setenv("SIM_TEST_KEY", "sk-cli-secret-42")
    r = runner.invoke(app, ["providers", "list", "--config", str(cfg), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["providers"][0]["key_set"] is True
    assert "sk-cli-secret-42" not in r.output
    r = runner.invoke(app, ["providers", "show", "sim", "--config", str(cfg), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["api_key_env"] == "SIM_TEST_KEY" and "sk-cli-secret-42" not in r.output
    r = runner.invoke(app, ["providers", "show", "other", "--config", str(cfg)])
    assert r.exit_code == 3 and "no provider named 'other'" in r.output
    r = runner.invoke(app, ["providers", "list", "--config", str(tmp_path / "missing.toml")])
    assert r.exit_code == 3
    ex = runner.invoke(app, ["providers", "list", "--example"])
    example = tmp_path / "ex.toml"
    example.write_text(ex.output)
    assert runner.invoke(app, ["providers", "show", "local-sim", "--config", str(example)]).exit_code == 0


def test_cli_providers_probe_unreachable(tmp_path: Path) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text('[providers.dead]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\ntimeout_s = 2\n')
    r = runner.invoke(app, ["providers", "probe", "dead", "--config", str(cfg), "--json"])
    assert r.exit_code == 3
    out = json.loads(r.stdout)
    # nothing answered, so nothing is reported (issue 37 item 3: it reported logprobs/streaming = false)
    assert out["capabilities"] is None and "connect_error" in out["error"]


@pytest.mark.skipif(not CASES.is_dir(), reason="shared cases absent")
@pytest.mark.parametrize("path", sorted(CASES.glob("*.json")) if CASES.is_dir() else [], ids=lambda p: p.stem)
def test_cli_debug_normalize_cases(path: Path) -> None:
    r = runner.invoke(app, ["debug", "normalize", str(path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    exp = json.loads(path.read_text())["expect"]
    assert d["expect_ok"] is True, d["expect_diffs"]
    assert d["text"] == exp.get("text", d["text"]) and d["n_tokens"] == exp.get("n_tokens", d["n_tokens"])
    human = runner.invoke(app, ["debug", "normalize", str(path)])
    assert human.exit_code == 0
    for field in ("n_tokens:", "text:", "token_bytes:", "logprobs:", "anomalies:", "expect: matches"):
        assert field in human.output


def test_cli_debug_normalize_raw_bodies(tmp_path: Path) -> None:
    raw = tmp_path / "body.json"
    raw.write_text(json.dumps({"choices": [{"index": 0, "text": " so", "logprobs": {"tokens": [" so"], "token_logprobs": [0.7], "top_logprobs": [{" so": 0.7}]}}]}))
    r = runner.invoke(app, ["debug", "normalize", str(raw), "--api", "completions", "--json"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["logprobs"] == [None] and "positive_logprob" in d["anomalies"] and d["token_bytes"] == [[32, 115, 111]]
    sse = tmp_path / "body.sse"
    sse.write_text('data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n')
    r = runner.invoke(app, ["debug", "normalize", str(sse), "--json"])
    assert r.exit_code == 0 and "truncated_stream" in json.loads(r.output)["anomalies"]
    assert runner.invoke(app, ["debug", "normalize", str(tmp_path / "nope.json")]).exit_code == 3


def test_discover_seed_not_claimed_for_deterministic_server() -> None:
    handler, _ = fake_provider(20, True, True, True)

    def constant(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "seed" in body:
            body["seed"] = 0  # ignores the seed: every request answers the same
        return handler(httpx.Request("POST", request.url, json=body))

    cfg = ProviderConfig(name="fake", base_url="http://fake.test/v1", model="m")
    rep = asyncio.run(asyncio.wait_for(discover_capabilities(cfg, transport=httpx.MockTransport(constant)), 30))
    assert rep.capabilities.seed is False
    assert "seed not observable" in next(c.detail for c in rep.checks if c.name == "seed")
