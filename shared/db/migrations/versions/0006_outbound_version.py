"""organizations.outbound_version: moves with every change to what runs call out with

Workers cache an organization's agent, LLM providers, credentials and allowed domains
under this version, so a run never re-reads them while nothing changed, and never uses
them once something did.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "organizations",
        sa.Column("outbound_version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("organizations", "outbound_version")
