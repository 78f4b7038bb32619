"""Batch runs: many scenario runs of one agent, dispatched through a sliding window."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from shared.batches.schemas import MAX_REPETITIONS, BatchStatus
from shared.db.base import Base, IdMixin, JSONType, TimestampMixin
from shared.db.checks import in_list, not_negative, one_of
from shared.scenarios.schemas import MAX_JUDGE_REPETITIONS


class BatchRun(IdMixin, TimestampMixin, Base):
    __tablename__ = "batch_runs"
    __table_args__ = (
        Index("ix_batch_runs_org_created", "organization_id", "created_at"),
        Index("ix_batch_runs_status", "status"),
        # The completed batches whose comparison with their baseline is still to store.
        Index(
            "ix_batch_runs_comparison_due",
            "id",
            postgresql_where=text("baseline_batch_id IS NOT NULL AND comparison IS NULL"),
        ),
        # The window's arithmetic (shared.batches.window, where these are explained).
        one_of("status", BatchStatus),
        not_negative(
            "total_scenarios",
            "completed_scenarios",
            "passed_scenarios",
            "failed_scenarios",
            "error_scenarios",
            "dispatched_scenarios",
            name="counts_not_negative",
        ),
        CheckConstraint("max_concurrency >= 1", name="max_concurrency_positive"),
        CheckConstraint(
            f"repetitions >= 1 AND repetitions <= {MAX_REPETITIONS}", name="repetitions_in_range"
        ),
        CheckConstraint(
            f"judge_repetitions >= 1 AND judge_repetitions <= {MAX_JUDGE_REPETITIONS}",
            name="judge_repetitions_in_range",
        ),
        # A batch's replays, for its page.
        Index(
            "ix_batch_runs_replay_of", "replay_of", postgresql_where=text("replay_of IS NOT NULL")
        ),
        CheckConstraint(
            "completed_scenarios = passed_scenarios + failed_scenarios + error_scenarios",
            name="completed_is_sum",
        ),
        CheckConstraint("completed_scenarios <= total_scenarios", name="completed_within_total"),
        CheckConstraint("dispatched_scenarios <= total_scenarios", name="dispatched_within_total"),
        CheckConstraint(
            f"NOT ({in_list('status', (BatchStatus.QUEUED, BatchStatus.RUNNING))})"
            " OR (completed_scenarios <= dispatched_scenarios"
            " AND dispatched_scenarios - completed_scenarios <= max_concurrency)",
            name="window",
        ),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    agent_id: Mapped[uuid.UUID]
    agent_name: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    max_concurrency: Mapped[int] = mapped_column(Integer, default=10)
    # Runs of each scenario; the counters below count runs (scenarios x repetitions).
    repetitions: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    total_scenarios: Mapped[int] = mapped_column(Integer, default=0)
    completed_scenarios: Mapped[int] = mapped_column(Integer, default=0)
    passed_scenarios: Mapped[int] = mapped_column(Integer, default=0)
    failed_scenarios: Mapped[int] = mapped_column(Integer, default=0)
    error_scenarios: Mapped[int] = mapped_column(Integer, default=0)
    # Runs handed out so far; dispatched - completed is the window in use.
    dispatched_scenarios: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    started_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    error_message: Mapped[str | None] = mapped_column(Text)
    # Pass rates with the judge's measured error taken out (shared.calibration.trust):
    # NULL until asked for, once the batch is over.
    judge_trust: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
    # The batch this one is compared with (same organization and agent), and that
    # comparison (shared.batches.services.store_comparison): NULL until the batch has
    # completed and both are over, then stored once.
    baseline_batch_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("batch_runs.id", ondelete="SET NULL")
    )
    comparison: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # Each llm_evaluated criterion judged this many times, the majority kept (a tie: FAIL).
    judge_repetitions: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    # The batch whose stored transcripts this one re-judges (a replay), if any.
    replay_of: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("batch_runs.id", ondelete="SET NULL")
    )
