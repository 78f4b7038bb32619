"""Notifications (DESIGN §5.13): an organization's webhook endpoints, the events that happened
to it (an outbox, written in the transaction that made each happen) and one delivery per
event and endpoint subscribed to it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from shared.db.base import Base, IdMixin, JSONType, TimestampMixin
from shared.db.checks import not_negative, one_of
from shared.notifications.schemas import DeliveryStatus, EventStatus, EventType


class WebhookEndpoint(IdMixin, TimestampMixin, Base):
    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_org_created", "organization_id", "created_at"),)

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSONType)
    description: Mapped[str] = mapped_column(Text, default="")
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    # The Standard Webhooks secret (``whsec_…``) deliveries are signed with.
    secret_encrypted: Mapped[str] = mapped_column(Text)
    # The first failed attempt since the last delivery that succeeded: 24 hours of
    # failures from it disable the endpoint (``disabled_reason``, ``disabled_at``).
    failing_since: Mapped[datetime | None]
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    disabled_at: Mapped[datetime | None]
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )


class NotificationEvent(IdMixin, TimestampMixin, Base):
    __tablename__ = "notification_events"
    __table_args__ = (
        # Once per subject: an event recorded twice (a retried source) is recorded once.
        UniqueConstraint("type", "subject_id"),
        Index("ix_notification_events_status_updated", "status", "updated_at"),
        one_of("type", EventType),
        one_of("status", EventStatus),
        not_negative("attempts"),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    type: Mapped[str] = mapped_column(String(64))
    # What it happened to: a batch run, a trigger execution, a calibration.
    subject_id: Mapped[uuid.UUID]
    status: Mapped[str] = mapped_column(String(16), default="pending")
    # The envelope's ``data``, built once (as it is announced, or by its source).
    data: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[datetime | None]  # shared.work
    completed_at: Mapped[datetime | None]


class WebhookDelivery(IdMixin, TimestampMixin, Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # One delivery per event and endpoint; a redelivery sends the same one again.
        UniqueConstraint("event_id", "endpoint_id"),
        Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at"),
        Index("ix_webhook_deliveries_status_updated", "status", "updated_at"),
        one_of("status", DeliveryStatus),
        one_of("event_type", EventType),
        not_negative("attempts"),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    event_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("notification_events.id", ondelete="CASCADE")
    )
    event_type: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    # Attempts of this round (a redelivery starts a new round at 0).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the next attempt is due; null once the delivery has ended.
    next_attempt_at: Mapped[datetime | None]
    # The end of this round's 24 hours of retries.
    retry_until: Mapped[datetime]
    last_attempt_at: Mapped[datetime | None]
    last_response_code: Mapped[int | None] = mapped_column(Integer)
    last_response_body: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    heartbeat_at: Mapped[datetime | None]  # shared.work
    completed_at: Mapped[datetime | None]
