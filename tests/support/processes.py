"""Real ``spar`` processes for end-to-end tests: start, wait until healthy, stop."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from sqlalchemy import make_url

from shared.db.migrate import upgrade


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def suite_env(database_url: str, settings: Any, **variables: str) -> dict[str, str]:
    """The environment of ``spar`` processes on the suite's database and (emptied first)
    Redis, with its secret key, allowed to call loopback fakes; ``variables`` add to it."""
    redis.Redis.from_url(settings.redis_url).flushdb()
    return {
        "SPAR_DATABASE_URL": database_url,
        "SPAR_REDIS_URL": settings.redis_url,
        "SPAR_SECRET_KEY": settings.secret_key,
        "SPAR_EGRESS_ALLOW_PRIVATE": "true",
        **variables,
    }


def owner_over_http(
    http: httpx.Client, email: str, password: str, org_name: str
) -> tuple[dict[str, str], dict[str, Any]]:
    """Register an account through a real API process and let it make an organization:
    the account's bearer headers and the organization."""
    registered = http.post(
        "/v1/auth/register",
        json={"email": email, "password": password, "first_name": "E2e", "last_name": "Owner"},
    )
    assert registered.status_code == 201, registered.text
    headers = {"Authorization": f"Bearer {registered.json()['access_token']}"}
    org = http.post("/v1/organizations", json={"name": org_name}, headers=headers)
    assert org.status_code == 201, org.text
    return headers, org.json()


def spar_executable() -> str:
    found = shutil.which("spar", path=str(Path(sys.executable).parent)) or shutil.which("spar")
    if found is None:
        raise RuntimeError("the spar console script is not installed (pip install -e .)")
    return found


@contextmanager
def spar_process(
    args: list[str],
    env: dict[str, str],
    *,
    cwd: Path,
    health_url: str | None = None,
    timeout: float = 30.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``spar <args>``; wait for ``health_url`` to answer 200; always stop it after."""
    log_path = cwd / f"spar-{args[0]}-{os.getpid()}-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [spar_executable(), *args],
            env={**os.environ, **env},
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            if health_url:
                _wait_healthy(process, health_url, timeout, log_path)
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


@contextmanager
def spar_serve(
    env: dict[str, str],
    *,
    cwd: Path,
    args: Sequence[str] = (),
    health: str = "/health/live",
    public_url: bool = False,
    timeout: float = 30.0,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``spar serve <args>`` on a free loopback port and wait for ``health`` there to
    answer 200: its base URL and its process; always stop it after.  With ``public_url``
    its environment names that URL as ``SPAR_PUBLIC_BASE_URL`` unless ``env`` names
    another."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if public_url:
        env = {"SPAR_PUBLIC_BASE_URL": base, **env}
    with spar_process(
        ["serve", "--host", "127.0.0.1", "--port", str(port), *args],
        env,
        cwd=cwd,
        health_url=f"{base}{health}",
        timeout=timeout,
    ) as process:
        yield base, process


def _wait_healthy(
    process: subprocess.Popen[bytes], url: str, timeout: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"spar exited early:\n{log_path.read_text()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"spar did not become healthy at {url}:\n{log_path.read_text()}")


# --- throwaway services for tests and benchmarks that run their own processes -------------------


def admin_sql(url: str, *statements: str) -> None:
    """Run ``statements`` on the server of ``url`` (as its ``postgres`` database), each
    with ``{name}`` standing for the database ``url`` names."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        raise RuntimeError("Spar runs on PostgreSQL; give a postgresql+psycopg:// URL")
    admin = parsed.set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.format(name=parsed.database))


@contextmanager
def throwaway_database(url: str) -> Iterator[str]:
    """The database ``url`` names, created afresh and migrated; dropped afterwards."""
    admin_sql(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', 'CREATE DATABASE "{name}"')
    try:
        upgrade(url)
        yield url
    finally:
        admin_sql(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def private_redis(fallback: str) -> Iterator[str]:
    """A throwaway ``redis-server`` on a free loopback port (no persistence), its URL; or
    ``fallback`` when there is no ``redis-server`` to start."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield fallback
        return
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the caller's group must not stop it first
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the private redis-server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


NO_PERSISTENCE = ("--save", "", "--appendonly", "no")


class RestartableRedis:
    """A throwaway ``redis-server`` without persistence on a free loopback port, which a
    test can kill and start again on the same port (everything it held is lost, as with
    a real restart of such a server)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RestartableRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*(self.binary, "--port", str(self.port), "--bind", "127.0.0.1"), *NO_PERSISTENCE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()
