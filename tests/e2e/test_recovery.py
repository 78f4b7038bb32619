"""Recovery with default settings (issue 21): a batch whose worker is killed with
``kill -9``, or whose Redis restarts empty, has every run terminal by the heartbeat path,
with exact counters.

Real ``spar serve``, ``spar scheduler`` and ``spar worker`` processes, a Redis of the
test's own (so it can be restarted), the suite's PostgreSQL; only the agent is a
loopback fake.  No ``SPAR_*`` timing is set: the heartbeat timeout (30 s), the sweep
interval (15 s) and the stall period (300 s) are the defaults a user gets.  How long
recovery took is printed (about 35 s on a quiet machine): a figure, not an assertion,
since it depends on what else the machine runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from tests.support.factories import Tenant, tenant
from tests.support.fakes import FakeAgent
from tests.support.processes import RestartableRedis, spar_process, spar_serve
from tests.support.scenario_setup import create_scenario, criterion, outbound_setup, turn

pytestmark = pytest.mark.slow

SCENARIOS = 60
WINDOW = 20
AGENT_DELAY_S = 0.25
# Every run terminal within this long of the fault: before the stall path
# (SPAR_RUN_STALL_S, 300 s, left at its default) could send anything again, so only the
# heartbeat path (SPAR_RUN_HEARTBEAT_TIMEOUT_S, 30 s: a dead worker's runs, and a batch run
# it handed out whose message it was killed before sending) and the broker's give-back can
# have ended them.
BEFORE_THE_STALL_PATH_S = 240.0
WORKER = ["worker", "--processes", "1", "--threads", "16", "--queues", "runs,batches"]


def expected_status(n: int) -> str:
    return "failed" if n % 5 == 2 else "passed"


def slow_echo(body: dict[str, Any]) -> str:
    time.sleep(AGENT_DELAY_S)
    return f"Echo: {body['message']}"


def logs(directory: Path) -> str:
    return "\n".join(
        f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
        for path in sorted(directory.glob("spar-*.log"))
    )


async def suite(client: AsyncTestClient, agent_url: str) -> tuple[Tenant, str]:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent_url)
    for n in range(SCENARIOS):
        check = "never said" if expected_status(n) == "failed" else "second"
        await create_scenario(
            client,
            t,
            name=f"recovery {n:02d}",
            tags=["recovery"],
            turns=[
                turn(f"first {n}", criterion("first", "contains")),
                turn(f"second {n}", criterion(check, "contains")),
            ],
        )
    return t, setup.agent_id


def env(database_url: str, settings: Any, redis_url: str) -> dict[str, str]:
    # Deliberately no SPAR_RUN_HEARTBEAT_TIMEOUT_S, SPAR_SWEEP_INTERVAL_S, SPAR_RUN_STALL_S.
    return {
        "SPAR_DATABASE_URL": database_url,
        "SPAR_REDIS_URL": redis_url,
        "SPAR_SECRET_KEY": settings.secret_key,
        "SPAR_EGRESS_ALLOW_PRIVATE": "true",
        "SPAR_LOG_LEVEL": "INFO",
    }


class Batch:
    """A batch started and read through a real ``spar serve``."""

    def __init__(self, api: str, t: Tenant, agent_id: str) -> None:
        self.path = f"{api}/v1/orgs/{t.id}/scenarios/batch-runs"
        self.headers = t.owner.headers
        response = httpx.post(
            f"{self.path}/",
            json={"agent_id": agent_id, "tags": ["recovery"], "max_concurrency": WINDOW},
            headers=self.headers,
            timeout=30,
        )
        assert response.status_code == 201, response.text
        self.id = response.json()["id"]

    def state(self) -> dict[str, Any]:
        response = httpx.get(f"{self.path}/{self.id}", headers=self.headers, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def wait_until(self, done: Any, timeout_s: float, what: str, directory: Path) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state()
            if done(state):
                return state
            assert time.monotonic() < deadline, f"{what}: {_counts(state)}\n{logs(directory)}"
            time.sleep(0.2)


def _counts(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "runs"}


def assert_exact(final: dict[str, Any]) -> None:
    assert final["status"] == "completed", _counts(final)
    expected = Counter(expected_status(n) for n in range(SCENARIOS))
    assert (final["passed_scenarios"], final["failed_scenarios"], final["error_scenarios"]) == (
        expected["passed"],
        expected["failed"],
        0,
    ), _counts(final)
    assert final["completed_scenarios"] == final["total_scenarios"] == SCENARIOS
    by_name = {r["scenario_name"]: r for r in final["runs"]}
    for n in range(SCENARIOS):
        run = by_name[f"recovery {n:02d}"]
        assert run["status"] == expected_status(n), run
        assert run["total_turns"] == 2 and run["passed_turns"] == (
            2 if expected_status(n) == "passed" else 1
        ), run


@contextmanager
def spar(
    variables: dict[str, str], directory: Path, workers: int
) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """``spar serve``, ``spar scheduler`` and ``workers`` workers: the API's URL and the
    worker processes."""
    with ExitStack() as stack:
        api, _ = stack.enter_context(spar_serve(variables, cwd=directory))
        stack.enter_context(spar_process(["scheduler"], variables, cwd=directory))
        started = [
            stack.enter_context(spar_process(WORKER, variables, cwd=directory))
            for _ in range(workers)
        ]
        yield api, started


def in_flight(state: dict[str, Any]) -> int:
    return sum(1 for r in state["runs"] if r["status"] == "running")


async def recovery_after(
    fault: Callable[[RestartableRedis, list[subprocess.Popen[bytes]]], None],
    client: AsyncTestClient,
    database_url: str,
    settings: Any,
    directory: Path,
    *,
    workers: int,
    under_way: Callable[[dict[str, Any]], bool],
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Run the suite as a batch on real processes, cause ``fault`` (given the Redis and the
    workers) once the batch is ``under_way``, and wait for the batch's end, at most
    ``BEFORE_THE_STALL_PATH_S``: the batch before the fault, at its end, and the seconds
    from the fault to the end."""
    with RestartableRedis() as redis_server, FakeAgent(reply=slow_echo) as agent:
        t, agent_id = await suite(client, agent.url)
        variables = env(database_url, settings, redis_server.url)
        with spar(variables, directory, workers=workers) as (api, started):
            batch = Batch(api, t, agent_id)
            before = batch.wait_until(under_way, 60, "the batch never got under way", directory)
            fault(redis_server, started)
            faulted = time.monotonic()
            assert before["completed_scenarios"] < SCENARIOS, "the batch ended before the fault"
            final = batch.wait_until(
                lambda s: s["status"] != "running", BEFORE_THE_STALL_PATH_S, "not over", directory
            )
            return before, final, time.monotonic() - faulted


