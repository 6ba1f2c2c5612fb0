"""Verdict-change alerts: an ``alerts`` row, a printed line and an optional JSON webhook POST.

An alert is raised when a run's verdict differs from the provider's previous verdict (the newest
earlier non-calibration run that has one; runs that failed without a verdict neither change nor
reset it). The first verdict of a provider is not a change. :func:`record_verdict_change` is
idempotent per run: calling it again for the same run creates no second alert, so a retried or
restarted scheduler never alerts twice for one change.

Webhook: ``POST <url>`` with ``Content-Type: application/json`` and the body of
:func:`alert_payload` (it carries a ``text`` field so Slack/Mattermost-style incoming webhooks
display it as is). Transport errors and HTTP 5xx/429 are retried (tenacity, exponential
back-off); the final HTTP status is stored in ``alerts.webhook_status``. A webhook failure is
recorded, printed and never raises: the audit result is already stored.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    wait_exponential,
)

from auditor.store.models import Alert, AuditRun, utcnow

__all__ = [
    "WEBHOOK_ENV",
    "AlertRecord",
    "alert_payload",
    "post_webhook",
    "previous_verdict",
    "record_verdict_change",
]

#: Environment variable read by ``auditor schedule run`` when ``--webhook`` is not given.
WEBHOOK_ENV = "AUDITOR_WEBHOOK_URL"

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class AlertRecord:
    """A stored alert (plain copy of the ``alerts`` row; ``created_at`` aware UTC)."""

    id: int
    provider_name: str
    run_id: str | None
    previous_verdict: str | None
    verdict: str
    message: str
    created_at: dt.datetime
    delivered: bool
    webhook_status: int | None

    @classmethod
    def from_row(cls, a: Alert) -> AlertRecord:
        return cls(
            id=a.id,
            provider_name=a.provider_name,
            run_id=a.run_id,
            previous_verdict=a.previous_verdict,
            verdict=a.verdict,
            message=a.message,
            created_at=a.created_at,
            delivered=bool(a.delivered),
            webhook_status=a.webhook_status,
        )


def previous_verdict(session: Session, run: AuditRun) -> str | None:
    """The provider's verdict before ``run`` (None when ``run`` is its first verdict).

    "Before" orders by ``started_at`` then run id, over non-calibration runs with a verdict.
    """
    stmt = (
        select(AuditRun.verdict)
        .where(
            AuditRun.provider_name == run.provider_name,
            AuditRun.kind != "calibration",
            AuditRun.verdict.is_not(None),
            AuditRun.id != run.id,
            AuditRun.started_at <= run.started_at,
        )
        .order_by(AuditRun.started_at.desc(), AuditRun.id.desc())
    )
    for v in session.scalars(stmt):
        return v
    return None


def alert_payload(alert: AlertRecord) -> dict[str, Any]:
    """The JSON body POSTed to the webhook.

    Keys: ``event`` (``"verdict_change"``), ``alert_id``, ``provider``, ``run_id``,
    ``previous_verdict``, ``verdict``, ``message``, ``text`` (same as message, for chat
    webhooks) and ``created_at`` (ISO 8601, UTC).
    """
    return {
        "event": "verdict_change",
        "alert_id": alert.id,
        "provider": alert.provider_name,
        "run_id": alert.run_id,
        "previous_verdict": alert.previous_verdict,
        "verdict": alert.verdict,
        "message": alert.message,
        "text": alert.message,
        "created_at": alert.created_at.astimezone(dt.UTC).isoformat(),
    }


def post_webhook(
    url: str,
    payload: dict[str, Any],
    *,
    client: httpx.Client | None = None,
    timeout_s: float = 10.0,
    attempts: int = 3,
    backoff_s: float = 0.5,
) -> tuple[int | None, str | None]:
    """POST ``payload`` as JSON to ``url``; retry transport errors and 429/5xx.

    Args:
        url: the webhook URL (http or https).
        payload: JSON-serialisable body.
        client: an ``httpx.Client`` to use (tests pass a mocked one); default a fresh client.
        timeout_s: per-request timeout, seconds.
        attempts: total tries (≥ 1).
        backoff_s: first back-off wait, seconds (doubles each retry, at most 8 s).

    Returns:
        ``(status, error)``: the last HTTP status (None when no response arrived) and an error
        text (None on a 2xx).
    """
    own = client is None
    http = client or httpx.Client(timeout=timeout_s, follow_redirects=False)
    try:
        retrying = Retrying(
            stop=stop_after_attempt(max(1, attempts)),
            wait=wait_exponential(multiplier=backoff_s, max=8.0),
            retry=retry_if_exception_type(httpx.TransportError)
            | retry_if_result(lambda r: r.status_code in _RETRY_STATUSES),
            reraise=True,
        )
        try:
            response = retrying(http.post, url, json=payload, timeout=timeout_s)
        except RetryError as exc:  # every try answered 429/5xx: report the last status
            response = exc.last_attempt.result()
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"
        if 200 <= response.status_code < 300:
            return response.status_code, None
        return response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"
    finally:
        if own:
            http.close()


def _format_message(run: AuditRun, previous: str) -> str:
    when = run.started_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    reason = (run.verdict_reason or "").strip().replace("\n", " ")
    if len(reason) > 300:
        reason = reason[:297] + "..."
    msg = f"{run.provider_name}: verdict changed {previous} -> {run.verdict} (run {run.id}, {when})"
    return f"{msg}. {reason}" if reason else msg


def record_verdict_change(
    session: Session,
    run_id: str,
    *,
    webhook_url: str | None = None,
    echo: Callable[[str], Any] | None = print,
    client: httpx.Client | None = None,
    now: Callable[[], dt.datetime] = utcnow,
    backoff_s: float = 0.5,
) -> AlertRecord | None:
    """Raise an alert if run ``run_id`` changed its provider's verdict; at most one per run.

    Writes an ``alerts`` row (flushes; the caller commits), prints the message through ``echo``
    and, when ``webhook_url`` is set, POSTs :func:`alert_payload` (see :func:`post_webhook`).
    ``delivered`` is True when no webhook is configured or it answered 2xx.

    Returns:
        The new alert, or None when the run is unknown, has no verdict, is the provider's first
        verdict, keeps the previous verdict, or already has an alert.
    """
    run = session.get(AuditRun, run_id)
    if run is None or not run.verdict or run.kind == "calibration":
        return None
    if session.scalar(select(Alert.id).where(Alert.run_id == run_id).limit(1)) is not None:
        return None
    previous = previous_verdict(session, run)
    if previous is None or previous == run.verdict:
        return None
    alert = Alert(
        provider_name=run.provider_name,
        run_id=run.id,
        previous_verdict=previous,
        verdict=run.verdict,
        message=_format_message(run, previous),
        created_at=now(),
        delivered=webhook_url is None,
        webhook_status=None,
    )
    session.add(alert)
    session.flush()
    if echo is not None:
        echo(f"ALERT {alert.message}")
    if webhook_url:
        status, error = post_webhook(
            webhook_url, alert_payload(AlertRecord.from_row(alert)), client=client, backoff_s=backoff_s
        )
        alert.webhook_status = status
        alert.delivered = error is None
        if error and echo is not None:
            echo(f"webhook POST to {webhook_url} failed: {error}")
        session.flush()
    return AlertRecord.from_row(alert)

