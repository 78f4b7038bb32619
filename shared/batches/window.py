"""A batch's window and counters (DESIGN §5.3): everything that hands out, counts and stops
the runs of a batch lives here.

* **The window**: at most ``max_concurrency`` runs of a batch are in flight across every
  worker.  The batch row counts the runs handed out (``dispatched_scenarios``) and the
  runs ended (``completed_scenarios``); the difference is the window in use.
* **Dispatch** (:func:`dispatch`) fills the window: the first runs of a new batch (the
  ``batches`` actor), or places lost with a message (:func:`reoffer`, from the sweeper).
  It locks the batch row to count the room, then takes runs with ``SKIP LOCKED``, so it
  never waits for a run another transaction holds.
* **Settling** (:func:`settle`): the batch's side of runs moving to a terminal state, as
  CTEs the caller composes into the very statement that moves them.  A run's end, or a
  group of a batch's ends written in one transaction (:mod:`shared.scenarios.store`),
  hands each place to the next run and counts itself; a cancel (:func:`cancel`) ends the
  runs not handed out and closes the batch.  Either way
  ``completed = passed + failed + error`` holds, nothing is counted twice, and the batch
  completes with its last run.

**The invariant**, which CHECK constraints on ``batch_runs`` state too (``ck_batch_runs_*``,
migration 0015), so PostgreSQL refuses a write that breaks it: every counter is at least 0;
``completed = passed + failed + error <= total``; ``dispatched <= total`` (a run is handed
out once); and, while the batch is active (``queued`` or ``running``), ``completed <=
dispatched`` and ``dispatched - completed <= max_concurrency`` (``ck_batch_runs_window``):
the window in use is the runs in flight.

**The exception: a cancel counts runs as completed without dispatching them.**  The runs
not yet handed out end as ``error`` and are added to ``completed`` and ``error``, never to
``dispatched``, in the statement that moves the batch to ``error``; so an ended batch may
have ``completed > dispatched``, and ``dispatched - completed`` then means nothing.  No
arithmetic reads it there: :func:`dispatch` hands out nothing for a batch that is not
active, and a run's end hands out no successor for one (:func:`_hand_over`).  The runs in
flight at the cancel still end and are counted, until ``completed = total``
(``services.is_over``).  That is why ``ck_batch_runs_window`` holds only while the batch is
active.

**The lock order** is written once, in :func:`settle`: the runs first (the caller's UPDATE
of the runs, which ``settle`` takes as its input, then the successors, ``SKIP LOCKED``),
the batch row last.  A run's end and a cancel both go through it, so they never deadlock,
and the batch row, which every run of the batch writes, is held for the shortest time.

**Dispatch takes the batch row first**, the other way round, and is the one exception: in
a transaction of its own (:func:`dispatch_committed`), holding nothing, it locks the batch
row (``FOR UPDATE``) so two dispatches never count the same room, then hands out runs
``FOR UPDATE SKIP LOCKED`` and adds them to ``dispatched`` on the row it already holds.
Once it has the batch row it never waits for a lock: a run another transaction holds (a
successor being handed out, a run a cancel is ending) is skipped, not waited for.  So a
settle waiting for the batch row behind a dispatch only waits for that dispatch's commit,
and no cycle can form; a cancel that meets runs the dispatch has just handed out waits for
its commit, then leaves them (no longer ``dispatched_at IS NULL``) in flight.  The room a
dispatch counts stays true meanwhile: a run that ends concurrently is counted only after
the dispatch commits, and hands its place to one successor, so the runs in flight never
exceed ``max_concurrency``.

The caller commits, then sends the runs handed out: a message is only a pointer to a
committed row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import (
    CTE,
    ColumnElement,
    Label,
    and_,
    bindparam,
    case,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from shared.batches.schemas import BatchStatus
from shared.db.base import NOW, utcnow
from shared.db.engine import Database
from shared.db.models import BatchRun, ScenarioRun
from shared.notifications.outbox import recorded_when_completed
from shared.scenarios.schemas import RunStatus

ACTIVE = (BatchStatus.QUEUED, BatchStatus.RUNNING)
_runs = ScenarioRun.__table__
_batches = BatchRun.__table__
# Two comparisons, not IN: an IN list is re-rendered on every execution.
_active = or_(_batches.c.status == ACTIVE[0], _batches.c.status == ACTIVE[1])
CANCELLED = "cancelled"


# --- settling: the one place runs' ends reach their batch -----------------------------------------


def _hand_over(batch_id: ColumnElement[Any], places: ColumnElement[int]) -> CTE:
    """Give the ``places`` ended runs left in the window to the batch's next runs
    (``RETURNING`` their ids; fewer when fewer are left, none when the batch is over).  A
    run locked by another hand-out is skipped, never waited for.

    Their ``updated_at`` is set here, as :func:`settle`'s are: the run engine executes these
    straight on psycopg, where the model's ``onupdate`` does not apply."""
    runs = _runs.alias("next_run")
    following = (
        select(runs.c.id)
        .where(
            runs.c.batch_run_id == batch_id,
            runs.c.dispatched_at.is_(None),
            runs.c.status == RunStatus.PENDING,
            # Read, not locked: the batch row is locked last (see the module docstring).
            select(_batches.c.id).where(_batches.c.id == batch_id, _active).exists(),
        )
        .order_by(runs.c.created_at, runs.c.id)
        .limit(places)
        .with_for_update(skip_locked=True, of=runs)
    )
    return (
        update(_runs)
        .where(_runs.c.id.in_(following))
        .values(dispatched_at=NOW, updated_at=NOW)
        .returning(_runs.c.id)
        .cte("handed")
    )


