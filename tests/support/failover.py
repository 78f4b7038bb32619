"""The scheduler failover drill: two real ``spar scheduler`` processes and a ``* * * * *``
trigger for at least ``RUN_SLOTS`` slots, the active scheduler killed with SIGKILL part way.

The schedulers run with ``SPAR_TRIGGER_SECOND=*/6``: the minute's schedule fires every
six seconds, so the drill sees as many slots in under a minute as it would in eight
minutes of real cron.  The test (``tests/e2e/test_scheduler_failover.py``) runs it and
checks what it saw.  Everything it uses is its own: a database ``spar_failover_<pid>``,
a private ``redis-server`` on a free port (the worker's Redis database if there is no
``redis-server``), a ``spar serve``, a ``spar worker`` on the ``triggers`` queue, the two
schedulers and a loopback :class:`FakeAgent`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from sqlalchemy import make_url

from tests.support.fakes import FakeAgent
from tests.support.processes import (
    admin_sql,
    owner_over_http,
    private_redis,
    spar_executable,
    spar_process,
    spar_serve,
)

SECOND = "*/6"  # SPAR_TRIGGER_SECOND: a slot every six seconds
SLOT = timedelta(seconds=6)
RUN_SLOTS = 9  # the trigger runs at least this many slots...
KILL_AFTER_SLOTS = 3  # ... the leader dies this many slots in, between two slots ...
SLOTS_AFTER_KILL = 3  # ... and the standby fires at least this many after
LEADER_RETRY_S = 1.0
LEADING = "leading: starting the trigger jobs"


@dataclass
class DrillResult:
    trigger_created_at: datetime | None = None
    executions: list[dict[str, Any]] = field(default_factory=list)
    agent_calls: list[dict[str, Any]] = field(default_factory=list)
    killed_at: datetime | None = None
    killed: str | None = None  # "a" or "b": which scheduler led and was killed
    standby_led: bool = False  # the standby's log says it took the lead after the kill
    error: BaseException | None = None
    logs: dict[str, str] = field(default_factory=dict)


class FailoverDrill:
    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database_url = (
            make_url(database_url)
            .set(database=f"spar_failover_{os.getpid()}")
            .render_as_string(hide_password=False)
        )
        self.fallback_redis = redis_url
        self.result = DrillResult()

    def run(self) -> DrillResult:
        """Run the drill to its end; what went wrong, if anything, is in ``error``."""
        try:
            with contextlib.ExitStack() as stack:
                self._drill(stack)
        except Exception as exc:  # reported by the test, with the logs
            self.result.error = exc
        return self.result

    def _drill(self, stack: contextlib.ExitStack) -> None:
        url = self.database_url
        drop = 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
        admin_sql(url, drop, 'CREATE DATABASE "{name}"')
        stack.callback(admin_sql, url, drop)
        # Migrated by ``spar migrate``, not in this process: Alembic's context is global,
        # and the suite's own database may be migrating in the main thread right now.
        subprocess.run(
            [spar_executable(), "migrate"],
            env={**os.environ, "SPAR_DATABASE_URL": url},
            check=True,
            capture_output=True,
            timeout=120,
        )
        redis_url = stack.enter_context(private_redis(self.fallback_redis))
        redis.Redis.from_url(redis_url).flushdb()
        agent = stack.enter_context(FakeAgent(reply=lambda body: f"tock {body['message']}"))
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spar-failover-")))
        stack.callback(self._keep_logs, root)
        env = {
            "SPAR_DATABASE_URL": url,
            "SPAR_REDIS_URL": redis_url,
            "SPAR_SECRET_KEY": "failover-drill-secret",
            "SPAR_EGRESS_ALLOW_PRIVATE": "true",
            "SPAR_LOG_LEVEL": "INFO",
            "SPAR_LOG_FORMAT": "text",
            "SPAR_LEADER_RETRY_S": str(LEADER_RETRY_S),
            "SPAR_TRIGGER_POLL_S": "5",
            "SPAR_TRIGGER_SECOND": SECOND,
            # Small pools: the drill runs beside the rest of the suite, within one
            # PostgreSQL's max_connections (100 by default).
            "SPAR_DB_POOL_SIZE": "2",
        }
        for name in ("serve", "worker", "a", "b"):
            (root / name).mkdir()
        base, _ = stack.enter_context(spar_serve(env, cwd=root / "serve", timeout=60))
        stack.enter_context(
            spar_process(
                ["worker", "--processes", "1", "--threads", "4", "--queues", "triggers"],
                env,
                cwd=root / "worker",
            )
        )
        schedulers = {
            "a": stack.enter_context(spar_process(["scheduler"], env, cwd=root / "a")),
        }
        self._wait_for(lambda: self._leading(root / "a"), 60, "scheduler a to lead")
        schedulers["b"] = stack.enter_context(spar_process(["scheduler"], env, cwd=root / "b"))
        time.sleep(3)  # b is up and standing by

        trigger = self._create_trigger(base, agent.url)
        self.result.trigger_created_at = datetime.fromisoformat(trigger["created_at"])

        # Let KILL_AFTER_SLOTS slots fire, then kill the leader between two slots.
        self._wait_for(lambda: self._fired(url) >= KILL_AFTER_SLOTS, 60, "the first slots")
        while not 1.5 <= time.time() % SLOT.total_seconds() <= 3.5:
            time.sleep(0.1)
        leader = "a" if self._leading(root / "a") and not self._leading(root / "b") else "b"
        self.result.killed = leader
        self.result.killed_at = datetime.now(UTC)
        os.killpg(schedulers[leader].pid, signal.SIGKILL)
        schedulers[leader].wait()
        standby = "b" if leader == "a" else "a"
        self._wait_for(lambda: self._leading(root / standby), 30, f"scheduler {standby} to lead")
        self.result.standby_led = True

        # SLOTS_AFTER_KILL more slots at least, and RUN_SLOTS of the trigger in all.
        after_kill = self._fired(url) + SLOTS_AFTER_KILL
        self._wait_for(
            lambda: self._fired(url) >= max(after_kill, RUN_SLOTS), 90, "the slots after the kill"
        )
        # No slot after these: the standby stops, and every execution it queued ends.
        os.killpg(schedulers[standby].pid, signal.SIGTERM)
        schedulers[standby].wait(timeout=30)
        self._wait_for(lambda: self._unfinished(url) == 0, 30, "the last replies")
        self.result.executions = self._executions(url)
        self.result.agent_calls = [r.json for r in agent.requests]

    def _create_trigger(self, base: str, agent_url: str) -> dict[str, Any]:
        with httpx.Client(base_url=base, timeout=30) as http:
            h, org = owner_over_http(http, "drill@example.com", "drill-password", "drill")
            v1 = f"/v1/orgs/{org['id']}"
            http.post(
                f"{v1}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=h
            ).raise_for_status()
            made = http.post(
                f"{v1}/agents",
                json={"name": "clock", "kind": "http", "endpoint_url": f"{agent_url}/chat"},
                headers=h,
            )
            made.raise_for_status()
            trigger = http.post(
                f"{v1}/triggers/",
                json={
                    "name": "every minute",
                    "trigger_type": "scheduled",
                    "agent_id": made.json()["id"],
                    "message": "tick {{ trigger.name }}",
                    "cron_expression": "* * * * *",
                    "timezone": "UTC",
                },
                headers=h,
            )
            trigger.raise_for_status()
            return trigger.json()

    def _leading(self, cwd: Path) -> bool:
        return any(LEADING in log.read_text(errors="replace") for log in cwd.glob("*.log"))

    def _fired(self, url: str) -> int:
        return self._count(url, ["succeeded"])

    def _unfinished(self, url: str) -> int:
        return self._count(url, ["queued", "running"])

    def _count(self, url: str, statuses: list[str]) -> int:
        conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo) as conn:
            row = conn.execute(
                "SELECT count(*) FROM trigger_executions WHERE status = ANY(%s)", [statuses]
            ).fetchone()
        return int(row[0]) if row else 0

    def _executions(self, url: str) -> list[dict[str, Any]]:
        conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo) as conn:
            cursor = conn.execute(
                "SELECT id::text, scheduled_for, status, source, created_at, response"
                " FROM trigger_executions ORDER BY scheduled_for"
            )
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _wait_for(self, condition: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.5)

    def _keep_logs(self, root: Path) -> None:
        for log in root.glob("*/*.log"):
            self.result.logs[f"{log.parent.name}/{log.name}"] = log.read_text(errors="replace")[
                -4000:
            ]


def summary(result: DrillResult) -> str:
    """What the drill saw, for an assertion's message."""
    return json.dumps(
        {
            "killed": result.killed,
            "killed_at": str(result.killed_at),
            "standby_led": result.standby_led,
            "executions": [
                {k: str(v) for k, v in e.items() if k != "response"} for e in result.executions
            ],
            "logs": result.logs,
        },
        indent=1,
    )
