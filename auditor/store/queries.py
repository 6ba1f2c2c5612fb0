"""Query functions of the audit database: plain functions taking a :class:`~sqlalchemy.orm.Session`.

Callers own the transaction (``with store.session() as s: ...``); nothing here commits, except
that functions which must return generated ids flush. Other areas (runner, ``check`` pipeline,
detectors, scheduler, dashboard) use only these functions and the models.

Secrets: :func:`redact_secrets` removes API-key-looking values from anything persisted as a
config snapshot; :func:`scrub` removes known secret strings from free text.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, select, update
from sqlalchemy.orm import Session

from auditor.store.models import (  # ReferenceCache/CalibrationResult: re-exported for callers of q.*
    Alert,
    AuditRun,
    CalibrationResult,  # noqa: F401
    DetectorResultRow,
    NormalizedToken,
    Probe,
    ProbeAttempt,
    Provider,
    ReferenceCache,  # noqa: F401
    VerdictRow,
    new_run_id,
    utcnow,
)

# re-exported: callers keep importing these names from auditor.store.queries
from auditor.store.result_queries import (  # noqa: F401
    REDACTED,
    _get,
    add_calibration_result,
    detector_results_for_run,
    get_verdict,
    list_calibration_results,
    redact_secrets,
    reference_cache_get,
    reference_cache_get_many,
    reference_cache_key,
    reference_cache_put,
    scrub,
    store_detector_results,
    store_verdict,
)
from auditor.util import finite as _finite
from auditor.util import json_safe

# ---------------------------------------------------------------------------------------------
# Providers
# ---------------------------------------------------------------------------------------------


def upsert_provider(
    s: Session,
    name: str,
    *,
    base_url: str,
    model: str,
    api: str = "chat",
    config: Mapping[str, Any] | None = None,
) -> Provider:
    """Insert provider ``name`` or update its fields; ``config`` is stored redacted. Flushes."""
    row = s.scalar(select(Provider).where(Provider.name == name))
    cfg = json_safe(redact_secrets(dict(config or {})))
    if row is None:
        row = Provider(name=name, base_url=base_url, model=model, api=api, config_json=cfg)
        s.add(row)
    else:
        row.base_url, row.model, row.api, row.config_json = base_url, model, api, cfg
        row.updated_at = utcnow()
    s.flush()
    return row


def upsert_provider_config(s: Session, cfg: Any) -> Provider:
    """:func:`upsert_provider` from a ``probes.config.ProviderConfig`` (uses its ``safe_dump``)."""
    dump = cfg.safe_dump() if hasattr(cfg, "safe_dump") else dict(cfg)
    return upsert_provider(
        s, dump["name"], base_url=dump["base_url"], model=dump["model"], api=dump.get("api", "chat"), config=dump
    )


def get_provider_row(s: Session, name: str) -> Provider | None:
    """The stored provider called ``name``, or None."""
    return s.scalar(select(Provider).where(Provider.name == name))


def list_providers(s: Session) -> list[Provider]:
    """All stored providers, by name."""
    return list(s.scalars(select(Provider).order_by(Provider.name)))


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def create_run(
    s: Session,
    *,
    provider_name: str,
    kind: str = "audit",
    run_id: str | None = None,
    provider_id: int | None = None,
    model: str | None = None,
    suite: str | None = None,
    suite_version: str | None = None,
    code_version: str | None = None,
    reference_model: str | None = None,
    reference_revision: str | None = None,
    reference_dtype: str | None = None,
    config_snapshot: Mapping[str, Any] | None = None,
    alpha: float | None = None,
    budget_tokens: int | None = None,
    status: str = "running",
) -> AuditRun:
    """Create an ``audit_runs`` row (status ``running``) and return it; ``config_snapshot`` is
    redacted (:func:`redact_secrets`). When ``provider_id`` is None the provider row of that
    name is linked if it exists. Flushes.

    Raises:
        ValueError: ``kind`` or ``status`` is not one of the allowed values.
    """
    from auditor.store.models import RUN_KINDS, RUN_STATUSES

    if kind not in RUN_KINDS:
        raise ValueError(f"kind={kind!r}: use one of {RUN_KINDS}")
    if status not in RUN_STATUSES:
        raise ValueError(f"status={status!r}: use one of {RUN_STATUSES}")
    if provider_id is None:
        prov = get_provider_row(s, provider_name)
        provider_id = prov.id if prov is not None else None
    run = AuditRun(
        id=run_id or new_run_id(),
        provider_id=provider_id,
        provider_name=provider_name,
        model=model,
        kind=kind,
        suite=suite,
        suite_version=suite_version,
        code_version=code_version,
        reference_model=reference_model,
        reference_revision=reference_revision,
        reference_dtype=reference_dtype,
        config_snapshot=json_safe(redact_secrets(dict(config_snapshot or {}))),
        status=status,
        alpha=alpha,
        budget_tokens=budget_tokens,
        prompt_tokens=0,
        completion_tokens=0,
        cost_usd=0.0,
        started_at=utcnow(),
        summary={},
    )
    s.add(run)
    s.flush()
    return run


def get_run(s: Session, run_id: str) -> AuditRun | None:
    """The run with id ``run_id`` (exact), or None."""
    return s.get(AuditRun, run_id)


def find_run(s: Session, run_id_prefix: str) -> AuditRun | None:
    """The run whose id is ``run_id_prefix`` or uniquely starts with it (like git short shas).

    Raises:
        ValueError: the prefix matches more than one run.
    """
    exact = s.get(AuditRun, run_id_prefix)
    if exact is not None:
        return exact
    rows = list(s.scalars(select(AuditRun).where(AuditRun.id.startswith(run_id_prefix, autoescape=True)).limit(2)))
    if len(rows) > 1:
        raise ValueError(f"run id prefix {run_id_prefix!r} is ambiguous; give more characters")
    return rows[0] if rows else None


def update_run(s: Session, run_id: str, **fields: Any) -> AuditRun:
    """Set columns of run ``run_id`` (e.g. ``status``, ``verdict``, ``summary``, ``reference_revision``).

    JSON fields are made strict-JSON; ``config_snapshot`` is redacted.

    Raises:
        KeyError: no such run.  AttributeError: unknown column name.
    """
    run = s.get(AuditRun, run_id)
    if run is None:
        raise KeyError(f"no run with id {run_id!r}")
    for k, v in fields.items():
        if not hasattr(AuditRun, k):
            raise AttributeError(f"audit_runs has no column {k!r}")
        if k == "config_snapshot":
            v = json_safe(redact_secrets(v))
        elif k == "summary":
            v = json_safe(v)
        setattr(run, k, v)
    s.flush()
    return run


def set_run_status(s: Session, run_id: str, status: str, *, finished: bool | None = None,
                   reason: str | None = None) -> AuditRun:
    """Set ``status``; ``finished_at`` is set for completed/failed/interrupted (or when
    ``finished=True``) and cleared for ``running``. ``failure_reason`` is set to ``reason`` for a
    ``failed`` run (kept when ``reason`` is None) and cleared for every other status."""
    run = update_run(s, run_id, status=status)
    if status != "failed":
        run.failure_reason = None
    elif reason is not None:
        run.failure_reason = reason
    done = status != "running" if finished is None else finished
    run.finished_at = utcnow() if done else None
    s.flush()
    return run


def add_run_usage(s: Session, run_id: str, prompt_tokens: int, completion_tokens: int, cost_usd: float) -> None:
    """Atomically add token counts (tokens) and spend (USD) to a run's running totals.

    Raises:
        KeyError: no such run.
    """
    run = s.get(AuditRun, run_id)
    if run is None:
        raise KeyError(f"no run with id {run_id!r}")
    # SQL expressions: SET x = x + n (atomic); the attributes are reloaded on next access.
    run.prompt_tokens = AuditRun.prompt_tokens + int(prompt_tokens)
    run.completion_tokens = AuditRun.completion_tokens + int(completion_tokens)
    run.cost_usd = AuditRun.cost_usd + float(cost_usd)
    s.flush()


def list_runs(
    s: Session,
    *,
    provider: str | None = None,
    kind: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    verdict: str | Sequence[str] | None = None,
    suite: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    limit: int | None = 100,
    offset: int = 0,
    newest_first: bool = True,
) -> list[AuditRun]:
    """Runs matching every given filter (None = no filter; sequences match any of their values),
    ordered by ``started_at`` (newest first by default)."""

    def _in(col: Any, v: str | Sequence[str]) -> Any:
        return col == v if isinstance(v, str) else col.in_(list(v))

    q = select(AuditRun)
    if provider is not None:
        q = q.where(AuditRun.provider_name == provider)
    if kind is not None:
        q = q.where(_in(AuditRun.kind, kind))
    if status is not None:
        q = q.where(_in(AuditRun.status, status))
    if verdict is not None:
        q = q.where(_in(AuditRun.verdict, verdict))
    if suite is not None:
        q = q.where(AuditRun.suite == suite)
    if since is not None:
        q = q.where(AuditRun.started_at >= since)
    if until is not None:
        q = q.where(AuditRun.started_at < until)
    order = AuditRun.started_at.desc() if newest_first else AuditRun.started_at.asc()
    q = q.order_by(order, AuditRun.id).offset(offset)
    if limit is not None:
        q = q.limit(limit)
    return list(s.scalars(q))


def latest_run_per_provider(
    s: Session, *, kind: str | Sequence[str] | None = "audit", status: str | Sequence[str] | None = "completed"
) -> dict[str, AuditRun]:
    """``{provider_name: newest run}`` among runs of ``kind`` with ``status`` (None = any)."""
    latest: dict[str, AuditRun] = {}
    for run in list_runs(s, kind=kind, status=status, limit=None, newest_first=True):
        latest.setdefault(run.provider_name, run)
    return latest


def find_resumable_run(s: Session, *, provider_name: str, suite: str | None, kind: str = "probe") -> AuditRun | None:
    """The newest run of ``provider_name`` + ``suite`` + ``kind`` that did not finish
    (status ``running`` or ``interrupted``) and still has pending probes, or None."""
    runs = list_runs(s, provider=provider_name, kind=kind, status=("running", "interrupted"), suite=suite, limit=20)
    for run in runs:
        if probe_counts(s, run.id).get("pending", 0) > 0:
            return run
    return None


def delete_run(s: Session, run_id: str) -> bool:
    """Delete a run and everything under it (probes, attempts, tokens, results). True if it existed."""
    run = s.get(AuditRun, run_id)
    if run is None:
        return False
    probe_ids = select(Probe.id).where(Probe.run_id == run_id)
    s.execute(delete(NormalizedToken).where(NormalizedToken.probe_id.in_(probe_ids)))
    s.execute(delete(ProbeAttempt).where(ProbeAttempt.run_id == run_id))
    s.execute(delete(Probe).where(Probe.run_id == run_id))
    s.execute(delete(DetectorResultRow).where(DetectorResultRow.run_id == run_id))
    s.execute(delete(VerdictRow).where(VerdictRow.run_id == run_id))
    s.execute(update(Alert).where(Alert.run_id == run_id).values(run_id=None))
    s.delete(run)
    s.flush()
    return True


# ---------------------------------------------------------------------------------------------
# Probes, attempts, tokens
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedProbe:
    """A probe to insert as ``pending``: ``probe_key = "{suite_probe_id}#{sample}"``."""

    probe_key: str
    request_json: dict[str, Any]
    workload: str | None = None
    mode: str | None = None


def add_planned_probes(s: Session, run_id: str, planned: Iterable[PlannedProbe | Mapping[str, Any]]) -> int:
    """Insert planned probes as ``pending``, skipping keys the run already has. Returns how many
    were inserted. Flushes.

    Raises:
        ValueError: the same ``probe_key`` appears twice in ``planned``.
    """
    planned = list(planned)
    seen: set[str] = set()
    for p in planned:
        key = _get(p, "probe_key")
        if key in seen:
            raise ValueError(f"duplicate probe_key {key!r} in the plan of run {run_id}")
        seen.add(key)
    existing = set(s.scalars(select(Probe.probe_key).where(Probe.run_id == run_id)))
    now = utcnow()
    n = 0
    for p in planned:
        key = _get(p, "probe_key")
        if key in existing:
            continue
        s.add(
            Probe(
                run_id=run_id,
                probe_key=key,
                workload=_get(p, "workload"),
                mode=_get(p, "mode"),
                request_json=json_safe(redact_secrets(_get(p, "request_json") or {})),
                status="pending",
                n_attempts=0,
                anomalies=[],
                created_at=now,
            )
        )
        n += 1
    s.flush()
    return n


def reset_failed_probes(s: Session, run_id: str) -> int:
    """Put a run's ``failed`` probes back to ``pending`` (their attempts are kept; new attempts
    continue the numbering). Returns how many were reset."""
    # an UPDATE returns a CursorResult (which has ``rowcount``); Session.execute is typed as Result
    res = cast(CursorResult[Any], s.execute(
        update(Probe)
        .where(Probe.run_id == run_id, Probe.status == "failed")
        .values(status="pending", completed_at=None, anomalies=[], text=None, finish_reason=None, usage=None)
        .execution_options(synchronize_session="fetch")
    ))
    return int(res.rowcount or 0)


def get_probe(s: Session, run_id: str, probe_key: str) -> Probe | None:
    """The probe ``probe_key`` of run ``run_id``, or None."""
    return s.scalar(select(Probe).where(Probe.run_id == run_id, Probe.probe_key == probe_key))


def list_probes(s: Session, run_id: str, *, status: str | Sequence[str] | None = None) -> list[Probe]:
    """Probes of a run (optionally only those with ``status``), by id (= plan order)."""
    q = select(Probe).where(Probe.run_id == run_id)
    if status is not None:
        q = q.where(Probe.status == status if isinstance(status, str) else Probe.status.in_(list(status)))
    return list(s.scalars(q.order_by(Probe.id)))


def pending_probes(s: Session, run_id: str) -> list[Probe]:
    """Probes of a run still ``pending`` (what a resumed run sends), in plan order."""
    return list_probes(s, run_id, status="pending")


def probe_counts(s: Session, run_id: str) -> dict[str, int]:
    """``{status: count}`` of a run's probes (statuses absent from the run are omitted)."""
    rows = s.execute(select(Probe.status, func.count()).where(Probe.run_id == run_id).group_by(Probe.status))
    return {st: int(n) for st, n in rows}


