"""Issue 13 in the check pipeline: the parameter pre-flight is sent once, stored with the run and
shown in every report; an injected system prompt (honest weights) is never turned into
QUANTIZATION or SUBSTITUTION (nor any other deviation); failures above 10% make the verdict
INCONCLUSIVE ("provider failures"); a stored response whose ``logprobs.content`` carries reasoning
tokens is excluded from every detector and named in the report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from io import StringIO

import pytest
from rich.console import Console

from auditor.check.pipeline import run_check
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.report.render import load_report, render_json, render_text
from auditor.store import open_store
from auditor.store import queries as q

from .conftest import providers_toml
from .test_excluded_responses import REASONING, chat_body


@pytest.fixture
def env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    cfg = tmp_path / "providers.toml"
    cfg.write_text(providers_toml({
        "inject": tiny_sims.url("honest-fp32", inject_system_prompt="You are a terse assistant."),
        "flaky": tiny_sims.url("honest-fp32", faults=0.6),
        "honest": tiny_sims.url("honest-fp32"),
    }, "tiny", reference="tiny-ref") + "[providers.flaky.retry]\nmax_attempts = 1\n")
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}"}


def test_injected_system_prompt_scored_honestly_and_reported(env):
    rep = run_check("inject", suite="smoke", budget_tokens=96, db_url=env["db"], config_path=env["config"])
    # honest weights, honest sampler: a template difference is no deviation of any kind
    assert rep.verdict in ("PASS", "INCONCLUSIVE"), (rep.verdict, rep.verdict_reason)
    assert rep.exit_code in (0, 2)
    assert rep.secondary_causes == [], rep.secondary_causes
    assert not any(d.get("rejects") for d in rep.detectors), [d["name"] for d in rep.detectors if d.get("rejects")]
    tm = rep.verdict_details["template_mismatch"]
    assert tm["provider_prompt_tokens"] != tm["reference_prompt_tokens"]
    assert "chat template" in rep.verdict_reason
    lp = rep.detector("logprob-divergence")
    assert not lp["ran"] and "set aside" in lp["reason"]
    checks = {c["name"]: c["passed"] for c in rep.preflight_checks}
    assert checks["prompt-tokens"] is False and checks["seed"] is True
    # stored with the run (exchanges kept in the store, not in the report) and re-rendered identically
    st = open_store(env["db"])
    with st.session() as s:
        stored = q.get_run(s, rep.run_id).summary["preflight"]
    st.close()
    assert len(stored["exchanges"]) >= 8 and "exchanges" not in rep.summary["preflight"]
    again = load_report(rep.run_id, env["db"])
    assert json.loads(render_json(again))["preflight_checks"] == json.loads(render_json(rep))["preflight_checks"]
    md = render_markdown(rep)
    assert "## Parameter-compliance pre-flight" in md and "| prompt-tokens | template | FAIL |" in md
    con = Console(file=StringIO(), width=400)
    render_text(rep, con)
    text = con.file.getvalue()  # type: ignore[attr-defined]
    assert "failed: prompt-tokens" in text and "injected system prompt" in text
    root = ET.fromstring(render_junit(rep).split("\n", 1)[1])
    pf = [tc for tc in root.iter("testcase") if tc.get("classname", "").endswith(".preflight")]
    assert {tc.get("name") for tc in pf} >= {"seed", "prompt-tokens", "top-p"}
    assert any(tc.get("name") == "prompt-tokens" and tc.find("failure") is not None for tc in pf)


def test_provider_failures_make_the_audit_inconclusive(env):
    rep = run_check("flaky", suite="smoke", budget_tokens=96, db_url=env["db"], config_path=env["config"])
    f = rep.provider_failures
    assert f["failed"] > 0.1 * f["total"]
    assert rep.verdict == "INCONCLUSIVE" and rep.verdict_reason.startswith("provider failures")
    assert "would suffice" not in rep.verdict_reason and rep.exit_code == 2
    assert "Provider failures" in render_markdown(rep)


def test_reasoning_tokens_in_a_stored_response_reach_no_detector(env):
    """One stored response is replaced by the same answer with reasoning tokens mixed into its
    ``logprobs.content`` (normalized as the runner does): re-analysed, it gives no detector position
    and is reported as excluded, and the clean responses beside it still count. With every response
    so flagged the audit still ends (INCONCLUSIVE), naming them."""
    from probes.normalize import normalize_response

    kw = {"suite": "smoke", "budget_tokens": 96, "db_url": env["db"], "config_path": env["config"]}
    rep = run_check("honest", **kw)
    assert rep.excluded_responses is None and rep.tokens["scored_positions"] > 0
    st = open_store(env["db"])
    try:
        with st.session() as s:
            done = [p for p in q.list_probes(s, rep.run_id, status="done") if q.tokens_for_probe(s, p.id)]
            victim = next(p for p in done if p.mode in ("greedy", "logprob"))
            toks = q.tokens_for_probe(s, victim.id)
            scored_before = sum(t.ref_token_id is not None for t in toks)  # its 1:1 positions, all compared
            entries = [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token_bytes or b""),
                        "top_logprobs": [{"token": a[0], "logprob": a[1], "bytes": list(bytes.fromhex(h or ""))}
                                         for a, h in zip(t.top_logprobs or [], t.top_logprobs_bytes or [], strict=False)]}
                       for t in toks]
            req = dict(victim.request_json)
            norm = normalize_response("chat", req, response_text=chat_body(entries, victim.text or "", reasoning=True),
                                      stream=False, max_top_logprobs=20)
            assert "bytes_text_mismatch" in norm.anomalies
            q.mark_probe_done(s, victim.id, text=norm.text, finish_reason=norm.finish_reason,
                              anomalies=list(norm.anomalies), usage=norm.usage, tokens=norm.tokens)
            key, n_done = victim.probe_key, len(done)
    finally:
        st.close()
    again = run_check("honest", resume=rep.run_id, **kw)
    ex = again.excluded_responses
    assert ex is not None and ex["responses"] == 1 and ex["reasons"] == {"bytes_text_mismatch": 1}
    assert ex["probe_keys"] == [key] and ex["tokens"] == len(REASONING) + len(toks)
    assert again.tokens["scored_positions"] == rep.tokens["scored_positions"] - scored_before > 0
    assert not any(e.get("prompt_id") == key for d in again.detectors for e in d.get("evidence") or [])
    assert "| Excluded responses | 1 response" in render_markdown(again)
    assert load_report(again.run_id, env["db"]).excluded_responses == ex
    # every response flagged: nothing to score, the audit still ends and says why
    st = open_store(env["db"])
    try:
        with st.session() as s:
            for p in q.list_probes(s, rep.run_id, status="done"):
                p.anomalies = [*(p.anomalies or []), "bytes_text_mismatch"]
    finally:
        st.close()
    last = run_check("honest", resume=rep.run_id, **kw)
    assert last.verdict == "INCONCLUSIVE" and last.tokens["scored_positions"] == 0
    assert last.verdict_reason.startswith("provider failures") and "excluded: bytes_text_mismatch" in last.verdict_reason
    assert "would suffice" not in last.verdict_reason
    assert last.excluded_responses["responses"] == n_done
