"""The server side of ``spar``: the processes of a deployment, and ``spar dev``.

* ``spar dev``: the API, the workers and the scheduler in one process, on an embedded
  PostgreSQL (from a pip wheel, data in ``.spar-dev/``) and an in-memory broker;
* ``spar migrate``: apply the database migrations (``SPAR_DATABASE_URL``);
* ``spar serve``: the HTTP API (stateless; run as many as needed);
* ``spar worker``: Dramatiq workers taking runs, batches and the rest from Redis;
* ``spar scheduler``: cron triggers and the stuck-work sweeper (one replica active).

Configuration comes from ``SPAR_*`` environment variables.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

import click

from shared.logs import configure_logging, uvicorn_log_config
from shared.metrics_dir import ENV as METRICS_DIR_ENV
from shared.metrics_dir import prepare_multiprocess_dir
from shared.queue import QUEUES
from shared.settings import SettingsError, get_settings

POSITIVE = click.IntRange(min=1)


def _migrate() -> None:
    from shared.db.migrate import upgrade

    upgrade(get_settings().require_database_url())


def _serve(host: str, port: int, workers: int) -> None:
    import uvicorn

    settings = get_settings()
    # The workers write their metrics to one directory; any of them answers /metrics.
    ours = not os.environ.get(METRICS_DIR_ENV)
    metrics_dir = prepare_multiprocess_dir("api")
    try:
        uvicorn.run(
            "api.app:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            proxy_headers=True,
            log_level=settings.log_level.lower(),
            log_config=uvicorn_log_config(settings.log_level, settings.log_format),
            access_log=False,  # the API logs each request itself, with its request id
        )
    finally:
        if ours:
            shutil.rmtree(metrics_dir, ignore_errors=True)


DEV_DATA_DIR = Path(".spar-dev")
DEV_SECRET = "secret"  # noqa: S105 - the file that holds it, in the data directory


def _dev_secret_key(data_dir: Path) -> str:
    """A local secret for ``spar dev``, made once and kept beside the database's data."""
    path = data_dir / DEV_SECRET
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(key)
    return key


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # SIGTERM's default ends the process without unwinding: the embedded server would be
    # left running.  As an exception it unwinds through cmd_dev's ``finally`` instead.
    raise SystemExit(128 + signum)


@click.command(
    "dev",
    short_help="Run the API, workers and scheduler in one process on an embedded PostgreSQL.",
)
@click.option(
    "--data-dir",
    default=str(DEV_DATA_DIR),
    show_default=True,
    help="Where the embedded database and the dev secret live.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
def dev(data_dir: str, host: str, port: int) -> None:
    """Start an embedded PostgreSQL in --data-dir (unless SPAR_DATABASE_URL is set), migrate
    it and serve it with the workers and the scheduler in the same process on an in-memory
    broker; the server stops on exit.  Outbound calls may reach private addresses, and a
    secret key is kept in <data-dir>/secret unless SPAR_SECRET_KEY is set."""
    run_dev(Path(data_dir), host, port)


def run_dev(data_dir: Path, host: str, port: int) -> None:
    for variable, default in (
        ("SPAR_EGRESS_ALLOW_PRIVATE", "true"),
        ("SPAR_LOG_FORMAT", "text"),
    ):
        if not os.environ.get(variable):
            os.environ[variable] = default
    if not os.environ.get("SPAR_SECRET_KEY"):
        os.environ["SPAR_SECRET_KEY"] = _dev_secret_key(data_dir)
    get_settings.cache_clear()
    configure_logging(get_settings().log_level, get_settings().log_format)
    # uvicorn restores this handler after its own and re-raises the SIGTERM it caught.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with ExitStack() as stack:
        if not os.environ.get("SPAR_DATABASE_URL"):
            from shared.db.embedded import embedded_postgres

            os.environ["SPAR_DATABASE_URL"] = stack.enter_context(embedded_postgres(data_dir))
            embedded = f"embedded PostgreSQL in {data_dir}"
        else:
            embedded = "SPAR_DATABASE_URL"
        get_settings.cache_clear()
        settings = get_settings()
        logging.getLogger("spar").info("spar dev: database %s", embedded)
        _migrate()
        import uvicorn

        uvicorn.run(
            "api.app:create_dev_app",
            factory=True,
            host=host,
            port=port,
            log_level=settings.log_level.lower(),
            log_config=uvicorn_log_config(settings.log_level, settings.log_format),
            access_log=False,
        )


@click.command("migrate", short_help="Apply the database migrations (alembic upgrade head).")
def migrate() -> None:
    """Upgrade the database at SPAR_DATABASE_URL to the latest schema."""
    _migrate()


@click.command("worker", short_help="Run Dramatiq workers for the work queues (needs Redis).")
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
    "--metrics-port",
    type=POSITIVE,
    default=None,
    help="Serve the workers' Prometheus metrics on this port at /metrics "
    "(default: SPAR_WORKER_METRICS_PORT, else none).",
)
def worker(
    queues: str, processes: int, threads: int, prefetch: int | None, metrics_port: int | None
) -> None:
    """Dramatiq worker processes taking messages from Redis (SPAR_REDIS_URL);
    SPAR_SECRET_KEY must be set to decrypt credentials."""
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
    if metrics_port:
        env["SPAR_WORKER_METRICS_PORT"] = str(metrics_port)
    if metrics_port or settings.worker_metrics_port:
        argv += ["--fork-function", "shared.metrics:serve_worker_metrics"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # noqa: S606 - our own interpreter, fixed arguments


@click.command(
    "scheduler", short_help="Run the cron triggers and the sweeper (one replica active)."
)
@click.option(
    "--metrics-port",
    type=POSITIVE,
    default=None,
    help="Serve the scheduler's Prometheus metrics on this port at /metrics (default: none).",
)
def scheduler(metrics_port: int | None) -> None:
    """Fire scheduled triggers at their cron times, exactly once per slot, and re-enqueue
    work stuck past its deadline.  Run several for availability: a PostgreSQL advisory
    lock keeps one active, and a standby takes over within SPAR_LEADER_RETRY_S.  Needs
    SPAR_REDIS_URL."""
    from scheduler.main import main as scheduler_main

    settings = get_settings()
    settings.require_database_url()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: the scheduler sends work to Redis")
    scheduler_main(metrics_port)


@click.command("serve", short_help="Run the HTTP API (needs SPAR_SECRET_KEY).")
@click.option(
    "--host",
    default="0.0.0.0",  # noqa: S104 - a server listens
    show_default=True,
    help="Address to listen on.",
)
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--workers", type=POSITIVE, default=1, show_default=True, help="Uvicorn worker processes."
)
def serve(host: str, port: int, workers: int) -> None:
    """Serve the HTTP API with uvicorn; it is stateless, run as many as needed."""
    settings = get_settings()
    settings.require_database_url()
    if not settings.secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it encrypts secrets at rest)")
    _serve(host, port, workers)


COMMANDS = [dev, migrate, serve, worker, scheduler]
