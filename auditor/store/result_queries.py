"""Sanitizing helpers and the result-side queries of the audit database: detector results,
verdicts, the reference cache and calibration results.

Split out of :mod:`auditor.store.queries` (which re-exports every public name here, so callers
keep importing from there). Same conventions: plain functions taking a
:class:`~sqlalchemy.orm.Session`; callers own the transaction; functions returning generated ids flush.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from auditor.store.models import (
    AuditRun,
    CalibrationResult,
    DetectorResultRow,
    ReferenceCache,
    VerdictRow,
    utcnow,
)
from auditor.util import finite as _finite
from auditor.util import json_safe

# ---------------------------------------------------------------------------------------------
# Sanitizing helpers
# ---------------------------------------------------------------------------------------------

_SECRET_KEY_RE = re.compile(
    r"(api[_-]?key|secret|password|passwd|authorization|bearer|access[_-]?token|credential|cookie)",
    re.IGNORECASE,
)
REDACTED = "[REDACTED]"


def redact_secrets(obj: Any) -> Any:
    """A deep copy of ``obj`` with the values of secret-looking keys replaced by ``[REDACTED]``.

    A key is secret-looking when its name contains api_key, secret, password, authorization,
    bearer, access_token, credential or cookie — except names ending in ``_env`` (those hold the
    *name* of an environment variable, e.g. ``api_key_env``, which is safe to keep).
    """
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            ks = str(k)
            if _SECRET_KEY_RE.search(ks) and not ks.lower().endswith("_env") and v not in (None, ""):
                out[ks] = REDACTED
            else:
                out[ks] = redact_secrets(v)
        return out
    if isinstance(obj, list | tuple):
        return [redact_secrets(v) for v in obj]
    return obj


def scrub(text: str | None, secrets: Iterable[str | None]) -> str | None:
    """``text`` with every occurrence of each non-empty secret replaced by ``[REDACTED]``."""
    if text is None:
        return None
    for sec in secrets:
        if sec:
            text = text.replace(sec, REDACTED)
    return text


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


# ---------------------------------------------------------------------------------------------
# Detector results and verdicts
# ---------------------------------------------------------------------------------------------


def store_detector_results(
    s: Session, run_id: str, results: Iterable[Any], *, replace: bool = True
) -> list[DetectorResultRow]:
    """Store ``auditor.detectors.DetectorResult`` records (or mappings with the same fields).
    With ``replace`` the run's earlier results are deleted first. Non-finite numbers become NULL."""
    if replace:
        s.execute(delete(DetectorResultRow).where(DetectorResultRow.run_id == run_id))
    rows = []
    for r in results:
        ci = _get(r, "effect_ci", None) or (_get(r, "effect_ci_low", None), _get(r, "effect_ci_high", None))
        rows.append(
            DetectorResultRow(
                run_id=run_id,
                name=str(_get(r, "name")),
                statistic=_finite(_get(r, "statistic")),
                p_value=_finite(_get(r, "p_value")),
                p_adjusted=_finite(_get(r, "p_adjusted")),
                effect=_finite(_get(r, "effect")),
                effect_ci_low=_finite(ci[0]) if ci else None,
                effect_ci_high=_finite(ci[1]) if ci else None,
                n=int(_get(r, "n", 0) or 0),
                ran=bool(_get(r, "ran", True)),
                reason=_get(r, "reason"),
                evidence=json_safe(list(_get(r, "evidence", None) or [])),
                details=json_safe(dict(_get(r, "details", None) or {})),
            )
        )
    s.add_all(rows)
    s.flush()
    return rows


def store_verdict(
    s: Session, run_id: str, verdict: str, reason: str | None = None, details: Mapping[str, Any] | None = None
) -> VerdictRow:
    """Insert or replace the run's verdict and mirror it on ``audit_runs.verdict/verdict_reason``.

    Replacing a verdict clears the figures stored with the old one (``questions``, ``headline``, ``standing``):
    the dashboard then says "not stored" until :func:`store_verdict_figures` stores the new ones, never the
    old verdict's answers beside the new verdict."""
    row = s.scalar(select(VerdictRow).where(VerdictRow.run_id == run_id))
    det = json_safe(dict(details or {}))
    if row is None:
        row = VerdictRow(run_id=run_id, verdict=verdict, reason=reason, details=det, created_at=utcnow())
        s.add(row)
    else:
        row.verdict, row.reason, row.details, row.created_at = verdict, reason, det, utcnow()
        row.questions = row.headline = row.standing = None
    s.execute(
        update(AuditRun)
        .where(AuditRun.id == run_id)
        .values(verdict=verdict, verdict_reason=reason)
        .execution_options(synchronize_session="fetch")
    )
    s.flush()
    return row


