"""Judge calibrations (DESIGN §5.6): labelled examples judged as the runs' judge would, and
how far the judge agreed with the humans."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from shared.calibration.schemas import CalibrationStatus
from shared.db.base import Base, IdMixin, JSONType, TimestampMixin
from shared.db.checks import not_negative, one_of


class Calibration(IdMixin, TimestampMixin, Base):
    __tablename__ = "calibrations"
    __table_args__ = (
        Index("ix_calibrations_org_created", "organization_id", "created_at"),
        # An agent's latest completed calibrations (shared.calibration.trust).
        Index("ix_calibrations_agent_completed", "agent_id", "completed_at"),
        one_of("status", CalibrationStatus),
        not_negative("example_count", "attempts", name="counts_not_negative"),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    agent_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("agents.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    examples: Mapped[list[dict[str, Any]]] = mapped_column(JSONType)
    example_count: Mapped[int] = mapped_column(Integer)
    # Scenario criteria the examples named: criteria_id -> version when calibrated.
    criterion_versions: Mapped[dict[str, str]] = mapped_column(JSONType, default=dict)
    # ... and where each sat in its scenario ("scenario_id/turn/criterion"), which an edit
    # keeps while it gives the criterion a new id.
    criterion_places: Mapped[dict[str, str]] = mapped_column(
        JSONType, default=dict, server_default=text("'{}'::jsonb")
    )
    # The judge that judged it, as started: a calibration of another judge is stale.
    judge_provider_id: Mapped[uuid.UUID | None]
    judge_model: Mapped[str | None] = mapped_column(String(255))
    # The metrics and per-example results, once every example is judged.
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[datetime | None]  # shared.work
    completed_at: Mapped[datetime | None]
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
