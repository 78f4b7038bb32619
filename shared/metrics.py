"""Prometheus metrics every Spar process shares: the registry a process exposes, and the
metrics that shared code records wherever it runs (docs/operations.md lists them all).

Each process defines what only it exports beside its code: the API's requests and the
queues read at scrape time in :mod:`api.metrics`, the workers' messages in
:mod:`workers.metrics`, the scheduler's leadership, slots and sweeps in
:mod:`scheduler.metrics`.  Here:

* scenario runs in flight and finished, by status (the run engine);
* knowledge documents processed, by outcome;
* units of work given up (:mod:`shared.work`);
* agent and judge calls: latency and errors by kind and provider (:func:`observed_call`);
* the registry to expose, and a process's live gauges dropped as it exits.

Labels never hold organization ids, raw paths, secrets or any other unbounded value.

Under ``spar serve --workers N`` and ``spar worker --processes N`` the processes share a
``PROMETHEUS_MULTIPROC_DIR`` (:mod:`shared.metrics_dir`) and a scrape reads all of them;
elsewhere (``spar dev``, tests) the process's own registry is read.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

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

DOCUMENTS_PROCESSED = Counter(
    "spar_documents_processed_total",
    "Knowledge documents whose processing ended: ready, failed (with a reason on the "
    "document), or abandoned (deleted while processing).",
    ["status"],
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


# --- exposition ------------------------------------------------------------------------------


def multiprocess_mode() -> bool:
    return bool(os.environ.get(MULTIPROCESS_ENV))


def _process_registry() -> CollectorRegistry:
    if multiprocess_mode():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def exposition(*collectors: Collector) -> bytes:
    """The Prometheus text format of this process group's metrics, plus what
    ``collectors`` read at scrape time.  Blocking (files, sockets): call it from a
    thread."""
    body = generate_latest(_process_registry())
    if collectors:
        scraped = CollectorRegistry()
        for collector in collectors:
            scraped.register(collector)
        body += generate_latest(scraped)
    return body


def mark_process_dead() -> None:
    """Drop this process's live gauges (messages and runs in progress) from the shared
    directory as it exits."""
    if multiprocess_mode():
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


def serve_process_metrics(port: int) -> threading.Thread:
    """Serve this process group's metrics on ``port`` at ``/metrics`` from a daemon thread
    (``spar scheduler --metrics-port``, ``spar worker --metrics-port``)."""
    _, thread = start_http_server(port, addr="0.0.0.0", registry=_process_registry())  # noqa: S104
    return thread
