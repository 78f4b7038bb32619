"""Simulated users and conversation criteria (DESIGN §5.9): the scenario's ``simulation``
and ``conversation_criteria`` over REST, the provider's ``is_default_simulator``, and runs
that play a simulated user after their scripted turns and judge the whole conversation.

Runs are executed the way the worker actor does it (``execute_run``) against loopback
fakes: a :class:`FakeAgent` that echoes, a :class:`FakeSimulator` (OpenAI chat
completions answering the simulator's structured output: ``customer message N`` when
shown N exchanges, ``done`` once the conversation has ``done_at``) and a
:class:`FakeOpenAI` judge that fails a question holding ``[fail]``.  A run killed in a real
worker process mid-simulation is ``tests/e2e/test_worker.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.calibration import trust
from shared.calibration.judging import judge_examples
from shared.llm.judge import CONVERSATION_SYSTEM_PROMPT
from shared.llm.simulator import SYSTEM_PROMPT as SIMULATOR_PROMPT
from shared.metrics import OUTBOUND_ERRORS
from shared.outbound.limits import LocalLimiter
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import drain
from tests.support.calibration import EXAMPLES
from tests.support.factories import Tenant, single_validation_entry, tenant
from tests.support.fakes import (
    FakeAgent,
    FakeOpenAI,
    FakeSimulator,
    Reply,
    openai_completion,
    unused_loopback_url,
)
from tests.support.ratelimited import TokenBucketOpenAI
from tests.support.scenario_setup import (
    OutboundSetup,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

SIMULATOR_TOKENS = (29, 13)  # FakeSimulator's usage per call
PRICES = {"input_cost_per_mtok": 2.0, "output_cost_per_mtok": 10.0}
PERSONA = "Ada, a hurried traveller who writes short messages"
GOAL = "Move booking BK-42 to Friday"


def judge_reply(body: dict[str, Any]) -> str:
    prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
    verdict = "FAIL" if "[fail]" in prompt else "PASS"
    return json.dumps({"verdict": verdict, "critique": f"judged {verdict}", "evidence": "-"})


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Echo: {body['message']}") as fake:
        yield fake


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=judge_reply) as fake:
        yield fake


@pytest.fixture
def simulator() -> Iterator[FakeSimulator]:
    with FakeSimulator(done_at=3) as fake:
        yield fake


def simulator_errors() -> float:
    """Failed simulator calls of every kind, as the outbound metrics count them."""
    return sum(
        sample.value
        for metric in OUTBOUND_ERRORS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["target"] == "simulator"
    )


def simulation(**fields: Any) -> dict[str, Any]:
    return {"persona": PERSONA, "goal": GOAL, **fields}


async def create_simulator(
    client: AsyncTestClient, t: Tenant, url: str, **fields: Any
) -> dict[str, Any]:
    """An ``openai_compatible`` provider at a fake, the org's default simulator."""
    body = {
        "name": "simulator",
        "default_model": "sim-model",
        "is_default_judge": False,
        "is_default_simulator": True,
        **fields,
    }
    return await create_judge_provider(client, t, url, **body)


async def world(
    client: AsyncTestClient,
    agent: FakeAgent,
    judge: FakeOpenAI | None,
    simulator: FakeSimulator | None,
) -> tuple[Tenant, OutboundSetup]:
    """An organization reaching the fakes: the agent, a default judge and a default
    simulator (each when given)."""
    t = await tenant(client)
    out = await outbound_setup(client, t, agent.url, judge.url if judge else None)
    if simulator is not None:
        await create_simulator(client, t, simulator.url, **PRICES)
    return t, out


async def run_to_end(
    client: AsyncTestClient, app: Litestar, settings: Settings, t: Tenant, scenario: dict[str, Any]
) -> dict[str, Any]:
    run = await start_run(client, t, scenario["id"], scenario["_agent_id"])
    await execute_run(app.state.database, settings, UUID(run["id"]))
    return await get_run(client, t, run["id"])


async def scenario_of(
    client: AsyncTestClient, t: Tenant, out: OutboundSetup, **fields: Any
) -> dict[str, Any]:
    made = await create_scenario(client, t, **fields)
    return {**made, "_agent_id": out.agent_id}


