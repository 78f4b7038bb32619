"""Announcing an event, on the ``notifications`` queue (DESIGN §5.13): its payload built once,
from its subject, and one delivery recorded per active endpoint subscribed to it, sent to
the queue once committed (:mod:`shared.notifications.deliveries` attempts them).

At least once, never twice: the claim (:mod:`shared.work`) moves the event ``pending`` to
``announcing``; the announcement locks the event row and ends it ``announced`` in the
transaction that records its deliveries, so a second delivery of its message (or a worker
thought dead) finds it announced and records nothing, and ``(event, endpoint)`` is unique
besides.

A batch's regression against its baseline is found where its comparison is stored
(:func:`shared.batches.services.store_comparison`, once the batch and its baseline are
both over): that transaction records ``batch.regressed`` when the comparison holds a
significant regression, and its payload is built here from the stored comparison.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any
from uuid import UUID

import dramatiq
import msgspec
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from shared import work
from shared.batches.schemas import Change
from shared.db.base import utcnow
from shared.db.engine import Database
from shared.db.models import (
    BatchRun,
    Calibration,
    NotificationEvent,
    Trigger,
    TriggerExecution,
    WebhookDelivery,
    WebhookEndpoint,
)
from shared.notifications import outbox, schemas
from shared.notifications.schemas import DeliveryStatus, EventStatus
from shared.notifications.services import RETRY_FOR
from shared.queue import DELIVER_WEBHOOK, send_after_commit
from shared.settings import Settings
from shared.work import NOTIFICATION_EVENTS

log = logging.getLogger("spar.notifications")


# --- what an event says ---------------------------------------------------------------------------


def _ui(settings: Settings, organization_id: UUID, batch_id: UUID | None = None) -> str:
    """The results UI: a batch's page, else the organization's batches."""
    page = f"{settings.public_base_url}/ui/orgs/{organization_id}/batches"
    return f"{page}/{batch_id}" if batch_id is not None else page


def _api(settings: Settings, organization_id: UUID, *path: object) -> str:
    return "/".join([f"{settings.public_base_url}/v1/orgs/{organization_id}", *map(str, path)])


def batch_summary(batch: BatchRun) -> schemas.BatchRunSummary:
    total = batch.total_scenarios
    pass_rate = batch.passed_scenarios / total if total else None
    return schemas.BatchRunSummary.from_row(batch, pass_rate=pass_rate)


def _batch_links(settings: Settings, batch: BatchRun) -> schemas.Links:
    return schemas.Links(
        ui=_ui(settings, batch.organization_id, batch.id),
        api=_api(settings, batch.organization_id, "scenarios/batch-runs", batch.id),
    )


def significant_regressions(comparison: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The scenarios of a batch's stored comparison with its baseline that regressed
    significantly."""
    return [
        dict(scenario)
        for scenario in comparison.get("scenarios") or []
        if scenario.get("significant") is True and scenario.get("change") == Change.REGRESSED
    ]


async def _batch_completed(
    session: AsyncSession, settings: Settings, event: NotificationEvent, broker: Any
) -> msgspec.Struct | None:
    batch = await session.get(BatchRun, event.subject_id)
    if batch is None:
        return None
    return schemas.BatchCompletedData(
        batch_run=batch_summary(batch), links=_batch_links(settings, batch)
    )


async def _batch_regressed(
    session: AsyncSession, settings: Settings, event: NotificationEvent, broker: Any
) -> msgspec.Struct | None:
    """The batch, its significant regressions as its stored comparison states them, and
    its results page."""
    batch = await session.get(BatchRun, event.subject_id)
    if batch is None or not batch.comparison:
        return None
    regressions = significant_regressions(batch.comparison)
    baseline = batch.comparison.get("baseline_batch_id")
    return schemas.BatchRegressedData(
        batch_run=batch_summary(batch),
        comparison=schemas.RegressionSummary(
            baseline_batch_run_id=UUID(str(baseline)) if baseline else None,
            significant_regressions=len(regressions),
            scenarios=regressions,
        ),
        links=_batch_links(settings, batch),
    )


async def _execution_failed(
    session: AsyncSession, settings: Settings, event: NotificationEvent, broker: Any
) -> msgspec.Struct | None:
    row = (
        await session.execute(
            select(TriggerExecution, Trigger)
            .join(Trigger, Trigger.id == TriggerExecution.trigger_id)
            .where(TriggerExecution.id == event.subject_id)
        )
    ).one_or_none()
    if row is None:
        return None
    execution, trigger = row
    org = trigger.organization_id
    return schemas.TriggerExecutionFailedData(
        trigger=schemas.TriggerSummary.from_row(trigger),
        execution=schemas.ExecutionSummary.from_row(execution),
        links=schemas.Links(
            ui=_ui(settings, org, execution.batch_run_id),
            api=_api(settings, org, "triggers", trigger.id, "executions", execution.id),
        ),
    )


