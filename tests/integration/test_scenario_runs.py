"""Scenario runs: spec 14, the run endpoints of DESIGN §3 and the run engine (§5.2, §5.5).

Starting a run answers 201 with the pending run.  The engine is exercised the way the
worker actor does it: ``execute_run(session_factory, settings, run_id)``, against a
loopback :class:`FakeAgent` (the agent under test) and a :class:`FakeOpenAI` (the judge),
and the outcome is read back over ``GET …/scenarios/runs/{id}``.

The judge fake decides from the criterion question it is shown: a question containing
``[fail]`` gets FAIL, anything else PASS, and a ``[q:NAME]`` marker in the question comes
back in the critique and evidence, so each criterion result can be traced to its criterion.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import ScenarioRun
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Tenant, create_token, tenant
from tests.support.fakes import FakeAgent, FakeOpenAI, Reply
from tests.support.scenario_setup import (
    OutboundSetup,
    create_http_agent,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

RUN_FIELDS = {
    "id",
    "scenario_id",
    "agent_id",
    "status",
    "started_at",
    "completed_at",
    "created_at",
    "updated_at",
    "session_id",
    "cost_summary",
    "error_message",
    "batch_run_id",
    "turn_results",
    "error_turn",
    "simulation_outcome",
    "conversation_results",
    "trace_id",
    "judge_repetitions",
    "replay_of_run_id",
}
TURN_RESULT_FIELDS = {
    "id",
    "turn_index",
    "stopped_early",
    "passed",
    "response_content",
    "criteria_results",
    "user_message",
    "status",
    "knowledge",
    "redacted_keys",
    "refusal",
    "source",
    "tool_calls",
}
JUDGE_TOKENS = (11, 7)  # FakeOpenAI's default usage per call
AGENT_TOKENS = (17, 3)  # FakeAgent's default usage per call
_MARKER = re.compile(r"\[q:(\w+)\]")


def judge_reply(body: dict[str, Any]) -> str:
    prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
    marker = _MARKER.search(prompt)
    name = marker.group(1) if marker else "none"
    verdict = "FAIL" if "[fail]" in prompt else "PASS"
    return json.dumps(
        {"verdict": verdict, "critique": f"critique of {name}", "evidence": f"evidence of {name}"}
    )


def echo_reply(body: dict[str, Any]) -> str:
    return f"Echo: {body['message']}"


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=echo_reply) as fake:
        yield fake


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=judge_reply) as fake:
        yield fake


def runs_path(t: Tenant, run_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/scenarios/runs"
    return base if run_id is None else f"{base}/{run_id}"


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def execute(app: Litestar, settings: Settings, run_id: str) -> None:
    await execute_run(app.state.database, settings, UUID(run_id))


async def run_to_end(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    scenario_id: str,
    agent_id: str,
) -> dict[str, Any]:
    run = await start_run(client, t, scenario_id, agent_id)
    await execute(app, settings, run["id"])
    return await get_run(client, t, run["id"])


async def list_runs(client: AsyncTestClient, t: Tenant, query: str = "") -> dict[str, Any]:
    response = await client.get(f"{runs_path(t)}{query}", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def plant_template(db: AsyncSession, scenario_id: str, template: str) -> None:
    """Put ``template`` in the scenario's first turn, as a scenario saved before templates
    were checked at save may hold it (the API refuses such a template now)."""
    await db.execute(
        text("UPDATE scenario_turns SET user_message = :m WHERE scenario_id = :s"),
        {"m": template, "s": UUID(scenario_id)},
    )
    await db.commit()


async def setup(
    client: AsyncTestClient, agent: FakeAgent, judge: FakeOpenAI | None, **kw: Any
) -> tuple[Tenant, OutboundSetup]:
    t = await tenant(client)
    return t, await outbound_setup(client, t, agent.url, judge.url if judge else None, **kw)


async def raw_counts(db: AsyncSession, run_id: str) -> tuple[list[tuple[int, int]], int]:
    """Rows of the run in the tables: [(turn_index, rows)] and the criterion-result rows."""
    turns = (
        await db.execute(
            text(
                "SELECT turn_index, count(*) FROM turn_results WHERE run_id = :id "
                "GROUP BY turn_index ORDER BY turn_index"
            ),
            {"id": run_id},
        )
    ).all()
    criteria = await db.scalar(
        text(
            "SELECT count(*) FROM criterion_results c JOIN turn_results t "
            "ON c.turn_result_id = t.id WHERE t.run_id = :id"
        ),
        {"id": run_id},
    )
    duplicates = await db.scalar(
        text(
            "SELECT count(*) FROM (SELECT c.turn_result_id, c.criteria_id FROM criterion_results c "
            "JOIN turn_results t ON c.turn_result_id = t.id WHERE t.run_id = :id "
            "GROUP BY c.turn_result_id, c.criteria_id HAVING count(*) > 1) d"
        ),
        {"id": run_id},
    )
    await db.commit()
    assert duplicates == 0, "a criterion result was written twice"
    return [(int(i), int(n)) for i, n in turns], int(criteria or 0)


# --- starting, reading and listing runs -----------------------------------------------------------


async def test_start_answers_201_with_the_pending_run(
    client: AsyncTestClient, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(client, t)
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios/{scenario['id']}/run",
        json={"agent_id": out.agent_id},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    run = response.json()
    assert set(run) == RUN_FIELDS, sorted(run)
    UUID(run["id"])
    assert run["scenario_id"] == scenario["id"]
    assert run["agent_id"] == out.agent_id
    assert run["status"] == "pending"
    assert run["started_at"] is None
    assert run["completed_at"] is None
    assert isinstance(run["session_id"], str) and run["session_id"]
    assert run["turn_results"] == []
    assert run["error_message"] is None
    assert run["batch_run_id"] is None, "a single run belongs to no batch"

    assert await get_run(client, t, run["id"]) == run
    listing = await list_runs(client, t)
    assert listing["total"] == 1
    assert [r["id"] for r in listing["runs"]] == [run["id"]]
    assert listing["runs"][0]["status"] == "pending"
    assert listing["runs"][0]["batch_run_id"] is None
    # Nothing was executed: the agent and the judge were not called.
    assert agent.requests == [] and judge.requests == []


async def test_start_refuses_unknown_scenario_and_foreign_agents(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t, out = await setup(client, agent, None)
    other = await tenant(client)
    foreign_agent = await create_http_agent(client, other, agent.url)
    scenario = await create_scenario(client, t)

    cases = [
        (scenario["id"], foreign_agent["id"]),  # agent of another organization
        (scenario["id"], str(uuid4())),  # no such agent
        (str(uuid4()), out.agent_id),  # no such scenario
    ]
    for scenario_id, agent_id in cases:
        response = await client.post(
            f"/v1/orgs/{t.id}/scenarios/{scenario_id}/run",
            json={"agent_id": agent_id},
            headers=t.owner.headers,
        )
        assert response.status_code == 404, f"{scenario_id}/{agent_id}: {response.text}"
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios/{scenario['id']}/run", json={}, headers=t.owner.headers
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "agent_id"]
    assert (await list_runs(client, t))["total"] == 0
    assert (await list_runs(client, other))["total"] == 0


async def test_another_organizations_run_is_404(client: AsyncTestClient, agent: FakeAgent) -> None:
    t, out = await setup(client, agent, None)
    other = await tenant(client)
    run = await start_run(client, t, (await create_scenario(client, t))["id"], out.agent_id)
    for path in (runs_path(other, run["id"]), runs_path(t, run["id"]), runs_path(t)):
        response = await client.get(path, headers=other.owner.headers)
        assert response.status_code == 404, f"{path}: {response.status_code} {response.text}"
    response = await client.get(runs_path(t, str(uuid4())), headers=t.owner.headers)
    assert response.status_code == 404, response.text
    assert (await list_runs(client, other))["total"] == 0
    assert await get_run(client, t, run["id"]) == run


async def test_run_permissions(client: AsyncTestClient, agent: FakeAgent) -> None:
    t = await tenant(client, with_roles=("MEMBER", "VIEWER", "GUEST"))
    out = await outbound_setup(client, t, agent.url)
    scenario = await create_scenario(client, t)
    run_path = f"/v1/orgs/{t.id}/scenarios/{scenario['id']}/run"
    body = {"agent_id": out.agent_id}
    reader = await create_token(client, t.owner, t.id, ["scenarios:read", "scenarios:write"])
    runner = await create_token(client, t.owner, t.id, ["scenarios:run"])

    for who, headers in (
        ("VIEWER", t.members["VIEWER"].headers),
        ("GUEST", t.members["GUEST"].headers),
        ("token without scenarios:run", reader.headers),
    ):
        response = await client.post(run_path, json=body, headers=headers)
        assert response.status_code == 403, f"{who}: {response.status_code} {response.text}"
    assert (await list_runs(client, t))["total"] == 0

    response = await client.post(run_path, json=body, headers=t.members["MEMBER"].headers)
    assert response.status_code == 201, response.text
    by_member = response.json()
    response = await client.post(run_path, json=body, headers=runner.headers)
    assert response.status_code == 201, response.text
    assert (await list_runs(client, t))["total"] == 2

    # Reading runs takes scenarios:read: the VIEWER and the read token can, the GUEST can't.
    for who, headers, expected in (
        ("VIEWER", t.members["VIEWER"].headers, 200),
        ("token", reader.headers, 200),
        ("GUEST", t.members["GUEST"].headers, 403),
        ("run-only token", runner.headers, 403),
    ):
        for path in (runs_path(t), runs_path(t, by_member["id"])):
            response = await client.get(path, headers=headers)
            assert response.status_code == expected, f"{who} {path}: {response.text}"


async def test_run_listing_filters(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t, out = await setup(client, agent, None)
    second_agent = await create_http_agent(client, t, agent.url, name="second")
    s1 = await create_scenario(client, t, name="one")
    s2 = await create_scenario(client, t, name="two")
    r1 = await start_run(client, t, s1["id"], out.agent_id)
    r2 = await start_run(client, t, s1["id"], second_agent["id"])
    r3 = await start_run(client, t, s2["id"], out.agent_id)
    await execute(app, settings, r2["id"])

    def ids(listing: dict[str, Any]) -> list[str]:
        return [r["id"] for r in listing["runs"]]

    everything = await list_runs(client, t)
    assert set(everything) == {"runs", "total"}
    assert ids(everything) == [r1["id"], r2["id"], r3["id"]]
    assert everything["total"] == 3
    assert ids(await list_runs(client, t, f"?scenario_id={s1['id']}")) == [r1["id"], r2["id"]]
    assert ids(await list_runs(client, t, f"?agent_id={out.agent_id}")) == [r1["id"], r3["id"]]
    both = await list_runs(client, t, f"?scenario_id={s1['id']}&agent_id={out.agent_id}")
    assert (ids(both), both["total"]) == ([r1["id"]], 1)
    passed = await list_runs(client, t, "?status=passed")
    assert (ids(passed), passed["total"]) == ([r2["id"]], 1)
    assert passed["runs"][0]["status"] == "passed"
    pending = await list_runs(client, t, "?status=pending")
    assert (ids(pending), pending["total"]) == ([r1["id"], r3["id"]], 2)
    assert await list_runs(client, t, "?status=error") == {"runs": [], "total": 0}
    assert await list_runs(client, t, f"?scenario_id={uuid4()}") == {"runs": [], "total": 0}
    # Single runs belong to no batch: a batch filter finds none of them.
    assert await list_runs(client, t, f"?batch_run_id={uuid4()}") == {"runs": [], "total": 0}
    page = await list_runs(client, t, "?limit=1&offset=1")
    assert (ids(page), page["total"]) == ([r2["id"]], 3)

    response = await client.get(f"{runs_path(t)}?status=done", headers=t.owner.headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "status"]


# --- the engine: outcomes ---------------------------------------------------------------------


async def test_all_criteria_pass(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    agent.reply = lambda body: f"Welcome to PARIS, {body['message']} Ticket 123."
    t, out = await setup(client, agent, judge)
    examples = [{"response": "Bonjour!", "verdict": "PASS", "critique": "Greets warmly."}]
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn(
                "Hello there.",
                criterion("Is the reply polite? [q:polite]", few_shot_examples=examples),
                criterion("paris", "contains"),
                criterion("refund", "not_contains"),
                criterion(r"Ticket \d{3}", "regex"),
            ),
            turn("Where am I?", criterion("Does it name the city? [q:city]"), required=True),
        ],
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    before = datetime.now().astimezone()
    await execute(app, settings, run["id"])
    done = await get_run(client, t, run["id"])

    assert done["status"] == "passed", done
    assert done["error_message"] is None
    started, completed = parse_time(done["started_at"]), parse_time(done["completed_at"])
    assert started <= completed
    assert abs((started - before).total_seconds()) < 60
    assert done["session_id"] == run["session_id"]

    results = done["turn_results"]
    assert [r["turn_index"] for r in results] == [0, 1]
    assert [r["response_content"] for r in results] == [
        "Welcome to PARIS, Hello there. Ticket 123.",
        "Welcome to PARIS, Where am I? Ticket 123.",
    ]
    assert all(r["passed"] and not r["stopped_early"] for r in results)
    assert all(set(r) == TURN_RESULT_FIELDS for r in results)
    assert [r["status"] for r in results] == ["passed", "passed"]
    assert [r["user_message"] for r in results] == ["Hello there.", "Where am I?"]
    first, second = results
    expected_ids = [c["id"] for c in scenario["turns"][0]["criteria"]]
    assert [c["criteria_id"] for c in first["criteria_results"]] == expected_ids
    assert [c["verdict"] for c in first["criteria_results"]] == ["PASS"] * 4
    polite, contains, not_contains, regex = first["criteria_results"]
    assert (polite["critique"], polite["evidence"]) == ("critique of polite", "evidence of polite")
    assert (polite["input_tokens"], polite["output_tokens"]) == JUDGE_TOKENS
    for free in (contains, not_contains, regex):
        assert (free["input_tokens"], free["output_tokens"]) == (0, 0), free
        assert isinstance(free["critique"], str) and free["critique"]
    assert regex["evidence"] == "Ticket 123"
    assert [c["criteria_id"] for c in second["criteria_results"]] == [
        scenario["turns"][1]["criteria"][0]["id"]
    ]
    assert second["criteria_results"][0]["critique"] == "critique of city"
    assert (
        second["criteria_results"][0]["input_tokens"],
        second["criteria_results"][0]["output_tokens"],
    ) == JUDGE_TOKENS

    # Only the two llm_evaluated criteria went to the judge, with the question, the
    # few-shot example and the conversation so far.
    assert len(judge.requests) == 2
    prompts = ["\n".join(m["content"] for m in r.json["messages"]) for r in judge.requests]
    polite_prompt = next(p for p in prompts if "[q:polite]" in p)
    assert "Bonjour!" in polite_prompt and "Greets warmly." in polite_prompt
    assert "Welcome to PARIS, Hello there. Ticket 123." in polite_prompt
    city_prompt = next(p for p in prompts if "[q:city]" in p)
    assert "Hello there." in city_prompt and "Where am I?" in city_prompt
    assert "Welcome to PARIS, Where am I? Ticket 123." in city_prompt
    assert all(r.json["model"] == "judge-model" for r in judge.requests)
    assert len(agent.requests) == 2


async def test_deterministic_checks_without_the_judge(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    agent.reply = "Your Order Number is AB-991. No refund possible."
    t, out = await setup(client, agent, judge)
    checks = [
        ("order number", "contains", "PASS"),  # case-insensitive
        ("ORDER NUMBER IS", "contains", "PASS"),
        ("invoice", "contains", "FAIL"),
        ("REFUND", "not_contains", "FAIL"),  # case-insensitive too
        ("discount", "not_contains", "PASS"),
        (r"[A-Z]{2}-\d{3}\b", "regex", "PASS"),
        (r"^No refund", "regex", "FAIL"),
    ]
    scenario = await create_scenario(
        client, t, turns=[turn("Status?", *(criterion(q, kind) for q, kind, _ in checks))]
    )
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)

    assert done["status"] == "failed", done
    [result] = done["turn_results"]
    assert result["passed"] is False
    assert result["stopped_early"] is False
    verdicts = [c["verdict"] for c in result["criteria_results"]]
    assert verdicts == [expected for _, _, expected in checks]
    for c in result["criteria_results"]:
        assert (c["input_tokens"], c["output_tokens"]) == (0, 0)
    assert result["criteria_results"][5]["evidence"] == "AB-991"
    assert judge.requests == [], "deterministic checks never call the judge"
    assert done["cost_summary"]["judge"]["calls"] == 0


async def test_a_failing_optional_turn_lets_the_run_go_on(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn("one", criterion("Fine? [q:a]"), required=True),
            turn("two", criterion("Bad? [fail] [q:b]"), criterion("Echo", "contains")),
            turn("three", criterion("Fine again? [q:c]")),
        ],
    )
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "failed", done
    assert done["completed_at"] is not None
    results = done["turn_results"]
    assert [r["turn_index"] for r in results] == [0, 1, 2]
    assert [r["passed"] for r in results] == [True, False, True]
    assert [r["stopped_early"] for r in results] == [False, False, False]
    assert [c["verdict"] for c in results[1]["criteria_results"]] == ["FAIL", "PASS"]
    assert [r.json["message"] for r in agent.requests] == ["one", "two", "three"]
    assert [r["status"] for r in results] == ["passed", "failed", "passed"]


async def test_a_failing_required_turn_stops_the_run(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn("one", criterion("one", "contains")),
            turn("two", criterion("Good? [q:x]"), criterion("missing", "contains"), required=True),
            turn("three", criterion("three", "contains")),
            turn("four"),
        ],
    )
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "failed", done
    assert done["completed_at"] is not None
    assert done["error_message"] is None
    results = done["turn_results"]
    # Every turn of the scenario is listed: the two after the failed required one skipped.
    assert [r["turn_index"] for r in results] == [0, 1, 2, 3]
    assert [r["status"] for r in results] == ["passed", "failed", "skipped", "skipped"]
    assert [r["passed"] for r in results] == [True, False, False, False]
    assert [r["stopped_early"] for r in results] == [False, True, False, False]
    assert [c["verdict"] for c in results[1]["criteria_results"]] == ["PASS", "FAIL"]
    for skipped in results[2:]:
        assert (skipped["user_message"], skipped["response_content"]) == ("", "")
        assert skipped["criteria_results"] == []
    assert len({r["id"] for r in results}) == 4
    assert [r.json["message"] for r in agent.requests] == ["one", "two"], "turns 3-4 not sent"
    assert len(judge.requests) == 1

    # A redelivery writes nothing more, skipped turns included.
    await execute(app, settings, done["id"])
    assert await get_run(client, t, done["id"]) == done
    assert len(agent.requests) == 2


# --- the engine: what the agent receives -----------------------------------------------------


async def test_templates_history_and_the_agent_request(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    t, out = await setup(client, agent, None)
    context = {"name": "Ada", "booking": {"id": "BK-42", "seats": 2}}
    scenario = await create_scenario(
        client,
        t,
        customer_context=context,
        turns=[
            turn("Hi {{ name }}, booking {{ booking.id }}", criterion("BK-42", "contains")),
            turn("Make it {{ booking.seats + 1 }} seats, {{ name | upper }}."),
            turn("Plain {text} and }} braces"),
        ],
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    await execute(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done

    first, second, third = (r.json for r in agent.requests)
    assert first["message"] == "Hi Ada, booking BK-42"
    assert second["message"] == "Make it 3 seats, ADA."
    assert third["message"] == "Plain {text} and }} braces"
    for body in (first, second, third):
        assert body["session_id"] == run["session_id"]
        assert body["customer_context"] == context
        assert isinstance(body["metadata"], dict)
        assert run["id"] in json.dumps(body["metadata"])
    assert first["messages"] == [{"role": "user", "content": "Hi Ada, booking BK-42"}]
    assert second["messages"] == [
        {"role": "user", "content": "Hi Ada, booking BK-42"},
        {"role": "assistant", "content": "Echo: Hi Ada, booking BK-42"},
        {"role": "user", "content": "Make it 3 seats, ADA."},
    ]
    assert third["messages"][:-1] == [
        *second["messages"],
        {"role": "assistant", "content": "Echo: Make it 3 seats, ADA."},
    ]
    assert third["messages"][-1] == {"role": "user", "content": "Plain {text} and }} braces"}
    assert [r["response_content"] for r in done["turn_results"]] == [
        "Echo: Hi Ada, booking BK-42",
        "Echo: Make it 3 seats, ADA.",
        "Echo: Plain {text} and }} braces",
    ]
    # Each result keeps the message as sent, not the template it was rendered from.
    assert [r["user_message"] for r in done["turn_results"]] == [
        "Hi Ada, booking BK-42",
        "Make it 3 seats, ADA.",
        "Plain {text} and }} braces",
    ]
    stored = await get_run(client, t, run["id"])
    assert stored["turn_results"] == done["turn_results"]


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ name.__class__.__init__.__globals__ }}",
        "Hello {{ nobody }}",
        "Hello {{ booking.missing.deeper }}",
        "Hello {{ name",
    ],
    ids=["sandbox-escape", "globals", "undefined", "undefined-attribute", "syntax"],
)
async def test_a_bad_template_ends_the_run_in_error_before_the_agent(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    db: AsyncSession,
    agent: FakeAgent,
    template: str,
) -> None:
    """What the check at save lets through (or a scenario saved before it) still cannot
    reach the agent."""
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(
        client,
        t,
        customer_context={"name": "Ada", "booking": {"id": "BK-1"}},
        turns=[turn("placeholder", criterion("x", "contains"))],
    )
    await plant_template(db, scenario["id"], template)
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert "template" in (done["error_message"] or ""), done["error_message"]
    assert "<class" not in done["error_message"], "the template was executed"
    assert done["completed_at"] is not None
    assert done["turn_results"] == []
    assert agent.requests == [], "the agent got nothing"
    # The turn it ended on, with no message: none could be rendered, so none was sent.
    assert done["error_turn"] == {
        "turn_index": 0,
        "user_message": None,
        "response_content": None,
        "tool_calls": [],
    }


async def test_every_top_level_key_of_the_context_is_a_template_variable(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    """DESIGN §5.2: the variables are the top-level keys of customer_context, whatever
    their names: a key that happens to be a Python parameter name is no exception."""
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(
        client,
        t,
        customer_context={"template": "T", "kwargs": "K", "name": "Ada"},
        turns=[turn("Hi {{ name }}, {{ template }}{{ kwargs }}")],
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    await execute(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    assert [r.json["message"] for r in agent.requests] == ["Hi Ada, TK"]


async def test_a_template_using_the_reserved_name_self_ends_in_error_not_stuck(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    db: AsyncSession,
    agent: FakeAgent,
) -> None:
    """Jinja binds ``self`` to the template: refused at save, and a scenario saved before
    that check ends its run as error and says so."""
    t, out = await setup(client, agent, None)
    context = {"self": "me", "name": "Ada"}
    template = "Hi {{ name }}, this is {{ self }}"
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios",
        json={"name": "self", "customer_context": context, "turns": [turn(template)]},
        headers=t.owner.headers,
    )
    assert response.status_code == 422, response.text
    assert "'self' is reserved" in response.json()["detail"][0]["msg"]
    scenario = await create_scenario(client, t, customer_context=context, turns=[turn("x")])
    await plant_template(db, scenario["id"], template)
    run = await start_run(client, t, scenario["id"], out.agent_id)
    await execute(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "error", done
    assert "'self' is reserved" in done["error_message"]
    assert agent.requests == []


async def test_a_template_building_a_huge_value_ends_in_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    t, out = await setup(client, agent, None)
    for template in ("{{ 'a' * 1000000000 }}", "{{ 'a' * 10 ** 9 }}", "{{ 1000000000 * 'a' }}"):
        scenario = await create_scenario(client, t, turns=[turn(template)])
        run = await start_run(client, t, scenario["id"], out.agent_id)
        await execute(app, settings, run["id"])
        done = await get_run(client, t, run["id"])
        assert done["status"] == "error", (template, done)
        assert done["error_message"].startswith("user message template failed"), done
    assert agent.requests == []


# Two loops of ten thousand steps: seconds of CPU if nothing stopped it.
CPU_BOUND = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}hi"


async def test_a_template_burning_cpu_ends_in_error_and_holds_up_no_other_run(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    """Any MEMBER can save such a template (201); run twice, it must neither stall the
    worker's other runs (templated or not) nor run for longer than its CPU bound."""
    t, out = await setup(client, agent, None)
    slow = await create_scenario(client, t, name="slow", turns=[turn("Hello"), turn(CPU_BOUND)])
    quick = [
        await create_scenario(
            client,
            t,
            name=f"quick {n}",
            customer_context={"n": n},
            turns=[
                turn("quick {{ n }}" if n % 2 else f"quick {n}", criterion("quick", "contains"))
            ],
        )
        for n in range(4)
    ]
    slow_runs = [await start_run(client, t, slow["id"], out.agent_id) for _ in range(2)]
    quick_runs = [await start_run(client, t, s["id"], out.agent_id) for s in quick]
    await asyncio.gather(*(execute(app, settings, r["id"]) for r in slow_runs + quick_runs))

    slow_done = [await get_run(client, t, r["id"]) for r in slow_runs]
    quick_done = [await get_run(client, t, r["id"]) for r in quick_runs]
    for done in slow_done:
        assert done["status"] == "error", done
        assert done["error_message"] == (
            "user message template failed (turn 2): rendering used more than 1 s of CPU"
        ), done["error_message"]
        assert [r["turn_index"] for r in done["turn_results"]] == [0]
    assert [d["status"] for d in quick_done] == ["passed"] * 4, quick_done
    # The quick runs did not wait for the slow templates: all ended before either did.
    assert max(d["completed_at"] for d in quick_done) < min(d["completed_at"] for d in slow_done)
    sent = sorted(r.json["message"] for r in agent.requests)
    assert sent == ["Hello", "Hello", "quick 0", "quick 1", "quick 2", "quick 3"]


