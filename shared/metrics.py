"""Prometheus metrics: what operators alert and scale on (docs/operations.md lists them).

* HTTP requests by method, route *template* and status, with latency (the API's
  middleware records them);
* per actor: messages processed by outcome, retries, dead letters, durations and
  messages in progress (:class:`ActorMetrics`, a Dramatiq middleware);
* per queue: messages waiting, delayed, held by workers, dead, and the age of the oldest
  waiting one, read from the broker at scrape time (:class:`QueueCollector`);
* scenario runs in flight and finished, by status;
* agent and judge calls: latency and errors by kind and provider (:func:`observed_call`);
* knowledge documents processed, by outcome;
* the scheduler: whether it leads, trigger slots fired and missed, work the sweeper sent
  again (``spar scheduler --metrics-port``).

Labels never hold organization ids, raw paths, secrets or any other unbounded value.

Under ``spar serve --workers N`` and ``spar worker --processes N`` the processes share a
``PROMETHEUS_MULTIPROC_DIR`` (:mod:`shared.metrics_dir`) and a scrape reads all of them;
elsewhere (``spar dev``, tests) the process's own registry is read.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import dramatiq
import msgspec
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name, q_name
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from shared.metrics_dir import ENV as MULTIPROCESS_ENV

log = logging.getLogger("spar.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
P = ParamSpec("P")
R = TypeVar("R")

# --- the API ---------------------------------------------------------------------------------

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


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    method = method if method in HTTP_METHODS else "OTHER"
    HTTP_REQUESTS.labels(method, route, str(status)).inc()
    HTTP_DURATION.labels(method, route).observe(seconds)


# --- actors ----------------------------------------------------------------------------------

ACTOR_MESSAGES = Counter(
    "spar_actor_messages_total",
    "Messages an actor finished, by outcome: succeeded, failed (raised; retried or "
    "dead-lettered) or skipped.",
    ["queue", "actor", "outcome"],
)
ACTOR_RETRIES = Counter(
    "spar_actor_message_retries_total",
    "Failed messages sent again, after a backoff, for another attempt.",
    ["queue", "actor"],
)
ACTOR_DEAD = Counter(
    "spar_actor_messages_dead_lettered_total",
    "Messages given up on (retries exhausted) and moved to the dead-letter queue.",
    ["queue", "actor"],
)
ACTOR_DURATION = Histogram(
    "spar_actor_message_duration_seconds",
    "Time an actor spent on a message.",
    ["queue", "actor"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0),
)
ACTOR_IN_PROGRESS = Gauge(
    "spar_actor_messages_in_progress",
    "Messages being processed now.",
    ["queue", "actor"],
    multiprocess_mode="livesum",
)


def _actor_labels(message: dramatiq.Message) -> tuple[str, str]:
    return q_name(message.queue_name), message.actor_name


class ActorMetrics(dramatiq.Middleware):
    """Counts and times every message a worker processes, and the retries and dead letters
    it produces.  Before and after hooks run on the same worker thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        self._local.started = time.perf_counter()
        ACTOR_IN_PROGRESS.labels(*_actor_labels(message)).inc()

    def _finish(self, message: dramatiq.Message, outcome: str) -> None:
        labels = _actor_labels(message)
        started = getattr(self._local, "started", None)
        self._local.started = None
        if started is not None:  # a middleware before this one may have skipped it
            ACTOR_DURATION.labels(*labels).observe(time.perf_counter() - started)
            ACTOR_IN_PROGRESS.labels(*labels).dec()
        ACTOR_MESSAGES.labels(*labels, outcome).inc()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._finish(message, "succeeded" if exception is None else "failed")

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        self._finish(message, "skipped")

    def after_enqueue(
        self, broker: dramatiq.Broker, message: dramatiq.Message, delay: int | None
    ) -> None:
        # Retries sends a failed message again with a backoff delay; a delayed message
        # moving to its work queue when due is enqueued again without one.
        if delay and message.options.get("retries"):
            ACTOR_RETRIES.labels(*_actor_labels(message)).inc()

    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        ACTOR_DEAD.labels(*_actor_labels(message)).inc()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        mark_process_dead()


# --- scenario runs ---------------------------------------------------------------------------

RUNS_IN_FLIGHT = Gauge(
    "spar_runs_in_flight",
    "Scenario runs being played now.",
    multiprocess_mode="livesum",
)
RUNS_FINISHED = Counter(
    "spar_runs_finished_total",
    "Scenario runs that reached a terminal status (passed, failed, error).",
    ["status"],
)


def run_finished(status: str) -> None:
    RUNS_FINISHED.labels(status).inc()


def in_flight(gauge: Gauge) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Count calls of an async function in progress in ``gauge``."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def tracked(*args: P.args, **kwargs: P.kwargs) -> R:
            gauge.inc()
            try:
                return await fn(*args, **kwargs)
            finally:
                gauge.dec()

        return tracked

    return decorate


