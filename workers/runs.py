"""Actors for scenario runs (queue ``runs``) and batch dispatch (queue ``batches``).

Thin: the rules live in shared.scenarios.runner and shared.batches.window.
"""

from __future__ import annotations

from uuid import UUID

import dramatiq

from shared.batches.window import dispatch_committed
from shared.queue import DISPATCH_BATCH, RUN_SCENARIO, send
from shared.runtime import get_runtime
from shared.scenarios.runner import execute_run
from shared.work import RUNS
from workers.broker import broker, unit_actor


@unit_actor(
    RUNS,
    min_backoff=1_000,
    max_backoff=30_000,
    # Long conversations with slow agents: 30 minutes, then the sweeper takes over.
    time_limit=30 * 60 * 1000,
)
async def run_scenario(run_id: str) -> None:
    runtime = get_runtime()
    # The runs that took this one's place in its batch's window are committed: send them.
    for successor in (
        await execute_run(
            runtime.database,
            runtime.settings,
            UUID(run_id),
            http=runtime.http,
            limiter=runtime.limiter,
        )
        or ()
    ):
        send(broker, RUN_SCENARIO, str(successor))


@dramatiq.actor(
    actor_name=DISPATCH_BATCH[1],
    queue_name=DISPATCH_BATCH[0],
    max_retries=5,
    min_backoff=500,
    max_backoff=10_000,
    time_limit=60 * 1000,
)
async def dispatch_batch(batch_id: str) -> None:
    for run_id in await dispatch_committed(get_runtime().database, UUID(batch_id)):
        send(broker, RUN_SCENARIO, str(run_id))
