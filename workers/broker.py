"""Sets up a worker process from settings: its log format and level, and its Dramatiq
broker (with the request id and metrics middleware of :func:`shared.queue.get_broker`),
which opens the database connections as the worker boots.  Import before declaring
actors."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack

import dramatiq
from dramatiq.asyncio import get_event_loop_thread
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.logs import configure_logging
from shared.queue import get_broker
from shared.runtime import get_runtime
from shared.settings import get_settings

log = logging.getLogger("spar.worker")


async def _open_engine_pool(engine: AsyncEngine, size: int) -> None:
    """Fill ``engine``'s pool: a new batch's dispatch and its first runs' configuration load
    (SQLAlchemy sessions) then find connections open instead of each opening one."""
    async with AsyncExitStack() as stack:
        await asyncio.gather(*(stack.enter_async_context(engine.connect()) for _ in range(size)))


class WarmUp(dramatiq.Middleware):
    """Connections opened as the worker boots, not by its first messages."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        loop_thread = get_event_loop_thread()
        if loop_thread is None:
            return
        try:
            runtime = get_runtime()
            loop_thread.run_coroutine(runtime.warm_up())
            loop_thread.run_coroutine(
                _open_engine_pool(runtime.engine, runtime.settings.db_pool_size)
            )
        except Exception:  # the first messages will open them, or fail and be retried
            log.warning("could not open the database connections at boot", exc_info=True)


configure_logging(get_settings().log_level, get_settings().log_format)
broker = get_broker(get_settings().redis_url)
if not any(isinstance(m, WarmUp) for m in broker.middleware):
    broker.add_middleware(WarmUp())
dramatiq.set_broker(broker)
