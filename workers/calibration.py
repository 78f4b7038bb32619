"""The actors of queue ``calibration``: judging calibration examples, and a batch's pass
rates with the judge's measured error taken out.

Thin: the rules live in :mod:`shared.calibration.judging` and :mod:`shared.calibration.trust`.
"""

from __future__ import annotations

from uuid import UUID

import dramatiq

from shared.calibration import trust
from shared.calibration.judging import judge_examples
from shared.queue import JUDGE_TRUST
from shared.runtime import get_runtime
from shared.work import CALIBRATIONS
from workers.broker import broker, unit_actor


@unit_actor(
    CALIBRATIONS,
    min_backoff=1_000,
    max_backoff=30_000,
    time_limit=30 * 60 * 1000,
)
async def calibrate(calibration_id: str) -> None:
    runtime = get_runtime()
    await judge_examples(
        runtime.database,
        runtime.settings,
        UUID(calibration_id),
        http=runtime.http,
        limiter=runtime.limiter,
        broker=broker,
    )


@dramatiq.actor(
    actor_name=JUDGE_TRUST[1],
    queue_name=JUDGE_TRUST[0],
    max_retries=3,
    min_backoff=1_000,
    max_backoff=30_000,
    time_limit=10 * 60 * 1000,
)
async def judge_trust(batch_id: str) -> None:
    await trust.compute(get_runtime().database, UUID(batch_id))
