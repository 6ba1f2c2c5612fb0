"""normalized_tokens.top_logprobs_bytes: the alternatives' bytes, so each response is normalized once.

The runner stores every ``probes.records.TokenRecord`` field the later stages need; before this
revision the alternatives' bytes were dropped and the audit normalized the raw body a second time.
Rows written before it keep NULL (the evidence stage then falls back to the alternatives' UTF-8).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 18:20:00+00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``normalized_tokens.top_logprobs_bytes`` (JSON list of hex strings or nulls, nullable)."""
    with op.batch_alter_table("normalized_tokens") as batch:
        batch.add_column(sa.Column("top_logprobs_bytes", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop ``normalized_tokens.top_logprobs_bytes``."""
    with op.batch_alter_table("normalized_tokens") as batch:
        batch.drop_column("top_logprobs_bytes")
