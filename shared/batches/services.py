"""Batch runs (DESIGN §5.3): fan-out in bulk, a sliding dispatch window, exact counters.

* Creating a batch resolves its scenarios (ids and/or tags) and inserts one pending run
  per scenario, each with its snapshot: on PostgreSQL one ``INSERT … SELECT`` builds them
  all in the database (:func:`shared.scenarios.services.snapshot_source`).
* The window: at most ``max_concurrency`` runs of a batch are in flight across every
  worker.  The batch row counts the runs handed out (``dispatched_scenarios``) and the
  runs ended (``completed_scenarios``); the difference is the window in use.
* :func:`dispatch` fills the window (locking the batch row to count it): the first runs
  of a new batch, or places lost with a message (the sweeper offers it to every active
  batch).
* A run's end hands its place to the next run and counts the run in the same commit as
  its move to a terminal state (:func:`hand_over`, :func:`count_end`), so
  ``completed = passed + failed + error`` always holds, nothing is counted twice, the
  batch completes with its last run, and a successor is dispatched the moment its
  predecessor ends.  The run engine folds both into the run's own last statement on
  PostgreSQL (:mod:`shared.scenarios.store`), or calls :func:`settle_run` in its
  transaction elsewhere; either way the batch row, the one row every run of the batch
  writes, is locked last.

The caller commits, then sends the runs handed out: a message is only a pointer to a
committed row.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import msgspec
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Insert,
    Text,
    Update,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.batches import schemas
from shared.db.base import NOW, utcnow
from shared.db.engine import session_scope
from shared.db.models import BatchRun, Scenario, ScenarioRun, TurnResult
from shared.db.queries import one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.outbound.services import agent_in_org
from shared.paging import Paging, paginate
from shared.scenarios.schemas import TERMINAL_STATUSES
from shared.scenarios.services import snapshot_source, snapshots, tag_filter

ACTIVE = ("queued", "running")
_runs = ScenarioRun.__table__
_batches = BatchRun.__table__


async def create_batch(
    session: AsyncSession, access: OrgAccess, body: schemas.BatchRunCreate
) -> BatchRun:
    if not body.scenario_ids and not body.tags:
        raise InvalidInput(("body",), "give scenario_ids and/or tags", type="missing")
    agent = await agent_in_org(session, access.organization_id, body.agent_id)
    conditions = []
    if body.scenario_ids:
        conditions.append(Scenario.id.in_(set(body.scenario_ids)))
    if body.tags:
        conditions.append(tag_filter(session, list(body.tags)))
    matching = or_(*conditions)
    scenario_ids = list(
        await session.scalars(
            select(Scenario.id).where(Scenario.organization_id == access.organization_id, matching)
        )
    )
    missing = set(body.scenario_ids) - set(scenario_ids)
    if missing:
        raise NotFound(f"scenario not found: {', '.join(sorted(map(str, missing)))}")
    if not scenario_ids:
        raise InvalidInput(("body", "tags"), "no scenario matches these tags", input=body.tags)
    now = utcnow()
    batch = BatchRun(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        agent_id=agent.id,
        agent_name=agent.name,
        status="queued",
        max_concurrency=body.max_concurrency,
        total_scenarios=len(scenario_ids),
        created_by_user_id=access.principal.user_id,
        created_at=now,
        updated_at=now,
    )
    session.add(batch)
    await session.flush()
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            _FAN_OUT,
            {
                "p_ids": scenario_ids,
                "p_org": access.organization_id,
                "p_agent": agent.id,
                "p_batch": batch.id,
                "p_user": access.principal.user_id,
                "now": now,
            },
        )
        return batch
    rows = []
    for position, (scenario_id, snapshot) in enumerate(
        await snapshots(session, access.organization_id, matching)
    ):
        run_id = uuid.uuid4()
        rows.append(
            {
                "id": run_id,
                "organization_id": access.organization_id,
                "scenario_id": scenario_id,
                "agent_id": agent.id,
                "status": "pending",
                "session_id": f"spar-{run_id}",
                "snapshot": snapshot,
                "cost_summary": {},
                "batch_run_id": batch.id,
                "created_by_user_id": access.principal.user_id,
                # Distinct, ordered timestamps: runs are dispatched in the batch's order.
                "created_at": now + timedelta(microseconds=position),
                "updated_at": now,
            }
        )
    await session.execute(insert(_runs), rows)
    return batch


def _fan_out() -> Insert:
    """PostgreSQL: one pending run per scenario of ``:p_ids``, each with its snapshot, built
    and inserted by the database (the same rows the portable path above writes)."""
    picked = (
        func.unnest(bindparam("p_ids", type_=ARRAY(Uuid())))
        .table_valued("id")
        .render_derived(name="picked")
    )
    built = snapshot_source(picked)
    source = select(func.gen_random_uuid().label("id"), built).subquery("source")
    microsecond = literal_column("interval '1 microsecond'")
    return insert(_runs).from_select(
        [
            "id",
            "organization_id",
            "scenario_id",
            "agent_id",
            "status",
            "session_id",
            "snapshot",
            "cost_summary",
            "batch_run_id",
            "created_by_user_id",
            "created_at",
            "updated_at",
        ],
        select(
            source.c.id,
            bindparam("p_org", type_=Uuid()),
            source.c.scenario_id,
            bindparam("p_agent", type_=Uuid()),
            literal_column("'pending'"),
            literal_column("'spar-'") + cast(source.c.id, Text),
            source.c.snapshot,
            literal_column("'{}'::jsonb"),
            bindparam("p_batch", type_=Uuid()),
            bindparam("p_user", type_=Uuid()),
            # Distinct, ordered timestamps: runs are dispatched in the batch's order.
            NOW + (source.c.position - 1) * microsecond,
            NOW,
        ),
    )


_FAN_OUT = _fan_out()


async def get_batch(session: AsyncSession, access: OrgAccess, batch_id: UUID) -> BatchRun:
    return await one_in_org(
        session, BatchRun, access.organization_id, batch_id, "batch run", populate_existing=True
    )


async def list_batches(
    session: AsyncSession, access: OrgAccess, paging: Paging, status: str | None = None
) -> tuple[list[BatchRun], int]:
    query = select(BatchRun).where(BatchRun.organization_id == access.organization_id)
    if status:
        query = query.where(BatchRun.status == status)
    return await paginate(session, query, paging, BatchRun.created_at, BatchRun.id)


async def run_summaries(
    session: AsyncSession,
    batch_id: UUID,
    *,
    ended: bool = False,
    ended_since: datetime | None = None,
) -> list[schemas.BatchRunItemSummary]:
    """A summary of each run of the batch (the batch detail's ``runs`` and the events
    stream's ``run`` events), in the batch's order; with ``ended``, only the terminal runs
    (those that ended at ``ended_since`` or later, when given) in the order they ended."""
    passed_turns = (
        select(func.count(TurnResult.id))
        .where(TurnResult.run_id == ScenarioRun.id, TurnResult.passed)
        .scalar_subquery()
    )
    query = select(
        ScenarioRun.id,
        ScenarioRun.scenario_id,
        ScenarioRun.status,
        ScenarioRun.snapshot,
        ScenarioRun.completed_at,
        passed_turns,
    ).where(ScenarioRun.batch_run_id == batch_id)
    if ended:
        query = query.where(ScenarioRun.status.in_(TERMINAL_STATUSES)).order_by(
            ScenarioRun.completed_at, ScenarioRun.id
        )
        if ended_since is not None:
            query = query.where(ScenarioRun.completed_at >= ended_since)
    else:
        query = query.order_by(ScenarioRun.created_at, ScenarioRun.id)
    return [
        schemas.BatchRunItemSummary(
            id=run_id,
            scenario_id=scenario_id,
            scenario_name=str((snap or {}).get("name") or ""),
            status=status,
            passed_turns=passed,
            total_turns=len((snap or {}).get("turns") or []),
            completed_at=completed_at,
        )
        for run_id, scenario_id, status, snap, completed_at, passed in await session.execute(query)
    ]


async def cancel_batch(session: AsyncSession, access: OrgAccess, batch_id: UUID) -> BatchRun:
    """Stop dispatching: runs not yet handed out end as ``error`` (cancelled); runs in
    flight finish and are counted; the batch ends as ``error``."""
    batch = await get_batch(session, access, batch_id)
    if batch.status not in ACTIVE:
        raise Conflict(f"batch run is already {batch.status}")
    now = utcnow()
    # The runs first, the batch row last, like a run's end (settle_run): the other order
    # could deadlock with one.  A run being handed out right now is skipped here and
    # counted when it ends.
    cancelled = await session.execute(
        update(ScenarioRun)
        .where(
            ScenarioRun.batch_run_id == batch.id,
            ScenarioRun.status == "pending",
            ScenarioRun.dispatched_at.is_(None),
        )
        .values(status="error", error_message="cancelled", completed_at=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    count = cancelled.rowcount or 0
    ended = await session.execute(
        update(BatchRun)
        .where(BatchRun.id == batch.id, BatchRun.status.in_(ACTIVE))
        .values(
            completed_scenarios=BatchRun.completed_scenarios + count,
            error_scenarios=BatchRun.error_scenarios + count,
            status="error",
            error_message="cancelled",
            completed_at=now,
            updated_at=now,
        )
        .returning(BatchRun.id)
        .execution_options(synchronize_session=False)
    )
    if ended.first() is None:  # it ended meanwhile: the request rolls back
        raise Conflict("batch run has already ended")
    return await get_batch(session, access, batch_id)


# --- a run's end ---------------------------------------------------------------------------------
# Every run of a batch executes these, so they are built once.  The run engine runs them in
# its transaction (settle_run) or, on PostgreSQL, folded into one statement with the run's
# own end (shared.scenarios.store).

# Two comparisons, not IN: an IN list is re-rendered on every execution.
_active = or_(_batches.c.status == ACTIVE[0], _batches.c.status == ACTIVE[1])


def hand_over(batch_id: ColumnElement[Any]) -> Update:
    """The UPDATE that gives a finished run's place in the window to the batch's next run
    (``RETURNING`` its id; none when nothing is left or the batch is over).

    The successor needs no count: the run that ended held a place and gives it to at most
    one run.  A run locked by another hand-out is skipped, never waited for."""
    runs = _runs.alias("next_run")
    following = (
        select(runs.c.id)
        .where(
            runs.c.batch_run_id == batch_id,
            runs.c.dispatched_at.is_(None),
            runs.c.status == "pending",
            # Read, not locked: a cancel takes the runs before the batch row (cancel_batch).
            select(_batches.c.id).where(_batches.c.id == batch_id, _active).exists(),
        )
        .order_by(runs.c.created_at, runs.c.id)
        .limit(1)
        .with_for_update(skip_locked=True, of=runs)
        .scalar_subquery()
    )
    return (
        update(_runs)
        .where(_runs.c.id == following)
        .values(dispatched_at=NOW, updated_at=NOW)
        .returning(_runs.c.id)
    )


def count_end(batch_id: ColumnElement[Any], handed: ColumnElement[Any]) -> Update:
    """The UPDATE that counts one run's end (``:add_passed``, ``:add_failed``,
    ``:add_error``: one of them 1, see :func:`end_counts`) and the ``handed`` runs that took
    its place; the batch completes with its last run."""
    completed = _batches.c.completed_scenarios + 1
    ends = and_(_active, completed >= _batches.c.total_scenarios)
    return (
        update(_batches)
        .where(_batches.c.id == batch_id)
        .values(
            completed_scenarios=completed,
            passed_scenarios=_batches.c.passed_scenarios + bindparam("add_passed"),
            failed_scenarios=_batches.c.failed_scenarios + bindparam("add_failed"),
            error_scenarios=_batches.c.error_scenarios + bindparam("add_error"),
            dispatched_scenarios=_batches.c.dispatched_scenarios + handed,
            status=case((ends, "completed"), else_=_batches.c.status),
            completed_at=case((ends, NOW), else_=_batches.c.completed_at),
            updated_at=NOW,
        )
        .returning(_batches.c.id)
    )


def end_counts(status: str) -> dict[str, int]:
    """The parameters of :func:`count_end` for a run that ended as ``status``."""
    return {f"add_{kind}": int(status == kind) for kind in ("passed", "failed", "error")}


_HAND_OVER = hand_over(bindparam("batch_id"))
_COUNT_END = count_end(bindparam("batch_id"), bindparam("handed"))


async def settle_run(session: AsyncSession, batch_id: UUID, status: str) -> list[UUID]:
    """Hand one ended run's place to the next run of its batch and count the run; call it in
    the transaction of the run's move to ``status``.  Returns the run handed out (if any),
    to send after the commit.

    The batch row, which every run of the batch writes, is locked last, just before the
    commit."""
    conn = await session.connection()
    now = utcnow()
    handed = list((await conn.execute(_HAND_OVER, {"batch_id": batch_id, "now": now})).scalars())
    await conn.execute(
        _COUNT_END, {"batch_id": batch_id, "now": now, "handed": len(handed), **end_counts(status)}
    )
    return handed


async def dispatch(session: AsyncSession, batch_id: UUID) -> list[UUID]:
    """Hand out the next runs, as many as the window has room for (``max_concurrency``
    minus the runs handed out and not yet ended): the first runs of a new batch, or runs
    whose place was lost.  The caller commits, then sends them."""
    window = (
        await session.execute(
            select(
                BatchRun.status,
                BatchRun.max_concurrency,
                BatchRun.dispatched_scenarios,
                BatchRun.completed_scenarios,
            )
            .where(BatchRun.id == batch_id)
            .with_for_update()
        )
    ).one_or_none()
    if window is None:
        return []
    status, max_concurrency, dispatched, completed = window
    free = max_concurrency - (dispatched - completed)
    if status not in ACTIVE or free <= 0:
        return []
    now = utcnow()
    following = (
        select(ScenarioRun.id)
        .where(
            ScenarioRun.batch_run_id == batch_id,
            ScenarioRun.dispatched_at.is_(None),
            ScenarioRun.status == "pending",
        )
        .order_by(ScenarioRun.created_at, ScenarioRun.id)
        .limit(free)
        # A run being handed out by a run's end (settle_run) is its; skip it.
        .with_for_update(skip_locked=True)
    )
    handed = await session.execute(
        update(ScenarioRun)
        .where(ScenarioRun.id.in_(following))
        .values(dispatched_at=now, updated_at=now)
        .returning(ScenarioRun.id, ScenarioRun.created_at)
        .execution_options(synchronize_session=False)
    )
    # RETURNING has no order: send them in the batch's.
    ids = [run_id for run_id, _ in sorted(handed, key=lambda row: (row[1], row[0]))]
    await session.execute(
        update(BatchRun)
        .where(BatchRun.id == batch_id)
        .values(
            dispatched_scenarios=BatchRun.dispatched_scenarios + len(ids),
            status="running",
            started_at=func.coalesce(BatchRun.started_at, now),
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    return ids


async def dispatch_committed(
    factory: async_sessionmaker[AsyncSession], batch_id: UUID
) -> list[UUID]:
    """:func:`dispatch` in its own transaction: the returned runs are committed, send them."""
    async with session_scope(factory) as session:
        return await dispatch(session, batch_id)


def batch_read(
    batch: BatchRun, runs: list[schemas.BatchRunItemSummary] | None = None
) -> schemas.BatchRunRead:
    return schemas.BatchRunRead(
        id=batch.id,
        organization_id=batch.organization_id,
        agent_id=batch.agent_id,
        agent_name=batch.agent_name,
        status=batch.status,
        total_scenarios=batch.total_scenarios,
        completed_scenarios=batch.completed_scenarios,
        passed_scenarios=batch.passed_scenarios,
        failed_scenarios=batch.failed_scenarios,
        error_scenarios=batch.error_scenarios,
        max_concurrency=batch.max_concurrency,
        started_at=batch.started_at,
        completed_at=batch.completed_at,
        created_at=batch.created_at,
        updated_at=batch.updated_at,
        error_message=batch.error_message,
        runs=runs if runs is not None else msgspec.UNSET,
    )
