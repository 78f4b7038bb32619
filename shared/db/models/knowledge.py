"""Knowledge (DESIGN §5.4): collections of documents, each processed on the workers into
heading-aware chunks indexed for PostgreSQL full-text search, and bookmarked for agents."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Computed,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import REGCONFIG, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from shared.db.base import Base, IdMixin, JSONType, TimestampMixin
from shared.db.checks import in_list, not_negative, one_of
from shared.knowledge.schemas import MIME_TYPES, BookmarkMode, ProcessingStatus


class KnowledgeCollection(IdMixin, TimestampMixin, Base):
    __tablename__ = "knowledge_collections"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str | None] = mapped_column(Text)
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )


class KnowledgeDocument(IdMixin, TimestampMixin, Base):
    __tablename__ = "knowledge_documents"
    __table_args__ = (
        Index("ix_knowledge_documents_collection_created", "collection_id", "created_at"),
        Index("ix_knowledge_documents_org_status", "organization_id", "processing_status"),
        # At most one ready version of a path in a collection: a re-upload replaces the
        # old version in the transaction that makes the new one ready.
        Index(
            "uq_knowledge_documents_ready_path",
            "collection_id",
            "relative_path",
            unique=True,
            postgresql_where=text("processing_status = 'ready' AND relative_path IS NOT NULL"),
        ),
        one_of("processing_status", ProcessingStatus),
        one_of("bookmark_mode", BookmarkMode),
        CheckConstraint(in_list("mime_type", MIME_TYPES), name="mime_type"),
        # A percentage (shared.knowledge.processing).
        CheckConstraint(
            "processing_progress >= 0 AND processing_progress <= 100", name="processing_progress"
        ),
        not_negative("bytes_ingested", "processing_attempts", name="counts_not_negative"),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    collection_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("knowledge_collections.id", ondelete="CASCADE")
    )
    filename: Mapped[str] = mapped_column(String(255))
    mime_type: Mapped[str] = mapped_column(String(64))
    relative_path: Mapped[str | None] = mapped_column(String(1024))
    title: Mapped[str | None] = mapped_column(String(255))
    language: Mapped[str | None] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    bytes_ingested: Mapped[int] = mapped_column(Integer)
    processing_status: Mapped[str] = mapped_column(String(16), default="queued")
    processing_progress: Mapped[int] = mapped_column(Integer, default=0)
    processing_error: Mapped[str | None] = mapped_column(Text)
    processing_attempts: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[datetime | None]  # shared.work
    doc_metadata: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    bookmark_mode: Mapped[str] = mapped_column(String(16), default="none")
    usage_description: Mapped[str | None] = mapped_column(Text)
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )


class KnowledgeBookmarkAgent(Base):
    """An agent a document is bookmarked for; goes with the document or the agent."""

    __tablename__ = "knowledge_bookmark_agents"
    __table_args__ = (Index("ix_knowledge_bookmark_agents_agent", "agent_id"),)

    document_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("knowledge_documents.id", ondelete="CASCADE"), primary_key=True
    )
    agent_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True
    )


class KnowledgeChunk(IdMixin, Base):
    __tablename__ = "knowledge_chunks"
    __table_args__ = (
        UniqueConstraint("document_id", "position"),
        # fastupdate off: a search right after a burst of uploads must not scan a long
        # pending list of unmerged entries (measured: 44 ms instead of 14 at 10,000 chunks).
        Index(
            "ix_knowledge_chunks_search",
            "search_vector",
            postgresql_using="gin",
            postgresql_with={"fastupdate": "off"},
        ),
        not_negative("position"),
    )

    document_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("knowledge_documents.id", ondelete="CASCADE")
    )
    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    position: Mapped[int] = mapped_column(Integer)
    heading_path: Mapped[list[str]] = mapped_column(JSONType, default=list)
    # The heading path as one line ("Refunds > Exceptions"), weighted above the content.
    heading_text: Mapped[str] = mapped_column(Text, default="")
    content: Mapped[str] = mapped_column(Text)
    # The text search configuration of the document's language ('english' when unset).
    search_config: Mapped[str] = mapped_column(REGCONFIG)
    search_vector: Mapped[Any] = mapped_column(
        TSVECTOR,
        Computed(
            "setweight(to_tsvector(search_config, heading_text), 'A')"
            " || setweight(to_tsvector(search_config, content), 'B')",
            persisted=True,
        ),
    )
