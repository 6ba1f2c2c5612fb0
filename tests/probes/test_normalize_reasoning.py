"""Reasoning responses in the normalizer (issue 35 item 1): every shape, span labels, coverage.

The shared cases (../shared/cases/reasoning/) are run by ``test_cases.py``; these build the other
shapes: inline think tags (with and without the open tag, never closed), ``message.reasoning``,
streamed ``delta.reasoning_content``, logprobs over the answer only, and inconsistent logprobs.
"""

from __future__ import annotations

import json

import pytest

from probes.normalize import normalize_response

REQ = {"model": "m", "messages": [{"role": "user", "content": "q"}], "logprobs": True, "top_logprobs": 1, "temperature": 0}


def _entry(tok: str, lp: float = -0.1) -> dict:
    b = list(tok.encode())
    return {"token": tok, "logprob": lp, "bytes": b, "top_logprobs": [{"token": tok, "logprob": lp, "bytes": b}]}


def _body(content: str | None, toks: list[str], **reasoning: str) -> dict:
    msg: dict = {"role": "assistant", "content": content, **reasoning}
    return {"choices": [{"index": 0, "finish_reason": "stop", "message": msg, "logprobs": {"content": [_entry(t) for t in toks]}}]}


def _sse(chunks: list[tuple[dict, list[str]]]) -> str:
    lines = []
    for delta, toks in chunks:
        ch: dict = {"index": 0, "delta": delta, "finish_reason": None}
        if toks:
            ch["logprobs"] = {"content": [_entry(t) for t in toks]}
        lines.append("data: " + json.dumps({"object": "chat.completion.chunk", "choices": [ch]}))
    lines.append("data: " + json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    lines.append("data: [DONE]")
    return "\n\n".join(lines) + "\n\n"


REASON = ["<think>", "\n", "Two", " plus", " two", ".", "\n", "</think>"]
ANSWER = ["\n\n", "Four", "."]
R_TEXT = "\nTwo plus two.\n"


def _spans(out) -> list[str | None]:
    return [t.span for t in out.tokens]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_field_with_logprobs_over_both_spans(field: str) -> None:
    out = normalize_response("chat", REQ, response=_body("Four.", REASON + ANSWER, **{field: R_TEXT}))
    assert out.n_tokens == len(REASON + ANSWER)
    assert "bytes_text_mismatch" not in out.anomalies and "reasoning_logprobs_inconsistent" not in out.anomalies
    assert _spans(out) == ["reasoning"] * len(REASON) + ["answer"] * len(ANSWER)
    assert b"".join(out.token_bytes).decode() == "<think>" + R_TEXT + "</think>\n\nFour."
    assert (out.text, out.reasoning, out.reasoning_source, out.reasoning_coverage) == ("Four.", R_TEXT, field, "both")


def test_field_without_open_tag_and_stripped_fields() -> None:
    """DeepSeek-R1: the template opens <think> in the prompt; the parser strips the fields."""
    toks = REASON[1:] + ANSWER
    out = normalize_response("chat", REQ, response=_body("Four.", toks, reasoning_content=R_TEXT.strip()))
    assert out.anomalies == []
    assert _spans(out) == ["reasoning"] * (len(REASON) - 1) + ["answer"] * len(ANSWER)


def test_field_with_logprobs_over_the_answer_only() -> None:
    out = normalize_response("chat", REQ, response=_body("Four.", ["Four", "."], reasoning_content=R_TEXT))
    assert out.anomalies == []
    assert _spans(out) == ["answer", "answer"]
    assert out.reasoning_coverage == "answer" and out.token_bytes == [b"Four", b"."]


def test_field_cut_inside_the_reasoning() -> None:
    """max_tokens reached before </think>: content null, every token is reasoning."""
    out = normalize_response("chat", REQ, response=_body(None, REASON[:-1], reasoning_content=R_TEXT))
    assert out.anomalies == [] and out.text == ""
    assert _spans(out) == ["reasoning"] * (len(REASON) - 1)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_stream_delta_reasoning_then_content(field: str) -> None:
    chunks = [({field: "" if t in ("<think>", "</think>") else t}, [t]) for t in REASON]
    chunks += [({"content": t}, [t]) for t in ANSWER]
    out = normalize_response("chat", {**REQ, "stream": True}, response_text=_sse(chunks), stream=True)
    assert out.anomalies == [], out.anomaly_details
    assert _spans(out) == ["reasoning"] * len(REASON) + ["answer"] * len(ANSWER)
    assert out.reasoning_source == field and out.reasoning == R_TEXT and out.text == "\n\nFour."


def test_stream_reasoning_without_logprobs_answer_with() -> None:
    """Logprobs over the answer only in a stream: reasoning chunks carry none, no missing_logprobs."""
    chunks = [({"reasoning_content": t}, []) for t in REASON[1:-1]]
    chunks += [({"content": t}, [t]) for t in ["Four", "."]]
    out = normalize_response("chat", {**REQ, "stream": True}, response_text=_sse(chunks), stream=True)
    assert out.anomalies == [], out.anomaly_details
    assert _spans(out) == ["answer", "answer"] and out.reasoning_coverage == "answer"


def test_inline_think_tags() -> None:
    toks = REASON + ANSWER
    content = "".join(toks)
    out = normalize_response("chat", REQ, response=_body(content, toks))
    assert out.anomalies == []
    assert out.text == content and out.reasoning == R_TEXT and out.reasoning_source == "inline"
    assert _spans(out) == ["reasoning"] * len(REASON) + ["answer"] * len(ANSWER)


def test_inline_close_tag_only_and_unclosed() -> None:
    toks = REASON[1:] + ANSWER  # DeepSeek-R1 without a parser: no <think> in the output
    out = normalize_response("chat", REQ, response=_body("".join(toks), toks))
    assert _spans(out) == ["reasoning"] * (len(REASON) - 1) + ["answer"] * len(ANSWER)
    toks = REASON[:-1]  # cut inside the reasoning
    out = normalize_response("chat", REQ, response=_body("".join(toks), toks))
    assert _spans(out) == ["reasoning"] * len(toks) and out.anomalies == []


def test_completions_inline_think() -> None:
    toks = REASON + ANSWER
    body = {"choices": [{"index": 0, "text": "".join(toks), "finish_reason": "stop",
                         "logprobs": {"tokens": toks, "token_logprobs": [-0.1] * len(toks), "top_logprobs": None}}]}
    out = normalize_response("completions", {"prompt": "q", "logprobs": 0}, response=body)
    assert _spans(out) == ["reasoning"] * len(REASON) + ["answer"] * len(ANSWER)


def test_plain_answer_is_all_answer() -> None:
    out = normalize_response("chat", REQ, response=_body("Four.", ["Four", "."]))
    assert _spans(out) == ["answer", "answer"] and out.reasoning is None and out.reasoning_coverage is None


@pytest.mark.parametrize(
    ("toks", "reasoning"),
    [
        (["<think>", "Other", " thing", "</think>", "Four", "."], R_TEXT),  # reasoning tokens spell other text
        (["Five", "."], R_TEXT),  # neither the answer nor reasoning + answer
        (REASON + ["Five", "."], R_TEXT),  # right reasoning, wrong answer
    ],
)
def test_inconsistent_reasoning_logprobs(toks: list[str], reasoning: str) -> None:
    out = normalize_response("chat", REQ, response=_body("Four.", toks, reasoning_content=reasoning))
    assert "reasoning_logprobs_inconsistent" in out.anomalies
    assert "bytes_text_mismatch" not in out.anomalies
    assert out.reasoning_coverage == "inconsistent" and all(s is None for s in _spans(out))
    assert out.n_tokens == len(toks)
    json.loads(out.model_dump_json())


def test_empty_reasoning_field_with_mismatch_is_plain_mismatch() -> None:
    """An empty reasoning field proves nothing: a plain token/text mismatch stays bytes_text_mismatch."""
    out = normalize_response("chat", REQ, response=_body("Four.", ["Five", "."], reasoning_content=""))
    assert "bytes_text_mismatch" in out.anomalies and "reasoning_logprobs_inconsistent" not in out.anomalies


@pytest.mark.parametrize("bad", [None, 3, ["x"], {"a": 1}])
def test_hostile_reasoning_field_never_crashes(bad: object) -> None:
    out = normalize_response("chat", REQ, response=_body("Four.", ["Four", "."], reasoning_content=bad))  # type: ignore[arg-type]
    assert out.anomalies == [] and out.reasoning is None


def test_reasoning_tokens_without_the_close_tag_are_inconsistent() -> None:
    """Reasoning then answer tokens with no </think> between them: a gap in the sequence."""
    toks = REASON[1:-1] + ["Four", "."]
    out = normalize_response("chat", REQ, response=_body("Four.", toks, reasoning_content=R_TEXT))
    assert "reasoning_logprobs_inconsistent" in out.anomalies and "bytes_text_mismatch" not in out.anomalies


def test_think_tags_with_empty_bytes_fields() -> None:
    """A server that gives the (special) think tags an empty bytes list but their string."""
    body = _body("Four.", REASON + ANSWER, reasoning_content=R_TEXT)
    for e in body["choices"][0]["logprobs"]["content"]:
        if e["token"] in ("<think>", "</think>"):
            e["bytes"] = []
    out = normalize_response("chat", REQ, response=body)
    assert "reasoning_logprobs_inconsistent" not in out.anomalies and "bytes_text_mismatch" not in out.anomalies
    assert _spans(out) == ["reasoning"] * len(REASON) + ["answer"] * len(ANSWER)


def test_round_chunks_with_several_tokens_and_multibyte_reasoning() -> None:
    """Streamed chunks holding several tokens each; a multi-byte character split across two tokens."""
    caf = "caf\u00e9".encode()
    entries = [_entry("<think>"), _entry("caf"), {"token": "bytes:\\xc3", "logprob": -0.1, "bytes": [caf[3]], "top_logprobs": []},
               {"token": "bytes:\\xa9", "logprob": -0.1, "bytes": [caf[4]], "top_logprobs": []}, _entry("</think>"), _entry("ok")]
    chunks = [
        {"index": 0, "delta": {"reasoning_content": "caf"}, "logprobs": {"content": entries[:2]}, "finish_reason": None},
        {"index": 0, "delta": {"reasoning_content": "\u00e9"}, "logprobs": {"content": entries[2:5]}, "finish_reason": None},
        {"index": 0, "delta": {"content": "ok"}, "logprobs": {"content": entries[5:]}, "finish_reason": "stop"},
    ]
    text = "".join("data: " + json.dumps({"object": "chat.completion.chunk", "choices": [c]}) + "\n\n" for c in chunks) + "data: [DONE]\n\n"
    out = normalize_response("chat", {**REQ, "top_logprobs": 0, "stream": True}, response_text=text, stream=True)
    assert out.anomalies == [], out.anomaly_details
    assert _spans(out) == ["reasoning"] * 5 + ["answer"]
    assert out.token_bytes[2:4] == [caf[3:4], caf[4:5]]


def test_partial_character_in_the_reasoning() -> None:
    """A model emits an incomplete UTF-8 sequence inside its reasoning: the reasoning field holds
    U+FFFD there (the engine's detokenizer), the token's bytes field the raw bytes."""
    bad = {"token": "\\xe2\\x88", "logprob": -0.1, "bytes": [0xE2, 0x88], "top_logprobs": []}
    body = _body("Four.", [], reasoning_content="Hm\ufffd ok")
    body["choices"][0]["logprobs"]["content"] = [_entry("<think>"), _entry("Hm"), bad, _entry(" ok"), _entry("</think>"),
                                                 _entry("Four"), _entry(".")]
    out = normalize_response("chat", {**REQ, "top_logprobs": 0}, response=body)
    assert not {"reasoning_logprobs_inconsistent", "bytes_text_mismatch"} & set(out.anomalies), out.anomaly_details
    assert _spans(out) == ["reasoning"] * 5 + ["answer"] * 2
    assert out.token_bytes[2] == b"\xe2\x88"


def test_both_field_names_one_empty() -> None:
    """A server sending both names (one kept for compatibility, empty): the one with text counts."""
    out = normalize_response("chat", REQ, response=_body("Four.", REASON + ANSWER, reasoning_content="", reasoning=R_TEXT))
    assert out.reasoning == R_TEXT and out.reasoning_source == "reasoning" and out.anomalies == []
    assert _spans(out) == ["reasoning"] * len(REASON) + ["answer"] * len(ANSWER)