def scenario_path(t: Tenant, scenario_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/scenarios"
    return base if scenario_id is None else f"{base}/{scenario_id}"


# --- the scenario's fields ---------------------------------------------------------------------


async def test_a_scenario_keeps_its_simulation_and_conversation_criteria(
    client: AsyncTestClient, agent: FakeAgent, simulator: FakeSimulator
) -> None:
    t, out = await world(client, agent, None, None)
    provider = await create_simulator(client, t, simulator.url)
    made = await create_scenario(
        client,
        t,
        simulation=simulation(provider_id=provider["id"], model="sim-large"),
        conversation_criteria=[
            criterion("Was the booking moved?"),
            criterion("sorry", "not_contains"),
        ],
    )
    assert made["simulation"] == {
        "persona": PERSONA,
        "goal": GOAL,
        "max_turns": 8,
        "provider_id": provider["id"],
        "model": "sim-large",
    }
    first, second = made["conversation_criteria"]
    assert set(first) == {
        "id",
        "scenario_id",
        "question",
        "criteria_type",
        "few_shot_examples",
        "order_index",
        "expected_arguments",
    }
    assert (first["question"], first["criteria_type"], first["order_index"]) == (
        "Was the booking moved?",
        "llm_evaluated",
        0,
    )
    assert (second["criteria_type"], second["order_index"]) == ("not_contains", 1)
    assert first["scenario_id"] == second["scenario_id"] == made["id"]
    read = (await client.get(scenario_path(t, made["id"]), headers=t.owner.headers)).json()
    assert read == made

    # A PUT of the name keeps both; conversation criteria given are replaced whole; a
    # simulation given is replaced, null removes it.
    h = t.owner.headers
    renamed = (await client.put(scenario_path(t, made["id"]), json={"name": "x"}, headers=h)).json()
    assert renamed["simulation"] == made["simulation"]
    assert renamed["conversation_criteria"] == made["conversation_criteria"]
    changed = await client.put(
        scenario_path(t, made["id"]),
        json={
            "simulation": simulation(max_turns=3),
            "conversation_criteria": [criterion("Friday", "contains")],
        },
        headers=h,
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert body["simulation"] == {**simulation(max_turns=3), "provider_id": None, "model": None}
    (only,) = body["conversation_criteria"]
    assert only["question"] == "Friday" and only["id"] not in {first["id"], second["id"]}
    removed = await client.put(
        scenario_path(t, made["id"]),
        json={"simulation": None, "conversation_criteria": None},
        headers=h,
    )
    assert removed.json()["simulation"] is None
    assert removed.json()["conversation_criteria"] == body["conversation_criteria"]
    cleared = await client.put(
        scenario_path(t, made["id"]), json={"conversation_criteria": []}, headers=h
    )
    assert cleared.json()["conversation_criteria"] == []
    assert out.agent_id  # the agent is not needed to keep a scenario


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"simulation": {"goal": GOAL}}, ["body", "simulation", "persona"]),
        ({"simulation": {"persona": PERSONA}}, ["body", "simulation", "goal"]),
        ({"simulation": simulation(persona="")}, ["body", "simulation", "persona"]),
        ({"simulation": simulation(persona="p" * 4001)}, ["body", "simulation", "persona"]),
        ({"simulation": simulation(goal="")}, ["body", "simulation", "goal"]),
        ({"simulation": simulation(goal="g" * 4001)}, ["body", "simulation", "goal"]),
        ({"simulation": simulation(max_turns=0)}, ["body", "simulation", "max_turns"]),
        ({"simulation": simulation(max_turns=31)}, ["body", "simulation", "max_turns"]),
        ({"simulation": simulation(max_turns="8")}, ["body", "simulation", "max_turns"]),
        ({"simulation": simulation(provider_id="nope")}, ["body", "simulation", "provider_id"]),
        ({"simulation": simulation(model="")}, ["body", "simulation", "model"]),
        ({"simulation": simulation(model="m" * 256)}, ["body", "simulation", "model"]),
        (
            {"simulation": simulation(temperature=1)},
            ["body", "simulation", "temperature"],
        ),
        ({"simulation": "a persona"}, ["body", "simulation"]),
        (
            {"conversation_criteria": [{"question": ""}]},
            ["body", "conversation_criteria", "0", "question"],
        ),
        (
            {"conversation_criteria": [criterion("x", "vibes")]},
            ["body", "conversation_criteria", "0", "criteria_type"],
        ),
        (
            {"conversation_criteria": [criterion("ok"), criterion("(", "regex")]},
            ["body", "conversation_criteria", "1", "question"],
        ),
        ({"conversation_criteria": [criterion("x")] * 51}, ["body", "conversation_criteria"]),
    ],
)
async def test_bad_simulations_and_conversation_criteria_answer_422_and_change_nothing(
    client: AsyncTestClient, change: dict[str, Any], loc: list[str]
) -> None:
    t = await tenant(client)
    h = t.owner.headers
    created = await client.post(
        scenario_path(t), json={"name": "bad", "turns": [turn("Hi")], **change}, headers=h
    )
    assert single_validation_entry(created)["loc"] == loc
    listed = (await client.get(scenario_path(t), headers=h)).json()
    assert listed["total"] == 0
    kept = await create_scenario(client, t, simulation=simulation())
    updated = await client.put(scenario_path(t, kept["id"]), json=change, headers=h)
    assert single_validation_entry(updated)["loc"] == loc
    assert (await client.get(scenario_path(t, kept["id"]), headers=h)).json() == kept


