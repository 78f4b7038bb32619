"""Request and response bodies of webhook endpoints and their deliveries (DESIGN §5.13)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from shared.outbound.schemas import Url
from shared.schemas import Input, Output, text

UNSET = msgspec.UNSET
UnsetType = msgspec.UnsetType

EventType = Literal[
    "batch.completed",
    "batch.regressed",
    "trigger.execution.failed",
    "calibration.completed",
]
EVENT_TYPES: tuple[str, ...] = (
    "batch.completed",
    "batch.regressed",
    "trigger.execution.failed",
    "calibration.completed",
)


class EventStatus(enum.StrEnum):
    """An event is ``pending`` until it is announced: its payload built and one delivery
    recorded per endpoint subscribed to it (``announcing`` while a worker does that);
    ``failed`` when it could not be (its subject was deleted first)."""

    PENDING = "pending"
    ANNOUNCING = "announcing"
    ANNOUNCED = "announced"
    FAILED = "failed"


class DeliveryStatus(enum.StrEnum):
    """``pending`` until it is attempted (again), ``sending`` while an attempt is in flight,
    then ``succeeded`` (a 2xx answer) or ``failed`` (24 hours of failed attempts, or its
    endpoint disabled)."""

    PENDING = "pending"
    SENDING = "sending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


Events = Annotated[
    list[EventType],
    msgspec.Meta(
        min_length=1,
        max_length=len(EVENT_TYPES),
        description="The events sent to the endpoint: at least one.",
    ),
]
Description = Annotated[str, text(0, 1000)]


def stored_events(events: list[str]) -> list[str]:
    """The events as an endpoint holds them: each once, in the catalogue's order."""
    chosen = set(events)
    return [event for event in EVENT_TYPES if event in chosen]


class WebhookEndpointCreate(Input):
    url: Url
    events: Events
    description: Description = ""
    active: bool = True


class WebhookEndpointUpdate(Input):
    url: Url | UnsetType = UNSET
    events: Events | UnsetType = UNSET
    description: Description | UnsetType = UNSET
    active: bool | UnsetType = UNSET


class WebhookEndpointRead(Output):
    id: UUID
    organization_id: UUID
    url: str
    events: list[EventType]
    description: str
    active: bool
    # Why Spar turned the endpoint off (24 hours of failed deliveries), and when; null
    # while it is active, or when a user turned it off.
    disabled_reason: str | None
    disabled_at: datetime | None
    created_at: datetime
    updated_at: datetime


class WebhookEndpointCreated(WebhookEndpointRead):
    """The create response: the only one that carries the signing secret."""

    secret: str


class WebhookEndpointList(Output):
    webhook_endpoints: list[WebhookEndpointRead]
    total: int


class DeliveryRead(Output):
    id: UUID
    endpoint_id: UUID
    event_id: UUID
    event_type: EventType
    # The delivery's Standard Webhooks ``webhook-id``: the same on every attempt and
    # redelivery, so a receiver can drop what it already processed.
    webhook_id: str
    status: DeliveryStatus
    attempts: int
    # When the next attempt is due (``pending``); null once the delivery has ended.
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    last_response_code: int | None
    # At most 1 KiB of the last answer's body.
    last_response_body: str | None
    last_error: str | None
    # The body sent: the Standard Webhooks envelope ``{type, timestamp, data}``.
    payload: Any
    created_at: datetime
    completed_at: datetime | None


class DeliveryList(Output):
    deliveries: list[DeliveryRead]
    total: int


# --- what deliveries carry: the envelope's ``data`` of each event ---------------------------------


class Links(Output):
    ui: str  # the results UI: the batch's page, else the organization's
    api: str  # the subject in the API


class BatchRunSummary(Output):
    id: UUID
    agent_id: UUID
    agent_name: str
    status: str
    total_scenarios: int
    passed_scenarios: int
    failed_scenarios: int
    error_scenarios: int
    pass_rate: float | None  # passed / total; null for a batch of no scenario
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None


class BatchCompletedData(Output):
    batch_run: BatchRunSummary
    links: Links


class RegressionSummary(Output):
    """The significant regressions of a batch's comparison with its baseline: each as the
    comparison states it."""

    baseline_batch_run_id: UUID | None
    significant_regressions: int
    scenarios: list[dict[str, Any]]


class BatchRegressedData(Output):
    batch_run: BatchRunSummary
    comparison: RegressionSummary
    links: Links


class TriggerSummary(Output):
    id: UUID
    name: str
    trigger_type: str
    action: str


class ExecutionSummary(Output):
    id: UUID
    source: str
    status: str
    error: str | None
    scheduled_for: datetime | None
    batch_run_id: UUID | None
    attempts: int
    created_at: datetime
    completed_at: datetime | None


class TriggerExecutionFailedData(Output):
    trigger: TriggerSummary
    execution: ExecutionSummary
    links: Links


class CalibrationSummary(Output):
    """A completed calibration: the judge's agreement with the humans (spec 16's metrics,
    without the per-example results)."""

    id: UUID
    agent_id: UUID | None
    example_count: int
    created_at: datetime
    completed_at: datetime | None
    total: int | None = None
    agreements: int | None = None
    agreement_rate: float | None = None
    tpr: float | None = None
    tnr: float | None = None
    kappa: float | None = None
    undecided: int | None = None


class CalibrationCompletedData(Output):
    calibration: CalibrationSummary
    links: Links
