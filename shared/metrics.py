"""Prometheus metrics every Spar process shares: the registry a process exposes, and the
metrics that shared code records wherever it runs (docs/operations.md lists them all).

Each process defines what only it exports beside its code: the API's requests and the
queues read at scrape time in :mod:`api.metrics`, the workers' messages in
:mod:`workers.metrics`, the scheduler's leadership, slots and sweeps in
:mod:`scheduler.metrics`.  Here:

* scenario runs in flight and finished, by status (the run engine);
* knowledge documents processed, by outcome;
* units of work given up (:mod:`shared.work`);
* agent, judge and simulator calls: latency and errors by kind and provider
  (:func:`observed_call`);
* outbound limits (:mod:`shared.outbound.limits`): each destination kind's current limit,
  the calls waiting for their destination, and the rate-limit refusals;
* what a process exposes (:func:`exposition`), and its live gauges dropped as it exits.

Labels never hold organization ids, raw paths, secrets or any other unbounded value.

Every family is defined once, at import, wherever its module is imported; a process
exports only the families its role records (each process module's ``FAMILIES``, these
under :data:`RUN_ENGINE` for the workers), whatever else it happened to import: the API
never shows a scheduler's or a worker's families, and ``spar dev`` shows all three.

Under ``spar serve --workers N`` and ``spar worker --processes N`` the processes share a
``PROMETHEUS_MULTIPROC_DIR`` (:mod:`shared.metrics_dir`) and a scrape reads all of them;
elsewhere (``spar dev``, tests) the process's own registry is read.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from shared.metrics_dir import ENV as MULTIPROCESS_ENV

CONTENT_TYPE = CONTENT_TYPE_LATEST
P = ParamSpec("P")
R = TypeVar("R")


# --- scenario runs ---------------------------------------------------------------------------

RUNS_IN_FLIGHT = Gauge(
    "spar_runs_in_flight",
    "Scenario runs being played now.",
    multiprocess_mode="livesum",
)
RUN_STATUSES = ("passed", "failed", "error")
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


# --- knowledge documents and units of work ------------------------------------------------

DOCUMENT_STATUSES = ("ready", "failed", "abandoned")
DOCUMENTS_PROCESSED = Counter(
    "spar_documents_processed_total",
    "Knowledge documents whose processing ended: ready, failed (with a reason on the "
    "document), or abandoned (deleted while processing).",
    ["status"],
)
WORK_GIVEN_UP = Counter(
    "spar_work_given_up_total",
    "Units of work ended in error because their deliveries ran out (a unit that kept "
    "failing, or kept killing its worker): run, trigger_execution, document, calibration, "
    "notification_event, webhook_delivery.",
    ["kind"],
)


# --- agent and judge calls -------------------------------------------------------------------

OUTBOUND_DURATION = Histogram(
    "spar_outbound_call_duration_seconds",
    "Agent, judge and simulator calls, retries included, by target (agent, judge, simulator), "
    "kind (http, llm) "
    "and provider or protocol.",
    ["target", "kind", "provider"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
)
OUTBOUND_ERRORS = Counter(
    "spar_outbound_call_errors_total",
    "Agent, judge and simulator calls that failed, by target, kind, provider and error type.",
    ["target", "kind", "provider", "error"],
)


def agent_labels(_egress: Any, agent: Any, *_: Any, **__: Any) -> tuple[str, str]:
    """(kind, provider) of a ``call_agent(egress, agent, ...)``: ``http`` and its protocol,
    or ``llm`` and its provider type."""
    if agent.kind == "llm":
        return "llm", agent.provider.provider if agent.provider is not None else "none"
    return "http", agent.protocol or "spar"


def judge_labels(_egress: Any, provider: Any, *_: Any, **__: Any) -> tuple[str, str]:
    """(kind, provider) of a ``judge(egress, provider, ...)`` (or of the simulator's call)."""
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


# --- outbound limits (shared.outbound.limits) ----------------------------------------------

LIMIT_KINDS = ("agent", "judge", "simulator")
OUTBOUND_LIMIT = Gauge(
    "spar_outbound_limit",
    "The concurrency limit last seen for a destination of this kind (agent, judge, "
    "simulator): SPAR_OUTBOUND_MAX_CONCURRENCY until a rate limit halves it.",
    ["kind"],
    multiprocess_mode="mostrecent",
)
OUTBOUND_WAITING = Gauge(
    "spar_outbound_calls_waiting",
    "Calls waiting for their destination (a full limit or a Retry-After hold), by kind.",
    ["kind"],
    multiprocess_mode="livesum",
)
OUTBOUND_RATE_LIMITED = Counter(
    "spar_outbound_rate_limited_total",
    "Answers 429, 503 or 529 that halved or held a destination's limit, by kind.",
    ["kind"],
)


# What the run engine records wherever it runs: the workers (and ``spar dev``) export them.
RUN_ENGINE: tuple[MetricWrapperBase, ...] = (
    RUNS_IN_FLIGHT,
    RUNS_FINISHED,
    DOCUMENTS_PROCESSED,
    WORK_GIVEN_UP,
    OUTBOUND_DURATION,
    OUTBOUND_ERRORS,
    OUTBOUND_LIMIT,
    OUTBOUND_WAITING,
    OUTBOUND_RATE_LIMITED,
)


# --- exposition ------------------------------------------------------------------------------


def multiprocess_mode() -> bool:
    return bool(os.environ.get(MULTIPROCESS_ENV))


class _Owned:
    """The families of ``source`` named among ``names``: what this process records, out of
    everything defined in it (the default registry) or written by its process group (the
    multiprocess directory)."""

    def __init__(self, source: Collector, names: frozenset[str]) -> None:
        self.source, self.names = source, names

    def collect(self) -> Iterator[Metric]:
        return (family for family in self.source.collect() if family.name in self.names)


def process_registry(
    families: Iterable[MetricWrapperBase], *collectors: Collector
) -> CollectorRegistry:
    """What a process exposes: of Spar's metrics, ``families`` only (this process group's,
    under ``spar serve --workers N`` and ``spar worker --processes N``), and the
    interpreter's own process metrics where there is one process; plus ``collectors``,
    read at scrape time."""
    names = frozenset(family.name for metric in families for family in metric.describe())
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_mode():
        source: Collector = multiprocess.MultiProcessCollector(None)  # type: ignore[no-untyped-call]
    else:
        source = REGISTRY
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(standard)
    registry.register(_Owned(source, names))
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition(families: Iterable[MetricWrapperBase], *collectors: Collector) -> bytes:
    """The Prometheus text format of :func:`process_registry`.  Blocking (files, sockets):
    call it from a thread."""
    return generate_latest(process_registry(families, *collectors))


def mark_process_dead() -> None:
    """Drop this process's live gauges (messages and runs in progress) from the shared
    directory as it exits."""
    if multiprocess_mode():
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


def serve_process_metrics(port: int, families: Iterable[MetricWrapperBase]) -> threading.Thread:
    """Serve ``families`` of this process group on ``port`` at ``/metrics`` from a daemon
    thread (``spar scheduler --metrics-port``, ``spar worker --metrics-port``)."""
    registry = process_registry(families)
    _, thread = start_http_server(port, addr="0.0.0.0", registry=registry)  # noqa: S104
    return thread