# --- the engine: errors ------------------------------------------------------------------------


async def test_agent_answering_500_ends_in_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    failure = Reply(status=500, json={"error": "boom"}, headers={"Retry-After": "0"})
    agent.enqueue(*[failure] * 10)
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(client, t)
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("agent:"), done["error_message"]
    assert "500" in done["error_message"]
    assert done["completed_at"] is not None
    assert done["turn_results"] == []
    assert len(agent.requests) >= 2, "a 500 is retried"
    # The turn it ended on keeps the message that was sent; no reply came.
    sent = agent.requests[0].json["message"]
    assert done["error_turn"] == {
        "turn_index": 0,
        "user_message": sent,
        "response_content": None,
        "tool_calls": [],
    }


async def test_agent_reply_outside_the_protocol_ends_in_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    agent.enqueue(Reply(json={"text": "I forgot the protocol"}))
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(client, t)
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("agent:"), done["error_message"]
    assert done["turn_results"] == []
    assert len(agent.requests) == 1, "a 200 answer is not retried"


async def test_agent_timeout_ends_in_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    slow = Reply(json={"content": "too late"}, delay=2.0)
    agent.enqueue(*[slow] * 5)
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(client, t)
    run = await start_run(client, t, scenario["id"], out.agent_id)
    quick = msgspec.structs.replace(settings, egress_timeout_s=0.5)
    await execute(app, quick, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "error", done
    assert done["error_message"].startswith("agent:"), done["error_message"]
    assert "time" in done["error_message"].lower(), done["error_message"]
    assert done["turn_results"] == []
    # The timeout bounds the whole call: the first attempt took all of it (nobody waited
    # for the 2 s answer, which would have ended the run otherwise), so none followed.
    assert len(agent.requests) == 1
    assert f"timed out calling {agent.url}/chat after 1 attempt " in done["error_message"]


async def test_agent_host_not_allowed_ends_in_error_naming_the_host(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    t, out = await setup(client, agent, None)
    response = await client.delete(
        f"/v1/orgs/{t.id}/allowed-domains/{out.domain_id}", headers=t.owner.headers
    )
    assert response.status_code == 204, response.text
    scenario = await create_scenario(client, t)
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("agent:"), done["error_message"]
    assert "127.0.0.1" in done["error_message"]
    assert agent.requests == []


async def test_judge_garbage_is_retried_then_an_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    judge.reply = "I think it is fine, PASS I guess."
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(
        client, t, turns=[turn("one", criterion("Good? [q:x]")), turn("two")]
    )
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("judge:"), done["error_message"]
    assert len(judge.requests) == 2, "a malformed verdict is retried once"
    assert done["turn_results"] == [], "never counted as a PASS"
    assert len(agent.requests) == 1


async def test_judge_with_a_verdict_outside_pass_fail_is_an_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    judge.reply = json.dumps({"verdict": "MAYBE", "critique": "hmm", "evidence": ""})
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(client, t, turns=[turn("one", criterion("Good?"))])
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert done["error_message"].startswith("judge:"), done["error_message"]
    assert done["turn_results"] == []


async def test_a_regex_that_runs_away_ends_the_run_as_an_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    # Exponential backtracking on this reply: with no limit it would hold the worker for
    # longer than the test suite lives.
    agent.reply = "x" * 5000
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn("one", criterion("x", "contains"), criterion("(x+x+)+y", "regex")),
            turn("two"),
        ],
    )
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert done["error_message"] == "criterion: regex /(x+x+)+y/ ran longer than 1 s on the reply"
    assert done["turn_results"] == [], "an undecided check is never counted"
    assert len(agent.requests) == 1