def _count(ended: CTE, status: RunStatus | None) -> ColumnElement[int]:
    query = select(func.count()).select_from(ended)
    if status is not None:
        query = query.where(ended.c.status == status)
    return query.scalar_subquery()


def settle(
    ended: CTE, *, batch_id: ColumnElement[Any] | None = None, cancel: bool = False
) -> list[Label[Any]]:
    """The batch's side of the runs ``ended`` (a CTE: runs moved to a terminal state,
    ``batch_run_id`` and ``status``), as columns to select in the same statement:

    * runs' ends (``cancel`` false; the runs of one batch, read from ``ended`` when it holds
      one run, else ``batch_id``): ``successors``, the runs handed out in their places (an
      array, ``NULL`` if none), ``events`` (the ``batch.completed`` event recorded when
      these ends completed the batch: :mod:`shared.notifications.outbox`) and ``counted``
      (1 when they were counted in a batch);
    * a cancel (``batch_id`` given): ``counted`` is 1 when the batch was still active and
      is now ``error`` with the ended runs counted, 0 when it had already ended.

    Runs first, the batch row last: the lock order of every batch transition."""
    batch = batch_id if batch_id is not None else select(ended.c.batch_run_id).scalar_subquery()
    add = {
        "completed_scenarios": _batches.c.completed_scenarios + _count(ended, None),
        "passed_scenarios": _batches.c.passed_scenarios + _count(ended, RunStatus.PASSED),
        "failed_scenarios": _batches.c.failed_scenarios + _count(ended, RunStatus.FAILED),
        "error_scenarios": _batches.c.error_scenarios + _count(ended, RunStatus.ERROR),
    }
    columns: list[Label[Any]] = []
    if cancel:
        counted = (
            update(_batches)
            .where(_batches.c.id == batch, _active)
            .values(
                **add,
                status=BatchStatus.ERROR,
                error_message=CANCELLED,
                completed_at=NOW,
                updated_at=NOW,
            )
            .returning(_batches.c.id)
            .cte("counted")
        )
    else:
        handed = _hand_over(batch, _count(ended, None))
        columns.append(select(func.array_agg(handed.c.id)).scalar_subquery().label("successors"))
        ends = and_(_active, add["completed_scenarios"] >= _batches.c.total_scenarios)
        counted = (
            update(_batches)
            .where(_batches.c.id == batch)
            .values(
                **add,
                dispatched_scenarios=_batches.c.dispatched_scenarios
                + select(func.count()).select_from(handed).scalar_subquery(),
                status=case((ends, BatchStatus.COMPLETED), else_=_batches.c.status),
                completed_at=case((ends, NOW), else_=_batches.c.completed_at),
                updated_at=NOW,
            )
            .returning(_batches.c.id, _batches.c.organization_id, _batches.c.status)
            .cte("counted")
        )
        # The batch's completion, announced to its organization's webhooks: recorded in the
        # statement that completes it, never lost between two commits.
        columns.append(recorded_when_completed(counted))
    columns.append(select(func.count()).select_from(counted).scalar_subquery().label("counted"))
    return columns


