"""The Redis broker: how an idle consumer of a work queue learns of a message (announced on
a channel as it is enqueued), how long it waits when none is announced, and how soon a dead
worker's messages come back."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import dramatiq
import pytest
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name
from dramatiq.errors import ConnectionClosed

from shared.logs import MESSAGE_OPTION, request_id
from shared.queue import (
    BROKER_THREADS,
    BROKER_TIMEOUT_S,
    RUN_SCENARIO,
    PollingRedisBroker,
    asend_all,
    in_broker_thread,
    send,
    send_all,
)
from tests.support.loop import ticking_while_redis_holds_writes

URL = "redis://127.0.0.1:6379/15"  # never connected: building a delay queue's consumer


def test_work_queues_wait_at_most_work_poll_ms_and_delay_queues_keep_dramatiqs_timeout():
    broker = PollingRedisBroker(url=URL, work_poll_ms=20, heartbeat_timeout_s=30)
    assert broker.consume("runs", prefetch=4, timeout=1000).idle_s == 0.02
    assert broker.consume(dq_name("runs"), prefetch=4, timeout=1000).timeout == 1000


def test_a_dead_workers_messages_come_back_after_the_run_heartbeat_timeout():
    """Dramatiq gives a dead worker's fetched messages back once its heartbeat is this old
    (60 s by default): here the run heartbeat's timeout, checked at a quarter of commands
    (an idle worker's consumers send about four a second)."""
    broker = PollingRedisBroker(url=URL, work_poll_ms=20, heartbeat_timeout_s=12.5)
    assert broker.heartbeat_timeout == 12_500
    assert broker.maintenance_chance == 250_000


@pytest.fixture
def redis_url(redis_url: str) -> str:
    """This test worker's Redis database, empty."""
    redis.Redis.from_url(redis_url).flushdb()
    return redis_url


def _message(queue: str = "runs") -> dramatiq.Message:
    return dramatiq.Message(
        queue_name=queue, actor_name="run_scenario", args=("x",), kwargs={}, options={}
    )


def test_an_idle_consumer_is_woken_by_a_message_sent_long_before_its_next_look(redis_url: str):
    """Idle, the consumer would look again only after ``work_poll_ms`` (10 s here): the
    message's announcement wakes it at once."""
    receiving = PollingRedisBroker(url=redis_url, work_poll_ms=10_000, heartbeat_timeout_s=30)
    sending = PollingRedisBroker(url=redis_url, work_poll_ms=10_000, heartbeat_timeout_s=30)
    for broker in (receiving, sending):
        broker.declare_queue("runs")
    consumer = receiving.consume("runs", prefetch=1)
    got: list[tuple[float, object]] = []

    def look() -> None:
        started = time.monotonic()
        while (message := next(consumer)) is None and time.monotonic() - started < 15:
            pass
        got.append((time.monotonic() - started, message))

    looking = threading.Thread(target=look)
    looking.start()
    time.sleep(0.5)  # the consumer found nothing and waits (up to 10 s)
    sent = time.monotonic()
    sending.enqueue(_message())
    looking.join(timeout=20)
    took, message = got[0]
    assert message is not None and message.args == ("x",)
    assert time.monotonic() - sent < 2.0, f"woken after {took:.1f} s"


def test_a_message_nobody_announced_is_found_at_the_next_idle_look(redis_url: str):
    broker = PollingRedisBroker(url=redis_url, work_poll_ms=300, heartbeat_timeout_s=30)
    broker.declare_queue("runs")
    consumer = broker.consume("runs", prefetch=1)
    assert next(consumer) is None
    # Enqueued as Dramatiq's own broker does, with no announcement.
    dramatiq.brokers.redis.RedisBroker.enqueue(broker, _message())
    started = time.monotonic()
    while (message := next(consumer)) is None:
        assert time.monotonic() - started < 3
    assert message.args == ("x",)


def test_announcements_go_to_the_work_queue_not_the_delay_queue(redis_url: str):
    broker = PollingRedisBroker(url=redis_url, work_poll_ms=1000, heartbeat_timeout_s=30)
    broker.declare_queue("runs")
    listener = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    listener.psubscribe(broker.wake_channel("*"))
    listener.get_message(timeout=1)
    broker.enqueue(_message(), delay=60_000)  # on runs.DQ until it is due: nothing to wake
    broker.enqueue(_message())
    announced = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not announced:
        if (message := listener.get_message(timeout=0.5)) is not None:
            announced.append(message["channel"])
    time.sleep(0.3)
    while (message := listener.get_message(timeout=0.1)) is not None:
        announced.append(message["channel"])
    assert announced == [broker.wake_channel("runs").encode()]
    listener.close()


def test_a_full_consumer_acknowledged_while_it_looks_fetches_what_is_queued(redis_url: str):
    """A consumer holding all it may prefetch looks again every few milliseconds for its
    acknowledgements; one acknowledgement landing during that look must not send it to wait
    for an announcement (``work_poll_ms``, 10 s here) while messages sit in the queue.  It
    did: a batch of 1,000 runs, announced at once and then silent, was started at about 16
    runs per second per worker, each consumer idling up to ``SPAR_WORK_POLL_MS`` at a time.
    The worker threads acknowledge while the consumer looks: here a thread, many times."""
    broker = PollingRedisBroker(url=redis_url, work_poll_ms=10_000, heartbeat_timeout_s=30)
    broker.declare_queue("runs")
    consumer = broker.consume("runs", prefetch=1)

    def enqueue_unannounced() -> None:  # as Dramatiq's own broker does: the queue is silent
        dramatiq.brokers.redis.RedisBroker.enqueue(broker, _message())

    enqueue_unannounced()
    started = time.monotonic()
    while (held := next(consumer)) is None:
        assert time.monotonic() - started < 12
    for round_ in range(60):
        enqueue_unannounced()
        acking = threading.Timer(0.0005 * (round_ % 5), consumer.ack, [held])
        acking.start()
        started = time.monotonic()
        while (message := next(consumer)) is None:
            waited = time.monotonic() - started
            assert waited < 2.0, f"round {round_}: idled {waited:.1f} s with a message queued"
        acking.join()
        held = message
    consumer.ack(held)


def test_a_runs_consumer_fetches_no_more_than_its_process_has_room_for(redis_url: str):
    """A full process leaves run messages in the queue for the others (its room is what its
    conversations say, ``runs_room``); other queues keep the prefetch alone."""
    broker = PollingRedisBroker(url=redis_url, work_poll_ms=100, heartbeat_timeout_s=30)
    room = [0]
    broker.runs_room = lambda: room[0]
    broker.declare_queue("runs")
    consumer = broker.consume("runs", prefetch=4)
    for _ in range(3):
        broker.enqueue(_message())
    for _ in range(5):
        assert next(consumer) is None
    assert consumer.outstanding_message_count == 0
    room[0] = 2  # two runs ended
    got = [m for m in (next(consumer) for _ in range(5)) if m is not None]
    assert len(got) == 2 and consumer.outstanding_message_count == 2
    client = redis.Redis.from_url(redis_url)
    assert client.llen("dramatiq:runs") == 1  # the third is still there for another process
    for message in got:
        consumer.ack(message)


class _Hooks(dramatiq.Middleware):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message, delay) -> None:
        self.seen.append(("before", message.options["redis_message_id"]))

    def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message, delay) -> None:
        self.seen.append(("after", message.options["redis_message_id"]))


