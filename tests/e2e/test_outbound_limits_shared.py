"""Two real ``spar worker`` processes share one destination's limit (through Redis): the
judge never sees more calls at once than ``SPAR_OUTBOUND_MAX_CONCURRENCY`` allows, however
many runs the two processes play, and its rate limit's 429s end no run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.support.factories import tenant
from tests.support.fakes import FakeAgent
from tests.support.processes import spar_process, suite_env
from tests.support.ratelimited import TokenBucketOpenAI
from tests.support.scenario_setup import (
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

pytestmark = pytest.mark.slow

LIMIT = 3
RUNS = 12


async def test_two_worker_processes_share_a_destinations_limit(
    client, database_url, settings, tmp_path: Path
) -> None:
    env = suite_env(
        database_url,
        settings,
        SPAR_LOG_LEVEL="WARNING",
        SPAR_OUTBOUND_MAX_CONCURRENCY=str(LIMIT),
    )
    worker = ["worker", "--processes", "1", "--threads", "8", "--queues", "runs"]
    with (
        FakeAgent(reply="Hello there.") as agent,
        TokenBucketOpenAI(rate=40, burst=4, service_s=0.1) as judge,
        spar_process(worker, env, cwd=tmp_path),
        spar_process(worker, env, cwd=tmp_path),
    ):
        t = await tenant(client)
        made = await outbound_setup(client, t, agent.url, judge.url)
        scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Polite?"))])
        runs = [await start_run(client, t, scenario["id"], made.agent_id) for _ in range(RUNS)]
        deadline = time.monotonic() + 60
        statuses: list[str] = []
        while time.monotonic() < deadline:
            statuses = [(await get_run(client, t, r["id"]))["status"] for r in runs]
            if all(s in {"passed", "failed", "error"} for s in statuses):
                break
            await asyncio.sleep(0.2)
    assert statuses == ["passed"] * RUNS, statuses
    assert judge.served == RUNS
    # Two processes of eight threads each: without a shared limit the judge would see up to
    # sixteen calls at once; with it, never more than the limit.
    assert 2 <= judge.max_in_flight <= LIMIT, judge.max_in_flight
