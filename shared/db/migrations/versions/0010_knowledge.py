"""knowledge: collections, documents, chunks with a generated tsvector (GIN), bookmarks,
and turn_results.knowledge (the chunks an llm agent was given in that turn)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db.base

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "knowledge_collections",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_knowledge_collections_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_knowledge_collections_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_knowledge_collections")),
        sa.UniqueConstraint(
            "organization_id", "name", name=op.f("uq_knowledge_collections_organization_id_name")
        ),
    )
    op.create_table(
        "knowledge_documents",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("collection_id", sa.Uuid(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("mime_type", sa.String(length=64), nullable=False),
        sa.Column("relative_path", sa.String(length=1024), nullable=True),
        sa.Column("title", sa.String(length=255), nullable=True),
        sa.Column("language", sa.String(length=16), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("bytes_ingested", sa.Integer(), nullable=False),
        sa.Column("processing_status", sa.String(length=16), nullable=False),
        sa.Column("processing_progress", sa.Integer(), nullable=False),
        sa.Column("processing_error", sa.Text(), nullable=True),
        sa.Column("processing_attempts", sa.Integer(), nullable=False),
        sa.Column("metadata", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("bookmark_mode", sa.String(length=16), nullable=False),
        sa.Column("usage_description", sa.Text(), nullable=True),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["collection_id"],
            ["knowledge_collections.id"],
            name=op.f("fk_knowledge_documents_collection_id_knowledge_collections"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_knowledge_documents_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_knowledge_documents_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_knowledge_documents")),
    )
    op.create_index(
        "ix_knowledge_documents_collection_created",
        "knowledge_documents",
        ["collection_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_knowledge_documents_org_status",
        "knowledge_documents",
        ["organization_id", "processing_status"],
        unique=False,
    )
    op.create_index(
        "uq_knowledge_documents_ready_path",
        "knowledge_documents",
        ["collection_id", "relative_path"],
        unique=True,
        postgresql_where=sa.text("processing_status = 'ready' AND relative_path IS NOT NULL"),
    )
    op.create_table(
        "knowledge_bookmark_agents",
        sa.Column("document_id", sa.Uuid(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_knowledge_bookmark_agents_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["knowledge_documents.id"],
            name=op.f("fk_knowledge_bookmark_agents_document_id_knowledge_documents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "document_id", "agent_id", name=op.f("pk_knowledge_bookmark_agents")
        ),
    )
    op.create_index(
        "ix_knowledge_bookmark_agents_agent",
        "knowledge_bookmark_agents",
        ["agent_id"],
        unique=False,
    )
    op.create_table(
        "knowledge_chunks",
        sa.Column("document_id", sa.Uuid(), nullable=False),
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("heading_path", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("heading_text", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("search_config", postgresql.REGCONFIG(), nullable=False),
        sa.Column(
            "search_vector",
            postgresql.TSVECTOR(),
            sa.Computed(
                "setweight(to_tsvector(search_config, heading_text), 'A') || setweight(to_tsvector(search_config, content), 'B')",
                persisted=True,
            ),
            nullable=False,
        ),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["knowledge_documents.id"],
            name=op.f("fk_knowledge_chunks_document_id_knowledge_documents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_knowledge_chunks_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_knowledge_chunks")),
        sa.UniqueConstraint(
            "document_id", "position", name=op.f("uq_knowledge_chunks_document_id_position")
        ),
    )
    op.create_index(
        "ix_knowledge_chunks_search",
        "knowledge_chunks",
        ["search_vector"],
        unique=False,
        postgresql_using="gin",
        postgresql_with={"fastupdate": "off"},
    )
    op.add_column(
        "turn_results",
        sa.Column("knowledge", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("turn_results", "knowledge")
    op.drop_index(
        "ix_knowledge_chunks_search", table_name="knowledge_chunks", postgresql_using="gin"
    )
    op.drop_table("knowledge_chunks")
    op.drop_index("ix_knowledge_bookmark_agents_agent", table_name="knowledge_bookmark_agents")
    op.drop_table("knowledge_bookmark_agents")
    op.drop_index(
        "uq_knowledge_documents_ready_path",
        table_name="knowledge_documents",
        postgresql_where=sa.text("processing_status = 'ready' AND relative_path IS NOT NULL"),
    )
    op.drop_index("ix_knowledge_documents_org_status", table_name="knowledge_documents")
    op.drop_index("ix_knowledge_documents_collection_created", table_name="knowledge_documents")
    op.drop_table("knowledge_documents")
    op.drop_table("knowledge_collections")
