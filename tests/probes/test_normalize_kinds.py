"""The normalizer's handed-case kinds, generalized (issue 13): each kind in several variants.

Kinds: chat-shaped logprobs on /v1/completions (and the reverse); correct ``bytes`` never
overwritten by U+FFFD of text/token strings; GPT-2 byte-level recovery from the ``bytes`` field;
``text_offset`` trusted only when monotonic and consistent; streams without content events;
in-band errors; usage accounting.
"""

from __future__ import annotations

import itertools
import json

import pytest

from probes.byte_recovery import _gpt2_u2b
from probes.normalize import normalize_response

FFFD = "\ufffd"
CHAT_REQ = {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1, "temperature": 0.0}
COMP_REQ = {"model": "m", "prompt": "p", "logprobs": 1, "temperature": 0.0}


def _entry(token: str, b: bytes, lp: float) -> dict:
    return {"token": token, "logprob": lp, "bytes": list(b), "top_logprobs": [{"token": token, "logprob": lp, "bytes": list(b)}]}


def _sse(chunks: list[dict], done: bool = True) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + ("data: [DONE]\n\n" if done else "")


def _split_tokens(text: str, cuts: list[int]) -> list[bytes]:
    """``text``'s UTF-8 bytes cut at the given byte positions."""
    b = text.encode()
    edges = [0, *cuts, len(b)]
    return [b[a:z] for a, z in itertools.pairwise(edges)]


def _lossy(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


# -- kind 1: chat-shaped logprobs on completions (and completions-shaped on chat) ---------------

@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("text", ["5\n", "猫が好き", "ok 🙂!"])
def test_completions_with_chat_shaped_logprobs(stream: bool, text: str) -> None:
    toks = _split_tokens(text, [1] if len(text.encode()) > 1 else [])
    toks = [t for t in toks if t]
    # keep every token a whole character so token strings are exact
    toks = [text.encode()] if any(_lossy(t) != t.decode("utf-8", "ignore") for t in toks) else toks
    entries = [_entry(t.decode(), t, -0.1 * (i + 1)) for i, t in enumerate(toks)]
    if stream:
        chunks = [{"object": "text_completion", "choices": [{"index": 0, "text": e["token"], "logprobs": {"content": [e]}, "finish_reason": None}]} for e in entries]
        out = normalize_response("completions", COMP_REQ, response_text=_sse(chunks), stream=True)
    else:
        body = {"object": "text_completion", "choices": [{"index": 0, "text": text, "logprobs": {"content": entries}, "finish_reason": "length"}]}
        out = normalize_response("completions", COMP_REQ, body)
    assert "missing_logprobs" not in out.anomalies and "bytes_text_mismatch" not in out.anomalies
    assert out.n_tokens == len(toks) and out.text == text
    assert out.token_bytes == toks
    assert out.logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(toks))])