async def _calibration_completed(
    session: AsyncSession, settings: Settings, event: NotificationEvent, broker: Any
) -> msgspec.Struct | None:
    calibration = await session.get(Calibration, event.subject_id)
    if calibration is None:
        return None
    metrics = {
        name: value
        for name, value in (calibration.metrics or {}).items()
        if name in schemas.CalibrationSummary.__struct_fields__
    }
    org = calibration.organization_id
    return schemas.CalibrationCompletedData(
        calibration=schemas.CalibrationSummary.from_row(calibration, **metrics),
        links=schemas.Links(
            ui=_ui(settings, org),
            api=_api(settings, org, "scenarios/calibrations", calibration.id),
        ),
    )


_BUILDERS = {
    outbox.BATCH_COMPLETED: _batch_completed,
    outbox.BATCH_REGRESSED: _batch_regressed,
    outbox.TRIGGER_EXECUTION_FAILED: _execution_failed,
    outbox.CALIBRATION_COMPLETED: _calibration_completed,
}


# --- announcing (the notifications actor) ---------------------------------------------------------

_CLAIM = NOTIFICATION_EVENTS.claim().returning(NotificationEvent.id, NotificationEvent.attempts)


async def announce(
    database: Database, settings: Settings, event_id: UUID, *, broker: dramatiq.Broker
) -> None:
    """Announce the event ``event_id`` (the ``announce_event`` actor's body), claimed, kept
    alive and given up on as every unit of work is (:mod:`shared.work`)."""
    async with database.transaction() as session:
        claimed = (
            await work.execute_claim(session, _CLAIM, settings=settings, unit_id=event_id)
        ).one_or_none()
    if claimed is None:
        return

    async def play() -> None:
        async with database.transaction() as session:
            await _announce(session, settings, event_id, broker)

    async def give_up(reason: str) -> None:
        await work.finish(NOTIFICATION_EVENTS, database, event_id, EventStatus.FAILED, error=reason)

    await work.perform(
        NOTIFICATION_EVENTS,
        database,
        settings,
        event_id,
        claimed.attempts,
        play=play,
        give_up=give_up,
    )


async def _announce(
    session: AsyncSession, settings: Settings, event_id: UUID, broker: dramatiq.Broker
) -> None:
    event = await session.scalar(
        select(NotificationEvent).where(NotificationEvent.id == event_id).with_for_update()
    )
    if event is None or event.status != EventStatus.ANNOUNCING:
        return  # another delivery announced it
    now = utcnow()
    ended: dict[str, Any] = {"completed_at": now}
    if event.data is None:
        built = await _BUILDERS[event.type](session, settings, event, broker)
        if built is None:
            log.info("event %s (%s): its subject is gone", event.id, event.type)
            ended.update(status=EventStatus.FAILED, error="its subject was deleted")
            await session.execute(
                update(NotificationEvent).where(NotificationEvent.id == event.id).values(ended)
            )
            return
        ended["data"] = msgspec.to_builtins(built)
    endpoints = list(
        await session.scalars(
            select(WebhookEndpoint.id).where(
                WebhookEndpoint.organization_id == event.organization_id,
                WebhookEndpoint.active,
                WebhookEndpoint.events.contains([event.type]),
            )
        )
    )
    if endpoints:
        recorded = await session.scalars(
            insert(WebhookDelivery)
            .values(
                [
                    {
                        "id": uuid.uuid4(),
                        "organization_id": event.organization_id,
                        "endpoint_id": endpoint_id,
                        "event_id": event.id,
                        "event_type": event.type,
                        "status": DeliveryStatus.PENDING,
                        "attempts": 0,
                        "next_attempt_at": now,
                        "retry_until": now + RETRY_FOR,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for endpoint_id in endpoints
                ]
            )
            .on_conflict_do_nothing(index_elements=["event_id", "endpoint_id"])
            .returning(WebhookDelivery.id)
        )
        for delivery_id in recorded:
            send_after_commit(session, broker, DELIVER_WEBHOOK, str(delivery_id))
    await session.execute(
        update(NotificationEvent)
        .where(NotificationEvent.id == event.id)
        .values(status=EventStatus.ANNOUNCED, **ended)
    )
