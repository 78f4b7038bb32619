"""a run's OpenTelemetry trace id (scenario_runs.trace_id)

When tracing is on, each delivery of a run plays in a trace of its own and the run keeps
the latest one's id: 32 lower-case hex digits (a CHECK constraint), null when tracing is
off and for every existing run.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
# 0019-0021 are on other branches: re-chained to the last of them when they are merged.
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("scenario_runs", sa.Column("trace_id", sa.String(length=32), nullable=True))
    # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
    op.execute(
        "ALTER TABLE scenario_runs ADD CONSTRAINT ck_scenario_runs_trace_id_hex"
        " CHECK (trace_id ~ '^[0-9a-f]{32}$')"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE scenario_runs DROP CONSTRAINT ck_scenario_runs_trace_id_hex")
    op.drop_column("scenario_runs", "trace_id")