# --- knowledge documents -------------------------------------------------------------------

DOCUMENTS_PROCESSED = Counter(
    "spar_documents_processed_total",
    "Knowledge documents whose processing ended: ready, failed (with a reason on the "
    "document), or abandoned (deleted while processing).",
    ["status"],
)


# --- the scheduler ---------------------------------------------------------------------------

SCHEDULER_LEADING = Gauge(
    "spar_scheduler_leading",
    "1 while this scheduler holds the lock and runs the trigger jobs and the sweeper.",
    multiprocess_mode="livemax",
)
TRIGGER_SLOTS = Counter(
    "spar_trigger_slots_total",
    "Scheduled trigger slots recorded by the scheduler: queued (fired), or missed (older "
    "than SPAR_TRIGGER_GRACE_S when recorded).",
    ["outcome"],
)
SWEEPER_RESENT = Counter(
    "spar_sweeper_resent_total",
    "Work the sweeper sent again or handed out: stalled runs, batch runs dispatched, "
    "trigger executions, knowledge documents, calibrations.",
    ["kind"],
)
WORK_GIVEN_UP = Counter(
    "spar_work_given_up_total",
    "Units of work ended in error because their deliveries ran out (a unit that kept "
    "failing, or kept killing its worker): run, trigger_execution, document, calibration.",
    ["kind"],
)


# --- agent and judge calls -------------------------------------------------------------------

OUTBOUND_DURATION = Histogram(
    "spar_outbound_call_duration_seconds",
    "Agent and judge calls, retries included, by target (agent, judge), kind (http, llm) "
    "and provider or protocol.",
    ["target", "kind", "provider"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
)
OUTBOUND_ERRORS = Counter(
    "spar_outbound_call_errors_total",
    "Agent and judge calls that failed, by target, kind, provider and error type.",
    ["target", "kind", "provider", "error"],
)


def agent_labels(_egress: Any, agent: Any, *_: Any, **__: Any) -> tuple[str, str]:
    """(kind, provider) of a ``call_agent(egress, agent, ...)``: ``http`` and its protocol,
    or ``llm`` and its provider type."""
    if agent.kind == "llm":
        return "llm", agent.provider.provider if agent.provider is not None else "none"
    return "http", agent.protocol or "spar"


def judge_labels(_egress: Any, provider: Any, *_: Any, **__: Any) -> tuple[str, str]:
    """(kind, provider) of a ``judge(egress, provider, ...)``."""
    return "llm", provider.provider


def observed_call(
    target: str, labels: Callable[..., tuple[str, str]]
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Time an async outbound call and count its failures by exception type (a bounded
    set: the code's own exception classes).  ``labels`` maps the call's arguments to
    (kind, provider)."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def observed(*args: P.args, **kwargs: P.kwargs) -> R:
            kind, provider = labels(*args, **kwargs)
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                OUTBOUND_ERRORS.labels(target, kind, provider, type(exc).__name__).inc()
                raise
            finally:
                OUTBOUND_DURATION.labels(target, kind, provider).observe(
                    time.perf_counter() - started
                )

        return observed

    return decorate


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


# --- exposition ------------------------------------------------------------------------------


def multiprocess_mode() -> bool:
    return bool(os.environ.get(MULTIPROCESS_ENV))


def _process_registry() -> CollectorRegistry:
    if multiprocess_mode():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def exposition(broker: dramatiq.Broker | None) -> bytes:
    """The Prometheus text format of this process group's metrics, plus the queues of
    ``broker`` when given.  Blocking (files, Redis): call it from a thread."""
    body = generate_latest(_process_registry())
    if broker is not None:
        queues = CollectorRegistry()
        queues.register(QueueCollector(broker))  # type: ignore[arg-type]
        body += generate_latest(queues)
    return body


def mark_process_dead() -> None:
    """Drop this process's live gauges (messages and runs in progress) from the shared
    directory as it exits."""
    if multiprocess_mode():
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


def serve_process_metrics(port: int) -> None:
    """Serve this process's metrics on ``port`` at ``/metrics`` from a daemon thread
    (``spar scheduler --metrics-port``)."""
    start_http_server(port, addr="0.0.0.0", registry=_process_registry())  # noqa: S104


def serve_worker_metrics() -> None:
    """``spar worker --metrics-port``: a Dramatiq fork process serving the worker
    processes' metrics over HTTP (``GET /metrics``), until the worker stops."""
    from shared.settings import get_settings

    port = get_settings().worker_metrics_port
    if port is None:
        return
    _, thread = start_http_server(port, addr="0.0.0.0", registry=_process_registry())  # noqa: S104
    thread.join()
