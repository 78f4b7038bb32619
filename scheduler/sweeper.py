"""The sweeper: no lost message or dead worker strands a run or a batch (DESIGN §5.3).

Each pass, in the active scheduler:

* a run ``pending`` or ``running`` with no progress for ``SPAR_RUN_STALL_S`` (its
  ``updated_at`` moves with every committed turn) is sent again — the run engine resumes
  it after its last committed turn, and a duplicate changes nothing;
* every active batch is offered a dispatch, which hands out runs only if its window has
  room (after a lost refill message, for instance).

Runs of a batch that were never dispatched are the window's to hand out, not the sweeper's.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import dramatiq
from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.batches.services import ACTIVE, dispatch_committed
from shared.db.base import utcnow
from shared.db.engine import session_scope
from shared.db.models import BatchRun, ScenarioRun
from shared.queue import RUN_SCENARIO, send
from shared.scenarios.schemas import OPEN_STATUSES

log = logging.getLogger("spar.sweeper")
MAX_PER_PASS = 1000


async def sweep(
    factory: async_sessionmaker[AsyncSession], broker: dramatiq.Broker, stall_s: float
) -> tuple[int, int]:
    """One pass; returns (runs re-sent, runs dispatched for batches)."""
    now = utcnow()
    async with session_scope(factory) as session:
        stalled = list(
            await session.scalars(
                select(ScenarioRun.id)
                .where(
                    ScenarioRun.status.in_(OPEN_STATUSES),
                    ScenarioRun.updated_at < now - timedelta(seconds=stall_s),
                    or_(ScenarioRun.batch_run_id.is_(None), ScenarioRun.dispatched_at.is_not(None)),
                )
                .order_by(ScenarioRun.updated_at)
                .limit(MAX_PER_PASS)
                .with_for_update(skip_locked=True)
            )
        )
        if stalled:
            # Touch them, so the next pass waits a full stall period before sending again.
            await session.execute(
                update(ScenarioRun)
                .where(ScenarioRun.id.in_(stalled))
                .values(updated_at=now)
                .execution_options(synchronize_session=False)
            )
        batches = list(
            await session.scalars(select(BatchRun.id).where(BatchRun.status.in_(ACTIVE)))
        )
    for run_id in stalled:
        send(broker, RUN_SCENARIO, str(run_id))
    dispatched = 0
    for batch_id in batches:
        for run_id in await dispatch_committed(factory, batch_id):
            send(broker, RUN_SCENARIO, str(run_id))
            dispatched += 1
    if stalled or dispatched:
        log.info("sweeper re-sent %d stalled runs, dispatched %d", len(stalled), dispatched)
    return len(stalled), dispatched