def test_send_all_enqueues_as_send_does_in_order_and_announced_in_two_round_trips(
    redis_url: str,
):
    """A batch's window sent at once: the messages land in Redis as one ``send`` each would
    leave them (a consumer gets them all, in order, each under its own Redis id in the
    queue's hash), the middleware's enqueue hooks run for each, and the queue is announced
    once; two round trips (the script checked, then all of it), not two per message."""
    broker = PollingRedisBroker(url=redis_url, work_poll_ms=10_000, heartbeat_timeout_s=30)
    hooks = _Hooks()
    broker.add_middleware(hooks)
    broker.declare_queue("runs")
    listener = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    listener.psubscribe(broker.wake_channel("*"))
    listener.get_message(timeout=1)
    client = redis.Redis.from_url(redis_url)
    broker._max_unpack_size()  # Dramatiq asks Redis once per process, then remembers
    broker.client.ping()  # the broker's connection open, as a worker's is
    # What Redis executed for this database while the window was sent (MONITOR: the server's
    # own command statistics also count the other test processes sharing it).
    db = client.connection_pool.connection_kwargs.get("db", 0)
    sentinel = f"spar-test-{uuid.uuid4().hex}"
    marker = redis.Redis.from_url(redis_url)
    marker.ping()  # connected (and its database selected) before the monitor starts
    commands: list[tuple[str, str]] = []  # (client port, command); the scripts' own: no port
    with client.monitor() as monitor:
        send_all(broker, RUN_SCENARIO, [(f"run-{i}",) for i in range(40)])
        marker.echo(sentinel)
        for seen in monitor.listen():
            if sentinel in seen["command"]:
                break
            if seen["db"] == db and seen.get("client_port"):
                commands.append((seen["client_port"], seen["command"]))
    # One connection: the script checked, then 40 scripts (Dramatiq's dispatch, each an
    # enqueue) and one PUBLISH, nothing else.
    assert len({port for port, _ in commands}) == 1, commands
    sent = [command for _, command in commands]
    assert sent[0].startswith("SCRIPT EXISTS"), sent
    assert all(c.startswith("EVALSHA") and " enqueue " in c for c in sent[1:41]), sent
    assert [c.split()[0] for c in sent[41:]] == ["PUBLISH"], sent
    assert client.llen("dramatiq:runs") == 40
    assert client.hlen("dramatiq:runs.msgs") == 40
    ids = [i for when, i in hooks.seen if when == "before"]
    assert len(set(ids)) == 40
    assert hooks.seen == [("before", i) for i in ids] + [("after", i) for i in ids]

    announced = []
    while (message := listener.get_message(timeout=0.5)) is not None:
        announced.append(message["channel"])
    assert announced == [broker.wake_channel("runs").encode()]
    listener.close()

    consumer = broker.consume("runs", prefetch=40)
    got: list[dramatiq.Message] = []
    started = time.monotonic()
    while len(got) < 40:
        assert time.monotonic() - started < 5
        if (message := next(consumer)) is not None:
            got.append(message)
            consumer.ack(message)
    assert [m.args for m in got] == [(f"run-{i}",) for i in range(40)]
    assert {m.options["redis_message_id"] for m in got} == set(ids)
    assert all(m.actor_name == RUN_SCENARIO[1] and m.options[MESSAGE_OPTION] for m in got)
    assert client.hlen("dramatiq:runs.msgs") == 0


