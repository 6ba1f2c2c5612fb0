"""Issue 13 (evidence): a response whose tokens do not reproduce its text (``bytes_text_mismatch``,
e.g. reasoning tokens mixed into ``logprobs.content``) reaches no detector. It is excluded whole at
the observations stage, counted, and shown in every report with the reason; a clean response
beside it still counts. (The pipeline end to end: tests/audit/test_preflight_pipeline.py.)"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from io import StringIO

from rich.console import Console

from auditor.check.evidence import build_evidence
from auditor.check.observations import (
    ExcludedResponse,
    excluded_summary,
    load_observations,
    read_observations,
    untrusted_response_reasons,
)
from auditor.report.common import AuditReport, excluded_line
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.report.render import render_json, render_text
from auditor.store import open_store
from auditor.store import queries as q
from probes.normalize import normalize_response

#: The model's answer (each a single SmolLM2 token) and the reasoning tokens a server mixed in.
ANSWER = ["The", " capital", " of", " France", " is", " Paris", "."]
REASONING = ["Let", " me", " think", "."]


def _entry(tok: str, lp: float, bytes_: bytes | None = None) -> dict:
    b = list(tok.encode() if bytes_ is None else bytes_)
    return {"token": tok, "logprob": lp, "bytes": b, "top_logprobs": [{"token": tok, "logprob": lp, "bytes": b}]}


def chat_body(entries: list[dict], content: str, *, reasoning: bool) -> str:
    """A chat completion answering ``content``. With ``reasoning``, its ``logprobs.content`` opens
    with reasoning tokens that neither the answer text (``message.content``) nor any reasoning
    field or think tag accounts for (a server that mixes them in and drops the reasoning text).
    Reasoning responses that do account for them are evidence: tests/probes/test_normalize_reasoning.py."""
    lead = [_entry(t, -0.25) for t in REASONING] if reasoning else []
    msg = {"role": "assistant", "content": content}
    return json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": msg,
                                    "logprobs": {"content": lead + entries}}],
                       "usage": {"prompt_tokens": 9, "completion_tokens": len(lead) + len(entries)}})


REQ = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0.0,
       "logprobs": True, "top_logprobs": 1, "max_tokens": 16}


def test_reasoning_tokens_exclude_the_response_and_the_clean_one_counts(tmp_path, smollm2_tokenizer) -> None:
    tk = smollm2_tokenizer
    assert all(len(tk.encode(t, add_special_tokens=False)) == 1 for t in ANSWER)
    clean_entries = [_entry(t, -0.1 - 0.01 * i) for i, t in enumerate(ANSWER)]
    bodies = {key: chat_body(clean_entries, "".join(ANSWER), reasoning=key.startswith("reasoning"))
              for key in ("clean#0", "reasoning#0")}
    st = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with st.session() as s:
            rid = q.create_run(s, provider_name="p").id
            q.add_planned_probes(s, rid, [{"probe_key": k, "mode": "greedy", "workload": "chat", "request_json": REQ}
                                          for k in bodies])
            for key, body in bodies.items():
                norm = normalize_response("chat", REQ, response_text=body, stream=False, max_top_logprobs=20)
                assert ("bytes_text_mismatch" in norm.anomalies) == (key == "reasoning#0"), (key, norm.anomalies)
                q.mark_probe_done(s, q.get_probe(s, rid, key).id, text=norm.text, finish_reason=norm.finish_reason,
                                  anomalies=list(norm.anomalies), usage=norm.usage, tokens=norm.tokens)
            bad_id = q.get_probe(s, rid, "reasoning#0").id
        loaded = read_observations(st, rid, None, tk)  # type: ignore[arg-type]  # config is not read
        assert [o.probe_key for o in loaded.observations] == ["clean#0"]
        assert loaded.excluded == [ExcludedResponse(bad_id, "reasoning#0", ("bytes_text_mismatch",),
                                                    len(REASONING) + len(ANSWER))]
        assert [o.probe_key for o in load_observations(st, rid, None, tk)] == ["clean#0"]  # type: ignore[arg-type]
    finally:
        st.close()
    # no detector position comes from the excluded response; every answer token of the clean one counts
    batch, _ = build_evidence(loaded.observations, None, tk)
    assert set(batch.prompt_ids.tolist()) == {"clean#0"} and len(batch) == len(ANSWER)
    ex = excluded_summary(loaded.excluded)
    assert ex is not None and ex["responses"] == 1 and ex["tokens"] == len(REASONING) + len(ANSWER)
    assert ex["reasons"] == {"bytes_text_mismatch": 1} and ex["probe_keys"] == ["reasoning#0"]
    assert "reasoning tokens" in ex["explanations"]["bytes_text_mismatch"]
    assert excluded_summary([]) is None

    # every report shows it as excluded, with the reason
    rep = AuditReport(run_id="r1", provider="p", model="m", verdict="INCONCLUSIVE", verdict_reason="x", alpha=0.05,
                      summary={"excluded_responses": ex})
    line = excluded_line(rep.excluded_responses)
    assert line is not None and line.startswith("1 response (11 tokens) excluded from every detector: bytes_text_mismatch 1")
    con = Console(file=StringIO(), width=400)
    render_text(rep, con)
    assert "excluded: 1 response" in con.file.getvalue() and "reasoning#0" in con.file.getvalue()  # type: ignore[attr-defined]
    assert "| Excluded responses | 1 response (11 tokens)" in render_markdown(rep)
    assert json.loads(render_json(rep))["excluded_responses"]["reasons"] == {"bytes_text_mismatch": 1}
    root = ET.fromstring(render_junit(rep).split("\n", 1)[1])
    assert any(p.get("name") == "excluded_responses" and "bytes_text_mismatch" in str(p.get("value"))
               for p in root.iter("property"))
    # a report without exclusions (older runs too) says none
    old = AuditReport(run_id="r0", provider="p", model="m", verdict="PASS", verdict_reason="x", alpha=0.05)
    assert old.excluded_responses is None and "| Excluded responses | none |" in render_markdown(old)


def test_untrusted_response_kinds() -> None:
    assert untrusted_response_reasons(["bytes_text_mismatch", "truncated_stream"]) == ("bytes_text_mismatch",)
    assert untrusted_response_reasons(["normalize_error: ValueError: boom"]) == ("normalize_error",)
    # per-token kinds and sound response-level ones do not exclude a response
    assert untrusted_response_reasons(["replacement_char_text", "greedy_not_argmax", "retokenized_text"]) == ()
    assert untrusted_response_reasons(None) == ()
