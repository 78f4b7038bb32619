"""The Redis broker: how long an idle consumer may wait before it looks at Redis."""

from __future__ import annotations

from dramatiq.common import dq_name

from shared.queue import PollingRedisBroker

URL = "redis://127.0.0.1:6379/15"  # never connected: building consumers sends nothing


def test_work_queues_are_polled_at_least_every_work_poll_ms():
    broker = PollingRedisBroker(url=URL, work_poll_ms=20, heartbeat_timeout_s=30)
    assert broker.consume("runs", prefetch=4, timeout=1000).timeout == 20
    assert broker.consume("batches", prefetch=4, timeout=1000).timeout == 20
    # A shorter idle timeout of Dramatiq's own is kept.
    assert broker.consume("runs", prefetch=4, timeout=10).timeout == 10


def test_delay_queues_keep_dramatiqs_timeout():
    broker = PollingRedisBroker(url=URL, work_poll_ms=20, heartbeat_timeout_s=30)
    assert broker.consume(dq_name("runs"), prefetch=4, timeout=1000).timeout == 1000


def test_a_dead_workers_messages_come_back_after_the_run_heartbeat_timeout():
    """Dramatiq gives a dead worker's fetched messages back once its heartbeat is this old
    (60 s by default): here the run heartbeat's timeout, checked at 1 % of commands."""
    broker = PollingRedisBroker(url=URL, work_poll_ms=20, heartbeat_timeout_s=12.5)
    assert broker.heartbeat_timeout == 12_500
    assert broker.maintenance_chance == 10_000
