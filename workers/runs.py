"""Actor for scenario runs (queue ``runs``): thin, the rules live in shared.scenarios.runner."""

from __future__ import annotations

from uuid import UUID

import dramatiq

from shared.queue import RUN_SCENARIO
from shared.runtime import get_runtime
from shared.scenarios.runner import execute_run
from workers.broker import broker  # noqa: F401 - sets the broker before the actor is declared

queue_name, actor_name = RUN_SCENARIO


@dramatiq.actor(
    actor_name=actor_name,
    queue_name=queue_name,
    # A run is resumable and idempotent, so a retry after a crash is safe; a few are enough.
    max_retries=3,
    min_backoff=1_000,
    max_backoff=30_000,
    # Long conversations with slow agents: 30 minutes, then the sweeper takes over.
    time_limit=30 * 60 * 1000,
)
async def run_scenario(run_id: str) -> None:
    runtime = get_runtime()
    await execute_run(runtime.session_factory, runtime.settings, UUID(run_id), http=runtime.http)
