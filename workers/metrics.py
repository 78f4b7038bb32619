"""What only workers export (``spar worker --metrics-port``): per actor, the messages
processed by outcome, retries, dead letters, durations and messages in progress, recorded
by :class:`workers.observability.MessageObservability`; and the run engine's families
(:data:`shared.metrics.RUN_ENGINE`), which only workers record.

A counter an alert watches must exist before its first increment, or Prometheus never
sees that increment as an ``increase``: a worker starts every counter at 0 for the label
values it knows as it boots (:func:`count_from_zero`)."""

from __future__ import annotations

from collections.abc import Collection

import dramatiq
from prometheus_client import Counter, Gauge, Histogram

from shared import work
from shared.metrics import (
    DOCUMENT_STATUSES,
    DOCUMENTS_PROCESSED,
    LIMIT_KINDS,
    OUTBOUND_LIMIT,
    OUTBOUND_RATE_LIMITED,
    OUTBOUND_WAITING,
    RUN_ENGINE,
    RUN_STATUSES,
    RUNS_FINISHED,
    WORK_GIVEN_UP,
    serve_process_metrics,
)
from shared.settings import get_settings

OUTCOMES = ("succeeded", "failed", "skipped")

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


RUNS_IN_FLIGHT = Gauge(
    "spar_worker_runs_in_flight",
    "Scenario runs the worker processes are playing now (each at most its --runs-in-flight).",
    multiprocess_mode="livesum",
)

FAMILIES = (
    ACTOR_MESSAGES,
    ACTOR_RETRIES,
    ACTOR_DEAD,
    ACTOR_DURATION,
    ACTOR_IN_PROGRESS,
    RUNS_IN_FLIGHT,
    *RUN_ENGINE,
)


def count_from_zero(broker: dramatiq.Broker, queues: Collection[str] | None) -> None:
    """Every counter at 0 for the label values known before any message: each actor of
    the queues this worker takes (all when ``queues`` is None), the units of work those
    queues play, the statuses a run or a document ends in, and each destination kind of
    the outbound limits."""

    def taken(queue: str) -> bool:
        return queues is None or queue in queues

    for actor in broker.actors.values():
        if taken(actor.queue_name):
            labels = (actor.queue_name, actor.actor_name)
            for outcome in OUTCOMES:
                ACTOR_MESSAGES.labels(*labels, outcome)
            ACTOR_RETRIES.labels(*labels)
            ACTOR_DEAD.labels(*labels)
    for unit in work.KINDS:
        if taken(unit.message[0]):
            WORK_GIVEN_UP.labels(unit.kind)
    if taken(work.RUNS.message[0]):
        for status in RUN_STATUSES:
            RUNS_FINISHED.labels(status)
    if taken(work.DOCUMENTS.message[0]):
        for status in DOCUMENT_STATUSES:
            DOCUMENTS_PROCESSED.labels(status)
    if any(taken(unit.message[0]) for unit in work.KINDS if unit is not work.DOCUMENTS):
        for kind in LIMIT_KINDS:  # the outbound limits (0: no destination seen yet)
            OUTBOUND_LIMIT.labels(kind)
            OUTBOUND_WAITING.labels(kind)
            OUTBOUND_RATE_LIMITED.labels(kind)


def serve_worker_metrics() -> None:
    """``spar worker --metrics-port``: a Dramatiq fork process (its entry point, so it reads
    the settings) serving the worker processes' metrics over HTTP (``GET /metrics``),
    until the worker stops."""
    port = get_settings().worker_metrics_port
    if port is not None:
        serve_process_metrics(port, FAMILIES).join()
