"""What only the API exports: its requests by route template, the depth and age of the
queues read from the broker at scrape time, and ``GET /metrics`` (Prometheus text format)
for them: only them, whatever else the API's processes import (``spar dev`` serves its
workers' and scheduler's families here too).

``/metrics`` sits outside ``/v1``, beside the health probes: it names routes, queues,
actors and provider types, never an organization or a resource, so it holds no tenant
data.  With ``SPAR_METRICS_TOKEN`` set it answers only ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

import dramatiq
import msgspec
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name, q_name
from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.exceptions import NotAuthorizedException
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase

from shared import metrics as shared_metrics

log = logging.getLogger("spar.metrics")

# --- requests --------------------------------------------------------------------------------

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

HTTP_REQUESTS = Counter(
    "spar_http_requests_total",
    "HTTP requests answered, by method, route template and status code.",
    ["method", "route", "status"],
)
HTTP_DURATION = Histogram(
    "spar_http_request_duration_seconds",
    "Time to answer an HTTP request (streams: until the stream ends), by method and route.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


# What the API's processes export (``spar dev`` adds the workers' and the scheduler's).
FAMILIES = (HTTP_REQUESTS, HTTP_DURATION)


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    method = method if method in HTTP_METHODS else "OTHER"
    requests, duration = _request_series(method, route, status)
    requests.inc()
    duration.observe(seconds)


@cache
def _request_series(method: str, route: str, status: int) -> tuple[Counter, Histogram]:
    """The series a request counts in, looked up once per method, route template and
    status (a few hundred at most): ``labels`` checks its arguments and takes a lock at
    every call, on every request."""
    return HTTP_REQUESTS.labels(method, route, str(status)), HTTP_DURATION.labels(method, route)


# --- queues, read from the broker at scrape time ---------------------------------------------


class QueueStats(msgspec.Struct, frozen=True):
    queue: str
    ready: int  # waiting for a worker
    held: int  # taken by a worker: prefetched or being processed
    delayed: int  # waiting for their time (retry backoff)
    dead: int  # dead-lettered
    oldest_age_s: float  # the oldest waiting message's time since it became due; 0 if none


# One round trip, atomic: Dramatiq's Redis broker keeps, per queue, the waiting message
# ids in the list ``ns:queue`` (oldest first), every unacknowledged message in the hash
# ``ns:queue.msgs``, delayed ones in ``ns:queue.DQ.msgs`` and dead ones in the sorted
# set ``ns:queue.XQ``.
_REDIS_STATS = """
local out = {}
for i = 2, #ARGV do
    local queue = ARGV[1] .. ":" .. ARGV[i]
    local ready = redis.call("llen", queue)
    local held = redis.call("hlen", queue .. ".msgs") - ready
    local delayed = redis.call("hlen", queue .. ".DQ.msgs")
    local dead = redis.call("zcard", queue .. ".XQ")
    local head = false
    local first = redis.call("lrange", queue, 0, 0)
    if #first > 0 then
        head = redis.call("hget", queue .. ".msgs", first[1])
    end
    table.insert(out, {ready, held, delayed, dead, head})
end
return out
"""


def _age_s(encoded: bytes | None, now_ms: int) -> float:
    if not encoded:
        return 0.0
    message = dramatiq.Message.decode(encoded)
    due = message.options.get("eta") or message.message_timestamp
    return max(0.0, (now_ms - int(due)) / 1000)


def _work_queues(broker: dramatiq.Broker) -> list[str]:
    return sorted(q for q in broker.get_declared_queues() if q_name(q) == q)


def queue_stats(broker: dramatiq.Broker) -> list[QueueStats]:
    """Depth and age of each declared queue of a Redis or in-memory (``spar dev``) broker."""
    queues = _work_queues(broker)
    now_ms = int(time.time() * 1000)
    if isinstance(broker, RedisBroker):
        script = broker.client.register_script(_REDIS_STATS)
        rows = script(args=[broker.namespace, *queues]) if queues else []
        return [
            QueueStats(
                q, int(ready), max(0, int(held)), int(delayed), int(dead), _age_s(head, now_ms)
            )
            for q, (ready, held, delayed, dead, head) in zip(queues, rows, strict=True)
        ]
    if isinstance(broker, StubBroker):
        stats = []
        for q in queues:
            work, delay = broker.queues[q], broker.queues.get(dq_name(q))
            with work.mutex:
                ready, unfinished = len(work.queue), work.unfinished_tasks
                head = work.queue[0] if work.queue else None
            stats.append(
                QueueStats(
                    q,
                    ready,
                    max(0, unfinished - ready),
                    delay.unfinished_tasks if delay is not None else 0,
                    len(broker.dead_letters_by_queue[q]),
                    _age_s(head, now_ms),
                )
            )
        return stats
    return []


class QueueCollector:
    """Per-queue gauges, read from the broker at each scrape: what an operator (or KEDA)
    scales worker pools on.  A broker that does not answer gives ``spar_broker_up 0``."""

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("spar_broker_up", "1 if the broker answered this scrape.")
        try:
            stats = queue_stats(self.broker)
        except Exception as exc:  # a scrape reports, it does not fail
            log.warning("could not read the queues: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        gauges = {
            "ready": "Messages waiting for a worker.",
            "held": "Messages taken by workers: prefetched or being processed.",
            "delayed": "Messages waiting for their time (retry backoff).",
            "dead": "Dead-lettered messages.",
        }
        for state, help_text in gauges.items():
            family = GaugeMetricFamily(f"spar_queue_{state}_messages", help_text, labels=["queue"])
            for s in stats:
                family.add_metric([s.queue], getattr(s, state))
            yield family
        age = GaugeMetricFamily(
            "spar_queue_oldest_message_age_seconds",
            "Time the oldest waiting message has been due (0 when none waits).",
            labels=["queue"],
        )
        for s in stats:
            age.add_metric([s.queue], s.oldest_age_s)
        yield age


# --- GET /metrics ----------------------------------------------------------------------------


def exposition(broker: dramatiq.Broker | None, families: Iterable[MetricWrapperBase]) -> bytes:
    """``families`` as this API's processes counted them, plus the queues of ``broker``
    when given.  Blocking (files, Redis): call it from a thread."""
    if broker is None:
        return shared_metrics.exposition(families)
    return shared_metrics.exposition(families, QueueCollector(broker))  # type: ignore[arg-type]


def _authorized(request: Request[Any, Any, Any], token: str | None) -> bool:
    if token is None:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


@get("/metrics", include_in_schema=False)
async def metrics(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Prometheus metrics of this API's processes and the queues' depth and age."""
    if not _authorized(request, state.settings.metrics_token):
        raise NotAuthorizedException("a valid metrics token is required")
    body = await asyncio.to_thread(exposition, state.broker, state.metric_families)
    # The header as given: Litestar appends its own charset to a ``media_type`` of text/*,
    # and a second charset parameter is one Prometheus warns about or refuses.
    return Response(body, headers={"Content-Type": shared_metrics.CONTENT_TYPE})
