"""judge trust: batch_runs.judge_trust; calibrations.criterion_places, the judge it
measured and an index to find an agent's latest calibrations

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 05:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "batch_runs",
        sa.Column("judge_trust", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column(
        "calibrations",
        sa.Column(
            "criterion_places",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )
    op.add_column("calibrations", sa.Column("judge_provider_id", sa.Uuid(), nullable=True))
    op.add_column("calibrations", sa.Column("judge_model", sa.String(length=255), nullable=True))
    op.create_index(
        "ix_calibrations_agent_completed",
        "calibrations",
        ["agent_id", "completed_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_calibrations_agent_completed", table_name="calibrations")
    op.drop_column("calibrations", "judge_model")
    op.drop_column("calibrations", "judge_provider_id")
    op.drop_column("calibrations", "criterion_places")
    op.drop_column("batch_runs", "judge_trust")