async def test_llm_criterion_without_a_judge_provider_is_an_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(client, t, turns=[turn("one", criterion("Good?"))])
    done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
    assert done["status"] == "error", done
    assert "judge" in done["error_message"], done["error_message"]
    assert done["turn_results"] == []
    # The agent answered before the judge could not: the message and the reply are kept.
    reply = "Echo: one"
    assert done["error_turn"] == {
        "turn_index": 0,
        "user_message": "one",
        "response_content": reply,
        "tool_calls": [],
    }


async def test_agent_deleted_after_the_run_was_created(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(client, t)
    run = await start_run(client, t, scenario["id"], out.agent_id)
    response = await client.delete(
        f"/v1/orgs/{t.id}/agents/{out.agent_id}", headers=t.owner.headers
    )
    assert response.status_code == 204, response.text
    await execute(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "error", done
    assert "agent" in done["error_message"], done["error_message"]
    assert done["completed_at"] is not None
    assert agent.requests == []

    # A terminal run is never reopened.
    await execute(app, settings, run["id"])
    assert await get_run(client, t, run["id"]) == done


# --- cost and snapshot ---------------------------------------------------------------------------


async def test_cost_summary_adds_up_agent_and_judge_usage(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
) -> None:
    with (
        FakeAgent(reply="Fine.", usage=(100, 40)) as agent,
        FakeOpenAI(reply=judge_reply, prompt_tokens=1000, completion_tokens=200) as judge,
    ):
        t, out = await setup(
            client,
            agent,
            judge,
            judge_fields={"input_cost_per_mtok": 2.0, "output_cost_per_mtok": 8.0},
        )
        scenario = await create_scenario(
            client,
            t,
            turns=[
                turn("one", criterion("A? [q:a]"), criterion("B? [q:b]")),
                turn("two", criterion("fine", "contains")),
                turn("three", criterion("C? [q:c]")),
            ],
        )
        done = await run_to_end(client, app, settings, t, scenario["id"], out.agent_id)
        assert done["status"] == "passed", done
        assert len(judge.requests) == 3
    cost = done["cost_summary"]
    agent_side, judge_side = cost["agent"], cost["judge"]
    assert (agent_side["calls"], agent_side["input_tokens"], agent_side["output_tokens"]) == (
        3,
        300,
        120,
    )
    assert (judge_side["calls"], judge_side["input_tokens"], judge_side["output_tokens"]) == (
        3,
        3000,
        600,
    )
    expected = 3000 * 2.0 / 1e6 + 600 * 8.0 / 1e6  # the agent (http) has no prices
    assert cost["estimated_cost_usd"] == pytest.approx(expected, rel=1e-6)
    for side in (agent_side, judge_side):
        assert isinstance(side["latency_ms"], int | float) and side["latency_ms"] >= 0
    tokens = [
        (c["input_tokens"], c["output_tokens"])
        for r in done["turn_results"]
        for c in r["criteria_results"]
    ]
    assert tokens == [(1000, 200), (1000, 200), (0, 0), (1000, 200)]


async def test_cost_of_an_llm_agent_uses_its_provider_prices(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    judge: FakeOpenAI,
) -> None:
    with FakeOpenAI(reply="Model answer.", prompt_tokens=500, completion_tokens=50) as model:
        t = await tenant(client)
        out = await outbound_setup(
            client,
            t,
            model.url,
            judge.url,
            judge_fields={"input_cost_per_mtok": 1.0, "output_cost_per_mtok": 4.0},
        )
        provider = await create_judge_provider(
            client,
            t,
            model.url,
            name="agent model",
            is_default_judge=False,
            input_cost_per_mtok=3.0,
            output_cost_per_mtok=15.0,
        )
        response = await client.post(
            f"/v1/orgs/{t.id}/agents",
            json={
                "name": "llm agent",
                "kind": "llm",
                "llm_provider_id": provider["id"],
                "model": "agent-model",
                "system_prompt": "You are the agent under test.",
            },
            headers=t.owner.headers,
        )
        assert response.status_code == 201, response.text
        llm_agent = response.json()["id"]
        scenario = await create_scenario(
            client,
            t,
            turns=[
                turn("one", criterion("A? [q:a]")),
                turn("two", criterion("answer", "contains")),
            ],
        )
        done = await run_to_end(client, app, settings, t, scenario["id"], llm_agent)
        assert done["status"] == "passed", done
        assert [r.json["model"] for r in model.requests] == ["agent-model", "agent-model"]
        assert model.requests[1].json["messages"][0] == {
            "role": "system",
            "content": "You are the agent under test.",
        }
    assert out.agent_id != llm_agent
    cost = done["cost_summary"]
    assert (cost["agent"]["calls"], cost["agent"]["input_tokens"]) == (2, 1000)
    assert cost["agent"]["output_tokens"] == 100
    assert (cost["judge"]["calls"], cost["judge"]["input_tokens"]) == (1, JUDGE_TOKENS[0])
    assert cost["judge"]["output_tokens"] == JUDGE_TOKENS[1]
    expected = (1000 * 3.0 + 100 * 15.0) / 1e6 + (
        JUDGE_TOKENS[0] * 1.0 + JUDGE_TOKENS[1] * 4.0
    ) / 1e6
    assert cost["estimated_cost_usd"] == pytest.approx(expected, rel=1e-6)


async def test_the_agents_own_judge_and_the_business_information(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    with FakeOpenAI(reply=judge_reply) as own_judge:
        t, default = await setup(client, agent, judge)
        response = await client.patch(
            f"/v1/organizations/{t.id}",
            json={"business_information": "Acme Air sells flights to Lisbon."},
            headers=t.owner.headers,
        )
        assert response.status_code == 200, response.text
        provider = await create_judge_provider(
            client, t, own_judge.url, name="own judge", is_default_judge=False
        )
        special = await create_http_agent(
            client,
            t,
            agent.url,
            name="with its own judge",
            judge_provider_id=provider["id"],
            judge_model="special-judge",
        )
        scenario = await create_scenario(client, t, turns=[turn("one", criterion("A? [q:a]"))])

        done = await run_to_end(client, app, settings, t, scenario["id"], special["id"])
        assert done["status"] == "passed", done
        assert judge.requests == [], "the agent's judge wins over the org's default judge"
        [request] = own_judge.requests
        assert request.json["model"] == "special-judge"
        prompt = "\n".join(m["content"] for m in request.json["messages"])
        assert "Acme Air sells flights to Lisbon." in prompt

        # An agent without a judge of its own uses the default judge and its model.
        done = await run_to_end(client, app, settings, t, scenario["id"], default.agent_id)
        assert done["status"] == "passed", done
        assert len(own_judge.requests) == 1
        assert [r.json["model"] for r in judge.requests] == ["judge-model"]


async def test_the_run_executes_its_snapshot_not_later_edits(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    t, out = await setup(client, agent, None)
    scenario = await create_scenario(
        client,
        t,
        customer_context={"who": "Ada"},
        turns=[turn("first {{ who }}", criterion("first", "contains")), turn("second")],
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    deleted_later = await start_run(client, t, scenario["id"], out.agent_id)
    response = await client.put(
        f"/v1/orgs/{t.id}/scenarios/{scenario['id']}",
        json={
            "customer_context": {"who": "Eve"},
            "turns": [turn("edited", criterion("never", "contains"), required=True)],
        },
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text

    await execute(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    assert [r.json["message"] for r in agent.requests] == ["first Ada", "second"]
    assert [r["turn_index"] for r in done["turn_results"]] == [0, 1]
    # Each criterion result says what it asked, as the run's snapshot holds it: the
    # question and type it was judged on, not the scenario's after the edit.
    (result,) = done["turn_results"][0]["criteria_results"]
    assert result["criteria_id"] == scenario["turns"][0]["criteria"][0]["id"]
    assert (result["question"], result["criteria_type"]) == ("first", "contains")

    # Deleting the scenario does not strand its runs either.
    response = await client.delete(
        f"/v1/orgs/{t.id}/scenarios/{scenario['id']}", headers=t.owner.headers
    )
    assert response.status_code == 204, response.text
    await execute(app, settings, deleted_later["id"])
    other = await get_run(client, t, deleted_later["id"])
    assert other["status"] == "passed", other
    assert [r.json["message"] for r in agent.requests[2:]] == ["first Ada", "second"]


# --- durability and idempotency ------------------------------------------------------------------


async def test_executing_a_finished_run_again_changes_nothing(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(
        client, t, turns=[turn("one", criterion("A? [q:a]")), turn("two", criterion("B? [fail]"))]
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    await execute(app, settings, run["id"])
    first = await get_run(client, t, run["id"])
    assert first["status"] == "failed", first
    calls = (len(agent.requests), len(judge.requests))

    await execute(app, settings, run["id"])
    again = await get_run(client, t, run["id"])
    assert again == first, "a terminal run is never reopened nor rewritten"
    assert (len(agent.requests), len(judge.requests)) == calls
    assert await raw_counts(db, run["id"]) == ([(0, 1), (1, 1)], 2)


async def test_a_second_delivery_of_a_run_in_flight_changes_nothing(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    def slow_echo(body: dict[str, Any]) -> str:
        time.sleep(0.1)  # the second delivery arrives while the first plays turn 1
        return echo_reply(body)

    agent.reply = slow_echo
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(
        client, t, turns=[turn("one", criterion("one", "contains")), turn("two")]
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    first = asyncio.create_task(execute(app, settings, run["id"]))
    await agent.requests_received(1, wait_s=10)
    # The first delivery's heartbeat is alive: the duplicate does not claim the run.
    assert await execute_run(app.state.database, settings, UUID(run["id"])) is None
    await first
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    assert [r.json["message"] for r in agent.requests] == ["one", "two"]
    attempts = await db.scalar(select(ScenarioRun.attempts).where(ScenarioRun.id == run["id"]))
    assert attempts == 1, "a refused duplicate is not a delivery"


async def test_a_delivery_thought_dead_and_its_successor_write_each_result_once(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    def slow_echo(body: dict[str, Any]) -> str:
        time.sleep(0.1)  # both executions are past their claim before turn 1 is recorded
        return echo_reply(body)

    agent.reply = slow_echo
    t, out = await setup(client, agent, judge)
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn("one", criterion("A? [q:a]"), criterion("one", "contains")),
            turn("two", criterion("B? [q:b]")),
            turn("three", criterion("three", "contains"), criterion("nope", "not_contains")),
        ],
    )
    run = await start_run(client, t, scenario["id"], out.agent_id)
    # Heartbeats that are stale before they are stamped: each delivery takes the other for
    # dead (as with a worker whose loop stalled), both play, and the turn writes settle
    # which one goes on.
    hasty = msgspec.structs.replace(settings, run_heartbeat_timeout_s=-60.0)
    await asyncio.gather(execute(app, hasty, run["id"]), execute(app, hasty, run["id"]))
    messages = [r.json["message"] for r in agent.requests]
    assert messages.count("one") == 2, f"both executions should have raced on turn 1: {messages}"
    done = await get_run(client, t, run["id"])

    assert done["status"] == "passed", done
    assert done["completed_at"] is not None
    assert [r["turn_index"] for r in done["turn_results"]] == [0, 1, 2]
    assert [len(r["criteria_results"]) for r in done["turn_results"]] == [2, 1, 2]
    assert await raw_counts(db, run["id"]) == ([(0, 1), (1, 1), (2, 1)], 5)
    assert done["cost_summary"]["agent"]["calls"] == 3, "only recorded turns are counted"


async def test_an_interrupted_run_resumes_after_its_last_committed_turn(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    hang = threading.Event()
    hang.set()
    released = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if body["message"] == "second" and hang.is_set():
            released.wait(10)  # the first delivery's call to turn 2 never gets an answer
            return "late"
        return f"Echo: {body['message']}"

    with FakeAgent(reply=reply) as agent:
        t, out = await setup(client, agent, judge)
        scenario = await create_scenario(
            client,
            t,
            turns=[
                turn("first", criterion("Good? [q:a]")),
                turn("second", criterion("second", "contains")),
            ],
        )
        run = await start_run(client, t, scenario["id"], out.agent_id)
        task = asyncio.create_task(execute(app, settings, run["id"]))
        try:
            # Turn 2 is only sent once turn 1 has been committed.
            await agent.requests_received(2, wait_s=10)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout=0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            hang.clear()
            released.set()

        interrupted = await get_run(client, t, run["id"])
        assert interrupted["status"] == "running", interrupted
        assert interrupted["started_at"] is not None
        assert interrupted["completed_at"] is None
        assert [r["turn_index"] for r in interrupted["turn_results"]] == [0]
        assert interrupted["turn_results"][0]["response_content"] == "Echo: first"
        assert await raw_counts(db, run["id"]) == ([(0, 1)], 1)
        judge_calls = len(judge.requests)

        # Redelivery: resumes at turn 2, with turn 1's exchange as history.
        await execute(app, settings, run["id"])
        done = await get_run(client, t, run["id"])
        assert done["status"] == "passed", done
        assert [r["turn_index"] for r in done["turn_results"]] == [0, 1]
        assert done["turn_results"][0] == interrupted["turn_results"][0]
        assert done["turn_results"][1]["response_content"] == "Echo: second"
        assert done["started_at"] == interrupted["started_at"]
        assert await raw_counts(db, run["id"]) == ([(0, 1), (1, 1)], 2)
        messages = [r.json["message"] for r in agent.requests]
        assert messages == ["first", "second", "second"], "turn 1 was not replayed"
        assert agent.requests[-1].json["messages"] == [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "Echo: first"},
            {"role": "user", "content": "second"},
        ]
        assert agent.requests[-1].json["session_id"] == run["session_id"]
        assert len(judge.requests) == judge_calls, "turn 1 was not judged again"
        assert done["cost_summary"]["agent"]["calls"] == 2

        # And once terminal, never reopened.
        await execute(app, settings, run["id"])
        assert await get_run(client, t, run["id"]) == done
        assert len(agent.requests) == 3


async def test_a_resumed_run_remembers_an_earlier_failed_turn(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    db: AsyncSession,
) -> None:
    released = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if body["message"] == "second" and not released.is_set():
            released.wait(10)
        return f"Echo: {body['message']}"

    with FakeAgent(reply=reply) as agent:
        t, out = await setup(client, agent, None)
        scenario = await create_scenario(
            client,
            t,
            turns=[
                turn("first", criterion("absent", "contains")),  # fails, not required
                turn("second", criterion("second", "contains")),
            ],
        )
        run = await start_run(client, t, scenario["id"], out.agent_id)
        task = asyncio.create_task(execute(app, settings, run["id"]))
        try:
            await agent.requests_received(2, wait_s=10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            released.set()
        assert await raw_counts(db, run["id"]) == ([(0, 1)], 1)

        await execute(app, settings, run["id"])
        done = await get_run(client, t, run["id"])
    assert done["status"] == "failed", "turn 1 failed before the interruption"
    assert [r["passed"] for r in done["turn_results"]] == [False, True]
