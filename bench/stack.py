"""What every benchmark starts and measures with, written once.

* :func:`spar_stack`: a Spar of the benchmark's own: a throwaway database (created,
  migrated, dropped), Redis (``SPAR_BENCH_REDIS_URL``, flushed before and after, or a
  private ``redis-server``), ``spar serve`` and any ``spar worker`` processes with their
  logs in a temporary directory (their tails printed if the benchmark fails), and an
  owner with an organization made over REST;
* :func:`loopback_fakes`: the agent and judge fakes of ``bench/fakes.py``, in a process of
  their own (asyncio) or as threaded servers in the benchmark's process, with their
  latency (and the judge's rate limit) under control;
* :class:`CpuMeter`: the CPU time the stack spent in a window, read from ``/proc``:
  Spar's processes (and their children), the database's backends, Redis;
* :func:`percentiles` of timed samples, and the small REST and database helpers.

A benchmark is run as a script (``python bench/X.py``): it puts the repository root on
``sys.path`` before importing this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from sqlalchemy import make_url

from tests.support.processes import private_redis, spar_process, spar_serve, throwaway_database

ROOT = Path(__file__).resolve().parent.parent
FALLBACK_REDIS_URL = "redis://127.0.0.1:6379/13"
SECRET_KEY = "bench-secret-key-not-for-production"  # noqa: S105 - a throwaway stack
DRAMATIQ_HEARTBEATS = "dramatiq:__heartbeats__"


# --- a benchmark's process ---------------------------------------------------------------------


def database_url(name: str) -> str:
    """``SPAR_BENCH_DATABASE_URL``, or a database of this run's own on the local
    PostgreSQL: ``spar_bench_<name>_<pid>`` (``spar_bench_<pid>`` for no name)."""
    given = os.environ.get("SPAR_BENCH_DATABASE_URL")
    if given:
        return given
    database = "_".join(["spar_bench", *([name] if name else []), str(os.getpid())])
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"


def psycopg_dsn(url: str) -> str:
    """The ``postgresql://`` form of a SQLAlchemy URL, for psycopg itself."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def unwind_on_sigterm() -> None:
    """SIGTERM (``timeout``, a CI runner) unwinds like Ctrl-C: processes stopped, database
    dropped, Redis flushed."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def percentiles(seconds: list[float], *points: int) -> dict[str, float]:
    """The ``points`` percentiles (default 50 and 99) of timed samples, in milliseconds,
    keyed ``p50``, ``p99``…"""
    cut = statistics.quantiles(seconds, n=100) if len(seconds) > 1 else seconds * 99
    return {f"p{p}": cut[p - 1] * 1000 for p in points or (50, 99)}


# --- REST ------------------------------------------------------------------------------------


def ok(response: httpx.Response, status: int = 201) -> dict[str, Any]:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.method} {response.request.url}: {response.text}")
    return response.json()


def owner_and_org(api: httpx.Client) -> tuple[str, str]:
    """A new user's token and the id of an organization it owns, made over REST."""
    registered = ok(
        api.post(
            "/v1/auth/register",
            json={
                "email": f"bench-{uuid.uuid4().hex[:8]}@example.com",
                "password": "bench-password-123",
                "first_name": "Bench",
                "last_name": "Mark",
            },
        )
    )
    token = registered["access_token"]
    org = ok(
        api.post(
            "/v1/organizations",
            json={"name": "bench"},
            headers={"Authorization": f"Bearer {token}"},
        )
    )["id"]
    return token, org


# --- Spar ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    base: str  # the API's URL
    http: httpx.Client
    org_id: str
    token: str  # the owner's
    headers: dict[str, str]  # the owner's Authorization
    database_url: str
    redis_url: str | None
    serve_pid: int
    worker_pids: list[int]
    logs: Path
    workers_started: float  # perf_counter() as the first worker was started


