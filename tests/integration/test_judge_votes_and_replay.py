"""Judge votes and replay (DESIGN §5.11): a batch's ``judge_repetitions`` votes on each
LLM-judged criterion, kept by majority (a tie fails), with its votes and the batch's judge
flip rate; and a replay, a batch that re-judges another's stored conversations with the
scenarios' current criteria, calling neither the agent nor the simulated user.

The judge (:class:`VoteQuota`) passes exactly p of every n calls on a prompt carrying
``[judge:votes p/n]``, whatever order concurrent votes arrive in, so votes are exact; the
agent echoes the user message; every fake counts the requests it received."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.batches.window import dispatch_committed
from shared.calibration import trust
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import drain
from tests.support.factories import Tenant, member_holding, single_validation_entry, tenant
from tests.support.fakes import (
    FakeAgent,
    FakeOpenAI,
    FakeSimulator,
    VoteQuota,
    verdict_from_marker,
)
from tests.support.scenario_setup import (
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    scenario_body,
    start_run,
    turn,
)


@pytest.fixture
def votes() -> VoteQuota:
    return VoteQuota()


@pytest.fixture
def judge(votes: VoteQuota) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=votes) as fake:
        yield fake


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Echo: {body['message']}") as fake:
        yield fake


def batches(t: Tenant) -> str:
    return f"/v1/orgs/{t.id}/scenarios/batch-runs"


async def play(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    agent_id: str,
    tag: str,
    **body: Any,
) -> dict[str, Any]:
    made = await client.post(
        f"{batches(t)}/",
        json={"agent_id": agent_id, "tags": [tag], **body},
        headers=t.owner.headers,
    )
    assert made.status_code == 201, made.text
    await drain(app, settings, made.json()["id"])
    return await read(client, t, made.json()["id"])


async def read(client: AsyncTestClient, t: Tenant, batch_id: str) -> dict[str, Any]:
    response = await client.get(f"{batches(t)}/{batch_id}", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def runs_by_scenario(
    client: AsyncTestClient, t: Tenant, batch: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    return {run["scenario_name"]: await get_run(client, t, run["id"]) for run in batch["runs"]}


def only_result(run: dict[str, Any]) -> dict[str, Any]:
    (turn_result,) = run["turn_results"]
    (result,) = turn_result["criteria_results"]
    return result


async def test_each_judged_criterion_is_decided_by_the_majority_of_its_votes(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    votes: VoteQuota,
) -> None:
    """Three votes each: 2-1 passes, 3-0 passes, 1-2 on the whole conversation fails; a
    check has no votes; two of the three judged results were split: flip rate 2/3.  Every
    vote is paid for, and the stored critique is a vote agreeing with the majority."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    await create_scenario(
        client,
        t,
        name="split",
        tags=["v"],
        turns=[turn("hi", criterion("Polite? [judge:votes 2/3]"))],
    )
    await create_scenario(
        client,
        t,
        name="unanimous",
        tags=["v"],
        turns=[turn("hi", criterion("Helpful? [judge:votes 3/3]"), criterion("Echo", "contains"))],
    )
    await create_scenario(
        client,
        t,
        name="conversation",
        tags=["v"],
        turns=[turn("hi", criterion("Echo", "contains"))],
        conversation_criteria=[criterion("Resolved? [judge:votes 1/3]")],
    )
    batch = await play(client, app, settings, t, setup.agent_id, "v", judge_repetitions=3)
    assert (batch["status"], batch["judge_repetitions"], batch["replay_of"]) == (
        "completed",
        3,
        None,
    )
    assert batch["judge_flip_rate"] == pytest.approx(2 / 3)
    assert (batch["passed_scenarios"], batch["failed_scenarios"]) == (2, 1)
    assert votes.calls == {"[judge:votes 2/3]": 3, "[judge:votes 3/3]": 3, "[judge:votes 1/3]": 3}

    runs = await runs_by_scenario(client, t, batch)
    split = only_result(runs["split"])
    assert (split["verdict"], split["votes"]) == ("PASS", {"PASS": 2, "FAIL": 1})
    assert split["critique"].endswith(": PASS") and split["evidence"] == "PASS"
    # Tokens of all three votes (the fake judge's usage: 11 in, 7 out per call).
    assert (split["input_tokens"], split["output_tokens"]) == (33, 21)
    judge_cost = runs["split"]["cost_summary"]["judge"]
    assert (judge_cost["calls"], judge_cost["input_tokens"]) == (3, 33)
    assert runs["split"]["judge_repetitions"] == 3

    helpful, echo = runs["unanimous"]["turn_results"][0]["criteria_results"]
    assert (helpful["verdict"], helpful["votes"]) == ("PASS", {"PASS": 3, "FAIL": 0})
    assert (echo["verdict"], echo["votes"]) == ("PASS", None)

    (resolved,) = runs["conversation"]["conversation_results"]
    assert (resolved["verdict"], resolved["votes"]) == ("FAIL", {"PASS": 1, "FAIL": 2})
    assert resolved["critique"].endswith(": FAIL")
    assert runs["conversation"]["status"] == "failed"

    listed = await client.get(f"{batches(t)}/", headers=t.owner.headers)
    (summary,) = listed.json()["batch_runs"]
    assert summary["judge_repetitions"] == 3 and "judge_flip_rate" not in summary


