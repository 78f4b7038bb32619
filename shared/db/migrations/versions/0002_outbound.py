"""outbound: allowed domains, credentials, llm providers, agents

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 06:08:41.106817
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db.base

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "allowed_domains",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("domain", sa.String(length=255), nullable=False),
        sa.Column(
            "headers",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column(
            "query_params",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
        ),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_allowed_domains_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allowed_domains")),
        sa.UniqueConstraint(
            "organization_id", "domain", name=op.f("uq_allowed_domains_organization_id_domain")
        ),
    )
    op.create_index(
        "ix_allowed_domains_org_created",
        "allowed_domains",
        ["organization_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "credentials",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("ciphertext", sa.Text(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_credentials_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credentials")),
        sa.UniqueConstraint(
            "organization_id", "key", name=op.f("uq_credentials_organization_id_key")
        ),
    )
    op.create_table(
        "llm_providers",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("base_url", sa.String(length=2048), nullable=False),
        sa.Column("default_model", sa.String(length=255), nullable=False),
        sa.Column("credential_key", sa.String(length=128), nullable=True),
        sa.Column("input_cost_per_mtok", sa.Float(), nullable=True),
        sa.Column("output_cost_per_mtok", sa.Float(), nullable=True),
        sa.Column("is_default_judge", sa.Boolean(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_llm_providers_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_llm_providers")),
    )
    op.create_index(
        "ix_llm_providers_org_created",
        "llm_providers",
        ["organization_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "agents",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("endpoint_url", sa.String(length=2048), nullable=True),
        sa.Column("protocol", sa.String(length=32), nullable=True),
        sa.Column("llm_provider_id", sa.Uuid(), nullable=True),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("judge_provider_id", sa.Uuid(), nullable=True),
        sa.Column("judge_model", sa.String(length=255), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["judge_provider_id"],
            ["llm_providers.id"],
            name=op.f("fk_agents_judge_provider_id_llm_providers"),
        ),
        sa.ForeignKeyConstraint(
            ["llm_provider_id"],
            ["llm_providers.id"],
            name=op.f("fk_agents_llm_provider_id_llm_providers"),
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_agents_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
    )
    op.create_index(
        op.f("ix_agents_judge_provider_id"), "agents", ["judge_provider_id"], unique=False
    )
    op.create_index(op.f("ix_agents_llm_provider_id"), "agents", ["llm_provider_id"], unique=False)
    op.create_index(
        "ix_agents_org_created", "agents", ["organization_id", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_agents_org_created", table_name="agents")
    op.drop_index(op.f("ix_agents_llm_provider_id"), table_name="agents")
    op.drop_index(op.f("ix_agents_judge_provider_id"), table_name="agents")
    op.drop_table("agents")
    op.drop_index("ix_llm_providers_org_created", table_name="llm_providers")
    op.drop_table("llm_providers")
    op.drop_table("credentials")
    op.drop_index("ix_allowed_domains_org_created", table_name="allowed_domains")
    op.drop_table("allowed_domains")
