"""The API process's commands: ``spar migrate`` (apply the database migrations at
``SPAR_DATABASE_URL``) and ``spar serve`` (the HTTP API; stateless, run as many as
needed).  :func:`run_uvicorn` is how an app of this package is served, by ``spar serve``
and by ``spar dev`` (``workers/dev.py``); unless ``SPAR_PUBLIC_BASE_URL`` says otherwise,
the URLs Spar hands out (a trigger's ``webhook_url``) are on the address it serves.

Configuration comes from ``SPAR_*`` environment variables.  ``client.cli`` imports this
module only when one of its commands runs (their short help lives there).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
from typing import Any

import click

from shared.logs import uvicorn_log_config
from shared.metrics_dir import ENV as METRICS_DIR_ENV
from shared.metrics_dir import prepare_multiprocess_dir
from shared.settings import SettingsError, get_settings


def run_migrations() -> None:
    from shared.db.migrate import upgrade

    upgrade(get_settings().require_database_url())


# Addresses that listen on every interface: the URL to reach them is this machine's.
WILDCARD_HOSTS = ("", "0.0.0.0", "::")  # noqa: S104 - compared, not bound


def listening_url(host: str, port: int) -> str:
    """The URL of a server listening on ``host``:``port``: ``localhost`` for every
    interface, an IPv6 address in brackets."""
    if host in WILDCARD_HOSTS:
        host = "localhost"
    else:
        try:
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
        except ValueError:  # a name
            pass
    return f"http://{host}:{port}"


def run_uvicorn(factory: str, host: str, port: int, **options: Any) -> None:
    """Serve the app ``factory`` (``module:function``) with uvicorn, logging as every Spar
    process does.  ``SPAR_PUBLIC_BASE_URL``, when unset, becomes the address served (in
    the environment, so uvicorn's worker processes read it too)."""
    import uvicorn

    if not os.environ.get("SPAR_PUBLIC_BASE_URL"):
        os.environ["SPAR_PUBLIC_BASE_URL"] = listening_url(host, port)
        get_settings.cache_clear()
    settings = get_settings()
    uvicorn.run(
        factory,
        factory=True,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        log_config=uvicorn_log_config(settings.log_level, settings.log_format),
        access_log=False,  # the API logs each request itself, with its request id
        **options,
    )


def _serve(host: str, port: int, workers: int) -> None:
    # The workers write their metrics to one directory; any of them answers /metrics.
    ours = not os.environ.get(METRICS_DIR_ENV)
    metrics_dir = prepare_multiprocess_dir("api")
    try:
        run_uvicorn("api.app:create_app", host, port, workers=workers, proxy_headers=True)
    finally:
        if ours:
            shutil.rmtree(metrics_dir, ignore_errors=True)


@click.command("migrate")
def migrate() -> None:
    """Upgrade the database at SPAR_DATABASE_URL to the latest schema."""
    run_migrations()


@click.command("serve")
@click.option(
    "--host",
    default="0.0.0.0",  # noqa: S104 - a server listens
    show_default=True,
    help="Address to listen on.",
)
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Uvicorn worker processes.",
)
def serve(host: str, port: int, workers: int) -> None:
    """Serve the HTTP API with uvicorn; it is stateless, run as many as needed."""
    settings = get_settings()
    settings.require_database_url()
    if not settings.secret_key:
        raise SettingsError("SPAR_SECRET_KEY must be set (it encrypts secrets at rest)")
    _serve(host, port, workers)
