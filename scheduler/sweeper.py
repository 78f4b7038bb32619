"""The sweeper: no lost message or dead worker strands a run or a batch (DESIGN §5.3).

Each pass, in the active scheduler:

* a run ``pending`` or ``running`` with no progress for ``SPAR_RUN_STALL_S`` (its
  ``updated_at`` moves with every committed turn) is sent again — the run engine resumes
  it after its last committed turn, and a duplicate changes nothing;
* every active batch is offered a dispatch, which hands out runs only if its window has
  room (after a lost refill message, for instance);
* a trigger execution ``queued`` for a minute, or ``running`` without progress for
  ``SPAR_RUN_STALL_S``, is sent again (the execution actor is idempotent);
* a knowledge document ``queued`` or ``processing`` without progress for
  ``SPAR_RUN_STALL_S`` is sent again (processing starts it over).

Runs of a batch that were never dispatched are the window's to hand out, not the sweeper's.
"""

from __future__ import annotations

import logging

import dramatiq
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.batches import window
from shared.knowledge import processing
from shared.metrics import SWEEPER_RESENT
from shared.queue import PROCESS_DOCUMENT, RUN_SCENARIO, RUN_TRIGGER, send
from shared.runtime import provide_session
from shared.scenarios import store
from shared.triggers import firing

log = logging.getLogger("spar.sweeper")
MAX_PER_PASS = 1000


async def sweep(
    factory: async_sessionmaker[AsyncSession], broker: dramatiq.Broker, stall_s: float
) -> tuple[int, int]:
    """One pass; returns (runs re-sent, runs dispatched for batches)."""
    stalled = await store.take_stalled(factory, stall_s=stall_s, limit=MAX_PER_PASS)
    for run_id in stalled:
        send(broker, RUN_SCENARIO, str(run_id))
    dispatched = await window.reoffer(factory)
    for run_id in dispatched:
        send(broker, RUN_SCENARIO, str(run_id))
    async with provide_session(factory) as session:
        executions = await firing.take_stalled(session, stall_s=stall_s, limit=MAX_PER_PASS)
        documents = await processing.take_stalled(session, stall_s=stall_s, limit=MAX_PER_PASS)
    for execution_id in executions:
        send(broker, RUN_TRIGGER, str(execution_id))
    for document_id in documents:
        send(broker, PROCESS_DOCUMENT, str(document_id))
    for kind, sent in (
        ("runs", stalled),
        ("batch_runs", dispatched),
        ("trigger_executions", executions),
        ("documents", documents),
    ):
        SWEEPER_RESENT.labels(kind).inc(len(sent))
    if stalled or dispatched or executions or documents:
        log.info(
            "sweeper re-sent %d stalled runs, %d trigger executions and %d documents, "
            "dispatched %d",
            len(stalled),
            len(executions),
            len(documents),
            len(dispatched),
        )
    return len(stalled), len(dispatched)
