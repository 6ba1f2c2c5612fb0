"""Issue 37, item 11: memory and storage follow the request, not the provider.

A provider answering 100,000 ``top_logprobs`` per token (5 asked) once drove a 16-probe smoke audit
to 1.8 GB of RSS and a 218 MB SQLite file. Here (in-process, ``httpx.MockTransport``) such a
provider, streamed and plain: every stored token keeps at most the asked alternatives + 1 (the
chosen token), each such token carries ``top_logprobs_excess``, the raw bodies kept are bounded per
attempt and per run, so the database stays small; and a provider sending NaN / Infinity / positive
logprobs gets them counted from the store and named in every report format.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from auditor.check.runner import run_probes
from auditor.check.summary import logprob_defects
from auditor.report.common import AuditReport, logprob_defects_line
from auditor.report.render import render_json, render_junit, render_markdown, render_text
from auditor.store import open_store
from auditor.store import queries as q
from auditor.store.models import ProbeAttempt
from probes.config import Capabilities, ProviderConfig, RateLimits, ResponseLimits, RetryPolicy
from probes.normalize import normalize_response
from probes.suites import Probe, Suite
from probes.wire import build_payload, stored_body_cap

N_ALTERNATIVES = 100_000
ASKED = 5
ANSWER = ("Hi", " there", "!")


def _alternatives(n: int) -> str:
    """One token's ``n`` alternatives as JSON text (100,000: ~4.6 MB)."""
    alts = [{"token": f"w{j}", "logprob": -2.0 - j * 1e-5, "bytes": list(f"w{j}".encode())} for j in range(n)]
    return json.dumps(alts)


_ALTS_JSON = {N_ALTERNATIVES: _alternatives(N_ALTERNATIVES), 2000: _alternatives(2000)}


def _entry(tok: str, lp: object = -0.5, n: int = N_ALTERNATIVES) -> str:
    # splice the shared alternatives text in (json.dumps of 100,000 dicts per token would be slow)
    return (f'{{"token": {json.dumps(tok)}, "logprob": {lp}, "bytes": {json.dumps(list(tok.encode()))}, '
            f'"top_logprobs": {_ALTS_JSON[n]}}}')


def _small_flood(request: httpx.Request) -> httpx.Response:
    """2,000 alternatives per token, plain: ~95 KB bodies."""
    content = ", ".join(_entry(t, n=2000) for t in ANSWER)
    text = ('{"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": '
            f'{json.dumps("".join(ANSWER))}}}, "finish_reason": "stop", "logprobs": {{"content": [{content}]}}}}]}}')
    return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})


def _flood(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    if body.get("stream"):
        lines = []
        for t in ANSWER:
            lines.append('data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": '
                         f'{json.dumps(t)}}}, "finish_reason": null, "logprobs": {{"content": [{_entry(t)}]}}}}]}}\n\n')
        lines.append('data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, '
                     '"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        return httpx.Response(200, content="".join(lines).encode(), headers={"content-type": "text/event-stream"})
    content = ", ".join(_entry(t) for t in ANSWER)
    text = ('{"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": '
            f'{json.dumps("".join(ANSWER))}}}, "finish_reason": "stop", "logprobs": {{"content": [{content}]}}}}]}}')
    return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})


def _config(**limits: int) -> ProviderConfig:
    return ProviderConfig(
        name="flood", base_url="http://flood.invalid/v1", model="m", api="chat",
        capabilities=Capabilities(max_top_logprobs=ASKED, streaming=True),
        rate_limits=RateLimits(concurrency=2),
        retry=RetryPolicy(max_attempts=1),
        response_limits=ResponseLimits(**limits),
        timeout_s=30.0,
    )


def _suite(n: int) -> Suite:
    return Suite(name="flood", version="1", description="test", probes=[
        Probe(id=f"p{i}", workload="chat", mode="logprob", messages=[{"role": "user", "content": f"hello {i}"}],
              max_tokens=8, temperature=0.0, top_logprobs=ASKED) for i in range(n)])


@pytest.mark.parametrize("stream", [True, False])
def test_hundred_thousand_alternatives_are_capped_flagged_and_bounded(tmp_path: Path, stream: bool) -> None:
    db = tmp_path / "flood.db"
    store = open_store(f"sqlite:///{db}")
    cfg = _config()
    rid = run_probes(store, cfg, _suite(2), progress=None, transport=httpx.MockTransport(_flood), stream=stream,
                     api_key="")
    with store.session() as s:
        assert q.probe_counts(s, rid) == {"done": 2}
        toks = q.tokens_per_probe(s, rid, status=None)
        assert sum(len(v) for v in toks.values()) == 2 * len(ANSWER)
        for key, rows in toks.items():
            for t in rows:
                assert len(t.top_logprobs) <= ASKED + 1, key
                assert "top_logprobs_excess" in t.anomalies
                # the kept ones are the chosen token and the asked highest ones
                assert [a[0] for a in t.top_logprobs] == [f"w{j}" for j in range(ASKED)]
        for p in q.list_probes(s, rid):
            assert "top_logprobs_excess" in (p.anomalies or [])
        bodies = [len(a.response_text or "") for a in s.scalars(sa.select(ProbeAttempt))]
    raw = len(_flood(httpx.Request("POST", "http://x", json={"stream": stream})).content)
    assert raw > 10_000_000  # each answer is > 10 MB on the wire ...
    cap = stored_body_cap(build_payload("chat", _suite(1).probes[0], cfg, stream=stream), cfg)
    assert cap < 250_000 and max(bodies) <= cap + 200  # ... of which what the request could bring back is stored
    store.close()
    assert db.stat().st_size < 1_000_000  # 2 answers of > 10 MB each: the database stays small
    store = open_store(f"sqlite:///{db}")
    d = logprob_defects(store, rid)
    store.close()
    assert d == {"tokens": {"top_logprobs_excess": 6}, "responses": {"top_logprobs_excess": 2}}


