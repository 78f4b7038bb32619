"""Batch runs (DESIGN §5.3): fan-out in bulk, a sliding dispatch window, exact counters.

* Creating a batch resolves its scenarios (ids and/or tags) and inserts one pending run
  per scenario in bulk, each with its snapshot.
* :func:`dispatch` hands out at most ``max_concurrency`` runs at a time across every
  worker: it locks the batch row, counts the runs dispatched and not yet terminal, and
  marks the next ones dispatched.  The caller commits, then sends them.
* :func:`count_terminal_run` is called by the run engine in the same transaction as a
  run's move to a terminal state, so ``completed = passed + failed + error`` always holds
  and nothing is counted twice; the batch completes when every run is terminal.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from uuid import UUID

import msgspec
from sqlalchemy import and_, case, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from shared.batches import schemas
from shared.db.base import utcnow
from shared.db.engine import session_scope
from shared.db.models import BatchRun, Scenario, ScenarioRun, ScenarioTurn, TurnResult
from shared.db.queries import one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.outbound.services import agent_in_org
from shared.paging import Paging, paginate
from shared.scenarios.services import snapshot, tag_filter

ACTIVE = ("queued", "running")
IN_FLIGHT = ("pending", "running")


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
    scenarios = list(
        await session.scalars(
            select(Scenario)
            .where(Scenario.organization_id == access.organization_id, or_(*conditions))
            .options(selectinload(Scenario.turns).selectinload(ScenarioTurn.criteria))
            .order_by(Scenario.created_at, Scenario.id)
        )
    )
    missing = set(body.scenario_ids) - {s.id for s in scenarios}
    if missing:
        raise NotFound(f"scenario not found: {', '.join(sorted(map(str, missing)))}")
    if not scenarios:
        raise InvalidInput(("body", "tags"), "no scenario matches these tags", input=body.tags)
    now = utcnow()
    batch = BatchRun(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        agent_id=agent.id,
        agent_name=agent.name,
        status="queued",
        max_concurrency=body.max_concurrency,
        total_scenarios=len(scenarios),
        created_by_user_id=access.principal.user_id,
        created_at=now,
        updated_at=now,
    )
    session.add(batch)
    await session.flush()
    rows = []
    for position, scenario in enumerate(scenarios):
        run_id = uuid.uuid4()
        rows.append(
            {
                "id": run_id,
                "organization_id": access.organization_id,
                "scenario_id": scenario.id,
                "agent_id": agent.id,
                "status": "pending",
                "session_id": f"spar-{run_id}",
                "snapshot": snapshot(scenario),
                "cost_summary": {},
                "batch_run_id": batch.id,
                "created_by_user_id": access.principal.user_id,
                # Distinct, ordered timestamps: runs are dispatched in the batch's order.
                "created_at": now + timedelta(microseconds=position),
                "updated_at": now,
            }
        )
    await session.execute(insert(ScenarioRun), rows)
    return batch


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


async def run_summaries(session: AsyncSession, batch_id: UUID) -> list[schemas.BatchRunItemSummary]:
    passed_turns = (
        select(func.count(TurnResult.id))
        .where(TurnResult.run_id == ScenarioRun.id, TurnResult.passed)
        .scalar_subquery()
    )
    rows = await session.execute(
        select(
            ScenarioRun.id,
            ScenarioRun.scenario_id,
            ScenarioRun.status,
            ScenarioRun.snapshot,
            passed_turns,
        )
        .where(ScenarioRun.batch_run_id == batch_id)
        .order_by(ScenarioRun.created_at, ScenarioRun.id)
    )
    return [
        schemas.BatchRunItemSummary(
            id=run_id,
            scenario_id=scenario_id,
            scenario_name=str((snap or {}).get("name") or ""),
            status=status,
            passed_turns=passed,
            total_turns=len((snap or {}).get("turns") or []),
        )
        for run_id, scenario_id, status, snap, passed in rows
    ]


async def cancel_batch(session: AsyncSession, access: OrgAccess, batch_id: UUID) -> BatchRun:
    """Stop dispatching: runs not yet handed out end as ``error`` (cancelled); runs in
    flight finish and are counted; the batch ends as ``error``."""
    batch = await session.scalar(
        select(BatchRun)
        .where(BatchRun.id == batch_id, BatchRun.organization_id == access.organization_id)
        .with_for_update()
    )
    if batch is None:
        raise NotFound("batch run not found")
    if batch.status not in ACTIVE:
        raise Conflict(f"batch run is already {batch.status}")
    now = utcnow()
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
    batch.completed_scenarios += count
    batch.error_scenarios += count
    batch.status = "error"
    batch.error_message = "cancelled"
    batch.completed_at = now
    batch.updated_at = now
    await session.flush()
    return batch


async def count_terminal_run(session: AsyncSession, batch_id: UUID, status: str) -> None:
    """Count one run's move to ``status``; call it in the transaction of that move."""
    completed = BatchRun.completed_scenarios + 1
    now = utcnow()
    await session.execute(
        update(BatchRun)
        .where(BatchRun.id == batch_id)
        .values(
            completed_scenarios=completed,
            passed_scenarios=BatchRun.passed_scenarios + (1 if status == "passed" else 0),
            failed_scenarios=BatchRun.failed_scenarios + (1 if status == "failed" else 0),
            error_scenarios=BatchRun.error_scenarios + (1 if status == "error" else 0),
            status=case(
                (
                    and_(BatchRun.status.in_(ACTIVE), completed >= BatchRun.total_scenarios),
                    "completed",
                ),
                else_=BatchRun.status,
            ),
            completed_at=case(
                (and_(BatchRun.status.in_(ACTIVE), completed >= BatchRun.total_scenarios), now),
                else_=BatchRun.completed_at,
            ),
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )


async def dispatch(session: AsyncSession, batch_id: UUID) -> list[UUID]:
    """Mark the next runs dispatched, up to the window; the caller commits, then sends them."""
    batch = await session.get(BatchRun, batch_id, with_for_update=True, populate_existing=True)
    if batch is None or batch.status not in ACTIVE:
        return []
    now = utcnow()
    if batch.status == "queued":
        batch.status = "running"
        batch.started_at = now
        batch.updated_at = now
    in_flight = await session.scalar(
        select(func.count())
        .select_from(ScenarioRun)
        .where(
            ScenarioRun.batch_run_id == batch_id,
            ScenarioRun.dispatched_at.is_not(None),
            ScenarioRun.status.in_(IN_FLIGHT),
        )
    )
    free = batch.max_concurrency - int(in_flight or 0)
    if free <= 0:
        return []
    ids = list(
        await session.scalars(
            select(ScenarioRun.id)
            .where(
                ScenarioRun.batch_run_id == batch_id,
                ScenarioRun.dispatched_at.is_(None),
                ScenarioRun.status == "pending",
            )
            .order_by(ScenarioRun.created_at, ScenarioRun.id)
            .limit(free)
        )
    )
    if ids:
        await session.execute(
            update(ScenarioRun)
            .where(ScenarioRun.id.in_(ids))
            .values(dispatched_at=now, updated_at=now)
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
