"""`auditor reference generate|score` and `auditor models pull|list` through Typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from auditor.cli import app

from ..conftest import make_tiny_model

runner = CliRunner()


def _json(result):
    assert result.exit_code == 0, result.output
    out = result.stdout.strip()
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        line = [ln for ln in out.splitlines() if ln.startswith(("{", "["))][-1]
        return json.loads(line)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_tokenizer):
    d = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model(seed=0).save_pretrained(d)
    smollm2_tokenizer.save_pretrained(d)
    return d


def test_generate_json_contract_tiny(tiny_dir):
    base = ["reference", "generate", "--model", str(tiny_dir), "--prompt", "a b c a b c a b", "--json"]
    plain = _json(runner.invoke(app, base + ["--max-new-tokens", "12", "--drafter", "none"]))
    for key in ("token_ids", "text", "elapsed_s", "tokens_per_s", "mean_accepted_length", "accept_counts"):
        assert key in plain
    assert len(plain["token_ids"]) <= 12 and plain["accept_counts"][0] == len(plain["rounds"])
    for drafter in ("ngram", "ngram:1:3", "self:1"):
        spec = _json(runner.invoke(app, base + ["--max-new-tokens", "12", "--drafter", drafter, "--k", "3"]))
        assert spec["token_ids"] == plain["token_ids"], drafter
        assert len(spec["accept_counts"]) == 4
    sampled = [
        _json(runner.invoke(app, base + ["--max-new-tokens", "6", "--temperature", "0.9", "--top-p", "0.9", "--seed", "3"]))
        for _ in range(2)
    ]
    assert sampled[0]["token_ids"] == sampled[1]["token_ids"]


def test_score_json_contract_tiny(tiny_dir):
    r = _json(
        runner.invoke(
            app,
            ["reference", "score", "--model", str(tiny_dir), "--prompt", "Hello", "--continuation", " world again",
             "--chat", "--top-k", "3", "--json"],
        )
    )
    assert len(r["positions"]) == len(r["token_ids"]) >= 2
    pos = r["positions"][0]
    assert {"token_id", "logprob", "top_logprobs"} <= set(pos) and len(pos["top_logprobs"]) == 3
    assert pos["logprob"] <= 0 and pos["top_logprobs"][0]["logprob"] >= pos["logprob"]


def test_cli_errors_are_clear(tiny_dir):
    r = runner.invoke(app, ["reference", "generate", "--model", str(tiny_dir), "--prompt", "x", "--drafter", "bogus"])
    assert r.exit_code == 3 and "drafter" in r.output
    r = runner.invoke(app, ["reference", "generate", "--model", str(tiny_dir), "--prompt", "x", "--dtype", "int3"])
    assert r.exit_code == 3 and "dtype" in r.output
    r = runner.invoke(app, ["reference", "generate", "--model", str(tiny_dir), "--prompt", "x", "--top-p", "0"])
    assert r.exit_code == 3 and "top_p" in r.output


@pytest.mark.real_model
def test_cli_real_model_brief():
    pulled = _json(runner.invoke(app, ["models", "pull", "--json"]))
    assert pulled["name"] == "smollm2-135m-instruct" and pulled["revision"]
    listed = _json(runner.invoke(app, ["models", "list", "--json"]))
    assert any(m["name"] == "smollm2-135m-instruct" and m["status"] == "cached" for m in listed)
    g = _json(
        runner.invoke(
            app,
            ["reference", "generate", "--prompt", "What is the capital of France?", "--chat",
             "--max-new-tokens", "8", "--drafter", "ngram", "--json"],
        )
    )
    assert "Paris" in g["text"] and g["revision"] == pulled["revision"]
    s = _json(
        runner.invoke(
            app,
            ["reference", "score", "--prompt", "What is the capital of France?", "--chat",
             "--continuation", g["text"], "--top-k", "2", "--json"],
        )
    )
    assert s["positions"][0]["top_logprobs"][0]["token_id"] == s["positions"][0]["token_id"]