def next_attempt_no(s: Session, probe_id: int) -> int:
    """1 + the highest stored ``attempt_no`` of the probe (1 for a probe never tried)."""
    cur = s.scalar(select(func.max(ProbeAttempt.attempt_no)).where(ProbeAttempt.probe_id == probe_id))
    return int(cur or 0) + 1


def token_anomaly_counts(s: Session, run_id: str, kinds: Iterable[str]) -> tuple[dict[str, int], dict[str, int]]:
    """For each anomaly kind in ``kinds``: (tokens of ``run_id``'s finished probes flagged with it,
    probes with at least one such token). Kinds never seen are absent from both dicts."""
    wanted = set(kinds)
    tokens: dict[str, int] = {}
    probes: dict[str, set[int]] = {}
    rows = s.execute(select(NormalizedToken.probe_id, NormalizedToken.anomalies)
                     .join(Probe, Probe.id == NormalizedToken.probe_id).where(Probe.run_id == run_id))
    for pid, anomalies in rows:
        for k in set(anomalies or ()) & wanted:
            tokens[k] = tokens.get(k, 0) + 1
            probes.setdefault(k, set()).add(pid)
    return tokens, {k: len(v) for k, v in probes.items()}


def stored_body_chars(s: Session, run_id: str) -> int:
    """Characters of raw response bodies stored for ``run_id`` so far (all attempts; 0 when none),
    the figure ``response_limits.max_stored_bytes_per_run`` bounds."""
    n = s.scalar(select(func.coalesce(func.sum(func.length(ProbeAttempt.response_text)), 0))
                 .where(ProbeAttempt.run_id == run_id))
    return int(n or 0)


