"""The actor for trigger executions (queue ``triggers``).

Thin: the rules live in :mod:`shared.triggers.executions`.
"""

from __future__ import annotations

from uuid import UUID

from shared.runtime import get_runtime
from shared.triggers.executions import execute
from shared.work import TRIGGER_EXECUTIONS
from workers.broker import broker, unit_actor


@unit_actor(
    TRIGGER_EXECUTIONS,
    min_backoff=1_000,
    max_backoff=60_000,
    time_limit=10 * 60 * 1000,
)
async def run_trigger_execution(execution_id: str) -> None:
    runtime = get_runtime()
    await execute(
        runtime.database,
        runtime.settings,
        UUID(execution_id),
        broker=broker,
        http=runtime.http,
        limiter=runtime.limiter,
    )
