"""Units of work: the one way each is claimed, kept alive, retried and given up on.

Six kinds of unit live in PostgreSQL and travel through the queues as ids: scenario runs,
trigger executions, knowledge documents, calibrations, notification events and webhook
deliveries.  Dramatiq delivers at least
once, a worker can die holding a unit, Redis can restart empty.  For every kind alike:

1. **Claim** (:meth:`Work.claim`): a delivery takes a unit only while it is *waiting*
   (``pending`` / ``queued``) or *running with no sign of life* (its heartbeat older than
   ``SPAR_RUN_HEARTBEAT_TIMEOUT_S``, or cleared).  One UPDATE moves it to its running
   status, counts the delivery (``attempts + 1``) and stamps its heartbeat.  A duplicate
   delivery of a unit another worker is playing changes nothing.
2. **Heartbeat** (:func:`perform`): while a unit is in flight, its process stamps
   ``heartbeat_at`` every ``SPAR_RUN_HEARTBEAT_TIMEOUT_S / 6`` seconds (one UPDATE per
   kind per beat, for all of that process's units), whatever the unit is waiting on.
3. **Bounded deliveries** (:func:`perform`): a delivery that raises something the unit's
   own rules did not turn into an outcome releases the unit (heartbeat cleared) for
   Dramatiq's retry; when it is the unit's ``max_deliveries``-th delivery, the unit ends
   terminal instead, with the reason (``error: DataError: …``).  A delivery that finds
   the unit already claimed that many times (workers killed on it) ends it
   ``error: gave up after N deliveries that did not finish``.
4. **Sweep** (:func:`take`, from the scheduler's sweeper):
   running units whose heartbeat stopped are sent again after the heartbeat timeout;
   waiting units whose message made no progress for a stall period are sent again; and
   every waiting unit at once when the broker lost its messages.

Each kind keeps its own outcome rules (a run's end counts in its batch, a document's
chunks go with it); it hands :func:`perform` what to play and how to end in error, and
ends with :func:`finish` (a run ends with its batch's side: :mod:`shared.scenarios.store`).
A kind is one :class:`Work` declaration: the sweeper sends every kind declared
(:data:`KINDS`) to the actor it names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Table,
    Update,
    and_,
    any_,
    bindparam,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Result
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Integer, Uuid

from shared.db.base import NOW, UTCDateTime, utcnow
from shared.db.direct import Statement
from shared.db.engine import Database
from shared.db.errors import database_unavailable, describe_database_error
from shared.db.models import (
    Calibration,
    KnowledgeDocument,
    NotificationEvent,
    ScenarioRun,
    TriggerExecution,
    WebhookDelivery,
)
from shared.metrics import WORK_GIVEN_UP
from shared.queue import (
    ANNOUNCE_EVENT,
    CALIBRATE,
    DELIVER_WEBHOOK,
    PROCESS_DOCUMENT,
    RUN_SCENARIO,
    RUN_TRIGGER,
)
from shared.settings import Settings

log = logging.getLogger("spar.work")
T = TypeVar("T")

STALE_BEFORE = bindparam("p_stale", type_=UTCDateTime())
UNIT = bindparam("p_unit", type_=Uuid())  # the unit a statement is about, unless it names one
DELIVERY = bindparam("p_delivery", type_=Integer())  # which of its deliveries: its attempts
BEATS_PER_TIMEOUT = 6
MIN_BEAT_S = 0.5
PERSIST_WITHIN_S = 60.0
# Every kind declared, in declaration order: the sweeper's list.
KINDS: list[Work] = []


@dataclass(frozen=True, eq=False)
class Work:
    """One kind of unit: its table, the statuses a delivery claims, and its limits."""

    kind: str  # names the kind in messages and metric labels
    model: Any  # its ORM model
    waiting: str  # status of a unit whose message is on its way
    running: str
    max_deliveries: int
    message: tuple[str, str]  # (queue, actor) a unit's id is sent to (shared.queue)
    status_column: str = "status"
    attempts_column: str = "attempts"
    ended_column: str | None = "completed_at"  # stamped by :func:`finish`, if the kind has one
    # Waiting longer than this (not ``SPAR_RUN_STALL_S``) means the message was lost.
    waiting_stall: timedelta | None = None
    # Which waiting units are the sweeper's to send (all when ``None``).
    sweepable: Any = None
    # Waiting units expected to start at once (a batch run handed out: its message is sent
    # the moment its predecessor's end commits, and a worker killed in between loses it):
    # with no progress for ``SPAR_RUN_HEARTBEAT_TIMEOUT_S``, their message was lost.
    prompt: Any = None
    _beat: Statement = field(init=False, repr=False)
    _release: Statement = field(init=False, repr=False)

    def __post_init__(self) -> None:
        running = self.status == self.running
        units = bindparam("p_units", type_=ARRAY(Uuid()))
        # Never a released unit (heartbeat cleared): a beat that read the unit before its
        # release and stamps after it would have the next delivery find it alive.
        alive = (running, self.heartbeat.is_not(None))
        # Never a unit another transaction holds: its delivery is writing it (a turn, its
        # end), so it is alive, and the next beat stamps it.  A beat locks many units in no
        # set order: waiting for one, it could hold another that the holder waits for (a
        # batch's ends written together lock several runs: shared.scenarios.store).  The
        # lock the stamp itself takes (NO KEY UPDATE), no stronger: a row that is only
        # referenced meanwhile (a turn inserted, its foreign key's KEY SHARE) is stamped.
        free = (
            select(self.id)
            .where(self.id == any_(units), *alive)
            .with_for_update(skip_locked=True, key_share=True)
            .scalar_subquery()
        )
        beat = update(self.table).where(self.id.in_(free), *alive)
        # Only by the delivery that claimed it last: one taken for dead (its unit claimed
        # again since) must not clear the heartbeat of the delivery that now plays it.
        released = update(self.table).where(self.id == UNIT, running, self.attempts == DELIVERY)
        # Neither is progress: ``updated_at`` stays (an explicit value stops its onupdate).
        unchanged = {"updated_at": self.table.c.updated_at}
        beat = beat.values(heartbeat_at=NOW, **unchanged).returning(self.id)
        released = released.values(heartbeat_at=null(), **unchanged).returning(self.id)
        object.__setattr__(self, "_beat", Statement(beat))
        object.__setattr__(self, "_release", Statement(released))
        KINDS.append(self)

    @property
    def label(self) -> str:
        """Its units, in metric labels and the sweeper's log: ``runs``, ``documents``…"""
        return f"{self.kind}s"

    @property
    def table(self) -> Table:
        return self.model.__table__

    @property
    def id(self) -> Any:
        return self.table.c.id

    @property
    def status(self) -> Any:
        return self.table.c[self.status_column]

    @property
    def attempts(self) -> Any:
        return self.table.c[self.attempts_column]

    @property
    def heartbeat(self) -> Any:
        return self.table.c.heartbeat_at

    def silent(self, stale_before: Any) -> ColumnElement[bool]:
        """Running with no heartbeat since ``stale_before`` (or cleared)."""
        beat = or_(self.heartbeat.is_(None), self.heartbeat < stale_before)
        return and_(self.status == self.running, beat)

    def claimable(self) -> ColumnElement[bool]:
        """Waiting, or running with no heartbeat since ``:p_stale``."""
        return or_(self.status == self.waiting, self.silent(STALE_BEFORE))

    def claim(self, unit: BindParameter[Any] = UNIT, **values: Any) -> Update:
        """The UPDATE that claims the unit ``unit`` (``:p_unit`` unless given; also
        ``:p_stale`` and ``:now``, see :func:`claim_params`) with ``values`` set too; add
        its ``RETURNING``, which should include the attempts counted (:attr:`attempts`)."""
        return (
            update(self.table)
            .where(self.id == unit, self.claimable())
            .values(
                {
                    self.status_column: self.running,
                    self.attempts_column: self.attempts + 1,
                    "heartbeat_at": NOW,
                    "updated_at": NOW,
                    **values,
                }
            )
        )


