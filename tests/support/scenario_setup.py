"""Setting up scenario runs through the public API, against loopback fakes.

A run needs an organization whose allow-list lets Spar reach the agent and the judge,
a judge provider, an agent, and a scenario.  :func:`outbound_setup` does the first three
in one call; :func:`create_scenario`, :func:`start_run` and :func:`get_run` the rest.
Everything goes through the HTTP API as the tenant's owner (or ``caller``), so the rows
are exactly what a user would have made.

Typical use (``agent`` a :class:`~tests.support.fakes.FakeAgent`, ``judge`` a
:class:`~tests.support.fakes.FakeOpenAI`)::

    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(client, t, turns=[turn("Hi", criteria=[llm("Polite?")])])
    run = await start_run(client, t, scenario["id"], setup.agent_id)
    await execute_run(app.state.database, settings, UUID(run["id"]))  # or a worker
    final = await get_run(client, t, run["id"])
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.factories import Caller, Tenant

TERMINAL = frozenset({"passed", "failed", "error"})
LOOPBACK_HOST = "127.0.0.1"  # where every fake of tests.support.fakes listens


@dataclass(frozen=True)
class OutboundSetup:
    """Ids of what :func:`outbound_setup` created (``judge_provider_id`` None without judge)."""

    domain_id: str
    agent_id: str
    judge_provider_id: str | None
    agent: dict[str, Any]
    judge_provider: dict[str, Any] | None


def _owner(t: Tenant, caller: Caller | None) -> dict[str, str]:
    return (caller or t.owner).headers


async def allow_domain(
    client: AsyncTestClient,
    t: Tenant,
    domain: str = LOOPBACK_HOST,
    *,
    caller: Caller | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Add ``domain`` (plus ``headers`` / ``query_params``) to the org's allow-list."""
    response = await client.post(
        f"/v1/orgs/{t.id}/allowed-domains/",
        json={"domain": domain, **fields},
        headers=_owner(t, caller),
    )
    assert response.status_code == 201, response.text
    return response.json()