async def test_a_tie_fails_judge_trust_reads_the_majority_and_a_single_run_votes_once(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(
        client,
        t,
        name="tie",
        tags=["tie"],
        turns=[turn("hi", criterion("Polite? [judge:votes 1/2]"))],
    )
    batch = await play(client, app, settings, t, setup.agent_id, "tie", judge_repetitions=2)
    (run,) = (await runs_by_scenario(client, t, batch)).values()
    result = only_result(run)
    assert (result["verdict"], result["votes"]) == ("FAIL", {"PASS": 1, "FAIL": 1})
    assert result["critique"].endswith(": FAIL")
    assert (run["status"], batch["judge_flip_rate"]) == ("failed", 1.0)

    # Judge trust counts the stored verdict, the majority: 0 of 1 passed, not 1 of 2 votes.
    await trust.compute(app.state.database, UUID(batch["id"]))
    (polite,) = (await read(client, t, batch["id"]))["judge_trust"]["uncalibrated"]
    assert (polite["judged"], polite["passed"]) == (1, 0)

    # A single run is judged once; its one vote is still reported.
    single = await start_run(client, t, scenario["id"], setup.agent_id)
    await execute_run(app.state.database, settings, UUID(single["id"]))
    single = await get_run(client, t, single["id"])
    assert single["judge_repetitions"] == 1
    assert only_result(single)["votes"] in ({"PASS": 1, "FAIL": 0}, {"PASS": 0, "FAIL": 1})

    once = await play(client, app, settings, t, setup.agent_id, "tie")
    assert (once["judge_repetitions"], once["judge_flip_rate"]) == (1, None)


@pytest.mark.parametrize("value", [0, 6, "x"])
async def test_judge_repetitions_out_of_range_is_refused(
    client: AsyncTestClient, agent: FakeAgent, value: Any
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, tags=["a"])
    response = await client.post(
        f"{batches(t)}/",
        json={"agent_id": setup.agent_id, "tags": ["a"], "judge_repetitions": value},
        headers=t.owner.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "judge_repetitions"] and entry["input"] == value
    listed = await client.get(f"{batches(t)}/", headers=t.owner.headers)
    assert listed.json()["total"] == 0


async def test_a_replay_rejudges_the_stored_conversations_without_calling_anyone(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    """A new criterion wording judged on last batch's replies, the simulated turns as they
    were, a scenario that gained a turn and a deleted one in error: the agent and the
    simulator receive nothing."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    with FakeSimulator() as simulator:
        await create_judge_provider(
            client,
            t,
            simulator.url,
            name="simulator",
            is_default_judge=False,
            is_default_simulator=True,
        )
        reworded = await create_scenario(
            client,
            t,
            name="reworded",
            tags=["r"],
            turns=[turn("hi", criterion("Polite? [judge:PASS]"))],
        )
        simulated = await create_scenario(
            client,
            t,
            name="simulated",
            tags=["r"],
            turns=[turn("hi", criterion("Echo", "contains"))],
            simulation={"persona": "a customer", "goal": "get help", "max_turns": 2},
            conversation_criteria=[criterion("Resolved? [judge:PASS]")],
        )
        grown = await create_scenario(client, t, name="grown", tags=["r"])
        deleted = await create_scenario(client, t, name="deleted", tags=["r"])
        source = await play(client, app, settings, t, setup.agent_id, "r", repetitions=2)
        assert (source["status"], source["passed_scenarios"]) == ("completed", 8)
        sim_requests = len(simulator.requests)
        assert sim_requests == 2 * 2  # two simulated turns each (max_turns)

        # Today's scenarios: a new wording the judge fails, a new turn, one deleted.
        put = await client.put(
            f"/v1/orgs/{t.id}/scenarios/{reworded['id']}",
            json=scenario_body(
                "reworded", tags=["r"], turns=[turn("hi", criterion("Polite now?"))]
            ),
            headers=t.owner.headers,
        )
        assert put.status_code == 200, put.text
        put = await client.put(
            f"/v1/orgs/{t.id}/scenarios/{grown['id']}",
            json=scenario_body(
                "grown",
                tags=["r"],
                turns=[turn("hello", criterion("hello", "contains"))] * 2,
            ),
            headers=t.owner.headers,
        )
        assert put.status_code == 200, put.text
        gone = await client.delete(
            f"/v1/orgs/{t.id}/scenarios/{deleted['id']}", headers=t.owner.headers
        )
        assert gone.status_code == 204, gone.text

        agent_requests, judge_requests = len(agent.requests), len(judge.requests)
        made = await client.post(f"{batches(t)}/{source['id']}/replay", headers=t.owner.headers)
        assert made.status_code == 201, made.text
        replay = made.json()
        assert (replay["replay_of"], replay["agent_id"], replay["status"]) == (
            source["id"],
            setup.agent_id,
            "queued",
        )
        assert (replay["total_scenarios"], replay["repetitions"]) == (8, 2)
        await drain(app, settings, replay["id"])
        assert len(agent.requests) == agent_requests
        assert len(simulator.requests) == sim_requests
        # Judged: each reworded reply once, each simulated conversation once.
        assert len(judge.requests) - judge_requests == 4

    replay = await read(client, t, replay["id"])
    assert replay["status"] == "completed"
    assert (replay["passed_scenarios"], replay["failed_scenarios"], replay["error_scenarios"]) == (
        2,
        2,
        4,
    )
    assert (await read(client, t, source["id"]))["replays"] == [replay["id"]]
    source_runs = {run["id"] for run in source["runs"]}
    for item in replay["runs"]:
        run = await get_run(client, t, item["id"])
        assert run["replay_of_run_id"] in source_runs
        assert run["cost_summary"].get("agent", {"calls": 0})["calls"] == 0
        name = item["scenario_name"]
        if name == "reworded":
            result = only_result(run)
            assert (run["status"], result["verdict"]) == ("failed", "FAIL")
            assert result["question"] == "Polite now?"
            assert run["turn_results"][0]["response_content"] == "Echo: hi"
        elif name == "simulated":
            assert run["status"] == "passed"
            assert [r["source"] for r in run["turn_results"]] == ["scripted", *["simulated"] * 2]
            assert run["simulation_outcome"] == "max_turns"
            original = await get_run(client, t, run["replay_of_run_id"])
            assert [r["user_message"] for r in run["turn_results"]] == [
                r["user_message"] for r in original["turn_results"]
            ]
        elif name == "grown":
            assert run["status"] == "error"
            assert run["error_message"] == (
                f"scenario changed: it has 2 scripted turns now, 1 when run "
                f"{run['replay_of_run_id']} played it"
            )
        else:
            assert name == "deleted" and run["status"] == "error"
            assert run["error_message"].startswith(
                f"scenario changed: scenario {deleted['id']} was deleted"
            )
    assert simulated["id"]


async def test_an_interrupted_replay_run_resumes_from_the_stored_conversation(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    """A replay's run stopped while its second turn is judged resumes there: the first
    turn is neither written nor judged again, and the agent is never called."""
    hold, released = threading.Event(), threading.Event()

    def verdict(body: dict[str, Any]) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
        if "[hold]" in prompt and hold.is_set():
            released.wait(10)
        return verdict_from_marker(body)

    with FakeOpenAI(reply=verdict) as judge:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url, judge.url)
        turns = [
            turn("first", criterion("Good? [judge:PASS]")),
            turn("second", criterion("Still good? [hold] [judge:PASS]")),
        ]
        await create_scenario(client, t, name="two", tags=["two"], turns=turns)
        source = await play(client, app, settings, t, setup.agent_id, "two")
        assert source["passed_scenarios"] == 1
        asked = len(agent.requests)
        hold.set()
        made = await client.post(f"{batches(t)}/{source['id']}/replay", headers=t.owner.headers)
        assert made.status_code == 201, made.text
        database = app.state.database
        (run_id,) = await dispatch_committed(database, UUID(made.json()["id"]))
        task = asyncio.create_task(execute_run(database, settings, run_id))
        try:
            await judge.requests_received(len(judge.requests) + 2, wait_s=10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            hold.clear()
            released.set()
        interrupted = await get_run(client, t, str(run_id))
        assert interrupted["status"] == "running"
        assert [r["turn_index"] for r in interrupted["turn_results"]] == [0]
        judged = len(judge.requests)

        await execute_run(database, settings, run_id)
        done = await get_run(client, t, str(run_id))
        assert done["status"] == "passed", done
        assert [r["response_content"] for r in done["turn_results"]] == [
            "Echo: first",
            "Echo: second",
        ]
        assert done["turn_results"][0] == interrupted["turn_results"][0]
        assert len(judge.requests) == judged + 1  # the second turn only
        assert len(agent.requests) == asked
        assert (await read(client, t, made.json()["id"]))["passed_scenarios"] == 1


async def test_a_replay_is_of_a_completed_batch_of_the_organization_by_who_may_run(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t, other = await tenant(client), await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, tags=["a"])
    queued = await client.post(
        f"{batches(t)}/", json={"agent_id": setup.agent_id, "tags": ["a"]}, headers=t.owner.headers
    )
    refused = await client.post(
        f"{batches(t)}/{queued.json()['id']}/replay", headers=t.owner.headers
    )
    assert refused.status_code == 409, refused.text
    assert "only a completed batch run can be replayed" in refused.json()["detail"]

    done = await play(client, app, settings, t, setup.agent_id, "a")
    foreign = await client.post(
        f"{batches(other)}/{done['id']}/replay", headers=other.owner.headers
    )
    assert foreign.status_code == 404, foreign.text
    reader = await member_holding(client, t, ["scenarios:read"])
    forbidden = await client.post(f"{batches(t)}/{done['id']}/replay", headers=reader.headers)
    assert forbidden.status_code == 403, forbidden.text
    for value in (0, 6, "x"):
        bad = await client.post(
            f"{batches(t)}/{done['id']}/replay",
            json={"judge_repetitions": value},
            headers=t.owner.headers,
        )
        assert single_validation_entry(bad)["loc"] == ["body", "judge_repetitions"]
    assert (await read(client, t, done["id"]))["replays"] == []

    made = await client.post(
        f"{batches(t)}/{done['id']}/replay", json={"judge_repetitions": 3}, headers=t.owner.headers
    )
    assert made.status_code == 201, made.text
    assert made.json()["judge_repetitions"] == 3
