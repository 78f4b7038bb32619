"""Replaying a batch (DESIGN §5.11): a new batch that re-judges the stored transcripts of a
completed one with the scenarios' current criteria and the agent's current judge.

The replay is a batch like any other: its runs go through the window and the ``runs``
queue, durable, resumable and counted.  Each of its runs replays one run of the source
(with repetitions, each of them once), snapshots the scenario as it is now, and names its
source run (``replay_of_run_id``): the run engine then takes each turn's message and reply
from the source's stored turns instead of calling the agent or the simulated user
(:mod:`shared.scenarios.replay`, which also says when a run cannot be replayed).
"""

from __future__ import annotations

import uuid
from uuid import UUID

import dramatiq
from sqlalchemy import (
    Insert,
    Uuid,
    bindparam,
    func,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from shared.batches import schemas
from shared.batches.schemas import BatchStatus
from shared.batches.services import get_batch, insert_pending_runs
from shared.db.base import utcnow
from shared.db.models import BatchRun, ScenarioRun
from shared.errors import Conflict
from shared.identity.access import OrgAccess
from shared.outbound.services import agent_in_org
from shared.queue import DISPATCH_BATCH, send_after_commit
from shared.scenarios.services import snapshot_source

_runs = ScenarioRun.__table__


async def replay_batch(
    session: AsyncSession,
    *,
    access: OrgAccess,
    batch_id: UUID,
    body: schemas.BatchReplayCreate,
    broker: dramatiq.Broker,
) -> BatchRun:
    """A replay of the completed batch ``batch_id`` (of the same agent, window and
    repetitions; ``judge_repetitions`` as given, else the source's), its first window asked
    for once the caller commits.  A batch not completed is a conflict: its transcripts are
    not all written."""
    source = await get_batch(session, access=access, batch_id=batch_id)
    if source.status != BatchStatus.COMPLETED:
        raise Conflict(f"batch run is {source.status}: only a completed batch run can be replayed")
    agent = await agent_in_org(session, org_id=access.organization_id, agent_id=source.agent_id)
    now = utcnow()
    batch = BatchRun(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        agent_id=agent.id,
        agent_name=agent.name,
        status=BatchStatus.QUEUED,
        max_concurrency=source.max_concurrency,
        repetitions=source.repetitions,
        judge_repetitions=body.judge_repetitions or source.judge_repetitions,
        replay_of=source.id,
        total_scenarios=source.total_scenarios,  # one run per run of the source
        created_by_user_id=access.principal.user_id,
        created_at=now,
    )
    session.add(batch)
    await session.flush()
    await session.execute(
        _FAN_OUT,
        {
            "p_source": source.id,
            "p_org": access.organization_id,
            "p_agent": agent.id,
            "p_batch": batch.id,
            "p_user": access.principal.user_id,
            "p_judge_repetitions": batch.judge_repetitions,
            "now": now,
        },
    )
    send_after_commit(session, broker, DISPATCH_BATCH, str(batch.id))
    return batch


def _fan_out() -> Insert:
    """A pending run per run of the batch ``:p_source``, in its order, naming the run it
    replays, with the scenario's snapshot as it is now (the source run's, for a scenario
    deleted since: the run ends in error saying so)."""
    of_source = _runs.c.batch_run_id == bindparam("p_source", type_=Uuid())
    picked = select(_runs.c.scenario_id.label("id")).where(of_source).distinct().subquery("picked")
    built = snapshot_source(picked)
    source = (
        select(
            func.gen_random_uuid().label("id"),
            _runs.c.id.label("replay_of_run_id"),
            _runs.c.scenario_id,
            func.coalesce(built.c.snapshot, _runs.c.snapshot).label("snapshot"),
            func.row_number().over(order_by=(_runs.c.created_at, _runs.c.id)).label("position"),
        )
        .select_from(_runs.outerjoin(built, built.c.scenario_id == _runs.c.scenario_id))
        .where(of_source)
        .subquery("source")
    )
    return insert_pending_runs(
        source,
        order=source.c.position - 1,  # in the source's order
        extra={"replay_of_run_id": source.c.replay_of_run_id},
    )


_FAN_OUT = _fan_out()
