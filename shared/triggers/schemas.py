"""Request and response bodies of triggers and their executions (spec 21, DESIGN §5.7)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from shared.batches.schemas import MAX_BATCH_SCENARIOS, Repetitions
from shared.scenarios.schemas import Tag
from shared.schemas import STORABLE, Input, Name255, Output, TimezoneName, text

UNSET = msgspec.UNSET
UnsetType = msgspec.UnsetType

TriggerType = Literal["scheduled", "webhook"]
TriggerAction = Literal["message", "batch_run"]


class TriggerStatus(enum.StrEnum):
    ACTIVE = "active"
    INACTIVE = "inactive"


class ExecutionStatus(enum.StrEnum):
    """``queued`` -> ``running`` -> ``succeeded`` or ``failed``; a slot older than the
    grace time when a scheduler first saw it is recorded ``missed`` and never runs."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MISSED = "missed"


class ExecutionSource(enum.StrEnum):
    SCHEDULE = "schedule"
    WEBHOOK = "webhook"
    MANUAL = "manual"


OPEN_EXECUTION_STATUSES = (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING)

Message = Annotated[
    str,
    text(
        1,
        100_000,
        description="Sent to the agent: a sandboxed Jinja template with `trigger`, `now` and "
        "(webhooks, manual fires) `payload`.  Required for the `message` action; a "
        "`batch_run` trigger sends none.",
    ),
]
CronExpression = Annotated[
    str,
    text(
        1,
        255,
        description="Standard 5-field cron: minute hour day-of-month month day-of-week "
        "(0 and 7 are Sunday).",
    ),
]
ScenarioIds = Annotated[list[UUID], msgspec.Meta(max_length=MAX_BATCH_SCENARIOS)]
Tags = Annotated[list[Tag], msgspec.Meta(max_length=50)]
Concurrency = Annotated[int, msgspec.Meta(ge=1, le=100)]


class TriggerCreate(Input):
    name: Name255
    trigger_type: TriggerType
    agent_id: UUID
    # Required for the ``message`` action (checked with the other fields); stored as ""
    # for a ``batch_run`` trigger given none.
    message: Message | None = None
    cron_expression: CronExpression | None = None
    timezone: TimezoneName | None = None
    action: TriggerAction = "message"
    scenario_ids: ScenarioIds = []
    tags: Tags = []
    max_concurrency: Concurrency = 10
    repetitions: Repetitions = 1

    def stored(self) -> dict[str, Any]:
        """The trigger's fields as a row holds them."""
        fields = stored_lists(msgspec.structs.asdict(self))
        fields["message"] = self.message or ""
        return fields


class TriggerUpdate(Input):
    name: Name255 | UnsetType = UNSET
    agent_id: UUID | UnsetType = UNSET
    message: Message | UnsetType = UNSET
    cron_expression: CronExpression | UnsetType = UNSET
    timezone: TimezoneName | UnsetType = UNSET
    status: TriggerStatus | UnsetType = UNSET
    action: TriggerAction | UnsetType = UNSET
    scenario_ids: ScenarioIds | UnsetType = UNSET
    tags: Tags | UnsetType = UNSET
    max_concurrency: Concurrency | UnsetType = UNSET
    repetitions: Repetitions | UnsetType = UNSET

    def changes(self) -> dict[str, Any]:
        """The fields sent, as a row holds them."""
        return stored_lists(super().changes())


def stored_lists(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the scenario ids and tags among them as a trigger row holds them:
    each once, in the order given, ids as text."""
    if "scenario_ids" in fields:
        fields["scenario_ids"] = [str(i) for i in dict.fromkeys(fields["scenario_ids"])]
    if "tags" in fields:
        fields["tags"] = list(dict.fromkeys(fields["tags"]))
    return fields


class TriggerRead(Output):
    id: UUID
    organization_id: UUID
    name: str
    trigger_type: TriggerType
    status: TriggerStatus
    agent_id: UUID
    message: str  # "" for a batch_run trigger given none
    cron_expression: str | None
    timezone: str | None
    action: TriggerAction
    scenario_ids: list[UUID]
    tags: list[str]
    max_concurrency: int
    repetitions: int
    webhook_url: str
    # The next slot of an active scheduled trigger.
    next_run_at: datetime | None
    created_at: datetime
    updated_at: datetime


class TriggerCreated(TriggerRead):
    """The create response: the only one that carries the signing secret."""

    webhook_secret: str


class TriggerList(Output):
    triggers: list[TriggerRead]
    total: int


MAX_SECRET_OVERLAP_S = 7 * 24 * 3600


class RotateSecretBody(Input):
    """How long the secret being replaced stays valid beside the new one (seconds; 0
    refuses it at once, for a secret that leaked)."""

    previous_valid_for_s: Annotated[int, msgspec.Meta(ge=0, le=MAX_SECRET_OVERLAP_S)] = 86_400


class FireBody(Input):
    # What the message template sees as ``payload`` (a webhook's body, when one fires it).
    payload: Annotated[Any, STORABLE] = None


class ExecutionRead(Output):
    id: UUID
    trigger_id: UUID
    source: ExecutionSource
    status: ExecutionStatus
    scheduled_for: datetime | None
    webhook_id: str | None
    payload: Any  # any JSON, null included (``Any | None`` would say null twice)
    message: str | None
    response: str | None
    batch_run_id: UUID | None
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None


class ExecutionList(Output):
    executions: list[ExecutionRead]
    total: int


class HookAccepted(Output):
    execution_id: UUID
