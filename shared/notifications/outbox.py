"""Recording that something happened (DESIGN §5.13): one ``notification_events`` row, written
in the very transaction that made it happen, so no event is ever lost between its source
committing and a worker hearing of it.

* :func:`emit`, for a source holding a session (a trigger execution that fails, a
  calibration that completes): the row, and its message to the ``notifications`` queue
  once the caller commits (or, with no broker at hand, from the sweeper);
* :func:`recorded_when_completed`, for the run engine, whose statements commit on their own
  (:mod:`shared.batches.window`): the same INSERT as a CTE of the statement that moves a
  batch to ``completed``.  Nobody sends its message: the sweeper does, within a few
  seconds plus ``SPAR_SWEEP_INTERVAL_S`` (:data:`shared.work.NOTIFICATION_EVENTS`).

An event is recorded only when an active endpoint of its organization subscribes to it, and
once per subject (``type`` and ``subject_id`` are unique): a source that runs twice records
it once.  What it says (its ``data``) is built as it is announced
(:mod:`shared.notifications.announce`), from its subject, which no longer changes by
then; a source that has the data at hand gives it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import dramatiq
from sqlalchemy import CTE, ColumnElement, Insert, Label, func, literal, select
from sqlalchemy.dialects.postgresql import array, insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Uuid

from shared.db.base import NOW, JSONType, utcnow
from shared.db.models import NotificationEvent, WebhookEndpoint
from shared.notifications.schemas import EventStatus
from shared.queue import ANNOUNCE_EVENT, send_after_commit

BATCH_COMPLETED = "batch.completed"
BATCH_REGRESSED = "batch.regressed"
TRIGGER_EXECUTION_FAILED = "trigger.execution.failed"
CALIBRATION_COMPLETED = "calibration.completed"

_events = NotificationEvent.__table__
_endpoints = WebhookEndpoint.__table__


def subscribed(organization_id: ColumnElement[Any], event_type: str) -> ColumnElement[bool]:
    """An active endpoint of the organization takes ``event_type``."""
    return (
        select(_endpoints.c.id)
        .where(
            _endpoints.c.organization_id == organization_id,
            _endpoints.c.active,
            _endpoints.c.events.has_any(array((event_type,))),
        )
        .exists()
    )


def _record(
    event_type: str,
    organization_id: ColumnElement[Any],
    subject_id: ColumnElement[Any],
    *,
    where: ColumnElement[bool] | None = None,
    source: Any = None,
    data: ColumnElement[Any] | None = None,
) -> Insert:
    """``INSERT … SELECT`` of the event, for each row of ``source`` meeting ``where``, when
    the organization has a subscriber; nothing when it is recorded already."""
    row: dict[str, ColumnElement[Any]] = {
        "id": func.gen_random_uuid(),
        "organization_id": organization_id,
        "type": literal(event_type),
        "subject_id": subject_id,
        "status": literal(EventStatus.PENDING.value),
        "attempts": literal(0),
        "created_at": NOW,
        "updated_at": NOW,
    }
    if data is not None:
        row["data"] = data
    query = select(*(value.label(name) for name, value in row.items()))
    if source is not None:
        query = query.select_from(source)
    conditions = [subscribed(organization_id, event_type)]
    if where is not None:
        conditions.insert(0, where)
    return (
        insert(_events)
        .from_select(list(row), query.where(*conditions))
        .on_conflict_do_nothing(index_elements=["type", "subject_id"])
        .returning(_events.c.id)
    )


async def emit(
    session: AsyncSession,
    *,
    event_type: str,
    organization_id: UUID,
    subject_id: UUID,
    broker: dramatiq.Broker | None = None,
    data: dict[str, Any] | None = None,
) -> UUID | None:
    """Record the event ``event_type`` of ``subject_id`` in the caller's transaction: its id,
    or ``None`` when nobody subscribes to it or it was recorded already.  Announced once the
    caller commits (by a message, with ``broker``; else by the sweeper)."""
    statement = _record(
        event_type,
        literal(organization_id, Uuid()),
        literal(subject_id, Uuid()),
        data=None if data is None else literal(data, JSONType),
    )
    event_id: UUID | None = await session.scalar(statement, {"now": utcnow()})
    if event_id is not None and broker is not None:
        send_after_commit(session, broker, ANNOUNCE_EVENT, str(event_id))
    return event_id


def recorded_when_regressed(batches: CTE) -> Label[Any]:
    """The ``batch.regressed`` event of each batch of ``batches`` (a CTE of an UPDATE of
    batch runs storing their comparison, ``RETURNING id, organization_id, comparison``) whose
    comparison holds a significant regression, as a column to select in that statement: the
    comparison and the event that announces it commit together, or neither does."""
    significant = func.coalesce(
        batches.c.comparison["significant_regressions"].as_integer(), literal(0)
    )
    return _recorded_by(BATCH_REGRESSED, batches, where=significant > 0)


def recorded_when_completed(batches: CTE) -> Label[Any]:
    """The ``batch.completed`` event of each batch of ``batches`` (a CTE of an UPDATE of
    batch runs ``RETURNING id, organization_id, status``) that it left ``completed``, as a
    column (the events recorded) to select in that statement.  A batch completes with the
    end of its last run, which is counted once, so the statement that leaves it
    ``completed`` is the one that completed it."""
    return _recorded_by(BATCH_COMPLETED, batches, where=batches.c.status == "completed")


def _recorded_by(event_type: str, batches: CTE, *, where: ColumnElement[bool]) -> Label[Any]:
    """The ``event_type`` event of each batch of ``batches`` meeting ``where``, recorded by
    the statement that selects this column (how many were)."""
    recorded = _record(
        event_type, batches.c.organization_id, batches.c.id, where=where, source=batches
    ).cte(f"recorded_{event_type.replace('.', '_')}")
    return select(func.count()).select_from(recorded).scalar_subquery().label("events")