def test_send_all_on_the_in_memory_broker_enqueues_each():
    broker = StubBroker()
    broker.declare_queue("runs")
    send_all(broker, RUN_SCENARIO, [("a",), ("b",)])
    sent = [dramatiq.Message.decode(m) for m in broker.queues["runs"].queue]
    assert [m.args for m in sent] == [("a",), ("b",)]


async def test_a_coroutine_sends_its_messages_without_holding_up_the_event_loop(
    own_redis_url: str,
) -> None:
    """A run's successors (and a batch's first window) are sent from the worker's event loop,
    where every conversation of the process lives: while Redis is slow to take them (here
    its writes paused), the loop goes on, and the messages are queued once Redis is back."""
    broker = PollingRedisBroker(url=own_redis_url, work_poll_ms=1000, heartbeat_timeout_s=30)
    broker.declare_queue("runs")
    async with ticking_while_redis_holds_writes(own_redis_url, 600) as ticks:
        await asend_all(broker, RUN_SCENARIO, [("a",), ("b",)])
    # The loop ran while the send waited for Redis (about 50 ticks; none if blocked, and
    # none either if the send had not waited).
    assert ticks.count >= 20, ticks.count
    consumer = broker.consume("runs", prefetch=2)
    got = []
    deadline = time.monotonic() + 3
    while len(got) < 2 and time.monotonic() < deadline:
        if (message := next(consumer)) is not None:
            got.append(message.args)
    assert sorted(got) == [("a",), ("b",)]


async def test_a_send_does_not_wait_for_the_default_thread_pool() -> None:
    """Sends go on the broker's own threads: a default pool (``asyncio.to_thread``'s) whose
    every thread is held (password hashing, documents parsed, or sends to a silent Redis
    before) does not hold them up.  The message carries its sender's request id."""
    loop = asyncio.get_running_loop()
    release = threading.Event()
    held = [loop.run_in_executor(None, release.wait) for _ in range(40)]  # above its 32 at most
    broker = StubBroker()
    broker.declare_queue("runs")
    token = request_id.set("req-of-the-sender")
    try:
        await asyncio.wait_for(asend_all(broker, RUN_SCENARIO, [("a",)]), timeout=2)
    finally:
        request_id.reset(token)
        release.set()
        await asyncio.gather(*held)
    (message,) = [dramatiq.Message.decode(m) for m in broker.queues["runs"].queue]
    assert message.args == ("a",)
    assert message.options[MESSAGE_OPTION] == "req-of-the-sender"


