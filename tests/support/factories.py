"""Test setup through the public API: users, organizations, members with a role, tokens;
and a stub broker to read back what was sent, or the messages a Redis broker holds."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import redis
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker
from litestar.testing import AsyncTestClient

from shared.queue import QUEUES

PASSWORD = "correct-horse-battery"
_counter = itertools.count(1)


@dataclass
class Caller:
    """Someone (a user or a platform token) who can make requests."""

    token: str
    id: str | None = None
    email: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def unique_email(prefix: str = "user") -> str:
    return f"{prefix}{next(_counter)}@example.com"


async def register(client: AsyncTestClient, email: str | None = None, **fields: Any) -> Caller:
    email = email or unique_email()
    body = {
        "email": email,
        "password": PASSWORD,
        "first_name": "Test",
        "last_name": "User",
        **fields,
    }
    response = await client.post("/v1/auth/register", json=body)
    assert response.status_code == 201, response.text
    data = response.json()
    return Caller(token=data["access_token"], id=data["user"]["id"], email=email)


async def create_org(client: AsyncTestClient, owner: Caller, name: str = "Acme") -> dict[str, Any]:
    response = await client.post("/v1/organizations", json={"name": name}, headers=owner.headers)
    assert response.status_code == 201, response.text
    return response.json()


async def roles_by_name(client: AsyncTestClient, caller: Caller, org_id: str) -> dict[str, str]:
    response = await client.get(f"/v1/orgs/{org_id}/roles", headers=caller.headers)
    assert response.status_code == 200, response.text
    return {role["name"]: role["id"] for role in response.json()["roles"]}


async def add_member(client: AsyncTestClient, owner: Caller, org_id: str, role_id: str) -> Caller:
    """Invite a new email with ``role_id``, then register it: a full member with that role."""
    email = unique_email("member")
    response = await client.post(
        f"/v1/organizations/{org_id}/members",
        json={"email": email, "role_id": role_id},
        headers=owner.headers,
    )
    assert response.status_code == 201, response.text
    return await register(client, email)


async def create_token(
    client: AsyncTestClient, admin: Caller, org_id: str, permissions: list[str], **fields: Any
) -> Caller:
    response = await client.post(
        f"/v1/orgs/{org_id}/platform-tokens/",
        json={"name": "ci", "permissions": permissions, **fields},
        headers=admin.headers,
    )
    assert response.status_code == 201, response.text
    data = response.json()
    return Caller(token=data["token"], id=data["id"], extra=data)


@dataclass
class Tenant:
    """An organization with one member per system role."""

    org: dict[str, Any]
    roles: dict[str, str]
    members: dict[str, Caller]

    @property
    def id(self) -> str:
        return self.org["id"]

    @property
    def owner(self) -> Caller:
        return self.members["OWNER"]


async def tenant(client: AsyncTestClient, *, with_roles: tuple[str, ...] = ()) -> Tenant:
    owner = await register(client)
    org = await create_org(client, owner)
    roles = await roles_by_name(client, owner, org["id"])
    members = {"OWNER": owner}
    for name in with_roles:
        members[name] = await add_member(client, owner, org["id"], roles[name])
    return Tenant(org=org, roles=roles, members=members)


async def member_holding(
    client: AsyncTestClient, t: Tenant, permissions: list[str], name: str | None = None
) -> Caller:
    """A member whose custom role (made by the owner) holds exactly ``permissions``."""
    response = await client.post(
        f"/v1/orgs/{t.id}/roles",
        json={"name": name or f"holding {next(_counter)}", "permissions": permissions},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    return await add_member(client, t.owner, t.id, response.json()["id"])


def single_validation_entry(response: Any) -> dict[str, Any]:
    """The one entry of a 422 validation body in the spec's shape (§7)."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"detail"}, body
    assert isinstance(body["detail"], list) and len(body["detail"]) == 1, body
    entry = body["detail"][0]
    assert set(entry) == {"loc", "msg", "type", "input", "ctx"}, entry
    assert isinstance(entry["msg"], str) and entry["msg"], entry
    assert isinstance(entry["ctx"], dict), entry
    return entry


def stub_broker() -> StubBroker:
    """An in-memory broker with Spar's queues: what services send can be read back."""
    broker = StubBroker()
    for queue in QUEUES:
        broker.declare_queue(queue)
    return broker


def held_in_redis(url: str, queue: str) -> list[Message[Any]]:
    """The messages the Redis broker at ``url`` holds for ``queue`` (a work queue, or a
    delay queue such as ``notifications.DQ``), waiting or fetched, in no order."""
    return [
        Message.decode(data) for data in redis.Redis.from_url(url).hvals(f"dramatiq:{queue}.msgs")
    ]
