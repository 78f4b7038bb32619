"""Actors for scenario runs (queue ``runs``) and batch dispatch (queue ``batches``).

Thin: the rules live in shared.scenarios.runner and shared.batches.window.  A run is not
played on the actor's thread: the actor hands it to the process's event loop
(:mod:`workers.conversations`), so a process carries as many conversations as
``SPAR_RUNS_IN_FLIGHT`` allows, not as many as it has threads.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

import dramatiq
from dramatiq.middleware import CurrentMessage

from shared.batches.window import dispatch_committed
from shared.queue import DISPATCH_BATCH, RUN_SCENARIO, PollingRedisBroker, asend_all, send
from shared.runtime import get_runtime
from shared.scenarios.runner import execute_run
from shared.settings import get_settings
from shared.work import RUNS
from workers.broker import broker, unit_actor
from workers.conversations import Conversations

# One delivery's time limit: long conversations with slow agents get 30 minutes, then the
# delivery is cancelled (its run released) and sent again.
RUN_TIME_LIMIT_S = 30 * 60
RUN_BACKOFF_MS = (1_000, 30_000)


async def play_run(run_id: str, claimed: Callable[[], None]) -> None:
    """One delivery of the run (``claimed()`` once its claim is committed); the runs that
    took its place in its batch's window are committed: started here if this run came by
    a message (:meth:`Conversations.keep`), else sent."""
    runtime = get_runtime()
    successors = await execute_run(
        runtime.database,
        runtime.settings,
        UUID(run_id),
        http=runtime.http,
        limiter=runtime.limiter,
        claimed=claimed,
    )
    sent = [(str(s),) for s in successors or () if not conversations.keep(str(s), after=run_id)]
    await asend_all(broker, RUN_SCENARIO, sent)


def send_run(run_id: str, delay_ms: int | None, retries: int) -> None:
    send(broker, RUN_SCENARIO, run_id, delay_ms=delay_ms, retries=retries)


conversations = next((m for m in broker.middleware if isinstance(m, Conversations)), None)
if conversations is None:
    settings = get_settings()
    conversations = Conversations(
        play=play_run,
        send=send_run,
        limit=settings.runs_in_flight,
        time_limit_s=RUN_TIME_LIMIT_S,
        drain_s=settings.worker_drain_s,
        max_retries=RUNS.max_deliveries,
        backoff_ms=RUN_BACKOFF_MS,
    )
    broker.add_middleware(conversations)
    if isinstance(broker, PollingRedisBroker):
        broker.runs_room = conversations.room
    broker.add_middleware(CurrentMessage())


@unit_actor(RUNS)
def run_scenario(run_id: str) -> None:
    message = CurrentMessage.get_current_message()
    conversations.start(run_id, retries=message.options.get("retries", 0) if message else 0)


@dramatiq.actor(
    actor_name=DISPATCH_BATCH[1],
    queue_name=DISPATCH_BATCH[0],
    max_retries=5,
    min_backoff=500,
    max_backoff=10_000,
    time_limit=60 * 1000,
)
async def dispatch_batch(batch_id: str) -> None:
    handed = await dispatch_committed(get_runtime().database, UUID(batch_id))
    await asend_all(broker, RUN_SCENARIO, [(str(run_id),) for run_id in handed])
