"""The ``spar`` command: one entry point for every Spar process.

* ``spar dev``: the API, the workers and the scheduler in one process, on an embedded
  PostgreSQL (from a pip wheel, data in ``.spar-dev/``) and an in-memory broker (nothing
  else to install);
* ``spar migrate``: apply the database migrations (``SPAR_DATABASE_URL``);
* ``spar serve``: the HTTP API (stateless; run as many as needed);
* ``spar worker``: Dramatiq workers taking runs, batches and the rest from Redis;
* ``spar scheduler``: cron triggers and the stuck-work sweeper (run several; one is
  active at a time).

Configuration comes from ``SPAR_*`` environment variables.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import sys
from contextlib import ExitStack
from pathlib import Path

from shared.logs import configure_logging, uvicorn_log_config
from shared.metrics_dir import ENV as METRICS_DIR_ENV
from shared.metrics_dir import prepare_multiprocess_dir
from shared.queue import QUEUES
from shared.settings import SettingsError, get_settings


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


def cmd_dev(args: argparse.Namespace) -> None:
    """Everything in one process on the embedded default: embedded PostgreSQL (unless
    SPAR_DATABASE_URL points elsewhere), in-memory broker."""
    data_dir = Path(args.data_dir)
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
            host=args.host,
            port=args.port,
            log_level=settings.log_level.lower(),
            log_config=uvicorn_log_config(settings.log_level, settings.log_format),
            access_log=False,
        )


def cmd_migrate(_: argparse.Namespace) -> None:
    """Apply the database migrations up to the latest (``alembic upgrade head``)."""
    _migrate()


def cmd_worker(args: argparse.Namespace) -> None:
    """Dramatiq worker processes for the given queues (all of them by default)."""
    settings = get_settings()
    settings.require_database_url()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: workers take their work from Redis")
    if not settings.secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it decrypts credentials)")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    prepare_multiprocess_dir("worker")  # shared by the worker processes and --metrics-port
    env = dict(os.environ)
    # Dramatiq reads both once, when it is imported, so they go to a fresh interpreter.
    # A process holds no more messages than it has threads: a run waiting behind busy
    # threads in one process while another process idles would stretch the whole batch.
    if args.prefetch:
        env["dramatiq_queue_prefetch"] = str(args.prefetch)
    env.setdefault("dramatiq_queue_prefetch", str(args.threads))
    argv = [sys.executable, "-m", "dramatiq", "workers.actors", "--skip-logging"]
    argv += ["--processes", str(args.processes), "--threads", str(args.threads)]
    argv += ["--queues", *queues]
    if args.metrics_port:
        env["SPAR_WORKER_METRICS_PORT"] = str(args.metrics_port)
    if args.metrics_port or settings.worker_metrics_port:
        argv += ["--fork-function", "shared.metrics:serve_worker_metrics"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # noqa: S606 - our own interpreter, fixed arguments


def cmd_scheduler(_: argparse.Namespace) -> None:
    """Cron triggers and the sweeper; run several, one is active (leader election)."""
    from scheduler.main import main as scheduler_main

    settings = get_settings()
    settings.require_database_url()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: the scheduler sends work to Redis")
    scheduler_main()


def cmd_serve(args: argparse.Namespace) -> None:
    """The HTTP API under uvicorn."""
    settings = get_settings()
    settings.require_database_url()
    if not settings.secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it encrypts secrets at rest)")
    _serve(args.host, args.port, args.workers)


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {raw!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dev = commands.add_parser(
        "dev",
        help="run the API, workers and scheduler in one process on an embedded PostgreSQL",
        description=(
            "Start an embedded PostgreSQL in --data-dir (unless SPAR_DATABASE_URL is set), "
            "migrate it and serve it with the workers and the scheduler in the same process "
            "on an in-memory broker; the server stops on exit.  Outbound calls may reach "
            "private addresses, and a secret key is kept in <data-dir>/secret unless "
            "SPAR_SECRET_KEY is set."
        ),
    )
    dev.add_argument(
        "--data-dir",
        default=str(DEV_DATA_DIR),
        help="where the embedded database and the dev secret live (default: %(default)s)",
    )
    dev.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    dev.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    dev.set_defaults(func=cmd_dev)

    migrate = commands.add_parser(
        "migrate",
        help="apply the database migrations (alembic upgrade head)",
        description="Upgrade the database at SPAR_DATABASE_URL to the latest schema.",
    )
    migrate.set_defaults(func=cmd_migrate)

    worker = commands.add_parser(
        "worker",
        help="run Dramatiq worker processes for the work queues (needs SPAR_REDIS_URL)",
        description=(
            "Dramatiq worker processes taking messages from Redis (SPAR_REDIS_URL); "
            "SPAR_SECRET_KEY must be set to decrypt credentials."
        ),
    )
    worker.add_argument(
        "--queues",
        default=",".join(QUEUES),
        help="comma-separated queues to take messages from (default: %(default)s)",
    )
    worker.add_argument(
        "--processes",
        type=_positive,
        default=2,
        help="worker processes to start (default: %(default)s)",
    )
    worker.add_argument(
        "--threads",
        type=_positive,
        default=16,
        help="concurrent messages per process (default: %(default)s)",
    )
    worker.add_argument(
        "--prefetch",
        type=_positive,
        default=None,
        help="messages a process may hold (default: --threads; env dramatiq_queue_prefetch)",
    )
    worker.add_argument(
        "--metrics-port",
        type=_positive,
        default=None,
        help="serve the workers' Prometheus metrics on this port at /metrics "
        "(default: SPAR_WORKER_METRICS_PORT, else none)",
    )
    worker.set_defaults(func=cmd_worker)

    scheduler = commands.add_parser(
        "scheduler",
        help="run the cron triggers and the sweeper (one replica active at a time)",
        description=(
            "Fire scheduled triggers at their cron times, exactly once per slot, and "
            "re-enqueue work stuck past its deadline.  Run several for availability: a "
            "PostgreSQL advisory lock keeps one active, and a standby takes over within "
            "SPAR_LEADER_RETRY_S.  Needs SPAR_REDIS_URL."
        ),
    )
    scheduler.set_defaults(func=cmd_scheduler)

    serve = commands.add_parser(
        "serve",
        help="run the HTTP API (needs SPAR_SECRET_KEY)",
        description="Serve the HTTP API with uvicorn; it is stateless, run as many as needed.",
    )
    serve.add_argument(
        "--host",
        default="0.0.0.0",  # noqa: S104 - a server listens
        help="address to listen on (default: %(default)s)",
    )
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="uvicorn worker processes (default: %(default)s)",
    )
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        configure_logging(get_settings().log_level, get_settings().log_format)
        args.func(args)
    except SettingsError as exc:
        sys.exit(f"spar: configuration error: {exc}")
