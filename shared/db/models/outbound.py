"""What an organization needs to talk to the outside: allowed domains, credentials,
LLM providers and agents."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from shared.db.base import Base, IdMixin, JSONType, TimestampMixin
from shared.db.checks import not_negative, one_of
from shared.outbound.schemas import AgentKind, AgentProtocol, ProviderKind


class AllowedDomain(IdMixin, TimestampMixin, Base):
    __tablename__ = "allowed_domains"
    __table_args__ = (
        UniqueConstraint("organization_id", "domain"),
        Index("ix_allowed_domains_org_created", "organization_id", "created_at"),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    domain: Mapped[str] = mapped_column(String(255))
    headers: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    query_params: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)


class Credential(IdMixin, TimestampMixin, Base):
    __tablename__ = "credentials"
    __table_args__ = (UniqueConstraint("organization_id", "key"),)

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    key: Mapped[str] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text, default="")
    # Fernet token of the value (shared.crypto); the plaintext is never stored.
    ciphertext: Mapped[str] = mapped_column(Text)


class LLMProvider(IdMixin, TimestampMixin, Base):
    __tablename__ = "llm_providers"
    __table_args__ = (
        Index("ix_llm_providers_org_created", "organization_id", "created_at"),
        # At most one default judge per organization, whatever races to become it.
        Index(
            "uq_llm_providers_default_judge",
            "organization_id",
            unique=True,
            postgresql_where=text("is_default_judge"),
        ),
        # And at most one default simulator.
        Index(
            "uq_llm_providers_default_simulator",
            "organization_id",
            unique=True,
            postgresql_where=text("is_default_simulator"),
        ),
        one_of("provider", ProviderKind),
        not_negative("input_cost_per_mtok", "output_cost_per_mtok", name="costs_not_negative"),
        CheckConstraint("jsonb_typeof(request_options) = 'object'", name="request_options_object"),
        CheckConstraint(
            "provider = 'anthropic' OR anthropic_version IS NULL", name="anthropic_version_kind"
        ),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(255))
    provider: Mapped[str] = mapped_column(String(32))
    base_url: Mapped[str] = mapped_column(String(2048))
    default_model: Mapped[str] = mapped_column(String(255))
    credential_key: Mapped[str | None] = mapped_column(String(128))
    input_cost_per_mtok: Mapped[float | None] = mapped_column(Float)
    output_cost_per_mtok: Mapped[float | None] = mapped_column(Float)
    is_default_judge: Mapped[bool] = mapped_column(Boolean, default=False)
    # The simulated users' provider when a scenario names none (shared.scenarios.runner).
    is_default_simulator: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    # Fields merged into each request body (shared.llm.models); never Spar's own fields.
    request_options: Mapped[dict[str, Any]] = mapped_column(
        JSONType, default=dict, server_default=text("'{}'::jsonb")
    )
    # anthropic only: the anthropic-version header (null for the other kinds).
    anthropic_version: Mapped[str | None] = mapped_column(String(32))


class Agent(IdMixin, TimestampMixin, Base):
    __tablename__ = "agents"
    __table_args__ = (
        Index("ix_agents_org_created", "organization_id", "created_at"),
        one_of("kind", AgentKind),
        one_of("protocol", AgentProtocol),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(Text, default="")
    kind: Mapped[str] = mapped_column(String(16))
    endpoint_url: Mapped[str | None] = mapped_column(String(2048))
    protocol: Mapped[str | None] = mapped_column(String(32))
    llm_provider_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("llm_providers.id"), index=True
    )
    model: Mapped[str | None] = mapped_column(String(255))
    system_prompt: Mapped[str | None] = mapped_column(Text)
    judge_provider_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("llm_providers.id"), index=True
    )
    judge_model: Mapped[str | None] = mapped_column(String(255))