def add_probe_attempt(
    s: Session,
    *,
    probe_id: int,
    run_id: str,
    attempt_no: int | None = None,
    started_at: dt.datetime | None = None,
    latency_s: float | None = None,
    http_status: int | None = None,
    error: str | None = None,
    response_text: str | None = None,
    ttft_s: float | None = None,
    chunk_gaps_s: Sequence[float] | None = None,
    tokens_per_chunk: Sequence[int] | None = None,
) -> ProbeAttempt:
    """Store one HTTP try of a probe and bump ``probes.n_attempts``. ``attempt_no`` defaults to
    :func:`next_attempt_no`. Times in seconds. Flushes (the unique (probe_id, attempt_no)
    constraint rejects a duplicate)."""
    if attempt_no is None:
        attempt_no = next_attempt_no(s, probe_id)
    row = ProbeAttempt(
        probe_id=probe_id,
        run_id=run_id,
        attempt_no=attempt_no,
        started_at=started_at or utcnow(),
        latency_s=_finite(latency_s),
        http_status=http_status,
        error=error,
        response_text=response_text,
        ttft_s=_finite(ttft_s),
        chunk_gaps_s=json_safe(list(chunk_gaps_s)) if chunk_gaps_s is not None else None,
        tokens_per_chunk=json_safe(list(tokens_per_chunk)) if tokens_per_chunk is not None else None,
    )
    s.add(row)
    probe = s.get(Probe, probe_id)
    if probe is not None:
        probe.n_attempts = Probe.n_attempts + 1  # SET n_attempts = n_attempts + 1 (atomic)
    s.flush()
    return row


