"""``spar scheduler``: cron triggers and the sweeper, in one active replica.

Every replica tries for leadership (:mod:`scheduler.leader`) every
``SPAR_LEADER_RETRY_S``.  The leader runs the trigger cron (:mod:`scheduler.cron`),
re-reading the triggers on each change the database notifies and every
``SPAR_TRIGGER_POLL_S``, and sweeps every ``SPAR_SWEEP_INTERVAL_S``.  A replica that
loses the lock stops its jobs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

import dramatiq

from scheduler.cron import TriggerCron
from scheduler.leader import Leadership
from scheduler.metrics import FAMILIES, SCHEDULER_LEADING
from scheduler.sweeper import sweep
from shared.db.engine import Database
from shared.metrics import serve_process_metrics
from shared.queue import get_broker
from shared.runtime import get_runtime
from shared.settings import Settings

log = logging.getLogger("spar.scheduler")


async def _sweep_once(database: Database, broker: dramatiq.Broker, settings: Settings) -> None:
    try:
        await sweep(database, broker, settings)
    except Exception:  # one failed pass must not end the scheduler
        log.exception("sweep failed")


async def lead_forever(
    database: Database,
    broker: dramatiq.Broker,
    settings: Settings,
    stop: asyncio.Event,
    leadership: Leadership,
    cron: TriggerCron | None = None,
) -> None:
    """Lead when the lock is ours, stand by when it is not, until ``stop`` is set."""
    cron = cron or TriggerCron(database, broker, settings)
    next_sweep = next_poll = 0.0
    try:
        while not stop.is_set():
            try:
                leading = await leadership.try_acquire()
            except Exception:  # the database is away: stand by and try again
                log.warning("could not reach the database for leadership", exc_info=True)
                leading = False
            SCHEDULER_LEADING.set(1 if leading else 0)
            if not leading:
                if cron.running:
                    log.warning("lost the scheduler lock: stopping trigger jobs")
                    cron.stop()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=settings.leader_retry_s)
                continue
            try:
                if not cron.running:
                    log.info("leading: starting the trigger jobs")
                    await cron.start()
                    next_poll = time.monotonic() + settings.trigger_poll_s
                if time.monotonic() >= next_sweep:
                    await _sweep_once(database, broker, settings)
                    next_sweep = time.monotonic() + settings.sweep_interval_s
                wait = max(0.0, min(next_sweep, next_poll) - time.monotonic())
                changed = await leadership.wait_for_change(min(wait, settings.leader_retry_s))
                if changed or time.monotonic() >= next_poll:
                    await cron.sync()
                    next_poll = time.monotonic() + settings.trigger_poll_s
            except Exception:  # a failed pass must not end the scheduler
                log.exception("scheduler pass failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=settings.leader_retry_s)
    finally:
        cron.stop()
        SCHEDULER_LEADING.set(0)


async def run_forever(stop: asyncio.Event) -> None:
    runtime = get_runtime()
    leadership = Leadership(runtime.database.engine)
    try:
        await lead_forever(
            runtime.database,
            get_broker(runtime.settings),
            runtime.settings,
            stop,
            leadership,
        )
    finally:
        await leadership.release()
        await runtime.close()


def main(metrics_port: int | None = None) -> None:
    """The scheduler until SIGTERM or SIGINT; its metrics on ``metrics_port`` if given."""
    if metrics_port is not None:
        serve_process_metrics(metrics_port, FAMILIES)

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_forever(stop)

    asyncio.run(_main())
