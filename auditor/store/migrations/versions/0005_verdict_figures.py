"""The dashboard's figures stored with each verdict (issue 34): ``verdicts.questions``, ``headline``, ``standing``.

The dashboard may not import the verdict rules (docs/ARCHITECTURE.md, L8), so the buyer's two answers, the
plain headline (as the report renders them) and the provider's standing as of each audit are computed
when a verdict is stored (``auditor.check.stored_figures``) and read back by ``auditor.store.dashboard_queries``.
This revision adds the three nullable columns and backfills every existing verdict row by computing them
with the same code (:func:`auditor.check.stored_figures.backfill`; migrations may import the rules, the dashboard
may not). Downgrade drops the columns (the figures can be recomputed).

The backfill reads the runs through the ORM models of the installed code: a later revision that adds a
column to ``audit_runs``, ``verdicts``, ``detector_results``, ``probes`` or ``probe_attempts`` must keep this
upgrade working from revision 0004 (``tests/store/test_verdict_figures.py`` upgrades such a database to
head and checks the backfill).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 00:30:00+00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``verdicts.questions`` (JSON), ``headline`` (text), ``standing`` (JSON), then backfill them."""
    with op.batch_alter_table("verdicts") as batch:
        batch.add_column(sa.Column("questions", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("headline", sa.Text(), nullable=True))
        batch.add_column(sa.Column("standing", sa.JSON(none_as_null=True), nullable=True))

    from sqlalchemy.orm import Session

    from auditor.check.stored_figures import backfill  # the rules: here only, never in the dashboard

    with Session(bind=op.get_bind()) as session:
        backfill(session)
        session.flush()


def downgrade() -> None:
    """Drop the three columns."""
    with op.batch_alter_table("verdicts") as batch:
        batch.drop_column("standing")
        batch.drop_column("headline")
        batch.drop_column("questions")
