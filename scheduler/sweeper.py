"""The sweeper: no lost message, dead worker or emptied broker strands a unit of work
(DESIGN §5.3, :mod:`shared.work`).

Each pass, in the active scheduler, for runs, trigger executions, knowledge documents,
calibrations, notification events and webhook deliveries alike:

* a unit in flight whose heartbeat stopped for ``SPAR_RUN_HEARTBEAT_TIMEOUT_S`` (a killed
  worker) is sent again: the next delivery claims it and resumes it;
* a unit still waiting for its message after its stall period (``SPAR_RUN_STALL_S``; a
  minute for trigger executions, 5 s for notification events, 30 s for a webhook delivery
  once its next attempt is due) is sent again (a lost message, or none sent: a batch's
  completion recorded by the run engine, a delivery's retry hours away);
* when the broker lost every message it held (a Redis restarted without persistence:
  the pass finds the broker's mark gone), every waiting unit is sent again at once;
* every active batch is offered a dispatch, which hands out runs only if its window has
  room (after a lost refill message, for instance);
* every completed batch whose comparison with its baseline is due has it stored, read or
  not (:func:`shared.batches.comparisons.store_due`).

Each unit taken is touched, so the next pass leaves it alone for as long again, and a
duplicate message changes nothing: claims are guarded in SQL.  Runs of a batch that were
never dispatched are the window's to hand out, not the sweeper's.
"""

from __future__ import annotations

import logging
import uuid
from uuid import UUID

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from scheduler.metrics import DISPATCHED, SWEEPER_RESENT
from shared import work
from shared.batches import comparisons, window
from shared.db.engine import Database
from shared.queue import RUN_SCENARIO, asend_all, in_broker_thread
from shared.settings import Settings

log = logging.getLogger("spar.sweeper")
MAX_PER_PASS = 1000
# Kept in the broker's Redis: gone means the broker lost what it held (messages too).
BROKER_MARK = "spar:sweeper:broker-mark"


def broker_lost_its_messages(broker: dramatiq.Broker) -> bool:
    """Whether the broker lost every message it held since the last pass: its mark is
    gone (a Redis that restarted without persistence, or was flushed).  The first pass
    against a broker counts as such a loss too: nobody knows what it held.  Never for
    the in-memory broker of ``spar dev``, which lives and dies with its process."""
    if not isinstance(broker, RedisBroker):
        return False
    return not broker.client.exists(BROKER_MARK)


def mark_broker(broker: dramatiq.Broker) -> None:
    """Set the broker's mark once whatever it lost has been sent again."""
    if isinstance(broker, RedisBroker):
        broker.client.set(BROKER_MARK, uuid.uuid4().hex)


async def sweep(database: Database, broker: dramatiq.Broker, settings: Settings) -> tuple[int, int]:
    """One pass; returns (runs sent again, runs dispatched for batches)."""
    lost = await in_broker_thread(broker_lost_its_messages, broker)
    async with database.transaction() as session:
        # Every kind declared (shared.work.KINDS), sent to the actor it names.
        taken = [
            await work.take(session, unit, settings, limit=MAX_PER_PASS, broker_lost=lost)
            for unit in work.KINDS
        ]
    sent = {
        unit.label: await _send(broker, unit.message, ids)
        for unit, ids in zip(work.KINDS, taken, strict=True)
    }
    if lost:
        await in_broker_thread(mark_broker, broker)
    dispatched = await window.reoffer(database)
    sent[DISPATCHED] = await _send(broker, RUN_SCENARIO, dispatched)
    compared = await comparisons.store_due(database)
    if compared:
        log.info("sweeper stored %d batch comparisons with their baselines", compared)
    for label, ids in sent.items():
        SWEEPER_RESENT.labels(label).inc(len(ids))
    if any(sent.values()):
        counts = [f"{len(sent[u.label])} stalled {u.label.replace('_', ' ')}" for u in work.KINDS]
        log.info(
            "sweeper re-sent %s and %s%s, dispatched %d",
            ", ".join(counts[:-1]),
            counts[-1],
            " (the broker had lost its messages)" if lost else "",
            len(dispatched),
        )
    return len(sent["runs"]), len(dispatched)


async def _send(broker: dramatiq.Broker, target: tuple[str, str], ids: list[UUID]) -> list[UUID]:
    """Send ``ids`` to ``target`` from a thread: the scheduler's event loop, which fires the
    triggers' cron jobs, goes on while Redis answers."""
    await asend_all(broker, target, [(str(unit_id),) for unit_id in ids])
    return ids