async def test_a_simulator_provider_of_another_organization_is_404(
    client: AsyncTestClient, simulator: FakeSimulator
) -> None:
    t, other = await tenant(client), await tenant(client)
    theirs = await create_simulator(client, other, simulator.url)
    h = t.owner.headers
    for provider_id in (theirs["id"], str(uuid4())):
        body = {
            "name": "s",
            "turns": [turn("Hi")],
            "simulation": simulation(provider_id=provider_id),
        }
        created = await client.post(scenario_path(t), json=body, headers=h)
        assert created.status_code == 404, created.text
        assert created.json() == {"detail": "llm provider not found"}
    assert (await client.get(scenario_path(t), headers=h)).json()["total"] == 0
    kept = await create_scenario(client, t)
    moved = await client.put(
        scenario_path(t, kept["id"]),
        json={"simulation": simulation(provider_id=theirs["id"])},
        headers=h,
    )
    assert moved.status_code == 404, moved.text
    assert (await client.get(scenario_path(t, kept["id"]), headers=h)).json()["simulation"] is None


async def test_one_default_simulator_per_organization_and_a_used_one_is_kept(
    client: AsyncTestClient, simulator: FakeSimulator
) -> None:
    t, other = await tenant(client), await tenant(client)
    h = t.owner.headers
    first = await create_simulator(client, t, simulator.url, name="first")
    assert first["is_default_simulator"] is True and first["is_default_judge"] is False
    theirs = await create_simulator(client, other, simulator.url)
    second = await create_simulator(client, t, simulator.url, name="second")
    providers = f"/v1/orgs/{t.id}/llm-providers"
    listed = {
        p["name"]: p for p in (await client.get(providers, headers=h)).json()["llm_providers"]
    }
    assert (listed["first"]["is_default_simulator"], listed["second"]["is_default_simulator"]) == (
        False,
        True,
    )
    back = await client.patch(
        f"{providers}/{first['id']}", json={"is_default_simulator": True}, headers=h
    )
    assert back.json()["is_default_simulator"] is True
    assert (await client.get(f"{providers}/{second['id']}", headers=h)).json()[
        "is_default_simulator"
    ] is False
    # Another organization's default is its own.
    their_path = f"/v1/orgs/{other.id}/llm-providers/{theirs['id']}"
    assert (await client.get(their_path, headers=other.owner.headers)).json()[
        "is_default_simulator"
    ] is True
    bad = await client.patch(
        f"{providers}/{first['id']}", json={"is_default_simulator": "yes"}, headers=h
    )
    assert single_validation_entry(bad)["loc"] == ["body", "is_default_simulator"]

    # A provider a scenario's simulated user plays on is not deleted.
    await create_scenario(
        client, t, name="rebooking", simulation=simulation(provider_id=second["id"])
    )
    refused = await client.delete(f"{providers}/{second['id']}", headers=h)
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (
        "llm provider is used by scenarios (as their simulator): rebooking"
    )
    assert (await client.delete(f"{providers}/{first['id']}", headers=h)).status_code == 204


# --- runs with a simulated user ------------------------------------------------------------------