async def test_a_worker_killed_mid_batch_has_its_runs_terminal_and_exact(
    client: AsyncTestClient, database_url: str, settings: Any, tmp_path: Path
) -> None:
    def kill_one_worker(_: RestartableRedis, workers: list[subprocess.Popen[bytes]]) -> None:
        os.killpg(workers[0].pid, signal.SIGKILL)
        workers[0].wait()

    # Killed once the batch is well under way and runs are in flight.
    before, final, took = await recovery_after(
        kill_one_worker,
        client,
        database_url,
        settings,
        tmp_path,
        workers=2,
        under_way=lambda s: s["completed_scenarios"] >= SCENARIOS // 4 and in_flight(s) >= 4,
    )
    print(
        f"\nkill -9 of a worker at {before['completed_scenarios']}/{SCENARIOS} done, "
        f"{in_flight(before)} in flight: every run terminal {took:.1f} s after"
    )
    assert_exact(final)


async def test_a_redis_restart_mid_batch_has_every_run_terminal_and_exact(
    client: AsyncTestClient, database_url: str, settings: Any, tmp_path: Path
) -> None:
    def restart_redis(redis_server: RestartableRedis, _: list[subprocess.Popen[bytes]]) -> None:
        redis_server.restart()  # every queued message is gone

    before, final, took = await recovery_after(
        restart_redis,
        client,
        database_url,
        settings,
        tmp_path,
        workers=1,
        under_way=lambda s: s["completed_scenarios"] >= SCENARIOS // 4,
    )
    print(
        f"\nRedis restarted at {before['completed_scenarios']}/{SCENARIOS} done: "
        f"every run terminal {took:.1f} s after"
    )
    assert_exact(final)
