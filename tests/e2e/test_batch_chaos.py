"""Chaos: a batch of 500 two-turn scenarios on two real ``spar worker`` processes and a
real ``spar scheduler``; one worker is killed with SIGKILL mid-batch, then replaced, while
a client follows the batch's progress stream from a real ``spar serve``.

The batch must still complete with every run terminal, exact counters (equal to what
the runs themselves say, and to what the scenarios were built to produce), the window
never exceeded, and no turn or criterion result written twice.  Recovery comes from
the runs' claims and heartbeats in PostgreSQL and the scheduler's sweeper
(``SPAR_RUN_HEARTBEAT_TIMEOUT_S=3``, ``SPAR_RUN_STALL_S=3``, ``SPAR_SWEEP_INTERVAL_S=1``),
which re-sends runs the dead worker was playing and refills the window if the worker died
between a run's end and its refill.  (``tests/e2e/test_recovery.py`` measures the same
recovery with the default settings.)  The stream must report
every run once, counts that only grow, and end with the final counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
import redis
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import CriterionResult, ScenarioRun, TurnResult
from tests.support.factories import tenant
from tests.support.fakes import FakeAgent, FakeOpenAI
from tests.support.processes import spar_process, spar_serve, suite_env
from tests.support.sse import parse_sse

pytestmark = pytest.mark.slow

SCENARIOS = 500
WINDOW = 20
AGENT_DELAY_S = 0.05
JUDGE_DELAY_S = 0.03
KILL_AT = 0.25  # share of runs completed when worker A dies
DEADLINE_S = 150.0
WORKER_ARGS = ["worker", "--processes", "1", "--threads", "16", "--queues", "runs,batches"]


def expected_status(n: int) -> str:
    """What scenario ``n`` is built to end as (see :func:`scenario_body`)."""
    if n % 20 == 7:
        return "error"
    if n % 10 == 3:
        return "failed"
    return "passed"


def scenario_body(n: int) -> dict[str, Any]:
    """Two turns, each with a deterministic check and an LLM-judged criterion.

    Turn 2 fails its check for ``failed`` scenarios and cannot render for ``error`` ones
    (saved, but the sandbox refuses to build so large a value), so turn 1 is always
    committed first.
    """
    status = expected_status(n)
    second = {
        "passed": f"second {n}",
        "failed": f"second {n}",
        "error": f"second {n} {{{{ 'x' * 1000000000 }}}}",
    }[status]
    check = "never-said" if status == "failed" else "second"
    return {
        "name": f"chaos {n:03d}",
        "tags": ["chaos"],
        "turns": [
            {
                "user_message": f"first {n}",
                "criteria": [
                    {"question": "first", "criteria_type": "contains"},
                    {"question": "Is the reply polite?"},
                ],
            },
            {
                "user_message": second,
                "criteria": [
                    {"question": check, "criteria_type": "contains"},
                    {"question": "Does it answer the question?"},
                ],
            },
        ],
    }


class SlowAgent(FakeAgent):
    """Echoes the message after a fixed delay; counts the runs it serves at once."""

    def __init__(self) -> None:
        super().__init__(reply=self._answer)
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()
        self.max_runs_at_once = 0

    def _answer(self, body: dict[str, Any]) -> str:
        run_id = str((body.get("metadata") or {}).get("run_id"))
        with self._lock:
            self._active[run_id] += 1
            self.max_runs_at_once = max(self.max_runs_at_once, len(+self._active))
        try:
            time.sleep(AGENT_DELAY_S)
        finally:
            with self._lock:
                self._active[run_id] -= 1
        return f"Echo: {body['message']}"


def judge_reply(body: dict[str, Any]) -> str:
    time.sleep(JUDGE_DELAY_S)
    return json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "ok"})


@pytest.fixture
def chaos_env(database_url: str, settings: Any) -> dict[str, str]:
    return suite_env(
        database_url,
        settings,
        SPAR_LOG_LEVEL="WARNING",
        SPAR_SWEEP_INTERVAL_S="1",
        SPAR_RUN_STALL_S="3",
        SPAR_RUN_HEARTBEAT_TIMEOUT_S="3",
    )


def logs(directory: Path) -> str:
    """The tail of every process log, for a failure message."""
    parts = []
    for path in sorted(directory.glob("spar-*.log")):
        parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


async def setup(client: Any, agent_url: str, judge_url: str) -> tuple[Any, str]:
    t = await tenant(client)
    h = t.owner.headers
    response = await client.post(
        f"/v1/orgs/{t.id}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=h
    )
    assert response.status_code == 201, response.text
    response = await client.post(
        f"/v1/orgs/{t.id}/llm-providers",
        json={
            "name": "judge",
            "provider": "openai_compatible",
            "base_url": f"{judge_url}/v1",
            "default_model": "judge-1",
            "is_default_judge": True,
        },
        headers=h,
    )
    assert response.status_code == 201, response.text
    response = await client.post(
        f"/v1/orgs/{t.id}/agents",
        json={"name": "bot", "kind": "http", "endpoint_url": f"{agent_url}/chat"},
        headers=h,
    )
    assert response.status_code == 201, response.text
    agent_id = response.json()["id"]
    for n in range(SCENARIOS):
        response = await client.post(f"/v1/orgs/{t.id}/scenarios", json=scenario_body(n), headers=h)
        assert response.status_code == 201, response.text
    return t, agent_id


async def in_flight(db: AsyncSession, batch_id: str) -> int:
    count = await db.scalar(
        select(func.count())
        .select_from(ScenarioRun)
        .where(
            ScenarioRun.batch_run_id == UUID(batch_id),
            ScenarioRun.dispatched_at.is_not(None),
            ScenarioRun.status.in_(("pending", "running")),
        )
    )
    await db.commit()
    return int(count or 0)


def sweeper_resent(directory: Path) -> int:
    """Stalled runs the scheduler's sweeper re-sent, from its log (INFO)."""
    return sum(
        int(match)
        for log in directory.glob("spar-scheduler-*.log")
        for match in re.findall(r"sweeper re-sent (\d+) stalled runs", log.read_text())
    )


