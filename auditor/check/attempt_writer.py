"""The probe stage's attempt writer: every HTTP attempt of a run session stored as it arrives.

:class:`AttemptWriter` is the store side of :mod:`auditor.check.runner`: the runner's event loop hands it
each attempt the client reports (``probes.records.AttemptRecord``) and its methods run on the runner's
single writer thread, one transaction per attempt (the crash-safety contract in
:mod:`auditor.check.runner`'s docstring, points 2 and 3). A probe's final attempt is normalized here, once
(``probes.normalize.normalize_response``), and stored with the probe's status and the run's usage.

Units: characters for the stored raw bodies (``response_limits``), tokens, USD (``ProviderConfig.pricing``).
The API key (``secrets``) is scrubbed from every stored string.
"""

from __future__ import annotations

import logging
from typing import Any

from auditor.store import queries as q
from auditor.store.db import Store

log = logging.getLogger(__name__)

__all__ = ["AttemptWriter"]


def _error_text(rec: Any) -> str | None:
    """``"<error_kind>: detail"`` (the kind first, so summaries can group by it)."""
    if rec.error is None:
        return None
    kind = getattr(rec, "error_kind", None)
    if kind and not str(rec.error).startswith(f"{kind}:"):
        return f"{kind}: {rec.error}"
    return str(rec.error)


class AttemptWriter:
    """Stores attempts and finishes probes for one run session; its methods run on the writer thread.

    Each attempt is one transaction (:meth:`persist`): the attempt row (raw body scrubbed of the key,
    capped per request and per run: ``response_limits``, issue 37 item 11) and, for a probe's final
    attempt, the normalized response, the probe's status and the run's usage (:meth:`finalize`).
    """

    def __init__(self, store: Store, rid: str, config: Any, payloads: dict[str, dict[str, Any]], pending: list[tuple[int, str, int]],
                 secrets: list[str]) -> None:
        from auditor.check.usage_estimate import UsageEstimates
        from probes.wire import stored_body_cap

        self.store, self.rid, self.payloads, self.secrets = store, rid, payloads, secrets
        self.api, self.pricing, self.max_top = config.api, config.pricing, config.capabilities.max_top_logprobs
        self.base_attempts = {key: n for _pid, key, n in pending}
        self.probe_ids = {key: pid for pid, key, _n in pending}
        # raw bodies kept in the store: per attempt what its request can bring back, per run a budget,
        # counted across resumes
        self.body_caps = {key: stored_body_cap(p, config) for key, p in payloads.items()}
        with store.session() as s:
            self.stored_chars = q.stored_body_chars(s, rid)
        self.run_body_budget = config.response_limits.max_stored_bytes_per_run
        self.usage_est = UsageEstimates(config.reference)  # responses without usage: counted, marked estimated

    def finalize(self, s: Any, key: str, rec: Any) -> str:
        """Mark the probe done/failed from its final attempt ``rec`` (same transaction)."""
        from probes.normalize import normalize_response

        pid = self.probe_ids[key]
        if rec.error is not None:
            q.mark_probe_done(s, pid, status="failed", anomalies=[rec.error_kind or "error"])
            return "failed"
        req = self.payloads[key]
        try:
            norm = normalize_response(self.api, req, response_text=rec.response_text, stream=bool(req.get("stream")),
                                      max_top_logprobs=self.max_top)
            tokens, text, finish, anomalies, usage = (
                norm.tokens, norm.text, norm.finish_reason, list(norm.anomalies), norm.usage)
            reasoning, coverage = norm.reasoning, norm.reasoning_coverage
        except Exception as exc:
            log.warning("normalizing %s failed: %s", key, exc)
            tokens, text, finish, usage, reasoning, coverage = [], None, None, None, None, None
            anomalies = [f"normalize_error: {type(exc).__name__}: {q.scrub(str(exc), self.secrets)}"]
        q.mark_probe_done(
            s, pid, status="done", text=text, finish_reason=finish, anomalies=anomalies, usage=usage, tokens=tokens,
            reasoning=reasoning, reasoning_coverage=coverage,
        )
        usage = usage or {}
        pt = int(usage.get("prompt_tokens") or 0)
        ct = int(usage.get("completion_tokens") or len(tokens))
        if not all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
            pt, ct = self.usage_est.get().estimate(req, n_tokens=len(tokens), chunk_tokens=rec.tokens_per_chunk, text=text)
            self.usage_est.missing += 1
        q.add_run_usage(s, self.rid, pt, ct, self.pricing.cost_usd(pt, ct))
        return "done"

    def persist(self, key: str, rec: Any, final: bool) -> str | None:
        """Store one attempt (and finish the probe when ``final``) in one transaction; the probe's outcome
        (``done``/``failed``) when finished, else None."""
        from probes.wire import STORED_EVIDENCE_CHARS, stored_body

        cap = self.body_caps[key] if self.stored_chars < self.run_body_budget else STORED_EVIDENCE_CHARS
        body = stored_body(q.scrub(rec.response_text, self.secrets), cap)
        self.stored_chars += len(body or "")
        with self.store.session() as s:
            q.add_probe_attempt(
                s,
                probe_id=self.probe_ids[key],
                run_id=self.rid,
                attempt_no=self.base_attempts[key] + rec.attempt_no,
                started_at=rec.started_at,
                latency_s=rec.latency_s,
                http_status=rec.http_status,
                error=q.scrub(_error_text(rec), self.secrets),
                response_text=body,
                ttft_s=rec.ttft_s,
                chunk_gaps_s=list(rec.chunk_gaps_s) if rec.ttft_s is not None or rec.chunk_gaps_s else None,
                tokens_per_chunk=list(rec.tokens_per_chunk) if rec.tokens_per_chunk else None,
            )
            return self.finalize(s, key, rec) if final else None

    def finalize_only(self, key: str, rec: Any) -> str:
        """Finish a probe whose client stopped before its final attempt was reported."""
        with self.store.session() as s:
            return self.finalize(s, key, rec)
