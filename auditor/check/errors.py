"""Errors of the ``check`` pipeline (``auditor.check.pipeline`` and its stages).

Library code raises these with messages in library terms (parameter names such as
``budget_tokens``, never command-line flags); the CLI (``auditor/cli/check.py``,
:func:`auditor.cli.check.word_audit_error`) words them for the command line, using the structured
fields (``parameter``, ``run_id``, ``provider``) to name the flag and the command that continues an
interrupted audit.
"""

from __future__ import annotations

import datetime as dt
import os
import traceback
from pathlib import Path

__all__ = [
    "ENV_LOG_DIR",
    "INTERNAL_ERROR_EXIT",
    "AuditError",
    "AuditInterrupted",
    "NothingToAuditError",
    "error_log_dir",
    "failure_reason",
    "write_error_log",
]

#: Exit code of a command that ended in an unexpected error (a bug, not a finding about the provider):
#: never 0-3, so CI cannot read a crash as PASS (0), a deviation (1), INCONCLUSIVE (2) or a usage error (3).
INTERNAL_ERROR_EXIT = 4
#: Environment variable naming the directory of error logs (overrides ``$SPEC_AUDITOR_HOME/logs``).
ENV_LOG_DIR = "SPEC_AUDITOR_LOG_DIR"
#: Longest failure reason stored with a run (characters).
_MAX_REASON = 500


class AuditError(RuntimeError):
    """An audit cannot start or finish for a reason the user can fix (config, suite, database,
    connection, budget, reference model).

    Attributes:
        exit_code: the CLI exit code (3).
        parameter: the ``run_check``/``CheckOptions`` field at fault (e.g. ``budget_tokens``,
            ``alpha``, ``suite``), or None when the cause is not a parameter.
        run_id: the stored run the problem happened in (it can be resumed), or None.
        provider: the provider name, or None.
    """

    def __init__(
        self,
        message: str,
        exit_code: int = 3,
        *,
        parameter: str | None = None,
        run_id: str | None = None,
        provider: str | None = None,
    ):
        super().__init__(message)
        self.exit_code = exit_code
        self.parameter = parameter
        self.run_id = run_id
        self.provider = provider


class NothingToAuditError(AuditError):
    """A run produced no usable response (no probe succeeded, or none returned a token); the run is
    stored, and once the provider is fixed it can be continued (``run_id``)."""


class AuditInterrupted(KeyboardInterrupt):
    """Ctrl-C/SIGTERM during an audit; ``run_id`` is the run to continue with ``resume`` (None if
    it was interrupted before the run was created)."""

    def __init__(self, run_id: str | None):
        super().__init__(run_id)
        self.run_id = run_id


def failure_reason(exc: BaseException) -> str:
    """One line saying why a run failed, stored as ``audit_runs.failure_reason``: an :class:`AuditError`'s own
    message, else ``"internal error: <type>: <message>"`` (first line, at most 500 characters)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = first if isinstance(exc, AuditError) else f"internal error: {type(exc).__name__}: {first}".rstrip(": ")
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def error_log_dir() -> Path:
    """Where error logs go: ``$SPEC_AUDITOR_LOG_DIR``, else ``$SPEC_AUDITOR_HOME/logs``, else the platformdirs
    user log directory of ``spec-auditor``."""
    if os.environ.get(ENV_LOG_DIR):
        return Path(os.environ[ENV_LOG_DIR])
    if os.environ.get("SPEC_AUDITOR_HOME"):
        return Path(os.environ["SPEC_AUDITOR_HOME"]) / "logs"
    import platformdirs

    return Path(platformdirs.user_log_dir("spec-auditor"))


def write_error_log(exc: BaseException, command: str) -> Path | None:
    """Write ``exc``'s traceback (with the command and the time, UTC) to a new file in :func:`error_log_dir`.

    Returns:
        The file, or None when it could not be written (the caller then says so and suggests ``--debug``).
    """
    now = dt.datetime.now(dt.UTC)
    try:
        d = error_log_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"internal-error-{now:%Y%m%dT%H%M%S.%f}-{os.getpid()}.log"
        text = "".join(traceback.format_exception(exc))
        path.write_text(f"spec-auditor internal error in `{command}` at {now.isoformat()}\n\n{text}", encoding="utf-8")
    except OSError:
        return None
    return path