def token_row_values(rec: Any, position: int | None = None) -> dict[str, Any]:
    """Column values of a ``normalized_tokens`` row from a ``probes.records.TokenRecord`` (or an
    equivalent mapping). ``top_logprobs`` becomes ``[[token, logprob], ...]`` and
    ``top_logprobs_bytes`` the alternatives' bytes as hex (None where unknown)."""
    tops = []
    tops_bytes: list[str | None] = []
    for alt in _get(rec, "top_logprobs", None) or []:
        if isinstance(alt, Mapping):
            tops.append([alt.get("token"), _finite(alt.get("logprob"))])
            ab = alt.get("bytes")
        else:
            alt = list(alt)
            tops.append([alt[0], _finite(alt[-1]) if len(alt) > 1 else None])
            ab = alt[1] if len(alt) > 2 else None
        tops_bytes.append(bytes(ab).hex() if isinstance(ab, (bytes, bytearray, list)) else None)
    raw = _get(rec, "bytes", None)
    if raw is None:
        raw = _get(rec, "token_bytes", None)
    if isinstance(raw, list):
        raw = bytes(raw)
    return {
        "position": int(position if position is not None else _get(rec, "index", _get(rec, "position", 0))),
        "token": _get(rec, "token", "") or "",
        "token_bytes": raw,
        "logprob": _finite(_get(rec, "logprob", None)),
        "top_logprobs": json_safe(tops),
        "top_logprobs_bytes": tops_bytes,
        "ref_token_id": _get(rec, "ref_token_id", None),
        "anomalies": json_safe(list(_get(rec, "anomalies", None) or [])),
        "span": _span(_get(rec, "span", None)),
    }


