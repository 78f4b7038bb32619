"""Tenant isolation: another organization's ids are indistinguishable from missing ones.

Two organizations A and B, each with an owner.  Whoever belongs to A (its owner, a GUEST,
a platform token with every permission) gets 404 ``{"detail": ...}`` — never 403, never
data — on every organization-scoped endpoint addressed with B's organization id, and on
A's own paths combined with B's role, member or token ids.  Afterwards B is unchanged.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from litestar.testing import AsyncTestClient

from tests.support.design import PERMISSION_CATALOGUE as ALL_PERMISSIONS
from tests.support.factories import Caller, Tenant, create_token, tenant, unique_email


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
    a_token: Caller  # platform token of A with every permission
    b_role: str  # a custom role of B
    b_token: str  # id of a platform token of B
    b_member: str  # user id of an invited member of B


async def two_tenants(client: AsyncTestClient) -> Two:
    a = await tenant(client, with_roles=("GUEST",))
    b = await tenant(client)
    a_token = await create_token(client, a.owner, a.id, ALL_PERMISSIONS, name="a-all")
    response = await client.post(
        f"/v1/orgs/{b.id}/roles",
        json={"name": "b custom", "permissions": ["org:read"]},
        headers=b.owner.headers,
    )
    assert response.status_code == 201, response.text
    b_role = response.json()["id"]
    b_token = await create_token(client, b.owner, b.id, ["org:read"], name="b-token")
    response = await client.post(
        f"/v1/organizations/{b.id}/members",
        json={"email": unique_email("b-member"), "role_id": b.roles["VIEWER"]},
        headers=b.owner.headers,
    )
    assert response.status_code == 201, response.text
    return Two(
        a=a,
        b=b,
        a_token=a_token,
        b_role=b_role,
        b_token=str(b_token.id),
        b_member=response.json()["user_id"],
    )


def org_scoped_requests(
    org_id: str, *, role_id: str, user_id: str, token_id: str, grant_role: str
) -> list[Request]:
    """Every organization-scoped identity endpoint on ``org_id`` with valid bodies, so that
    nothing but the organization can decide the answer."""
    organizations = f"/v1/organizations/{org_id}"
    members = f"{organizations}/members"
    roles = f"/v1/orgs/{org_id}/roles"
    tokens = f"/v1/orgs/{org_id}/platform-tokens"
    return [
        Request("organization get", "GET", organizations),
        Request("organization patch", "PATCH", organizations, {"name": "hijacked"}),
        Request("members list", "GET", members),
        Request(
            "member invite",
            "POST",
            members,
            {"email": unique_email("intruder"), "role_id": grant_role},
        ),
        Request("member get", "GET", f"{members}/{user_id}"),
        Request("member patch", "PATCH", f"{members}/{user_id}", {"role_id": grant_role}),
        Request("member delete", "DELETE", f"{members}/{user_id}"),
        Request("roles list", "GET", roles),
        Request("role create", "POST", roles, {"name": "intruder", "permissions": []}),
        Request("role get", "GET", f"{roles}/{role_id}"),
        Request("role patch", "PATCH", f"{roles}/{role_id}", {"name": "hijacked"}),
        Request("role delete", "DELETE", f"{roles}/{role_id}"),
        Request("platform tokens list", "GET", f"{tokens}/"),
        Request("platform token create", "POST", f"{tokens}/", {"name": "x", "permissions": []}),
        Request("platform token get", "GET", f"{tokens}/{token_id}"),
        Request("platform token revoke", "DELETE", f"{tokens}/{token_id}"),
        # Last: if it wrongly succeeded, everything above would still have been checked.
        Request("organization delete", "DELETE", organizations),
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


async def snapshot(client: AsyncTestClient, t: Tenant) -> dict[str, Any]:
    """Everything of ``t`` the identity endpoints show, as its owner sees it."""
    state: dict[str, Any] = {}
    for key, path in {
        "organization": f"/v1/organizations/{t.id}",
        "roles": f"/v1/orgs/{t.id}/roles?limit=500",
        "members": f"/v1/organizations/{t.id}/members?limit=500",
    }.items():
        response = await client.get(path, headers=t.owner.headers)
        assert response.status_code == 200, f"GET {path}: {response.text}"
        state[key] = response.json()
    response = await client.get(f"/v1/orgs/{t.id}/platform-tokens/", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    # Using a token moves its last_used_at (and so updated_at); everything else must stay.
    state["tokens"] = [
        {k: v for k, v in token.items() if k not in {"last_used_at", "updated_at"}}
        for token in response.json()["tokens"]
    ]
    return state


def report(problems: list[str]) -> str:
    return f"{len(problems)} wrong answer(s):\n" + "\n".join(problems)


async def test_another_organizations_id_is_not_found_for_every_kind_of_caller(
    client: AsyncTestClient,
) -> None:
    two = await two_tenants(client)
    b_before = await snapshot(client, two.b)
    callers = {
        "owner of A": two.a.owner,
        "GUEST of A": two.a.members["GUEST"],  # 404 comes before 403
        "platform token of A (all permissions)": two.a_token,
    }
    requests = org_scoped_requests(
        two.b.id,
        role_id=two.b_role,
        user_id=two.b_member,
        token_id=two.b_token,
        grant_role=two.b.roles["VIEWER"],
    )
    problems = await expect_404(client, callers, requests)
    # The owner of B is a member of B: addressing them by id is no different.
    problems += await expect_404(
        client,
        {"owner of A": two.a.owner},
        [
            Request("member get", "GET", f"/v1/organizations/{two.b.id}/members/{two.b.owner.id}"),
            Request(
                "member delete", "DELETE", f"/v1/organizations/{two.b.id}/members/{two.b.owner.id}"
            ),
        ],
    )
    assert not problems, report(problems)
    assert await snapshot(client, two.b) == b_before, "organization B changed"


async def test_own_organization_path_with_another_organizations_ids_is_not_found(
    client: AsyncTestClient,
) -> None:
    two = await two_tenants(client)
    a_before = await snapshot(client, two.a)
    b_before = await snapshot(client, two.b)
    a = two.a.id
    members = f"/v1/organizations/{a}/members"
    roles = f"/v1/orgs/{a}/roles"
    tokens = f"/v1/orgs/{a}/platform-tokens"
    guest_of_a = two.a.members["GUEST"].id
    by_id = [
        Request("role get", "GET", f"{roles}/{two.b_role}"),
        Request("role patch", "PATCH", f"{roles}/{two.b_role}", {"name": "hijacked"}),
        Request("role delete", "DELETE", f"{roles}/{two.b_role}"),
        Request("B's system role get", "GET", f"{roles}/{two.b.roles['ADMIN']}"),
        Request("member get (B's owner)", "GET", f"{members}/{two.b.owner.id}"),
        Request(
            "member patch (B's owner)",
            "PATCH",
            f"{members}/{two.b.owner.id}",
            {"role_id": two.a.roles["GUEST"]},
        ),
        Request("member delete (B's owner)", "DELETE", f"{members}/{two.b.owner.id}"),
        Request("member get (B's member)", "GET", f"{members}/{two.b_member}"),
        Request("member delete (B's member)", "DELETE", f"{members}/{two.b_member}"),
        # A role of B handed out inside A.
        Request(
            "member invite with B's role",
            "POST",
            members,
            {"email": unique_email("cross"), "role_id": two.b_role},
        ),
        Request(
            "member patch to B's role", "PATCH", f"{members}/{guest_of_a}", {"role_id": two.b_role}
        ),
    ]
    token_requests = [
        Request("platform token get", "GET", f"{tokens}/{two.b_token}"),
        Request("platform token revoke", "DELETE", f"{tokens}/{two.b_token}"),
    ]
    problems = await expect_404(
        client,
        {"owner of A": two.a.owner, "platform token of A (all permissions)": two.a_token},
        by_id,
    )
    # Platform tokens may not use the token endpoints at all (403), so only the owner here.
    problems += await expect_404(client, {"owner of A": two.a.owner}, token_requests)
    assert not problems, report(problems)
    assert await snapshot(client, two.b) == b_before, "organization B changed"
    assert await snapshot(client, two.a) == a_before, "organization A changed"


async def test_unknown_organization_id_is_not_found(client: AsyncTestClient) -> None:
    two = await two_tenants(client)
    nowhere = str(uuid.uuid4())
    requests = org_scoped_requests(
        nowhere,
        role_id=str(uuid.uuid4()),
        user_id=str(uuid.uuid4()),
        token_id=str(uuid.uuid4()),
        grant_role=str(uuid.uuid4()),
    )
    problems = await expect_404(
        client,
        {
            "owner of A": two.a.owner,
            "GUEST of A": two.a.members["GUEST"],
            "platform token of A (all permissions)": two.a_token,
        },
        requests,
    )
    assert not problems, report(problems)


async def test_unknown_ids_inside_own_organization_are_not_found(client: AsyncTestClient) -> None:
    """The control: the same 404 that foreign ids get is what missing ids get."""
    two = await two_tenants(client)
    a = two.a.id
    missing = str(uuid.uuid4())
    requests = [
        Request("role get", "GET", f"/v1/orgs/{a}/roles/{missing}"),
        Request("member get", "GET", f"/v1/organizations/{a}/members/{missing}"),
        Request("platform token get", "GET", f"/v1/orgs/{a}/platform-tokens/{missing}"),
        Request(
            "member invite with unknown role",
            "POST",
            f"/v1/organizations/{a}/members",
            {"email": unique_email("ghost"), "role_id": missing},
        ),
    ]
    problems = await expect_404(client, {"owner of A": two.a.owner}, requests)
    assert not problems, report(problems)


async def test_listings_show_only_the_callers_organization(client: AsyncTestClient) -> None:
    two = await two_tenants(client)
    problems: list[str] = []
    for who, caller in {
        "owner of A": two.a.owner,
        "GUEST of A": two.a.members["GUEST"],
        "platform token of A": two.a_token,
    }.items():
        response = await client.get("/v1/organizations", headers=caller.headers)
        assert response.status_code == 200, f"{who}: {response.text}"
        body = response.json()
        ids = [org["id"] for org in body["organizations"]]
        if ids != [two.a.id] or body["total"] != 1:
            problems.append(f"GET /v1/organizations as {who}: {ids}, total {body['total']}")
    response = await client.get("/v1/auth/me", headers=two.a.owner.headers)
    assert response.status_code == 200, response.text
    me_orgs = [org["id"] for org in response.json()["organizations"]]
    if me_orgs != [two.a.id]:
        problems.append(f"GET /v1/auth/me as owner of A lists {me_orgs}")
    response = await client.get(
        f"/v1/organizations/{two.a.id}/members?limit=500", headers=two.a.owner.headers
    )
    assert response.status_code == 200, response.text
    member_users = {m["user_id"] for m in response.json()["members"]}
    if member_users != {two.a.owner.id, two.a.members["GUEST"].id}:
        problems.append(f"A's members listing shows users {sorted(member_users)}")
    response = await client.get(f"/v1/orgs/{two.a.id}/roles?limit=500", headers=two.a.owner.headers)
    assert response.status_code == 200, response.text
    foreign = [r for r in response.json()["roles"] if r["organization_id"] != two.a.id]
    if foreign or two.b_role in {r["id"] for r in response.json()["roles"]}:
        problems.append(f"A's roles listing shows roles of another organization: {foreign}")
    response = await client.get(
        f"/v1/orgs/{two.a.id}/platform-tokens/", headers=two.a.owner.headers
    )
    assert response.status_code == 200, response.text
    token_ids = {t["id"] for t in response.json()["tokens"]}
    if token_ids != {str(two.a_token.id)}:
        problems.append(f"A's platform tokens listing shows {sorted(token_ids)}")
    assert not problems, report(problems)
