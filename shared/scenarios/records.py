"""What the run engine carries and stores, typed: a run's snapshot, its turn and criterion
results, its cost summary.

The snapshot and the cost summary are JSON columns of ``scenario_runs``; these Structs
decode them (``msgspec.convert``) and encode back to the very same JSON shape, so stored
rows and the API's bodies are unchanged.  Turn and criterion results are the rows the run
engine writes (``turn_results``, ``criteria_results``), sent to PostgreSQL as JSON.

Each Struct is its record's only definition: the run engine's SQL (the columns a turn
fills, the recordset types it arrives with, the snapshot and the turns built as JSON, the
claim's columns) is derived from these fields (:mod:`shared.db.shapes`), and a field's
name is its column's.
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

import msgspec

from shared.outbound.schemas import ToolCall


class SnapshotCriterion(msgspec.Struct, frozen=True):
    id: str
    order_index: int
    question: str
    criteria_type: str
    few_shot_examples: list[dict[str, Any]] | None = None
    expected_arguments: dict[str, Any] | None = None  # tool_called only


class SnapshotTurn(msgspec.Struct, frozen=True):
    id: str
    order_index: int
    user_message: str
    required: bool
    criteria: list[SnapshotCriterion] = []


class SnapshotSimulation(msgspec.Struct, frozen=True):
    """The scenario's simulated user (shared.scenarios.schemas.SimulationCreate)."""

    persona: str
    goal: str
    max_turns: int
    provider_id: str | None = None
    model: str | None = None


class Snapshot(msgspec.Struct, frozen=True):
    """The scenario as it was when the run was created: what the run plays."""

    name: str
    customer_context: dict[str, Any] | None = None
    turns: list[SnapshotTurn] = []
    simulation: SnapshotSimulation | None = None
    conversation_criteria: list[SnapshotCriterion] = []


class CallCost(msgspec.Struct):
    """One side's calls (the agent's, the judge's or the simulator's) summed over the run."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0

    def __add__(self, other: CallCost) -> CallCost:
        return CallCost(
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            latency_ms=self.latency_ms + other.latency_ms,
        )


class CostSummary(msgspec.Struct):
    """A run's ``cost_summary``: stored ``{}`` until its first turn is committed."""

    agent: CallCost = msgspec.field(default_factory=CallCost)
    judge: CallCost = msgspec.field(default_factory=CallCost)
    # The simulated user's calls (priced with its provider's prices).
    simulator: CallCost = msgspec.field(default_factory=CallCost)
    estimated_cost_usd: float = 0.0

    def __add__(self, other: CostSummary) -> CostSummary:
        return CostSummary(
            agent=self.agent + other.agent,
            judge=self.judge + other.judge,
            simulator=self.simulator + other.simulator,
            estimated_cost_usd=round(self.estimated_cost_usd + other.estimated_cost_usd, 8),
        )


class TurnRecord(msgspec.Struct, frozen=True):
    """A turn, as written to ``turn_results``: played, or left unplayed (``skipped``)."""

    id: UUID
    turn_index: int
    user_message: str
    response_content: str
    passed: bool
    stopped_early: bool
    # What an llm agent was given from its knowledge (GivenKnowledge), if anything.
    knowledge: list[Any] | None = None
    # The credential keys whose values were redacted out of ``response_content``.
    redacted_keys: list[str] = []
    # Not played: an earlier required turn failed (no message sent, no criterion results).
    skipped: bool = False
    # The agent's model refused: ``response_content`` is its refusal.
    refusal: bool = False
    # ``scripted``, or ``simulated``: the message was the simulated user's.
    source: str = "scripted"
    # The deterministic conversation criteria the reply matched: criterion id -> evidence.
    conversation_matches: dict[str, str] | None = None
    # The tools the agent called for its reply, redacted and capped (shared.outbound.tool_calls).
    tool_calls: list[ToolCall] = []

    @classmethod
    def unplayed(cls, turn_index: int) -> TurnRecord:
        """A turn a stopped run leaves unplayed."""
        return cls(
            id=uuid.uuid4(),
            turn_index=turn_index,
            user_message="",
            response_content="",
            passed=False,
            stopped_early=False,
            skipped=True,
        )


class CriterionRecord(msgspec.Struct, frozen=True):
    """A criterion's verdict on a turn, as written to ``criteria_results``."""

    id: UUID
    criteria_id: UUID
    order_index: int
    verdict: str
    critique: str
    evidence: str
    input_tokens: int = 0
    output_tokens: int = 0
    # The judge's votes ({"PASS": a, "FAIL": b}) when it decided the verdict; None for a check.
    votes: dict[str, int] | None = None


class ErrorTurn(msgspec.Struct, frozen=True):
    """The turn a run ended in error on, as written to ``scenario_runs.error_turn``: the
    message sent to the agent (``None`` when it could not be rendered, so none was sent)
    and the agent's reply (``None`` unless it answered before the error: a judge or a check
    that failed on it), redacted as a turn's reply is."""

    turn_index: int
    user_message: str | None = None
    response_content: str | None = None
    tool_calls: list[ToolCall] = []  # reported with that reply


class DoneTurn(msgspec.Struct, frozen=True):
    """A turn committed before this delivery: the conversation so far, whether it passed,
    and what the conversation criteria found in its reply."""

    turn_index: int
    user_message: str
    response_content: str
    passed: bool
    stopped_early: bool
    conversation_matches: dict[str, str] | None = None
    tool_calls: list[ToolCall] = []


class Claimed(msgspec.Struct, frozen=True):
    """What playing a run needs, read by the claim that takes it."""

    organization_id: UUID
    agent_id: UUID
    session_id: str | None
    snapshot: Snapshot
    cost_summary: CostSummary
    outbound_version: int  # the organization's, for the outbound configuration cache
    business_information: str
    done: list[DoneTurn]  # the turns committed by earlier deliveries, in order
    attempts: int  # deliveries that claimed the run, this one included (shared.work)
    # How its simulated conversation ended, when an earlier delivery learnt it.
    simulation_outcome: str | None = None
    judge_repetitions: int = 1  # each llm_evaluated criterion judged this many times
    # A replay's run: the run whose stored transcript it re-judges, calling no one.
    replay_of_run_id: UUID | None = None
    batch_run_id: UUID | None = None  # its batch's, when it is one's
