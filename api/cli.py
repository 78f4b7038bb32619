"""The ``spar`` command: dev, migrate, serve (worker and scheduler join as they get work)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from shared.settings import DEFAULT_DATABASE_URL, SettingsError, get_settings


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


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


def cmd_dev(args: argparse.Namespace) -> None:
    """Everything in one process on the embedded default: SQLite file, in-memory broker."""
    os.environ.setdefault("SPAR_DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ.setdefault("SPAR_EGRESS_ALLOW_PRIVATE", "true")
    get_settings.cache_clear()
    settings = get_settings()
    logging.getLogger("spar").info("spar dev: database %s", settings.database_url)
    _migrate()
    _serve(args.host, args.port, workers=1)


def cmd_migrate(_: argparse.Namespace) -> None:
    _migrate()


def cmd_serve(args: argparse.Namespace) -> None:
    _serve(args.host, args.port, args.workers)


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

    serve = commands.add_parser("serve", help="run the API")
    serve.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a server listens
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        _configure_logging(get_settings().log_level)
        args.func(args)
    except SettingsError as exc:
        sys.exit(f"spar: configuration error: {exc}")
