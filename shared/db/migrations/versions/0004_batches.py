"""batch runs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 06:38:55.013706
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db.base

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batch_runs",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("agent_name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=False),
        sa.Column("total_scenarios", sa.Integer(), nullable=False),
        sa.Column("completed_scenarios", sa.Integer(), nullable=False),
        sa.Column("passed_scenarios", sa.Integer(), nullable=False),
        sa.Column("failed_scenarios", sa.Integer(), nullable=False),
        sa.Column("error_scenarios", sa.Integer(), nullable=False),
        sa.Column("started_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("completed_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_batch_runs_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_batch_runs_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_runs")),
    )
    op.create_index(
        "ix_batch_runs_org_created", "batch_runs", ["organization_id", "created_at"], unique=False
    )
    op.create_index("ix_batch_runs_status", "batch_runs", ["status"], unique=False)
    op.add_column("scenario_runs", sa.Column("batch_run_id", sa.Uuid(), nullable=True))
    op.add_column(
        "scenario_runs",
        sa.Column("dispatched_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_scenario_runs_batch_status", "scenario_runs", ["batch_run_id", "status"], unique=False
    )
    op.create_foreign_key(
        op.f("fk_scenario_runs_batch_run_id_batch_runs"),
        "scenario_runs",
        "batch_runs",
        ["batch_run_id"],
        ["id"],
        ondelete="CASCADE",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("fk_scenario_runs_batch_run_id_batch_runs"), "scenario_runs", type_="foreignkey"
    )
    op.drop_index("ix_scenario_runs_batch_status", table_name="scenario_runs")
    op.drop_column("scenario_runs", "dispatched_at")
    op.drop_column("scenario_runs", "batch_run_id")
    op.drop_index("ix_batch_runs_status", table_name="batch_runs")
    op.drop_index("ix_batch_runs_org_created", table_name="batch_runs")
    op.drop_table("batch_runs")
