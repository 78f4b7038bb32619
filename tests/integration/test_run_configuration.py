"""What a run calls out with (its agent, the egress policy, the judge) is cached by the
workers per organization version (``shared.outbound.configuration.load_outbound``): every write
to agents, LLM providers, credentials or allowed domains moves the version, so the next
run to start sees the change even when a run before it — in the same process — loaded
the configuration a moment earlier."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.errors import NotFound
from shared.outbound.configuration import load_outbound
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Tenant, tenant
from tests.support.fakes import FakeAgent, FakeOpenAI
from tests.support.scenario_setup import (
    create_http_agent,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

NOWHERE = "http://127.0.0.1:9"  # never called: only stored


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply="Hello, how can I help?") as fake:
        yield fake


@pytest.fixture
def other_agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply="Another agent here.") as fake:
        yield fake


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply='{"verdict": "PASS", "critique": "ok", "evidence": "ok"}') as fake:
        yield fake


async def version(db: AsyncSession, t: Tenant) -> int:
    value = await db.scalar(
        text("SELECT outbound_version FROM organizations WHERE id = :id"), {"id": t.id}
    )
    await db.commit()
    return int(value)


async def run_once(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    scenario_id: str,
    agent_id: str,
) -> dict[str, Any]:
    run = await start_run(client, t, scenario_id, agent_id)
    await execute_run(app.state.database, settings, UUID(run["id"]))
    return await get_run(client, t, run["id"])


def url(t: Tenant, tail: str) -> str:
    return f"/v1/orgs/{t.id}/{tail}"


def expect(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json() if status != 204 else {}


# Each change: (what to prepare first, unmeasured; the change measured).  Both take the
# client, the tenant and the ids made by the setup, and may add ids for the second step.


async def nothing(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    return None


async def spare_provider(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    made = await create_judge_provider(client, t, NOWHERE, name="spare", is_default_judge=False)
    ids["spare_provider"] = made["id"]


async def spare_agent(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    ids["spare_agent"] = (await create_http_agent(client, t, NOWHERE, name="spare"))["id"]


async def spare_credential(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    expect(
        await client.put(
            url(t, "credentials/spare"), json={"value": "v1-secret"}, headers=t.owner.headers
        ),
        201,
    )


async def create_domain(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    body = {"domain": "api.example.com"}
    expect(await client.post(url(t, "allowed-domains/"), json=body, headers=t.owner.headers), 201)


async def update_domain(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    body = {"headers": {"X-Team": "qa"}}
    response = await client.patch(
        url(t, f"allowed-domains/{ids['domain']}"), json=body, headers=t.owner.headers
    )
    expect(response, 200)


async def delete_domain(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    expect(
        await client.delete(url(t, f"allowed-domains/{ids['domain']}"), headers=t.owner.headers),
        204,
    )


async def create_credential(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    expect(
        await client.put(
            url(t, "credentials/fresh"), json={"value": "v1-secret"}, headers=t.owner.headers
        ),
        201,
    )


async def replace_credential(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    expect(
        await client.put(
            url(t, "credentials/spare"), json={"value": "v2-secret"}, headers=t.owner.headers
        ),
        200,
    )


async def delete_credential(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    expect(await client.delete(url(t, "credentials/spare"), headers=t.owner.headers), 204)


async def create_provider(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    await create_judge_provider(client, t, NOWHERE, name="second", is_default_judge=False)


async def update_provider(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    body = {"default_model": "judge-2"}
    response = await client.patch(
        url(t, f"llm-providers/{ids['provider']}"), json=body, headers=t.owner.headers
    )
    expect(response, 200)


async def delete_provider(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    response = await client.delete(
        url(t, f"llm-providers/{ids['spare_provider']}"), headers=t.owner.headers
    )
    expect(response, 204)


async def create_agent(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    await create_http_agent(client, t, NOWHERE, name="another agent")


async def update_agent(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    body = {"description": "version two"}
    response = await client.patch(
        url(t, f"agents/{ids['agent']}"), json=body, headers=t.owner.headers
    )
    expect(response, 200)


async def delete_agent(client: AsyncTestClient, t: Tenant, ids: dict[str, Any]) -> None:
    expect(
        await client.delete(url(t, f"agents/{ids['spare_agent']}"), headers=t.owner.headers), 204
    )


CHANGES = {
    "create an allowed domain": (nothing, create_domain),
    "update an allowed domain": (nothing, update_domain),
    "delete an allowed domain": (nothing, delete_domain),
    "create a credential": (nothing, create_credential),
    "replace a credential": (spare_credential, replace_credential),
    "delete a credential": (spare_credential, delete_credential),
    "create an LLM provider": (nothing, create_provider),
    "update an LLM provider": (nothing, update_provider),
    "delete an LLM provider": (spare_provider, delete_provider),
    "create an agent": (nothing, create_agent),
    "update an agent": (nothing, update_agent),
    "delete an agent": (spare_agent, delete_agent),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_every_outbound_change_moves_the_organizations_version(
    client: AsyncTestClient, db: AsyncSession, agent: FakeAgent, judge: FakeOpenAI, change: str
) -> None:
    t = await tenant(client)
    other = await tenant(client)
    made = await outbound_setup(client, t, agent.url, judge.url)
    ids = {"domain": made.domain_id, "agent": made.agent_id, "provider": made.judge_provider_id}
    prepare, act = CHANGES[change]
    await prepare(client, t, ids)
    before, other_before = await version(db, t), await version(db, other)

    await act(client, t, ids)

    assert await version(db, t) > before
    assert await version(db, other) == other_before  # another tenant's cache stays warm


async def test_reading_the_configuration_leaves_the_version_alone(
    client: AsyncTestClient, db: AsyncSession, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    t = await tenant(client)
    made = await outbound_setup(client, t, agent.url, judge.url)
    before = await version(db, t)
    for tail in (
        "allowed-domains/",
        "credentials",
        "llm-providers",
        "agents",
        f"agents/{made.agent_id}",
    ):
        expect(await client.get(url(t, tail), headers=t.owner.headers), 200)
    assert await version(db, t) == before


async def test_a_changed_agent_endpoint_reaches_the_very_next_run(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    other_agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    t = await tenant(client)
    made = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Is it polite?"))])
    first = await run_once(client, app, settings, t, scenario["id"], made.agent_id)
    assert first["status"] == "passed", first
    assert len(agent.requests) == 1

    response = await client.patch(
        url(t, f"agents/{made.agent_id}"),
        json={"endpoint_url": f"{other_agent.url}/chat"},
        headers=t.owner.headers,
    )
    expect(response, 200)
    second = await run_once(client, app, settings, t, scenario["id"], made.agent_id)

    assert second["status"] == "passed", second
    assert second["turn_results"][0]["response_content"] == "Another agent here."
    assert len(agent.requests) == 1  # the cached configuration was not used
    assert len(other_agent.requests) == 1


async def test_a_removed_allowed_domain_stops_the_very_next_run(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    t = await tenant(client)
    made = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Is it polite?"))])
    assert (await run_once(client, app, settings, t, scenario["id"], made.agent_id))[
        "status"
    ] == "passed"

    expect(
        await client.delete(url(t, f"allowed-domains/{made.domain_id}"), headers=t.owner.headers),
        204,
    )
    refused = await run_once(client, app, settings, t, scenario["id"], made.agent_id)

    assert refused["status"] == "error", refused
    assert refused["error_message"].startswith("agent:")
    assert "allowed domains" in refused["error_message"]
    assert len(agent.requests) == 1


async def test_a_replaced_credential_is_sent_by_the_very_next_run(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    t = await tenant(client)
    body = {"value": "first-secret-value"}
    expect(
        await client.put(url(t, "credentials/agent_token"), json=body, headers=t.owner.headers), 201
    )
    made = await outbound_setup(client, t, agent.url, judge.url)
    header = {"headers": {"X-Agent-Token": "{{credentials.agent_token}}"}}
    expect(
        await client.patch(
            url(t, f"allowed-domains/{made.domain_id}"), json=header, headers=t.owner.headers
        ),
        200,
    )
    scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Is it polite?"))])
    await run_once(client, app, settings, t, scenario["id"], made.agent_id)

    body = {"value": "second-secret-value"}
    expect(
        await client.put(url(t, "credentials/agent_token"), json=body, headers=t.owner.headers), 200
    )
    await run_once(client, app, settings, t, scenario["id"], made.agent_id)

    sent = [request.header("x-agent-token") for request in agent.requests]
    assert sent == ["first-secret-value", "second-secret-value"]


async def test_runs_starting_together_load_the_configuration_once(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    """A batch's first window starts many runs of one agent at the same moment: one of them
    loads the configuration, the others wait for it rather than all querying at once."""
    t = await tenant(client)
    made = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Is it polite?"))])
    runs = [await start_run(client, t, scenario["id"], made.agent_id) for _ in range(6)]
    agent_queries = await _played_together(app, settings, runs)
    assert len(agent_queries) == 1, agent_queries
    for run in runs:
        assert (await get_run(client, t, run["id"]))["status"] == "passed"


async def test_runs_starting_together_share_one_failed_load(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """A configuration that cannot load (its agent is no longer the organization's) is
    tried once for all the runs waiting on it: each ends in error naming why, and none of
    them loads it again on its own."""
    t = await tenant(client)
    other = await tenant(client)
    made = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Is it polite?"))])
    runs = [await start_run(client, t, scenario["id"], made.agent_id) for _ in range(6)]
    await db.execute(
        text("UPDATE agents SET organization_id = :other WHERE id = :agent"),
        {"other": other.id, "agent": made.agent_id},
    )
    await db.commit()
    agent_queries = await _played_together(app, settings, runs)
    assert len(agent_queries) == 1, agent_queries
    for run in runs:
        ended = await get_run(client, t, run["id"])
        assert (ended["status"], ended["error_message"]) == (
            "error",
            "cannot start: agent not found",
        )
    assert agent.requests == []


async def test_a_failed_load_is_not_kept_the_next_one_reads_again(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession
) -> None:
    """A load that failed is not cached: once what made it fail is mended, the next load at
    the same version reads again and succeeds."""
    t = await tenant(client)
    other = await tenant(client)
    made = await outbound_setup(client, t, NOWHERE)
    as_of = await version(db, t)
    move = text("UPDATE agents SET organization_id = :org WHERE id = :agent")
    await db.execute(move, {"org": other.id, "agent": made.agent_id})
    await db.commit()
    with pytest.raises(NotFound):
        await load_outbound(app.state.database, settings, t.id, UUID(made.agent_id), as_of)
    await db.execute(move, {"org": t.id, "agent": made.agent_id})
    await db.commit()
    loaded = await load_outbound(app.state.database, settings, t.id, UUID(made.agent_id), as_of)
    assert str(loaded.agent.id) == made.agent_id


async def test_a_provider_named_by_the_agent_is_found_whatever_order_the_reads_take(
    client: AsyncTestClient, app: Litestar, settings: Settings, judge: FakeOpenAI, db: AsyncSession
) -> None:
    """The configuration's reads run at once, so the providers' may see the database as it
    was before the agent's does.  Here the agent's read waits (its table locked) while the
    others go; meanwhile a credential and a provider using it are created and the agent is
    pointed at that provider as its judge.  The load still finds the provider, with its key:
    what a row names was committed before it, and the load reads it after."""
    t = await tenant(client)
    made = await outbound_setup(client, t, NOWHERE)  # an agent without a judge
    loaded_as_of = await version(db, t)
    await db.execute(text("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE"))
    load = asyncio.create_task(
        load_outbound(app.state.database, settings, t.id, UUID(made.agent_id), loaded_as_of)
    )
    await asyncio.sleep(0.3)  # every read but the agent's is done
    assert not load.done()
    body = {"value": "judge-secret-value"}
    expect(
        await client.put(url(t, "credentials/judge_key"), json=body, headers=t.owner.headers), 201
    )
    provider = await create_judge_provider(
        client, t, judge.url, name="new judge", is_default_judge=False, credential_key="judge_key"
    )
    await db.execute(
        text("UPDATE agents SET judge_provider_id = :provider WHERE id = :agent"),
        {"provider": provider["id"], "agent": made.agent_id},
    )
    await db.commit()  # the agent's read goes on, and finds the new judge
    loaded = await asyncio.wait_for(load, 10)
    assert loaded.judge is not None
    assert (str(loaded.judge.id), loaded.judge.api_key) == (provider["id"], "judge-secret-value")


async def test_a_providers_key_is_found_when_it_names_a_credential_made_just_before(
    client: AsyncTestClient, app: Litestar, settings: Settings, judge: FakeOpenAI, db: AsyncSession
) -> None:
    """A credential made, then the judge provider set to use it: the providers' read waits
    (its table locked) while the others go, and the load still finds the key, the
    credentials being read once the rows that name them are."""
    t = await tenant(client)
    made = await outbound_setup(client, t, NOWHERE, judge.url)  # a judge without a key
    loaded_as_of = await version(db, t)
    await db.execute(text("LOCK TABLE llm_providers IN ACCESS EXCLUSIVE MODE"))
    load = asyncio.create_task(
        load_outbound(app.state.database, settings, t.id, UUID(made.agent_id), loaded_as_of)
    )
    await asyncio.sleep(0.3)  # every read but the providers' is done
    assert not load.done()
    body = {"value": "judge-secret-value"}
    expect(
        await client.put(url(t, "credentials/judge_key"), json=body, headers=t.owner.headers), 201
    )
    await db.execute(
        text("UPDATE llm_providers SET credential_key = 'judge_key' WHERE id = :provider"),
        {"provider": made.judge_provider_id},
    )
    await db.commit()
    loaded = await asyncio.wait_for(load, 10)
    assert loaded.judge is not None and loaded.judge.api_key == "judge-secret-value"


async def _played_together(
    app: Litestar, settings: Settings, runs: list[dict[str, Any]]
) -> list[str]:
    """Plays ``runs`` at once, as a batch's first window starts; the statements that read
    an agent meanwhile.  The agents' table stays locked until every run has claimed its
    row, so that the first run's load of the configuration is still under way when the
    last one wants it, however slowly a busy machine lets them start."""
    agent_queries: list[str] = []
    ids = [UUID(r["id"]) for r in runs]

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM agents" in statement:
            agent_queries.append(statement)

    database = app.state.database
    event.listen(database.engine.sync_engine, "before_cursor_execute", count)
    try:
        async with database.transaction() as lock:
            await lock.execute(text("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE"))
            played = asyncio.gather(*(execute_run(database, settings, run) for run in ids))
            claimed = text(
                "SELECT count(*) FROM scenario_runs WHERE id = ANY(:ids) AND attempts > 0"
            )
            for _ in range(1500):  # 30 s at most
                if await lock.scalar(claimed, {"ids": ids}) == len(ids):
                    break
                await asyncio.sleep(0.02)
        await played  # the lock released with the block's commit
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", count)
    return agent_queries
