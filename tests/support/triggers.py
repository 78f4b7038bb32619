"""Triggers through the API: their path, a scheduled or a webhook trigger's body, made."""

from __future__ import annotations

from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.factories import Tenant


def path(t: Tenant, *rest: str) -> str:
    return "/".join([f"/v1/orgs/{t.id}/triggers", *rest]) + ("/" if not rest else "")


def scheduled(agent_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": "nightly",
        "trigger_type": "scheduled",
        "agent_id": agent_id,
        "message": "Good evening, it is {{ now }}",
        "cron_expression": "0 2 * * *",
        "timezone": "Europe/Amsterdam",
        **fields,
    }


def webhook(agent_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": "on deploy",
        "trigger_type": "webhook",
        "agent_id": agent_id,
        "message": "Deployed {{ payload.version }} ({{ trigger.name }})",
        **fields,
    }


async def create(client: AsyncTestClient, t: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    return response.json()