def test_chat_with_completions_shaped_logprobs() -> None:
    body = {"choices": [{"index": 0, "message": {"content": "ab"}, "logprobs": {
        "tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25], "top_logprobs": [{"a": -0.5}, {"b": -0.25}]}}]}
    out = normalize_response("chat", CHAT_REQ, body)
    assert "missing_logprobs" not in out.anomalies and out.logprobs == [-0.5, -0.25] and out.token_bytes == [b"a", b"b"]


def test_really_missing_logprobs_still_reported() -> None:
    body = {"object": "text_completion", "choices": [{"index": 0, "text": "5", "logprobs": {"content": None}}]}
    assert "missing_logprobs" in normalize_response("completions", COMP_REQ, body).anomalies
    body = {"choices": [{"index": 0, "text": "5"}]}
    assert "missing_logprobs" in normalize_response("completions", COMP_REQ, body).anomalies


# -- kind 2: correct bytes never overwritten by U+FFFD from text or token strings ---------------

CASES_FFFD = [
    ("x≤5", [1, 3]),          # 3-byte char split 2+1, in the middle
    ("≤5", [1]),              # split 1+2 at the start
    ("ab猫", [2, 3, 4]),       # CJK at the end, split 1+1+1
    ("🙂", [2]),              # 4-byte emoji over two tokens
    ("a🙂b", [1, 2, 3, 4]),   # 4-byte emoji over four tokens
    ("日本", [1, 3, 5]),       # two CJK characters, each split
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("text", "cuts"), CASES_FFFD)
def test_correct_bytes_kept_when_text_and_tokens_carry_fffd(text: str, cuts: list[int], stream: bool) -> None:
    toks = _split_tokens(text, cuts)
    pieces = [_lossy(t) for t in toks]  # the runtime decoded each token on its own
    entries = [_entry(p, t, -0.01 * (i + 1)) for i, (p, t) in enumerate(zip(pieces, toks, strict=True))]
    assert FFFD in "".join(pieces)
    if stream:
        chunks = [{"choices": [{"index": 0, "delta": {"content": p}, "logprobs": {"content": [e]}, "finish_reason": None}]} for p, e in zip(pieces, entries, strict=True)]
        out = normalize_response("chat", CHAT_REQ, response_text=_sse(chunks), stream=True)
    else:
        body = {"choices": [{"index": 0, "message": {"content": "".join(pieces)}, "logprobs": {"content": entries}, "finish_reason": "stop"}]}
        out = normalize_response("chat", CHAT_REQ, body)
    assert out.token_bytes == toks
    assert b"".join(out.token_bytes) == text.encode()
    assert "replacement_char_bytes" not in out.anomalies and "bytes_text_mismatch" not in out.anomalies
    assert "replacement_char_text" in out.anomalies
    # alternatives keep their given bytes too
    assert [t.top_logprobs[0][1] for t in out.tokens] == toks


@pytest.mark.parametrize("stream", [False, True])
def test_correct_bytes_kept_when_runtime_groups_fffd_differently(stream: bool) -> None:
    # the runtime buffers the partial first byte pair (emits nothing), then emits one U+FFFD for
    # the last byte: text "x" "" "\ufffd" "5" — no per-token reading matches, the bytes are still right
    toks = [b"x", "≤".encode()[:2], "≤".encode()[2:], b"5"]
    pieces = ["x", "", FFFD, "5"]
    entries = [_entry(p, t, -0.1) for p, t in zip(pieces, toks, strict=True)]
    if stream:
        chunks = [{"choices": [{"index": 0, "delta": {"content": p}, "logprobs": {"content": [e]}}]} for p, e in zip(pieces, entries, strict=True)]
        out = normalize_response("chat", CHAT_REQ, response_text=_sse(chunks), stream=True)
    else:
        out = normalize_response("chat", CHAT_REQ, {"choices": [{"index": 0, "message": {"content": "".join(pieces)}, "logprobs": {"content": entries}}]})
    assert out.token_bytes == toks
    assert "bytes_text_mismatch" not in out.anomalies and "replacement_char_bytes" not in out.anomalies
    assert "replacement_char_text" in out.anomalies
    # bytes that disagree with the text outside the U+FFFD are still a mismatch
    bad = [_entry(p, t, -0.1) for p, t in zip(pieces, [b"y", *toks[1:]], strict=True)]
    out2 = normalize_response("chat", CHAT_REQ, {"choices": [{"index": 0, "message": {"content": "".join(pieces)}, "logprobs": {"content": bad}}]})
    assert "bytes_text_mismatch" in out2.anomalies


def test_fffd_bytes_with_clean_text_still_recovered_or_flagged() -> None:
    # the opposite defect (h05 kind) is unchanged: bytes are U+FFFD, the text is right
    e = [_entry(FFFD, FFFD.encode(), -0.1), _entry("5", b"5", -0.2)]
    out = normalize_response("chat", CHAT_REQ, {"choices": [{"index": 0, "message": {"content": "≤5"}, "logprobs": {"content": e}}]})
    assert out.token_bytes == ["≤".encode(), b"5"] and "replacement_char_bytes" in out.anomalies


def test_genuine_fffd_in_text_and_bytes_is_clean() -> None:
    e = [_entry(FFFD, FFFD.encode(), -0.1), _entry("!", b"!", -0.2)]
    out = normalize_response("chat", CHAT_REQ, {"choices": [{"index": 0, "message": {"content": FFFD + "!"}, "logprobs": {"content": e}}]})
    assert out.anomalies == [] and out.token_bytes == [FFFD.encode(), b"!"]


# -- kind 3: GPT-2 byte-level recovery applies to the bytes field -------------------------------

def _gpt2(b: bytes) -> str:
    b2u = {v: k for k, v in _gpt2_u2b().items()}
    return "".join(b2u[x] for x in b)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("text", "cuts"), [(" that is", [5]), ("猫です", [1, 3, 6]), ("a 🙂", [2, 4])])
def test_gpt2_recovery_from_bytes_field(text: str, cuts: list[int], stream: bool) -> None:
    toks = _split_tokens(text, cuts)
    # token strings useless (U+FFFD or empty); bytes field = UTF-8 of the GPT-2 surrogate string
    entries = [
        {"token": FFFD if i % 2 else "", "logprob": -0.1, "bytes": list(_gpt2(t).encode()),
         "top_logprobs": [{"token": FFFD, "logprob": -0.1, "bytes": list(_gpt2(t).encode())}]}
        for i, t in enumerate(toks)
    ]
    if stream:
        chunks = [{"choices": [{"index": 0, "delta": {"content": text if i == 0 else ""}, "logprobs": {"content": [e]}}]} for i, e in enumerate(entries)]
        out = normalize_response("chat", CHAT_REQ, response_text=_sse(chunks), stream=True)
    else:
        body = {"choices": [{"index": 0, "message": {"content": text}, "logprobs": {"content": entries}}]}
        out = normalize_response("chat", CHAT_REQ, body)
    assert out.token_bytes == toks
    assert "surrogate_token_strings" in out.anomalies and "bytes_text_mismatch" not in out.anomalies
    assert [t.top_logprobs[0][1] for t in out.tokens] == toks  # alternatives recovered the same way


def test_gpt2_strings_on_completions_with_cjk() -> None:
    text = "猫"
    toks = _split_tokens(text, [1, 2])
    body = {"choices": [{"index": 0, "text": text, "logprobs": {
        "tokens": [_gpt2(t) for t in toks], "token_logprobs": [-0.1] * 3, "top_logprobs": [{_gpt2(t): -0.1} for t in toks]}}]}
    out = normalize_response("completions", COMP_REQ, body)
    assert out.token_bytes == toks and "surrogate_token_strings" in out.anomalies
    assert [t.top_logprobs[0][1] for t in out.tokens] == toks


# -- kind 4: text_offset trusted only when monotonic and consistent -----------------------------

ECHO_REQ = {"model": "m", "prompt": "The cat", "max_tokens": 2, "echo": True, "logprobs": 1, "temperature": 0}


def _echo(offsets: list[int] | None, tokens=("The", " cat", " sat", " down"), text="The cat sat down") -> dict:
    lp = {"tokens": list(tokens), "token_logprobs": [None, -3.2, -0.4, -0.5], "top_logprobs": [None, {" cat": -3.2}, {" sat": -0.4}, {" down": -0.5}]}
    if offsets is not None:
        lp["text_offset"] = offsets
    return {"choices": [{"index": 0, "text": text, "logprobs": lp}]}


@pytest.mark.parametrize("offsets", [[0, 3, 7, 11], [0, 0, 0, 0], [0, 5, 2, 11], [7, 7, 7, 7], [0, 1, 2, 3], None])
def test_echo_split_ignores_bad_text_offsets(offsets) -> None:
    out = normalize_response("completions", ECHO_REQ, _echo(offsets))
    assert [t.token for t in out.prompt_tokens] == ["The", " cat"]
    assert out.text == " sat down" and out.logprobs == [-0.4, -0.5] and "echo_ignored" not in out.anomalies


def test_echo_split_uses_good_offsets_when_bytes_cannot_decide() -> None:
    # token strings do not spell the text (a tokenizer quirk), only consistent offsets can split
    out = normalize_response("completions", ECHO_REQ, _echo([0, 3, 7, 11], tokens=("The", " cat", " sAt", " down")))
    assert [t.token for t in out.prompt_tokens] == ["The", " cat"] and out.n_tokens == 2
    bad = normalize_response("completions", ECHO_REQ, _echo([0, 0, 9, 9], tokens=("Thee", " cat", " sAt", " down")))
    assert bad.prompt_tokens == [] and "echo_ignored" in bad.anomalies


@pytest.mark.parametrize("bos", ["<bos>", "<s>", "<|begin_of_text|>"])
@pytest.mark.parametrize("with_offsets", [True, False])
def test_echo_leading_bos_that_spells_no_text_is_dropped(bos, with_offsets) -> None:
    """vLLM / the simulator echo a prepended BOS (gemma's ``<bos>``) as the first prompt token with
    logprob null and text_offset 0, while ``text`` starts with the prompt itself: it must not shift
    the split (gemma reference-path audits reported 11 of 16 echoes as ignored before this)."""
    lp = {"tokens": [bos, "The", " cat", " sat", " down"], "token_logprobs": [None, -2.0, -3.2, -0.4, -0.5],
          "top_logprobs": [None, {"The": -2.0}, {" cat": -3.2}, {" sat": -0.4}, {" down": -0.5}]}
    if with_offsets:
        lp["text_offset"] = [0, 0, 3, 7, 11]
    out = normalize_response("completions", ECHO_REQ, {"choices": [{"index": 0, "text": "The cat sat down", "logprobs": lp}]})
    assert [t.token for t in out.prompt_tokens] == ["The", " cat"], out.anomalies
    assert out.text == " sat down" and out.logprobs == [-0.4, -0.5]
    assert "echo_ignored" not in out.anomalies and "bytes_text_mismatch" not in out.anomalies


def test_echo_first_token_with_a_logprob_is_never_dropped() -> None:
    # a real first token that the text does not start with is a mismatch to report, not a BOS
    lp = {"tokens": ["<x>", "The", " cat", " sat"], "token_logprobs": [-1.0, -2.0, -3.2, -0.4],
          "top_logprobs": [None, None, None, None], "text_offset": [0, 0, 3, 7]}
    out = normalize_response("completions", ECHO_REQ, {"choices": [{"index": 0, "text": "The cat sat", "logprobs": lp}]})
    assert [t.token for t in out.prompt_tokens] != ["The", " cat"]


# -- kind 5: a stream without content events is malformed, not an empty answer ------------------

@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize(
    "body",
    [
        "data: [DONE]\n\n",
        "data: [DONE]",
        ": keep-alive\n\ndata: [DONE]\n\n",
        'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0}}\n\ndata: [DONE]\n\n',
        'data: {"id": "x", "object": "chat.completion.chunk"}\n\ndata: [DONE]\n\n',
        "",
    ],
)
def test_stream_without_content_events_is_malformed(api: str, body: str) -> None:
    req = CHAT_REQ if api == "chat" else COMP_REQ
    out = normalize_response(api, req, response_text=body, stream=True)
    assert "malformed_response" in out.anomalies and out.text == "" and out.tokens == []


def test_stream_with_empty_answer_is_not_malformed() -> None:
    body = _sse([{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}])
    out = normalize_response("chat", {**CHAT_REQ, "logprobs": False}, response_text=body, stream=True)
    assert out.anomalies == [] and out.text == ""


def test_choice_missing_from_n2_stream_is_malformed() -> None:
    body = _sse([{"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}])
    plain = {**CHAT_REQ, "logprobs": False}
    assert normalize_response("chat", plain, response_text=body, stream=True, choice=0).anomalies == []
    assert "malformed_response" in normalize_response("chat", plain, response_text=body, stream=True, choice=1).anomalies


# -- in-band errors (one parser with the client) -----------------------------------------------

@pytest.mark.parametrize(
    "body",
    [
        'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n',
        'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n',
        'data: {"object": "error", "message": "boom", "code": 503}\n\n',
        'event: error\ndata: not json\n\n',
    ],
)
def test_stream_error_events_are_provider_errors(body: str) -> None:
    out = normalize_response("chat", CHAT_REQ, response_text=body, stream=True)
    assert "provider_error" in out.anomalies


# -- usage ------------------------------------------------------------------------------------

def test_usage_missing_flag_and_hostile_usage() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}
    plain = {**CHAT_REQ, "logprobs": False}
    no_usage = normalize_response("chat", plain, response_text=_sse([chunk]), stream=True)
    assert no_usage.usage is None and no_usage.usage_missing
    with_usage = normalize_response("chat", plain, response_text=_sse([chunk, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}]), stream=True)
    assert with_usage.usage == {"prompt_tokens": 5, "completion_tokens": 1} and not with_usage.usage_missing
    hostile = {"choices": [{"index": 0, "message": {"content": "a"}}], "usage": {"prompt_tokens": "1e99", "completion_tokens": [1], "total_tokens": -4}}
    h = normalize_response("chat", plain, hostile)
    assert h.usage_missing and "malformed_usage" in h.anomalies and h.usage == {}
