"""Issue 35 item 3: the ``relaxed-think`` profile — relaxed MTP acceptance inside the reasoning span only.

On the greedy path a draft in the target's top-3 with p(d) >= 0.5 p(top-1) is accepted inside
``<think>``; the answer, sampling requests and plain (non-reasoning) chat are verified strictly.
"""

from __future__ import annotations

import pytest
import torch

from probes.normalize import normalize_response
from probes.reasoning import think_tag_positions
from simulator.profiles import get_profile
from simulator.server import create_app
from simulator.verifiers import RelaxedThinkVerifier, make_verifier


def test_accept_rule() -> None:
    v = RelaxedThinkVerifier()
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.10])
    assert v.accepts(p, 0) and v.accepts(p, 1)  # top-1; top-2 with 0.25 >= 0.5 * 0.40
    assert not v.accepts(p, 2)  # top-3 but 0.15 < 0.20
    p2 = torch.tensor([0.30, 0.20, 0.18, 0.17, 0.15])
    assert v.accepts(p2, 2) and not v.accepts(p2, 3)  # 4th-ranked: outside the top-3 though >= 0.15
    assert v.n_relaxed == 2


def test_relaxed_only_inside_the_reasoning_span() -> None:
    prof = get_profile("relaxed-think")
    assert isinstance(make_verifier(prof, span="reasoning"), RelaxedThinkVerifier)
    assert not isinstance(make_verifier(prof, span="answer"), RelaxedThinkVerifier)
    assert not isinstance(make_verifier(prof), RelaxedThinkVerifier)


def _flips(out) -> dict[str, int]:
    """Greedy positions per span where the emitted token is not the provider's own top-1 (the
    think-tag tokens aside: the budget forces the close tag)."""
    n: dict[str, int] = {"reasoning": 0, "answer": 0}
    tags = think_tag_positions(out.tokens)
    for i, t in enumerate(out.tokens):
        if i in tags:
            continue
        alts = [v for _s, _b, v in t.top_logprobs if v is not None]
        if t.logprob is not None and alts and max(alts) - t.logprob > 1e-6 and t.span is not None:
            n[t.span] += 1
    return n


def test_relaxed_think_flips_the_greedy_path_in_the_reasoning_span_only(peaked_lm, client) -> None:
    req = {"model": "tiny", "max_tokens": 40, "logprobs": True, "top_logprobs": 5, "temperature": 0}
    relaxed = client(create_app("relaxed-think", peaked_lm, served_model_name="tiny", reasoning="field",
                                reasoning_budget=20))
    plain = client(create_app("relaxed-think", peaked_lm, served_model_name="tiny"))
    total = {"reasoning": 0, "answer": 0}
    for i in range(4):
        body = {**req, "messages": [{"role": "user", "content": f"Question {i}: why is the sky blue?"}]}
        out = normalize_response("chat", body, response_text=relaxed.post("/v1/chat/completions", json=body).text)
        assert out.reasoning_coverage == "both"
        for k, v in _flips(out).items():
            total[k] += v
        p_out = normalize_response("chat", body, response_text=plain.post("/v1/chat/completions", json=body).text)
        assert _flips(p_out) == {"reasoning": 0, "answer": 0}  # no reasoning span: strict
    assert total["reasoning"] > 0 and total["answer"] == 0, total
    honest = client(create_app("honest-fp32", peaked_lm, served_model_name="tiny", reasoning="field", reasoning_budget=20))
    body = {**req, "messages": [{"role": "user", "content": "Question 0: why is the sky blue?"}]}
    h_out = normalize_response("chat", body, response_text=honest.post("/v1/chat/completions", json=body).text)
    assert _flips(h_out) == {"reasoning": 0, "answer": 0}  # control: the honest reasoning path is argmax


def test_synthetic_acceptance_emits_l_drafts_unverified_then_the_target_token() -> None:
    from simulator.verifiers import SyntheticAcceptanceVerifier

    p = torch.softmax(torch.randn(5, 11, generator=torch.Generator().manual_seed(0)), -1)
    drafts = torch.tensor([int(p[i].argmin()) for i in range(4)])  # the least likely tokens: never verified
    v = make_verifier(get_profile("synthetic-acceptance:3"))
    assert isinstance(v, SyntheticAcceptanceVerifier) and v.accept_len == 3
    r = v.verify(p, None, drafts, torch.Generator().manual_seed(1), True)
    assert r.n_accepted == 3 and r.next_token == int(p[3].argmax()) and v.n_unverified == 3
    r = v.verify(p[:3], None, drafts[:2], torch.Generator().manual_seed(1), False)
    assert r.n_accepted == 2  # fewer drafts than L: all of them
    assert get_profile("synthetic-acceptance").expected_verdict == "RELAXED_VERIFICATION"
    with pytest.raises(ValueError, match="whole number"):
        get_profile("synthetic-acceptance:1.5")
