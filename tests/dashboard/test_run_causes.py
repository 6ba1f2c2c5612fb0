"""Issue 13 on the run page: every cause (primary and secondary, with the deciding evidence) and
every parameter-compliance pre-flight check stored with the run (failed ones named), rendered
without a browser (Streamlit AppTest, as tests/dashboard/test_app.py); runs stored before these
existed still render, without the new sections. Provider-controlled text stays escaped."""

from __future__ import annotations

import re

from sqlalchemy import select

from dashboard.render import md_code, verdict_badge
from dashboard.views.run_detail import causes_md, preflight_md
from tests.dashboard.conftest import SEED_NOW
from tests.dashboard.test_app import _no_html, _texts
from tests.fixtures_store import HOSTILE_TOKEN

CHECKS = [
    {"name": "t0-determinism", "kind": "parameter", "passed": True, "summary": "identical answers", "p_value": None},
    {"name": "seed", "kind": "parameter", "passed": False, "summary": "two seeded requests differ", "p_value": None},
    {"name": "greedy-top1", "kind": "decoding", "passed": False, "p_value": 7.8e-24,
     "summary": f"41 of 702 T=0 tokens not the own top-1, e.g. {HOSTILE_TOKEN}"},
    {"name": "prompt-tokens", "kind": "template", "passed": None, "summary": "no usage.prompt_tokens"},
]
SECONDARY = [{"verdict": "DECODING_NONCOMPLIANT", "rule": "6-preflight",
              "reason": "greedy tokens are not its own top-1 (repetition penalty before the pick)",
              "evidence": [{"detector": "self-greedy", "p_adjusted": 1.7e-56},
                           {"detector": "preflight-greedy-top1", "p_adjusted": 7.8e-24}]}]


def _detail(**kw) -> dict:
    return {"verdict": "QUANTIZATION", "verdict_details": {"rule": "2-logprob"}, "secondary_causes": [],
            "provider_failures": None, "excluded_responses": None, **kw}


def test_causes_and_preflight_markdown() -> None:
    md = causes_md(_detail(secondary_causes=SECONDARY,
                           provider_failures={"failed": 2, "total": 52, "share": 2 / 52, "kinds": {"timeout": 2}},
                           excluded_responses={"responses": 1, "tokens": 11, "reasons": {"bytes_text_mismatch": 1}}))
    lines = md.splitlines()
    assert lines[0] == f"- {verdict_badge('QUANTIZATION')} **primary** (rule {md_code('2-logprob')})"
    assert "**also**" in lines[1] and "DECODING\\_NONCOMPLIANT" in lines[1]
    assert "self\\-greedy p (Holm) 1.7e-56" in lines[1] and "preflight\\-greedy\\-top1 p (Holm) 7.8e-24" in lines[1]
    assert "Provider failures: 2 of 52 probes (3.8%): timeout 2" in md
    assert "Excluded from every detector: 1 response (11 tokens): bytes\\_text\\_mismatch 1" in md
    assert "No other cause" in causes_md(_detail()) and causes_md(_detail(verdict=None)) == ""
    pre = preflight_md(CHECKS)
    assert pre.startswith("1 of 4 checks passed; **failed: seed, greedy\\-top1**")
    assert pre.count("| :red-badge[FAIL] |") == 2 and ":gray-badge[not run]" in pre and "7.8e-24" in pre
    assert "\\<img" in pre and not re.search(r"(?<!\\)<", pre)  # provider text escaped
    assert preflight_md([]) == ""


def test_run_page_shows_every_cause_and_every_check(app_test, tmp_path) -> None:
    from auditor.store import models as orm
    from auditor.store.db import open_store
    from tests.fixtures_store import seed_demo

    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    store = open_store(url)
    with store.session() as s:
        summary = seed_demo(s, now=SEED_NOW)
        new_id, old_id = summary["runs"]["sim-int4"][-1], summary["runs"]["sim-honest"][-1]
        run = s.get(orm.AuditRun, new_id)
        run.summary = {**(run.summary or {}), "preflight": {"checks": CHECKS, "exchanges": [{"raw": "x" * 50}]},
                       "excluded_responses": {"responses": 3, "tokens": 57, "reasons": {"bytes_text_mismatch": 3}}}
        v = s.scalar(select(orm.VerdictRow).where(orm.VerdictRow.run_id == new_id))
        v.details = {**(v.details or {}), "secondary_causes": SECONDARY}
    store.close()

    at = app_test(url, page="run", run=new_id)
    assert not at.exception, [e.value for e in at.exception]
    _no_html(at)
    text = _texts(at)
    assert "Every cause found" in text and "**also**" in text and "DECODING\\_NONCOMPLIANT" in text
    assert "self\\-greedy p (Holm) 1.7e-56" in text
    assert "Parameter-compliance pre-flight" in text and "**failed: seed, greedy\\-top1**" in text
    for c in CHECKS:  # every stored check, passed or not
        assert c["name"].replace("-", "\\-") in text
    assert "Excluded from every detector: 3 responses" in text
    assert HOSTILE_TOKEN not in text and "x" * 50 not in text  # escaped; raw exchanges not shown

    old = app_test(url, page="run", run=old_id)  # stored before causes and pre-flights existed
    assert not old.exception, [e.value for e in old.exception]
    old_text = _texts(old)
    assert "Every cause found" in old_text and "No other cause" in old_text
    assert "Parameter-compliance pre-flight" not in old_text and "Run detail" in old_text