def _span(v: Any) -> str | None:
    """A token's span label as stored: ``reasoning`` | ``answer``, anything else None."""
    return v if v in ("reasoning", "answer") else None


def mark_probe_done(
    s: Session,
    probe_id: int,
    *,
    status: str = "done",
    text: str | None = None,
    finish_reason: str | None = None,
    anomalies: Sequence[str] | None = None,
    usage: Mapping[str, Any] | None = None,
    tokens: Iterable[Any] = (),
    reasoning: str | None = None,
    reasoning_coverage: str | None = None,
) -> Probe:
    """Finish a probe: set ``status`` (``done`` or ``failed``), the response summary and its
    normalized tokens (replacing any stored before). Call in the same transaction as the final
    :func:`add_probe_attempt` so the two commit together. ``reasoning``/``reasoning_coverage``:
    a reasoning model's reasoning text and what its logprobs covered
    (``probes.records.NormalizedResponse``), None for a plain answer.

    Raises:
        ValueError: ``status`` is not done/failed.  KeyError: no such probe.
    """
    if status not in ("done", "failed"):
        raise ValueError(f"status={status!r}: a finished probe is 'done' or 'failed'")
    probe = s.get(Probe, probe_id)
    if probe is None:
        raise KeyError(f"no probe with id {probe_id}")
    s.execute(delete(NormalizedToken).where(NormalizedToken.probe_id == probe_id))
    rows = [NormalizedToken(probe_id=probe_id, **token_row_values(t, i)) for i, t in enumerate(tokens)]
    s.add_all(rows)
    probe.status = status
    probe.text = text
    probe.finish_reason = finish_reason
    probe.anomalies = json_safe(list(anomalies or []))
    probe.usage = json_safe(dict(usage)) if usage is not None else None
    probe.reasoning = reasoning
    probe.reasoning_coverage = reasoning_coverage
    probe.completed_at = utcnow()
    s.flush()
    return probe


def set_ref_token_ids(s: Session, probe_id: int, ref_ids: Sequence[int | None]) -> None:
    """Store aligned reference-tokenizer ids (``ref_ids[position]``; None = alignment failed)."""
    toks = {t.position: t for t in s.scalars(select(NormalizedToken).where(NormalizedToken.probe_id == probe_id))}
    for pos, rid in enumerate(ref_ids):
        if pos in toks:
            toks[pos].ref_token_id = None if rid is None else int(rid)
    s.flush()


