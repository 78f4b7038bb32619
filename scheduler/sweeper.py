"""The sweeper: no lost message, dead worker or emptied broker strands a unit of work
(DESIGN §5.3, :mod:`shared.work`).

Each pass, in the active scheduler, for runs, trigger executions, knowledge documents
and calibrations alike:

* a unit in flight whose heartbeat stopped for ``SPAR_RUN_HEARTBEAT_TIMEOUT_S`` (a killed
  worker) is sent again: the next delivery claims it and resumes it;
* a unit still waiting for its message after its stall period (``SPAR_RUN_STALL_S``; a
  minute for trigger executions) is sent again (a lost message);
* when the broker lost every message it held (a Redis restarted without persistence:
  the pass finds the broker's mark gone), every waiting unit is sent again at once;
* every active batch is offered a dispatch, which hands out runs only if its window has
  room (after a lost refill message, for instance).

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
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shared.batches import window
from shared.calibration import services as calibration
from shared.knowledge import processing
from shared.metrics import SWEEPER_RESENT
from shared.queue import CALIBRATE, PROCESS_DOCUMENT, RUN_SCENARIO, RUN_TRIGGER, send
from shared.runtime import provide_session
from shared.scenarios import store
from shared.settings import Settings
from shared.triggers import firing

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


async def sweep(
    factory: async_sessionmaker[AsyncSession], broker: dramatiq.Broker, settings: Settings
) -> tuple[int, int]:
    """One pass; returns (runs sent again, runs dispatched for batches)."""
    lost = broker_lost_its_messages(broker)
    async with provide_session(factory) as session:
        runs = await store.take_stalled(session, settings, limit=MAX_PER_PASS)
        executions = await firing.take_stalled(session, settings, limit=MAX_PER_PASS)
        documents = await processing.take_stalled(session, settings, limit=MAX_PER_PASS)
        calibrations = await calibration.take_stalled(session, settings, limit=MAX_PER_PASS)
        if lost:
            runs = _union(runs, await store.take_waiting(session, limit=MAX_PER_PASS))
            executions = _union(executions, await firing.take_waiting(session, limit=MAX_PER_PASS))
            documents = _union(
                documents, await processing.take_waiting(session, limit=MAX_PER_PASS)
            )
            calibrations = _union(
                calibrations, await calibration.take_waiting(session, limit=MAX_PER_PASS)
            )
    sent: dict[str, list[UUID]] = {
        "runs": _send(broker, RUN_SCENARIO, runs),
        "trigger_executions": _send(broker, RUN_TRIGGER, executions),
        "documents": _send(broker, PROCESS_DOCUMENT, documents),
        "calibrations": _send(broker, CALIBRATE, calibrations),
    }
    if lost:
        mark_broker(broker)
    dispatched = await window.reoffer(factory)
    sent["batch_runs"] = _send(broker, RUN_SCENARIO, dispatched)
    for kind, ids in sent.items():
        SWEEPER_RESENT.labels(kind).inc(len(ids))
    if any(sent.values()):
        log.info(
            "sweeper re-sent %d stalled runs, %d trigger executions, %d documents and "
            "%d calibrations%s, dispatched %d",
            len(runs),
            len(executions),
            len(documents),
            len(calibrations),
            " (the broker had lost its messages)" if lost else "",
            len(dispatched),
        )
    return len(runs), len(dispatched)


def _union(first: list[UUID], second: list[UUID]) -> list[UUID]:
    return list(dict.fromkeys([*first, *second]))


def _send(broker: dramatiq.Broker, target: tuple[str, str], ids: list[UUID]) -> list[UUID]:
    for unit_id in ids:
        send(broker, target, str(unit_id))
    return ids
