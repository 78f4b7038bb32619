"""Scenario runs in flight on a worker's event loop, not on its threads (DESIGN §8).

A run is a conversation that waits on its agent and judge for seconds at a time.  Played
inside its actor, it would hold a Dramatiq worker thread for its whole life, and a process
would carry at most ``--threads`` conversations.  Instead the actor hands the run to the
process's event loop and returns: conversations in flight are bounded by
``--runs-in-flight`` (``SPAR_RUNS_IN_FLIGHT``), which stands for memory and the loop's
CPU, and a worker thread waits only while the process is full.  A run that came by a
message and ends starts the run that takes its place in its batch's window on the same
loop, with no message; that one sends its own successor (:meth:`Conversations.keep`).

At-least-once is the run's own, not the message's (:mod:`shared.work`): the message is
acknowledged once the run is claimed in SQL, with a heartbeat (the actor's thread waits
for the claim, a database round trip: acknowledged before it, a run whose worker was
killed in between would be left to the stall period's sweep).
Its process killed, the heartbeat stops and the scheduler's sweeper sends it again; a
delivery that raises is sent again here after a backoff, as Dramatiq's retries would,
while its deliveries counted in SQL bound it; one over its time limit is cancelled
(released) and sent again the same way.  A worker asked to stop waits up to
``SPAR_WORKER_DRAIN_S`` for its conversations to end, then cancels the rest, which
release their claims, and sends each again for another worker to resume from its last
committed turn.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Awaitable, Callable

import dramatiq
from dramatiq.asyncio import get_event_loop_thread

from shared.queue import in_broker_thread
from workers.metrics import RUNS_IN_FLIGHT

log = logging.getLogger("spar.worker.conversations")

SLOT_WAIT_S = 0.5  # a thread waiting for room looks this often whether the worker stops
CANCEL_WAIT_S = 5.0  # cancelled at a stop: the time their claims have to be released
CLAIM_WAIT_S = 30.0  # the longest a thread waits for its run's claim before acknowledging


class Conversations(dramatiq.Middleware):
    """The runs a worker process plays on its event loop: at most ``limit`` at once.

    ``play(run_id, claimed)`` plays one delivery of a run (to its end, or to where another
    delivery took it), calling ``claimed()`` once the run's claim is committed (or found
    not to be its); ``send(run_id, delay_ms, retries)`` sends the run's message again.
    """

    def __init__(
        self,
        *,
        play: Callable[[str, Callable[[], None]], Awaitable[None]],
        send: Callable[[str, int | None, int], None],
        limit: int,
        time_limit_s: float,
        drain_s: float,
        max_retries: int,
        backoff_ms: tuple[int, int],
    ) -> None:
        self._play = play
        self._send = send
        self.limit = limit
        self.time_limit_s = time_limit_s
        self.drain_s = drain_s
        self.max_retries = max_retries
        self.backoff_ms = backoff_ms
        # The places of ``limit`` taken (a run starting or in flight), and its changes.
        self._taken = 0
        self._changed = threading.Condition()
        # The runs in flight, by id; of those, the ones started by keep() and the ones that
        # handed their place on to a successor as they ended: on the event loop only.
        self._flying: dict[str, asyncio.Task[None]] = {}
        self._kept: set[str] = set()
        self._handed_on: set[str] = set()
        self._stopping = threading.Event()

    # --- on a worker thread --------------------------------------------------------------

    def room(self) -> int:
        """The runs this process could start now: its broker's consumer of the ``runs``
        queue fetches no more (:class:`shared.queue.PollingRedisBroker`), so that a full
        process leaves the messages it has no room for to the others instead of holding
        them until a run of its own ends."""
        return self.limit - self._taken

    def start(self, run_id: str, retries: int) -> None:
        """Put the run on the event loop, waiting for room while the process is full, and
        return once its claim is committed.  A worker stopping meanwhile sends it back to
        the queue instead."""
        while not self._take(SLOT_WAIT_S):
            if self._stopping.is_set():
                self._send(run_id, None, retries)
                return
        claimed = threading.Event()
        self._loop().call_soon_threadsafe(self._launch, run_id, retries, claimed)
        claimed.wait(CLAIM_WAIT_S)

    # --- on the event loop ---------------------------------------------------------------

    def keep(self, run_id: str, *, after: str) -> bool:
        """Start ``run_id``, a successor that the run ``after`` of this process made as it
        ended (a run that took its place in its batch's window), here and at once, in
        ``after``'s own place, if ``after`` came by a message; ``False`` when it was itself
        started this way (or has handed its place on already, or the worker is stopping):
        send it.

        A successor started here costs no message (an enqueue, a fetch, a worker thread's
        hand-off, an acknowledgement: about 1.7 ms of a worker's CPU in ``bench/batch.py``,
        and the time they take before it starts).  Kept every time, a batch would stay on
        the processes that took its first window, and one that boots later or joins
        mid-batch would get none of it; kept every other time along each chain of a
        batch's runs, half of them go to the queue, for any process (the share of a batch
        a process plays halves its distance to an even share at each generation), and no
        run waits for two messages in a row.
        At-least-once is the run's own: it is committed as dispatched, so if this process
        dies before its claim, the sweeper sends it as it does a lost message."""
        if (
            self._stopping.is_set()
            or after not in self._flying
            or after in self._kept
            or after in self._handed_on
        ):
            return False
        self._handed_on.add(after)  # its place is the successor's: not given back
        self._kept.add(run_id)
        self._launch(run_id, 0, threading.Event())
        return True

    def _launch(self, run_id: str, retries: int, claimed: threading.Event) -> None:
        if run_id in self._flying:  # a duplicate of a run this process plays (re-sent)
            self._give_back()
            claimed.set()
            return
        RUNS_IN_FLIGHT.inc()
        task = asyncio.get_running_loop().create_task(self._fly(run_id, retries, claimed))
        self._flying[run_id] = task
        task.add_done_callback(lambda _: self._landed(run_id))

    def _landed(self, run_id: str) -> None:
        del self._flying[run_id]
        self._kept.discard(run_id)
        RUNS_IN_FLIGHT.dec()
        if run_id in self._handed_on:
            self._handed_on.discard(run_id)
        else:
            self._give_back()

    # --- the room ------------------------------------------------------------------------

    def _take(self, timeout: float) -> bool:
        """A place for a run, waiting up to ``timeout`` for one; ``False`` if none came."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._taken < self.limit, timeout):
                return False
            self._taken += 1
            return True

    def _give_back(self) -> None:
        with self._changed:
            if self._taken == 0:  # as a bounded semaphore refuses a release too many
                raise ValueError("a run's place given back that was not taken")
            self._taken -= 1
            self._changed.notify()

    async def _fly(self, run_id: str, retries: int, claimed: threading.Event) -> None:
        try:
            async with asyncio.timeout(self.time_limit_s):
                await self._play(run_id, claimed.set)
        except asyncio.CancelledError:
            if self._stopping.is_set():  # released by the run: another worker resumes it
                await self._sent(run_id, None, retries)
            raise
        except Exception as exc:  # the delivery failed (its unit released), or timed out
            await self._again(run_id, retries, exc)
        finally:
            claimed.set()

    async def _again(self, run_id: str, retries: int, exc: Exception) -> None:
        if retries >= self.max_retries:
            # As a dead letter: the run's heartbeat is cleared, the sweeper sends it again.
            log.error("run %s failed %d times: left to the sweeper", run_id, retries + 1)
            return
        low, high = self.backoff_ms
        delay = min(low * 2**retries, high)
        delay = int(delay * random.uniform(0.9, 1.1))  # noqa: S311 - jitter, not a secret
        if isinstance(exc, TimeoutError):
            log.warning("run %s over its time limit: sent again in %d ms", run_id, delay)
        await self._sent(run_id, delay, retries + 1)

    async def _sent(self, run_id: str, delay_ms: int | None, retries: int) -> None:
        """``send`` from a thread: a send is a blocking round trip to the broker, as long as
        its client waits when Redis is slow or away, and on the event loop every
        conversation of the process would wait through it.  A send that fails leaves the
        run to the sweeper (its heartbeat stops with this delivery)."""
        try:
            await in_broker_thread(self._send, run_id, delay_ms, retries)
        except Exception:
            log.warning(
                "run %s could not be sent again: left to the sweeper", run_id, exc_info=True
            )

    async def _drain(self) -> None:
        """Wait up to the drain for the runs in flight, then cancel the rest: each releases
        its claim and is sent again (:meth:`_fly`)."""
        if not self._flying:
            return
        log.info("waiting up to %.0f s for %d runs in flight", self.drain_s, len(self._flying))
        _, left = await asyncio.wait(set(self._flying.values()), timeout=self.drain_s)
        if not left:
            return
        log.info("%d runs still in flight: handing them to other workers", len(left))
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=CANCEL_WAIT_S)

    # --- the worker's stop ---------------------------------------------------------------

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stopping.set()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Before the event loop stops (Dramatiq runs ``after_*`` hooks in reverse order,
        and this middleware comes after the loop's): the conversations in flight end, or
        are cancelled and sent again."""
        drained = asyncio.run_coroutine_threadsafe(self._drain(), self._loop())
        try:
            drained.result(timeout=self.drain_s + CANCEL_WAIT_S + 1)
        except Exception:  # their heartbeats stop: the sweeper sends them again
            log.warning("could not hand every run in flight back", exc_info=True)

    @staticmethod
    def _loop() -> asyncio.AbstractEventLoop:
        loop_thread = get_event_loop_thread()
        if loop_thread is None:  # pragma: no cover - the AsyncIO middleware makes it
            raise RuntimeError("the worker has no event loop thread")
        return loop_thread.loop
