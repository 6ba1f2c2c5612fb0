"""Prompt-token estimates for responses without ``usage`` (auditor/check/usage_estimate.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from auditor.check.usage_estimate import PromptTokenEstimator, _cache_dir, request_text

MSGS = [
    [{"role": "user", "content": "Count from one to ten: one, two,"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 你好 🙂 and a longer sentence."}],
]


def test_request_text_chat_parts_and_completions() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
                         {"role": "assistant", "content": "b"}, "junk"]}
    assert request_text(body) == "a\nb"
    assert request_text({"prompt": "xyz"}) == "xyz"
    assert request_text({}) == ""


def test_length_rule_without_a_cached_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    est = PromptTokenEstimator("smollm2-135m-instruct")
    assert est.method == "chars/4"
    text = "x" * 41
    assert est.count({"prompt": text}) == math.ceil(41 / 4) == 11
    assert PromptTokenEstimator(None).count({"messages": "not a list"}) == 0


def test_broken_cache_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    (tmp_path / "models" / "bad").mkdir(parents=True)
    (tmp_path / "models" / "bad" / "tokenizer.json").write_text("{not json", encoding="utf-8")
    assert PromptTokenEstimator("bad").method == "chars/4"


_REF = _cache_dir() / "smollm2-135m-instruct"


@pytest.mark.skipif(not (_REF / "tokenizer.json").is_file(), reason="bundled reference not pulled")
@pytest.mark.parametrize("msgs", MSGS)
def test_tokenizer_count_matches_transformers_chat_template(msgs: list) -> None:
    transformers = pytest.importorskip("transformers")
    tk = transformers.AutoTokenizer.from_pretrained(str(_REF))
    want = len(tk(tk.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"])
    est = PromptTokenEstimator("smollm2-135m-instruct")
    assert est.method == "tokenizer"
    assert est.count({"messages": msgs}) == want
    assert est.count({"prompt": msgs[-1]["content"]}) == len(tk(msgs[-1]["content"], add_special_tokens=False)["input_ids"])


def test_estimate_prefers_normalized_then_chunks_then_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))  # chars/4 rule
    est = PromptTokenEstimator("x")
    req = {"prompt": "abcdefgh"}
    assert est.estimate(req, n_tokens=5, chunk_tokens=(1, 1), text="zzzz") == (2, 5)
    assert est.estimate(req, n_tokens=0, chunk_tokens=(1, 2), text="zzzz") == (2, 3)
    assert est.estimate(req, n_tokens=0, chunk_tokens=(), text="z" * 9) == (2, 3)
    assert est.estimate({}, n_tokens=0, text=None) == (0, 0)


def test_usage_estimates_record_marks_summary_and_accumulates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from auditor.check.usage_estimate import UsageEstimates

    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    summary: dict = {}
    UsageEstimates("x").record(summary)
    assert summary == {}  # every response had usage: nothing estimated
    u = UsageEstimates("x")
    u.missing = 3
    u.record(summary)
    u.record(summary)  # a resumed run adds its own count
    assert summary == {"usage_estimated": True, "usage_missing_responses": 6, "usage_prompt_tokens_method": "chars/4"}
