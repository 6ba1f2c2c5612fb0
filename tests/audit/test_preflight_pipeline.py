"""Issue 13 in the check pipeline: the parameter pre-flight is sent once, stored with the run and
shown in every report; an injected system prompt (honest weights) is never turned into
QUANTIZATION or SUBSTITUTION; failures above 10% make the verdict INCONCLUSIVE ("provider failures")."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from auditor.audit import run_check
from auditor.report import load_report, render_json, render_junit, render_markdown
from auditor.store import open_store
from auditor.store import queries as q

from .conftest import providers_toml


@pytest.fixture
def env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    from auditor import audit

    monkeypatch.setitem(audit._MODELS, ("tiny-ref", "float32"), tiny_lm)
    cfg = tmp_path / "providers.toml"
    cfg.write_text(providers_toml({
        "inject": tiny_sims.url("honest-fp32", inject_system_prompt="You are a terse assistant."),
        "flaky": tiny_sims.url("honest-fp32", faults=0.6),
    }, "tiny", reference="tiny-ref") + "[providers.flaky.retry]\nmax_attempts = 1\n")
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}"}


def test_injected_system_prompt_scored_honestly_and_reported(env):
    rep = run_check("inject", suite="smoke", budget_tokens=96, db_url=env["db"], config_path=env["config"])
    assert rep.verdict in ("PASS", "INCONCLUSIVE", "DECODING_NONCOMPLIANT")
    assert rep.verdict not in ("QUANTIZATION", "SUBSTITUTION")
    assert not any(c["verdict"] in ("QUANTIZATION", "SUBSTITUTION") for c in rep.secondary_causes)
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
