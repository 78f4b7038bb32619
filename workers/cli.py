"""``spar worker``: Dramatiq worker processes taking runs, batches and the rest from Redis.

``client.cli`` imports this module only when the command runs (its short help lives there).
"""

from __future__ import annotations

import os
import sys

import click

from shared.metrics_dir import prepare_multiprocess_dir
from shared.queue import QUEUES
from shared.settings import SettingsError, get_settings

POSITIVE = click.IntRange(min=1)


@click.command("worker")
@click.option(
    "--queues",
    default=",".join(QUEUES),
    show_default=True,
    help="Comma-separated queues to take messages from.",
)
@click.option(
    "--processes", type=POSITIVE, default=2, show_default=True, help="Worker processes to start."
)
@click.option(
    "--threads",
    type=POSITIVE,
    default=16,
    show_default=True,
    help="Concurrent messages per process.",
)
@click.option(
    "--prefetch",
    type=POSITIVE,
    default=None,
    help="Messages a process may hold (default: --threads; env dramatiq_queue_prefetch).",
)
@click.option(
    "--runs-in-flight",
    type=POSITIVE,
    default=None,
    help="Scenario runs a process plays at once on its event loop, whatever its threads "
    "(default: SPAR_RUNS_IN_FLIGHT, else 500).",
)
@click.option(
    "--metrics-port",
    type=POSITIVE,
    default=None,
    help="Serve the workers' Prometheus metrics on this port at /metrics "
    "(default: SPAR_WORKER_METRICS_PORT, else none).",
)
def worker(
    queues: str,
    processes: int,
    threads: int,
    prefetch: int | None,
    runs_in_flight: int | None,
    metrics_port: int | None,
) -> None:
    """Dramatiq worker processes taking their work from the queues in Redis: a worker
    started apart from the API needs SPAR_REDIS_URL (spar dev needs no Redis: it runs its
    workers in its own process, on an in-memory broker), SPAR_DATABASE_URL, and
    SPAR_SECRET_KEY to decrypt credentials."""
    settings = get_settings()
    settings.require_database_url()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: workers take their work from Redis")
    if not settings.secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it decrypts credentials)")
    names = [q.strip() for q in queues.split(",") if q.strip()]
    prepare_multiprocess_dir("worker")  # shared by the worker processes and --metrics-port
    env = dict(os.environ)
    # Dramatiq reads both once, when it is imported, so they go to a fresh interpreter.
    # A process holds no more messages than it has threads: a run waiting behind busy
    # threads in one process while another process idles would stretch the whole batch.
    if prefetch:
        env["dramatiq_queue_prefetch"] = str(prefetch)
    env.setdefault("dramatiq_queue_prefetch", str(threads))
    argv = [sys.executable, "-m", "dramatiq", "workers.actors", "--skip-logging"]
    argv += ["--processes", str(processes), "--threads", str(threads)]
    argv += ["--queues", *names]
    if runs_in_flight:
        env["SPAR_RUNS_IN_FLIGHT"] = str(runs_in_flight)
    if metrics_port:
        env["SPAR_WORKER_METRICS_PORT"] = str(metrics_port)
    if metrics_port or settings.worker_metrics_port:
        argv += ["--fork-function", "workers.metrics:serve_worker_metrics"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # noqa: S606 - our own interpreter, fixed arguments
