"""units of work: deliveries counted on runs, a heartbeat on runs, trigger executions,
documents and calibrations; the credential keys redacted out of a turn's reply; at most
one default judge per organization

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db.base

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HEARTBEATS = ("scenario_runs", "trigger_executions", "knowledge_documents", "calibrations")


def upgrade() -> None:
    op.add_column(
        "scenario_runs",
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "turn_results",
        sa.Column(
            "redacted_keys",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
    )
    for table in _HEARTBEATS:
        op.add_column(
            table,
            sa.Column("heartbeat_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        )
    # Races could leave several default judges; the oldest is the one runs used.
    op.execute(
        """
        UPDATE llm_providers p SET is_default_judge = false
        WHERE p.is_default_judge AND EXISTS (
            SELECT 1 FROM llm_providers o
            WHERE o.organization_id = p.organization_id AND o.is_default_judge
              AND (o.created_at, o.id) < (p.created_at, p.id)
        )
        """
    )
    op.create_index(
        "uq_llm_providers_default_judge",
        "llm_providers",
        ["organization_id"],
        unique=True,
        postgresql_where=sa.text("is_default_judge"),
    )


def downgrade() -> None:
    op.drop_index(
        "uq_llm_providers_default_judge",
        table_name="llm_providers",
        postgresql_where=sa.text("is_default_judge"),
    )
    for table in _HEARTBEATS:
        op.drop_column(table, "heartbeat_at")
    op.drop_column("turn_results", "redacted_keys")
    op.drop_column("scenario_runs", "attempts")
