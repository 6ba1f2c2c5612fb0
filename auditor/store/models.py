"""SQLAlchemy 2.0 typed models of the audit database (authoritative schema).

Every table of ``docs/ARCHITECTURE.md`` ("store") lives here; Alembic migrations under
``auditor/store/migrations/versions/`` must match this metadata exactly (the test
``tests/store/test_migrations.py`` runs ``alembic.autogenerate.compare_metadata`` and fails on any
drift). Conventions:

- Timestamps are timezone-aware UTC (:class:`UTCDateTime`; SQLite stores naive UTC, the type adds
  ``tzinfo=UTC`` on the way out and converts aware values to UTC on the way in).
- JSON columns use SQLAlchemy :class:`~sqlalchemy.JSON` (``json`` on PostgreSQL, text on SQLite);
  values must be strict JSON (no NaN/inf — see :func:`auditor.store.queries.json_safe`).
- Integer autoincrement ids everywhere except ``audit_runs.id``: a short uuid4 hex (12 chars),
  shown to users as ``RUN_ID``.
- Durations are seconds (``*_s``), money is USD, token counts are tokens.
- API keys never reach any column: :func:`auditor.store.queries.redact_secrets` strips them from
  config snapshots and the runner never stores request headers.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

#: Constraint names are deterministic so migrations (and SQLite batch mode) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Allowed values of the string "enum" columns (kept as plain strings for portable migrations).
RUN_KINDS = ("audit", "probe", "calibration", "speed")  # speed: auditor.speed (summary = SpeedReport.to_dict())
RUN_STATUSES = ("running", "completed", "failed", "interrupted")
PROBE_MODES = ("greedy", "logprob", "sampling")
PROBE_STATUSES = ("pending", "done", "failed")


def utcnow() -> dt.datetime:
    """Current time, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


def new_run_id() -> str:
    """A fresh ``RUN_ID``: the first 12 hex digits of a uuid4 (48 random bits)."""
    return uuid.uuid4().hex[:12]


class UTCDateTime(TypeDecorator[dt.datetime]):
    """``DateTime(timezone=True)`` that always returns timezone-aware UTC datetimes.

    SQLite has no time zone support, so values are stored as naive UTC and re-labelled as UTC
    when read. Naive values passed in are assumed to already be UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        value = value.astimezone(dt.UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base; ``Base.metadata`` is what Alembic's ``env.py`` imports."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dt.datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[Any]: JSON(),
        bytes: LargeBinary(),
    }


class Provider(Base):
    """A provider as last configured (``providers.toml`` entry, secrets removed)."""

    __tablename__ = "providers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    base_url: Mapped[str] = mapped_column(String(2000))
    model: Mapped[str] = mapped_column(String(500))
    api: Mapped[str] = mapped_column(String(32))  # "chat" | "completions"
    config_json: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    runs: Mapped[list[AuditRun]] = relationship(back_populates="provider")


class AuditRun(Base):
    """One audit, probes-only run or calibration run; ``id`` is the user-facing ``RUN_ID``."""

    __tablename__ = "audit_runs"
    __table_args__ = (
        Index("ix_audit_runs_provider_started", "provider_name", "started_at"),
        Index("ix_audit_runs_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_run_id)
    provider_id: Mapped[int | None] = mapped_column(ForeignKey("providers.id", ondelete="SET NULL"), nullable=True)
    provider_name: Mapped[str] = mapped_column(String(200))
    model: Mapped[str | None] = mapped_column(String(500), nullable=True)
    kind: Mapped[str] = mapped_column(String(32), default="audit")  # RUN_KINDS
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True)
    suite_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    code_version: Mapped[str | None] = mapped_column(String(128), nullable=True)
    reference_model: Mapped[str | None] = mapped_column(String(500), nullable=True)
    reference_revision: Mapped[str | None] = mapped_column(String(128), nullable=True)
    reference_dtype: Mapped[str | None] = mapped_column(String(32), nullable=True)
    config_snapshot: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(32), default="running")  # RUN_STATUSES
    verdict: Mapped[str | None] = mapped_column(String(64), nullable=True)
    verdict_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: why a ``failed`` run failed (one line: the error, or "internal error: <type>: <message>"); None otherwise
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    alpha: Mapped[float | None] = mapped_column(Float, nullable=True)
    budget_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    provider: Mapped[Provider | None] = relationship(back_populates="runs")
    probes: Mapped[list[Probe]] = relationship(back_populates="run", cascade="all, delete-orphan", passive_deletes=True)
    detector_results: Mapped[list[DetectorResultRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )
    verdict_row: Mapped[VerdictRow | None] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class Probe(Base):
    """One planned request of a run: ``probe_key = "{suite_probe_id}#{sample}"`` unique per run.

    ``status`` moves ``pending`` → ``done`` | ``failed`` in the same transaction that stores the
    final attempt, so a crash can neither lose nor duplicate a probe. ``text``, ``finish_reason``,
    ``anomalies`` and ``usage`` summarize the normalized response of the final successful attempt.
    """

    __tablename__ = "probes"
    __table_args__ = (
        UniqueConstraint("run_id", "probe_key", name="uq_probes_run_id_probe_key"),
        Index("ix_probes_run_status", "run_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("audit_runs.id", ondelete="CASCADE"))
    probe_key: Mapped[str] = mapped_column(String(300))
    workload: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mode: Mapped[str | None] = mapped_column(String(32), nullable=True)  # PROBE_MODES
    request_json: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # PROBE_STATUSES
    n_attempts: Mapped[int] = mapped_column(Integer, default=0)
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    anomalies: Mapped[list[Any]] = mapped_column(JSON, default=list)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reasoning: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The reasoning text of a reasoning model's answer (``NormalizedResponse.reasoning``); null when none."""
    reasoning_coverage: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """``both`` | ``answer`` | ``inconsistent`` (``NormalizedResponse.reasoning_coverage``); null when no reasoning."""
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    completed_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)

    run: Mapped[AuditRun] = relationship(back_populates="probes")
    attempts: Mapped[list[ProbeAttempt]] = relationship(
        back_populates="probe",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="ProbeAttempt.attempt_no",
    )
    tokens: Mapped[list[NormalizedToken]] = relationship(
        back_populates="probe",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="NormalizedToken.position",
    )


