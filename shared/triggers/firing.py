"""Which slots of scheduled triggers are due, recorded exactly once each (DESIGN §5.7).

A slot is an instant of the trigger's :class:`~shared.triggers.schedule.Schedule`.  Slots
are due after the later of the trigger's ``schedule_from`` and its latest recorded slot,
up to now.  Each becomes one ``trigger_executions`` row, unique on
``(trigger_id, scheduled_for)``: whoever records a slot first (the active scheduler's
job at the slot's time, its catch-up pass after a restart, a second scheduler in a
split-brain moment) records it; everyone else's insert does nothing.  A slot within the
grace time (``SPAR_TRIGGER_GRACE_S``) is queued and its execution sent after commit; an
older one is recorded ``missed`` and never runs.  An execution whose message is lost is
sent again by the sweeper (:mod:`shared.work`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import Trigger, TriggerExecution
from shared.queue import RUN_TRIGGER, send_after_commit
from shared.triggers.schedule import Schedule
from shared.triggers.schemas import ExecutionSource, ExecutionStatus, TriggerStatus

# Missed slots are recorded for the last day at most, the latest MAX_MISSED of them: a
# minute-by-minute trigger whose schedulers were down for a week records its last 100
# missed minutes, not ten thousand rows.
MISSED_HORIZON = timedelta(days=1)
MAX_MISSED = 100


@dataclass(frozen=True, slots=True)
class ScheduledTrigger:
    """An active scheduled trigger as the scheduler mirrors it."""

    id: UUID
    organization_id: UUID
    schedule: Schedule
    schedule_from: datetime
    last_slot: datetime | None

    @property
    def key(self) -> tuple[str, str, datetime]:
        """What its job depends on: a change of any of these replaces the job."""
        return (self.schedule.expression, self.schedule.timezone, self.schedule_from)

    @property
    def after(self) -> datetime:
        """Slots after this instant are not recorded yet."""
        if self.last_slot is None:
            return self.schedule_from
        return max(self.schedule_from, self.last_slot)

    def next_due(self) -> datetime | None:
        return self.schedule.next_after(self.after)


def _last_slot() -> Any:
    return (
        select(func.max(TriggerExecution.scheduled_for))
        .where(TriggerExecution.trigger_id == Trigger.id)
        .scalar_subquery()
    )


def _scheduled() -> Any:
    return select(
        Trigger.id,
        Trigger.organization_id,
        Trigger.cron_expression,
        Trigger.timezone,
        Trigger.schedule_from,
        _last_slot().label("last_slot"),
    ).where(Trigger.trigger_type == "scheduled", Trigger.status == TriggerStatus.ACTIVE)


def _mirrored(row: Any, second: str) -> ScheduledTrigger:
    return ScheduledTrigger(
        id=row.id,
        organization_id=row.organization_id,
        schedule=Schedule(row.cron_expression, row.timezone or "UTC", second=second),
        schedule_from=row.schedule_from,
        last_slot=row.last_slot,
    )


async def scheduled_triggers(session: AsyncSession, *, second: str = "0") -> list[ScheduledTrigger]:
    """Every active scheduled trigger, with its latest recorded slot (``second``: see
    :func:`~shared.triggers.schedule.parse_cron`)."""
    return [_mirrored(row, second) for row in await session.execute(_scheduled())]


async def scheduled_trigger(
    session: AsyncSession, *, trigger_id: UUID, second: str = "0"
) -> ScheduledTrigger | None:
    """One of them, as of now; ``None`` once it is paused, deleted or no longer scheduled."""
    row = (await session.execute(_scheduled().where(Trigger.id == trigger_id))).one_or_none()
    return None if row is None else _mirrored(row, second)


@dataclass(frozen=True, slots=True)
class Fired:
    queued: list[UUID]
    missed: int


async def fire_due(
    session: AsyncSession,
    *,
    trigger: ScheduledTrigger,
    now: datetime,
    grace: timedelta,
    broker: Any,
) -> Fired:
    """Record the trigger's slots due at ``now``: queued (and sent once the caller commits)
    within ``grace``, ``missed`` before it.  A slot someone else recorded is left alone."""
    after = max(trigger.after, now - MISSED_HORIZON)
    slots = list(trigger.schedule.slots(after, now))
    if not slots:
        return Fired(queued=[], missed=0)
    due = [slot for slot in slots if slot >= now - grace]
    missed = [slot for slot in slots if slot < now - grace][-MAX_MISSED:]
    rows = [_execution(trigger, slot, ExecutionStatus.QUEUED, now) for slot in due]
    rows += [_execution(trigger, slot, ExecutionStatus.MISSED, now) for slot in missed]
    recorded = (
        await session.execute(
            insert(TriggerExecution)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["trigger_id", "scheduled_for"])
            .returning(TriggerExecution.id, TriggerExecution.status)
        )
    ).all()
    queued = [row.id for row in recorded if row.status == ExecutionStatus.QUEUED]
    for execution_id in queued:
        send_after_commit(session, broker, RUN_TRIGGER, str(execution_id))
    return Fired(queued=queued, missed=len(recorded) - len(queued))


def _execution(
    trigger: ScheduledTrigger, slot: datetime, status: ExecutionStatus, now: datetime
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "trigger_id": trigger.id,
        "organization_id": trigger.organization_id,
        "source": ExecutionSource.SCHEDULE,
        "status": status,
        "scheduled_for": slot,
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "completed_at": now if status == ExecutionStatus.MISSED else None,
    }
