"""Sets up a worker process from its settings, read once here: its log format and level,
and its Dramatiq broker (:func:`shared.queue.get_broker`) with the worker's middleware:
each message's request id, log line and metrics (:mod:`workers.observability`), the
database connections opened as the worker boots, one stop per SIGTERM.  Import before
declaring actors."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.asyncio import get_event_loop_thread

from shared.heap import settle_startup_heap
from shared.logs import configure_logging
from shared.queue import get_broker
from shared.runtime import get_runtime
from shared.settings import get_settings
from shared.work import Work
from workers.observability import Tracing, observe_messages
from workers.warmup import warm_up

log = logging.getLogger("spar.worker")


class WarmUp(dramatiq.Middleware):
    """Connections opened, and the run engine's cold paths taken, as the worker boots, not
    by its first messages (:mod:`workers.warmup`); the outbound limiter's queue given back
    as it stops.

    Before the worker's consumers start (after Dramatiq's event loop thread is made): a
    worker fetches no message, and shows no heartbeat, until it is warm.  A batch sent to
    a worker still warming up would otherwise have its first window wait on the warm-up.
    Then the heap is settled (:func:`shared.heap.settle_startup_heap`)."""

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        loop_thread = get_event_loop_thread()
        if loop_thread is not None:
            try:
                loop_thread.run_coroutine(warm_up(get_runtime()))
            except Exception:  # the first messages will open them, or fail and be retried
                log.warning("could not warm up the database connections at boot", exc_info=True)
        settle_startup_heap()  # what the boot and the warm-up made, frozen

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Once the worker's runs have ended or been handed back (their middleware,
        :class:`workers.conversations.Conversations`, was added after this one, and Dramatiq
        runs these hooks in reverse order), and before the event loop stops: the outbound
        limiter gives back the slots its calls left queued for release (a call does not
        wait for its slot's release), which would otherwise stay taken for the lease."""
        loop_thread = get_event_loop_thread()
        if loop_thread is None:
            return
        try:
            loop_thread.run_coroutine(get_runtime().close_limiter())
        except Exception:  # their leases run out: the slots come back within a minute
            log.warning("could not give back the outbound limiter's slots", exc_info=True)


class OneStopSignal(dramatiq.Middleware):
    """A worker process stops gracefully on a SIGTERM sent to its whole process group.

    Such a SIGTERM (systemd's default ``KillMode=control-group``, ``kill -- -PGID``)
    reaches a worker process twice at once: from the sender, and forwarded by Dramatiq's
    main process.  Dramatiq takes a second SIGTERM as "kill now" and exits the process's
    main thread while its worker threads still run, and the process then hangs until
    SIGKILL.  A repeat within :attr:`REPEAT_S` of the first is that same stop, and is
    ignored; a later one still kills."""

    REPEAT_S = 2.0

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        stop = signal.getsignal(signal.SIGTERM)
        # Only Dramatiq's own worker-process handler (never, say, uvicorn's in spar dev).
        if not callable(stop) or "worker_process" not in getattr(stop, "__qualname__", ""):
            return
        first: list[float] = []

        def once(signum: int, frame: Any) -> None:
            now = time.monotonic()
            if first and now - first[0] < self.REPEAT_S:
                return
            first.append(now)
            stop(signum, frame)

        signal.signal(signal.SIGTERM, once)


settings = get_settings()
configure_logging(settings.log_level, settings.log_format)
broker = observe_messages(get_broker(settings))
if not any(isinstance(m, WarmUp) for m in broker.middleware):
    broker.add_middleware(WarmUp())
    broker.add_middleware(OneStopSignal())
    broker.add_middleware(Tracing())
dramatiq.set_broker(broker)


def unit_actor(
    work: Work, **options: Any
) -> Callable[[Callable[..., Any]], dramatiq.Actor[Any, Any]]:
    """The actor that plays ``work``'s units: its queue and name are the ones the kind's
    units are sent to (``work.message``, which the sweeper sends to as well), and
    Dramatiq's retries are the kind's delivery bound, so the unit's own count of
    deliveries (:mod:`shared.work`) ends it before they run out.  Every unit is idempotent
    and resumable, so a retry is safe.  ``options``: backoff and time limit."""
    queue_name, actor_name = work.message
    return dramatiq.actor(
        actor_name=actor_name,
        queue_name=queue_name,
        max_retries=work.max_deliveries,
        **options,
    )
