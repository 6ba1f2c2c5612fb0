"""Issue 37, item 1: a well-formed answer never crashes ``auditor check``, and an unexpected error is never
read as an accusation.

- A provider whose temperature-1 ``top_logprobs`` carry all the probability mass (they sum to 1: nothing
  is left unlisted, so the pre-flight top-p check expects 0 unlisted emissions) is audited to the end
  (it crashed with ``float(None)`` in ``PreflightReport.detector_results``, exit 1 = "deviation found").
- Any other unexpected error ends ``auditor check`` with exit 4 (not 0-3), one line on stderr naming the
  log file that holds the traceback (``--debug`` prints it), the run stored ``failed`` with the reason,
  and the reason shown by ``auditor report RUN_ID`` and on the dashboard's run page.
"""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest
from typer.testing import CliRunner

from auditor.check.preflight import run_preflight
from auditor.cli import app
from auditor.store import open_store
from auditor.store import queries as q
from probes.config import Capabilities, ProviderConfig

from ._plain_server import create_plain_app

runner = CliRunner()


def _all_mass_transport() -> httpx.MockTransport:
    """The plain server's answers through httpx (no sockets): top_logprobs sum to 1 at every position."""
    from fastapi.testclient import TestClient

    tc = TestClient(create_plain_app("m"))

    def handler(request: httpx.Request) -> httpx.Response:
        r = tc.post("/v1/chat/completions", content=request.content, headers={"content-type": "application/json"})
        return httpx.Response(r.status_code, content=r.content, headers={"content-type": r.headers["content-type"]})

    return httpx.MockTransport(handler)


def test_all_mass_top_logprobs_preflight_gives_results_not_a_crash() -> None:
    cfg = ProviderConfig(name="plain", base_url="http://plain.test/v1", model="m",
                         capabilities=Capabilities(max_top_logprobs=5, seed=True))
    rep = run_preflight(cfg, None, transport=_all_mass_transport())
    tp = rep.check("top-p")
    assert tp is not None and tp.n > 0  # sampled tokens with alternatives came back
    assert tp.evidence["expected_unlisted"] == 0.0  # nothing is left unlisted
    res = {r.name: r for r in rep.detector_results()}  # raised TypeError: float(None)
    r = res["preflight-top-p"]
    assert r.ran and r.p_value > 1e-3  # the answers follow the reported distribution: no truncation
    assert math.isnan(r.effect) or math.isfinite(r.effect)
    assert "all the probability mass" in tp.summary


# -- the whole check -------------------------------------------------------------------------------

@pytest.fixture
def plain_env(tmp_path, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup
    from simulator.server import ServerThread

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    monkeypatch.setenv("SPEC_AUDITOR_LOG_DIR", str(tmp_path / "logs"))
    srv = ServerThread(create_plain_app("plain")).start()
    cfg = tmp_path / "providers.toml"
    cfg.write_text(
        f'[providers.plain]\nbase_url = "{srv.base_url}"\nmodel = "plain"\napi = "chat"\nreference = "tiny-ref"\n'
        "timeout_s = 30\n\n[providers.plain.capabilities]\nmax_top_logprobs = 5\nlogprobs = true\nn = true\n"
        "seed = true\nstreaming = false\n\n[providers.plain.rate_limits]\nconcurrency = 2\n")
    yield {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}", "logs": tmp_path / "logs"}
    srv.stop()


def _check(env: dict, *extra: str):
    return runner.invoke(app, ["check", "--provider", "plain", "--suite", "smoke", "--budget-tokens", "96",
                               "--config", env["config"], "--db", env["db"], "--no-progress", "--format", "json",
                               *extra])


def _newest_run(db: str):
    st = open_store(db)
    try:
        with st.session() as s:
            run = q.list_runs(s, provider="plain", limit=1)[0]
            return run.id, run.status, run.failure_reason
    finally:
        st.close()


def test_all_mass_provider_is_audited_to_the_end(plain_env) -> None:
    r = _check(plain_env)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)  # it was TypeError
    assert r.exit_code in (0, 1, 2), r.output  # a verdict, not a crash (the crash was exit 1)
    assert "Traceback" not in r.output
    rep = json.loads(r.stdout)
    checks = {c["name"]: c for c in rep["preflight_checks"]}
    assert checks["top-p"]["passed"] is not False  # nothing was truncated
    rid, status, reason = _newest_run(plain_env["db"])
    assert rid == rep["run_id"] and status == "completed" and reason is None


def test_unexpected_error_exits_4_with_one_line_and_stores_the_reason(plain_env, monkeypatch) -> None:
    from auditor.check import pipeline as audit

    def boom(*_a, **_k):
        raise RuntimeError("boom in the analysis")

    monkeypatch.setattr(audit, "_analyze", boom)
    r = _check(plain_env)
    assert r.exit_code == 4, r.output
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "internal error" in err[0] and "RuntimeError: boom in the analysis" in err[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    logs = list(plain_env["logs"].glob("*.log"))
    assert len(logs) == 1 and str(logs[0]) in r.stderr
    text = logs[0].read_text()
    assert "Traceback" in text and "boom in the analysis" in text
    rid, status, reason = _newest_run(plain_env["db"])
    assert status == "failed" and reason is not None and "RuntimeError: boom in the analysis" in reason
    assert rid in err[0]
    # `auditor report RUN_ID` names the reason instead of "no verdict yet"
    rr = runner.invoke(app, ["report", rid, "--db", plain_env["db"]])
    assert rr.exit_code == 3 and "RuntimeError: boom in the analysis" in rr.output and "failed" in rr.output
    # --debug prints the traceback, same exit code
    rd = _check(plain_env, "--debug")
    assert rd.exit_code == 4 and "Traceback" in rd.stderr and "boom in the analysis" in rd.stderr


def test_failure_reason_on_the_run_page(plain_env, monkeypatch) -> None:
    from auditor.check import pipeline as audit
    from auditor.store.run_detail_queries import run_detail
    from dashboard.views.run_detail import status_md

    monkeypatch.setattr(audit, "_analyze", lambda *_a, **_k: (_ for _ in ()).throw(ValueError("bad <b>value</b>")))
    assert _check(plain_env).exit_code == 4
    rid, _status, _reason = _newest_run(plain_env["db"])
    st = open_store(plain_env["db"])
    try:
        with st.session() as s:
            d = run_detail(s, rid)
    finally:
        st.close()
    assert d is not None and d["status"] == "failed" and "ValueError: bad <b>value</b>" in d["failure_reason"]
    md = status_md(d)
    assert md.startswith("Run status: **failed** — no verdict: internal error")
    assert "ValueError" in md and "bad \\<b\\>value" in md and not re.search(r"(?<!\\)<", md)  # escaped
    assert status_md({"status": "completed", "verdict_reason": "x"}) == ""
