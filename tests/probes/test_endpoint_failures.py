"""Issue 37, items 3, 7 and 12: endpoints that fail are named for what they are, with the server's words.

- 401 / unknown model: the status and the server's own message reach the user (``auditor probe``,
  ``auditor providers probe``); never ``no probe succeeded (http_error=16)`` alone.
- An HTML page (HTTP 200, ``text/html``) is ``html_response``, not ``truncated_stream: 0 events``.
- A 307 is ``redirect`` with its Location and the base_url to use (redirects stay unfollowed).
- An unreachable port fails on the first connection error (it was 64 tries over 18.7 s).
- ``providers probe --write`` against a failing endpoint exits 3, quotes the server, writes nothing and
  reports no capability it did not observe.
- An SSE stream with a role chunk then ``[DONE]`` (no content, ``finish_reason`` null: llama.cpp's server
  ending a running stream when another request waits) is ``empty_stream``: retried, a pressure failure that
  narrows the concurrency, never counted ok; the capability probe's overlap test sees it.
"""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from auditor.cli import app
from probes.client import ProbeClient
from probes.concurrency import is_pressure
from probes.config import Capabilities, ProviderConfig
from probes.discover import discover_capabilities
from probes.normalize import normalize_response
from probes.suites import Probe, Suite
from probes.wire import parse_response

from ._error_server import HTML_TITLE, KEY_MESSAGE, MODEL_MESSAGE, REDIRECT_TO, closed_port, error_server
from ._one_slot_server import OneSlotServer, threaded_server

runner = CliRunner()
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
ROLE = 'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]}\n\n'


def _cfg(url: str, **kw: object) -> ProviderConfig:
    return ProviderConfig(name="ep", base_url=url, model="m", timeout_s=5,
                          retry={"max_attempts": 4, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}, **kw)


def _send(url: str, stream: bool = False, **kw: object):
    async def go():
        async with ProbeClient(_cfg(url, **kw)) as c:
            return await c.send({**BODY, "stream": stream}, key="k")

    return asyncio.run(go())


# -- item 12: classification -------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_html_page_is_html_response_not_a_truncated_stream(stream: bool) -> None:
    with error_server("html") as (url, seen):
        res = _send(url, stream=stream)
    assert res.error_kind == "html_response" and res.http_status == 200, res.error
    assert HTML_TITLE in res.error and "base_url" in res.error and "truncated_stream" not in res.error
    assert len(seen) == 1  # a web page does not change on a retry


def test_redirect_names_its_location_and_the_base_url_to_use() -> None:
    with error_server("redirect") as (url, seen):
        res = _send(url)
    assert res.error_kind == "redirect" and res.http_status == 307 and len(seen) == 1  # not followed, not retried
    assert REDIRECT_TO in res.error and "base_url = \"https://api.example.com/openai/v1\"" in res.error


def test_401_and_unknown_model_quote_the_server() -> None:
    with error_server("401") as (url, _):
        res = _send(url)
    assert res.error.startswith(f"http_401: {KEY_MESSAGE}") and res.n_attempts == 1
    with error_server("wrong-model") as (url, _):
        res = _send(url)
    assert res.http_status == 404 and MODEL_MESSAGE in res.error and res.n_attempts == 1


def test_unreachable_port_fails_on_the_first_connection_error() -> None:
    res = _send(f"http://127.0.0.1:{closed_port()}/v1")
    assert res.error_kind == "connect_error" and res.n_attempts == 1, [a.error for a in res.attempts]
    assert "cannot connect" in res.error


def _suite(n: int = 12, stream_tokens: int = 6) -> Suite:
    return Suite(name="t", version="1", description="test", probes=[
        Probe(id=f"p{i:02d}", workload="chat", mode="greedy", messages=[{"role": "user", "content": f"item {i}"}],
              max_tokens=stream_tokens, temperature=0.0) for i in range(n)])


