"""The Dramatiq broker and how every process sends work to the queues (DESIGN §1).

Redis when ``SPAR_REDIS_URL`` is set, otherwise Dramatiq's in-memory stub broker (the
embedded ``spar dev``).  Messages are sent by actor name, so senders (the API, the
scheduler) never import the actors.  Send only after the transaction that created the
row has committed: the message is just a pointer to it.  Code holding a session does not
commit to send: it calls :func:`send_after_commit`, and whoever owns the transaction
commits (the request's ``db_session`` dependency, or a job's ``database.transaction()``).

Every message carries the request id of the context that sent it (a new one outside
any request), and the worker restores it around the actor (:mod:`shared.logs`; the
worker's middleware is ``workers.observability``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar
from uuid import uuid4

import dramatiq
import redis
from dramatiq.asyncio import EventLoopThread, set_event_loop_thread
from dramatiq.broker import Consumer
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import current_millis, q_name
from dramatiq.errors import BrokerConnectionError, ConnectionClosed
from dramatiq.middleware import AsyncIO
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from shared.logs import MESSAGE_OPTION, current_request_id, new_request_id
from shared.settings import Settings

MAINTENANCE_CHANCE = 250_000  # per million broker commands
# A message enqueued on a work queue is announced on ``spar:wake:<db>:<queue>``: channels
# are the Redis server's, not a database's.
WAKE_PREFIX = "spar:wake:"
# A consumer holding all it may prefetch looks again this often: its worker threads hand it
# their acknowledgements, which it sends only between two looks (a look while full sends
# no Redis command).
FULL_POLL_S = 0.01
# The runs a process fetches at once, whatever its threads: a batch's first window, sent at
# once, is shared among the workers as they fetch (with a prefetch of 32, the threads, one
# of two processes could take 32 runs of a window of 50).  Not fewer: a run's message is
# held until its claim commits (workers.conversations), and at 4 a batch's runs waited
# 100-250 ms for one another's claims to be fetched.
RUNS_PREFETCH = 16
# The broker's Redis client waits this long for a connection or an answer, then fails
# (:class:`_Consumer` takes that as a closed connection).  Set here whatever redis-py's
# defaults: before redis-py 8 a command had no timeout, and one sent to a Redis that
# stopped answering (a failover that left the old address silent, a cut network) waited
# until TCP gave up, about a quarter of an hour.  Dramatiq's commands are scripts that
# never block; the work queues' subscription reads without it (redis-py 8.0.1 and later).
BROKER_TIMEOUT_S = 5.0
# An idle connection's peer is checked after 10 s of silence, then every 5 s: three checks
# unanswered and the connection is dead (its read fails).  The work queues' subscription
# waits for announcements without a timeout, so this is how it learns that Redis went away
# without a word, and subscribes again.
_KEEPALIVE = (
    {socket.TCP_KEEPIDLE: 10, socket.TCP_KEEPINTVL: 5, socket.TCP_KEEPCNT: 3}
    if hasattr(socket, "TCP_KEEPIDLE")  # Linux; elsewhere the system's keepalive timing
    else {}
)
# What the broker's Redis answers when it cannot take work: away or silent, loading its
# data after a restart, a replica after a failover (read-only), full (``maxmemory``).  Any
# other error (a script's, a wrong type) is a fault to raise, not an outage to wait out.
REDIS_AWAY = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.ReadOnlyError,
    redis.OutOfMemoryError,
)
# The threads a process's calls to the broker's Redis run on (:func:`in_broker_thread`).
BROKER_THREADS = 8
QUEUES = ("runs", "batches", "documents", "calibration", "triggers", "notifications")
RUN_SCENARIO = ("runs", "run_scenario")
DISPATCH_BATCH = ("batches", "dispatch_batch")
RUN_TRIGGER = ("triggers", "run_trigger_execution")
PROCESS_DOCUMENT = ("documents", "process_document")
CALIBRATE = ("calibration", "calibrate")
JUDGE_TRUST = ("calibration", "judge_trust")
ANNOUNCE_EVENT = ("notifications", "announce_event")
DELIVER_WEBHOOK = ("notifications", "deliver_webhook")


log = logging.getLogger("spar.queue")
T = TypeVar("T")


class _AsyncIO(AsyncIO):
    """Dramatiq's event loop for async actors: uvloop where it builds (every run's I/O of a
    worker goes through this one loop), and its waiting threads checking for interrupts
    (time limits, shutdown) once a second instead of ten times.

    Every message in progress holds a worker thread waiting on the loop; a worker with
    dozens of conversations in flight would otherwise wake hundreds of times a second, and
    each wake-up takes the GIL from the event loop that does the actual work."""

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = EventLoopThread(self.logger, interrupt_check_ival=1.0)
        thread.loop.close()
        thread.loop = _new_event_loop()
        thread.start(timeout=1.0)
        set_event_loop_thread(thread)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - not built for Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class PollingRedisBroker(RedisBroker):
    """Dramatiq's Redis broker, its work queues' idle consumers woken as soon as a message
    is enqueued, and a dead worker's messages given back to their queues within about
    ``heartbeat_timeout_s`` (``SPAR_RUN_HEARTBEAT_TIMEOUT_S``).

    A worker killed with messages fetched but not yet started strands them in its ack set
    until another worker's maintenance finds it dead: after Dramatiq's heartbeat timeout
    (60 s by default), at a maintenance that 0.1 % of commands run.  Here the timeout is
    the run heartbeat's, and maintenance runs with a quarter of commands (about once a
    second on an idle worker, whose consumers look at Redis about four times a second), so
    those runs come back as fast as the runs the dead worker was
    playing (:mod:`shared.work`).  A live worker taken for dead has its messages delivered
    twice, which the claims in SQL make harmless.

    Redis pushes nothing to Dramatiq's consumers: an idle one polls, backing off up to its
    idle timeout (1 s), so a message could wait that long for an idle worker to look, and
    polling more often costs every idle consumer a Redis script per look (at 50 ms, a tenth
    of a busy worker's CPU, measured in ``bench/batch.py``).  Here every message enqueued
    on a work queue is announced on a channel (``PUBLISH``, :meth:`wake_channel`), and an
    idle consumer of that queue waits for the announcement, looking anyway every
    ``work_poll_ms`` (``SPAR_WORK_POLL_MS``) for a message no one announced.  The delay
    queues' consumers keep Dramatiq's timeout."""

    def __init__(self, *, url: str, work_poll_ms: int, heartbeat_timeout_s: float) -> None:
        super().__init__(
            client=redis.Redis.from_url(
                url,
                socket_timeout=BROKER_TIMEOUT_S,
                socket_connect_timeout=BROKER_TIMEOUT_S,
                socket_keepalive=True,
                socket_keepalive_options=_KEEPALIVE,
            ),
            heartbeat_timeout=int(heartbeat_timeout_s * 1000),
            maintenance_chance=MAINTENANCE_CHANCE,
        )
        self.work_poll_ms = work_poll_ms
        database = self.client.connection_pool.connection_kwargs.get("db", 0)
        self._wake_prefix = f"{WAKE_PREFIX}{database}:"
        self._wakes: _Wakes | None = None
        self._wakes_lock = threading.Lock()
        # How many more runs this process could start (a worker's conversations set it):
        # its consumer of the ``runs`` queue fetches no more.
        self.runs_room: Callable[[], int] | None = None

    @property
    def consumer_class(self) -> type[_Consumer]:
        return _Consumer  # a delay queue's (a work queue's is made below)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        if q_name(queue_name) != queue_name:  # a delay queue
            return super().consume(queue_name, prefetch, timeout)
        with self._wakes_lock:
            if self._wakes is None:
                self._wakes = _Wakes(self.client, [self.wake_channel(q) for q in QUEUES])
        wake = self._wakes.event(self.wake_channel(queue_name))
        runs_room = None
        if queue_name == RUN_SCENARIO[0]:
            prefetch = min(prefetch, RUNS_PREFETCH)
            runs_room = self.runs_room
        return _WakingConsumer(
            self, queue_name, prefetch, self.work_poll_ms / 1000, wake, runs_room
        )

    def enqueue(self, message: dramatiq.Message, *, delay: int | None = None) -> dramatiq.Message:
        enqueued = super().enqueue(message, delay=delay)
        if delay is None:  # on its queue now (a delayed one is announced when it moves there)
            self.client.publish(self.wake_channel(message.queue_name), b"")
        return enqueued

    def enqueue_all(self, messages: list[dramatiq.Message]) -> None:
        """:meth:`enqueue` each of ``messages`` (no delay), in order, in one pipeline: a
        round trip for them all (and one to check the script is loaded) instead of two
        each.  A batch's first window, sent one message at a time, held the sending
        worker's event loop half a millisecond per run (50 ms for a window of 100) while
        the messages went out one by one.

        Each message is enqueued as Dramatiq's own :meth:`enqueue` does (a Redis id of
        its own, the middleware's enqueue hooks, the broker's ``dispatch`` script with the
        arguments of its ``do_enqueue``, maintenance at the same chance), each queue
        announced once after."""
        dispatch = self.scripts["dispatch"]
        enqueued: list[dramatiq.Message] = []
        with self.client.pipeline(transaction=False) as pipe:
            for message in messages:
                message = message.copy(options={"redis_message_id": str(uuid4())})
                self.emit_before("enqueue", message, None)
                dispatch(
                    keys=[self.namespace],
                    args=[
                        "enqueue",
                        current_millis(),
                        message.queue_name,
                        self.broker_id,
                        self.heartbeat_timeout,
                        self.dead_message_ttl,
                        self._should_do_maintenance("enqueue"),
                        self._max_unpack_size(),
                        message.options["redis_message_id"],
                        message.encode(),
                    ],
                    client=pipe,
                )
                enqueued.append(message)
            for queue_name in dict.fromkeys(message.queue_name for message in enqueued):
                pipe.publish(self.wake_channel(queue_name), b"")
            pipe.execute()
        for message in enqueued:
            self.emit_after("enqueue", message, None)

    def wake_channel(self, queue_name: str) -> str:
        """Where a message enqueued on the work queue ``queue_name`` is announced."""
        return self._wake_prefix + queue_name


class _Consumer(_RedisConsumer):
    """Dramatiq's consumer of a Redis queue, Redis away in any of its forms
    (:data:`REDIS_AWAY`) taken as a closed connection (Dramatiq's ``ConnectionClosed``):
    its consumer thread then makes a new consumer, and an acknowledgement is tried again
    until Redis takes it.  Dramatiq's own takes only a refused connection so.  A timeout,
    or a failover's read-only replica, reached the consumer thread as an unexpected error,
    whose clean-up (giving back the delayed messages it held) failed in turn and ended the
    thread for good: that worker took no delayed message again (a webhook retry, a run's
    backoff) until it restarted.  The delayed messages it held stay in its Redis ack set
    (Dramatiq drops them from memory on a closed connection); their units are sent again
    by the sweeper."""

    def ack(self, message: Any) -> None:
        with _closed_when_away():
            super().ack(message)

    def nack(self, message: Any) -> None:
        with _closed_when_away():
            super().nack(message)

    def requeue(self, messages: Any) -> None:
        with _closed_when_away():
            super().requeue(messages)

    def __next__(self) -> Any:
        with _closed_when_away():
            return super().__next__()


@contextmanager
def _closed_when_away() -> Iterator[None]:
    try:
        yield
    except REDIS_AWAY as exc:
        raise ConnectionClosed(exc) from None


class _WakingConsumer(_Consumer):
    """A work queue's consumer: with nothing to fetch, it waits for a message's announcement
    (or ``idle_s``) instead of Dramatiq's backoff."""

    def __init__(
        self,
        broker: RedisBroker,
        queue_name: str,
        prefetch: int,
        idle_s: float,
        wake: threading.Event,
        runs_room: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(broker, queue_name, prefetch, 0)  # no backoff of its own
        self.idle_s = idle_s
        self._wake = wake
        self._runs_room = runs_room

    def __next__(self) -> Any:
        if self.message_cache:
            return super().__next__()
        room = self._room() - self.outstanding_message_count
        if room <= 0:
            # Full: it waits for its messages' acknowledgements (or, for runs, for a run of
            # its process to end), and leaves any announcement for when it has room (taken
            # now, it would be lost).
            time.sleep(FULL_POLL_S)
            return None
        # Room here is room at the fetch: only this thread fetches, and the worker threads'
        # acknowledgements and ending runs only make more.  So an empty fetch is an empty
        # queue, never a look skipped for want of room.  Decided after Dramatiq's own look
        # instead, an acknowledgement landing during it sent a full consumer to wait for an
        # announcement with messages queued: a batch's first window of 1,000 runs, announced
        # at once and then silent, started at about 16 runs per second per worker, each
        # consumer idling up to ``work_poll_ms`` at a time.
        with _closed_when_away():
            self.message_cache = self.broker.do_fetch(self.queue_name, room)
        if self.message_cache:
            return super().__next__()
        if self._wake.wait(self.idle_s):
            # Cleared before the next fetch: an announcement after it wakes the next wait.
            self._wake.clear()
        return None

    def _room(self) -> int:
        """The messages it may hold: its prefetch, and for runs no more than its process
        has room to start (a message held by a full process would wait there for one of
        that process's runs to end while other processes idle)."""
        if self._runs_room is None:
            return self.prefetch
        return min(self.prefetch, self._runs_room())


class _Wakes:
    """The work queues' announcements in one process: a thread subscribed to their channels
    sets the event of each channel that gets a message.  Redis away (or gone silent: TCP
    keepalive finds the connection dead, :data:`_KEEPALIVE`), it subscribes again once Redis
    is back; meanwhile the consumers poll every ``SPAR_WORK_POLL_MS``."""

    def __init__(self, client: redis.Redis, channels: list[str]) -> None:
        self._client = client
        self._events = {channel.encode(): threading.Event() for channel in channels}
        threading.Thread(target=self._listen, name="spar-wakes", daemon=True).start()

    def event(self, channel: str) -> threading.Event:
        return self._events[channel.encode()]

    def _listen(self) -> None:
        pause = 0.1
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(*self._events)
                pause = 0.1
                for message in pubsub.listen():
                    wake = self._events.get(message["channel"])
                    if wake is not None:
                        wake.set()
            except redis.RedisError:
                log.info("work queue announcements: Redis away, subscribing again", exc_info=True)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
            finally:
                pubsub.close()


@lru_cache(maxsize=4)
def get_broker(settings: Settings) -> dramatiq.Broker:
    """One broker per process and settings (``spar dev``'s API and worker share the
    in-memory one): Redis at ``settings.redis_url``, else the in-memory stub, with the
    AsyncIO middleware for async actors.  A worker adds its own middleware
    (``workers.broker``)."""
    broker: dramatiq.Broker = (
        PollingRedisBroker(
            url=settings.redis_url,
            work_poll_ms=settings.work_poll_ms,
            heartbeat_timeout_s=settings.run_heartbeat_timeout_s,
        )
        if settings.redis_url
        else StubBroker()
    )
    broker.add_middleware(_AsyncIO())
    for queue in QUEUES:
        broker.declare_queue(queue)
    return broker


def send(
    broker: dramatiq.Broker,
    target: tuple[str, str],
    *args: Any,
    delay_ms: int | None = None,
    retries: int = 0,
) -> None:
    """Send ``args`` to the actor ``target`` (queue, actor name), with the current request
    id (or a new one) so the worker's log lines for it can be found by that id; with
    ``delay_ms``, to be delivered that much later (Dramatiq's delay queue); ``retries``:
    the deliveries that failed before this one, when the sender retries it itself
    (:mod:`workers.conversations`), in Dramatiq's own option."""
    broker.enqueue(_message(target, args, retries), delay=delay_ms)


def send_all(broker: dramatiq.Broker, target: tuple[str, str], each: list[tuple[Any, ...]]) -> None:
    """:func:`send` ``target`` each of ``each``'s arguments, in order, at once: one round
    trip to Redis (:meth:`PollingRedisBroker.enqueue_all`) however many there are."""
    messages = [_message(target, args, 0) for args in each]
    if isinstance(broker, PollingRedisBroker):
        broker.enqueue_all(messages)
    else:
        for message in messages:
            broker.enqueue(message)


async def asend_all(
    broker: dramatiq.Broker, target: tuple[str, str], each: list[tuple[Any, ...]]
) -> None:
    """:func:`send_all` from a coroutine: sent from a thread, so that the event loop goes on
    while Redis answers.  An enqueue is a blocking round trip (Dramatiq's client): in
    ``bench/batch.py`` a run's successor took 1.3 ms to send on average and up to 7 ms as a
    batch's runs ended together, and every conversation on the loop waited through it."""
    if each:
        await in_broker_thread(send_all, broker, target, each)


async def in_broker_thread(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``, a blocking call to the broker's Redis, on a thread of the process's
    pool for them (:data:`BROKER_THREADS`), in the caller's context (its request id).

    A pool of their own: while Redis is silent each call holds its thread up to
    :data:`BROKER_TIMEOUT_S`, and in the default pool (``asyncio.to_thread``'s: the CPU
    count + 4 threads) a few of them held up what else waits there: password hashing,
    documents being parsed.

    A call that waited :data:`BROKER_TIMEOUT_S` for a thread is not made: it raises
    ``ConnectionClosed`` at once, as with Redis away.  Calls queued behind a silent Redis
    would otherwise wait for one another without end (eight threads take 1.6 calls a
    second), each request behind every request before it; what they would have sent is
    sent again by the sweeper."""
    queued_at = time.monotonic()

    def run() -> T:
        if time.monotonic() - queued_at > BROKER_TIMEOUT_S:
            raise ConnectionClosed(TimeoutError("the broker's calls are backed up"))
        return call(*args)

    runner = functools.partial(contextvars.copy_context().run, run)
    return await asyncio.get_running_loop().run_in_executor(_broker_threads(), runner)


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _broker_threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(BROKER_THREADS, "spar-broker")
        return _pool


def _forget_the_pool() -> None:
    """In a forked child (a worker process): none of the parent's threads came along, and
    its lock may have been held as it forked."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_pool)


def _message(target: tuple[str, str], args: tuple[Any, ...], retries: int) -> dramatiq.Message:
    queue_name, actor_name = target
    options: dict[str, Any] = {MESSAGE_OPTION: current_request_id() or new_request_id()}
    if retries:
        options["retries"] = retries
    return dramatiq.Message(
        queue_name=queue_name, actor_name=actor_name, args=args, kwargs={}, options=options
    )


_AFTER_COMMIT = "spar_send_after_commit"
# What a transaction asked to send: the broker, the target, the arguments, the delay (ms).
_Pending = tuple[dramatiq.Broker, tuple[str, str], tuple[Any, ...], int | None]


def send_after_commit(
    session: AsyncSession,
    broker: dramatiq.Broker,
    target: tuple[str, str],
    *args: Any,
    delay_ms: int | None = None,
) -> None:
    """:func:`send` once ``session``'s transaction has committed (:func:`send_committed`);
    never if it rolls back.  A worker told about a row must always find it, and the caller
    need not own the transaction to say so."""
    session.info.setdefault(_AFTER_COMMIT, []).append((broker, target, args, delay_ms))


async def send_committed(session: AsyncSession) -> None:
    """Send what ``session``'s transaction, now committed, asked to (:func:`send_after_commit`),
    in order, from a thread, once the session has given back its connection.

    From a thread: Dramatiq's enqueue is a blocking round trip, and sent from the event
    loop it held up every request of an API process while Redis answered (a health check
    sent during a 2 s pause of Redis answered after the pause).

    A message that cannot be sent (Redis away in any of its forms, :data:`REDIS_AWAY`, or
    the broker's calls backed up, :func:`in_broker_thread`) is logged with those after it,
    not raised.  Its row is committed: the unit waits for its message and is sent again
    once its stall period is over (the sweeper; ``docs/operations.md``, "A lost
    message").  Raised, it answered the request that made the row 500, and a caller who
    retried made a second one."""
    pending = session.info.pop(_AFTER_COMMIT, None)
    if not pending:
        return
    try:
        unsent, error = await in_broker_thread(_send_each, pending)
    except BrokerConnectionError as exc:  # backed up: none was tried
        unsent, error = pending, exc
    if unsent:
        log.warning(
            "could not send %s after its commit (%s: %s); it is sent again later",
            ", ".join(sorted({actor for _, (_, actor), _, _ in unsent})),
            type(error).__name__,
            error,
        )


def _send_each(pending: list[_Pending]) -> tuple[list[_Pending], Exception | None]:
    """Send each of ``pending`` in order; those not sent, from the first that Redis did not
    take, and why."""
    for index, (broker, target, args, delay_ms) in enumerate(pending):
        try:
            send(broker, target, *args, delay_ms=delay_ms)
        except (*REDIS_AWAY, BrokerConnectionError) as exc:
            return pending[index:], exc
    return [], None


@event.listens_for(Session, "after_rollback")
def _drop_pending(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)