@contextlib.contextmanager
def spar_stack(
    database_url: str,
    *,
    with_redis: bool = True,
    env: dict[str, str] | None = None,
    workers: int = 0,
    worker_args: list[str] | None = None,
    worker_env: dict[str, str] | None = None,
    log_level: str = "WARNING",
) -> Iterator[Stack]:
    """Spar on a throwaway database: ``spar serve`` and ``workers`` ``spar worker
    <worker_args>`` processes (``worker_env`` added to theirs), on Redis unless
    ``with_redis`` is false (the API alone, on its in-memory broker)."""
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spar-bench-")))
        redis_url = stack.enter_context(bench_redis()) if with_redis else None
        stack.enter_context(throwaway_database(database_url))
        process_env = {
            "SPAR_DATABASE_URL": database_url,
            "SPAR_SECRET_KEY": SECRET_KEY,
            "SPAR_LOG_LEVEL": log_level,
            **({"SPAR_REDIS_URL": redis_url} if redis_url else {}),
            **(env or {}),
        }
        with _logs_on_failure(logs):
            base, serve = stack.enter_context(spar_serve(process_env, cwd=logs, public_url=True))
            workers_started = time.perf_counter()
            worker_pids = [
                stack.enter_context(
                    spar_process(
                        ["worker", *(worker_args or [])],
                        {"SPAR_PUBLIC_BASE_URL": base, **process_env, **(worker_env or {})},
                        cwd=logs,
                    )
                ).pid
                for _ in range(workers)
            ]
            http = stack.enter_context(httpx.Client(base_url=base, timeout=60))
            token, org_id = owner_and_org(http)
            yield Stack(
                base=base,
                http=http,
                org_id=org_id,
                token=token,
                headers={"Authorization": f"Bearer {token}"},
                database_url=database_url,
                redis_url=redis_url,
                serve_pid=serve.pid,
                worker_pids=worker_pids,
                logs=logs,
                workers_started=workers_started,
            )


@contextlib.contextmanager
def bench_redis() -> Iterator[str]:
    """``SPAR_BENCH_REDIS_URL`` (flushed before and after), or a private ``redis-server``:
    its URL."""
    given = os.environ.get("SPAR_BENCH_REDIS_URL")
    if not given:
        with private_redis(FALLBACK_REDIS_URL) as url:
            yield url
        return
    client = redis.Redis.from_url(given)
    client.flushdb()
    try:
        yield given
    finally:
        with contextlib.suppress(redis.RedisError):
            client.flushdb()


@contextlib.contextmanager
def _logs_on_failure(logs: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        for log in sorted(logs.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}", file=sys.stderr)
        raise


def wait_for_workers(redis_url: str, count: int, timeout_s: float) -> None:
    """Until ``count`` worker processes fetch from Redis (Dramatiq's heartbeats)."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.perf_counter() + timeout_s
    while client.zcard(DRAMATIQ_HEARTBEATS) < count:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{count} workers not ready after {timeout_s}s")
        time.sleep(0.05)


# --- loopback fakes --------------------------------------------------------------------------


class Fakes:
    """The agent's and the judge's URLs, and control over their latency and the judge's
    rate limit (over HTTP, wherever they run)."""

    agent_url: str
    judge_url: str
    pids: list[int]  # the processes they run in (for the CPU they take)

    def _listening(self, ports: dict[str, int]) -> None:
        if not ports:
            raise RuntimeError("the fakes did not start")
        self.agent_url = f"http://127.0.0.1:{ports['agent']}"
        self.judge_url = f"http://127.0.0.1:{ports['judge']}"

    def set_latency(self, agent_s: float, judge_s: float) -> None:
        httpx.post(f"{self.judge_url}/_latency", json={"agent_s": agent_s, "judge_s": judge_s})

    def set_limit(self, rate: float | None, burst: int = 1, retry_after: str = "seconds") -> None:
        """The judge behind a token bucket of ``rate`` requests a second (``None``: none)."""
        httpx.post(
            f"{self.judge_url}/_limit",
            json={"rate": rate, "burst": burst, "retry_after": retry_after},
        ).raise_for_status()

    def fail_every(self, n: int | None) -> None:
        """Every ``n``-th judge verdict from now on a FAIL (``None``: none)."""
        httpx.post(f"{self.judge_url}/_verdicts", json={"fail_every": n}).raise_for_status()

    def served(self) -> dict[str, int]:
        return httpx.get(f"{self.judge_url}/_stats").json()

    def stop(self) -> None:
        raise NotImplementedError


class ProcessFakes(Fakes):
    """``bench/fakes.py`` in a process of its own (one asyncio loop)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "fakes.py")],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self._process.stdout is not None
        self._listening(json.loads(self._process.stdout.readline() or "{}"))
        self.pids = [self._process.pid]

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