class ProgressReader(threading.Thread):
    """Follows ``GET …/events`` from a real API process until the stream ends."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.events: list[tuple[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            body = []
            with httpx.stream("GET", self.url, headers=self.headers, timeout=DEADLINE_S) as r:
                assert r.status_code == 200, r.read()
                assert r.headers["content-type"].startswith("text/event-stream")
                for chunk in r.iter_text():
                    body.append(chunk)
            self.events = parse_sse("".join(body))
        except BaseException as exc:  # reported by the test
            self.error = exc


async def runs_beating(db: AsyncSession, run_ids: list[UUID]) -> dict[UUID, tuple[str, Any]]:
    """Status and heartbeat of those of ``run_ids`` still pending or running."""
    rows = (
        await db.execute(
            select(ScenarioRun.id, ScenarioRun.status, ScenarioRun.heartbeat_at).where(
                ScenarioRun.id.in_(run_ids), ScenarioRun.status.in_(("pending", "running"))
            )
        )
    ).all()
    await db.commit()
    return {run_id: (status, beat) for run_id, status, beat in rows}


def workers_fetching(r: redis.Redis) -> int:
    """Worker processes fetching from Redis now (Dramatiq's heartbeats)."""
    return int(r.zcard("dramatiq:__heartbeats__"))


async def runs_in_flight(db: AsyncSession, batch_id: str) -> list[UUID]:
    """The batch's runs being played now (by either worker)."""
    rows = await db.scalars(
        select(ScenarioRun.id).where(
            ScenarioRun.batch_run_id == UUID(batch_id), ScenarioRun.status == "running"
        )
    )
    await db.commit()
    return list(rows)


async def test_a_batch_survives_a_worker_killed_mid_batch(
    client: Any, db: AsyncSession, chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    r = redis.Redis.from_url(chaos_env["SPAR_REDIS_URL"])
    with (
        SlowAgent() as agent,
        FakeOpenAI(reply=judge_reply) as judge,
    ):
        t, agent_id = await setup(client, agent.url, judge.url)
        path = f"/v1/orgs/{t.id}/scenarios/batch-runs"
        h = t.owner.headers
        samples: list[int] = []

        async def batch_state() -> dict[str, Any]:
            response = await client.get(f"{path}/{batch_id}", headers=h)
            assert response.status_code == 200, response.text
            samples.append(await in_flight(db, batch_id))
            return response.json()

        with (
            spar_serve(chaos_env, cwd=tmp_path) as (base, _),
            spar_process(["scheduler"], {**chaos_env, "SPAR_LOG_LEVEL": "INFO"}, cwd=tmp_path),
            spar_process(WORKER_ARGS, chaos_env, cwd=tmp_path) as worker_a,
        ):
            response = await client.post(
                f"{path}/",
                json={"agent_id": agent_id, "tags": ["chaos"], "max_concurrency": WINDOW},
                headers=h,
            )
            assert response.status_code == 201, response.text
            assert response.json()["status"] == "queued"
            assert response.json()["total_scenarios"] == SCENARIOS
            batch_id = response.json()["id"]
            progress = ProgressReader(f"{base}{path}/{batch_id}/events", h)
            progress.start()

            with spar_process(WORKER_ARGS, chaos_env, cwd=tmp_path):
                # A dies once a quarter of the runs are done, both workers fetching, with
                # runs in flight.  A run is acknowledged to the broker as its worker starts
                # playing it (workers.conversations): which runs A plays is learnt from
                # their heartbeats, which stop with A.
                deadline = time.monotonic() + 60
                while True:
                    state = await batch_state()
                    flying = await runs_in_flight(db, batch_id)
                    done = state["completed_scenarios"]
                    if (
                        workers_fetching(r) == 2
                        and done >= SCENARIOS * KILL_AT
                        and len(flying) >= 6
                    ):
                        break
                    assert time.monotonic() < deadline, (
                        f"no kill point: {state['completed_scenarios']} done, {len(flying)} "
                        f"in flight, {workers_fetching(r)} workers\n{logs(tmp_path)}"
                    )
                    await asyncio.sleep(0.02)
                os.killpg(worker_a.pid, signal.SIGKILL)
                worker_a.wait()
                at_kill = state["completed_scenarios"]
                unfinished = await runs_beating(db, await runs_in_flight(db, batch_id))
                assert at_kill < SCENARIOS, "the batch ended before the kill: make it longer"

                await asyncio.sleep(2.0)
                # Those A was playing: running, their heartbeat (every 0.5 s while a live
                # worker plays a run) still where it was at the kill; B's beats move.
                # Another worker must take each of A's over once its heartbeat is stale
                # (the sweeper re-sends it).
                later = await runs_beating(db, list(unfinished))
                taken_over = {
                    run_id
                    for run_id, (status, beat) in unfinished.items()
                    if status == "running" and later.get(run_id) == (status, beat)
                }
                with spar_process(WORKER_ARGS, chaos_env, cwd=tmp_path):
                    deadline = time.monotonic() + DEADLINE_S
                    while True:
                        state = await batch_state()
                        if state["status"] != "running":
                            break
                        assert time.monotonic() < deadline, (
                            f"batch not finished after {DEADLINE_S}s: "
                            f"{ {k: v for k, v in state.items() if k != 'runs'} }\n"
                            f"{logs(tmp_path)}"
                        )
                        await asyncio.sleep(0.25)
                    # Let any late duplicate delivery finish whatever it would still do.
                    await asyncio.sleep(1.0)
                    final = (await client.get(f"{path}/{batch_id}", headers=h)).json()
                    await asyncio.to_thread(progress.join, 30)

    elapsed = time.monotonic() - started
    # The recovery path was taken: each run A was playing was claimed again by another
    # worker: re-sent by the sweeper once its heartbeat stopped (or, for a message A took
    # and had not yet acknowledged, given back by the broker).
    resent = sweeper_resent(tmp_path)
    claims = dict(
        (
            await db.execute(
                select(ScenarioRun.id, ScenarioRun.attempts).where(ScenarioRun.id.in_(taken_over))
            )
        ).all()
    )
    await db.commit()
    print(
        f"\nchaos: {SCENARIOS} runs; worker A killed at {at_kill} completed, "
        f"{len(unfinished)} runs in flight; done in {elapsed:.1f}s; "
        f"agent calls {len(agent.requests)} (ideal {2 * SCENARIOS - SCENARIOS // 20}), judge "
        f"calls {len(judge.requests)}; most runs at the agent at once {agent.max_runs_at_once}; "
        f"most in flight {max(samples)}; runs re-sent by the sweeper {resent}; runs A was "
        f"playing, taken over {len(claims)}"
    )
    assert claims, "worker A was playing no run when killed: the kill tested nothing"
    assert all(attempts >= 2 for attempts in claims.values()), claims

    # The batch completed, every run terminal, as each scenario was built to end.
    assert final["status"] == "completed", {k: v for k, v in final.items() if k != "runs"}
    assert final["completed_at"] is not None
    runs = final["runs"]
    assert len(runs) == SCENARIOS
    assert all(r["status"] in {"passed", "failed", "error"} for r in runs), Counter(
        r["status"] for r in runs
    )
    by_name = {r["scenario_name"]: r for r in runs}
    for n in range(SCENARIOS):
        assert by_name[f"chaos {n:03d}"]["status"] == expected_status(n), by_name[f"chaos {n:03d}"]
    expected = Counter(expected_status(n) for n in range(SCENARIOS))

    # Counters exact: by construction, by the runs in the response, and by the database.
    assert final["completed_scenarios"] == final["total_scenarios"] == SCENARIOS
    assert final["completed_scenarios"] == (
        final["passed_scenarios"] + final["failed_scenarios"] + final["error_scenarios"]
    )
    counters = Counter(
        passed=final["passed_scenarios"],
        failed=final["failed_scenarios"],
        error=final["error_scenarios"],
    )
    assert counters == expected
    assert Counter(r["status"] for r in runs) == expected
    stored = dict(
        (
            await db.execute(
                select(ScenarioRun.status, func.count())
                .where(ScenarioRun.batch_run_id == UUID(batch_id))
                .group_by(ScenarioRun.status)
            )
        ).all()
    )
    assert stored == dict(expected)

    # The window held: never more than max_concurrency runs handed out and unfinished.
    assert max(samples) <= WINDOW, max(samples)

    # No turn or criterion result twice; each run has the turns its outcome implies.
    duplicate_turns = await db.scalar(
        text(
            "SELECT count(*) FROM (SELECT t.run_id, t.turn_index FROM turn_results t "
            "JOIN scenario_runs r ON r.id = t.run_id WHERE r.batch_run_id = :b "
            "GROUP BY t.run_id, t.turn_index HAVING count(*) > 1) d"
        ),
        {"b": batch_id},
    )
    duplicate_criteria = await db.scalar(
        text(
            "SELECT count(*) FROM (SELECT c.turn_result_id, c.criteria_id "
            "FROM criterion_results c JOIN turn_results t ON t.id = c.turn_result_id "
            "JOIN scenario_runs r ON r.id = t.run_id WHERE r.batch_run_id = :b "
            "GROUP BY c.turn_result_id, c.criteria_id HAVING count(*) > 1) d"
        ),
        {"b": batch_id},
    )
    assert duplicate_turns == 0
    assert duplicate_criteria == 0

    # The client followed it all on the stream: every run once, counts only growing, and
    # an end carrying the final counts.
    assert not progress.is_alive() and progress.error is None, progress.error
    names = [name for name, _ in progress.events]
    assert names[-1] == "end" and names.count("end") == 1, names[-5:]
    streamed = [data["id"] for name, data in progress.events if name == "run"]
    assert len(streamed) == len(set(streamed)) == SCENARIOS
    statuses = {data["id"]: data["status"] for name, data in progress.events if name == "run"}
    assert statuses == {r["id"]: r["status"] for r in runs}
    completed = [
        data["completed_scenarios"] for name, data in progress.events if name == "progress"
    ]
    assert completed == sorted(completed) and len(completed) > 5, completed
    end = progress.events[-1][1]
    assert {k: end[k] for k in ("status", "completed_scenarios", "passed_scenarios")} == {
        "status": "completed",
        "completed_scenarios": SCENARIOS,
        "passed_scenarios": expected["passed"],
    }
    turns = dict(
        (
            await db.execute(
                select(TurnResult.run_id, func.count())
                .join(ScenarioRun, ScenarioRun.id == TurnResult.run_id)
                .where(ScenarioRun.batch_run_id == UUID(batch_id))
                .group_by(TurnResult.run_id)
            )
        ).all()
    )
    criteria = dict(
        (
            await db.execute(
                select(TurnResult.run_id, func.count())
                .join(CriterionResult, CriterionResult.turn_result_id == TurnResult.id)
                .join(ScenarioRun, ScenarioRun.id == TurnResult.run_id)
                .where(ScenarioRun.batch_run_id == UUID(batch_id))
                .group_by(TurnResult.run_id)
            )
        ).all()
    )
    await db.commit()
    for run in runs:
        run_id = UUID(run["id"])
        if run_id in taken_over:
            assert run["status"] == expected_status(int(run["scenario_name"].split()[1]))
        want = 1 if run["status"] == "error" else 2
        assert turns.get(run_id, 0) == want, run
        assert criteria.get(run_id, 0) == 2 * want, run
        assert run["total_turns"] == 2
        assert run["passed_turns"] == {"passed": 2, "failed": 1, "error": 1}[run["status"]], run
