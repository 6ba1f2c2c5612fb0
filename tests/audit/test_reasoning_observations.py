"""Issue 35 item 1 (observations): a reasoning response is evidence, token by token, with its span.

Stored as the runner stores it (normalized once), read back by the observations stage: every token
of a consistent reasoning response is observed (its reasoning tokens too), each with its span label
reaching the evidence rows; logprobs over the answer only leave the answer without an exact prefix
(the reasoning tokens are unknown) and exclude it with that reason, as inconsistent logprobs do.
"""

from __future__ import annotations

import json

from auditor.check.evidence import build_evidence, enrich_evidence
from auditor.check.observations import REASONING_PREFIX_UNKNOWN, excluded_summary, read_observations
from auditor.detectors import DetectorResult
from auditor.store import open_store
from auditor.store import queries as q
from probes.normalize import normalize_response

REQ = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0.0,
       "logprobs": True, "top_logprobs": 1, "max_tokens": 32}
REASONING = ["<think>", "\n", "The", " capital", " is", " Paris", ".", "\n", "</think>"]
ANSWER = ["\n\n", "Paris", "."]


def _entry(tok: str, lp: float) -> dict:
    b = list(tok.encode())
    return {"token": tok, "logprob": lp, "bytes": b, "top_logprobs": [{"token": tok, "logprob": lp, "bytes": b}]}


def _body(toks: list[str], content: str, reasoning: str) -> str:
    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    return json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": msg,
                                    "logprobs": {"content": [_entry(t, -0.1) for t in toks]}}],
                       "usage": {"prompt_tokens": 9, "completion_tokens": len(toks)}})


R_TEXT = "".join(REASONING[1:-1])
BODIES = {
    "both#0": _body(REASONING + ANSWER, "Paris.", R_TEXT),
    "answer_only#0": _body(["Paris", "."], "Paris.", R_TEXT),
    "inconsistent#0": _body(["<think>", "Rome", "</think>", "Paris", "."], "Paris.", R_TEXT),
}


def test_reasoning_responses_in_the_observations_stage(tmp_path, smollm2_tokenizer) -> None:
    tk = smollm2_tokenizer
    st = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with st.session() as s:
            rid = q.create_run(s, provider_name="p").id
            q.add_planned_probes(s, rid, [{"probe_key": k, "mode": "greedy", "workload": "chat", "request_json": REQ}
                                          for k in BODIES])
            for key, body in BODIES.items():
                norm = normalize_response("chat", REQ, response_text=body, stream=False, max_top_logprobs=20)
                assert "bytes_text_mismatch" not in norm.anomalies
                q.mark_probe_done(s, q.get_probe(s, rid, key).id, text=norm.text, finish_reason=norm.finish_reason,
                                  anomalies=list(norm.anomalies), usage=norm.usage, tokens=norm.tokens,
                                  reasoning=norm.reasoning, reasoning_coverage=norm.reasoning_coverage)
        got = read_observations(st, rid, None, tk)  # type: ignore[arg-type]  # config is not read
    finally:
        st.close()
    obs = {o.probe_key: o for o in got.observations}
    assert set(obs) == {"both#0"}
    # answer only / inconsistent: excluded whole, with the reason named
    assert sorted((e.probe_key, e.reasons) for e in got.excluded) == [
        ("answer_only#0", (REASONING_PREFIX_UNKNOWN,)), ("inconsistent#0", ("reasoning_logprobs_inconsistent",))]
    ex = excluded_summary(got.excluded)
    assert ex is not None and {"reasoning_logprobs_inconsistent", REASONING_PREFIX_UNKNOWN} <= set(ex["explanations"])

    both = obs["both#0"]
    assert [t.span for t in both.tokens] == ["reasoning"] * len(REASONING) + ["answer"] * len(ANSWER)
    assert both.failures == [] and len(both.spans) == len(REASONING) + len(ANSWER)
    assert tk.decode(both.ref_ids) == "".join(REASONING + ANSWER)  # the whole output is teacher-forced

    # reasoning positions are evidence; each evidence row says its span
    batch, _ = build_evidence([both], None, tk)
    keys = batch.prompt_ids.tolist()
    n_both = keys.count("both#0")
    assert n_both >= len([t for t in REASONING + ANSWER if len(tk.encode(t, add_special_tokens=False)) == 1])
    rows = [batch.evidence_row(i) for i in range(len(batch))]
    res = enrich_evidence([DetectorResult(name="x", statistic=0.0, p_value=1.0, effect=0.0, effect_ci=(0.0, 0.0), n=len(rows), evidence=rows)], [both], tk)
    spans = {(e["prompt_id"], e["position"]): e["span"] for e in res[0].evidence}
    assert spans[("both#0", 2)] == "reasoning" and spans[("both#0", len(REASONING) + 1)] == "answer"
    # the think tags are teacher-forced but reach no detector (a budget may force them)
    assert both.tag_positions == frozenset({0, len(REASONING) - 1})
    assert ("both#0", 0) not in spans and ("both#0", len(REASONING) - 1) not in spans


def test_think_tag_spelled_out_maps_to_a_special_token() -> None:
    """A reference whose tokenizer marks the think tags special: the provider's spelled-out tag aligns to it."""
    from probes.align import ByteVocab, align_to_reference
    from probes.records import TokenRecord

    bv = ByteVocab(by_bytes={b"a": 1}, special={"<think>": 7}, id_bytes={1: b"a"}, max_len=1, mode="text")
    toks = [TokenRecord(index=0, token="<think>", bytes=b"<think>", logprob=-0.1),
            TokenRecord(index=1, token="a", bytes=b"a", logprob=-0.1)]
    al = align_to_reference(toks, bv)
    assert al.ref_ids == [7, 1] and al.failures == []