class ThreadedFakes(Fakes):
    """The same fakes as stdlib threaded servers inside this (the load generator's) process."""

    def __init__(self) -> None:
        from bench.fakes import serve_threaded

        ports, self._stop = serve_threaded()
        self._listening(ports)
        self.pids = [os.getpid()]

    def stop(self) -> None:
        self._stop()


FAKES = {"asyncio": ProcessFakes, "threaded": ThreadedFakes}


@contextlib.contextmanager
def loopback_fakes(kind: str = "asyncio") -> Iterator[Fakes]:
    started = FAKES[kind]()
    try:
        yield started
    finally:
        started.stop()


# --- CPU -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuSpent:
    """CPU seconds (user + system) spent in a window, by part of the stack."""

    spar: float  # spar serve, the workers and their children
    serve: float  # of which spar serve (with its children)
    database: float  # the backends connected to the benchmark's database
    redis: float
    fakes: float  # the fakes' process (threaded: the benchmark's own, its poll included)
    wall_s: float

    @property
    def stack(self) -> float:
        """Everything but the fakes: what a turn costs the machine that runs Spar."""
        return self.spar + self.database + self.redis


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone), from ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_cpu_seconds(database_url: str | None) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend connected to the database."""
    if database_url is None:
        return {}
    with psycopg.connect(psycopg_dsn(database_url), autocommit=True) as conn:
        pids = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return {pid: cpu_seconds(pid) for (pid,) in pids}


class CpuMeter:
    """Reads ``/proc`` at :meth:`start` and :meth:`stop`: the CPU each part of the stack
    spent in between.  A process that ends inside the window loses its share (the pools
    keep theirs open; the figure is a floor)."""

    def __init__(self, spar: Stack, fakes: Fakes | None = None) -> None:
        self._spar = spar
        self._fake_pids = fakes.pids if fakes is not None else []
        self._start: dict[str, dict[int, float]] = {}
        self._started = 0.0

    def _times(self) -> dict[str, dict[int, float]]:
        """CPU seconds so far of each process of each part."""
        import psutil

        def family(pid: int) -> list[int]:
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(pid)
                return [pid, *(child.pid for child in parent.children(recursive=True))]
            return []

        serve = family(self._spar.serve_pid)
        workers = [p for pid in self._spar.worker_pids for p in family(pid)]
        redis_pids = []
        if self._spar.redis_url:
            server = redis.Redis.from_url(self._spar.redis_url).info("server")
            redis_pids = [int(server["process_id"])]
        return {
            "spar": {pid: cpu_seconds(pid) for pid in serve + workers},
            "serve": {pid: cpu_seconds(pid) for pid in serve},
            "database": backend_cpu_seconds(self._spar.database_url),
            "redis": {pid: cpu_seconds(pid) for pid in redis_pids},
            "fakes": {pid: cpu_seconds(pid) for pid in self._fake_pids},
        }

    def start(self) -> None:
        self._start = self._times()
        self._started = time.perf_counter()

    def stop(self) -> CpuSpent:
        wall = time.perf_counter() - self._started
        spent = {}
        for part, now in self._times().items():
            before = self._start.get(part, {})
            # A process born inside the window counts whole; one that is gone, not at all.
            spent[part] = sum(t - before.get(pid, 0.0) for pid, t in now.items())
        return CpuSpent(wall_s=wall, **spent)
