"""a run's error turn (scenario_runs.error_turn) and the results UI's browser sessions
(user_tokens.browser_session)

A run that ends in error on a turn keeps that turn (JSON: ``turn_index``, the
``user_message`` sent, if any, and the agent's ``response_content``, if it answered
before the error), which is never committed as a turn result.  Null for every existing
run, and for any run not in ``error`` (a CHECK constraint).

A user token the results UI made for one browser is marked ``browser_session``: signing
that browser out revokes it, and never a token that login or register answered (false
for every existing token).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("scenario_runs", sa.Column("error_turn", postgresql.JSONB(), nullable=True))
    # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
    op.execute(
        "ALTER TABLE scenario_runs ADD CONSTRAINT ck_scenario_runs_error_turn_of_error"
        " CHECK (status = 'error' OR error_turn IS NULL)"
    )
    op.add_column(
        "user_tokens",
        sa.Column("browser_session", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("user_tokens", "browser_session")
    op.execute("ALTER TABLE scenario_runs DROP CONSTRAINT ck_scenario_runs_error_turn_of_error")
    op.drop_column("scenario_runs", "error_turn")
