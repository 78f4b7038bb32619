"""trigger webhook secret rotation: the previous secret, valid until it expires

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 05:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import shared.db.base

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("triggers", sa.Column("previous_secret_encrypted", sa.Text(), nullable=True))
    op.add_column(
        "triggers",
        sa.Column(
            "previous_secret_expires_at",
            shared.db.base.UTCDateTime(timezone=True),
            nullable=True,
        ),
    )


def downgrade() -> None:
    op.drop_column("triggers", "previous_secret_expires_at")
    op.drop_column("triggers", "previous_secret_encrypted")
