"""A Spar of its own for a benchmark: a throwaway database, a private ``redis-server``, a
``spar serve`` (and, if asked, a ``spar worker``), and an owner with an organization."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.batch import FALLBACK_REDIS_URL, owner_and_org
from tests.support.processes import free_port, private_redis, spar_process, throwaway_database


@dataclass(frozen=True)
class Stack:
    base: str  # the API's URL
    http: httpx.Client
    org_id: str
    headers: dict[str, str]  # the owner's Authorization


@contextlib.contextmanager
def spar_stack(database_url: str, *, worker_args: list[str] | None = None) -> Iterator[Stack]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(throwaway_database(database_url))
        redis_url = stack.enter_context(private_redis(FALLBACK_REDIS_URL))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spar-bench-")))
        env = {
            "SPAR_DATABASE_URL": database_url,
            "SPAR_REDIS_URL": redis_url,
            "SPAR_SECRET_KEY": "bench-secret-key-not-for-production",
            "SPAR_PUBLIC_BASE_URL": base,
            "SPAR_LOG_LEVEL": "WARNING",
        }
        stack.enter_context(
            spar_process(
                ["serve", "--host", "127.0.0.1", "--port", str(port)],
                env,
                cwd=logs,
                health_url=f"{base}/health/live",
            )
        )
        if worker_args is not None:
            stack.enter_context(spar_process(["worker", *worker_args], env, cwd=logs))
        http = stack.enter_context(httpx.Client(base_url=base, timeout=30))
        token, org_id = owner_and_org(http)
        yield Stack(base, http, org_id, {"Authorization": f"Bearer {token}"})
