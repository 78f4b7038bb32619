"""repetitions and baselines: batch_runs.repetitions, baseline_batch_id and comparison;
triggers.repetitions

A batch runs each of its scenarios ``repetitions`` times (1 to 20; 1 for every existing
batch, which ran each once). ``baseline_batch_id`` names the batch it is compared with (a
batch of the same organization and agent; NULL for every existing batch), and
``comparison`` holds that comparison once the batch has completed (JSON, stored once;
NULL until then). A partial index finds the completed batches whose comparison is due.

A ``batch_run`` trigger's batches run each scenario ``repetitions`` times (1 for every
existing trigger).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "batch_runs",
        sa.Column("repetitions", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.add_column("batch_runs", sa.Column("baseline_batch_id", sa.Uuid(), nullable=True))
    op.add_column(
        "batch_runs",
        sa.Column("comparison", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_foreign_key(
        "fk_batch_runs_baseline_batch_id_batch_runs",
        "batch_runs",
        "batch_runs",
        ["baseline_batch_id"],
        ["id"],
        ondelete="SET NULL",
    )
    # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
    op.execute(
        "ALTER TABLE batch_runs ADD CONSTRAINT ck_batch_runs_repetitions_in_range"
        " CHECK (repetitions >= 1 AND repetitions <= 20)"
    )
    op.create_index(
        "ix_batch_runs_comparison_due",
        "batch_runs",
        ["id"],
        postgresql_where=sa.text("baseline_batch_id IS NOT NULL AND comparison IS NULL"),
    )
    op.add_column(
        "triggers",
        sa.Column("repetitions", sa.Integer(), nullable=False, server_default=sa.text("1")),
    )
    op.execute(
        "ALTER TABLE triggers ADD CONSTRAINT ck_triggers_repetitions_in_range"
        " CHECK (repetitions >= 1 AND repetitions <= 20)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE triggers DROP CONSTRAINT ck_triggers_repetitions_in_range")
    op.drop_column("triggers", "repetitions")
    op.drop_index("ix_batch_runs_comparison_due", table_name="batch_runs")
    op.execute("ALTER TABLE batch_runs DROP CONSTRAINT ck_batch_runs_repetitions_in_range")
    op.drop_constraint(
        "fk_batch_runs_baseline_batch_id_batch_runs", "batch_runs", type_="foreignkey"
    )
    op.drop_column("batch_runs", "comparison")
    op.drop_column("batch_runs", "baseline_batch_id")
    op.drop_column("batch_runs", "repetitions")
