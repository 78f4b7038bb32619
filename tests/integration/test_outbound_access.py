"""Who may touch the outbound configuration, and only inside their own organization.

Permission matrix: every allowed-domain, credential, LLM-provider and agent endpoint,
called as each system role (OWNER, ADMIN, MEMBER, VIEWER, GUEST), as a platform token with
no permission, one holding only the permission the route needs, and one holding every
permission but that one.  The expectation is written from DESIGN §4, never read from
the application: MEMBER has every ``:read`` plus ``agents:write`` (not domains:write,
credentials:write or providers:write), VIEWER every ``:read``, GUEST nothing.  A refused
call answers 403 ``{"detail": str}`` and changes nothing; destructive calls get a fresh
target per principal.

Tenant isolation: organization A's owner, GUEST and all-permission token get 404 on B's
paths, and on A's paths with B's ids; B is unchanged afterwards.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.design import ALL_PERMISSIONS, ROLE_PERMISSIONS, USER_ROLES
from tests.support.factories import Caller, Tenant, create_token, tenant

_serial = itertools.count(1)


def serial() -> int:
    return next(_serial)


# --- the machinery --------------------------------------------------------------------------------


@dataclass
class Principal:
    name: str
    caller: Caller
    permissions: frozenset[str]


@dataclass
class Call:
    path: str
    json: Any = None
    target: dict[str, Any] = field(default_factory=dict)


Prepare = Callable[[Principal], Awaitable[Call]]
After = Callable[[Principal, Call, Any, bool], Awaitable[str | None]]


@dataclass
class Endpoint:
    name: str
    method: str
    success: int
    permission: str
    prepare: Prepare
    after: After | None = None


@dataclass
class World:
    client: AsyncTestClient
    tenant: Tenant
    principals: list[Principal]
    narrow: dict[str, Principal] = field(default_factory=dict)

    @property
    def owner(self) -> Caller:
        return self.tenant.owner

    @property
    def org(self) -> str:
        return f"/v1/orgs/{self.tenant.id}"

    async def principals_for(self, permission: str) -> list[Principal]:
        extra = []
        for name, permissions in (
            (f"PAT(only {permission})", frozenset({permission})),
            (f"PAT(all but {permission})", ALL_PERMISSIONS - {permission}),
        ):
            if name not in self.narrow:
                pat = await create_token(
                    self.client, self.owner, self.tenant.id, sorted(permissions)
                )
                self.narrow[name] = Principal(name, pat, permissions)
            extra.append(self.narrow[name])
        return [*self.principals, *extra]

    async def owner_request(self, method: str, path: str, body: Any = None) -> Any:
        response = await self.client.request(method, path, json=body, headers=self.owner.headers)
        assert response.status_code in (200, 201, 204), f"{method} {path}: {response.text}"
        return response.json() if response.content else None

    async def owner_status(self, path: str) -> int:
        return (await self.client.get(path, headers=self.owner.headers)).status_code


async def build_world(client: AsyncTestClient) -> World:
    t = await tenant(client, with_roles=("ADMIN", "MEMBER", "VIEWER", "GUEST"))
    principals = [Principal(role, t.members[role], ROLE_PERMISSIONS[role]) for role in USER_ROLES]
    pat_none = await create_token(client, t.owner, t.id, [])
    principals.append(Principal("PAT(no permissions)", pat_none, frozenset()))
    return World(client=client, tenant=t, principals=principals)


async def run_matrix(world: World, endpoints: list[Endpoint]) -> list[str]:
    problems: list[str] = []
    for endpoint in endpoints:
        for principal in await world.principals_for(endpoint.permission):
            call = await endpoint.prepare(principal)
            ok = endpoint.permission in principal.permissions
            expected = endpoint.success if ok else 403
            response = await world.client.request(
                endpoint.method, call.path, json=call.json, headers=principal.caller.headers
            )
            where = f"{endpoint.name} ({endpoint.method} {call.path}) as {principal.name}"
            if response.status_code != expected:
                got = f"{response.status_code} {response.text[:300]}"
                problems.append(f"{where}: expected {expected}, got {got}")
                continue
            if expected == 403:
                body = response.json()
                if not (isinstance(body, dict) and isinstance(body.get("detail"), str)):
                    problems.append(f"{where}: 403 body is not {{'detail': str}}: {body!r}")
            elif expected == 204 and response.content:
                problems.append(f"{where}: 204 with a body: {response.text[:300]}")
            if endpoint.after is not None:
                problem = await endpoint.after(principal, call, response, ok)
                if problem:
                    problems.append(f"{where}: {problem}")
    return problems


def report(problems: list[str]) -> str:
    return f"{len(problems)} wrong answer(s):\n" + "\n".join(problems)


def fixed(path: str, body: Any = None) -> Prepare:
    async def prepare(principal: Principal) -> Call:
        return Call(path=path, json=body)

    return prepare


def gone_after_delete(world: World) -> After:
    async def after(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        status = await world.owner_status(call.target.get("check", call.path))
        if status != (404 if ok else 200):
            return f"the owner's GET answers {status} afterwards"
        return None

    return after


# --- the matrices ---------------------------------------------------------------------------------


async def test_allowed_domain_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    base = f"{world.org}/allowed-domains"
    existing = await world.owner_request("POST", f"{base}/", {"domain": "fixed.example.com"})

    async def fresh_domain() -> dict[str, Any]:
        return await world.owner_request(
            "POST", f"{base}/", {"domain": f"t{serial()}.example.com", "headers": {"X-V": "0"}}
        )

    async def create_call(p: Principal) -> Call:
        domain = f"new{serial()}.example.com"
        return Call(f"{base}/", {"domain": domain}, target={"domain": domain})

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await world.owner_request("GET", f"{base}/?limit=500")
        present = call.target["domain"] in {d["domain"] for d in listing["domains"]}
        if present != ok:
            return f"domain listed afterwards: {present}"
        if ok and response.json()["domain"] != call.target["domain"]:
            return f"created {response.json()!r}"
        return None

    async def patch_call(p: Principal) -> Call:
        domain = await fresh_domain()
        return Call(f"{base}/{domain['id']}", {"headers": {"X-V": "1"}})

    async def after_patch(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        headers = (await world.owner_request("GET", call.path))["headers"]
        if headers != ({"X-V": "1"} if ok else {"X-V": "0"}):
            return f"headers afterwards: {headers}"
        return None

    async def delete_call(p: Principal) -> Call:
        return Call(f"{base}/{(await fresh_domain())['id']}")

    endpoints = [
        Endpoint("domains list", "GET", 200, "domains:read", fixed(f"{base}/")),
        Endpoint("domains list (no slash)", "GET", 200, "domains:read", fixed(base)),
        Endpoint("domain get", "GET", 200, "domains:read", fixed(f"{base}/{existing['id']}")),
        Endpoint("domain create", "POST", 201, "domains:write", create_call, after_create),
        Endpoint("domain patch", "PATCH", 200, "domains:write", patch_call, after_patch),
        Endpoint(
            "domain delete", "DELETE", 204, "domains:write", delete_call, gone_after_delete(world)
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


async def test_credential_matrix(client: AsyncTestClient, db: AsyncSession) -> None:
    world = await build_world(client)
    base = f"{world.org}/credentials"
    await world.owner_request("PUT", f"{base}/fixed", {"value": "v0", "description": "d0"})

    async def fresh_key() -> str:
        key = f"k{serial()}"
        await world.owner_request("PUT", f"{base}/{key}", {"value": "v0", "description": "d0"})
        return key

    async def listed() -> dict[str, str]:
        listing = await world.owner_request("GET", f"{base}?limit=500")
        return {c["key"]: c["description"] for c in listing["credentials"]}

    async def create_call(p: Principal) -> Call:
        key = f"new{serial()}"
        return Call(f"{base}/{key}", {"value": "secret"}, target={"key": key})

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        present = call.target["key"] in await listed()
        return None if present == ok else f"credential listed afterwards: {present}"

    async def replace_call(p: Principal) -> Call:
        key = await fresh_key()
        return Call(f"{base}/{key}", {"value": "v1", "description": "d1"}, target={"key": key})

    async def after_replace(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        description = (await listed())[call.target["key"]]
        if description != ("d1" if ok else "d0"):
            return f"description afterwards: {description!r}"
        return None

    async def delete_call(p: Principal) -> Call:
        key = await fresh_key()
        return Call(f"{base}/{key}", target={"check": f"{base}/{key}/usage"})

    endpoints = [
        Endpoint("credentials list", "GET", 200, "credentials:read", fixed(base)),
        Endpoint("credentials list (slash)", "GET", 200, "credentials:read", fixed(f"{base}/")),
        Endpoint("credential usage", "GET", 200, "credentials:read", fixed(f"{base}/fixed/usage")),
        Endpoint(
            "credential put (new)", "PUT", 201, "credentials:write", create_call, after_create
        ),
        Endpoint(
            "credential put (replace)", "PUT", 200, "credentials:write", replace_call, after_replace
        ),
        Endpoint(
            "credential delete",
            "DELETE",
            204,
            "credentials:write",
            delete_call,
            gone_after_delete(world),
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)
    # Whoever could read the listing never saw a value.
    assert "v0" not in str(await listed())


async def test_llm_provider_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    base = f"{world.org}/llm-providers"
    body = {"name": "P", "provider": "openai", "default_model": "m0"}
    existing = await world.owner_request("POST", base, body)

    async def fresh_provider() -> dict[str, Any]:
        return await world.owner_request("POST", base, {**body, "name": f"p{serial()}"})

    async def create_call(p: Principal) -> Call:
        name = f"new{serial()}"
        return Call(base, {**body, "name": name}, target={"name": name})

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await world.owner_request("GET", f"{base}?limit=500")
        present = call.target["name"] in {x["name"] for x in listing["llm_providers"]}
        return None if present == ok else f"provider listed afterwards: {present}"

    async def patch_call(p: Principal) -> Call:
        return Call(f"{base}/{(await fresh_provider())['id']}", {"default_model": "m1"})

    async def after_patch(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        model = (await world.owner_request("GET", call.path))["default_model"]
        return None if model == ("m1" if ok else "m0") else f"default_model afterwards: {model}"

    async def delete_call(p: Principal) -> Call:
        return Call(f"{base}/{(await fresh_provider())['id']}")

    endpoints = [
        Endpoint("providers list", "GET", 200, "providers:read", fixed(base)),
        Endpoint("provider get", "GET", 200, "providers:read", fixed(f"{base}/{existing['id']}")),
        Endpoint("provider create", "POST", 201, "providers:write", create_call, after_create),
        Endpoint("provider patch", "PATCH", 200, "providers:write", patch_call, after_patch),
        Endpoint(
            "provider delete",
            "DELETE",
            204,
            "providers:write",
            delete_call,
            gone_after_delete(world),
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


async def test_agent_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    base = f"{world.org}/agents"
    body = {"name": "A", "kind": "http", "endpoint_url": "https://agent.example.com/"}
    existing = await world.owner_request("POST", base, body)

    async def fresh_agent() -> dict[str, Any]:
        return await world.owner_request("POST", base, {**body, "name": f"a{serial()}"})

    async def create_call(p: Principal) -> Call:
        name = f"new{serial()}"
        return Call(base, {**body, "name": name}, target={"name": name})

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await world.owner_request("GET", f"{base}?limit=500")
        present = call.target["name"] in {x["name"] for x in listing["agents"]}
        return None if present == ok else f"agent listed afterwards: {present}"

    async def patch_call(p: Principal) -> Call:
        return Call(f"{base}/{(await fresh_agent())['id']}", {"description": "changed"})

    async def after_patch(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        description = (await world.owner_request("GET", call.path))["description"]
        if description != ("changed" if ok else ""):
            return f"description afterwards: {description!r}"
        return None

    async def delete_call(p: Principal) -> Call:
        return Call(f"{base}/{(await fresh_agent())['id']}")

    endpoints = [
        Endpoint("agents list", "GET", 200, "agents:read", fixed(base)),
        Endpoint("agent get", "GET", 200, "agents:read", fixed(f"{base}/{existing['id']}")),
        Endpoint("agent create", "POST", 201, "agents:write", create_call, after_create),
        Endpoint("agent patch", "PATCH", 200, "agents:write", patch_call, after_patch),
        Endpoint(
            "agent delete", "DELETE", 204, "agents:write", delete_call, gone_after_delete(world)
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


async def test_member_role_can_manage_agents_but_not_what_they_depend_on(
    client: AsyncTestClient,
) -> None:
    """The MEMBER row of DESIGN §4 spelled out once, as a readable control of the matrix."""
    t = await tenant(client, with_roles=("MEMBER",))
    member = t.members["MEMBER"].headers
    org = f"/v1/orgs/{t.id}"
    response = await client.post(
        f"{org}/agents",
        json={"name": "mine", "kind": "http", "endpoint_url": "https://a.example.com"},
        headers=member,
    )
    assert response.status_code == 201, response.text
    for method, path, body in (
        ("POST", f"{org}/allowed-domains/", {"domain": "a.example.com"}),
        ("PUT", f"{org}/credentials/k", {"value": "v"}),
        ("POST", f"{org}/llm-providers", {"name": "p", "provider": "openai", "default_model": "m"}),
    ):
        response = await client.request(method, path, json=body, headers=member)
        assert response.status_code == 403, f"{method} {path}: {response.text}"
    for path in (
        f"{org}/allowed-domains/",
        f"{org}/credentials",
        f"{org}/llm-providers",
        f"{org}/agents",
    ):
        response = await client.get(path, headers=member)
        assert response.status_code == 200, f"GET {path}: {response.text}"


# --- tenant isolation ----------------------------------------------------------------------------


@dataclass
class Request:
    name: str
    method: str
    path: str
    json: Any = None


@dataclass
class Two:
    a: Tenant
    b: Tenant
    a_token: Caller
    b_ids: dict[str, str]
    a_ids: dict[str, str]


async def two_tenants(client: AsyncTestClient) -> Two:
    a = await tenant(client, with_roles=("GUEST",))
    b = await tenant(client)
    a_token = await create_token(client, a.owner, a.id, sorted(ALL_PERMISSIONS), name="a-all")

    async def owner_post(t: Tenant, method: str, path: str, body: Any) -> dict[str, Any]:
        response = await client.request(
            method, f"/v1/orgs/{t.id}{path}", json=body, headers=t.owner.headers
        )
        assert response.status_code in (200, 201), f"{method} {path}: {response.text}"
        return response.json()

    ids: dict[str, dict[str, str]] = {}
    for t in (a, b):
        prefix = "a" if t is a else "b"
        key = f"{prefix}_key"
        await owner_post(t, "PUT", f"/credentials/{key}", {"value": f"secret-of-{prefix}"})
        domain = await owner_post(
            t,
            "POST",
            "/allowed-domains/",
            {"domain": f"{prefix}.example.com", "headers": {"X-Key": f"{{{{credentials.{key}}}}}"}},
        )
        provider = await owner_post(
            t,
            "POST",
            "/llm-providers",
            {
                "name": f"{prefix} provider",
                "provider": "openai",
                "default_model": "m",
                "credential_key": key,
            },
        )
        agent = await owner_post(
            t,
            "POST",
            "/agents",
            {
                "name": f"{prefix} agent",
                "kind": "llm",
                "llm_provider_id": provider["id"],
                "judge_provider_id": provider["id"],
            },
        )
        ids[prefix] = {
            "key": key,
            "domain": domain["id"],
            "provider": provider["id"],
            "agent": agent["id"],
        }
    return Two(a=a, b=b, a_token=a_token, b_ids=ids["b"], a_ids=ids["a"])


def outbound_requests(org_id: str, ids: dict[str, str], provider_for_agents: str) -> list[Request]:
    """Every outbound endpoint on ``org_id`` addressing ``ids``, with valid bodies."""
    org = f"/v1/orgs/{org_id}"
    domains, credentials = f"{org}/allowed-domains", f"{org}/credentials"
    providers, agents = f"{org}/llm-providers", f"{org}/agents"
    return [
        Request("domains list", "GET", f"{domains}/"),
        Request("domain create", "POST", f"{domains}/", {"domain": "intruder.example.com"}),
        Request("domain get", "GET", f"{domains}/{ids['domain']}"),
        Request("domain patch", "PATCH", f"{domains}/{ids['domain']}", {"headers": {}}),
        Request("credentials list", "GET", credentials),
        Request("credential put", "PUT", f"{credentials}/{ids['key']}", {"value": "hijacked"}),
        Request("credential put (new key)", "PUT", f"{credentials}/intruder", {"value": "x"}),
        Request("credential usage", "GET", f"{credentials}/{ids['key']}/usage"),
        Request("providers list", "GET", providers),
        Request(
            "provider create",
            "POST",
            providers,
            {"name": "intruder", "provider": "openai", "default_model": "m"},
        ),
        Request("provider get", "GET", f"{providers}/{ids['provider']}"),
        Request(
            "provider patch", "PATCH", f"{providers}/{ids['provider']}", {"default_model": "x"}
        ),
        Request("agents list", "GET", agents),
        Request(
            "agent create",
            "POST",
            agents,
            {"name": "intruder", "kind": "llm", "llm_provider_id": provider_for_agents},
        ),
        Request("agent get", "GET", f"{agents}/{ids['agent']}"),
        Request("agent patch", "PATCH", f"{agents}/{ids['agent']}", {"name": "hijacked"}),
        # Deletes last, agent before the provider it uses, domain before its credential.
        Request("agent delete", "DELETE", f"{agents}/{ids['agent']}"),
        Request("provider delete", "DELETE", f"{providers}/{ids['provider']}"),
        Request("domain delete", "DELETE", f"{domains}/{ids['domain']}"),
        Request("credential delete", "DELETE", f"{credentials}/{ids['key']}"),
    ]


async def expect_404(
    client: AsyncTestClient, callers: dict[str, Caller], requests: list[Request]
) -> list[str]:
    problems: list[str] = []
    for request in requests:
        for who, caller in callers.items():
            response = await client.request(
                request.method, request.path, json=request.json, headers=caller.headers
            )
            where = f"{request.name} ({request.method} {request.path}) as {who}"
            if response.status_code != 404:
                problems.append(
                    f"{where}: expected 404, got {response.status_code} {response.text[:300]}"
                )
                continue
            body = response.json()
            if not (isinstance(body, dict) and set(body) == {"detail"}):
                problems.append(f"{where}: 404 body is not {{'detail': ...}}: {body!r}")
            elif not isinstance(body["detail"], str) or not body["detail"]:
                problems.append(f"{where}: 404 detail is not a message: {body!r}")
    return problems


async def snapshot(client: AsyncTestClient, db: AsyncSession, t: Tenant, key: str) -> Any:
    """Everything of ``t``'s outbound configuration, as its owner sees it, plus the raw
    credential rows (a replaced value shows only in the ciphertext)."""
    state: dict[str, Any] = {}
    org = f"/v1/orgs/{t.id}"
    for name, path in {
        "domains": f"{org}/allowed-domains/?limit=500",
        "credentials": f"{org}/credentials?limit=500",
        "providers": f"{org}/llm-providers?limit=500",
        "agents": f"{org}/agents?limit=500",
        "usage": f"{org}/credentials/{key}/usage",
    }.items():
        response = await client.get(path, headers=t.owner.headers)
        assert response.status_code == 200, f"GET {path}: {response.text}"
        state[name] = response.json()
    rows = await db.execute(
        text(
            "SELECT key, ciphertext, description, updated_at FROM credentials"
            " WHERE organization_id = :org ORDER BY key"
        ),
        {"org": uuid.UUID(t.id)},
    )
    state["credential_rows"] = [tuple(row) for row in rows]
    await db.commit()
    return state


async def test_another_organizations_paths_are_not_found(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    two = await two_tenants(client)
    b_before = await snapshot(client, db, two.b, two.b_ids["key"])
    callers = {
        "owner of A": two.a.owner,
        "GUEST of A": two.a.members["GUEST"],  # 404 comes before 403
        "platform token of A (all permissions)": two.a_token,
    }
    requests = outbound_requests(two.b.id, two.b_ids, provider_for_agents=two.b_ids["provider"])
    problems = await expect_404(client, callers, requests)
    assert not problems, report(problems)
    assert await snapshot(client, db, two.b, two.b_ids["key"]) == b_before, "B changed"


async def test_own_paths_with_another_organizations_ids_are_not_found(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    two = await two_tenants(client)
    b_before = await snapshot(client, db, two.b, two.b_ids["key"])
    a_before = await snapshot(client, db, two.a, two.a_ids["key"])
    a_org = f"/v1/orgs/{two.a.id}"
    b_provider = two.b_ids["provider"]
    http_agent = {"name": "x", "kind": "http", "endpoint_url": "https://x.example.com"}
    # A's own paths, B's ids.  Credential keys are names, not ids: B's key names nothing in A
    # (a PUT of it would just create A's own credential of that name, so it is left out).
    by_id = {
        "domain get",
        "domain patch",
        "domain delete",
        "credential usage",
        "credential delete",
        "provider get",
        "provider patch",
        "provider delete",
        "agent create",  # llm agent with B's provider
        "agent get",
        "agent patch",
        "agent delete",
    }
    requests = [
        r
        for r in outbound_requests(two.a.id, two.b_ids, provider_for_agents=b_provider)
        if r.name in by_id
    ]
    assert {r.name for r in requests} == by_id
    requests += [
        Request(
            "agent create (B's judge)",
            "POST",
            f"{a_org}/agents",
            {**http_agent, "judge_provider_id": b_provider},
        ),
        Request(
            "agent create (llm with A's provider, B's judge)",
            "POST",
            f"{a_org}/agents",
            {
                "name": "x",
                "kind": "llm",
                "llm_provider_id": two.a_ids["provider"],
                "judge_provider_id": b_provider,
            },
        ),
        Request(
            "agent create (http, B's provider)",
            "POST",
            f"{a_org}/agents",
            {**http_agent, "llm_provider_id": b_provider},
        ),
        Request(
            "A's agent patched onto B's provider",
            "PATCH",
            f"{a_org}/agents/{two.a_ids['agent']}",
            {"llm_provider_id": b_provider},
        ),
        Request(
            "A's agent patched onto B's judge",
            "PATCH",
            f"{a_org}/agents/{two.a_ids['agent']}",
            {"judge_provider_id": b_provider},
        ),
    ]
    callers = {"owner of A": two.a.owner, "platform token of A (all permissions)": two.a_token}
    problems = await expect_404(client, callers, requests)
    assert not problems, report(problems)
    assert await snapshot(client, db, two.b, two.b_ids["key"]) == b_before, "B changed"
    assert await snapshot(client, db, two.a, two.a_ids["key"]) == a_before, "A changed"


async def test_unknown_organization_is_not_found(client: AsyncTestClient) -> None:
    two = await two_tenants(client)
    nowhere = str(uuid.uuid4())
    ids = {"key": "a_key", "domain": two.a_ids["domain"], "provider": two.a_ids["provider"]}
    ids["agent"] = two.a_ids["agent"]
    requests = outbound_requests(nowhere, ids, provider_for_agents=two.a_ids["provider"])
    problems = await expect_404(
        client, {"owner of A": two.a.owner, "platform token of A": two.a_token}, requests
    )
    assert not problems, report(problems)
