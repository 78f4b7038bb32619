"""``spar scheduler``: the stuck-run sweeper (cron triggers join later), one active replica."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import dramatiq
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from scheduler.leader import Leadership
from scheduler.sweeper import sweep
from shared.queue import get_broker
from shared.runtime import get_runtime
from shared.settings import Settings

log = logging.getLogger("spar.scheduler")


async def sweep_forever(
    factory: async_sessionmaker[AsyncSession],
    broker: dramatiq.Broker,
    settings: Settings,
    stop: asyncio.Event,
    leadership: Leadership | None = None,
) -> None:
    """Sweep every ``SPAR_SWEEP_INTERVAL_S`` while this process is the leader."""
    while not stop.is_set():
        if leadership is None or await leadership.try_acquire():
            try:
                await sweep(factory, broker, settings.run_stall_s)
            except Exception:  # one failed pass must not end the scheduler
                log.exception("sweep failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=settings.sweep_interval_s)


async def run_forever(stop: asyncio.Event) -> None:
    runtime = get_runtime()
    leadership = Leadership(runtime.engine)
    try:
        await sweep_forever(
            runtime.session_factory,
            get_broker(runtime.settings.redis_url),
            runtime.settings,
            stop,
            leadership,
        )
    finally:
        await leadership.release()
        await runtime.close()


def main() -> None:
    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_forever(stop)

    asyncio.run(_main())
