"""What a worker tells operators about each message, measured once by one middleware:
the request id its sender passed on (:mod:`shared.logs`), one log line, and the actor's
metrics (:mod:`workers.metrics`).  The API's counterpart for requests is
:mod:`api.observability`.  And the traces of the runs it plays, when the environment asks
for them (:class:`Tracing`, :mod:`shared.traces`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import dramatiq
from dramatiq.common import q_name

from shared import traces
from shared.logs import MESSAGE_OPTION, request_id
from shared.metrics import mark_process_dead
from workers.metrics import (
    ACTOR_DEAD,
    ACTOR_DURATION,
    ACTOR_IN_PROGRESS,
    ACTOR_MESSAGES,
    ACTOR_RETRIES,
    count_from_zero,
)

_message_log = logging.getLogger("spar.worker.messages")


def _labels(message: dramatiq.Message) -> tuple[str, str]:
    return q_name(message.queue_name), message.actor_name


class MessageObservability(dramatiq.Middleware):
    """Around each actor: restores the request id its message was sent with (or, for a
    message sent without one, its message id), so the worker's log lines carry it and the
    messages the actor sends pass it on; then times the message once, and from that one
    measure logs one line (actor, queue, outcome and duration, never its arguments) and
    records the actor's metrics.  Counts the retries and dead letters it produces too, and
    as the worker boots starts every counter at 0 for the actors it takes
    (:func:`workers.metrics.count_from_zero`).

    First on the broker (:func:`observe_messages`): Dramatiq runs ``after_*`` hooks in
    reverse order, so the id is still set while the other middleware (retries, time
    limits) log about the message.  Before and after hooks run on the same worker thread.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        count_from_zero(broker, worker.consumer_whitelist)

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        request_id.set(str(message.options.get(MESSAGE_OPTION) or message.message_id))
        self._local.started = time.perf_counter()
        ACTOR_IN_PROGRESS.labels(*_labels(message)).inc()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._done(message, "succeeded" if exception is None else "failed")

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        self._done(message, "skipped")

    def _done(self, message: dramatiq.Message, outcome: str) -> None:
        labels = _labels(message)
        started = getattr(self._local, "started", None)
        self._local.started = None
        seconds = None if started is None else time.perf_counter() - started
        if seconds is not None:  # a middleware before this one may have skipped it
            ACTOR_DURATION.labels(*labels).observe(seconds)
            ACTOR_IN_PROGRESS.labels(*labels).dec()
        ACTOR_MESSAGES.labels(*labels, outcome).inc()
        _message_log.info(
            "%s %s",
            message.actor_name,
            outcome,
            extra={
                "actor": message.actor_name,
                "queue": message.queue_name,
                "message_id": message.message_id,
                "outcome": outcome,
                "duration_ms": None if seconds is None else round(seconds * 1000, 1),
            },
        )
        # A worker thread serves one message after another in the same context.
        request_id.set(None)

    def after_enqueue(
        self, broker: dramatiq.Broker, message: dramatiq.Message, delay: int | None
    ) -> None:
        # Retries sends a failed message again with a backoff delay; a delayed message
        # moving to its work queue when due is enqueued again without one.
        if delay and message.options.get("retries"):
            ACTOR_RETRIES.labels(*_labels(message)).inc()

    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        ACTOR_DEAD.labels(*_labels(message)).inc()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        mark_process_dead()


class Tracing(dramatiq.Middleware):
    """Traces on in each worker process as it boots, when ``OTEL_EXPORTER_OTLP_ENDPOINT``
    asks for them (service ``spar-worker`` unless ``OTEL_SERVICE_NAME`` says otherwise), and
    what is still buffered exported as the worker stops (:mod:`shared.traces`)."""

    SERVICE = "spar-worker"

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        traces.configure(self.SERVICE)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        traces.shutdown()


def observe_messages(broker: dramatiq.Broker) -> dramatiq.Broker:
    """``broker`` with :class:`MessageObservability` first among its middleware (once)."""
    if not any(isinstance(m, MessageObservability) for m in broker.middleware):
        broker.add_middleware(MessageObservability(), before=type(broker.middleware[0]))
    return broker