async def test_the_simulated_user_plays_after_the_scripted_turns_until_it_is_done(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    t, out = await world(client, agent, judge, simulator)
    scenario = await scenario_of(
        client,
        t,
        out,
        turns=[turn("I need to change my booking", criterion("Echo", "contains"))],
        customer_context={"booking": "BK-42"},
        simulation=simulation(max_turns=5),
    )
    done = await run_to_end(client, app, settings, t, scenario)

    assert done["status"] == "passed", done
    assert done["simulation_outcome"] == "goal_reached"
    turns = done["turn_results"]
    assert [(r["turn_index"], r["source"]) for r in turns] == [
        (0, "scripted"),
        (1, "simulated"),
        (2, "simulated"),
    ]
    assert [r["user_message"] for r in turns] == [
        "I need to change my booking",
        "customer message 1",
        "customer message 2",
    ]
    assert [r["response_content"] for r in turns[1:]] == [
        "Echo: customer message 1",
        "Echo: customer message 2",
    ]
    assert [len(r["criteria_results"]) for r in turns] == [1, 0, 0]
    assert all(r["passed"] and r["status"] == "passed" for r in turns)
    assert done["conversation_results"] == []
    # Asked once per turn; the done answer's message never reached the agent.
    assert simulator.asked_per_exchange() == {1: 1, 2: 1, 3: 1}
    assert [r.json["message"] for r in agent.requests] == [r["user_message"] for r in turns]
    last = agent.requests[-1].json
    assert [m["content"] for m in last["messages"] if m["role"] == "user"] == [
        r["user_message"] for r in turns
    ]
    # What the simulator is shown: its part, the customer context, the conversation.
    asked = simulator.requests[-1].json
    assert asked["model"] == "sim-model"
    assert asked["messages"][0] == {"role": "system", "content": SIMULATOR_PROMPT}
    assert asked["response_format"]["type"] == "json_schema"
    prompt = asked["messages"][1]["content"]
    for shown in (PERSONA, GOAL, '{"booking":"BK-42"}', "AGENT: Echo: customer message 2"):
        assert shown in prompt, prompt
    assert "CUSTOMER: I need to change my booking" in prompt
    # The simulator's tokens are counted apart, priced with its provider's prices.
    cost = done["cost_summary"]
    calls, tokens_in, tokens_out = 3, 3 * SIMULATOR_TOKENS[0], 3 * SIMULATOR_TOKENS[1]
    assert (
        cost["simulator"]["calls"],
        cost["simulator"]["input_tokens"],
        cost["simulator"]["output_tokens"],
    ) == (calls, tokens_in, tokens_out)
    assert cost["simulator"]["latency_ms"] > 0
    assert cost["agent"]["calls"] == 3 and cost["judge"]["calls"] == 0
    assert cost["estimated_cost_usd"] == pytest.approx((tokens_in * 2.0 + tokens_out * 10.0) / 1e6)


async def test_a_simulator_that_is_never_done_stops_after_max_turns_and_the_run_passes(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    with FakeSimulator(done_at=None) as simulator:
        t, out = await world(client, agent, judge, simulator)
        scenario = await scenario_of(
            client, t, out, turns=[turn("Hello")], simulation=simulation(max_turns=2)
        )
        done = await run_to_end(client, app, settings, t, scenario)
    assert done["status"] == "passed", done
    assert done["simulation_outcome"] == "max_turns"
    assert [r["source"] for r in done["turn_results"]] == ["scripted", "simulated", "simulated"]
    assert simulator.asked_per_exchange() == {1: 1, 2: 1}, "never asked past max_turns"
    assert len(agent.requests) == 3


async def test_a_simulator_that_gives_up_ends_the_conversation_without_failing_the_run(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    with FakeSimulator(done_at=1, outcome="gave_up") as simulator:
        t, out = await world(client, agent, judge, simulator)
        scenario = await scenario_of(client, t, out, turns=[turn("Hello")], simulation=simulation())
        done = await run_to_end(client, app, settings, t, scenario)
    assert (done["status"], done["simulation_outcome"]) == ("passed", "gave_up")
    assert [r["source"] for r in done["turn_results"]] == ["scripted"]
    assert done["cost_summary"]["simulator"]["calls"] == 1


async def test_an_empty_answer_is_asked_for_again_once(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    t, out = await world(client, agent, judge, simulator)
    scenario = await scenario_of(client, t, out, turns=[turn("Hello")], simulation=simulation())
    simulator.enqueue(Reply(json=openai_completion("")))
    done = await run_to_end(client, app, settings, t, scenario)
    assert (done["status"], done["simulation_outcome"]) == ("passed", "goal_reached"), done
    assert simulator.asked_per_exchange() == {1: 2, 2: 1, 3: 1}
    assert done["cost_summary"]["simulator"]["calls"] == 4
    assert [r["user_message"] for r in done["turn_results"]] == [
        "Hello",
        "customer message 1",
        "customer message 2",
    ]


@pytest.mark.parametrize(
    "garbage",
    [
        "Sure! Here is the next message: hi",
        json.dumps({"message": "", "done": False, "outcome": None}),
        json.dumps({"message": "bye", "done": True, "outcome": "bored"}),
    ],
    ids=["not-json", "no-message", "unknown-outcome"],
)
async def test_an_unusable_answer_twice_ends_the_run_in_error_put_down_to_the_simulator(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
    garbage: str,
) -> None:
    t, out = await world(client, agent, judge, simulator)
    scenario = await scenario_of(client, t, out, turns=[turn("Hello")], simulation=simulation())
    # The first simulated turn is played; the second is asked for twice and never usable.
    simulator.enqueue(
        Reply(
            json=openai_completion(json.dumps({"message": "hi", "done": False, "outcome": None}))
        ),
        Reply(json=openai_completion(garbage)),
        Reply(json=openai_completion(garbage)),
    )
    done = await run_to_end(client, app, settings, t, scenario)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("simulator: no usable answer after 2 attempts")
    assert done["error_turn"] is None, "the agent is not the one that failed"
    assert done["simulation_outcome"] is None
    assert [r["user_message"] for r in done["turn_results"]] == ["Hello", "hi"]
    assert len(simulator.requests) == 3
    assert len(agent.requests) == 2


async def test_an_unreachable_simulator_ends_the_run_in_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t, out = await world(client, agent, judge, None)
    await create_judge_provider(
        client,
        t,
        unused_loopback_url(),
        name="gone",
        is_default_judge=False,
        is_default_simulator=True,
    )
    scenario = await scenario_of(client, t, out, turns=[turn("Hello")], simulation=simulation())
    done = await run_to_end(client, app, settings, t, scenario)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("simulator: could not reach"), done["error_message"]
    assert [r["source"] for r in done["turn_results"]] == ["scripted"]
    assert done["error_turn"] is None


async def test_the_simulators_calls_are_a_rate_limited_destination_of_their_own(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    """Outbound limits: a simulator refusing every call (429) holds back the simulator's
    calls only, until the wait runs out: the run ends in error, put down to the simulator."""
    limiter = LocalLimiter(max_concurrency=8, wait_s=0.6, lease_s=30.0, probe_s=1.5)
    errors_before = simulator_errors()
    with TokenBucketOpenAI(rate=20, burst=3, refuse_always=True) as refusing:
        t, out = await world(client, agent, judge, None)
        await create_simulator(client, t, refusing.url)
        scenario = await scenario_of(client, t, out, turns=[turn("Hello")], simulation=simulation())
        run = await start_run(client, t, scenario["id"], out.agent_id)
        try:
            await execute_run(app.state.database, settings, UUID(run["id"]), limiter=limiter)
        finally:
            await limiter.close()
        ended = await get_run(client, t, run["id"])
    assert ended["status"] == "error"
    message = ended["error_message"]
    assert message.startswith("simulator: rate limited by 127.0.0.1 (simulator calls)"), message
    assert len(agent.requests) == 1  # the scripted turn, not held back
    assert simulator_errors() == errors_before + 1


async def test_the_simulator_is_the_scenarios_provider_else_the_default_else_the_judge(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    with (
        FakeSimulator(done_at=1) as named,
        FakeSimulator(done_at=1) as default,
        FakeSimulator(done_at=1) as judge,
    ):
        # The agent's judge (nothing asks it for a verdict: the criteria are checks).
        t, out = await world(client, agent, judge, None)
        plays = [turn("Hello", criterion("Hello", "contains"))]
        on_judge = await scenario_of(client, t, out, turns=plays, simulation=simulation())
        assert (await run_to_end(client, app, settings, t, on_judge))["status"] == "passed"
        assert (len(judge.requests), judge.requests[0].json["model"]) == (1, "judge-model")

        await create_simulator(client, t, default.url)
        on_default = await scenario_of(client, t, out, turns=plays, simulation=simulation())
        assert (await run_to_end(client, app, settings, t, on_default))["status"] == "passed"
        assert (len(default.requests), len(judge.requests)) == (1, 1)

        chosen = await create_judge_provider(
            client, t, named.url, name="chosen", is_default_judge=False
        )
        on_named = await scenario_of(
            client,
            t,
            out,
            turns=plays,
            simulation=simulation(provider_id=chosen["id"], model="sim-xl"),
        )
        assert (await run_to_end(client, app, settings, t, on_named))["status"] == "passed"
        assert (len(named.requests), named.requests[0].json["model"]) == (1, "sim-xl")
        assert (len(default.requests), len(judge.requests)) == (1, 1)

    # Without any of them the run ends in error, saying how to set one.
    t, out = await world(client, agent, None, None)
    alone = await scenario_of(client, t, out, turns=plays, simulation=simulation())
    done = await run_to_end(client, app, settings, t, alone)
    assert done["status"] == "error"
    assert done["error_message"].startswith("simulator: no simulator provider (set"), done
    assert "is_default_simulator" in done["error_message"]
    assert [r["source"] for r in done["turn_results"]] == ["scripted"]


# --- conversation criteria -----------------------------------------------------------------------


def by_question(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["question"]: r for r in run["conversation_results"]}


async def test_conversation_criteria_of_each_type_judge_a_scripted_conversation(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t, out = await world(client, agent, judge, None)
    scenario = await scenario_of(
        client,
        t,
        out,
        turns=[turn("first"), turn("second"), turn("third", criterion("third", "contains"))],
        conversation_criteria=[
            criterion("SECOND", "contains"),
            criterion("never said", "contains"),
            criterion("third", "not_contains"),
            criterion("never said", "not_contains"),
            criterion(r"Echo: s\w+", "regex"),
            criterion(r"^nothing$", "regex"),
            criterion("Was the agent consistent all along?"),
            criterion("Did it apologise? [fail]"),
        ],
    )
    done = await run_to_end(client, app, settings, t, scenario)

    assert done["status"] == "failed", done
    assert all(r["passed"] for r in done["turn_results"]), "only the conversation failed"
    assert done["simulation_outcome"] is None
    results = done["conversation_results"]
    assert [(r["question"], r["criteria_type"], r["verdict"]) for r in results] == [
        ("SECOND", "contains", "PASS"),
        ("never said", "contains", "FAIL"),
        ("third", "not_contains", "FAIL"),
        ("never said", "not_contains", "PASS"),
        (r"Echo: s\w+", "regex", "PASS"),
        (r"^nothing$", "regex", "FAIL"),
        ("Was the agent consistent all along?", "llm_evaluated", "PASS"),
        ("Did it apologise? [fail]", "llm_evaluated", "FAIL"),
    ]
    assert [r["critique"] for r in results[:6]] == [
        "the reply of turn 2 contains 'SECOND'",
        "no reply contains 'never said'",
        "the reply of turn 3 contains 'third'",
        "no reply contains 'never said'",
        r"the reply of turn 2 matches /Echo: s\w+/",
        r"no reply matches /^nothing$/",
    ]
    assert results[4]["evidence"] == "Echo: second"
    ids = [c["id"] for c in scenario["conversation_criteria"]]
    assert [r["criteria_id"] for r in results] == ids
    # The judge was asked once per LLM criterion, of the whole conversation.
    conversation_asks = [
        r.json
        for r in judge.requests
        if r.json["messages"][0]["content"] == CONVERSATION_SYSTEM_PROMPT
    ]
    assert len(conversation_asks) == 2
    prompt = conversation_asks[0]["messages"][1]["content"]
    for said in ("USER: first", "ASSISTANT: Echo: second", "ASSISTANT: Echo: third"):
        assert said in prompt
    assert done["cost_summary"]["judge"]["calls"] == 2


async def test_conversation_criteria_read_every_reply_of_a_simulated_conversation(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    t, out = await world(client, agent, judge, simulator)
    scenario = await scenario_of(
        client,
        t,
        out,
        turns=[turn("Hello")],
        simulation=simulation(),
        conversation_criteria=[
            criterion("customer message 2", "contains"),
            criterion("customer message", "not_contains"),
            criterion("Did the customer get what they wanted?"),
        ],
    )
    done = await run_to_end(client, app, settings, t, scenario)
    assert (done["status"], done["simulation_outcome"]) == ("failed", "goal_reached"), done
    found = by_question(done)
    assert found["customer message 2"]["verdict"] == "PASS"
    assert found["customer message 2"]["critique"] == (
        "the reply of turn 3 contains 'customer message 2'"
    )
    assert found["customer message"]["verdict"] == "FAIL"
    assert found["customer message"]["critique"] == (
        "the replies of turns 2, 3 contain 'customer message'"
    )
    assert found["Did the customer get what they wanted?"]["verdict"] == "PASS"
    asked = [
        r.json
        for r in judge.requests
        if r.json["messages"][0]["content"] == CONVERSATION_SYSTEM_PROMPT
    ]
    assert "USER: customer message 2" in asked[0]["messages"][1]["content"]


def booking_calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools a booking agent reports: a lookup for the first simulated message, the
    move for the second."""
    if body["message"] == "customer message 1":
        return [{"name": "lookup_booking", "arguments": {"id": "BK-42"}, "output": {"day": "Wed"}}]
    if body["message"] == "customer message 2":
        return [{"name": "move_booking", "arguments": {"booking_id": "BK-42", "day": "Friday"}}]
    return []


TOOL_CHECKS = [
    criterion("move_booking", "tool_called", expected_arguments={"day": "Friday"}),
    criterion("move_booking", "tool_called", expected_arguments={"day": "Monday"}),
    criterion("refund_order", "tool_not_called"),
    criterion("lookup_booking", "tool_not_called"),
]


async def test_tool_checks_among_conversation_criteria_look_at_every_turns_calls(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    with FakeAgent(
        reply=lambda body: f"Echo: {body['message']}", tool_calls=booking_calls
    ) as agent:
        t, out = await world(client, agent, judge, simulator)
        scenario = await scenario_of(
            client,
            t,
            out,
            turns=[turn("Hello", criterion("move_booking", "tool_not_called"))],
            simulation=simulation(),
            conversation_criteria=[*TOOL_CHECKS, criterion("Was the booking moved?")],
        )
        done = await run_to_end(client, app, settings, t, scenario)
    assert done["status"] == "failed", done
    assert all(r["passed"] for r in done["turn_results"])
    assert [len(r["tool_calls"]) for r in done["turn_results"]] == [0, 1, 1]
    results = done["conversation_results"]
    assert [(r["criteria_type"], r["question"], r["verdict"]) for r in results] == [
        ("tool_called", "move_booking", "PASS"),
        ("tool_called", "move_booking", "FAIL"),
        ("tool_not_called", "refund_order", "PASS"),
        ("tool_not_called", "lookup_booking", "FAIL"),
        ("llm_evaluated", "Was the booking moved?", "PASS"),
    ]
    moved, never, _, looked_up, _ = results
    assert moved["critique"] == (
        'move_booking was called with {"day":"Friday"}; calls seen: lookup_booking, '
        "move_booking (called in turn 3)"
    )
    assert '"booking_id":"BK-42"' in moved["evidence"]
    assert never["critique"].startswith('move_booking was called once, never with {"day":"Monday"}')
    assert looked_up["critique"].endswith("(called in turn 2)")
    # The judge reads the conversation's tool calls under the replies.
    (asked,) = [
        r.json
        for r in judge.requests
        if r.json["messages"][0]["content"] == CONVERSATION_SYSTEM_PROMPT
    ]
    assert (
        '[tool call] move_booking({"booking_id":"BK-42","day":"Friday"})'
        in (asked["messages"][1]["content"])
    )


async def test_a_failed_required_turn_stops_before_the_simulator_and_the_conversation_criteria(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    t, out = await world(client, agent, judge, simulator)
    scenario = await scenario_of(
        client,
        t,
        out,
        turns=[turn("Hello", criterion("never said", "contains"), required=True), turn("more")],
        simulation=simulation(),
        conversation_criteria=[criterion("Was it good?")],
    )
    done = await run_to_end(client, app, settings, t, scenario)
    assert done["status"] == "failed", done
    assert [r["status"] for r in done["turn_results"]] == ["failed", "skipped"]
    assert done["turn_results"][0]["stopped_early"] is True
    assert done["conversation_results"] == []
    assert done["simulation_outcome"] is None
    assert simulator.requests == [] and judge.requests == []


async def test_a_failing_conversation_criterion_fails_its_run_in_the_batch_counters(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    t, out = await world(client, agent, judge, simulator)
    h = t.owner.headers
    kept = await scenario_of(
        client,
        t,
        out,
        name="kept",
        turns=[turn("Hello")],
        simulation=simulation(),
        conversation_criteria=[criterion("customer message 1", "contains")],
    )
    broken = await scenario_of(
        client,
        t,
        out,
        name="broken",
        turns=[turn("Hello")],
        simulation=simulation(),
        conversation_criteria=[criterion("Was it perfect? [fail]")],
    )
    made = await client.post(
        f"/v1/orgs/{t.id}/scenarios/batch-runs/",
        json={"agent_id": out.agent_id, "scenario_ids": [kept["id"], broken["id"]]},
        headers=h,
    )
    assert made.status_code == 201, made.text
    await drain(app, settings, made.json()["id"])
    batch = (
        await client.get(f"/v1/orgs/{t.id}/scenarios/batch-runs/{made.json()['id']}", headers=h)
    ).json()
    assert batch["status"] == "completed"
    counts = ("completed_scenarios", "passed_scenarios", "failed_scenarios", "error_scenarios")
    assert [batch[c] for c in counts] == [2, 1, 1, 0]
    runs = {r["scenario_name"]: r for r in batch["runs"]}
    assert (runs["kept"]["status"], runs["broken"]["status"]) == ("passed", "failed")
    # Every turn passed, simulated ones counted with the scripted one.
    assert (runs["broken"]["passed_turns"], runs["broken"]["total_turns"]) == (3, 3)
    # Judge trust reports the LLM-judged conversation criterion, as one.
    await trust.compute(app.state.database, UUID(batch["id"]))
    report = (
        await client.get(f"/v1/orgs/{t.id}/scenarios/batch-runs/{batch['id']}", headers=h)
    ).json()["judge_trust"]
    (judged,) = report["uncalibrated"]
    assert (judged["question"], judged["conversation"]) == ("Was it perfect? [fail]", True)
    assert (judged["judged"], judged["passed"]) == (1, 0)


# --- resuming -----------------------------------------------------------------------------------


async def test_an_interrupted_simulation_resumes_without_asking_again_for_a_committed_turn(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    judge: FakeOpenAI,
    simulator: FakeSimulator,
) -> None:
    """Stopped while the agent answers the second simulated message: the simulator is asked
    again for that turn (nothing of it was committed), never for the first."""
    released = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if body["message"] == "customer message 2" and not released.is_set():
            released.wait(10)  # the first delivery never gets this answer
        return f"Echo: {body['message']}"

    with FakeAgent(reply=reply) as agent:
        t, out = await world(client, agent, judge, simulator)
        scenario = await scenario_of(client, t, out, turns=[turn("Hello")], simulation=simulation())
        run = await start_run(client, t, scenario["id"], out.agent_id)
        task = asyncio.create_task(execute_run(app.state.database, settings, UUID(run["id"])))
        try:
            await agent.requests_received(3, wait_s=10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            released.set()
        interrupted = await get_run(client, t, run["id"])
        assert interrupted["status"] == "running"
        assert [r["user_message"] for r in interrupted["turn_results"]] == [
            "Hello",
            "customer message 1",
        ]
        assert simulator.asked_per_exchange() == {1: 1, 2: 1}

        await execute_run(app.state.database, settings, UUID(run["id"]))
        done = await get_run(client, t, run["id"])
    assert (done["status"], done["simulation_outcome"]) == ("passed", "goal_reached"), done
    assert done["turn_results"][:2] == interrupted["turn_results"]
    assert simulator.asked_per_exchange() == {1: 1, 2: 2, 3: 1}
    messages = [r.json["message"] for r in agent.requests]
    assert messages == ["Hello", "customer message 1", "customer message 2", "customer message 2"]
    resumed = agent.requests[-1].json["messages"]
    assert [m["content"] for m in resumed if m["role"] == "user"] == [
        "Hello",
        "customer message 1",
        "customer message 2",
    ]


async def test_a_done_answer_is_committed_and_a_redelivery_never_asks_for_it_again(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    simulator: FakeSimulator,
) -> None:
    """Stopped while the judge weighs the conversation, after the simulator said done: the
    next delivery judges it from the committed turns (their tool calls too)."""
    released = threading.Event()

    def slow_verdict(body: dict[str, Any]) -> str:
        if not released.is_set():
            released.wait(10)
        return judge_reply(body)

    with (
        FakeOpenAI(reply=slow_verdict) as judge,
        FakeAgent(reply=lambda body: f"Echo: {body['message']}", tool_calls=booking_calls) as agent,
    ):
        t, out = await world(client, agent, judge, simulator)
        scenario = await scenario_of(
            client,
            t,
            out,
            turns=[turn("Hello")],
            simulation=simulation(),
            conversation_criteria=[criterion("Was the goal reached?"), TOOL_CHECKS[0]],
        )
        run = await start_run(client, t, scenario["id"], out.agent_id)
        task = asyncio.create_task(execute_run(app.state.database, settings, UUID(run["id"])))
        try:
            await judge.requests_received(1, wait_s=10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            released.set()
        interrupted = await get_run(client, t, run["id"])
        assert (interrupted["status"], interrupted["simulation_outcome"]) == (
            "running",
            "goal_reached",
        )
        assert interrupted["cost_summary"]["simulator"]["calls"] == 3
        asked = len(simulator.requests)

        await execute_run(app.state.database, settings, UUID(run["id"]))
        done = await get_run(client, t, run["id"])
    assert (done["status"], done["simulation_outcome"]) == ("passed", "goal_reached"), done
    assert len(simulator.requests) == asked == 3, "the done answer was not asked for again"
    assert len(agent.requests) == 3
    # The tool check read the calls the first delivery committed.
    assert [r["verdict"] for r in done["conversation_results"]] == ["PASS", "PASS"]
    assert done["cost_summary"]["simulator"]["calls"] == 3


# --- calibration ------------------------------------------------------------------------------


async def test_a_calibration_example_may_name_a_conversation_criterion(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    with FakeOpenAI(reply=judge_reply) as judge:
        t, out = await world(client, agent, judge, None)
        question = "Was the customer helped all along?"
        scenario = await create_scenario(
            client, t, conversation_criteria=[criterion(question)], name="helped"
        )
        criteria_id = scenario["conversation_criteria"][0]["id"]
        named = [
            {
                **{k: v for k, v in EXAMPLES[0].items() if k != "criterion_question"},
                "criteria_id": criteria_id,
            }
        ]
        response = await impatient.post(
            f"/v1/orgs/{t.id}/scenarios/calibrate?agent_id={out.agent_id}",
            json={"examples": named},
            headers=t.owner.headers,
        )
        assert response.status_code == 202, response.text
        calibration_id = response.json()["id"]
        await judge_examples(app.state.database, settings, UUID(calibration_id))
    one = f"/v1/orgs/{t.id}/scenarios/calibrations/{calibration_id}"
    body = (await client.get(one, headers=t.owner.headers)).json()
    assert body["status"] == "completed", body
    assert body["results"][0]["criterion"] == question
    assert body["results"][0]["judge_verdict"] == "PASS"
    # Judged as a conversation criterion is in a run.
    (asked,) = judge.requests
    assert asked.json["messages"][0]["content"] == CONVERSATION_SYSTEM_PROMPT
    (entry,) = body["criteria"]
    assert (entry["criteria_id"], entry["stale"]) == (criteria_id, False)
    # Its conversation criteria replaced, the calibration's criterion is gone.
    await client.put(
        scenario_path(t, scenario["id"]),
        json={"conversation_criteria": [criterion("Something else?")]},
        headers=t.owner.headers,
    )
    gone = (await client.get(one, headers=t.owner.headers)).json()["criteria"][0]
    assert gone["stale"] is True and "no longer exists" in gone["reason"]
