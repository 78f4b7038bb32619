"""An ``llm`` agent under test answers from its knowledge (DESIGN §5.4): ``always``
documents in its system context, ``on_demand`` chunks retrieved for each message, what
it was given recorded in the turn result, and runs that wait for documents still being
processed.  The LLM is a loopback :class:`FakeOpenAI` that records every request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Tenant, tenant
from tests.support.fakes import FakeOpenAI
from tests.support.knowledge import collection, kb, process, upload
from tests.support.scenario_setup import (
    allow_domain,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    start_run,
    turn,
)

HOURS = "# Store hours\n\nOur stores open from 9:00 to 17:00, Monday to Saturday."
REFUNDS = """# Refund policy

## Timing

Refunds reach the original payment method within 5 business days.

## Store credit

Store credit is issued instantly.
"""
SECRET_RECIPE = "# Recipe\n\nThe secret sauce is mostly ketchup and refunds of flavour."


@pytest.fixture
def llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply="Refunds take 5 business days.") as fake:
        yield fake


async def llm_agent(client: AsyncTestClient, t: Tenant, llm_url: str, name: str = "shop bot"):
    """An ``llm`` agent on a provider at ``llm_url`` (the first one allows the loopback)."""
    if name == "shop bot":
        await allow_domain(client, t)
    provider = await create_judge_provider(client, t, llm_url, name=f"llm for {name}")
    response = await client.post(
        f"/v1/orgs/{t.id}/agents",
        json={
            "name": name,
            "kind": "llm",
            "llm_provider_id": provider["id"],
            "model": "shop-model",
            "system_prompt": "You are the shop's assistant.",
        },
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


async def bookmark(client, t, document_id: str, mode: str, agent_ids: list[str], usage=None):
    response = await client.put(
        kb(t, "documents", document_id, "bookmark"),
        json={"bookmarkMode": mode, "usageDescription": usage, "agentIds": agent_ids},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text


async def run_once(client, app, settings, t, agent_id: str, *checks) -> dict[str, Any]:
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn("How long do refunds take?", criterion("5 business days", "contains"), *checks)
        ],
    )
    run = await start_run(client, t, scenario["id"], agent_id)
    await execute_run(app.state.database, settings, UUID(run["id"]))
    return await get_run(client, t, run["id"])


def system_prompt(request) -> str:
    (system,) = [m["content"] for m in request.json["messages"] if m["role"] == "system"]
    return system


async def test_an_llm_agent_gets_its_always_documents_and_retrieved_chunks(
    client: AsyncTestClient, app: Litestar, settings: Settings, llm: FakeOpenAI
) -> None:
    t = await tenant(client)
    agent = await llm_agent(client, t, llm.url)
    other = await llm_agent(client, t, llm.url, name="kitchen bot")  # after the first
    cid = await collection(client, t)
    hours = await upload(client, t, cid, HOURS, filename="hours.md")
    refunds = await upload(client, t, cid, REFUNDS, filename="refunds.md")
    recipe = await upload(client, t, cid, SECRET_RECIPE, filename="recipe.md")
    unbookmarked = await upload(client, t, cid, "# Refunds FAQ\n\nrefunds refunds refunds")
    for doc in (hours, refunds, recipe, unbookmarked):
        await process(app, doc["id"])
    await bookmark(client, t, hours["id"], "always", [agent["id"]])
    await bookmark(client, t, refunds["id"], "on_demand", [agent["id"]], usage="refund questions")
    await bookmark(client, t, recipe["id"], "on_demand", [other["id"]])

    searched = criterion(
        "search_knowledge",
        "tool_called",
        expected_arguments={"query": "How long do refunds take?"},
    )
    final = await run_once(client, app, settings, t, agent["id"], searched)
    assert final["status"] == "passed", final
    system = system_prompt(llm.requests[-1])
    assert system.startswith("You are the shop's assistant.")
    assert "Our stores open from 9:00 to 17:00" in system  # always
    assert "Refunds reach the original payment method within 5 business days." in system
    assert "(Use: refund questions)" in system
    assert "## Refund policy > Timing\n" in system  # where the chunk sits
    assert "ketchup" not in system and "refunds refunds" not in system  # not this agent's

    (result,) = final["turn_results"]
    given = result["knowledge"]
    assert given[0] == {
        "documentId": hours["id"],
        "title": "Store hours",
        "mode": "always",
        "chunkId": None,
        "headingPath": [],
        "score": None,
    }
    on_demand = [g for g in given if g["mode"] == "on_demand"]
    assert on_demand and on_demand[0]["documentId"] == refunds["id"]
    assert on_demand[0]["headingPath"] == ["Refund policy", "Timing"]
    assert on_demand[0]["score"] > 0
    assert {g["documentId"] for g in given} <= {hours["id"], refunds["id"]}
    # The retrieval is reported as the agent's tool call: the query, and what it found.
    (search,) = result["tool_calls"]
    assert search == {
        "name": "search_knowledge",
        "arguments": {"query": "How long do refunds take?"},
        "output": on_demand,
    }
    assert result["criteria_results"][1]["verdict"] == "PASS"


async def test_agents_without_knowledge_and_http_agents_record_none(
    client: AsyncTestClient, app: Litestar, settings: Settings, llm: FakeOpenAI
) -> None:
    t = await tenant(client)
    agent = await llm_agent(client, t, llm.url)
    unsearched = criterion("search_knowledge", "tool_not_called")
    final = await run_once(client, app, settings, t, agent["id"], unsearched)
    assert final["status"] == "passed", final
    assert final["turn_results"][0]["knowledge"] is None
    assert final["turn_results"][0]["tool_calls"] == []  # nothing to search: no search
    assert system_prompt(llm.requests[-1]) == "You are the shop's assistant."


async def test_a_run_waits_for_documents_still_processing(
    client: AsyncTestClient, app: Litestar, settings: Settings, llm: FakeOpenAI
) -> None:
    t = await tenant(client)
    agent = await llm_agent(client, t, llm.url)
    cid = await collection(client, t)
    hours = await upload(client, t, cid, HOURS, filename="hours.md")
    await bookmark(client, t, hours["id"], "always", [agent["id"]])

    async def process_later() -> None:
        await asyncio.sleep(0.8)
        await process(app, hours["id"])

    processing = asyncio.create_task(process_later())
    final = await run_once(client, app, settings, t, agent["id"])
    await processing
    assert final["status"] == "passed", final
    assert "Our stores open" in system_prompt(llm.requests[-1])
    assert final["turn_results"][0]["tool_calls"] == []  # always documents: given, not searched


async def test_a_run_whose_documents_never_get_ready_ends_in_error_naming_them(
    client: AsyncTestClient, app: Litestar, settings: Settings, llm: FakeOpenAI
) -> None:
    t = await tenant(client)
    agent = await llm_agent(client, t, llm.url)
    cid = await collection(client, t)
    stuck = await upload(client, t, cid, HOURS, filename="hours.md")
    await bookmark(client, t, stuck["id"], "always", [agent["id"]])
    impatient = msgspec.structs.replace(settings, knowledge_wait_s=0.3)
    final = await run_once(client, app, impatient, t, agent["id"])
    assert final["status"] == "error"
    assert "not ready" in final["error_message"] and stuck["id"] in final["error_message"]
    assert "hours.md" in final["error_message"]
    assert llm.requests == []  # the agent never saw a conversation without its documents
