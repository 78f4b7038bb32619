"""``spar dev``: the API, the workers and the scheduler in one process, on an embedded
PostgreSQL (from a pip wheel, data in ``.spar-dev/``; ``spar[dev]``) and an in-memory
broker.  :func:`create_dev_app` is the API app with the workers and the scheduler started
on it: it lives here, with the workers, so that ``api/`` imports neither ``workers/`` nor
``scheduler/``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
from contextlib import ExitStack
from pathlib import Path

import click
import dramatiq
from litestar import Litestar

from api.app import create_app
from api.cli import run_migrations, run_uvicorn
from scheduler import metrics as scheduler_metrics
from scheduler.leader import Leadership
from scheduler.main import lead_forever
from shared import traces
from shared.db.embedded import DEFAULT_DATA_DIR, embedded_postgres
from shared.logs import configure_logging
from shared.settings import get_settings
from workers import metrics as worker_metrics

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
    # left running.  As an exception it unwinds through run_dev's ``finally`` instead.
    raise SystemExit(128 + signum)


@click.command("dev")
@click.option(
    "--data-dir",
    default=str(DEFAULT_DATA_DIR),
    show_default=True,
    help="Where the embedded database and the dev secret live.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
def dev(data_dir: str, host: str, port: int) -> None:
    """Start an embedded PostgreSQL in --data-dir (unless SPAR_DATABASE_URL is set), migrate
    it and serve it with the workers and the scheduler in the same process, on an in-memory
    broker: no Redis needed (Redis at SPAR_REDIS_URL when set).  The server stops on exit.
    Outbound calls may reach private addresses, a secret key is kept in <data-dir>/secret
    unless SPAR_SECRET_KEY is set, and webhook URLs are on --host and --port unless
    SPAR_PUBLIC_BASE_URL is set."""
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
            os.environ["SPAR_DATABASE_URL"] = stack.enter_context(embedded_postgres(data_dir))
            embedded = f"embedded PostgreSQL in {data_dir}"
        else:
            embedded = "SPAR_DATABASE_URL"
        get_settings.cache_clear()
        logging.getLogger("spar").info("spar dev: database %s", embedded)
        run_migrations()
        run_uvicorn("workers.dev:create_dev_app", host, port)


def create_dev_app() -> Litestar:
    """``spar dev``: the API plus the workers in-process, on the in-memory broker; its
    ``/metrics`` shows what production's API, workers and scheduler show between them."""
    app = create_app()
    app.state.metric_families = (
        *app.state.metric_families,
        *worker_metrics.FAMILIES,
        *scheduler_metrics.FAMILIES,
    )

    async def start_worker(app: Litestar) -> None:
        import workers.actors  # noqa: F401 - declares the actors on the in-memory broker

        # Its runs play in this process: traced as the API's (the worker flushes on stop).
        traces.configure("spar-api")
        app.state.worker = dramatiq.Worker(app.state.broker, worker_threads=8)
        app.state.worker.start()
        # The scheduler (trigger cron and sweeper) in the API's loop; it still takes the
        # lock, so a second spar dev on the same database stands by.
        app.state.scheduler_stop = asyncio.Event()
        app.state.leadership = Leadership(app.state.database.engine)
        app.state.scheduler = asyncio.create_task(
            lead_forever(
                app.state.database,
                app.state.broker,
                app.state.settings,
                app.state.scheduler_stop,
                app.state.leadership,
            )
        )

    async def stop_worker(app: Litestar) -> None:
        app.state.scheduler_stop.set()
        await app.state.scheduler
        await app.state.leadership.release()
        app.state.worker.stop()

    app.on_startup.append(start_worker)
    app.on_shutdown.insert(0, stop_worker)
    return app
