"""Normalizer behaviour beyond the shared cases: recoveries, echo, streams, robustness."""

from __future__ import annotations

import json
import math
import random

import pytest

from probes.anomalies import ANOMALY_KINDS
from probes.byte_recovery import gpt2_unicode_to_bytes
from probes.normalize import normalize_response
from probes.records import NormalizedResponse

CHAT_REQ = {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2, "temperature": 0.0}


def chat(content, entries, **extra):
    ch = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    if entries is not None:
        ch["logprobs"] = {"content": entries}
    body = {"id": "c", "object": "chat.completion", "choices": [ch]}
    body.update(extra)
    return body


def ent(token, lp, top=None, b=None):
    e = {"token": token, "logprob": lp, "bytes": list(token.encode()) if b is None else b}
    e["top_logprobs"] = [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in (top or [(token, lp)])]
    return e


def test_clean_response_has_no_anomalies() -> None:
    entries = [
        ent("The", -0.1, [("The", -0.1), ("A", -2.5)]),
        ent(" cat", -0.3, [(" cat", -0.3), (" dog", -1.6)]),
        ent(" sat", -0.05, [(" sat", -0.05), (" is", -3.1)]),
    ]
    out = normalize_response("chat", CHAT_REQ, chat("The cat sat", entries, usage={"completion_tokens": 3}))
    assert out.anomalies == [] and out.n_tokens == 3 and out.text == "The cat sat"
    assert out.logprobs == [-0.1, -0.3, -0.05]
    assert out.token_bytes == [b"The", b" cat", b" sat"]
    assert out.tokens[1].top_logprobs[1] == (" dog", b" dog", -1.6)
    again = NormalizedResponse.model_validate_json(out.model_dump_json())
    assert again.token_bytes == out.token_bytes


def test_single_replacement_token_recovered_from_text() -> None:
    # "é" split into 2 byte tokens; only the second is reported as U+FFFD: its bytes follow from the text
    entries = [ent("caf", -0.1), ent("\\xc3", -0.2, b=[195]), ent("\ufffd", -0.3, b=[239, 191, 189])]
    out = normalize_response("chat", {**CHAT_REQ, "top_logprobs": 0}, chat("café", entries))
    assert out.token_bytes == [b"caf", b"\xc3", b"\xa9"]
    assert "replacement_char_bytes" in out.anomalies and "bytes_text_mismatch" not in out.anomalies
    assert out.tokens[2].anomalies == ["replacement_char_bytes"]


def test_completions_surrogates_spm_and_byte_tokens() -> None:
    req = {"model": "m", "prompt": "p", "logprobs": 1, "temperature": 1.0}

    def comp(text, toks):
        return {"choices": [{"index": 0, "text": text, "logprobs": {"tokens": toks, "token_logprobs": [-0.5] * len(toks), "top_logprobs": [{t: -0.5} for t in toks]}}]}

    g = normalize_response("completions", req, comp(" that is\n", ["Ġthat", "Ġis", "Ċ"]))
    assert g.token_bytes == [b" that", b" is", b"\n"] and "surrogate_token_strings" in g.anomalies
    assert g.tokens[0].top_logprobs[0][1] == b" that"  # alternatives decoded the same way
    s = normalize_response("completions", req, comp(" the end", ["▁the", "▁end"]))
    assert s.token_bytes == [b" the", b" end"] and "spm_token_strings" in s.anomalies
    b = normalize_response("completions", req, comp("é!", ["<0xC3>", "<0xA9>", "!"]))
    assert b.token_bytes == [b"\xc3", b"\xa9", b"!"] and b.anomalies == []  # byte spellings: a convention
    v = normalize_response("completions", req, comp("é", ["bytes:\\xc3", "bytes:\\xa9"]))
    assert v.token_bytes == [b"\xc3", b"\xa9"] and v.anomalies == []
    # OpenAI/simulator style: text with \xNN escapes for the partial character; alternatives alike
    m = normalize_response("completions", req, comp(" é", [" \\xc3", "\\xa9"]))
    assert m.token_bytes == [b" \xc3", b"\xa9"] and m.anomalies == []
    assert m.tokens[0].top_logprobs[0][1] == b" \xc3"
    # a literal backslash-x in the text stays literal
    lit = normalize_response("completions", req, comp('"\\xc3"', ['"\\', "xc", '3"']))
    assert lit.token_bytes == [b'"\\', b"xc", b'3"'] and lit.anomalies == []


