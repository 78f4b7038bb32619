"""Every identity endpoint, every kind of principal: the allowed success code or 403.

The expected matrix is written from DESIGN §4 (permission catalogue, system roles), the
route requirements and the rules for handing out access in docs/permissions.md (ADMIN
is given, taken and removed only by an OWNER or ADMIN), never read from the application's
own tables, so a drift in the role definitions, a route's ``access=`` rule or a
service's own check shows up here.

Each test builds one tenant (a user per system role plus two platform tokens) and loops
over the principals inside it; for a permission rule also over a token holding only that
permission and one holding all the others, so that a route checking the wrong
permission fails even where the system roles cannot tell the two apart.  Destructive
calls get a fresh target per principal, and a failure lists every ``endpoint as
principal`` pair that answered wrongly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.design import ALL_PERMISSIONS, ROLE_PERMISSIONS, USER_ROLES
from tests.support.factories import (
    Caller,
    Tenant,
    create_org,
    create_token,
    roles_by_name,
    tenant,
    unique_email,
)

# --- the expected matrix, from DESIGN §4 ---------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """What a route demands: any principal, users only, a permission, or a system role."""

    users_only: bool = False
    permission: str | None = None
    roles: frozenset[str] | None = None


ANYONE = Rule()
USERS_ONLY = Rule(users_only=True)
ADMIN_OR_OWNER = Rule(users_only=True, roles=frozenset({"OWNER", "ADMIN"}))
# Giving the ADMIN role, or acting on an ADMIN: the route's permission and the role too.
ADMIN_MEMBERS = Rule(users_only=True, permission="members:write", roles=ADMIN_OR_OWNER.roles)
OWNER_ONLY = Rule(users_only=True, roles=frozenset({"OWNER"}))


def needs(permission: str) -> Rule:
    return Rule(permission=permission)


@dataclass
class Principal:
    name: str
    caller: Caller
    role: str | None  # system role of a user; None for a platform token
    permissions: frozenset[str]

    @property
    def is_user(self) -> bool:
        return self.role is not None

    @property
    def headers(self) -> dict[str, str]:
        return self.caller.headers


def allowed(rule: Rule, principal: Principal) -> bool:
    if rule.users_only and not principal.is_user:
        return False
    if rule.roles is not None and principal.role not in rule.roles:
        return False
    return rule.permission is None or rule.permission in principal.permissions


# --- the machinery --------------------------------------------------------------------------------


@dataclass
class Call:
    path: str
    json: Any = None
    headers: dict[str, str] | None = None  # overrides the principal's own headers
    target: dict[str, Any] = field(default_factory=dict)  # what `after` needs to check


Prepare = Callable[[Principal], Awaitable[Call]]
# (principal, call, response, expected_allowed) -> problem or None
After = Callable[[Principal, Call, Any, bool], Awaitable[str | None]]


@dataclass
class Endpoint:
    name: str
    method: str
    success: int
    rule: Rule
    prepare: Prepare
    after: After | None = None


@dataclass
class World:
    client: AsyncTestClient
    tenant: Tenant
    principals: list[Principal]

    @property
    def owner(self) -> Caller:
        return self.tenant.owner

    @property
    def org_id(self) -> str:
        return self.tenant.id

    narrow: dict[str, Principal] = field(default_factory=dict)

    def principal(self, name: str) -> Principal:
        return next(p for p in self.principals if p.name == name)

    async def principals_for(self, rule: Rule) -> list[Principal]:
        """The seven principals, plus for a permission rule two platform tokens that tell
        that permission apart from every other: one holding only it, one holding all but it."""
        if rule.permission is None:
            return self.principals
        extra = []
        for name, permissions in (
            (f"PAT(only {rule.permission})", frozenset({rule.permission})),
            (f"PAT(all but {rule.permission})", ALL_PERMISSIONS - {rule.permission}),
        ):
            if name not in self.narrow:
                pat = await create_token(self.client, self.owner, self.org_id, sorted(permissions))
                self.narrow[name] = Principal(name, pat, None, permissions)
            extra.append(self.narrow[name])
        return [*self.principals, *extra]


async def build_world(client: AsyncTestClient) -> World:
    t = await tenant(client, with_roles=("ADMIN", "MEMBER", "VIEWER", "GUEST"))
    principals = [
        Principal(role, t.members[role], role, ROLE_PERMISSIONS[role]) for role in USER_ROLES
    ]
    pat_all = await create_token(client, t.owner, t.id, sorted(ALL_PERMISSIONS))
    pat_none = await create_token(client, t.owner, t.id, [])
    principals.append(Principal("PAT(all permissions)", pat_all, None, ALL_PERMISSIONS))
    principals.append(Principal("PAT(no permissions)", pat_none, None, frozenset()))
    return World(client=client, tenant=t, principals=principals)


async def run_matrix(world: World, endpoints: list[Endpoint]) -> list[str]:
    """Call every endpoint as every principal; return one line per wrong answer."""
    problems: list[str] = []
    for endpoint in endpoints:
        for principal in await world.principals_for(endpoint.rule):
            call = await endpoint.prepare(principal)
            ok = allowed(endpoint.rule, principal)
            expected = endpoint.success if ok else 403
            response = await world.client.request(
                endpoint.method,
                call.path,
                json=call.json,
                headers=call.headers or principal.headers,
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


async def get_status(world: World, path: str, caller: Caller | None = None) -> int:
    response = await world.client.get(path, headers=(caller or world.owner).headers)
    return response.status_code


async def owner_get(world: World, path: str) -> Any:
    response = await world.client.get(path, headers=world.owner.headers)
    assert response.status_code == 200, f"GET {path} as owner: {response.text}"
    return response.json()


# --- auth and organizations ----------------------------------------------------------------------


async def test_auth_and_organization_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    org = f"/v1/organizations/{world.org_id}"

    async def fixed(path: str, body: Any = None) -> Call:
        return Call(path=path, json=body)

    async def fresh_org_for(principal: Principal) -> Call:
        """A new organization of the same owner in which ``principal`` has its standing."""
        fresh = await create_org(client, world.owner, name=f"to delete by {principal.name}")
        if principal.is_user:
            if principal.role != "OWNER":
                roles = await roles_by_name(client, world.owner, fresh["id"])
                response = await client.post(
                    f"/v1/organizations/{fresh['id']}/members",
                    json={"email": principal.caller.email, "role_id": roles[principal.role]},
                    headers=world.owner.headers,
                )
                assert response.status_code == 201, response.text
            headers = principal.headers
        else:
            pat = await create_token(
                client, world.owner, fresh["id"], sorted(principal.permissions)
            )
            headers = pat.headers
        return Call(path=f"/v1/organizations/{fresh['id']}", headers=headers)

    async def after_create_org(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        if not ok:
            return None
        body = response.json()
        if body.get("name") != call.json["name"] or body.get("owner_user_id") != p.caller.id:
            return f"created organization is not the caller's: {body!r}"
        return None

    async def after_patch_org(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        name = (await owner_get(world, org))["name"]
        if ok != (name == call.json["name"]):
            return f"organization name is {name!r} afterwards"
        return None

    async def after_delete_org(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        status = await get_status(world, call.path)
        if status != (404 if ok else 200):
            return f"the owner's GET of the organization answers {status} afterwards"
        return None

    async def after_logout(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        me = await client.get("/v1/auth/me", headers=p.headers)
        if ok and me.status_code != 401:
            return f"the token still works after logout: GET /v1/auth/me {me.status_code}"
        if not ok:
            still = await client.get("/v1/organizations", headers=p.headers)
            if still.status_code != 200:
                return f"a refused logout broke the token: {still.status_code}"
        return None

    endpoints = [
        Endpoint("auth me", "GET", 200, USERS_ONLY, lambda p: fixed("/v1/auth/me")),
        Endpoint("organizations list", "GET", 200, ANYONE, lambda p: fixed("/v1/organizations")),
        Endpoint(
            "organizations create",
            "POST",
            201,
            USERS_ONLY,
            lambda p: fixed("/v1/organizations", {"name": f"created by {p.name}"}),
            after_create_org,
        ),
        Endpoint("organization get", "GET", 200, needs("org:read"), lambda p: fixed(org)),
        Endpoint(
            "organization patch",
            "PATCH",
            200,
            needs("org:write"),
            lambda p: fixed(org, {"name": f"renamed by {p.name}"}),
            after_patch_org,
        ),
        Endpoint("organization delete", "DELETE", 204, OWNER_ONLY, fresh_org_for, after_delete_org),
        # Last: it revokes the token the principal uses.
        Endpoint(
            "auth logout",
            "POST",
            204,
            USERS_ONLY,
            lambda p: fixed("/v1/auth/logout"),
            after_logout,
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


# --- members --------------------------------------------------------------------------------------


async def test_member_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    roles = world.tenant.roles
    members = f"/v1/organizations/{world.org_id}/members"
    viewer_id = world.tenant.members["VIEWER"].id

    async def fixed(path: str, body: Any = None) -> Call:
        return Call(path=path, json=body)

    async def invitee(role: str = "GUEST") -> str:
        """A fresh member (an invited user) with ``role`` to act on; returns its user id."""
        response = await client.post(
            members,
            json={"email": unique_email("target"), "role_id": roles[role]},
            headers=world.owner.headers,
        )
        assert response.status_code == 201, response.text
        return response.json()["user_id"]

    def invite_as(role: str) -> Prepare:
        async def invite_call(p: Principal) -> Call:
            email = unique_email("invitee")
            return Call(members, {"email": email, "role_id": roles[role]}, target={"email": email})

        return invite_call

    async def after_invite(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await owner_get(world, f"{members}?limit=500")
        emails = {m["user"]["email"] for m in listing["members"]}
        if ok != (call.target["email"] in emails):
            return f"invited email listed afterwards: {call.target['email'] in emails}"
        return None

    # The new role grants nothing, so whoever holds members:write may hand it out.
    response = await client.post(
        f"/v1/orgs/{world.org_id}/roles",
        json={"name": "nothing", "permissions": []},
        headers=world.owner.headers,
    )
    assert response.status_code == 201, response.text
    empty_role = response.json()["id"]

    role_names = {role_id: name for name, role_id in roles.items()} | {empty_role: "nothing"}

    def re_role(before: str, after_id: str) -> Prepare:
        async def patch_call(p: Principal) -> Call:
            user_id = await invitee(before)
            return Call(f"{members}/{user_id}", {"role_id": after_id}, target={"before": before})

        return patch_call

    async def after_patch(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        role = (await owner_get(world, call.path))["role"]["name"]
        if role != (role_names[call.json["role_id"]] if ok else call.target["before"]):
            return f"the member's role is {role} afterwards"
        return None

    def remove(role: str) -> Prepare:
        async def delete_call(p: Principal) -> Call:
            return Call(f"{members}/{await invitee(role)}")

        return delete_call

    async def after_delete(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        status = await get_status(world, call.path)
        if status != (404 if ok else 200):
            return f"the owner's GET of the member answers {status} afterwards"
        return None

    endpoints = [
        Endpoint("members list", "GET", 200, needs("members:read"), lambda p: fixed(members)),
        Endpoint(
            "member get",
            "GET",
            200,
            needs("members:read"),
            lambda p: fixed(f"{members}/{viewer_id}"),
        ),
        Endpoint(
            "member invite", "POST", 201, needs("members:write"), invite_as("GUEST"), after_invite
        ),
        Endpoint(
            "member patch",
            "PATCH",
            200,
            needs("members:write"),
            re_role("GUEST", empty_role),
            after_patch,
        ),
        Endpoint(
            "member delete", "DELETE", 204, needs("members:write"), remove("GUEST"), after_delete
        ),
        Endpoint(
            "member invite as ADMIN", "POST", 201, ADMIN_MEMBERS, invite_as("ADMIN"), after_invite
        ),
        Endpoint(
            "member promote to ADMIN",
            "PATCH",
            200,
            ADMIN_MEMBERS,
            re_role("GUEST", roles["ADMIN"]),
            after_patch,
        ),
        Endpoint(
            "member re-role an ADMIN",
            "PATCH",
            200,
            ADMIN_MEMBERS,
            re_role("ADMIN", empty_role),
            after_patch,
        ),
        Endpoint(
            "member remove an ADMIN", "DELETE", 204, ADMIN_MEMBERS, remove("ADMIN"), after_delete
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


# --- roles ----------------------------------------------------------------------------------------


async def test_role_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    roles_path = f"/v1/orgs/{world.org_id}/roles"
    viewer_role = world.tenant.roles["VIEWER"]
    counter = iter(range(1, 10_000))

    async def fixed(path: str, body: Any = None) -> Call:
        return Call(path=path, json=body)

    async def custom_role() -> str:
        """A fresh custom role granting nothing (so it is nobody's to out-grant)."""
        response = await client.post(
            roles_path,
            json={"name": f"target {next(counter)}", "permissions": []},
            headers=world.owner.headers,
        )
        assert response.status_code == 201, response.text
        return response.json()["id"]

    async def create_call(p: Principal) -> Call:
        name = f"made by {p.name}"
        # No permissions: whoever holds roles:write may create it (nothing to out-grant).
        return Call(roles_path, {"name": name, "permissions": []}, target={"name": name})

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await owner_get(world, f"{roles_path}?limit=500")
        names = {r["name"] for r in listing["roles"]}
        if ok != (call.target["name"] in names):
            return f"role {call.target['name']!r} listed afterwards: {not ok}"
        return None

    async def patch_call(p: Principal) -> Call:
        role_id = await custom_role()
        return Call(f"{roles_path}/{role_id}", {"name": f"renamed by {p.name}"})

    async def after_patch(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        name = (await owner_get(world, call.path))["name"]
        if ok != (name == call.json["name"]):
            return f"the role's name is {name!r} afterwards"
        return None

    async def delete_call(p: Principal) -> Call:
        return Call(f"{roles_path}/{await custom_role()}")

    async def after_delete(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        status = await get_status(world, call.path)
        if status != (404 if ok else 200):
            return f"the owner's GET of the role answers {status} afterwards"
        return None

    endpoints = [
        Endpoint("roles list", "GET", 200, needs("roles:read"), lambda p: fixed(roles_path)),
        Endpoint(
            "role get",
            "GET",
            200,
            needs("roles:read"),
            lambda p: fixed(f"{roles_path}/{viewer_role}"),
        ),
        Endpoint("role create", "POST", 201, needs("roles:write"), create_call, after_create),
        Endpoint("role patch", "PATCH", 200, needs("roles:write"), patch_call, after_patch),
        Endpoint("role delete", "DELETE", 204, needs("roles:write"), delete_call, after_delete),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


# --- platform tokens -----------------------------------------------------------------------------


async def test_platform_token_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    tokens = f"/v1/orgs/{world.org_id}/platform-tokens"
    existing = world.principal("PAT(no permissions)").caller.id

    async def fixed(path: str, body: Any = None) -> Call:
        return Call(path=path, json=body)

    async def create_call(p: Principal) -> Call:
        name = f"made by {p.name}"
        return Call(
            f"{tokens}/", {"name": name, "permissions": ["org:read"]}, target={"name": name}
        )

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await owner_get(world, f"{tokens}/?limit=500")
        names = {t["name"] for t in listing["tokens"]}
        if ok != (call.target["name"] in names):
            return f"token {call.target['name']!r} listed afterwards: {not ok}"
        if ok and not response.json().get("token", "").startswith("pat_"):
            return f"the create answer has no full pat_ token: {response.text[:300]}"
        return None

    async def revoke_call(p: Principal) -> Call:
        target = await create_token(client, world.owner, world.org_id, [], name="to revoke")
        return Call(f"{tokens}/{target.id}")

    async def after_revoke(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        active = (await owner_get(world, call.path))["is_active"]
        if active == ok:
            return f"the token's is_active is {active} afterwards"
        return None

    endpoints = [
        Endpoint("platform tokens list", "GET", 200, ADMIN_OR_OWNER, lambda p: fixed(f"{tokens}/")),
        Endpoint("platform token create", "POST", 201, ADMIN_OR_OWNER, create_call, after_create),
        Endpoint(
            "platform token get",
            "GET",
            200,
            ADMIN_OR_OWNER,
            lambda p: fixed(f"{tokens}/{existing}"),
        ),
        Endpoint("platform token revoke", "DELETE", 204, ADMIN_OR_OWNER, revoke_call, after_revoke),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


# --- webhook endpoints ---------------------------------------------------------------------------


async def test_webhook_endpoint_matrix(client: AsyncTestClient) -> None:
    world = await build_world(client)
    hooks = f"/v1/orgs/{world.org_id}/webhook-endpoints"
    body = {"url": "https://hooks.example.com/spar", "events": ["batch.completed"]}

    async def fixed(path: str, json: Any = None) -> Call:
        return Call(path=path, json=json)

    async def endpoint() -> str:
        response = await client.post(hooks, json=body, headers=world.owner.headers)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    existing = await endpoint()

    async def create_call(p: Principal) -> Call:
        description = f"made by {p.name}"
        return Call(hooks, {**body, "description": description}, target={"d": description})

    async def after_create(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        listing = await owner_get(world, f"{hooks}?limit=500")
        made = {e["description"] for e in listing["webhook_endpoints"]}
        if ok != (call.target["d"] in made):
            return f"endpoint {call.target['d']!r} listed afterwards: {not ok}"
        if ok and not response.json().get("secret", "").startswith("whsec_"):
            return f"the create answer has no whsec_ secret: {response.text[:300]}"
        return None

    async def patch_call(p: Principal) -> Call:
        return Call(f"{hooks}/{await endpoint()}", {"description": f"changed by {p.name}"})

    async def after_patch(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        description = (await owner_get(world, call.path))["description"]
        if ok != (description == call.json["description"]):
            return f"the endpoint's description is {description!r} afterwards"
        return None

    async def delete_call(p: Principal) -> Call:
        return Call(f"{hooks}/{await endpoint()}")

    async def after_delete(p: Principal, call: Call, response: Any, ok: bool) -> str | None:
        status = await get_status(world, call.path)
        if status != (404 if ok else 200):
            return f"the owner's GET of the endpoint answers {status} afterwards"
        return None

    unknown = "00000000-0000-4000-8000-000000000000"
    endpoints = [
        Endpoint(
            "webhook endpoints list",
            "GET",
            200,
            needs("notifications:read"),
            lambda p: fixed(hooks),
        ),
        Endpoint(
            "webhook endpoint get",
            "GET",
            200,
            needs("notifications:read"),
            lambda p: fixed(f"{hooks}/{existing}"),
        ),
        Endpoint(
            "webhook deliveries list",
            "GET",
            200,
            needs("notifications:read"),
            lambda p: fixed(f"{hooks}/{existing}/deliveries"),
        ),
        Endpoint(
            "webhook endpoint create",
            "POST",
            201,
            needs("notifications:write"),
            create_call,
            after_create,
        ),
        Endpoint(
            "webhook endpoint patch",
            "PATCH",
            200,
            needs("notifications:write"),
            patch_call,
            after_patch,
        ),
        Endpoint(
            "webhook endpoint delete",
            "DELETE",
            204,
            needs("notifications:write"),
            delete_call,
            after_delete,
        ),
        # Refused before it is looked up: a delivery nobody made is 404 only to a writer.
        Endpoint(
            "webhook redeliver",
            "POST",
            404,
            needs("notifications:write"),
            lambda p: fixed(f"{hooks}/{existing}/deliveries/{unknown}/redeliver"),
        ),
    ]
    problems = await run_matrix(world, endpoints)
    assert not problems, report(problems)


# --- the roles themselves -------------------------------------------------------------------------


async def test_system_roles_carry_the_designed_permissions(client: AsyncTestClient) -> None:
    """/auth/me shows each system role's effective permissions exactly as DESIGN §4 lists them."""
    world = await build_world(client)
    problems: list[str] = []
    for principal in world.principals:
        if not principal.is_user:
            continue
        response = await client.get("/v1/auth/me", headers=principal.headers)
        assert response.status_code == 200, f"GET /v1/auth/me as {principal.name}: {response.text}"
        entry = next((o for o in response.json()["organizations"] if o["id"] == world.org_id), None)
        if entry is None:
            problems.append(f"/v1/auth/me as {principal.name}: organization missing")
            continue
        if entry["role"]["name"] != principal.role or entry["role"]["is_system"] is not True:
            problems.append(f"/v1/auth/me as {principal.name}: role {entry['role']!r}")
        got = set(entry["permissions"])
        if got != principal.permissions or len(entry["permissions"]) != len(got):
            problems.append(
                f"/v1/auth/me as {principal.name}: extra {sorted(got - principal.permissions)}, "
                f"missing {sorted(principal.permissions - got)}"
            )
    assert not problems, report(problems)
