"""judge votes and replay: batch_runs.judge_repetitions and replay_of;
scenario_runs.judge_repetitions and replay_of_run_id; criterion_results.votes

A batch judges each ``llm_evaluated`` criterion ``judge_repetitions`` times (1 to 5; 1 for
every existing batch and run) and keeps the majority verdict with its ``votes``
(``{"PASS": a, "FAIL": b}``; NULL for a deterministic check and for every existing
result). A run carries its batch's ``judge_repetitions``, so a resumed run judges the same.

A replay (``replay_of``: the batch it replays) re-judges the stored transcripts of another
batch's runs: each of its runs names the run whose transcript it re-judges
(``replay_of_run_id``, a plain id: a run whose source is gone ends in error). Both are NULL
for every existing batch and run; ``replay_of`` is set to NULL when its batch is deleted.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("batch_runs", "scenario_runs"):
        op.add_column(
            table,
            sa.Column(
                "judge_repetitions", sa.Integer(), nullable=False, server_default=sa.text("1")
            ),
        )
        # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_judge_repetitions_in_range"
            " CHECK (judge_repetitions >= 1 AND judge_repetitions <= 5)"
        )
    op.add_column("batch_runs", sa.Column("replay_of", sa.Uuid(), nullable=True))
    op.create_foreign_key(
        "fk_batch_runs_replay_of_batch_runs",
        "batch_runs",
        "batch_runs",
        ["replay_of"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_index(
        "ix_batch_runs_replay_of",
        "batch_runs",
        ["replay_of"],
        postgresql_where=sa.text("replay_of IS NOT NULL"),
    )
    # A plain id, like scenario_id: a replay's run that outlives its source ends in error
    # saying so, never plays as a run that calls the agent.
    op.add_column("scenario_runs", sa.Column("replay_of_run_id", sa.Uuid(), nullable=True))
    op.add_column(
        "criterion_results",
        sa.Column("votes", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("criterion_results", "votes")
    op.drop_column("scenario_runs", "replay_of_run_id")
    op.drop_index("ix_batch_runs_replay_of", table_name="batch_runs")
    op.drop_constraint("fk_batch_runs_replay_of_batch_runs", "batch_runs", type_="foreignkey")
    op.drop_column("batch_runs", "replay_of")
    for table in ("scenario_runs", "batch_runs"):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_judge_repetitions_in_range")
        op.drop_column(table, "judge_repetitions")
