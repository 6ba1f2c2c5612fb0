"""Reasoning responses (issue 35): ``normalized_tokens.span`` and ``probes.reasoning``.

``span`` is the span each generated token belongs to (``reasoning`` / ``answer``, from
``probes.records.TokenRecord.span``); ``reasoning`` the response's reasoning text (``message.
reasoning_content`` / ``reasoning``, streamed deltas, or inline think tags) and
``reasoning_coverage`` what its logprobs covered (``both`` / ``answer`` / ``inconsistent``), so
that the observations stage knows which reasoning responses left their reasoning span uncovered
(excluded as ``reasoning_prefix_unknown``). Rows written before this revision keep NULL (read as plain answers).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05 18:30:00+00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``normalized_tokens.span``, ``probes.reasoning`` and ``probes.reasoning_coverage`` (nullable)."""
    with op.batch_alter_table("normalized_tokens") as batch:
        batch.add_column(sa.Column("span", sa.String(length=16), nullable=True))
    with op.batch_alter_table("probes") as batch:
        batch.add_column(sa.Column("reasoning", sa.Text(), nullable=True))
        batch.add_column(sa.Column("reasoning_coverage", sa.String(length=16), nullable=True))


def downgrade() -> None:
    """Drop the three columns."""
    with op.batch_alter_table("probes") as batch:
        batch.drop_column("reasoning_coverage")
        batch.drop_column("reasoning")
    with op.batch_alter_table("normalized_tokens") as batch:
        batch.drop_column("span")