def test_the_brokers_commands_wait_for_a_redis_that_stopped_answering_only_so_long(
    own_redis_url: str,
):
    """A send to a Redis that stopped answering fails while it is still silent (after
    ``BROKER_TIMEOUT_S``), as with Redis away (its sender logs it, and the sweeper sends
    the unit again), instead of holding its thread until Redis answers or TCP gives up; a
    consumer's look fails the same way, which Dramatiq's worker answers by making its
    consumer again.  The work queues' subscription, which waits for announcements without
    a timeout, is not cut by it."""
    broker = PollingRedisBroker(url=own_redis_url, work_poll_ms=100, heartbeat_timeout_s=30)
    broker.declare_queue("runs")
    consumer = broker.consume("runs", prefetch=1)
    admin = redis.Redis.from_url(own_redis_url)

    def subscribers() -> list[str]:
        return [c["id"] for c in admin.client_list() if c["cmd"] in ("subscribe", "ssubscribe")]

    deadline = time.monotonic() + 10
    while not subscribers() and time.monotonic() < deadline:
        time.sleep(0.05)
    (subscribed,) = subscribers()
    # Long enough for both calls to give up while it lasts: a call that waited it out
    # would succeed once it ends, and raise nothing.
    admin.execute_command("CLIENT", "PAUSE", str(int((BROKER_TIMEOUT_S * 2 + 2) * 1000)), "ALL")
    try:
        with pytest.raises(redis.TimeoutError):
            send(broker, RUN_SCENARIO, "x")
        with pytest.raises(ConnectionClosed):
            next(consumer)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert subscribers() == [subscribed], "the subscription was cut"


def _silent(admin: redis.Redis) -> None:
    """Redis answers nothing, for long enough that a look times out and the clean-up after
    it would have too."""
    paused_s = 2 * BROKER_TIMEOUT_S + 1.5
    admin.execute_command("CLIENT", "PAUSE", str(int(paused_s * 1000)), "ALL")
    time.sleep(paused_s + 1.5)


def _read_only(admin: redis.Redis) -> None:
    """Redis a replica for a while (what a failover leaves at the old address): it refuses
    every write, Dramatiq's fetch script's included."""
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a primary that never answers
    time.sleep(3)
    admin.execute_command("REPLICAOF", "NO", "ONE")


@pytest.mark.parametrize("away", [_silent, _read_only], ids=["silent", "read-only"])
def test_a_workers_delay_queue_consumer_outlives_a_redis_that_cannot_take_work(
    own_redis_url: str, away: Callable[[redis.Redis], None]
):
    """A worker holding a delayed message (a webhook retry, a run's backoff) when Redis
    stops answering, or turns read-only: its delay queue's consumer fails, and Dramatiq's
    worker makes it again, as after a refused connection; it takes the delayed messages
    sent once Redis is back.  Before, the failure reached the consumer thread as an
    unexpected error, whose clean-up (giving the held message back) failed too and ended
    the thread for good."""
    broker = PollingRedisBroker(url=own_redis_url, work_poll_ms=1000, heartbeat_timeout_s=30)
    played = threading.Event()

    @dramatiq.actor(broker=broker, queue_name="notifications", actor_name="noted")
    def noted(note: str) -> None:
        if note == "soon":
            played.set()

    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        noted.send_with_options(args=("in a minute",), delay=60_000)
        time.sleep(1.0)  # fetched by the delay queue's consumer, held until it is due
        away(redis.Redis.from_url(own_redis_url))
        assert worker.consumers[dq_name("notifications")].is_alive()
        noted.send_with_options(args=("soon",), delay=100)
        assert played.wait(10), "the delayed message was never played"
    finally:
        worker.stop()


async def test_a_broker_call_that_waited_its_timeout_for_a_thread_is_not_made() -> None:
    """Calls queued behind a silent Redis do not wait for one another without end: one that
    waited ``BROKER_TIMEOUT_S`` for a thread fails at once, as with Redis away, and the
    calls after the backlog are made."""
    release = threading.Event()
    held = [asyncio.ensure_future(in_broker_thread(release.wait)) for _ in range(BROKER_THREADS)]
    made: list[str] = []
    queued = asyncio.ensure_future(in_broker_thread(made.append, "late"))
    await asyncio.sleep(BROKER_TIMEOUT_S + 0.5)
    release.set()
    await asyncio.gather(*held)
    with pytest.raises(ConnectionClosed):
        await queued
    await in_broker_thread(made.append, "next")
    assert made == ["next"]
