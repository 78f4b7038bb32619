"""Scenarios (turns and criteria), scenario runs and their turn and criterion results."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from shared.db.base import Base, IdMixin, JSONType, TimestampMixin, utcnow
from shared.db.checks import not_negative, one_of
from shared.scenarios.schemas import (
    MAX_JUDGE_REPETITIONS,
    CriteriaType,
    RunStatus,
    SimulationOutcome,
    TurnSource,
    Verdict,
)


class Scenario(IdMixin, TimestampMixin, Base):
    __tablename__ = "scenarios"
    __table_args__ = (Index("ix_scenarios_org_created", "organization_id", "created_at"),)

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list[str]] = mapped_column(JSONType, default=list)
    customer_context: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
    # The simulated user playing after the scripted turns (shared.scenarios.schemas
    # SimulationCreate, as JSON), or null for a scripted scenario.
    simulation: Mapped[dict[str, Any] | None] = mapped_column(JSONType)

    turns: Mapped[list[ScenarioTurn]] = relationship(
        lazy="raise",
        order_by="ScenarioTurn.order_index",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )
    # Judged once on the whole conversation, after it ends (criteria with no turn).
    conversation_criteria: Mapped[list[Criterion]] = relationship(
        lazy="raise",
        order_by="Criterion.order_index",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class ScenarioTurn(IdMixin, Base):
    __tablename__ = "scenario_turns"
    __table_args__ = (
        UniqueConstraint("scenario_id", "order_index"),
        not_negative("order_index"),
    )

    scenario_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("scenarios.id", ondelete="CASCADE"))
    order_index: Mapped[int] = mapped_column(Integer)
    user_message: Mapped[str] = mapped_column(Text)
    required: Mapped[bool] = mapped_column(Boolean, default=False)

    criteria: Mapped[list[Criterion]] = relationship(
        lazy="raise",
        order_by="Criterion.order_index",
        cascade="all, delete-orphan",
        passive_deletes=True,
    )


class Criterion(IdMixin, Base):
    """A turn's criterion (``turn_id``), or a conversation criterion of its scenario
    (``scenario_id``): one or the other."""

    __tablename__ = "criteria"
    __table_args__ = (
        UniqueConstraint("turn_id", "order_index"),
        UniqueConstraint("scenario_id", "order_index"),
        not_negative("order_index"),
        one_of("criteria_type", CriteriaType),
        CheckConstraint("(turn_id IS NULL) <> (scenario_id IS NULL)", name="one_place"),
        CheckConstraint(
            "expected_arguments IS NULL OR (criteria_type = 'tool_called'"
            " AND jsonb_typeof(expected_arguments) = 'object')",
            name="expected_arguments_of_tool_called",
        ),
    )

    turn_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("scenario_turns.id", ondelete="CASCADE")
    )
    scenario_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("scenarios.id", ondelete="CASCADE")
    )
    order_index: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    criteria_type: Mapped[str] = mapped_column(String(32))
    few_shot_examples: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    # tool_called only: the arguments some call of the tool must carry (SQL NULL when none).
    expected_arguments: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))


class ScenarioRun(IdMixin, TimestampMixin, Base):
    """One execution of a scenario against an agent.

    ``scenario_id`` and ``agent_id`` are plain ids, not foreign keys: a run keeps its
    history (and its ``snapshot`` of turns and criteria) after either is deleted.
    """

    __tablename__ = "scenario_runs"
    __table_args__ = (
        Index("ix_scenario_runs_org_created", "organization_id", "created_at"),
        Index("ix_scenario_runs_status_updated", "status", "updated_at"),
        Index("ix_scenario_runs_batch_status", "batch_run_id", "status"),
        # The runs of a batch changed since a results page's last look (its poll).
        Index("ix_scenario_runs_batch_updated", "batch_run_id", "updated_at"),
        # The batch window's next runs, in order, without scanning the ones handed out.
        Index(
            "ix_scenario_runs_undispatched",
            "batch_run_id",
            "created_at",
            "id",
            postgresql_where=text("dispatched_at IS NULL"),
        ),
        one_of("status", RunStatus),
        one_of("simulation_outcome", SimulationOutcome),
        not_negative("attempts"),
        CheckConstraint("status = 'error' OR error_turn IS NULL", name="error_turn_of_error"),
        CheckConstraint("trace_id ~ '^[0-9a-f]{32}$'", name="trace_id_hex"),
        CheckConstraint(
            f"judge_repetitions >= 1 AND judge_repetitions <= {MAX_JUDGE_REPETITIONS}",
            name="judge_repetitions_in_range",
        ),
    )

    organization_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("organizations.id", ondelete="CASCADE")
    )
    scenario_id: Mapped[uuid.UUID] = mapped_column(index=True)
    agent_id: Mapped[uuid.UUID] = mapped_column(index=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    started_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    session_id: Mapped[str | None] = mapped_column(String(64))
    cost_summary: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    error_message: Mapped[str | None] = mapped_column(Text)
    # A run that ended in error on a turn: the turn, its message and any reply
    # (shared.scenarios.records.ErrorTurn); never committed as a turn result.
    error_turn: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_by_user_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL")
    )
    # Batch membership: the window counts runs dispatched and not yet terminal.
    batch_run_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("batch_runs.id", ondelete="CASCADE")
    )
    dispatched_at: Mapped[datetime | None]
    # Deliveries that claimed the run, and the latest sign of life of the one playing it
    # (shared.work): a run whose heartbeat stops is re-sent, one that keeps failing ends.
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    heartbeat_at: Mapped[datetime | None]
    # How a simulated conversation ended (null for a scripted scenario, and until it ends):
    # committed as soon as it is known, so a redelivery never asks the simulator again.
    simulation_outcome: Mapped[str | None] = mapped_column(String(16))
    # The OpenTelemetry trace of the run's latest delivery (32 hex digits), when tracing is
    # on (shared.scenarios.tracing).
    trace_id: Mapped[str | None] = mapped_column(String(32))
    # Each llm_evaluated criterion judged this many times (its batch's; 1 for a single run).
    judge_repetitions: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    # A replay's run: the run whose stored transcript it re-judges, without calling out (a
    # plain id, like scenario_id: a run whose source is gone ends in error saying so).
    replay_of_run_id: Mapped[uuid.UUID | None]

    turn_results: Mapped[list[TurnResult]] = relationship(
        lazy="raise", order_by="TurnResult.turn_index", passive_deletes=True
    )
    # The verdicts of the scenario's conversation criteria, written with the run's end.
    conversation_results: Mapped[list[CriterionResult]] = relationship(
        lazy="raise", order_by="CriterionResult.order_index", passive_deletes=True
    )


class TurnResult(IdMixin, Base):
    __tablename__ = "turn_results"
    __table_args__ = (
        UniqueConstraint("run_id", "turn_index"),
        not_negative("turn_index"),
        one_of("source", TurnSource),
        CheckConstraint("jsonb_typeof(tool_calls) = 'array'", name="tool_calls_array"),
    )

    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("scenario_runs.id", ondelete="CASCADE"))
    turn_index: Mapped[int] = mapped_column(Integer)
    user_message: Mapped[str] = mapped_column(Text, default="")
    response_content: Mapped[str] = mapped_column(Text, default="")
    passed: Mapped[bool] = mapped_column(Boolean)
    stopped_early: Mapped[bool] = mapped_column(Boolean, default=False)
    # Not played: an earlier required turn failed (no message sent, no criterion results).
    skipped: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The knowledge an llm agent was given for this turn (documents and chunks), if any.
    knowledge: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    # The credential keys whose values were redacted out of the reply (the values never kept).
    redacted_keys: Mapped[list[str]] = mapped_column(
        JSONType, default=list, server_default=text("'[]'::jsonb")
    )
    # The model refused: ``response_content`` is its refusal.
    refusal: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # ``scripted`` (a turn of the scenario) or ``simulated`` (written by the simulator).
    source: Mapped[str] = mapped_column(
        String(16), default="scripted", server_default=text("'scripted'")
    )
    # The deterministic conversation criteria this reply matched, as the agent sent it
    # (criterion id -> what matched, redacted): judged once the conversation ends, without
    # the unredacted replies of earlier deliveries.
    conversation_matches: Mapped[dict[str, str] | None] = mapped_column(JSONType)
    # The tools the agent called for the reply (redacted, capped: shared.outbound.tool_calls).
    tool_calls: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONType, default=list, server_default=text("'[]'::jsonb")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    criteria_results: Mapped[list[CriterionResult]] = relationship(
        lazy="raise", order_by="CriterionResult.order_index", passive_deletes=True
    )


class CriterionResult(IdMixin, Base):
    """A criterion's verdict on a turn (``turn_result_id``), or a conversation criterion's
    on its run's whole conversation (``run_id``): one or the other."""

    __tablename__ = "criterion_results"
    __table_args__ = (
        UniqueConstraint("turn_result_id", "criteria_id"),
        UniqueConstraint("run_id", "criteria_id"),
        one_of("verdict", Verdict),
        not_negative("order_index", "input_tokens", "output_tokens", name="counts_not_negative"),
        CheckConstraint("(turn_result_id IS NULL) <> (run_id IS NULL)", name="one_place"),
    )

    turn_result_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("turn_results.id", ondelete="CASCADE")
    )
    run_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("scenario_runs.id", ondelete="CASCADE")
    )
    criteria_id: Mapped[uuid.UUID]
    order_index: Mapped[int] = mapped_column(Integer, default=0)
    verdict: Mapped[str] = mapped_column(String(8))
    critique: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[str] = mapped_column(Text, default="")
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # The judge's votes, {"PASS": a, "FAIL": b}, when the judge decided it (null for a check).
    votes: Mapped[dict[str, int] | None] = mapped_column(JSONType)
