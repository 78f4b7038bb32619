"""batch window: a dispatched counter and an index of the runs still to hand out

The window is ``max_concurrency - (dispatched - completed)``: both counters live on the
batch row, which the hand-out locks anyway, so no run has to be counted.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 16:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNDISPATCHED = sa.text("dispatched_at IS NULL")


def upgrade() -> None:
    op.add_column(
        "batch_runs",
        sa.Column(
            "dispatched_scenarios", sa.Integer(), nullable=False, server_default=sa.text("0")
        ),
    )
    op.execute(
        "UPDATE batch_runs SET dispatched_scenarios = (SELECT count(*) FROM scenario_runs"
        " WHERE scenario_runs.batch_run_id = batch_runs.id"
        " AND scenario_runs.dispatched_at IS NOT NULL)"
    )
    op.create_index(
        "ix_scenario_runs_undispatched",
        "scenario_runs",
        ["batch_run_id", "created_at", "id"],
        unique=False,
        postgresql_where=UNDISPATCHED,
    )


def downgrade() -> None:
    op.drop_index("ix_scenario_runs_undispatched", table_name="scenario_runs")
    op.drop_column("batch_runs", "dispatched_scenarios")
