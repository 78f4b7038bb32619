"""Whether code under test leaves the event loop free: a coroutine that wakes every
``every_s`` counts its wake-ups meanwhile; a loop blocked by the code ticks seldom.
:func:`ticking_while_redis_holds_writes` counts them while a Redis makes its writes wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis


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


@asynccontextmanager
async def ticking_while_redis_holds_writes(url: str, pause_ms: int) -> AsyncIterator[Ticks]:
    """:func:`ticking`, with the Redis at ``url`` holding every client's writes (``CLIENT
    PAUSE WRITE``, reads go on) for ``pause_ms`` from the block's start, or until it ends.
    Pause a ``redis-server`` of the test's own: the pause holds every database."""
    pauser = redis.Redis.from_url(url)
    try:
        async with ticking() as ticks:
            pauser.client_pause(pause_ms, all=False)
            yield ticks
    finally:
        pauser.client_unpause()
        pauser.close()
