"""audit_runs.failure_reason: why a failed run failed, shown by ``auditor report`` and the dashboard.

Before this revision a run that ended in an error was stored ``failed`` with no reason (issue 37,
item 1: a crash looked like an audit that found nothing to report). Rows written before it keep NULL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 14:00:00+00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``audit_runs.failure_reason`` (text, nullable)."""
    with op.batch_alter_table("audit_runs") as batch:
        batch.add_column(sa.Column("failure_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop ``audit_runs.failure_reason``."""
    with op.batch_alter_table("audit_runs") as batch:
        batch.drop_column("failure_reason")
