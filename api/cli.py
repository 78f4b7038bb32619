"""The ``spar`` command: dev, migrate, serve (worker and scheduler join as they get work)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from pathlib import Path

from shared.logs import configure_logging
from shared.queue import QUEUES
from shared.settings import DEFAULT_DATABASE_URL, SettingsError, get_settings


def _migrate() -> None:
    from shared.db.migrate import upgrade

    upgrade(get_settings().database_url)


def _serve(host: str, port: int, workers: int) -> None:
    import uvicorn

    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        proxy_headers=True,
        log_level=get_settings().log_level.lower(),
    )


DEV_SECRET_FILE = Path(".spar-dev-secret")


def _dev_secret_key() -> str:
    """A local secret for ``spar dev``, made once and kept beside the SQLite file."""
    if DEV_SECRET_FILE.exists():
        return DEV_SECRET_FILE.read_text().strip()
    key = secrets.token_urlsafe(32)
    DEV_SECRET_FILE.touch(mode=0o600)
    DEV_SECRET_FILE.write_text(key)
    return key


def cmd_dev(args: argparse.Namespace) -> None:
    """Everything in one process on the embedded default: SQLite file, in-memory broker."""
    for variable, default in (
        ("SPAR_DATABASE_URL", DEFAULT_DATABASE_URL),
        ("SPAR_EGRESS_ALLOW_PRIVATE", "true"),
    ):
        if not os.environ.get(variable):
            os.environ[variable] = default
    if not os.environ.get("SPAR_SECRET_KEY"):
        os.environ["SPAR_SECRET_KEY"] = _dev_secret_key()
    get_settings.cache_clear()
    settings = get_settings()
    logging.getLogger("spar").info("spar dev: database %s", settings.database_url)
    _migrate()
    import uvicorn

    uvicorn.run(
        "api.app:create_dev_app",
        factory=True,
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
    )


def cmd_migrate(_: argparse.Namespace) -> None:
    _migrate()


def cmd_worker(args: argparse.Namespace) -> None:
    """Dramatiq worker processes for the given queues (all of them by default)."""
    settings = get_settings()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: workers take their work from Redis")
    if not settings.secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it decrypts credentials)")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
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
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)  # noqa: S606 - our own interpreter, fixed arguments


def cmd_scheduler(_: argparse.Namespace) -> None:
    """The sweeper (and, later, cron triggers); run several, one is active."""
    from scheduler.main import main as scheduler_main

    settings = get_settings()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: the scheduler sends work to Redis")
    scheduler_main()


def cmd_serve(args: argparse.Namespace) -> None:
    if not get_settings().secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it encrypts secrets at rest)")
    _serve(args.host, args.port, args.workers)


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {raw!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spar", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    dev = commands.add_parser("dev", help="run everything in one process on SQLite")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.set_defaults(func=cmd_dev)

    migrate = commands.add_parser(
        "migrate", help="apply database migrations (alembic upgrade head)"
    )
    migrate.set_defaults(func=cmd_migrate)

    worker = commands.add_parser("worker", help="run Dramatiq workers")
    worker.add_argument("--queues", default=",".join(QUEUES), help="comma-separated queues")
    worker.add_argument("--processes", type=_positive, default=2)
    worker.add_argument(
        "--threads", type=_positive, default=16, help="concurrent messages per process"
    )
    worker.add_argument(
        "--prefetch",
        type=_positive,
        default=None,
        help="messages a process may hold (default: --threads; env dramatiq_queue_prefetch)",
    )
    worker.set_defaults(func=cmd_worker)

    scheduler = commands.add_parser("scheduler", help="run the scheduler (sweeper)")
    scheduler.set_defaults(func=cmd_scheduler)

    serve = commands.add_parser("serve", help="run the API")
    serve.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a server listens
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        configure_logging(get_settings().log_level)
        args.func(args)
    except SettingsError as exc:
        sys.exit(f"spar: configuration error: {exc}")
