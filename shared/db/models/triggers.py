"""Triggers (DESIGN §5.7 and §5.8): an agent started on a cron schedule or by a signed webhook,
and one execution row per firing."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from shared.batches.schemas import MAX_REPETITIONS
from shared.db.base import Base, IdMixin, JSONType, TimestampMixin
from shared.db.checks import not_negative, one_of
from shared.triggers.schemas import (
    ExecutionSource,
    ExecutionStatus,
    TriggerAction,
    TriggerStatus,
    TriggerType,
)


class Trigger(IdMixin, TimestampMixin, Base):
    __tablename__ = "triggers"
    __table_args__ = (
        Index("ix_triggers_org_created", "organization_id", "created_at"),
        Index("ix_triggers_agent", "agent_id"),
        one_of("trigger_type", TriggerType),
        one_of("status", TriggerStatus),
        one_of("action", TriggerAction),
        CheckConstraint("max_concurrency >= 1", name="max_concurrency_positive"),
        CheckConstraint(
            f"repetitions >= 1 AND repetitions <= {MAX_REPETITIONS}", name="repetitions_in_range"
        ),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    # An agent a trigger names cannot be deleted (409) until the trigger is.
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="RESTRICT"))
    name: Mapped[str] = mapped_column(String(255))
    trigger_type: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="active")
    message: Mapped[str] = mapped_column(Text)
    cron_expression: Mapped[str | None] = mapped_column(String(255))
    timezone: Mapped[str | None] = mapped_column(String(64))
    # "message" (spec: send the message to the agent) or "batch_run" (run a suite).
    action: Mapped[str] = mapped_column(String(16), default="message")
    scenario_ids: Mapped[list[str]] = mapped_column(JSONType, default=list)
    tags: Mapped[list[str]] = mapped_column(JSONType, default=list)
    max_concurrency: Mapped[int] = mapped_column(Integer, default=10)
    repetitions: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    webhook_secret_encrypted: Mapped[str] = mapped_column(Text)
    # After a rotation, the secret before it, still accepted until it expires: callers
    # switch to the new one without a delivery refused in between.
    previous_secret_encrypted: Mapped[str | None] = mapped_column(Text)
    previous_secret_expires_at: Mapped[datetime | None]
    # Slots at or before this instant are never due: set on create, and whenever the
    # trigger is activated or its schedule changes (no catch-up for a paused stretch).
    schedule_from: Mapped[datetime]
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )


class TriggerExecution(IdMixin, TimestampMixin, Base):
    __tablename__ = "trigger_executions"
    __table_args__ = (
        # Exactly once per slot, whatever fires it: two schedulers, a restart, a retry.
        UniqueConstraint("trigger_id", "scheduled_for"),
        # A webhook delivery retried with its webhook-id starts nothing new.
        UniqueConstraint("trigger_id", "webhook_id"),
        Index("ix_trigger_executions_trigger_created", "trigger_id", "created_at"),
        Index("ix_trigger_executions_status_updated", "status", "updated_at"),
        one_of("source", ExecutionSource),
        one_of("status", ExecutionStatus),
        not_negative("attempts"),
    )

    trigger_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("triggers.id", ondelete="CASCADE"))
    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    source: Mapped[str] = mapped_column(String(16))  # schedule, webhook, manual
    status: Mapped[str] = mapped_column(String(16), default="queued")
    scheduled_for: Mapped[datetime | None]
    webhook_id: Mapped[str | None] = mapped_column(String(255))
    payload: Mapped[Any | None] = mapped_column(JSONType)
    message: Mapped[str | None] = mapped_column(Text)  # as rendered and sent
    response: Mapped[str | None] = mapped_column(Text)
    batch_run_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("batch_runs.id", ondelete="SET NULL")
    )
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[datetime | None]  # shared.work
    started_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