def test_stored_bodies_are_bounded_per_run(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'run.db'}")
    cfg = _config(max_stored_bytes_per_run=65536)
    rid = run_probes(store, cfg, _suite(6), progress=None, transport=httpx.MockTransport(_small_flood), stream=False,
                     api_key="")
    with store.session() as s:
        cap = stored_body_cap(build_payload("chat", _suite(1).probes[0], cfg, stream=False), cfg)
        # the budget is spent by the first body already (each is capped at `cap`), then 4 KiB each
        assert q.stored_body_chars(s, rid) <= cap + 5 * (4096 + 100)
        small = [a for a in s.scalars(sa.select(ProbeAttempt)) if len(a.response_text or "") < 4200]
        assert len(small) >= 4
        assert all("not stored" in (a.response_text or "") for a in small)
    store.close()


def test_unasked_alternatives_are_bounded_too() -> None:
    body = json.loads('{"choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "stop", '
                      f'"logprobs": {{"content": [{_entry("Hi")}]}}}}]}}')
    out = normalize_response("chat", {"temperature": 1.0}, response=body)  # logprobs never asked
    assert len(out.tokens[0].top_logprobs) == 20 and "top_logprobs_excess" in out.anomalies
    asked = normalize_response("chat", {"logprobs": True, "top_logprobs": 3, "temperature": 1.0}, response=body)
    assert len(asked.tokens[0].top_logprobs) == 3  # the chosen token "Hi" is not listed: its place stays empty


def test_within_the_asked_count_nothing_changes() -> None:
    alts = [{"token": t, "logprob": math.log(p)} for t, p in (("b", 0.3), ("a", 0.5), ("c", 0.1))]
    body = {"choices": [{"index": 0, "message": {"content": "a"}, "finish_reason": "stop",
                         "logprobs": {"content": [{"token": "a", "logprob": math.log(0.5), "top_logprobs": alts}]}}]}
    out = normalize_response("chat", {"logprobs": True, "top_logprobs": 2, "temperature": 1.0}, response=body)
    assert [a[0] for a in out.tokens[0].top_logprobs] == ["b", "a", "c"]  # k + 1 (vLLM lists the chosen token)
    assert "top_logprobs_excess" not in out.anomalies


def _bad_logprobs(request: httpx.Request) -> httpx.Response:
    """Three tokens: a NaN chosen logprob, a positive one, an Infinity one (non-strict JSON)."""
    lps = ("NaN", "0.7", "Infinity")
    content = ", ".join(f'{{"token": {json.dumps(t)}, "logprob": {lp}, "bytes": {json.dumps(list(t.encode()))}, '
                        '"top_logprobs": []}' for t, lp in zip(ANSWER, lps, strict=True))
    text = ('{"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": '
            f'{json.dumps("".join(ANSWER))}}}, "finish_reason": "stop", "logprobs": {{"content": [{content}]}}}}]}}')
    return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})


def test_nonfinite_and_positive_logprobs_are_named_in_every_report_format(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'nan.db'}")
    rid = run_probes(store, _config(), _suite(3), progress=None, transport=httpx.MockTransport(_bad_logprobs),
                     stream=False, api_key="")
    d = logprob_defects(store, rid)
    store.close()
    assert d == {"tokens": {"nonfinite_logprob": 6, "positive_logprob": 3},
                 "responses": {"nonfinite_logprob": 3, "positive_logprob": 3}}
    line = logprob_defects_line({"logprob_defects": d})
    assert line is not None
    assert "6 tokens with NaN, ±Infinity or null logprobs (nonfinite_logprob, in 3 responses)" in line
    assert "3 tokens with positive logprobs (positive_logprob, in 3 responses)" in line
    rep = AuditReport(run_id=rid, provider="flood", model="m", verdict="INCONCLUSIVE", verdict_reason="r", alpha=0.05,
                      summary={"logprob_defects": d})
    assert line in render_markdown(rep)
    assert json.loads(render_json(rep))["logprob_defects"] == d
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_junit(rep)).iter("property")}
    assert props["logprob_defects"] == line
    from rich.console import Console

    con = Console(record=True, width=400)
    render_text(rep, console=con)
    assert "6 tokens with NaN, ±Infinity or null logprobs" in con.export_text()
    clean = AuditReport(run_id=rid, provider="flood", model="m", verdict="PASS", verdict_reason="r", alpha=0.05)
    assert logprob_defects_line(clean.summary) is None
    assert "no NaN, infinite, positive or excess values counted" in render_markdown(clean)