def test_special_token_with_empty_text_is_not_a_mismatch() -> None:
    entries = [ent("Hi", -0.1), ent("<|im_end|>", -0.01, b=[])]
    out = normalize_response("chat", {**CHAT_REQ, "top_logprobs": 0}, chat("Hi", entries))
    assert out.token_bytes == [b"Hi", b""] and out.anomalies == []


def test_unrecoverable_text_mismatch_reported() -> None:
    out = normalize_response("chat", {**CHAT_REQ, "top_logprobs": 0}, chat("Hello", [ent("Help", -0.1)]))
    assert out.anomalies == ["bytes_text_mismatch"] and out.token_bytes == [b"Help"]


def test_echo_honoured_splits_prompt_tokens() -> None:
    req = {"model": "m", "prompt": "The cat", "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    body = {"choices": [{"index": 0, "text": "The cat sat", "logprobs": {
        "tokens": ["The", " cat", " sat"], "token_logprobs": [None, -3.2, -0.4],
        "top_logprobs": [None, {" cat": -3.2}, {" sat": -0.4}], "text_offset": [0, 3, 7]}}]}
    out = normalize_response("completions", req, body)
    assert out.text == " sat" and out.n_tokens == 1 and out.logprobs == [-0.4]
    assert [t.token for t in out.prompt_tokens] == ["The", " cat"]
    assert out.prompt_tokens[0].logprob is None and out.prompt_tokens[1].logprob == -3.2
    assert "echo_ignored" not in out.anomalies and "nonfinite_logprob" not in out.anomalies


def test_sampling_chosen_outside_top_only_flagged_when_it_belongs() -> None:
    req = {**CHAT_REQ, "temperature": 1.0}
    low = normalize_response("chat", req, chat("z", [ent("z", -6.0, [("a", -0.2), ("b", -1.9)])]))
    assert "chosen_not_in_top" not in low.anomalies and "greedy_not_argmax" not in low.anomalies
    high = normalize_response("chat", req, chat("z", [ent("z", -0.5, [("a", -0.2), ("b", -1.9)])]))
    assert "chosen_not_in_top" in high.anomalies


def test_greedy_tie_is_not_flagged() -> None:
    out = normalize_response("chat", CHAT_REQ, chat("b", [ent("b", -0.6931, [("a", -0.6931), ("b", -0.6931)])]))
    assert "greedy_not_argmax" not in out.anomalies
    bad = normalize_response("chat", CHAT_REQ, chat("b", [ent("b", -1.2, [("a", -0.4), ("b", -1.2)])]))
    assert "greedy_not_argmax" in bad.anomalies and bad.logprobs == [-1.2]


def test_single_zero_with_mass_is_untrusted_but_confident_zero_is_kept() -> None:
    bad = normalize_response("chat", CHAT_REQ, chat("a", [ent("a", 0.0, [("a", 0.0), ("b", -1.0)])]))
    assert bad.logprobs == [None] and "mass_exceeds_one" in bad.anomalies and "zero_logprob_run" not in bad.anomalies
    ok = normalize_response("chat", CHAT_REQ, chat("aa", [ent("a", 0.0, [("a", 0.0), ("b", -40.0)])] * 2))
    assert ok.logprobs == [0.0, 0.0] and ok.anomalies == []


def test_stream_with_plain_json_body_and_truncation() -> None:
    plain = json.dumps(chat("hi", [ent("hi", -0.1)]))
    out = normalize_response("chat", {**CHAT_REQ, "top_logprobs": 0}, response_text=plain, stream=True)
    assert out.text == "hi" and out.anomalies == []
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "logprobs": {"content": [ent("hi", -0.1)]}}]}
    cut = "data: " + json.dumps(chunk) + "\n\n"
    t = normalize_response("chat", {**CHAT_REQ, "top_logprobs": 0}, response_text=cut, stream=True)
    assert t.text == "hi" and t.n_tokens == 1 and "truncated_stream" in t.anomalies