def claim_params(settings: Settings) -> dict[str, datetime]:
    """``:now`` and ``:p_stale`` for a claim made now."""
    now = utcnow()
    return {"now": now, "p_stale": now - timedelta(seconds=settings.run_heartbeat_timeout_s)}


async def execute_claim(
    session: AsyncSession, claim: Any, *, settings: Settings, unit_id: UUID
) -> Result[Any]:
    """Execute ``claim`` (a :meth:`Work.claim` with its ``RETURNING``) for ``unit_id`` in
    ``session``: no row when the unit is not to be claimed (ended, gone, or alive in
    another delivery)."""
    return await session.execute(claim, {"p_unit": unit_id, **claim_params(settings)})


RUNS = Work(
    "run",
    ScenarioRun,
    waiting="pending",
    running="running",
    max_deliveries=5,
    message=RUN_SCENARIO,
    # A batch's runs never handed out are its window's to hand out, not the sweeper's.
    sweepable=or_(ScenarioRun.batch_run_id.is_(None), ScenarioRun.dispatched_at.is_not(None)),
    prompt=ScenarioRun.dispatched_at.is_not(None),
)
TRIGGER_EXECUTIONS = Work(
    "trigger_execution",
    TriggerExecution,
    waiting="queued",
    running="running",
    max_deliveries=10,
    message=RUN_TRIGGER,
    waiting_stall=timedelta(seconds=60),
)
DOCUMENTS = Work(
    "document",
    KnowledgeDocument,
    waiting="queued",
    running="processing",
    max_deliveries=5,
    message=PROCESS_DOCUMENT,
    status_column="processing_status",
    attempts_column="processing_attempts",
    ended_column=None,
)
CALIBRATIONS = Work(
    "calibration",
    Calibration,
    waiting="queued",
    running="running",
    max_deliveries=5,
    message=CALIBRATE,
)
# An event recorded in the statement that completed a batch has no message: the sweeper
# sends it after a few seconds (shared.notifications.outbox).
NOTIFICATION_EVENTS = Work(
    "notification_event",
    NotificationEvent,
    waiting="pending",
    running="announcing",
    max_deliveries=5,
    message=ANNOUNCE_EVENT,
    waiting_stall=timedelta(seconds=5),
)
# A delivery waits for its next attempt (``next_attempt_at``) as much as for its message:
# the sweeper sends those that are due, and a claim takes only those
# (shared.notifications.deliveries).  Bounded by its 24 hours of retries first; the bound
# on deliveries is above the attempts those allow.
WEBHOOK_DELIVERIES = Work(
    "webhook_delivery",
    WebhookDelivery,
    waiting="pending",
    running="sending",
    max_deliveries=40,
    message=DELIVER_WEBHOOK,
    waiting_stall=timedelta(seconds=30),
    sweepable=WebhookDelivery.next_attempt_at <= func.now(),
)


