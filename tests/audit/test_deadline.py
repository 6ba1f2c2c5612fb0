"""Issue 37, item 9: a whole-audit deadline.

A provider that answers its first requests and then stalls (each later answer a body of keep-alive
blanks that never ends — within the stall rule, since a plain body may wait for its first byte up
to ``timeout_s``) kept a smoke audit running past 10 minutes. With ``auditor check --deadline 6`` the
deadline is stated up front, the audit ends soon after it with what it collected (a verdict, exit 0-2),
the probes cut off stay pending, no pre-flight request is sent past it, and every report format says
why. The runner alone: the same provider under ``deadline_s`` ends on time, summary ``deadline``.
"""

from __future__ import annotations

import asyncio
import json
import time
import xml.etree.ElementTree as ET

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from typer.testing import CliRunner

from auditor.check.runner import run_probes
from auditor.cli import app
from auditor.report.common import AuditReport, deadline_line
from auditor.report.render import render_junit, render_markdown
from auditor.store import open_store
from auditor.store import queries as q
from probes.config import Capabilities, ProviderConfig, RateLimits, RetryPolicy
from probes.suites import Probe, Suite

from ._plain_server import create_plain_app

runner = CliRunner()
ANSWERED = 4  # chat requests answered before the provider stalls


def _stalling_app() -> FastAPI:
    app = create_plain_app("plain")
    seen = {"n": 0}

    @app.middleware("http")
    async def stall_after(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path.endswith("/chat/completions"):
            seen["n"] += 1
            if seen["n"] > ANSWERED:
                async def blanks():  # a body that never ends (bounded for the test's sake)
                    for _ in range(600):
                        yield b" "
                        await asyncio.sleep(0.2)
                return StreamingResponse(blanks(), media_type="application/json")
        return await call_next(request)

    return app


@pytest.fixture
def stall_env(tmp_path, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup
    from simulator.server import ServerThread

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    srv = ServerThread(_stalling_app()).start()
    cfg = tmp_path / "providers.toml"
    cfg.write_text(
        f'[providers.plain]\nbase_url = "{srv.base_url}"\nmodel = "plain"\napi = "chat"\nreference = "tiny-ref"\n'
        "timeout_s = 60\n\n[providers.plain.capabilities]\nmax_top_logprobs = 5\nlogprobs = true\nn = true\n"
        "seed = true\nstreaming = false\n\n[providers.plain.rate_limits]\nconcurrency = 2\n")
    yield {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}"}
    srv.stop()


def test_check_ends_at_the_deadline_with_what_it_has(stall_env) -> None:
    t0 = time.monotonic()
    r = runner.invoke(app, ["check", "--provider", "plain", "--suite", "smoke", "--config", stall_env["config"],
                            "--db", stall_env["db"], "--no-progress", "--format", "json", "--deadline", "6"])
    took = time.monotonic() - t0
    assert r.exit_code in (0, 1, 2), r.output  # a verdict on what was collected, not an error
    assert "deadline: 6 s for this audit's requests (--deadline)" in r.stderr  # stated up front
    rep = json.loads(r.stdout)
    d = rep["deadline"]
    assert d["reached"] is True and d["deadline_s"] == pytest.approx(6, abs=0.5)
    assert d["done"] == ANSWERED and d["pending"] > 0
    assert took < 6 + 60  # the analysis of a few probes; without the deadline: 60 s per attempt, 4 attempts each
    st = open_store(stall_env["db"])
    with st.session() as s:
        counts = q.probe_counts(s, rep["run_id"])
        run = q.get_run(s, rep["run_id"])
        assert run is not None and run.status == "completed"
        assert "exchanges" not in ((run.summary or {}).get("preflight") or {}) or not any(
            (run.summary or {})["preflight"]["exchanges"])  # nothing sent past the deadline
    st.close()
    assert counts.get("done") == ANSWERED and counts.get("pending", 0) == d["pending"]
    rep_obj = AuditReport.from_dict(rep)
    line = deadline_line(rep_obj.summary)
    assert line is not None and f"{ANSWERED} of {ANSWERED + d['pending']} probes finished" in line
    assert line in render_markdown(rep_obj)
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_junit(rep_obj)).iter("property")}
    assert props["deadline"] == line


def test_runner_stops_at_its_deadline() -> None:
    answered = {"n": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        answered["n"] += 1
        if answered["n"] > ANSWERED:
            await asyncio.sleep(3600)  # never answers (cancelled at the deadline)
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "hi"},
                                                      "finish_reason": "stop"}]})

    cfg = ProviderConfig(name="late", base_url="http://late.invalid/v1", model="m", api="chat",
                         capabilities=Capabilities(streaming=False), rate_limits=RateLimits(concurrency=2),
                         retry=RetryPolicy(max_attempts=1), timeout_s=3000.0)
    suite = Suite(name="late", version="1", description="t", probes=[
        Probe(id=f"p{i}", workload="chat", mode="greedy", messages=[{"role": "user", "content": f"x{i}"}],
              max_tokens=4, temperature=0.0) for i in range(10)])
    st = open_store("sqlite://")
    t0 = time.monotonic()
    rid = run_probes(st, cfg, suite, progress=None, transport=httpx.MockTransport(handler), api_key="",
                     deadline_s=1.0)
    assert time.monotonic() - t0 < 60  # without the deadline: 3600 s (the handler never answers); generous under load
    with st.session() as s:
        run = q.get_run(s, rid)
        assert run is not None and run.status == "interrupted"  # resumable
        d = (run.summary or {})["deadline"]
        assert q.probe_counts(s, rid) == {"done": ANSWERED, "pending": 10 - ANSWERED}
    assert d["reached"] is True and d["done"] == ANSWERED and d["pending"] == 10 - ANSWERED
    st.close()
