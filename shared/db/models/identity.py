"""Users, their tokens, organizations, roles, memberships and platform tokens."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from shared.db.base import Base, IdMixin, JSONType, TimestampMixin, utcnow
from shared.db.checks import not_negative, one_of
from shared.identity.schemas import UserStatus


class User(IdMixin, TimestampMixin, Base):
    __tablename__ = "users"
    __table_args__ = (one_of("status", UserStatus),)

    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(255))
    first_name: Mapped[str] = mapped_column(String(100), default="")
    last_name: Mapped[str] = mapped_column(String(100), default="")
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    # "active" once the user has a password; "invited" while only an invitation exists.
    status: Mapped[str] = mapped_column(String(16), default="active")
    invited_at: Mapped[datetime | None]


class UserToken(IdMixin, Base):
    __tablename__ = "user_tokens"

    user_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # A session the results UI made for one browser (signing that browser out revokes it);
    # false for the tokens login and register answer.
    browser_session: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class Organization(IdMixin, TimestampMixin, Base):
    __tablename__ = "organizations"
    __table_args__ = (not_negative("outbound_version"),)

    name: Mapped[str] = mapped_column(String(255))
    business_information: Mapped[str] = mapped_column(Text, default="")
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    created_by_user_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("users.id", ondelete="RESTRICT"), index=True
    )
    owner_user_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("users.id", ondelete="RESTRICT"), index=True
    )
    # Moves with every change to the organization's agents, LLM providers, credentials and
    # allowed domains: workers cache what a run needs to call out under this version.
    outbound_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))


class Role(IdMixin, TimestampMixin, Base):
    __tablename__ = "roles"
    __table_args__ = (UniqueConstraint("organization_id", "name"),)

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(100))
    is_system: Mapped[bool] = mapped_column(Boolean, default=False)
    permissions: Mapped[list[str]] = mapped_column(JSONType, default=list)


class Membership(IdMixin, Base):
    __tablename__ = "memberships"
    __table_args__ = (
        UniqueConstraint("organization_id", "user_id"),
        Index("ix_memberships_user_id", "user_id"),
        Index("ix_memberships_role_id", "role_id"),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    role_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("roles.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    user: Mapped[User] = relationship(lazy="raise")
    role: Mapped[Role] = relationship(lazy="raise")
    organization: Mapped[Organization] = relationship(lazy="raise")


class PlatformToken(IdMixin, TimestampMixin, Base):
    __tablename__ = "platform_tokens"
    __table_args__ = (Index("ix_platform_tokens_org_created", "organization_id", "created_at"),)

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(255))
    permissions: Mapped[list[str]] = mapped_column(JSONType, default=list)
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    token_preview: Mapped[str] = mapped_column(String(32))
    expires_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