class ProbeAttempt(Base):
    """One HTTP try of a probe (failures and retries included), persisted as it arrives.

    ``response_text`` is the raw body (for streams: the raw SSE text); request headers are never
    stored. ``latency_s`` is wall time to the last byte (s); ``ttft_s`` time to the first content
    token (s, streams only); ``chunk_gaps_s`` inter-chunk gaps (s); ``tokens_per_chunk`` tokens per
    streamed chunk.
    """

    __tablename__ = "probe_attempts"
    __table_args__ = (
        UniqueConstraint("probe_id", "attempt_no", name="uq_probe_attempts_probe_id_attempt_no"),
        Index("ix_probe_attempts_run_id", "run_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    probe_id: Mapped[int] = mapped_column(ForeignKey("probes.id", ondelete="CASCADE"))
    run_id: Mapped[str] = mapped_column(ForeignKey("audit_runs.id", ondelete="CASCADE"))
    attempt_no: Mapped[int] = mapped_column(Integer)  # 1-based, continues across resumes
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    latency_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    response_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    ttft_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    chunk_gaps_s: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    tokens_per_chunk: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)

    probe: Mapped[Probe] = relationship(back_populates="attempts")


class NormalizedToken(Base):
    """One generated token after normalization (``probes.records.TokenRecord``).

    ``logprob`` is in nats, null when censored/untrustworthy; ``top_logprobs`` is a JSON list of
    ``[token, logprob]``; ``top_logprobs_bytes`` the alternatives' authoritative bytes in the same
    order (lowercase hex strings, null where the normalizer could not recover them; the column is
    null for rows stored before revision 0002), so the evidence stage maps alternatives to
    reference ids without normalizing the response again; ``ref_token_id`` the aligned
    reference-tokenizer id (null when alignment failed — never guessed; written by the analysis'
    final transaction); ``anomalies`` uses the vocabulary of ``shared/cases/README.md``.
    """

    __tablename__ = "normalized_tokens"
    __table_args__ = (UniqueConstraint("probe_id", "position", name="uq_normalized_tokens_probe_id_position"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    probe_id: Mapped[int] = mapped_column(ForeignKey("probes.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    token: Mapped[str] = mapped_column(Text)
    token_bytes: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    logprob: Mapped[float | None] = mapped_column(Float, nullable=True)
    top_logprobs: Mapped[list[Any]] = mapped_column(JSON, default=list)
    top_logprobs_bytes: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    ref_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    anomalies: Mapped[list[Any]] = mapped_column(JSON, default=list)
    span: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """``reasoning`` | ``answer`` (``TokenRecord.span``); null where unknown or for rows before revision 0004."""

    probe: Mapped[Probe] = relationship(back_populates="tokens")


class ReferenceCache(Base):
    """Cached reference results (teacher-forced scores): npz bytes keyed by a sha256 hex.

    ``key`` = sha256 of model revision + dtype + prompt ids + continuation ids + top_k
    (see :func:`auditor.store.queries.reference_cache_key`).
    """

    __tablename__ = "reference_cache"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_revision: Mapped[str] = mapped_column(String(128), index=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class DetectorResultRow(Base):
    """A stored ``auditor.detectors.DetectorResult`` (NaN/inf statistics stored as NULL)."""

    __tablename__ = "detector_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("audit_runs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    statistic: Mapped[float | None] = mapped_column(Float, nullable=True)
    p_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    p_adjusted: Mapped[float | None] = mapped_column(Float, nullable=True)
    effect: Mapped[float | None] = mapped_column(Float, nullable=True)
    effect_ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    effect_ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    n: Mapped[int] = mapped_column(Integer, default=0)
    ran: Mapped[bool] = mapped_column(Boolean, default=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    evidence: Mapped[list[Any]] = mapped_column(JSON, default=list)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    run: Mapped[AuditRun] = relationship(back_populates="detector_results")


class VerdictRow(Base):
    """The verdict of a run (one per run): PASS, QUANTIZATION, RELAXED_VERIFICATION, ..."""

    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("audit_runs.id", ondelete="CASCADE"), unique=True)
    verdict: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: The buyer's two answers as the report renders them (``auditor.verdict.questions``: ``[{"key", "question",
    #: "answer", "evidence"}]``), stored at write time (``auditor.check.stored_figures``, revision 0005) so the
    #: dashboard shows them without the rules; NULL only for a row written before it and not backfilled.
    questions: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    #: The report's plain headline (``auditor.verdict.questions.plain_headline``), stored with ``questions``.
    headline: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: The provider's combined standing as of this audit (``auditor.watch.standing.Standing.to_dict()``, anchored at
    #: this run's start, over the completed audits of its provider and model); NULL for runs that are not
    #: completed audits.
    standing: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)

    run: Mapped[AuditRun] = relationship(back_populates="verdict_row")


class Schedule(Base):
    """A recurring audit: every ``every_seconds`` s, suite ``suite``, ``budget_tokens`` tokens."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    provider_name: Mapped[str] = mapped_column(String(200), index=True)
    every_seconds: Mapped[int] = mapped_column(Integer)
    suite: Mapped[str | None] = mapped_column(String(200), nullable=True)
    budget_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_run_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    next_run_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class Alert(Base):
    """A verdict change worth telling someone about; ``webhook_status`` is the HTTP status of the
    webhook POST (null when not sent or the request failed before a status)."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    provider_name: Mapped[str] = mapped_column(String(200), index=True)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("audit_runs.id", ondelete="SET NULL"), nullable=True)
    previous_verdict: Mapped[str | None] = mapped_column(String(64), nullable=True)
    verdict: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    delivered: Mapped[bool] = mapped_column(Boolean, default=False)
    webhook_status: Mapped[int | None] = mapped_column(Integer, nullable=True)


class CalibrationResult(Base):
    """Measured rejection rate of the audit for one (model, simulator profile, budget) cell,
    with a Clopper–Pearson (or Wilson) interval ``[ci_low, ci_high]``."""

    __tablename__ = "calibration_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(500))
    profile: Mapped[str] = mapped_column(String(200))
    budget_tokens: Mapped[int] = mapped_column(Integer)
    audits: Mapped[int] = mapped_column(Integer)
    rejection_rate: Mapped[float] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    cause_correct_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


#: The metadata Alembic compares against (``auditor/store/migrations/env.py`` imports only this).
metadata = Base.metadata

__all__ = [
    "Alert",
    "AuditRun",
    "Base",
    "CalibrationResult",
    "DetectorResultRow",
    "NormalizedToken",
    "Probe",
    "ProbeAttempt",
    "Provider",
    "ReferenceCache",
    "Schedule",
    "UTCDateTime",
    "VerdictRow",
    "metadata",
    "new_run_id",
    "utcnow",
]
