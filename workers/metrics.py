"""What only workers export (``spar worker --metrics-port``): per actor, the messages
processed by outcome, retries, dead letters, durations and messages in progress, recorded
by :class:`workers.observability.MessageObservability`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import serve_process_metrics
from shared.settings import get_settings

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


def serve_worker_metrics() -> None:
    """``spar worker --metrics-port``: a Dramatiq fork process (its entry point, so it reads
    the settings) serving the worker processes' metrics over HTTP (``GET /metrics``),
    until the worker stops."""
    port = get_settings().worker_metrics_port
    if port is not None:
        serve_process_metrics(port).join()
