"""scenarios, runs and results

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 06:19:49.304195
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db.base

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scenario_runs",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("scenario_id", sa.Uuid(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("completed_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("session_id", sa.String(length=64), nullable=True),
        sa.Column(
            "cost_summary",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column(
            "snapshot",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_scenario_runs_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_scenario_runs_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scenario_runs")),
    )
    op.create_index(op.f("ix_scenario_runs_agent_id"), "scenario_runs", ["agent_id"], unique=False)
    op.create_index(
        "ix_scenario_runs_org_created",
        "scenario_runs",
        ["organization_id", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_scenario_runs_scenario_id"), "scenario_runs", ["scenario_id"], unique=False
    )
    op.create_index(
        "ix_scenario_runs_status_updated", "scenario_runs", ["status", "updated_at"], unique=False
    )
    op.create_table(
        "scenarios",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column(
            "tags",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column(
            "customer_context",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_scenarios_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_scenarios_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scenarios")),
    )
    op.create_index(
        "ix_scenarios_org_created", "scenarios", ["organization_id", "created_at"], unique=False
    )
    op.create_table(
        "scenario_turns",
        sa.Column("scenario_id", sa.Uuid(), nullable=False),
        sa.Column("order_index", sa.Integer(), nullable=False),
        sa.Column("user_message", sa.Text(), nullable=False),
        sa.Column("required", sa.Boolean(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["scenario_id"],
            ["scenarios.id"],
            name=op.f("fk_scenario_turns_scenario_id_scenarios"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scenario_turns")),
        sa.UniqueConstraint(
            "scenario_id", "order_index", name=op.f("uq_scenario_turns_scenario_id_order_index")
        ),
    )
    op.create_table(
        "turn_results",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("user_message", sa.Text(), nullable=False),
        sa.Column("response_content", sa.Text(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("stopped_early", sa.Boolean(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["scenario_runs.id"],
            name=op.f("fk_turn_results_run_id_scenario_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turn_results")),
        sa.UniqueConstraint("run_id", "turn_index", name=op.f("uq_turn_results_run_id_turn_index")),
    )
    op.create_table(
        "criteria",
        sa.Column("turn_id", sa.Uuid(), nullable=False),
        sa.Column("order_index", sa.Integer(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("criteria_type", sa.String(length=32), nullable=False),
        sa.Column(
            "few_shot_examples",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["scenario_turns.id"],
            name=op.f("fk_criteria_turn_id_scenario_turns"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_criteria")),
        sa.UniqueConstraint("turn_id", "order_index", name=op.f("uq_criteria_turn_id_order_index")),
    )
    op.create_table(
        "criterion_results",
        sa.Column("turn_result_id", sa.Uuid(), nullable=False),
        sa.Column("criteria_id", sa.Uuid(), nullable=False),
        sa.Column("order_index", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(length=8), nullable=False),
        sa.Column("critique", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["turn_result_id"],
            ["turn_results.id"],
            name=op.f("fk_criterion_results_turn_result_id_turn_results"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_criterion_results")),
        sa.UniqueConstraint(
            "turn_result_id",
            "criteria_id",
            name=op.f("uq_criterion_results_turn_result_id_criteria_id"),
        ),
    )


def downgrade() -> None:
    op.drop_table("criterion_results")
    op.drop_table("criteria")
    op.drop_table("turn_results")
    op.drop_table("scenario_turns")
    op.drop_index("ix_scenarios_org_created", table_name="scenarios")
    op.drop_table("scenarios")
    op.drop_index("ix_scenario_runs_status_updated", table_name="scenario_runs")
    op.drop_index(op.f("ix_scenario_runs_scenario_id"), table_name="scenario_runs")
    op.drop_index("ix_scenario_runs_org_created", table_name="scenario_runs")
    op.drop_index(op.f("ix_scenario_runs_agent_id"), table_name="scenario_runs")
    op.drop_table("scenario_runs")
