"""tool calls: turn_results.tool_calls, criteria.expected_arguments and the tool criteria

A turn result keeps the tools the agent called for its reply (a JSON array, ``[]`` for
every existing turn).  A criterion may be ``tool_called`` or ``tool_not_called``; a
``tool_called`` criterion may carry ``expected_arguments`` (a JSON object; null for every
existing criterion, and for every other type: a CHECK constraint).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TYPES_BEFORE = "'llm_evaluated', 'contains', 'not_contains', 'regex'"
TYPES = f"{TYPES_BEFORE}, 'tool_called', 'tool_not_called'"


def upgrade() -> None:
    op.add_column(
        "turn_results",
        sa.Column(
            "tool_calls", postgresql.JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")
        ),
    )
    op.add_column("criteria", sa.Column("expected_arguments", postgresql.JSONB(), nullable=True))
    # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
    op.execute(
        "ALTER TABLE turn_results ADD CONSTRAINT ck_turn_results_tool_calls_array"
        " CHECK (jsonb_typeof(tool_calls) = 'array')"
    )
    op.execute(
        "ALTER TABLE criteria DROP CONSTRAINT ck_criteria_criteria_type,"
        f" ADD CONSTRAINT ck_criteria_criteria_type CHECK (criteria_type IN ({TYPES})),"
        " ADD CONSTRAINT ck_criteria_expected_arguments_of_tool_called"
        " CHECK (expected_arguments IS NULL OR (criteria_type = 'tool_called'"
        " AND jsonb_typeof(expected_arguments) = 'object'))"
    )


def downgrade() -> None:
    # Criteria of the new types have no older meaning: they go, with their results' rows
    # left to name a criterion that is gone (as when a scenario is edited).
    op.execute("DELETE FROM criteria WHERE criteria_type IN ('tool_called', 'tool_not_called')")
    op.execute(
        "ALTER TABLE criteria DROP CONSTRAINT ck_criteria_expected_arguments_of_tool_called,"
        " DROP CONSTRAINT ck_criteria_criteria_type,"
        f" ADD CONSTRAINT ck_criteria_criteria_type CHECK (criteria_type IN ({TYPES_BEFORE}))"
    )
    op.drop_column("criteria", "expected_arguments")
    op.execute("ALTER TABLE turn_results DROP CONSTRAINT ck_turn_results_tool_calls_array")
    op.drop_column("turn_results", "tool_calls")