def set_aligned_ref_token_ids(s: Session, aligned: Iterable[tuple[int, Sequence[int | None]]]) -> None:
    """:func:`set_ref_token_ids` for every ``(probe_id, ref_ids)`` row (the analysis' final transaction)."""
    for probe_id, ref_ids in aligned:
        set_ref_token_ids(s, probe_id, ref_ids)


def attempts_for_probe(s: Session, probe_id: int) -> list[ProbeAttempt]:
    """Every stored try of a probe, by ``attempt_no``."""
    return list(
        s.scalars(select(ProbeAttempt).where(ProbeAttempt.probe_id == probe_id).order_by(ProbeAttempt.attempt_no))
    )


def tokens_for_probe(s: Session, probe_id: int) -> list[NormalizedToken]:
    """Normalized tokens of one probe, by position."""
    return list(
        s.scalars(
            select(NormalizedToken).where(NormalizedToken.probe_id == probe_id).order_by(NormalizedToken.position)
        )
    )


def tokens_per_probe(s: Session, run_id: str, *, status: str | None = "done") -> dict[str, list[NormalizedToken]]:
    """``{probe_key: [NormalizedToken by position]}`` for a run's probes (``done`` ones by default)."""
    q = (
        select(Probe.probe_key, NormalizedToken)
        .join(NormalizedToken, NormalizedToken.probe_id == Probe.id)
        .where(Probe.run_id == run_id)
        .order_by(Probe.id, NormalizedToken.position)
    )
    if status is not None:
        q = q.where(Probe.status == status)
    out: dict[str, list[NormalizedToken]] = {}
    for key, tok in s.execute(q):
        out.setdefault(key, []).append(tok)
    return out


# ---------------------------------------------------------------------------------------------
# Run detail
# ---------------------------------------------------------------------------------------------


@dataclass
class RunDetail:
    """Everything the report/dashboard shows about one run."""

    run: AuditRun
    probe_counts: dict[str, int]
    n_probes: int
    n_attempts: int
    n_retries: int  # attempts beyond the first of each probe
    n_failed_attempts: int  # attempts with an error or a non-2xx status
    n_tokens: int
    http_status_counts: dict[str, int]
    detector_results: list[DetectorResultRow] = field(default_factory=list)
    verdict: VerdictRow | None = None


def run_detail(s: Session, run_id: str) -> RunDetail | None:
    """Aggregate view of run ``run_id`` (None if absent)."""
    run = s.get(AuditRun, run_id)
    if run is None:
        return None
    counts = probe_counts(s, run_id)
    n_probes = sum(counts.values())
    n_attempts = int(s.scalar(select(func.count()).select_from(ProbeAttempt).where(ProbeAttempt.run_id == run_id)) or 0)
    tried = int(
        s.scalar(select(func.count()).select_from(Probe).where(Probe.run_id == run_id, Probe.n_attempts > 0)) or 0
    )
    failed = int(
        s.scalar(
            select(func.count())
            .select_from(ProbeAttempt)
            .where(
                ProbeAttempt.run_id == run_id,
                (ProbeAttempt.error.is_not(None))
                | (ProbeAttempt.http_status.is_(None))
                | (ProbeAttempt.http_status >= 300),
            )
        )
        or 0
    )
    n_tokens = int(
        s.scalar(
            select(func.count())
            .select_from(NormalizedToken)
            .join(Probe, NormalizedToken.probe_id == Probe.id)
            .where(Probe.run_id == run_id)
        )
        or 0
    )
    status_rows = s.execute(
        select(ProbeAttempt.http_status, func.count())
        .where(ProbeAttempt.run_id == run_id)
        .group_by(ProbeAttempt.http_status)
    )
    http_counts = {("none" if st is None else str(st)): int(n) for st, n in status_rows}
    dets = list(
        s.scalars(select(DetectorResultRow).where(DetectorResultRow.run_id == run_id).order_by(DetectorResultRow.id))
    )
    verdict = s.scalar(select(VerdictRow).where(VerdictRow.run_id == run_id))
    return RunDetail(
        run=run,
        probe_counts=counts,
        n_probes=n_probes,
        n_attempts=n_attempts,
        n_retries=n_attempts - tried,
        n_failed_attempts=failed,
        n_tokens=n_tokens,
        http_status_counts=http_counts,
        detector_results=dets,
        verdict=verdict,
    )
