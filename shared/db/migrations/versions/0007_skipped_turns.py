"""turn_results.skipped: the turns a failed required turn left unplayed

A run stopped by a required turn records the turns after it as skipped, in the same
statement as its end, so a run's results list every turn of its snapshot.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "turn_results",
        sa.Column("skipped", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("turn_results", "skipped")
