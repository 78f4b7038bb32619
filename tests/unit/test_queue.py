"""The Redis broker: how long an idle consumer may wait before it looks at Redis."""

from __future__ import annotations

from dramatiq.common import dq_name

from shared.queue import PollingRedisBroker

URL = "redis://127.0.0.1:6379/15"  # never connected: building consumers sends nothing


def test_work_queues_are_polled_at_least_every_work_poll_ms():
    broker = PollingRedisBroker(url=URL, work_poll_ms=20)
    assert broker.consume("runs", prefetch=4, timeout=1000).timeout == 20
    assert broker.consume("batches", prefetch=4, timeout=1000).timeout == 20
    # A shorter idle timeout of Dramatiq's own is kept.
    assert broker.consume("runs", prefetch=4, timeout=10).timeout == 10


def test_delay_queues_keep_dramatiqs_timeout():
    broker = PollingRedisBroker(url=URL, work_poll_ms=20)
    assert broker.consume(dq_name("runs"), prefetch=4, timeout=1000).timeout == 1000
