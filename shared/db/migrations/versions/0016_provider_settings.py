"""today's providers: llm_providers.request_options and anthropic_version, turn_results.refusal

A provider's ``request_options`` (a JSON object, ``{}`` for every existing provider) are
merged into each request body; ``anthropic_version`` is the ``anthropic-version`` header
of an ``anthropic`` provider (existing ones get the version Spar sent until now,
``2023-06-01``) and null for the other kinds.  A turn result's ``refusal`` marks a reply
that is the model's refusal (false for every existing turn).  Both rules on providers are
CHECK constraints too.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "llm_providers",
        sa.Column(
            "request_options",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'{}'::jsonb"),
        ),
    )
    op.add_column("llm_providers", sa.Column("anthropic_version", sa.String(32), nullable=True))
    op.execute(
        "UPDATE llm_providers SET anthropic_version = '2023-06-01' WHERE provider = 'anthropic'"
    )
    # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
    op.execute(
        "ALTER TABLE llm_providers"
        " ADD CONSTRAINT ck_llm_providers_request_options_object"
        " CHECK (jsonb_typeof(request_options) = 'object'),"
        " ADD CONSTRAINT ck_llm_providers_anthropic_version_kind"
        " CHECK (provider = 'anthropic' OR anthropic_version IS NULL)"
    )
    op.add_column(
        "turn_results",
        sa.Column("refusal", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("turn_results", "refusal")
    op.execute(
        "ALTER TABLE llm_providers DROP CONSTRAINT ck_llm_providers_anthropic_version_kind,"
        " DROP CONSTRAINT ck_llm_providers_request_options_object"
    )
    op.drop_column("llm_providers", "anthropic_version")
    op.drop_column("llm_providers", "request_options")
