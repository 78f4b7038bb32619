"""Scenario runs end to end: the API (in-process, real HTTP semantics), a real ``spar
worker`` process on Redis, loopback fakes for the agent and the judge."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from shared.db.models import CriterionResult, ScenarioRun, TurnResult
from shared.metrics import RUN_STATUSES
from shared.queue import RUN_SCENARIO, get_broker, send
from shared.settings import Settings
from tests.support import metrics
from tests.support.batches import create_batch, get_batch, make_scenario, make_world
from tests.support.calibration import EXAMPLES
from tests.support.factories import tenant
from tests.support.fakes import FakeAgent, FakeOpenAI, FakeSimulator, verdict_from_marker
from tests.support.otlp import OTLPReceiver
from tests.support.processes import free_port, spar_process, suite_env
from tests.support.scenario_setup import (
    create_judge_provider,
    create_scenario,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

pytestmark = pytest.mark.slow

HEARTBEATS = "dramatiq:__heartbeats__"  # the worker processes fetching, by Dramatiq's id
VERDICT = json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "ok"})


@pytest.fixture
def worker_env(database_url, settings):
    return suite_env(database_url, settings, SPAR_LOG_LEVEL="WARNING")


async def _setup(client, agent_url: str, judge_url: str, turns: int = 2):
    t = await tenant(client)
    h, org = t.owner.headers, t.id
    domain = await client.post(
        f"/v1/orgs/{org}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=h
    )
    assert domain.status_code == 201, domain.text
    provider = await client.post(
        f"/v1/orgs/{org}/llm-providers",
        json={
            "name": "judge",
            "provider": "openai_compatible",
            "base_url": judge_url,
            "default_model": "judge-1",
            "is_default_judge": True,
        },
        headers=h,
    )
    assert provider.status_code == 201, provider.text
    agent = await client.post(
        f"/v1/orgs/{org}/agents",
        json={"name": "bot", "kind": "http", "endpoint_url": agent_url},
        headers=h,
    )
    assert agent.status_code == 201, agent.text
    scenario = await client.post(
        f"/v1/orgs/{org}/scenarios",
        json={
            "name": "greeting",
            "turns": [
                {
                    "user_message": f"message {n}",
                    "criteria": [
                        {"question": "Is it polite?"},
                        {"question": f"message {n}", "criteria_type": "contains"},
                    ],
                }
                for n in range(turns)
            ],
        },
        headers=h,
    )
    assert scenario.status_code == 201, scenario.text
    return t, agent.json()["id"], scenario.json()["id"]


async def _poll(client, t, run_id: str, *, until, within: float = 30.0) -> dict:
    deadline = time.monotonic() + within
    while True:
        run = (
            await client.get(f"/v1/orgs/{t.id}/scenarios/runs/{run_id}", headers=t.owner.headers)
        ).json()
        if until(run):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run did not reach the expected state: {run}")
        await asyncio.sleep(0.1)


async def _started_and_one_turn_in(client, t, scenario_id: str, agent_id: str) -> str:
    """A run of the scenario started, once its first turn is committed: its id."""
    started = await client.post(
        f"/v1/orgs/{t.id}/scenarios/{scenario_id}/run",
        json={"agent_id": agent_id},
        headers=t.owner.headers,
    )
    run_id = started.json()["id"]
    await _poll(client, t, run_id, until=lambda r: len(r["turn_results"]) >= 1)
    return run_id


async def _result_counts(db, run_id: str) -> tuple[int, int, int]:
    turns = await db.scalar(
        select(func.count()).select_from(TurnResult).where(TurnResult.run_id == run_id)
    )
    distinct = await db.scalar(
        select(func.count(func.distinct(TurnResult.turn_index))).where(TurnResult.run_id == run_id)
    )
    criteria = await db.scalar(
        select(func.count())
        .select_from(CriterionResult)
        .join(TurnResult, TurnResult.id == CriterionResult.turn_result_id)
        .where(TurnResult.run_id == run_id)
    )
    return turns, distinct, criteria


async def test_a_worker_process_runs_a_scenario_to_passed_and_exports_its_trace(
    client, db, worker_env, tmp_path: Path
):
    with (
        FakeAgent(reply=lambda body: f"Sure: {body['message']}") as agent,
        FakeOpenAI(reply=VERDICT) as judge,
        OTLPReceiver() as collector,
        spar_process(
            ["worker", "--processes", "1", "--threads", "4", "--queues", "runs"],
            # Traces on, as an operator turns them on (docs/operations.md, "Traces").
            {**worker_env, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url},
            cwd=tmp_path,
        ),
    ):
        t, agent_id, scenario_id = await _setup(client, agent.url, judge.url)
        started = await client.post(
            f"/v1/orgs/{t.id}/scenarios/{scenario_id}/run",
            json={"agent_id": agent_id},
            headers=t.owner.headers,
        )
        assert started.status_code == 201, started.text
        assert started.json()["status"] == "pending"
        run = await _poll(
            client,
            t,
            started.json()["id"],
            until=lambda r: r["status"] in {"passed", "failed", "error"},
        )
    assert run["status"] == "passed", run
    assert [turn["response_content"] for turn in run["turn_results"]] == [
        "Sure: message 0",
        "Sure: message 1",
    ]
    assert all(len(turn["criteria_results"]) == 2 for turn in run["turn_results"])
    assert run["cost_summary"]["agent"]["calls"] == 2
    assert run["cost_summary"]["judge"]["calls"] == 2
    assert len(agent.requests) == 2
    assert await _result_counts(db, run["id"]) == (2, 2, 4)
    # Its spans, exported by the worker process as it stopped (SIGTERM): the run's trace.
    spans = collector.spans()
    assert {span.trace_id for span in spans} == {run["trace_id"]}
    assert {span.resource["service.name"] for span in spans} == {"spar-worker"}
    assert sorted(span.name for span in spans) == [
        "chat judge-1",
        "chat judge-1",
        "invoke_agent bot",
        "invoke_agent bot",
        "scenario_run greeting",
        "turn 0",
        "turn 1",
    ]


async def test_the_same_message_delivered_twice_runs_once(
    client, db, app, worker_env, tmp_path: Path
):
    with (
        FakeAgent(reply=lambda body: (time.sleep(0.3), f"ok {body['message']}")[1]) as agent,
        FakeOpenAI(reply=VERDICT) as judge,
        spar_process(
            ["worker", "--processes", "2", "--threads", "4", "--queues", "runs"],
            worker_env,
            cwd=tmp_path,
        ),
    ):
        t, agent_id, scenario_id = await _setup(client, agent.url, judge.url, turns=3)
        started = await client.post(
            f"/v1/orgs/{t.id}/scenarios/{scenario_id}/run",
            json={"agent_id": agent_id},
            headers=t.owner.headers,
        )
        run_id = started.json()["id"]
        # At-least-once delivery: the same message again, while the first is being worked on.
        send(app.state.broker, RUN_SCENARIO, run_id)
        run = await _poll(
            client, t, run_id, until=lambda r: r["status"] in {"passed", "failed", "error"}
        )
        await asyncio.sleep(1.0)  # let a late duplicate finish whatever it would do
    assert run["status"] == "passed", run
    assert await _result_counts(db, run_id) == (3, 3, 6)
    again = (
        await client.get(f"/v1/orgs/{t.id}/scenarios/runs/{run_id}", headers=t.owner.headers)
    ).json()
    assert again["completed_at"] == run["completed_at"]


async def test_a_worker_killed_mid_run_is_resumed_by_the_next(
    client, db, app, worker_env, tmp_path: Path
):
    worker_args = ["worker", "--processes", "1", "--threads", "2", "--queues", "runs"]
    # The dead worker's heartbeat must go stale before another may take its run: 3 s here.
    worker_env = {**worker_env, "SPAR_RUN_HEARTBEAT_TIMEOUT_S": "3"}
    with (
        FakeAgent(reply=lambda body: (time.sleep(0.6), f"ok {body['message']}")[1]) as agent,
        FakeOpenAI(reply=VERDICT) as judge,
    ):
        t, agent_id, scenario_id = await _setup(client, agent.url, judge.url, turns=4)
        with spar_process(worker_args, worker_env, cwd=tmp_path) as worker:
            run_id = await _started_and_one_turn_in(client, t, scenario_id, agent_id)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        crashed = (
            await client.get(f"/v1/orgs/{t.id}/scenarios/runs/{run_id}", headers=t.owner.headers)
        ).json()
        assert crashed["status"] == "running"
        committed = len(crashed["turn_results"])
        assert 1 <= committed < 4
        with spar_process(worker_args, worker_env, cwd=tmp_path):
            # The killed worker never acknowledged the message: the broker hands it out again
            # after its heartbeat times out, and the scheduler's sweeper re-enqueues a run
            # whose heartbeat stopped.  Either way it is the same message again, once the
            # heartbeat is stale: send it as they would.
            await asyncio.sleep(3.5)
            broker = get_broker(Settings(redis_url=worker_env["SPAR_REDIS_URL"]))
            send(broker, RUN_SCENARIO, run_id)
            run = await _poll(
                client, t, run_id, until=lambda r: r["status"] in {"passed", "failed", "error"}
            )
    assert run["status"] == "passed", run
    assert await _result_counts(db, run_id) == (4, 4, 8)
    # The resumed worker replayed nothing already committed: each turn's message reached the
    # agent once, except possibly the one in flight when the worker died.
    messages = [request.json["message"] for request in agent.requests]
    assert sorted(set(messages)) == [f"message {n}" for n in range(4)]
    assert len(messages) <= 5
    resumed = [r.json for r in agent.requests if r.json["message"] == "message 3"][-1]
    assert [m["content"] for m in resumed["messages"] if m["role"] == "user"] == [
        f"message {n}" for n in range(4)
    ]


async def test_a_worker_killed_mid_simulation_resumes_the_conversation_where_it_was(
    client, db, worker_env, tmp_path: Path
):
    """A simulated conversation (DESIGN §5.9) whose worker is killed with SIGKILL goes on
    in the next worker from its committed turns: no committed message is written again,
    none reaches the agent twice; only the turn in flight at the kill may be asked of the
    simulator (and sent to the agent) again."""
    worker_args = ["worker", "--processes", "1", "--threads", "2", "--queues", "runs"]
    worker_env = {**worker_env, "SPAR_RUN_HEARTBEAT_TIMEOUT_S": "3"}
    with (
        FakeAgent(reply=lambda body: (time.sleep(0.6), f"ok {body['message']}")[1]) as agent,
        FakeSimulator(done_at=5) as simulator,
    ):
        t = await tenant(client)
        out = await outbound_setup(client, t, agent.url)
        await create_judge_provider(
            client, t, simulator.url, is_default_judge=False, is_default_simulator=True
        )
        scenario = await create_scenario(
            client,
            t,
            turns=[turn("I want to move my booking")],
            simulation={"persona": "a traveller", "goal": "move the booking", "max_turns": 8},
        )
        with spar_process(worker_args, worker_env, cwd=tmp_path) as worker:
            run_id = (await start_run(client, t, scenario["id"], out.agent_id))["id"]
            await _poll(client, t, run_id, until=lambda r: len(r["turn_results"]) >= 2)
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        crashed = await get_run(client, t, run_id)
        assert crashed["status"] == "running"
        committed = len(crashed["turn_results"])
        assert 2 <= committed < 5
        with spar_process(worker_args, worker_env, cwd=tmp_path):
            await asyncio.sleep(3.5)  # the dead worker's heartbeat goes stale
            broker = get_broker(Settings(redis_url=worker_env["SPAR_REDIS_URL"]))
            send(broker, RUN_SCENARIO, run_id)
            run = await _poll(
                client, t, run_id, until=lambda r: r["status"] in {"passed", "failed", "error"}
            )
    assert (run["status"], run["simulation_outcome"]) == ("passed", "goal_reached"), run
    assert run["turn_results"][:committed] == crashed["turn_results"], "nothing rewritten"
    assert [r["user_message"] for r in run["turn_results"]] == [
        "I want to move my booking",
        *(f"customer message {n}" for n in range(1, 5)),
    ]
    assert await _result_counts(db, run_id) == (5, 5, 0)
    # The simulator was asked once for each turn and for its done answer, except perhaps
    # for the turn in flight at the kill (exchange ``committed``: not committed then).
    asked = simulator.asked_per_exchange()
    assert set(asked) == {1, 2, 3, 4, 5}
    assert all(n == 1 for exchange, n in asked.items() if exchange != committed), asked
    assert asked[committed] <= 2
    # Each message reached the agent once, but the one in flight at the kill.
    sent = Counter(request.json["message"] for request in agent.requests)
    in_flight = f"customer message {committed}"
    assert set(sent) == {r["user_message"] for r in run["turn_results"]}
    assert all(n == 1 for message, n in sent.items() if message != in_flight), sent
    assert sent[in_flight] <= 2


async def test_calibrate_answers_200_with_the_metrics_a_worker_judged_while_it_waited(
    client, worker_env, tmp_path: Path
):
    with (
        FakeAgent() as agent,
        FakeOpenAI(reply=verdict_from_marker) as judge,
        spar_process(
            ["worker", "--processes", "1", "--threads", "2", "--queues", "calibration"],
            worker_env,
            cwd=tmp_path,
        ),
    ):
        t, agent_id, _ = await _setup(client, agent.url, judge.url)
        response = await client.post(
            f"/v1/orgs/{t.id}/scenarios/calibrate?agent_id={agent_id}",
            json={"examples": EXAMPLES},
            headers=t.owner.headers,
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert (body["total"], body["agreements"], body["undecided"]) == (6, 3, 1)
    assert len(body["results"]) == 6


def test_a_sigterm_to_the_whole_process_group_stops_the_worker_gracefully(
    worker_env, tmp_path: Path
):
    """systemd's default stop (and ``kill -- -PGID``) signals every process of the group:
    each worker process gets the SIGTERM twice, from the sender and from Dramatiq's main
    process, and must still stop gracefully, not hang until SIGKILL."""
    with spar_process(
        ["worker", "--processes", "1", "--threads", "2", "--queues", "runs"],
        {**worker_env, "SPAR_LOG_LEVEL": "INFO"},
        cwd=tmp_path,
    ) as worker:
        log = next(tmp_path.glob("spar-worker-*.log"))
        deadline = time.monotonic() + 30
        while "ready for action" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        os.killpg(worker.pid, signal.SIGTERM)
        assert worker.wait(timeout=10) == 0, log.read_text()
    text = log.read_text()
    assert "Worker has been shut down" in text and "Killing worker process" not in text


class _Concurrency:
    """An agent that holds each request until ``together`` have been in progress at once
    (at most ``wait_s``), and counts the most in progress at once."""

    def __init__(self, together: int, wait_s: float) -> None:
        self.together = together
        self.wait_s = wait_s
        self.now = 0
        self.most = 0
        self._changed = threading.Condition()

    def reply(self, body: dict) -> str:
        with self._changed:
            self.now += 1
            self.most = max(self.most, self.now)
            self._changed.notify_all()
            self._changed.wait_for(lambda: self.most >= self.together, timeout=self.wait_s)
        with self._changed:
            self.now -= 1
        return f"ok {body['message']}"


async def test_a_worker_plays_more_runs_at_once_than_it_has_threads_up_to_its_bound(
    client, worker_env, tmp_path: Path
):
    """A run waits on its agent on the worker's event loop, not on a worker thread: one
    thread carries as many conversations as ``--runs-in-flight`` allows, and no more."""
    agent_calls = _Concurrency(together=8, wait_s=10.0)
    with (
        FakeAgent(reply=agent_calls.reply) as agent,
        FakeOpenAI(reply=VERDICT) as judge,
    ):
        t, agent_id, scenario_id = await _setup(client, agent.url, judge.url, turns=1)
        run_ids = []
        for _ in range(12):
            started = await client.post(
                f"/v1/orgs/{t.id}/scenarios/{scenario_id}/run",
                json={"agent_id": agent_id},
                headers=t.owner.headers,
            )
            assert started.status_code == 201, started.text
            run_ids.append(started.json()["id"])
        worker_args = ["worker", "--processes", "1", "--threads", "1", "--queues", "runs"]
        with spar_process([*worker_args, "--runs-in-flight", "8"], worker_env, cwd=tmp_path):
            runs = [
                await _poll(client, t, run_id, until=lambda r: r["status"] == "passed")
                for run_id in run_ids
            ]
    assert len(runs) == 12
    # Eight at once on one thread (and never nine): the bound is --runs-in-flight.
    assert agent_calls.most == 8, agent_calls.most
    assert len(agent.requests) == 12


async def test_a_full_worker_leaves_the_runs_it_has_no_room_for_to_another(
    client, worker_env, tmp_path: Path
):
    """A worker playing its ``--runs-in-flight`` takes no more run messages: a third run
    waits in the queue for a second worker, not in the first one's hands until one of its
    runs ends (here 20 s: its agent holds every call until three are in progress)."""
    agent_calls = _Concurrency(together=3, wait_s=20.0)
    with (
        FakeAgent(reply=agent_calls.reply) as agent,
        FakeOpenAI(reply=VERDICT) as judge,
    ):
        t, agent_id, scenario_id = await _setup(client, agent.url, judge.url, turns=1)
        run_ids = [(await start_run(client, t, scenario_id, agent_id))["id"] for _ in range(3)]
        worker_args = ["worker", "--processes", "1", "--threads", "1", "--queues", "runs"]
        worker_args += ["--runs-in-flight", "2"]
        with spar_process(worker_args, worker_env, cwd=tmp_path):
            deadline = time.monotonic() + 30
            while agent_calls.now < 2:  # the first worker is full
                assert time.monotonic() < deadline, "the first worker never played two runs"
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # it looks for messages every 10 ms meanwhile
            with spar_process(worker_args, worker_env, cwd=tmp_path):
                runs = [
                    await _poll(client, t, run_id, until=lambda r: r["status"] == "passed")
                    for run_id in run_ids
                ]
    assert [r["status"] for r in runs] == ["passed"] * 3
    assert agent_calls.most == 3, agent_calls.most  # the third was played beside the two


async def _spread_batch(client, agent: FakeAgent, scenarios: int, window: int):
    """A world with ``scenarios`` one-turn scenarios (a deterministic check each) and a
    batch of them all at ``window`` runs at a time: (world, batch id)."""
    w = await make_world(client, agent)
    for n in range(scenarios):
        await make_scenario(client, w, f"spread {n:02d}", tags=["spread"])
    batch = await create_batch(client, w, tags=["spread"], max_concurrency=window)
    assert batch["total_scenarios"] == scenarios
    return w, batch["id"]


async def _batch_done(client, w, batch_id: str, within: float = 60.0, *, at_least: int = 0):
    """The batch once it has ``at_least`` runs done, or has ended."""
    deadline = time.monotonic() + within
    while True:
        batch = await get_batch(client, w, batch_id)
        done = batch["completed_scenarios"]
        if (done >= at_least > 0) or batch["status"] in {"completed", "error", "cancelled"}:
            return batch
        assert time.monotonic() < deadline, {k: v for k, v in batch.items() if k != "runs"}
        await asyncio.sleep(0.05)


async def test_a_worker_starts_every_other_successor_of_a_batch_itself_without_a_message(
    client, settings: Settings, worker_env, tmp_path: Path
):
    """Six runs one at a time on one worker: the first is sent by the batch's dispatch,
    and of the five that each took its predecessor's place, the second, fourth and sixth
    run start where their predecessor ended, with no message on the ``runs`` queue."""
    broker = get_broker(settings)
    announced = broker.client.pubsub()
    announced.subscribe(broker.wake_channel(RUN_SCENARIO[0]))
    try:
        with FakeAgent(reply=lambda body: f"hello {body['message']}") as agent:
            w, batch_id = await _spread_batch(client, agent, scenarios=6, window=1)
            worker_args = ["worker", "--processes", "1", "--threads", "2"]
            with spar_process([*worker_args, "--queues", "runs,batches"], worker_env, cwd=tmp_path):
                batch = await _batch_done(client, w, batch_id)
        assert batch["status"] == "completed" and batch["passed_scenarios"] == 6, batch
        assert len(agent.requests) == 6
        messages = 0
        while (message := announced.get_message(timeout=0.5)) is not None:
            messages += message["type"] == "message"
    finally:
        announced.close()
    assert messages == 3, messages  # six before: one per run


async def test_a_worker_that_joins_mid_batch_plays_a_share_of_it(
    client, settings: Settings, worker_env, tmp_path: Path
):
    """A second worker started once the first has played a batch's first window gets part
    of the rest: a process keeps only half of the successors its runs make, and the other
    half go to whichever process fetches them.  Here 96 runs, 6 at a time, each about
    0.3 s at its agent, which holds every answer from the first window's end until the
    second worker fetches; the runs each worker finished, as its metrics count them."""
    worker_args = ["worker", "--processes", "1", "--threads", "2", "--queues", "runs,batches"]
    first_port, second_port = free_port(), free_port()
    open_gate = threading.Event()
    open_gate.set()

    def reply(body: dict) -> str:
        assert open_gate.wait(60)
        time.sleep(0.3)
        return f"hello {body['message']}"

    redis = get_broker(settings).client
    with FakeAgent(reply=reply) as agent:
        w, batch_id = await _spread_batch(client, agent, scenarios=96, window=6)
        with spar_process(
            [*worker_args, "--metrics-port", str(first_port)], worker_env, cwd=tmp_path
        ):
            await _batch_done(client, w, batch_id, at_least=6)
            open_gate.clear()
            fetching = set(redis.zrange(HEARTBEATS, 0, -1))  # the first worker's, at least
            with spar_process(
                [*worker_args, "--metrics-port", str(second_port)], worker_env, cwd=tmp_path
            ):
                deadline = time.monotonic() + 60
                while not set(redis.zrange(HEARTBEATS, 0, -1)) - fetching:
                    assert time.monotonic() < deadline, "the second worker never fetched"
                    await asyncio.sleep(0.05)
                left = 96 - (await get_batch(client, w, batch_id))["completed_scenarios"]
                open_gate.set()
                batch = await _batch_done(client, w, batch_id)
                played = [await _runs_finished(port) for port in (first_port, second_port)]
    assert batch["status"] == "completed" and batch["passed_scenarios"] == 96, batch
    print(f"\nruns finished by the first worker, the second: {played}; {left} left as it joined")
    assert sum(played) == 96, played
    # With every successor kept where it was made, the second would play none of them.
    assert left >= 72 and played[1] >= left / 8, (played, left)


async def _runs_finished(port: int, within: float = 30.0) -> float:
    """The runs a worker finished, from its metrics port (waiting for it to answer)."""
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + within
    while True:
        try:
            found = await asyncio.to_thread(metrics.scrape, url)
        except httpx.ConnectError:
            assert time.monotonic() < deadline, f"nothing answers on {url}"
            await asyncio.sleep(0.1)
            continue
        return sum(found.value("spar_runs_finished_total", status=s) or 0 for s in RUN_STATUSES)


async def test_a_stopping_worker_hands_its_runs_in_flight_to_the_next_at_once(
    client, db, worker_env, tmp_path: Path
):
    """SIGTERM while a long run is in flight: the worker waits ``SPAR_WORKER_DRAIN_S`` for
    it, then releases its claim and sends it again, and exits cleanly.  The next worker
    resumes it from its last committed turn at once: no heartbeat to wait out (two minutes
    here), no sweeper (none runs)."""
    worker_args = ["worker", "--processes", "1", "--threads", "2", "--queues", "runs"]
    worker_env = {**worker_env, "SPAR_RUN_HEARTBEAT_TIMEOUT_S": "120"}
    stopping = {**worker_env, "SPAR_WORKER_DRAIN_S": "1", "SPAR_LOG_LEVEL": "INFO"}
    with (
        FakeAgent(reply=lambda body: (time.sleep(0.5), f"ok {body['message']}")[1]) as agent,
        FakeOpenAI(reply=VERDICT) as judge,
    ):
        t, agent_id, scenario_id = await _setup(client, agent.url, judge.url, turns=8)
        with spar_process(worker_args, stopping, cwd=tmp_path) as worker:
            run_id = await _started_and_one_turn_in(client, t, scenario_id, agent_id)
            stopped_at = time.monotonic()
            os.killpg(worker.pid, signal.SIGTERM)
            assert worker.wait(timeout=15) == 0
            took = time.monotonic() - stopped_at
        handed = await _claim_of(db, run_id)
        assert handed[:2] == ("running", None), handed
        committed = (await _result_counts(db, run_id))[0]
        assert 1 <= committed < 8
        log = await asyncio.to_thread(_worker_logs, tmp_path)
        assert "handing them to other workers" in log, log
        resumed_at = time.monotonic()
        with spar_process(worker_args, worker_env, cwd=tmp_path):
            run = await _poll(
                client, t, run_id, until=lambda r: r["status"] != "running", within=60
            )
        resumed_in = time.monotonic() - resumed_at
    assert run["status"] == "passed", run
    assert (await _claim_of(db, run_id))[2] == 2  # two deliveries: the stopped one, the next
    assert await _result_counts(db, run_id) == (8, 8, 16)
    # The turn in flight at the stop may have reached the agent twice; no other did.
    messages = Counter(request.json["message"] for request in agent.requests)
    assert sorted(messages) == [f"message {n}" for n in range(8)]
    assert sum(messages.values()) <= 9, messages
    print(f"\nstopped in {took:.1f} s; resumed and finished in {resumed_in:.1f} s")


def _worker_logs(directory: Path) -> str:
    return "\n".join(path.read_text() for path in directory.glob("spar-worker-*.log"))


async def _claim_of(db, run_id: str) -> tuple[str, object, int]:
    """The run's status, heartbeat and deliveries counted, as stored."""
    row = (
        await db.execute(
            select(ScenarioRun.status, ScenarioRun.heartbeat_at, ScenarioRun.attempts).where(
                ScenarioRun.id == run_id
            )
        )
    ).one()
    await db.commit()
    return tuple(row)