def test_stream_chunks_as_list_and_missing_logprobs() -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [ent("a", -0.1)]}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}, "logprobs": None}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    out = normalize_response("chat", {**CHAT_REQ, "top_logprobs": 0}, response=chunks, stream=True)
    assert out.text == "ab" and "missing_logprobs" in out.anomalies and out.usage == {"completion_tokens": 2}
    none = normalize_response("chat", CHAT_REQ, chat("abc", None, usage={"completion_tokens": 2}))
    assert none.anomalies == ["missing_logprobs"] and none.n_tokens == 2 and none.tokens == []
    empty = normalize_response("chat", CHAT_REQ, chat("abc", [], usage={"completion_tokens": 2}))
    assert empty.anomalies == ["missing_logprobs"] and empty.n_tokens == 2


def test_errors_and_malformed_bodies_never_raise() -> None:
    e = normalize_response("chat", CHAT_REQ, {"error": {"message": "overloaded"}})
    assert e.anomalies == ["provider_error"] and e.text == "" and e.n_tokens is None
    m = normalize_response("chat", CHAT_REQ, response_text='{"choices": [')
    assert m.anomalies == ["malformed_json"]
    s = normalize_response("chat", CHAT_REQ, response_text="data: {oops\n\ndata: [DONE]\n\n", stream=True)
    assert "malformed_json" in s.anomalies
    w = normalize_response("chat", CHAT_REQ, {"choices": [{"index": 0, "message": {"content": "x"}, "logprobs": {"content": "nope"}}]})
    assert "malformed_response" in w.anomalies


def _mutate(obj, rng: random.Random):
    junk = [None, -math.inf, math.nan, "str", 12, -9999.0, 1e300, [], {}, [1, 2, 300], True]
    if isinstance(obj, dict):
        return {k: (rng.choice(junk) if rng.random() < 0.15 else _mutate(v, rng)) for k, v in obj.items() if rng.random() > 0.05}
    if isinstance(obj, list):
        return [rng.choice(junk) if rng.random() < 0.15 else _mutate(v, rng) for v in obj]
    return obj


def test_fuzzed_responses_never_raise_and_stay_json_safe() -> None:
    rng = random.Random(1234)
    base = chat("The cat", [ent("The", -0.1, [("The", -0.1), ("A", -2.0)]), ent(" cat", -0.2, [(" cat", -0.2), (" dog", -1.0)])])
    for i in range(300):
        body = _mutate(base, rng)
        out = normalize_response("chat", _mutate(CHAT_REQ, rng) if i % 3 == 0 else CHAT_REQ, body)
        assert set(out.anomalies) <= set(ANOMALY_KINDS)
        for t in out.tokens:
            assert t.logprob is None or (math.isfinite(t.logprob) and -9999 < t.logprob <= 1e-6)
        json.loads(out.model_dump_json())
        text = json.dumps(body)
        cut = text[: rng.randrange(len(text))]
        normalize_response("chat", CHAT_REQ, response_text=cut)
        normalize_response("chat", CHAT_REQ, response_text="data: " + cut, stream=True)


def test_choice_index_and_unknown_api() -> None:
    body = {"choices": [
        {"index": 0, "message": {"content": "a"}, "logprobs": {"content": [ent("a", -0.1)]}},
        {"index": 1, "message": {"content": "b"}, "logprobs": {"content": [ent("b", -0.2)]}},
    ]}
    req = {**CHAT_REQ, "top_logprobs": 0}
    assert normalize_response("chat", req, body, choice=1).text == "b"
    assert normalize_response("responses", req, body).anomalies == ["malformed_response"]


def test_cap_suppresses_short() -> None:
    req = {**CHAT_REQ, "top_logprobs": 20}
    body = chat("a", [ent("a", -0.1, [("a", -0.1), ("b", -3.0), ("c", -4.0), ("d", -5.0), ("e", -6.0)])])
    assert "top_logprobs_short" in normalize_response("chat", req, body).anomalies
    assert "top_logprobs_short" not in normalize_response("chat", req, body, max_top_logprobs=5).anomalies


def test_gpt2_table_is_a_bijection() -> None:
    from probes.byte_recovery import _gpt2_u2b

    table = _gpt2_u2b()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert gpt2_unicode_to_bytes("ĠhelloĊ") == b" hello\n"
    assert gpt2_unicode_to_bytes("日本") is None


@pytest.mark.parametrize("kind", sorted(ANOMALY_KINDS))
def test_anomaly_kinds_are_snake_case(kind: str) -> None:
    assert kind == kind.lower() and " " not in kind