# --- playing a claimed unit ----------------------------------------------------------------------


def reason(exc: BaseException) -> str:
    """What went wrong, for a unit's error: the exception's type and first line, without
    the statement text and parameters SQLAlchemy would add."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    described = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
    return described[:500]


async def perform(
    work: Work,
    database: Database,
    settings: Settings,
    unit_id: UUID,
    attempts: int,
    *,
    play: Callable[[], Awaitable[T]],
    give_up: Callable[[str], Awaitable[T]],
) -> T:
    """Play the claimed unit ``unit_id`` (claimed for the ``attempts``-th time) with its
    heartbeat kept, and end it with ``give_up(reason)`` when its deliveries run out.

    ``play`` ends the unit by its kind's own rules; an exception out of it is unexpected
    (the kind's rules turn every expected failure into an outcome): the unit is released
    for a retry, or, at its last delivery, given up with the exception as its reason."""
    if attempts > work.max_deliveries:
        return await _given_up(
            work,
            give_up,
            f"error: gave up after {work.max_deliveries} deliveries that did not finish",
        )
    interval_s = max(settings.run_heartbeat_timeout_s / BEATS_PER_TIMEOUT, MIN_BEAT_S)
    beats = _heartbeats(database, interval_s)
    beats.add(work, unit_id)
    try:
        return await play()
    except asyncio.CancelledError:
        # Stopped from outside (a time limit, a shutdown): the next delivery may take it.
        await asyncio.shield(_release(work, database, unit_id, attempts))
        raise
    except Exception as exc:
        why = reason(exc)
        last = attempts >= work.max_deliveries
        _log_failure(work, unit_id, attempts, "giving up" if last else "to be retried", exc)
        if last:
            return await _given_up(work, give_up, f"error: {why} (after {attempts} deliveries)")
        await _release(work, database, unit_id, attempts)
        raise
    finally:
        beats.discard(work, unit_id)


def _log_failure(work: Work, unit_id: UUID, attempts: int, then: str, exc: Exception) -> None:
    """The failure with its traceback; a database error only described (its text can
    quote the values it refused: what an agent said, what a request sent)."""
    described = describe_database_error(exc)
    message = "%s %s failed (delivery %d): %s"
    if described is None:
        log.error(message, work.kind, unit_id, attempts, then, exc_info=exc)
    else:
        log.error(message + ": %s", work.kind, unit_id, attempts, then, described)


async def _given_up(work: Work, give_up: Callable[[str], Awaitable[T]], why: str) -> T:
    WORK_GIVEN_UP.labels(work.kind).inc()
    return await give_up(why)


async def _release(work: Work, database: Database, unit_id: UUID, attempts: int) -> None:
    """Clear the heartbeat of the unit this delivery (its ``attempts``-th) claimed: a retry
    claims it at once instead of waiting it out."""
    try:
        async with database.connection() as conn:
            await work._release.rows(conn, p_unit=unit_id, p_delivery=attempts)
    except Exception:  # the database is away: the heartbeat times out instead
        log.warning("could not release %s %s", work.kind, unit_id, exc_info=True)


async def finish(
    work: Work,
    database: Database,
    unit_id: UUID,
    status: str,
    *,
    then: Callable[[AsyncSession], Awaitable[Any]] | None = None,
    **values: Any,
) -> bool:
    """End the unit ``unit_id`` as ``status`` with ``values`` (its end stamped, for a kind
    that has one) if it is still running: ``False`` if another delivery ended it first.
    ``then(session)`` runs in the same transaction once it ended it (what the end causes,
    such as the event it announces: :mod:`shared.notifications.outbox`).  Waits out a
    database that is away (:func:`persist`): what the unit's delivery learned (an agent's
    reply, a judge's verdicts) is not thrown away for a moment without one."""
    ended = {work.status_column: status, **values}
    if work.ended_column is not None:
        ended[work.ended_column] = utcnow()
    statement = (
        update(work.table)
        .where(work.id == unit_id, work.status == work.running)
        .values(ended)
        .returning(work.id)
    )

    async def once() -> bool:
        async with database.transaction() as session:
            ended = await session.scalar(statement) is not None
            if ended and then is not None:
                await then(session)
            return ended

    return await persist(once)


async def persist(write: Callable[[], Awaitable[T]], *, within_s: float = PERSIST_WITHIN_S) -> T:
    """``write()``, tried again while the database is away
    (:func:`shared.db.errors.database_unavailable`) for up to ``within_s``.  For the
    writes that record what an outbound call brought back (a turn, an execution's reply, a
    calibration's verdicts): a database restart, or a moment without a free connection,
    never makes a redelivery call the agent again."""
    deadline = time.monotonic() + within_s
    delay = 0.2
    while True:
        try:
            return await write()
        except Exception as exc:
            if not database_unavailable(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("the database is away: writing again in %.1f s", delay, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


# --- heartbeats ----------------------------------------------------------------------------------


class _Heartbeats:
    """The units a process (one event loop, one database) has in flight, and the task that
    stamps their heartbeats while there are any."""

    def __init__(self, database: Database, interval_s: float) -> None:
        self.database = database
        self.interval_s = interval_s
        self.units: dict[Work, dict[UUID, int]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, work: Work, unit_id: UUID) -> None:
        held = self.units.setdefault(work, {})
        held[unit_id] = held.get(unit_id, 0) + 1
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._beat_while_held())

    def discard(self, work: Work, unit_id: UUID) -> None:
        held = self.units.get(work, {})
        count = held.get(unit_id, 0) - 1
        if count > 0:
            held[unit_id] = count
        else:
            held.pop(unit_id, None)

    async def _beat_while_held(self) -> None:
        while any(self.units.values()):
            await asyncio.sleep(self.interval_s)
            for work, held in list(self.units.items()):
                if not held:
                    continue
                try:
                    async with self.database.connection() as conn:
                        await work._beat.rows(conn, p_units=list(held), now=utcnow())
                except Exception:  # the database is away: beat again next time
                    log.warning("could not stamp %s heartbeats", work.kind, exc_info=True)


_keepers: dict[tuple[asyncio.AbstractEventLoop, Database, float], _Heartbeats] = {}


def _heartbeats(database: Database, interval_s: float) -> _Heartbeats:
    key = (asyncio.get_running_loop(), database, interval_s)
    keeper = _keepers.get(key)
    if keeper is None:
        keeper = _keepers[key] = _Heartbeats(database, interval_s)
    return keeper


# --- the sweeper's side --------------------------------------------------------------------------


async def take(
    session: AsyncSession,
    work: Work,
    settings: Settings,
    *,
    limit: int,
    broker_lost: bool = False,
) -> list[UUID]:
    """Up to ``limit`` units of ``work`` to send again: running with no heartbeat for
    ``SPAR_RUN_HEARTBEAT_TIMEOUT_S`` (a dead worker), or waiting with no progress for the
    kind's stall period (a lost message), or, when the broker lost every message it held,
    waiting at all.  Each is touched as it is taken, so the next pass leaves it as long
    again."""
    now = utcnow()
    stale_before = now - timedelta(seconds=settings.run_heartbeat_timeout_s)
    updated_at = work.table.c.updated_at
    dead = and_(work.silent(stale_before), updated_at < stale_before)
    waiting = work.status == work.waiting
    if work.sweepable is not None:
        waiting = and_(waiting, work.sweepable)
    if not broker_lost:
        stall = work.waiting_stall or timedelta(seconds=settings.run_stall_s)
        late = updated_at < now - stall
        if work.prompt is not None:
            late = or_(late, and_(work.prompt, updated_at < stale_before))
        waiting = and_(waiting, late)
    # Oldest first, skipping units another transaction holds; touched, so that the next
    # pass leaves them for as long again.
    taken = (
        select(work.id)
        .where(or_(dead, waiting))
        .order_by(updated_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    touched = update(work.table).where(work.id.in_(taken)).values(updated_at=now)
    return list(await session.scalars(touched.returning(work.id)))
