"""Verdict-change alerts: rows, idempotence and the JSON webhook (respx mock and a loopback server)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
import respx
from sqlalchemy import select

from auditor.store.models import Alert, AuditRun
from auditor.watch.alerts import alert_payload, post_webhook, previous_verdict, record_verdict_change

from .conftest import T0

HOOK = "https://hooks.example.test/audit"


def _runs(store, verdicts, provider="p"):
    ids = []
    with store.session() as s:
        for k, v in enumerate(verdicts):
            run = AuditRun(
                provider_name=provider, kind="audit", status="completed" if v else "failed", verdict=v,
                verdict_reason=f"reason {k}", started_at=T0 + dt.timedelta(hours=k),
            )  # fmt: skip
            s.add(run)
            s.flush()
            ids.append(run.id)
    return ids


def test_previous_verdict_skips_runs_without_verdict(store):
    ids = _runs(store, ["PASS", None, "QUANTIZATION"])
    with store.session() as s:
        assert previous_verdict(s, s.get(AuditRun, ids[0])) is None
        assert previous_verdict(s, s.get(AuditRun, ids[2])) == "PASS"
        assert record_verdict_change(s, ids[0], echo=None) is None  # first verdict is not a change
        assert record_verdict_change(s, ids[1], echo=None) is None  # no verdict
        assert record_verdict_change(s, "missing", echo=None) is None
        alert = record_verdict_change(s, ids[2], echo=None)
    assert alert is not None and alert.previous_verdict == "PASS" and alert.verdict == "QUANTIZATION"
    assert "p: verdict changed PASS -> QUANTIZATION" in alert.message and "reason 2" in alert.message


def test_other_providers_do_not_count(store):
    _runs(store, ["RELAXED_VERIFICATION"], provider="other")
    ids = _runs(store, ["PASS"])
    with store.session() as s:
        assert record_verdict_change(s, ids[0], echo=None) is None


@respx.mock
def test_webhook_payload_and_status(store):
    route = respx.post(HOOK).mock(return_value=httpx.Response(204))
    ids = _runs(store, ["PASS", "RELAXED_VERIFICATION"])
    with store.session() as s:
        alert = record_verdict_change(s, ids[1], webhook_url=HOOK, echo=None, backoff_s=0)
    assert route.call_count == 1
    body = json.loads(route.calls[0].request.content)
    assert body == alert_payload(alert)
    assert body["event"] == "verdict_change" and body["provider"] == "p"
    assert body["previous_verdict"] == "PASS" and body["verdict"] == "RELAXED_VERIFICATION"
    assert body["run_id"] == ids[1] and body["text"] == body["message"]
    assert route.calls[0].request.headers["content-type"] == "application/json"
    with store.session() as s:
        row = s.scalars(select(Alert)).one()
        assert row.webhook_status == 204 and row.delivered


@respx.mock
def test_webhook_retries_5xx_then_succeeds():
    route = respx.post(HOOK).mock(side_effect=[httpx.Response(503), httpx.Response(200)])
    assert post_webhook(HOOK, {"x": 1}, backoff_s=0) == (200, None)
    assert route.call_count == 2


@respx.mock
def test_webhook_gives_up_after_attempts_and_reports_last_status():
    route = respx.post(HOOK).mock(return_value=httpx.Response(503, text="busy"))
    status, err = post_webhook(HOOK, {"x": 1}, attempts=3, backoff_s=0)
    assert (status, route.call_count) == (503, 3) and "HTTP 503" in err


@respx.mock
def test_webhook_failure_is_recorded_not_raised(store):
    respx.post(HOOK).mock(side_effect=httpx.ConnectError("refused"))
    lines: list[str] = []
    ids = _runs(store, ["PASS", "SUBSTITUTION"])
    with store.session() as s:
        alert = record_verdict_change(s, ids[1], webhook_url=HOOK, echo=lines.append, backoff_s=0)
    assert alert is not None and not alert.delivered and alert.webhook_status is None
    assert any("webhook POST" in line and "ConnectError" in line for line in lines)
    respx.post(HOOK + "/bad").mock(return_value=httpx.Response(400, text="nope"))
    status, err = post_webhook(HOOK + "/bad", {}, backoff_s=0)
    assert status == 400 and "HTTP 400" in err


def test_webhook_to_loopback_server(store, clock):
    """End to end through the scheduler: a real HTTP POST to a server on 127.0.0.1."""
    from auditor.watch.scheduler import AuditScheduler, add_schedule

    from .conftest import FakeRunner

    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers["Content-Length"])
            received.append(json.loads(self.rfile.read(n)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        with store.session() as s:
            add_schedule(s, "sim-int4", 3600, now=clock())
        runner = FakeRunner(clock, verdicts=["PASS", "QUANTIZATION", "QUANTIZATION"])
        sched = AuditScheduler(store, runner=runner, clock=clock, echo=None, webhook_url=url)
        for _ in range(3):
            sched.run_due()
            clock.advance(hours=1)
    finally:
        server.shutdown()
        server.server_close()
    assert len(received) == 1
    assert received[0]["verdict"] == "QUANTIZATION" and received[0]["previous_verdict"] == "PASS"
    with store.session() as s:
        row = s.scalars(select(Alert)).one()
        assert row.webhook_status == 200 and row.delivered


@pytest.mark.parametrize("status", [200, 201, 299])
@respx.mock
def test_any_2xx_is_delivered(status):
    respx.post(HOOK).mock(return_value=httpx.Response(status))
    assert post_webhook(HOOK, {}, backoff_s=0) == (status, None)
