"""Issue 35 item 2: the simulator's reasoning mode, every parser variant, read back by the normalizer.

The template opens the assistant turn with ``<think>\\n``; the model writes the reasoning until the
token budget, the close tag is forced, then the answer. Each shape (``reasoning_content``,
``reasoning``, inline; plain and streamed; logprobs over both spans or the answer only) must
normalize without anomalies, with every covered token labelled by span.
"""

from __future__ import annotations

import pytest

from probes.normalize import normalize_response
from simulator.reasoning import REASONING_CLOSE
from simulator.server import create_app

REQ = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about cats."}], "max_tokens": 24,
       "logprobs": True, "top_logprobs": 3, "temperature": 0, "seed": 1}
BUDGET = 8


def _app(tiny_lm, mode: str, cover: str):
    return create_app("honest-fp32", tiny_lm, served_model_name="tiny", reasoning=mode, reasoning_logprobs=cover,
                      reasoning_budget=BUDGET, drafter="none")


VARIANTS = [("field", "both"), ("field", "answer"), ("field-reasoning", "both"), ("field-reasoning", "answer"),
            ("inline", "both")]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("mode", "cover"), VARIANTS)
def test_reasoning_shapes_normalize_cleanly(tiny_lm, client, mode: str, cover: str, stream: bool) -> None:
    c = client(_app(tiny_lm, mode, cover))
    req = {**REQ, "stream": stream}
    r = c.post("/v1/chat/completions", json=req)
    assert r.status_code == 200
    out = normalize_response("chat", req, response_text=r.text, stream=stream)
    assert not {"bytes_text_mismatch", "reasoning_logprobs_inconsistent", "missing_logprobs"} & set(out.anomalies), out.anomaly_details
    close_n = len(tiny_lm.tokenizer.encode(REASONING_CLOSE, add_special_tokens=False))
    spans = [t.span for t in out.tokens]
    if cover == "both":
        assert spans[: BUDGET + close_n] == ["reasoning"] * (BUDGET + close_n)
        assert set(spans[BUDGET + close_n:]) <= {"answer"}
        assert out.reasoning_coverage == "both"
    else:
        assert set(spans) <= {"answer"} and out.reasoning_coverage in ("answer", None)
    want_source = {"field": "reasoning_content", "field-reasoning": "reasoning", "inline": "inline"}[mode]
    assert out.reasoning_source == want_source and out.reasoning
    if mode == "inline":
        assert REASONING_CLOSE in out.text
    else:
        assert REASONING_CLOSE not in out.text and REASONING_CLOSE not in (out.reasoning or "")
    usage = out.usage or {}
    if not stream:
        assert usage.get("completion_tokens") == len(spans) + (0 if cover == "both" else BUDGET + close_n)


def test_same_output_whatever_the_shape(tiny_lm, client) -> None:
    """The shapes carry one generation: same reasoning and answer, same token ids (greedy, same seed)."""
    outs = []
    for mode in ("field", "inline"):
        r = client(_app(tiny_lm, mode, "both")).post("/v1/chat/completions", json=REQ)
        outs.append(normalize_response("chat", REQ, response_text=r.text))
    assert outs[0].token_bytes == outs[1].token_bytes and outs[0].reasoning == outs[1].reasoning


def test_prompt_opens_the_reasoning_span(tiny_lm, client) -> None:
    """The template's opener is part of the prompt (counted in usage.prompt_tokens)."""
    plain = client(create_app("honest-fp32", tiny_lm, served_model_name="tiny", drafter="none"))
    a = plain.post("/v1/chat/completions", json=REQ).json()["usage"]["prompt_tokens"]
    b = client(_app(tiny_lm, "field", "both")).post("/v1/chat/completions", json=REQ).json()["usage"]["prompt_tokens"]
    assert b - a == len(tiny_lm.tokenizer.encode("<think>\n", add_special_tokens=False))


def test_bad_reasoning_options_are_refused(tiny_lm) -> None:
    with pytest.raises(ValueError, match="reasoning="):
        create_app("honest-fp32", tiny_lm, reasoning="xml")
    with pytest.raises(ValueError, match="reasoning_logprobs="):
        create_app("honest-fp32", tiny_lm, reasoning="field", reasoning_logprobs="none")
    with pytest.raises(ValueError, match="no parser"):
        create_app("honest-fp32", tiny_lm, reasoning="inline", reasoning_logprobs="answer")
    with pytest.raises(ValueError, match="reasoning_budget="):
        create_app("honest-fp32", tiny_lm, reasoning="field", reasoning_budget=0)
