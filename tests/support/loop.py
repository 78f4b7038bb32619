"""Whether code under test leaves the event loop free: a coroutine that wakes every
``every_s`` counts its wake-ups meanwhile; a loop blocked by the code ticks seldom."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass


@dataclass
class Ticks:
    count: int = 0


@asynccontextmanager
async def ticking(every_s: float = 0.01) -> AsyncIterator[Ticks]:
    ticks = Ticks()

    async def tick() -> None:
        while True:
            await asyncio.sleep(every_s)
            ticks.count += 1

    ticker = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        ticker.cancel()