def store_verdict_figures(
    s: Session,
    run_id: str,
    *,
    questions: Sequence[Mapping[str, Any]] | None = None,
    headline: str | None = None,
    standing: Mapping[str, Any] | None = None,
) -> VerdictRow:
    """Store the figures the dashboard shows with the run's verdict (issue 34: computed at write time by
    ``auditor.check.stored_figures``, never by the store): the buyer's two answers and the plain headline as the
    report renders them, and the provider's standing as of this run. Arguments left None are not changed.

    Raises:
        ValueError: the run has no stored verdict yet (store it first with :func:`store_verdict`).
    """
    row = s.scalar(select(VerdictRow).where(VerdictRow.run_id == run_id))
    if row is None:
        raise ValueError(f"run {run_id!r} has no stored verdict: store the verdict before its figures")
    if questions is not None:
        row.questions = json_safe([dict(q) for q in questions])
    if headline is not None:
        row.headline = str(headline)
    if standing is not None:
        row.standing = json_safe(dict(standing))
    s.flush()
    return row


def get_verdict(s: Session, run_id: str) -> VerdictRow | None:
    """The stored verdict of a run, or None."""
    return s.scalar(select(VerdictRow).where(VerdictRow.run_id == run_id))


def detector_results_for_run(s: Session, run_id: str) -> list[DetectorResultRow]:
    """Stored detector results of a run, in insertion order."""
    return list(
        s.scalars(select(DetectorResultRow).where(DetectorResultRow.run_id == run_id).order_by(DetectorResultRow.id))
    )


# ---------------------------------------------------------------------------------------------
# Reference cache
# ---------------------------------------------------------------------------------------------


def reference_cache_key(
    model_revision: str, dtype: str, prompt_ids: Sequence[int], continuation_ids: Sequence[int], top_k: int
) -> str:
    """sha256 hex of (model revision, dtype, prompt ids, continuation ids, top_k) — the
    ``reference_cache.key`` of a teacher-forced scoring result."""
    blob = json.dumps(
        [str(model_revision), str(dtype), [int(i) for i in prompt_ids], [int(i) for i in continuation_ids], int(top_k)],
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def reference_cache_get(s: Session, key: str) -> bytes | None:
    """Cached payload (npz bytes) for ``key``, or None."""
    row = s.get(ReferenceCache, key)
    return None if row is None else bytes(row.payload)


def reference_cache_get_many(s: Session, keys: Sequence[str]) -> dict[str, bytes]:
    """``{key: payload}`` for the keys present in the cache."""
    out: dict[str, bytes] = {}
    keys = list(dict.fromkeys(keys))
    for i in range(0, len(keys), 500):
        for row in s.scalars(select(ReferenceCache).where(ReferenceCache.key.in_(keys[i : i + 500]))):
            out[row.key] = bytes(row.payload)
    return out


def reference_cache_put(s: Session, key: str, model_revision: str, payload: bytes) -> None:
    """Insert or overwrite the cached payload for ``key``."""
    row = s.get(ReferenceCache, key)
    if row is None:
        s.add(ReferenceCache(key=key, model_revision=model_revision, payload=bytes(payload), created_at=utcnow()))
    else:
        row.model_revision, row.payload, row.created_at = model_revision, bytes(payload), utcnow()
    s.flush()


# ---------------------------------------------------------------------------------------------
# Calibration results (schedules: auditor.watch.scheduler; alerts: auditor.watch.alerts)
# ---------------------------------------------------------------------------------------------


def add_calibration_result(s: Session, **fields: Any) -> CalibrationResult:
    """Store one calibration cell (columns of :class:`CalibrationResult`). Flushes."""
    fields.setdefault("created_at", utcnow())
    fields["details"] = json_safe(fields.get("details") or {})
    for k in ("rejection_rate", "ci_low", "ci_high", "cause_correct_rate"):
        if k in fields:
            fields[k] = _finite(fields[k])
    row = CalibrationResult(**fields)
    s.add(row)
    s.flush()
    return row


def list_calibration_results(
    s: Session, *, model: str | None = None, profile: str | None = None
) -> list[CalibrationResult]:
    """Calibration cells, optionally filtered, ordered by model, profile, budget."""
    q = select(CalibrationResult)
    if model is not None:
        q = q.where(CalibrationResult.model == model)
    if profile is not None:
        q = q.where(CalibrationResult.profile == profile)
    return list(
        s.scalars(
            q.order_by(
                CalibrationResult.model,
                CalibrationResult.profile,
                CalibrationResult.budget_tokens,
                CalibrationResult.id,
            )
        )
    )
