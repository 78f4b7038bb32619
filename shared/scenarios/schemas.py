"""Request and response bodies of scenarios and scenario runs (spec 10-14, DESIGN §5.2)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from shared.outbound.schemas import ToolCall
from shared.schemas import Input, JsonObject, Name255, Output, text

UNSET = msgspec.UNSET
UnsetType = msgspec.UnsetType

CriteriaType = Literal[
    "llm_evaluated", "contains", "not_contains", "regex", "tool_called", "tool_not_called"
]
# The criteria that read the agent's tool calls, not its reply (question = the tool's name).
TOOL_CRITERIA = ("tool_called", "tool_not_called")
MAX_EXPECTED_ARGUMENTS_BYTES = 16_384  # a criterion's expected_arguments, as JSON


def criterion_label(criteria_type: str, question: str) -> str:
    """How reports name a criterion: its question, a tool check by what it checks
    (``tool_called refund_order``: its question alone is a bare tool name)."""
    return f"{criteria_type} {question}" if criteria_type in TOOL_CRITERIA else question


Verdict = Literal["PASS", "FAIL"]
# Where a turn's user message came from: the scenario's turns, or the simulated user.
TurnSource = Literal["scripted", "simulated"]
# How a simulated conversation ended: the simulator said it reached its goal or gave up,
# or it ran out of turns.
SimulationOutcome = Literal["goal_reached", "gave_up", "max_turns"]
MAX_SIMULATED_TURNS = 30
# How many times a batch may have the judge decide each llm_evaluated criterion.
MAX_JUDGE_REPETITIONS = 5
DEFAULT_SIMULATED_TURNS = 8


class RunStatus(enum.StrEnum):
    """A run moves ``pending`` -> ``running`` -> one of the terminal three, never back."""

    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"


TurnStatus = Literal["passed", "failed", "skipped"]
TERMINAL_STATUSES = frozenset({RunStatus.PASSED, RunStatus.FAILED, RunStatus.ERROR})
OPEN_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING)  # may still move; never back to them
Tag = Annotated[str, text(1, 100)]
LongText = Annotated[str, text(0, 100_000)]


class FewShotExample(Input):
    response: LongText
    verdict: Verdict
    critique: LongText = ""


ExpectedArguments = Annotated[
    JsonObject,
    msgspec.Meta(
        description="tool_called only: the arguments some call of the tool must carry (each "
        "key with an equal value; nested objects compared the same way, lists whole). At "
        f"most {MAX_EXPECTED_ARGUMENTS_BYTES} bytes as JSON."
    ),
]


class CriterionCreate(Input):
    question: Annotated[str, text(1, 10_000)]
    criteria_type: CriteriaType = "llm_evaluated"
    few_shot_examples: list[FewShotExample] = []
    # Accepted for the spec's request shape; criteria are ordered by their position.
    order_index: Annotated[int, msgspec.Meta(ge=0)] = 0
    expected_arguments: ExpectedArguments | None = None


class ScenarioTurnCreate(Input):
    user_message: Annotated[str, text(1, 100_000)]
    required: bool = False
    criteria: list[CriterionCreate] = []


TurnList = Annotated[list[ScenarioTurnCreate], msgspec.Meta(min_length=1, max_length=200)]
ConversationCriteria = Annotated[list[CriterionCreate], msgspec.Meta(max_length=50)]
SimulationText = Annotated[str, text(1, 4_000)]


class SimulationCreate(Input):
    """A simulated user, playing after the scripted turns until it is done or has sent
    ``max_turns`` messages."""

    persona: SimulationText
    goal: SimulationText
    max_turns: Annotated[int, msgspec.Meta(ge=1, le=MAX_SIMULATED_TURNS)] = DEFAULT_SIMULATED_TURNS
    # An LLM provider of the organization; else its default simulator, else the agent's judge.
    provider_id: UUID | None = None
    # Else the provider's default_model.
    model: Annotated[str, text(1, 255)] | None = None


class ScenarioCreate(Input):
    name: Name255
    turns: TurnList
    description: LongText | None = None
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] = []
    customer_context: JsonObject = {}
    simulation: SimulationCreate | None = None
    conversation_criteria: ConversationCriteria = []


class ScenarioUpdate(Input):
    """PUT body: every field optional; ``turns`` given (not null) replaces all turns."""

    name: Name255 | UnsetType | None = UNSET
    description: LongText | UnsetType | None = UNSET
    tags: Annotated[list[Tag], msgspec.Meta(max_length=50)] | UnsetType | None = UNSET
    customer_context: JsonObject | UnsetType = UNSET
    turns: (
        Annotated[list[ScenarioTurnCreate], msgspec.Meta(min_length=1, max_length=200)]
        | UnsetType
        | None
    ) = UNSET
    # null removes the simulated user.
    simulation: SimulationCreate | UnsetType | None = UNSET
    # Given (not null), replaces every conversation criterion.
    conversation_criteria: ConversationCriteria | UnsetType | None = UNSET

    def changes(self) -> dict[str, Any]:
        """What the PUT sets on the scenario row: a null ``name`` or ``tags`` leaves it as it
        is, tags are kept once each; ``turns`` and ``conversation_criteria`` are rebuilt by
        the service, not set; ``simulation`` is stored as JSON."""
        sent = super().changes()
        sent.pop("turns", None)
        sent.pop("conversation_criteria", None)
        if "simulation" in sent:
            sent["simulation"] = msgspec.to_builtins(sent["simulation"])
        for name in ("name", "tags"):
            if name in sent and sent[name] is None:
                del sent[name]
        if "tags" in sent:
            sent["tags"] = list(dict.fromkeys(sent["tags"]))
        return sent


class FewShotExampleRead(Output):
    response: str
    verdict: Verdict
    critique: str


class CriterionRead(Output):
    id: UUID
    turn_id: UUID
    question: str
    criteria_type: CriteriaType
    few_shot_examples: list[FewShotExampleRead]
    order_index: int
    expected_arguments: dict[str, Any] | None = None


class ConversationCriterionRead(Output):
    """A criterion judged once on the whole conversation (its scenario's, not a turn's)."""

    id: UUID
    scenario_id: UUID
    question: str
    criteria_type: CriteriaType
    few_shot_examples: list[FewShotExampleRead]
    order_index: int
    expected_arguments: dict[str, Any] | None = None


class SimulationRead(Output):
    persona: str
    goal: str
    max_turns: int
    provider_id: UUID | None
    model: str | None


class ScenarioTurnRead(Output):
    id: UUID
    scenario_id: UUID
    order_index: int
    user_message: str
    required: bool
    criteria: list[CriterionRead]


class ScenarioRead(Output):
    id: UUID
    organization_id: UUID
    name: str
    description: str | None
    tags: list[str]
    customer_context: dict[str, Any]
    created_by_user_id: UUID | None
    turns: list[ScenarioTurnRead]
    created_at: datetime
    updated_at: datetime
    simulation: SimulationRead | None = None
    conversation_criteria: list[ConversationCriterionRead] = []


class ScenarioSummary(Output):
    id: UUID
    organization_id: UUID
    name: str
    description: str | None
    tags: list[str]
    turn_count: int
    created_at: datetime
    updated_at: datetime


class ScenarioList(Output):
    scenarios: list[ScenarioSummary]
    total: int


# --- runs -------------------------------------------------------------------------------------


class RunCreate(Input):
    agent_id: UUID


class CriterionResultRead(Output):
    id: UUID
    criteria_id: UUID
    # What was asked, as the run's snapshot holds the criterion: the scenario may have
    # been edited or deleted since.
    question: str
    criteria_type: CriteriaType
    verdict: Verdict
    critique: str
    evidence: str
    input_tokens: int
    output_tokens: int
    # How the judge voted, when it decided the verdict: {"PASS": a, "FAIL": b}, the verdict
    # being the majority (a tie is FAIL); null for a deterministic check.
    votes: dict[str, int] | None = None


class ScenarioTurnResultRead(Output):
    id: UUID
    turn_index: int
    stopped_early: bool
    passed: bool
    response_content: str
    criteria_results: list[CriterionResultRead]
    # The message sent to the agent, rendered from the turn's template ("" when skipped).
    user_message: str
    # ``skipped``: not played, because an earlier required turn failed.
    status: TurnStatus
    # What an llm agent was given from its knowledge documents in this turn (documents
    # bookmarked ``always``, chunks retrieved ``on_demand``); null for other agents.
    knowledge: list[dict[str, Any]] | None = None
    # The credential keys whose values the agent's reply held, redacted out of
    # ``response_content`` (a leak shows without the value being kept).
    redacted_keys: list[str] = []
    # The agent's model refused to answer: ``response_content`` is its refusal.
    refusal: bool = False
    # ``simulated``: the message was written by the scenario's simulated user (such a turn
    # has no criteria of its own).
    source: TurnSource = "scripted"
    # The tools the agent called for its reply, as it reported them, redacted like
    # ``response_content``; at most 64 KiB of JSON, then a call named "spar:cut" says how
    # many were left out.
    tool_calls: list[ToolCall] = []


class ErrorTurnRead(Output):
    """The turn a run ended in error on (never one of its ``turn_results``)."""

    turn_index: int
    # The message sent to the agent; null when it could not be rendered (none was sent).
    user_message: str | None
    # The agent's reply, when it answered before the error (a judge or a check that
    # failed on it); null otherwise.
    response_content: str | None
    tool_calls: list[ToolCall] = []  # reported with that reply


class ScenarioRunRead(Output):
    id: UUID
    scenario_id: UUID
    agent_id: UUID
    status: RunStatus
    started_at: datetime | None
    completed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    session_id: str | None = None
    cost_summary: dict[str, Any] = {}
    error_message: str | None = None
    batch_run_id: UUID | None = None  # the batch the run belongs to; null for a single run
    turn_results: list[ScenarioTurnResultRead] | UnsetType = UNSET
    # A run that ended in error while playing a turn: that turn, with what was sent.
    error_turn: ErrorTurnRead | None = None
    # How the simulated user's conversation ended; null for a scripted scenario (and until
    # a simulated one ends).
    simulation_outcome: SimulationOutcome | None = None
    # The verdicts of the scenario's conversation criteria, judged once the conversation
    # ended (none when a failed required turn stopped the run).
    conversation_results: list[CriterionResultRead] | UnsetType = UNSET
    # The OpenTelemetry trace the run ended in (its latest delivery's), 32 hex digits; null
    # when tracing is off.
    trace_id: str | None = None
    # How many times the judge decided each llm_evaluated criterion (the majority kept).
    judge_repetitions: int = 1
    # A replay's run: the run whose stored transcript it re-judged; null otherwise.
    replay_of_run_id: UUID | None = None


class ScenarioRunList(Output):
    runs: list[ScenarioRunRead]
    total: int
