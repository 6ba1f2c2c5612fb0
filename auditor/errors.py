"""Errors of the ``check`` pipeline (``auditor.audit`` and its stages).

Library code raises these with messages in library terms (parameter names such as
``budget_tokens``, never command-line flags); the CLI (``auditor/cli/check.py``,
:func:`auditor.cli.check.word_audit_error`) words them for the command line, using the structured
fields (``parameter``, ``run_id``, ``provider``) to name the flag and the command that continues an
interrupted audit.
"""

from __future__ import annotations

__all__ = ["AuditError", "AuditInterrupted", "NothingToAuditError"]


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
