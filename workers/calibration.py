"""The actor that judges calibration examples (queue ``calibration``).

Thin: the rules live in :mod:`shared.calibration.services`.
"""

from __future__ import annotations

from uuid import UUID

import dramatiq

from shared.calibration.services import judge_examples
from shared.queue import CALIBRATE
from shared.runtime import get_runtime
from workers.broker import broker  # noqa: F401 - the broker the actor is declared on


@dramatiq.actor(
    actor_name=CALIBRATE[1],
    queue_name=CALIBRATE[0],
    max_retries=3,
    min_backoff=1_000,
    max_backoff=30_000,
    time_limit=30 * 60 * 1000,
)
async def calibrate(calibration_id: str) -> None:
    runtime = get_runtime()
    await judge_examples(
        runtime.session_factory, runtime.settings, UUID(calibration_id), http=runtime.http
    )
