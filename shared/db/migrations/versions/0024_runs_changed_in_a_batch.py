"""a batch's runs by when they last changed (ix_scenario_runs_batch_updated)

The results page of a running batch polls each second for the runs changed since its
last look (``?since=``); on a batch of thousands of runs this index reads those runs
instead of every run of the batch.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 02:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_scenario_runs_batch_updated", "scenario_runs", ["batch_run_id", "updated_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_scenario_runs_batch_updated", table_name="scenario_runs")
