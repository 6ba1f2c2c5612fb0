"""Initial schema: every table of docs/ARCHITECTURE.md (store).

Revision ID: 0001
Revises:
Create Date: 2026-11-29 10:08:13.725491+00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "calibration_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("profile", sa.String(length=200), nullable=False),
        sa.Column("budget_tokens", sa.Integer(), nullable=False),
        sa.Column("audits", sa.Integer(), nullable=False),
        sa.Column("rejection_rate", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("cause_correct_rate", sa.Float(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration_results")),
    )
    op.create_table(
        "providers",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("base_url", sa.String(length=2000), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("api", sa.String(length=32), nullable=False),
        sa.Column("config_json", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_providers")),
        sa.UniqueConstraint("name", name=op.f("uq_providers_name")),
    )
    op.create_table(
        "reference_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("model_revision", sa.String(length=128), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_reference_cache")),
    )
    op.create_index(op.f("ix_reference_cache_model_revision"), "reference_cache", ["model_revision"], unique=False)

    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("provider_name", sa.String(length=200), nullable=False),
        sa.Column("every_seconds", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=200), nullable=True),
        sa.Column("budget_tokens", sa.Integer(), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
    )
    op.create_index(op.f("ix_schedules_provider_name"), "schedules", ["provider_name"], unique=False)

    op.create_table(
        "audit_runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("provider_id", sa.Integer(), nullable=True),
        sa.Column("provider_name", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("suite", sa.String(length=200), nullable=True),
        sa.Column("suite_version", sa.String(length=64), nullable=True),
        sa.Column("code_version", sa.String(length=128), nullable=True),
        sa.Column("reference_model", sa.String(length=500), nullable=True),
        sa.Column("reference_revision", sa.String(length=128), nullable=True),
        sa.Column("reference_dtype", sa.String(length=32), nullable=True),
        sa.Column("config_snapshot", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("verdict", sa.String(length=64), nullable=True),
        sa.Column("verdict_reason", sa.Text(), nullable=True),
        sa.Column("alpha", sa.Float(), nullable=True),
        sa.Column("budget_tokens", sa.Integer(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["provider_id"], ["providers.id"], name=op.f("fk_audit_runs_provider_id_providers"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_runs")),
    )
    op.create_index("ix_audit_runs_provider_started", "audit_runs", ["provider_name", "started_at"], unique=False)
    op.create_index("ix_audit_runs_status", "audit_runs", ["status"], unique=False)

    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("provider_name", sa.String(length=200), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=True),
        sa.Column("previous_verdict", sa.String(length=64), nullable=True),
        sa.Column("verdict", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered", sa.Boolean(), nullable=False),
        sa.Column("webhook_status", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_alerts_run_id_audit_runs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index(op.f("ix_alerts_provider_name"), "alerts", ["provider_name"], unique=False)

    op.create_table(
        "detector_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("statistic", sa.Float(), nullable=True),
        sa.Column("p_value", sa.Float(), nullable=True),
        sa.Column("p_adjusted", sa.Float(), nullable=True),
        sa.Column("effect", sa.Float(), nullable=True),
        sa.Column("effect_ci_low", sa.Float(), nullable=True),
        sa.Column("effect_ci_high", sa.Float(), nullable=True),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("ran", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_detector_results_run_id_audit_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_detector_results")),
    )
    op.create_index(op.f("ix_detector_results_run_id"), "detector_results", ["run_id"], unique=False)

    op.create_table(
        "probes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("probe_key", sa.String(length=300), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=True),
        sa.Column("mode", sa.String(length=32), nullable=True),
        sa.Column("request_json", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n_attempts", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("finish_reason", sa.String(length=64), nullable=True),
        sa.Column("anomalies", sa.JSON(), nullable=False),
        sa.Column("usage", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_probes_run_id_audit_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probes")),
        sa.UniqueConstraint("run_id", "probe_key", name="uq_probes_run_id_probe_key"),
    )
    op.create_index("ix_probes_run_status", "probes", ["run_id", "status"], unique=False)

    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("verdict", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_verdicts_run_id_audit_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_verdicts")),
        sa.UniqueConstraint("run_id", name=op.f("uq_verdicts_run_id")),
    )
    op.create_table(
        "normalized_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("probe_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("token_bytes", sa.LargeBinary(), nullable=True),
        sa.Column("logprob", sa.Float(), nullable=True),
        sa.Column("top_logprobs", sa.JSON(), nullable=False),
        sa.Column("ref_token_id", sa.Integer(), nullable=True),
        sa.Column("anomalies", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["probe_id"], ["probes.id"], name=op.f("fk_normalized_tokens_probe_id_probes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_normalized_tokens")),
        sa.UniqueConstraint("probe_id", "position", name="uq_normalized_tokens_probe_id_position"),
    )
    op.create_table(
        "probe_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("probe_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("response_text", sa.Text(), nullable=True),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("chunk_gaps_s", sa.JSON(), nullable=True),
        sa.Column("tokens_per_chunk", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["probe_id"], ["probes.id"], name=op.f("fk_probe_attempts_probe_id_probes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["audit_runs.id"], name=op.f("fk_probe_attempts_run_id_audit_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_attempts")),
        sa.UniqueConstraint("probe_id", "attempt_no", name="uq_probe_attempts_probe_id_attempt_no"),
    )
    op.create_index("ix_probe_attempts_run_id", "probe_attempts", ["run_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_probe_attempts_run_id", table_name="probe_attempts")

    op.drop_table("probe_attempts")
    op.drop_table("normalized_tokens")
    op.drop_table("verdicts")
    op.drop_index("ix_probes_run_status", table_name="probes")

    op.drop_table("probes")
    op.drop_index(op.f("ix_detector_results_run_id"), table_name="detector_results")

    op.drop_table("detector_results")
    op.drop_index(op.f("ix_alerts_provider_name"), table_name="alerts")

    op.drop_table("alerts")
    op.drop_index("ix_audit_runs_status", table_name="audit_runs")
    op.drop_index("ix_audit_runs_provider_started", table_name="audit_runs")

    op.drop_table("audit_runs")
    op.drop_index(op.f("ix_schedules_provider_name"), table_name="schedules")

    op.drop_table("schedules")
    op.drop_index(op.f("ix_reference_cache_model_revision"), table_name="reference_cache")

    op.drop_table("reference_cache")
    op.drop_table("providers")
    op.drop_table("calibration_results")