# --- cancel ---------------------------------------------------------------------------------------

_CANCELLED_RUNS = (
    update(_runs)
    .where(
        _runs.c.batch_run_id == bindparam("p_batch"),
        _runs.c.status == RunStatus.PENDING,
        # A run handed out is in flight: it finishes and is counted when it ends.
        _runs.c.dispatched_at.is_(None),
    )
    .values(status=RunStatus.ERROR, error_message=CANCELLED, completed_at=NOW)
    .returning(_runs.c.batch_run_id, _runs.c.status)
    .cte("cancelled")
)
_CANCEL = select(*settle(_CANCELLED_RUNS, batch_id=bindparam("p_batch"), cancel=True))


async def cancel(session: AsyncSession, *, batch_id: UUID) -> bool:
    """Stop handing out the batch's runs: those not yet handed out end as ``error``
    (cancelled), the batch as ``error``; runs in flight finish and are counted.  False when
    the batch had already ended (the caller rolls back)."""
    counted = await session.scalar(_CANCEL, {"p_batch": batch_id, "now": utcnow()})
    return bool(counted)


# --- dispatch -------------------------------------------------------------------------------------

_WINDOW = (
    select(
        _batches.c.status,
        _batches.c.max_concurrency,
        _batches.c.dispatched_scenarios,
        _batches.c.completed_scenarios,
    )
    .where(_batches.c.id == bindparam("p_batch"))
    # The batch row first: two dispatches must not both count the same room.  The runs
    # are then taken SKIP LOCKED, so this never waits for a run's end or a cancel.
    .with_for_update()
)
_following = (
    select(_runs.c.id)
    .where(
        _runs.c.batch_run_id == bindparam("p_batch"),
        _runs.c.dispatched_at.is_(None),
        _runs.c.status == RunStatus.PENDING,
    )
    .order_by(_runs.c.created_at, _runs.c.id)
    .limit(bindparam("p_free"))
    # A run being handed out by a run's end (settle) is its; skip it.
    .with_for_update(skip_locked=True)
    .scalar_subquery()
)
_HAND_OUT = (
    update(_runs)
    .where(_runs.c.id.in_(_following))
    .values(dispatched_at=NOW)
    .returning(_runs.c.id, _runs.c.created_at)
)
_COUNT_HANDED = (
    update(_batches)
    .where(_batches.c.id == bindparam("p_batch"))
    .values(
        dispatched_scenarios=_batches.c.dispatched_scenarios + bindparam("p_handed"),
        status=BatchStatus.RUNNING,
        started_at=func.coalesce(_batches.c.started_at, NOW),
    )
)


async def dispatch(session: AsyncSession, *, batch_id: UUID) -> list[UUID]:
    """Hand out the next runs, as many as the window has room for (``max_concurrency``
    minus the runs handed out and not yet ended), in the batch's order.  The caller
    commits, then sends them."""
    conn = await session.connection()
    window = (await conn.execute(_WINDOW, {"p_batch": batch_id})).one_or_none()
    if window is None:
        return []
    free = window.max_concurrency - (window.dispatched_scenarios - window.completed_scenarios)
    if window.status not in ACTIVE or free <= 0:
        return []
    params = {"p_batch": batch_id, "now": utcnow()}
    handed = await conn.execute(_HAND_OUT, {**params, "p_free": free})
    # RETURNING has no order: send them in the batch's.
    ids = [row.id for row in sorted(handed, key=lambda row: (row.created_at, row.id))]
    await conn.execute(_COUNT_HANDED, {**params, "p_handed": len(ids)})
    return ids


async def dispatch_committed(database: Database, batch_id: UUID) -> list[UUID]:
    """:func:`dispatch` in its own transaction: the returned runs are committed, send them."""
    async with database.transaction() as session:
        return await dispatch(session, batch_id=batch_id)


async def reoffer(database: Database) -> list[UUID]:
    """Offer every active batch a dispatch (the sweeper's pass): runs whose place was lost
    with a message are handed out again.  Each batch in its own transaction; the returned
    runs are committed, send them."""
    async with database.transaction() as session:
        batches: Sequence[UUID] = list(await session.scalars(select(_batches.c.id).where(_active)))
    handed: list[UUID] = []
    for batch_id in batches:
        handed += await dispatch_committed(database, batch_id)
    return handed