async def create_judge_provider(
    client: AsyncTestClient,
    t: Tenant,
    judge_url: str,
    *,
    caller: Caller | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """An ``openai_compatible`` provider at a FakeOpenAI (``base_url`` = ``{judge_url}/v1``),
    the org's default judge unless ``is_default_judge=False`` is given.  ``fields`` override
    the body (e.g. ``input_cost_per_mtok``, ``output_cost_per_mtok``, ``default_model``)."""
    body = {
        "name": "judge",
        "provider": "openai_compatible",
        "base_url": f"{judge_url}/v1",
        "default_model": "judge-model",
        "is_default_judge": True,
        **fields,
    }
    response = await client.post(
        f"/v1/orgs/{t.id}/llm-providers", json=body, headers=_owner(t, caller)
    )
    assert response.status_code == 201, response.text
    return response.json()


async def create_http_agent(
    client: AsyncTestClient,
    t: Tenant,
    agent_url: str,
    *,
    caller: Caller | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """An ``http`` agent speaking protocol ``spar`` at ``{agent_url}/chat`` (a FakeAgent
    answers on any path); ``fields`` override the body (name, protocol, judge_provider_id…)."""
    body = {
        "name": "agent under test",
        "kind": "http",
        "protocol": "spar",
        "endpoint_url": f"{agent_url}/chat",
        **fields,
    }
    response = await client.post(f"/v1/orgs/{t.id}/agents", json=body, headers=_owner(t, caller))
    assert response.status_code == 201, response.text
    return response.json()


async def outbound_setup(
    client: AsyncTestClient,
    t: Tenant,
    agent_url: str,
    judge_url: str | None = None,
    *,
    caller: Caller | None = None,
    domain: str = LOOPBACK_HOST,
    judge_fields: dict[str, Any] | None = None,
    agent_fields: dict[str, Any] | None = None,
) -> OutboundSetup:
    """Everything a run needs besides the scenario, in the tenant ``t``:

    * ``domain`` (default ``127.0.0.1``, where the fakes listen) on the allow-list — the
      test settings allow private addresses, so loopback is reachable once allowed;
    * when ``judge_url`` is given, a default-judge ``openai_compatible`` provider at
      ``{judge_url}/v1`` (extra provider fields in ``judge_fields``, e.g. prices);
    * an ``http`` agent (protocol ``spar``) at ``{agent_url}/chat`` (extra fields in
      ``agent_fields``, e.g. ``judge_provider_id``).

    Without ``judge_url`` the org has no judge: ``llm_evaluated`` criteria then end the
    run in ``error``.  Made as the owner unless ``caller`` is given.
    """
    entry = await allow_domain(client, t, domain, caller=caller)
    provider = None
    if judge_url is not None:
        provider = await create_judge_provider(
            client, t, judge_url, caller=caller, **(judge_fields or {})
        )
    made = await create_http_agent(client, t, agent_url, caller=caller, **(agent_fields or {}))
    return OutboundSetup(
        domain_id=entry["id"],
        agent_id=made["id"],
        judge_provider_id=provider["id"] if provider else None,
        agent=made,
        judge_provider=provider,
    )


# --- scenarios and runs ---------------------------------------------------------------------------


def criterion(question: str, criteria_type: str = "llm_evaluated", **fields: Any) -> dict[str, Any]:
    """A CriterionCreate body (``few_shot_examples`` and the like in ``fields``)."""
    return {"question": question, "criteria_type": criteria_type, **fields}


def turn(user_message: str, *criteria: dict[str, Any], required: bool = False) -> dict[str, Any]:
    """A ScenarioTurnCreate body."""
    return {"user_message": user_message, "required": required, "criteria": list(criteria)}


def scenario_body(name: str = "checkout help", **fields: Any) -> dict[str, Any]:
    """A ScenarioCreate body: one turn with one ``contains`` check unless ``turns`` is given."""
    return {
        "name": name,
        "turns": [turn("Hello", criterion("hello", "contains"))],
        **fields,
    }


async def create_scenario(
    client: AsyncTestClient, t: Tenant, *, caller: Caller | None = None, **fields: Any
) -> dict[str, Any]:
    """POST a scenario (:func:`scenario_body` with ``fields``); the ScenarioRead."""
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios", json=scenario_body(**fields), headers=_owner(t, caller)
    )
    assert response.status_code == 201, response.text
    return response.json()


async def start_run(
    client: AsyncTestClient,
    t: Tenant,
    scenario_id: str,
    agent_id: str,
    *,
    caller: Caller | None = None,
) -> dict[str, Any]:
    """POST …/scenarios/{id}/run; the pending ScenarioRunRead (also enqueued for a worker)."""
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios/{scenario_id}/run",
        json={"agent_id": agent_id},
        headers=_owner(t, caller),
    )
    assert response.status_code == 201, response.text
    return response.json()


async def get_run(
    client: AsyncTestClient, t: Tenant, run_id: str, *, caller: Caller | None = None
) -> dict[str, Any]:
    """GET …/scenarios/runs/{run_id}: the run with its turn and criterion results."""
    response = await client.get(
        f"/v1/orgs/{t.id}/scenarios/runs/{run_id}", headers=_owner(t, caller)
    )
    assert response.status_code == 200, response.text
    return response.json()


async def wait_for_run(
    client: AsyncTestClient,
    t: Tenant,
    run_id: str,
    *,
    timeout_s: float = 20.0,
    interval_s: float = 0.1,
) -> dict[str, Any]:
    """Poll the run until it is terminal (for tests where a worker executes it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = await get_run(client, t, run_id)
        if run["status"] in TERMINAL:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} not terminal after {timeout_s}s: {run}")
        await asyncio.sleep(interval_s)
