"""LLM providers and agents (DESIGN §3, §5.1).

Providers: ``openai`` / ``anthropic`` get their public base URL by default,
``openai_compatible`` must name one; a ``credential_key`` must name an existing
credential of the organization; one default judge per organization; a provider an agent
uses cannot be deleted.  Agents: ``http`` needs ``endpoint_url`` (protocol ``spar`` by
default), ``llm`` needs ``llm_provider_id`` (model defaults to the provider's
``default_model``); providers of another organization are never reachable (404).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import Agent
from shared.logs import JsonFormatter
from tests.support.factories import Tenant, tenant

PROVIDER_FIELDS = {
    "id",
    "organization_id",
    "name",
    "provider",
    "base_url",
    "default_model",
    "credential_key",
    "input_cost_per_mtok",
    "output_cost_per_mtok",
    "is_default_judge",
    "is_default_simulator",
    "request_options",
    "anthropic_version",
    "created_at",
    "updated_at",
}
AGENT_FIELDS = {
    "id",
    "organization_id",
    "name",
    "description",
    "kind",
    "endpoint_url",
    "protocol",
    "llm_provider_id",
    "model",
    "system_prompt",
    "judge_provider_id",
    "judge_model",
    "created_at",
    "updated_at",
}


def providers_path(t: Tenant, provider_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/llm-providers"
    return base if provider_id is None else f"{base}/{provider_id}"


def agents_path(t: Tenant, agent_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/agents"
    return base if agent_id is None else f"{base}/{agent_id}"


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def single_error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    entries = response.json()["detail"]
    assert isinstance(entries, list) and len(entries) == 1, entries
    entry = entries[0]
    assert set(entry) == {"loc", "msg", "type", "input", "ctx"}, entry
    assert isinstance(entry["msg"], str) and entry["msg"], entry
    return entry


async def put_credential(client: AsyncTestClient, t: Tenant, key: str) -> None:
    response = await client.put(
        f"/v1/orgs/{t.id}/credentials/{key}", json={"value": "sk-x"}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text


async def create_provider(client: AsyncTestClient, t: Tenant, **fields: Any) -> dict[str, Any]:
    body = {"name": "OpenAI", "provider": "openai", "default_model": "gpt-4o-mini", **fields}
    response = await client.post(providers_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    return response.json()


async def create_agent(client: AsyncTestClient, t: Tenant, **fields: Any) -> dict[str, Any]:
    body = {"name": "bot", "kind": "http", "endpoint_url": "https://agent.example.com/chat"}
    response = await client.post(agents_path(t), json={**body, **fields}, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    return response.json()


async def get(client: AsyncTestClient, t: Tenant, path: str) -> dict[str, Any]:
    response = await client.get(path, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


COUNTS = {
    "agents": text("SELECT count(*) FROM agents"),
    "llm_providers": text("SELECT count(*) FROM llm_providers"),
}


async def count(db: AsyncSession, table: str) -> int:
    value = int(await db.scalar(COUNTS[table]) or 0)
    await db.commit()
    return value


# --- providers: create ------------------------------------------------------------------------


async def test_create_provider_with_every_field(client: AsyncTestClient) -> None:
    t = await tenant(client)
    await put_credential(client, t, "openai_key")
    body = {
        "name": "Local vLLM",
        "provider": "openai_compatible",
        "base_url": "http://127.0.0.1:8000/v1",
        "default_model": "llama-3-8b",
        "credential_key": "openai_key",
        "input_cost_per_mtok": 0.5,
        "output_cost_per_mtok": 1.25,
        "is_default_judge": True,
    }
    response = await client.post(providers_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created) == PROVIDER_FIELDS
    uuid.UUID(created["id"])
    assert created["organization_id"] == t.id
    assert {k: created[k] for k in body} == body
    assert parse_time(created["created_at"]) <= parse_time(created["updated_at"])
    assert await get(client, t, providers_path(t, created["id"])) == created


async def test_provider_defaults(client: AsyncTestClient) -> None:
    t = await tenant(client)
    openai = await create_provider(client, t, provider="openai")
    anthropic = await create_provider(
        client, t, name="Claude", provider="anthropic", default_model="claude-sonnet"
    )
    assert openai["base_url"] == "https://api.openai.com/v1"
    assert anthropic["base_url"] == "https://api.anthropic.com"
    for provider in (openai, anthropic):
        assert provider["credential_key"] is None
        assert provider["input_cost_per_mtok"] is None
        assert provider["output_cost_per_mtok"] is None
        assert provider["is_default_judge"] is False
    # An explicit base_url wins over the default.
    proxied = await create_provider(client, t, base_url="https://proxy.example.com/openai/v1")
    assert proxied["base_url"] == "https://proxy.example.com/openai/v1"


async def test_invalid_providers_are_422_and_nothing_is_stored(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    base = {"name": "P", "provider": "openai", "default_model": "m"}
    cases: list[tuple[str, dict[str, Any], list[str]]] = [
        (
            "openai_compatible without base_url",
            {**base, "provider": "openai_compatible"},
            ["body", "base_url"],
        ),
        (
            "openai_compatible with null base_url",
            {**base, "provider": "openai_compatible", "base_url": None},
            ["body", "base_url"],
        ),
        ("ftp base_url", {**base, "base_url": "ftp://files.example.com"}, ["body", "base_url"]),
        ("relative base_url", {**base, "base_url": "/v1"}, ["body", "base_url"]),
        ("host-less base_url", {**base, "base_url": "https://"}, ["body", "base_url"]),
        ("unknown provider kind", {**base, "provider": "mistral"}, ["body", "provider"]),
        (
            "negative input cost",
            {**base, "input_cost_per_mtok": -0.01},
            ["body", "input_cost_per_mtok"],
        ),
        (
            "negative output cost",
            {**base, "output_cost_per_mtok": -1},
            ["body", "output_cost_per_mtok"],
        ),
        ("missing credential", {**base, "credential_key": "nope"}, ["body", "credential_key"]),
        ("malformed credential key", {**base, "credential_key": "a b"}, ["body", "credential_key"]),
        ("missing name", {k: v for k, v in base.items() if k != "name"}, ["body", "name"]),
        ("missing default_model", {"name": "P", "provider": "openai"}, ["body", "default_model"]),
        ("empty default_model", {**base, "default_model": ""}, ["body", "default_model"]),
    ]
    problems = []
    for name, body, loc in cases:
        response = await client.post(providers_path(t), json=body, headers=t.owner.headers)
        if response.status_code != 422:
            problems.append(f"{name}: {response.status_code} {response.text[:200]}")
            continue
        entries = response.json()["detail"]
        if [e["loc"] for e in entries] != [loc]:
            problems.append(f"{name}: {entries}")
    assert not problems, "\n".join(problems)
    assert await count(db, "llm_providers") == 0


async def test_zero_costs_are_accepted(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create_provider(client, t, input_cost_per_mtok=0, output_cost_per_mtok=0)
    assert created["input_cost_per_mtok"] == 0
    assert created["output_cost_per_mtok"] == 0


async def test_credential_of_another_organization_is_unknown(client: AsyncTestClient) -> None:
    a = await tenant(client)
    b = await tenant(client)
    await put_credential(client, b, "b_key")
    response = await client.post(
        providers_path(a),
        json={"name": "P", "provider": "openai", "default_model": "m", "credential_key": "b_key"},
        headers=a.owner.headers,
    )
    assert single_error(response)["loc"] == ["body", "credential_key"]


# --- providers: default judge ------------------------------------------------------------------


async def test_only_one_default_judge_per_organization(client: AsyncTestClient) -> None:
    t = await tenant(client)
    other = await tenant(client)
    foreign = await create_provider(client, other, is_default_judge=True)

    first = await create_provider(client, t, name="first", is_default_judge=True)
    second = await create_provider(client, t, name="second", is_default_judge=True)
    assert second["is_default_judge"] is True
    assert (await get(client, t, providers_path(t, first["id"])))["is_default_judge"] is False

    # PATCH the first back: the second loses it.
    response = await client.patch(
        providers_path(t, first["id"]), json={"is_default_judge": True}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["is_default_judge"] is True
    listing = await get(client, t, providers_path(t))
    judges = [p["name"] for p in listing["llm_providers"] if p["is_default_judge"]]
    assert judges == ["first"]

    # A non-judge provider created afterwards changes nothing.
    await create_provider(client, t, name="third")
    listing = await get(client, t, providers_path(t))
    assert [p["name"] for p in listing["llm_providers"] if p["is_default_judge"]] == ["first"]

    # Another organization's default judge is untouched by all of this.
    assert (await get(client, other, providers_path(other, foreign["id"])))["is_default_judge"]


async def test_concurrent_default_judges_leave_exactly_one_and_answer_no_5xx(
    client: AsyncTestClient, live_client: httpx.AsyncClient, db: AsyncSession
) -> None:
    """Ten creates, then ten PATCHes, all making themselves the default judge at once: each
    is answered as if it came alone (the one committed last is the default), and the
    organization ends with exactly one default judge."""
    t = await tenant(client)
    body = {"provider": "openai", "default_model": "m", "is_default_judge": True}
    created = await asyncio.gather(
        *(
            live_client.post(
                providers_path(t), json={**body, "name": f"c{i}"}, headers=t.owner.headers
            )
            for i in range(10)
        )
    )
    assert [r.status_code for r in created] == [201] * 10, [r.text for r in created]
    assert all(r.json()["is_default_judge"] for r in created)
    listing = await get(client, t, providers_path(t))
    assert len([p for p in listing["llm_providers"] if p["is_default_judge"]]) == 1, listing

    patched = await asyncio.gather(
        *(
            live_client.patch(
                providers_path(t, r.json()["id"]),
                json={"is_default_judge": True},
                headers=t.owner.headers,
            )
            for r in created
        )
    )
    assert [r.status_code for r in patched] == [200] * 10, [r.text for r in patched]
    listing = await get(client, t, providers_path(t))
    assert len([p for p in listing["llm_providers"] if p["is_default_judge"]]) == 1, listing
    defaults = await db.scalar(
        text("SELECT count(*) FROM llm_providers WHERE is_default_judge AND organization_id = :o"),
        {"o": uuid.UUID(t.id)},
    )
    await db.commit()
    assert defaults == 1


# --- providers: update, list, delete ----------------------------------------------------------


async def test_patch_provider_changes_only_what_is_sent(client: AsyncTestClient) -> None:
    t = await tenant(client)
    await put_credential(client, t, "k1")
    created = await create_provider(
        client, t, credential_key="k1", input_cost_per_mtok=1.0, output_cost_per_mtok=2.0
    )
    path = providers_path(t, created["id"])

    response = await client.patch(path, json={"default_model": "gpt-4o"}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    updated = response.json()
    unchanged = {k: v for k, v in created.items() if k not in {"default_model", "updated_at"}}
    assert {k: v for k, v in updated.items() if k in unchanged} == unchanged
    assert updated["default_model"] == "gpt-4o"
    assert parse_time(updated["updated_at"]) > parse_time(created["updated_at"])

    response = await client.patch(
        path, json={"credential_key": None, "input_cost_per_mtok": None}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["credential_key"] is None
    assert updated["input_cost_per_mtok"] is None
    assert updated["output_cost_per_mtok"] == 2.0
    assert updated["default_model"] == "gpt-4o"
    assert await get(client, t, path) == updated


async def test_patch_provider_is_validated_and_a_refused_patch_changes_nothing(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    created = await create_provider(client, t)
    path = providers_path(t, created["id"])
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"credential_key": "missing"}, ["body", "credential_key"]),
        ({"base_url": "file:///etc/passwd"}, ["body", "base_url"]),
        ({"provider": "cohere"}, ["body", "provider"]),
        ({"output_cost_per_mtok": -5}, ["body", "output_cost_per_mtok"]),
        ({"name": ""}, ["body", "name"]),
    ]
    for body, loc in cases:
        response = await client.patch(path, json=body, headers=t.owner.headers)
        assert single_error(response)["loc"] == loc, body
    assert await get(client, t, path) == created


async def test_patch_base_url_to_null_restores_the_default(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create_provider(client, t, base_url="https://proxy.example.com/v1")
    response = await client.patch(
        providers_path(t, created["id"]), json={"base_url": None}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["base_url"] == "https://api.openai.com/v1"


async def test_list_providers_pages_in_creation_order(client: AsyncTestClient) -> None:
    t = await tenant(client)
    names = ["p0", "p1", "p2"]
    for name in names:
        await create_provider(client, t, name=name)
    listing = await get(client, t, providers_path(t))
    assert set(listing) == {"llm_providers", "total"}
    assert listing["total"] == 3
    assert [p["name"] for p in listing["llm_providers"]] == names
    page = await get(client, t, f"{providers_path(t)}?limit=1&offset=1")
    assert page["total"] == 3
    assert [p["name"] for p in page["llm_providers"]] == ["p1"]


async def test_delete_provider_204_then_404(client: AsyncTestClient, db: AsyncSession) -> None:
    t = await tenant(client)
    keep = await create_provider(client, t, name="keep")
    gone = await create_provider(client, t, name="gone")
    path = providers_path(t, gone["id"])
    response = await client.delete(path, headers=t.owner.headers)
    assert response.status_code == 204, response.text
    assert response.content == b""
    for method, body in (("GET", None), ("PATCH", {"name": "x"}), ("DELETE", None)):
        response = await client.request(method, path, json=body, headers=t.owner.headers)
        assert response.status_code == 404, f"{method}: {response.text}"
    assert await count(db, "llm_providers") == 1
    listing = await get(client, t, providers_path(t))
    assert [p["id"] for p in listing["llm_providers"]] == [keep["id"]]


async def test_provider_used_by_an_agent_cannot_be_deleted(client: AsyncTestClient) -> None:
    t = await tenant(client)
    llm = await create_provider(client, t, name="llm")
    judge = await create_provider(client, t, name="judge")
    agent = await create_agent(client, t, name="Support bot", kind="llm", llm_provider_id=llm["id"])
    judged = await create_agent(client, t, name="Judged bot", judge_provider_id=judge["id"])

    for provider, agent_name in ((llm, "Support bot"), (judge, "Judged bot")):
        response = await client.delete(providers_path(t, provider["id"]), headers=t.owner.headers)
        assert response.status_code == 409, response.text
        assert agent_name in response.json()["detail"]
        await get(client, t, providers_path(t, provider["id"]))

    for a in (agent, judged):
        response = await client.delete(agents_path(t, a["id"]), headers=t.owner.headers)
        assert response.status_code == 204, response.text
    for provider in (llm, judge):
        response = await client.delete(providers_path(t, provider["id"]), headers=t.owner.headers)
        assert response.status_code == 204, response.text


async def test_another_organizations_provider_is_not_found(client: AsyncTestClient) -> None:
    a = await tenant(client)
    b = await tenant(client)
    theirs = await create_provider(client, b, name="b's")
    path = providers_path(a, theirs["id"])
    for method, body in (("GET", None), ("PATCH", {"name": "stolen"}), ("DELETE", None)):
        response = await client.request(method, path, json=body, headers=a.owner.headers)
        assert response.status_code == 404, f"{method}: {response.text}"
    assert await get(client, b, providers_path(b, theirs["id"])) == theirs


# --- agents ---------------------------------------------------------------------------------------


async def test_http_agent_defaults_and_read_back(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.post(
        agents_path(t),
        json={"name": "bot", "kind": "http", "endpoint_url": "https://agent.example.com/chat"},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    agent = response.json()
    assert set(agent) == AGENT_FIELDS
    uuid.UUID(agent["id"])
    assert agent["organization_id"] == t.id
    assert agent["kind"] == "http"
    assert agent["endpoint_url"] == "https://agent.example.com/chat"
    assert agent["protocol"] == "spar"
    assert agent["description"] == ""
    for field in ("llm_provider_id", "model", "system_prompt", "judge_provider_id", "judge_model"):
        assert agent[field] is None, field
    assert await get(client, t, agents_path(t, agent["id"])) == agent

    chat = await create_agent(client, t, name="chat", protocol="openai_chat", description="d")
    assert chat["protocol"] == "openai_chat"
    assert chat["description"] == "d"


async def test_llm_agent_model_defaults_to_the_providers_default_model(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    provider = await create_provider(client, t, default_model="gpt-4o-mini")
    judge = await create_provider(client, t, name="judge", default_model="gpt-4o")
    agent = await create_agent(
        client,
        t,
        kind="llm",
        endpoint_url=None,
        llm_provider_id=provider["id"],
        system_prompt="You are helpful.",
        judge_provider_id=judge["id"],
        judge_model="gpt-4o",
    )
    assert agent["kind"] == "llm"
    assert agent["llm_provider_id"] == provider["id"]
    assert agent["model"] == "gpt-4o-mini"
    assert agent["system_prompt"] == "You are helpful."
    assert agent["judge_provider_id"] == judge["id"]
    assert agent["judge_model"] == "gpt-4o"

    explicit = await create_agent(
        client, t, name="explicit", kind="llm", llm_provider_id=provider["id"], model="o3"
    )
    assert explicit["model"] == "o3"


async def test_invalid_agents_are_422_and_nothing_is_stored(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    provider = await create_provider(client, t)
    cases: list[tuple[str, dict[str, Any], list[str]]] = [
        ("http without endpoint_url", {"name": "a", "kind": "http"}, ["body", "endpoint_url"]),
        (
            "http with null endpoint_url",
            {"name": "a", "kind": "http", "endpoint_url": None},
            ["body", "endpoint_url"],
        ),
        (
            "http with non-http endpoint_url",
            {"name": "a", "kind": "http", "endpoint_url": "ftp://agent.example.com"},
            ["body", "endpoint_url"],
        ),
        (
            "unknown protocol",
            {"name": "a", "kind": "http", "endpoint_url": "https://x.example", "protocol": "grpc"},
            ["body", "protocol"],
        ),
        ("llm without provider", {"name": "a", "kind": "llm"}, ["body", "llm_provider_id"]),
        (
            "unknown kind",
            {"name": "a", "kind": "robot", "llm_provider_id": provider["id"]},
            ["body", "kind"],
        ),
        (
            "malformed provider id",
            {"name": "a", "kind": "llm", "llm_provider_id": "nope"},
            ["body", "llm_provider_id"],
        ),
        ("missing name", {"kind": "http", "endpoint_url": "https://x.example"}, ["body", "name"]),
    ]
    problems = []
    for name, body, loc in cases:
        response = await client.post(agents_path(t), json=body, headers=t.owner.headers)
        if response.status_code != 422:
            problems.append(f"{name}: {response.status_code} {response.text[:200]}")
            continue
        entries = response.json()["detail"]
        if [e["loc"] for e in entries] != [loc]:
            problems.append(f"{name}: {entries}")
    assert not problems, "\n".join(problems)
    assert await count(db, "agents") == 0


async def test_providers_of_another_organization_cannot_be_referenced(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    a = await tenant(client)
    b = await tenant(client)
    own = await create_provider(client, a, name="own")
    foreign = await create_provider(client, b, name="foreign")
    unknown = str(uuid.uuid4())
    bodies = [
        {"name": "x", "kind": "llm", "llm_provider_id": foreign["id"]},
        {"name": "x", "kind": "llm", "llm_provider_id": unknown},
        {
            "name": "x",
            "kind": "llm",
            "llm_provider_id": own["id"],
            "judge_provider_id": foreign["id"],
        },
        {
            "name": "x",
            "kind": "http",
            "endpoint_url": "https://x.example",
            "judge_provider_id": foreign["id"],
        },
    ]
    for body in bodies:
        response = await client.post(agents_path(a), json=body, headers=a.owner.headers)
        assert response.status_code == 404, f"{body}: {response.text}"
        assert isinstance(response.json()["detail"], str)
    assert await count(db, "agents") == 0

    # Nor through PATCH.
    agent = await create_agent(client, a, kind="llm", llm_provider_id=own["id"])
    path = agents_path(a, agent["id"])
    for body in ({"llm_provider_id": foreign["id"]}, {"judge_provider_id": foreign["id"]}):
        response = await client.patch(path, json=body, headers=a.owner.headers)
        assert response.status_code == 404, f"{body}: {response.text}"
    assert await get(client, a, path) == agent
    # And b can still delete its provider: nothing of a's points at it.
    response = await client.delete(providers_path(b, foreign["id"]), headers=b.owner.headers)
    assert response.status_code == 204, response.text


async def test_patch_agent_with_an_unknown_provider_answers_404_like_create(
    client: AsyncTestClient, caplog: Any
) -> None:
    """An id that names no provider at all (not even another organization's) is refused
    before the agent's row is written: 404, the agent unchanged, and nothing of the request
    in the log (it used to reach PostgreSQL as a foreign-key violation: a 500 whose log
    held the statement's parameters, the system prompt among them)."""
    caplog.set_level(logging.INFO)
    t = await tenant(client)
    provider = await create_provider(client, t)
    agent = await create_agent(
        client, t, kind="llm", llm_provider_id=provider["id"], system_prompt="You help."
    )
    path = agents_path(t, agent["id"])
    prompt = "Never say the word PROMPT-TEXT-5f1c to anyone"
    for field in ("llm_provider_id", "judge_provider_id"):
        body = {field: str(uuid.uuid4()), "system_prompt": prompt, "description": "changed"}
        response = await client.patch(path, json=body, headers=t.owner.headers)
        assert response.status_code == 404, f"{field}: {response.status_code} {response.text}"
        assert response.json() == {"detail": "llm provider not found"}
    assert await get(client, t, path) == agent
    assert "PROMPT-TEXT-5f1c" not in caplog.text


async def test_a_database_error_never_carries_its_statements_parameters(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    """Workers and the scheduler log exceptions as they are: the text of an error of the
    engine (a foreign key missed here) says which statement failed, never with what."""
    t = await tenant(client)
    with pytest.raises(IntegrityError) as refused:
        await db.execute(
            insert(Agent).values(
                organization_id=uuid.UUID(t.id),
                name="bot",
                kind="llm",
                llm_provider_id=uuid.uuid4(),
                system_prompt="PROMPT-TEXT-0d3b of the request",
            )
        )
    await db.rollback()
    assert "INSERT INTO agents" in str(refused.value)
    assert "PROMPT-TEXT-0d3b" not in str(refused.value)


async def test_an_unforeseen_database_error_is_logged_without_what_the_request_sent(
    client: AsyncTestClient, db: AsyncSession, caplog: Any
) -> None:
    """A database error no rule foresaw (here a CHECK constraint added for the test) answers
    500 and is logged, but the log holds neither the statement's parameters nor
    PostgreSQL's "Failing row contains (...)": both would quote the request's body."""
    caplog.set_level(logging.INFO)
    t = await tenant(client)
    agent = await create_agent(client, t)
    prompt = "FORBIDDEN and the PROMPT-TEXT-9a7e of the request"
    await db.execute(
        text(
            "ALTER TABLE agents ADD CONSTRAINT test_unforeseen"
            " CHECK (system_prompt NOT LIKE 'FORBIDDEN%')"
        )
    )
    await db.commit()
    try:
        response = await client.patch(
            agents_path(t, agent["id"]), json={"system_prompt": prompt}, headers=t.owner.headers
        )
    finally:
        await db.execute(text("ALTER TABLE agents DROP CONSTRAINT test_unforeseen"))
        await db.commit()
    assert response.status_code == 500, response.text
    assert response.json() == {"detail": "internal server error"}
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged, "the error is logged"
    text_logged = caplog.text + "".join(JsonFormatter().format(r) for r in logged)
    assert "test_unforeseen" in text_logged, "the log says what failed"
    assert "PROMPT-TEXT-9a7e" not in text_logged
    assert "PROMPT-TEXT-9a7e" not in response.text
    assert await get(client, t, agents_path(t, agent["id"])) == agent


async def test_an_http_agent_cannot_point_at_another_organizations_provider_either(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    """``llm_provider_id`` on an ``http`` agent is still a reference: a provider of another
    organization (or none at all) must be refused like for an ``llm`` agent, never stored.
    Otherwise organization B can no longer delete its own provider (A's agent holds the
    foreign key), and an unknown id breaks the insert."""
    a = await tenant(client)
    b = await tenant(client)
    foreign = await create_provider(client, b, name="foreign")
    http = {"name": "x", "kind": "http", "endpoint_url": "https://x.example"}
    problems = []
    for label, provider_id in (("B's provider", foreign["id"]), ("unknown", str(uuid.uuid4()))):
        response = await client.post(
            agents_path(a), json={**http, "llm_provider_id": provider_id}, headers=a.owner.headers
        )
        if response.status_code != 404:
            problems.append(f"create with {label}: {response.status_code} {response.text[:200]}")
    agent = await create_agent(client, a)
    response = await client.patch(
        agents_path(a, agent["id"]),
        json={"llm_provider_id": foreign["id"]},
        headers=a.owner.headers,
    )
    if response.status_code != 404:
        problems.append(f"patch with B's provider: {response.status_code} {response.text[:200]}")
    # B's own provider stays B's to delete.
    response = await client.delete(providers_path(b, foreign["id"]), headers=b.owner.headers)
    if response.status_code != 204:
        problems.append(f"B deleting its provider: {response.status_code} {response.text[:200]}")
    assert not problems, "\n".join(problems)


async def test_patch_agent_is_partial(client: AsyncTestClient) -> None:
    t = await tenant(client)
    agent = await create_agent(client, t, description="first")
    path = agents_path(t, agent["id"])
    response = await client.patch(path, json={"name": "renamed"}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["name"] == "renamed"
    same = {k: v for k, v in agent.items() if k not in {"name", "updated_at"}}
    assert {k: updated[k] for k in same} == same
    assert parse_time(updated["updated_at"]) > parse_time(agent["updated_at"])

    response = await client.patch(path, json={"protocol": "openai_chat"}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json()["protocol"] == "openai_chat"
    assert response.json()["name"] == "renamed"
    assert await get(client, t, path) == response.json()


async def test_patch_switching_kind_is_revalidated(client: AsyncTestClient) -> None:
    t = await tenant(client)
    provider = await create_provider(client, t, default_model="gpt-4o-mini")
    agent = await create_agent(client, t)
    path = agents_path(t, agent["id"])

    # http -> llm without a provider: refused, agent unchanged.
    response = await client.patch(path, json={"kind": "llm"}, headers=t.owner.headers)
    assert single_error(response)["loc"] == ["body", "llm_provider_id"]
    assert await get(client, t, path) == agent

    # http -> llm with a provider: the model defaults to the provider's.
    response = await client.patch(
        path, json={"kind": "llm", "llm_provider_id": provider["id"]}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    as_llm = response.json()
    assert as_llm["kind"] == "llm"
    assert as_llm["llm_provider_id"] == provider["id"]
    assert as_llm["model"] == "gpt-4o-mini"

    # llm -> http without an endpoint_url: refused.
    response = await client.patch(
        path, json={"kind": "http", "endpoint_url": None}, headers=t.owner.headers
    )
    assert single_error(response)["loc"] == ["body", "endpoint_url"]
    assert await get(client, t, path) == as_llm

    # Removing the provider of an llm agent: refused.
    response = await client.patch(path, json={"llm_provider_id": None}, headers=t.owner.headers)
    assert single_error(response)["loc"] == ["body", "llm_provider_id"]

    # llm -> http with an endpoint_url.
    response = await client.patch(
        path,
        json={"kind": "http", "endpoint_url": "https://other.example.com/a"},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text
    assert response.json()["kind"] == "http"
    assert response.json()["endpoint_url"] == "https://other.example.com/a"
    assert response.json()["protocol"] in {"spar", "openai_chat"}


async def test_list_get_delete_agents(client: AsyncTestClient, db: AsyncSession) -> None:
    t = await tenant(client)
    names = ["a0", "a1", "a2"]
    agents = [await create_agent(client, t, name=name) for name in names]
    listing = await get(client, t, agents_path(t))
    assert set(listing) == {"agents", "total"}
    assert listing["total"] == 3
    assert [a["name"] for a in listing["agents"]] == names
    assert listing["agents"][0] == agents[0]
    page = await get(client, t, f"{agents_path(t)}?limit=2&offset=1")
    assert page["total"] == 3
    assert [a["name"] for a in page["agents"]] == names[1:]

    path = agents_path(t, agents[1]["id"])
    response = await client.delete(path, headers=t.owner.headers)
    assert response.status_code == 204, response.text
    assert response.content == b""
    for method, body in (("GET", None), ("PATCH", {"name": "x"}), ("DELETE", None)):
        response = await client.request(method, path, json=body, headers=t.owner.headers)
        assert response.status_code == 404, f"{method}: {response.text}"
    assert await count(db, "agents") == 2
    listing = await get(client, t, agents_path(t))
    assert [a["name"] for a in listing["agents"]] == ["a0", "a2"]

    response = await client.get(agents_path(t, str(uuid.uuid4())), headers=t.owner.headers)
    assert response.status_code == 404, response.text
    response = await client.get(agents_path(t, "not-a-uuid"), headers=t.owner.headers)
    assert single_error(response)["loc"] == ["path", "agent_id"]


async def test_another_organizations_agent_is_not_found(client: AsyncTestClient) -> None:
    a = await tenant(client)
    b = await tenant(client)
    theirs = await create_agent(client, b)
    path = agents_path(a, theirs["id"])
    for method, body in (("GET", None), ("PATCH", {"name": "stolen"}), ("DELETE", None)):
        response = await client.request(method, path, json=body, headers=a.owner.headers)
        assert response.status_code == 404, f"{method}: {response.text}"
    assert await get(client, b, agents_path(b, theirs["id"])) == theirs