def _probe_cli(tmp_path: Path, url: str, *extra: str):
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[providers.ep]\nbase_url = "{url}"\nmodel = "m"\ntimeout_s = 5\n\n'
                   '[providers.ep.retry]\nmax_attempts = 4\nbackoff_initial_s = 0.2\nbackoff_max_s = 1.0\n')
    return runner.invoke(app, ["probe", "--provider", "ep", "--suite", "smoke", "--config", str(cfg),
                               "--db", f"sqlite:///{tmp_path / 'p.db'}", "--no-progress", *extra])


@pytest.mark.parametrize(("mode", "words"), [("401", ["HTTP 401", KEY_MESSAGE]), ("wrong-model", ["HTTP 404", MODEL_MESSAGE]),
                                             ("html", ["html_response", HTML_TITLE])])
def test_no_probe_succeeded_names_status_and_message(tmp_path: Path, mode: str, words: list[str]) -> None:
    with error_server(mode) as (url, _):
        r = _probe_cli(tmp_path, url)
    assert r.exit_code == 3, r.output
    line = next(ln for ln in r.stderr.splitlines() if "no probe succeeded" in ln)
    for w in words:
        assert w in line, line


def test_unreachable_port_run_stops_at_once(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    r = _probe_cli(tmp_path, f"http://127.0.0.1:{closed_port()}/v1")
    wall = time.perf_counter() - t0
    assert r.exit_code == 3, r.output
    line = next(ln for ln in r.stderr.splitlines() if "no probe succeeded" in ln)
    assert "connect_error" in line and "cannot connect" in line
    from auditor.check.runner import summarize_run
    from auditor.store import open_store
    from auditor.store import queries as q

    st = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with st.session() as s:
            rid = q.list_runs(s, provider="ep", limit=1)[0].id
        summ = summarize_run(st, rid)
    finally:
        st.close()
    assert summ.attempts <= 8 and summ.retries == 0, summ  # at most those in flight (concurrency 8), never retried
    assert summ.status == "failed" and summ.probes_pending > 0  # the rest stays to resume once it is up
    assert wall < 10


# -- item 3: providers probe --write -----------------------------------------------------------------

@pytest.mark.parametrize(("mode", "words"), [("401", ["HTTP 401", KEY_MESSAGE]), ("wrong-model", ["HTTP 404", MODEL_MESSAGE]),
                                             ("html", [HTML_TITLE]), ("redirect", [REDIRECT_TO]),
                                             ("500", ["HTTP 500", "upstream exploded"])])
def test_probe_write_from_a_failing_endpoint_writes_nothing(tmp_path: Path, mode: str, words: list[str]) -> None:
    with error_server(mode) as (url, seen):
        path = tmp_path / "providers.toml"
        path.write_text(f'[providers.ep]\nbase_url = "{url}"\nmodel = "m"\ntimeout_s = 5\n', encoding="utf-8")
        before = path.read_bytes()
        r = runner.invoke(app, ["providers", "probe", "ep", "--config", str(path), "--write"])
        j = runner.invoke(app, ["providers", "probe", "ep", "--config", str(path), "--json"])
    assert r.exit_code == 3, r.output
    assert path.read_bytes() == before  # nothing written
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "nothing written" in err[0], r.stderr
    for w in words:
        assert w in err[0], err[0]
    assert "concurrency: yes" not in r.output and "completed" not in r.stdout
    assert j.exit_code == 3
    out = json.loads(j.stdout)
    assert out["capabilities"] is None and out["error"] and all(not c["supported"] for c in out["checks"])
    assert len(seen) <= 4  # it stopped at the first failing request (one per command, retries aside)


def test_probe_of_a_dead_endpoint_reports_no_capability(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(f'[providers.dead]\nbase_url = "http://127.0.0.1:{closed_port()}/v1"\nmodel = "m"\n', encoding="utf-8")
    before = path.read_bytes()
    r = runner.invoke(app, ["providers", "probe", "dead", "--config", str(path), "--write", "--json"])
    assert r.exit_code == 3 and path.read_bytes() == before
    out = json.loads(r.stdout)
    assert out["capabilities"] is None and "cannot connect" in out["error"] and out["requests"] == 1


# -- item 7: empty streams ------------------------------------------------------------------------------

def test_role_chunk_then_done_is_an_empty_stream() -> None:
    pr = parse_response("chat", 200, ROLE + "data: [DONE]\n\n", stream=True)
    assert not pr.ok and pr.error_kind == "empty_stream" and pr.retryable
    assert is_pressure("empty_stream", 200)
    # a finished empty answer is an answer (the model ended at once), and only [DONE] stays malformed (h16)
    fin = ROLE + 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    assert parse_response("chat", 200, fin, stream=True).ok
    assert parse_response("chat", 200, "data: [DONE]\n\n", stream=True).error_kind == "malformed_response"
    norm = normalize_response("chat", {**BODY, "stream": True}, response_text=ROLE + "data: [DONE]\n\n", stream=True)
    assert "empty_stream" in norm.anomalies
    plain = {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    assert parse_response("chat", 200, json.dumps(plain)).error_kind == "empty_answer"
    assert "empty_answer" in normalize_response("chat", BODY, response=plain).anomalies


def test_runner_never_counts_empty_streams_as_ok(tmp_path: Path) -> None:
    from auditor.check.runner import run_probes, summarize_run
    from auditor.store import open_store
    from auditor.store import queries as q

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with threaded_server(n_tokens=6, token_delay_s=0.01, cancel_mode="empty") as srv:
        cfg = ProviderConfig(
            name="llama-like", base_url=srv.base_url, model="m", timeout_s=10,
            capabilities=Capabilities(max_top_logprobs=0, logprobs=False, streaming=True, stream_usage=False),
            rate_limits={"concurrency": 4},
            retry={"max_attempts": 4, "backoff_initial_s": 0.02, "backoff_max_s": 0.1},
        )
        rid = run_probes(store, cfg, _suite(), progress=None, stream=True)
    summ = summarize_run(store, rid)
    with store.session() as s:
        done = q.list_probes(s, rid, status="done")
        texts = [p.text for p in done]
        extra = dict(q.get_run(s, rid).summary or {})
    assert summ.error_kinds.get("empty_stream", 0) > 0, summ.error_kinds  # seen, named
    assert all(t for t in texts), texts  # no empty answer counted ok
    assert summ.probes_ok == len(done) >= 10 and summ.retries > 0
    assert "empty_stream" in extra["concurrency"]["summary"] and extra["concurrency"]["min"] < 4
    store.close()


def test_capability_probe_sees_overlapping_answers_come_back_empty() -> None:
    async def go():
        async with OneSlotServer(n_tokens=6, token_delay_s=0.01, cancel_mode="empty") as srv:
            return await discover_capabilities(ProviderConfig(
                name="llama-like", base_url=srv.base_url, model="m", timeout_s=10, rate_limits={"concurrency": 8},
                retry={"max_attempts": 4, "backoff_initial_s": 0.02, "backoff_max_s": 0.1}))

    rep = asyncio.run(go())
    check = next(c for c in rep.checks if c.name == "concurrency")
    assert not check.supported and rep.safe_concurrency == 1, check.detail
    assert "empty" in check.detail
    assert rep.capabilities is not None and rep.capabilities.concurrent_streams_ok is False
    assert rep.capabilities.streaming  # observed once alone


def test_cli_probe_write_against_llama_like_empty_streams(tmp_path: Path) -> None:
    with threaded_server(n_tokens=6, token_delay_s=0.01, cancel_mode="empty") as srv:
        path = tmp_path / "providers.toml"
        path.write_text(f'[providers.ll]\nbase_url = "{srv.base_url}"\nmodel = "m"\n', encoding="utf-8")
        r = runner.invoke(app, ["providers", "probe", "ll", "--config", str(path), "--write"])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(path.read_text(encoding="utf-8"))["providers"]["ll"]
    assert data["rate_limits"]["concurrency"] == 1 and data["capabilities"]["concurrent_streams_ok"] is False
