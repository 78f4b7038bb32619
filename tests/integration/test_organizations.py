"""Organizations: creation makes the creator OWNER, reading, partial updates, deletion by the
owner only (DESIGN §3, §4)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import uuid4

from litestar.testing import AsyncTestClient

from shared.identity.permissions import ALL_PERMISSIONS
from tests.support.factories import (
    Caller,
    add_member,
    create_org,
    create_token,
    register,
    tenant,
)

ORG_FIELDS = {
    "id",
    "name",
    "business_information",
    "timezone",
    "created_by_user_id",
    "owner_user_id",
    "created_at",
    "updated_at",
}


async def memberships(client: AsyncTestClient, caller: Caller) -> dict[str, dict[str, Any]]:
    """The caller's organizations from /v1/auth/me, by id."""
    response = await client.get("/v1/auth/me", headers=caller.headers)
    assert response.status_code == 200, response.text
    return {org["id"]: org for org in response.json()["organizations"]}


def when(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp)


def assert_detail(response: Any, status: int) -> None:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and detail


def assert_invalid(response: Any, loc: list[str]) -> None:
    assert response.status_code == 422, response.text
    entries = response.json()["detail"]
    assert isinstance(entries, list) and entries
    assert entries[0]["loc"] == loc
    assert {"loc", "msg", "type", "input", "ctx"} <= set(entries[0])


# --- creating -------------------------------------------------------------------------------


async def test_creating_an_organization_makes_the_creator_its_owner(
    client: AsyncTestClient,
) -> None:
    user = await register(client)

    response = await client.post("/v1/organizations", json={"name": "Acme"}, headers=user.headers)

    assert response.status_code == 201, response.text
    org = response.json()
    assert set(org) == ORG_FIELDS
    assert org["name"] == "Acme"
    assert org["business_information"] == ""
    assert org["timezone"] == "UTC"
    assert org["created_by_user_id"] == user.id
    assert org["owner_user_id"] == user.id

    mine = await memberships(client, user)
    assert list(mine) == [org["id"]]
    assert mine[org["id"]]["role"]["name"] == "OWNER"
    assert mine[org["id"]]["role"]["is_system"] is True
    assert set(mine[org["id"]]["permissions"]) == set(ALL_PERMISSIONS)
    assert len(ALL_PERMISSIONS) == 24

    members = await client.get(f"/v1/organizations/{org['id']}/members", headers=user.headers)
    assert members.status_code == 200, members.text
    assert [(m["user_id"], m["role"]["name"]) for m in members.json()["members"]] == [
        (user.id, "OWNER")
    ]


async def test_creating_an_organization_keeps_its_business_information_and_timezone(
    client: AsyncTestClient,
) -> None:
    user = await register(client)

    response = await client.post(
        "/v1/organizations",
        json={
            "name": "Globex",
            "business_information": "We sell widgets.",
            "timezone": "Asia/Tokyo",
        },
        headers=user.headers,
    )

    assert response.status_code == 201, response.text
    created = response.json()
    assert created["business_information"] == "We sell widgets."
    assert created["timezone"] == "Asia/Tokyo"
    read = await client.get(f"/v1/organizations/{created['id']}", headers=user.headers)
    assert read.status_code == 200, read.text
    assert read.json() == created
    listed = await client.get("/v1/organizations", headers=user.headers)
    assert listed.status_code == 200, listed.text
    assert listed.json() == {"organizations": [created], "total": 1}


async def test_a_new_organization_has_the_five_system_roles(client: AsyncTestClient) -> None:
    user = await register(client)
    org = await create_org(client, user)

    response = await client.get(f"/v1/orgs/{org['id']}/roles", headers=user.headers)

    assert response.status_code == 200, response.text
    roles = {role["name"]: role for role in response.json()["roles"]}
    assert set(roles) == {"OWNER", "ADMIN", "MEMBER", "VIEWER", "GUEST"}
    assert all(role["is_system"] for role in roles.values())
    assert all(role["organization_id"] == org["id"] for role in roles.values())


async def test_organization_names_are_1_to_255_characters(client: AsyncTestClient) -> None:
    user = await register(client)

    empty = await client.post("/v1/organizations", json={"name": ""}, headers=user.headers)
    too_long = await client.post(
        "/v1/organizations", json={"name": "x" * 256}, headers=user.headers
    )
    missing = await client.post("/v1/organizations", json={}, headers=user.headers)
    longest = await client.post("/v1/organizations", json={"name": "x" * 255}, headers=user.headers)

    assert_invalid(empty, ["body", "name"])
    assert_invalid(too_long, ["body", "name"])
    assert_invalid(missing, ["body", "name"])
    assert longest.status_code == 201, longest.text
    assert longest.json()["name"] == "x" * 255
    # Only the valid request created anything.
    assert list(await memberships(client, user)) == [longest.json()["id"]]


async def test_an_unknown_timezone_is_rejected(client: AsyncTestClient) -> None:
    user = await register(client)

    response = await client.post(
        "/v1/organizations", json={"name": "Acme", "timezone": "Mars/Olympus"}, headers=user.headers
    )

    assert_invalid(response, ["body", "timezone"])
    assert await memberships(client, user) == {}


async def test_the_owner_cannot_be_chosen_in_the_request_body(client: AsyncTestClient) -> None:
    user = await register(client)
    other = await register(client)

    response = await client.post(
        "/v1/organizations",
        json={"name": "Acme", "owner_user_id": other.id},
        headers=user.headers,
    )

    assert_invalid(response, ["body", "owner_user_id"])
    assert await memberships(client, other) == {}


async def test_creating_an_organization_needs_a_token(client: AsyncTestClient) -> None:
    response = await client.post("/v1/organizations", json={"name": "Acme"})

    assert_detail(response, 401)


async def test_a_platform_token_cannot_create_an_organization(client: AsyncTestClient) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    pat = await create_token(client, owner, org["id"], ["org:read", "org:write"])

    response = await client.post("/v1/organizations", json={"name": "Shadow"}, headers=pat.headers)

    assert_detail(response, 403)
    listed = await client.get("/v1/organizations", headers=owner.headers)
    assert [o["name"] for o in listed.json()["organizations"]] == ["Acme"]


# --- listing and reading ---------------------------------------------------------------------


async def test_listing_shows_only_the_callers_organizations(client: AsyncTestClient) -> None:
    alice = await register(client)
    bob = await register(client)
    first = await create_org(client, alice, "Alpha")
    second = await create_org(client, alice, "Beta")
    await create_org(client, bob, "Bobco")

    response = await client.get("/v1/organizations", headers=alice.headers)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == 2
    assert [o["id"] for o in body["organizations"]] == [first["id"], second["id"]]
    assert set(body["organizations"][0]) == ORG_FIELDS

    page = await client.get("/v1/organizations?limit=1&offset=1", headers=alice.headers)
    assert page.status_code == 200, page.text
    assert page.json()["total"] == 2
    assert [o["id"] for o in page.json()["organizations"]] == [second["id"]]


async def test_an_organization_is_listed_for_its_members_too(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("GUEST",))

    response = await client.get("/v1/organizations", headers=org.members["GUEST"].headers)

    assert response.status_code == 200, response.text
    assert response.json()["total"] == 1
    assert [o["id"] for o in response.json()["organizations"]] == [org.id]


async def test_a_platform_token_lists_only_its_own_organization(client: AsyncTestClient) -> None:
    owner = await register(client)
    org = await create_org(client, owner, "Alpha")
    await create_org(client, owner, "Beta")
    pat = await create_token(client, owner, org["id"], ["org:read"])

    response = await client.get("/v1/organizations", headers=pat.headers)

    assert response.status_code == 200, response.text
    assert response.json()["total"] == 1
    assert [o["id"] for o in response.json()["organizations"]] == [org["id"]]


async def test_members_with_org_read_can_read_the_organization(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER",))

    response = await client.get(
        f"/v1/organizations/{org.id}", headers=org.members["VIEWER"].headers
    )

    assert response.status_code == 200, response.text
    assert response.json() == org.org


async def test_a_guest_cannot_read_the_organization(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("GUEST",))

    response = await client.get(f"/v1/organizations/{org.id}", headers=org.members["GUEST"].headers)

    assert_detail(response, 403)


async def test_another_organization_is_indistinguishable_from_a_missing_one(
    client: AsyncTestClient,
) -> None:
    owner = await register(client)
    outsider = await register(client)
    org = await create_org(client, owner)

    foreign = await client.get(f"/v1/organizations/{org['id']}", headers=outsider.headers)
    missing = await client.get(f"/v1/organizations/{uuid4()}", headers=outsider.headers)
    patched = await client.patch(
        f"/v1/organizations/{org['id']}", json={"name": "Mine now"}, headers=outsider.headers
    )
    deleted = await client.delete(f"/v1/organizations/{org['id']}", headers=outsider.headers)

    for response in (foreign, missing, patched, deleted):
        assert_detail(response, 404)
    assert foreign.json() == missing.json()
    still = await client.get(f"/v1/organizations/{org['id']}", headers=owner.headers)
    assert still.json()["name"] == "Acme"


async def test_a_malformed_organization_id_is_a_validation_error(client: AsyncTestClient) -> None:
    user = await register(client)

    response = await client.get("/v1/organizations/not-a-uuid", headers=user.headers)

    assert_invalid(response, ["path", "org_id"])


# --- updating ----------------------------------------------------------------------------------


async def test_updating_changes_only_the_given_fields(client: AsyncTestClient) -> None:
    owner = await register(client)
    created = await client.post(
        "/v1/organizations",
        json={"name": "Acme", "business_information": "Widgets", "timezone": "Europe/Paris"},
        headers=owner.headers,
    )
    org = created.json()

    response = await client.patch(
        f"/v1/organizations/{org['id']}", json={"name": "Acme Corp"}, headers=owner.headers
    )

    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["name"] == "Acme Corp"
    assert updated["business_information"] == "Widgets"
    assert updated["timezone"] == "Europe/Paris"
    assert updated["created_at"] == org["created_at"]
    assert when(updated["updated_at"]) > when(org["updated_at"])

    second = await client.patch(
        f"/v1/organizations/{org['id']}",
        json={"timezone": "America/New_York"},
        headers=owner.headers,
    )
    assert second.status_code == 200, second.text
    assert second.json()["name"] == "Acme Corp"
    assert second.json()["timezone"] == "America/New_York"
    read = await client.get(f"/v1/organizations/{org['id']}", headers=owner.headers)
    assert read.json() == second.json()


async def test_an_update_with_a_bad_timezone_or_empty_name_changes_nothing(
    client: AsyncTestClient,
) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    path = f"/v1/organizations/{org['id']}"

    bad_timezone = await client.patch(
        path, json={"name": "Renamed", "timezone": "Nowhere/Land"}, headers=owner.headers
    )
    empty_name = await client.patch(path, json={"name": ""}, headers=owner.headers)
    null_name = await client.patch(path, json={"name": None}, headers=owner.headers)

    assert_invalid(bad_timezone, ["body", "timezone"])
    assert_invalid(empty_name, ["body", "name"])
    assert_invalid(null_name, ["body", "name"])
    read = await client.get(path, headers=owner.headers)
    assert read.json() == org


async def test_updating_needs_org_write(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN", "MEMBER"))
    path = f"/v1/organizations/{org.id}"

    refused = await client.patch(
        path, json={"name": "By member"}, headers=org.members["MEMBER"].headers
    )
    allowed = await client.patch(
        path, json={"name": "By admin"}, headers=org.members["ADMIN"].headers
    )

    assert_detail(refused, 403)
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["name"] == "By admin"
    # The owner stays the owner whoever edits the organization.
    assert allowed.json()["owner_user_id"] == org.owner.id


# --- deleting ----------------------------------------------------------------------------------


async def test_only_the_owner_can_delete_the_organization(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN", "MEMBER"))
    path = f"/v1/organizations/{org.id}"

    by_admin = await client.delete(path, headers=org.members["ADMIN"].headers)
    by_member = await client.delete(path, headers=org.members["MEMBER"].headers)

    assert_detail(by_admin, 403)
    assert_detail(by_member, 403)
    still = await client.get(path, headers=org.owner.headers)
    assert still.status_code == 200, still.text


async def test_a_custom_role_named_like_the_owner_cannot_delete_the_organization(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    lookalike = await client.post(
        f"/v1/orgs/{org.id}/roles",
        json={"name": "Owner", "permissions": list(ALL_PERMISSIONS)},
        headers=org.owner.headers,
    )
    assert lookalike.status_code == 201, lookalike.text
    impostor = await add_member(client, org.owner, org.id, lookalike.json()["id"])

    response = await client.delete(f"/v1/organizations/{org.id}", headers=impostor.headers)

    assert_detail(response, 403)
    assert (
        await client.get(f"/v1/organizations/{org.id}", headers=impostor.headers)
    ).status_code == 200


async def test_a_platform_token_cannot_delete_the_organization(client: AsyncTestClient) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    pat = await create_token(client, owner, org["id"], list(ALL_PERMISSIONS))

    response = await client.delete(f"/v1/organizations/{org['id']}", headers=pat.headers)

    assert_detail(response, 403)
    assert (
        await client.get(f"/v1/organizations/{org['id']}", headers=owner.headers)
    ).status_code == 200


async def test_deleting_the_organization_removes_it_for_every_member(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    admin = org.members["ADMIN"]
    path = f"/v1/organizations/{org.id}"

    response = await client.delete(path, headers=org.owner.headers)

    assert response.status_code == 204, response.text
    assert response.content == b""
    for caller in (org.owner, admin):
        assert_detail(await client.get(path, headers=caller.headers), 404)
        assert await memberships(client, caller) == {}
        listed = await client.get("/v1/organizations", headers=caller.headers)
        assert listed.json() == {"organizations": [], "total": 0}
    assert_detail(await client.get(f"{path}/members", headers=org.owner.headers), 404)
    assert_detail(await client.get(f"/v1/orgs/{org.id}/roles", headers=org.owner.headers), 404)
    assert_detail(await client.delete(path, headers=org.owner.headers), 404)


async def test_deleting_an_organization_leaves_the_others_alone(client: AsyncTestClient) -> None:
    doomed = await tenant(client, with_roles=("ADMIN",))
    admin = doomed.members["ADMIN"]
    kept = await create_org(client, admin, "Kept")

    response = await client.delete(f"/v1/organizations/{doomed.id}", headers=doomed.owner.headers)

    assert response.status_code == 204, response.text
    assert list(await memberships(client, admin)) == [kept["id"]]
    roles = await client.get(f"/v1/orgs/{kept['id']}/roles", headers=admin.headers)
    assert roles.json()["total"] == 5


async def test_deleting_an_organization_retires_its_platform_tokens(
    client: AsyncTestClient,
) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    pat = await create_token(client, owner, org["id"], ["org:read"])

    response = await client.delete(f"/v1/organizations/{org['id']}", headers=owner.headers)

    assert response.status_code == 204, response.text
    after = await client.get(f"/v1/organizations/{org['id']}", headers=pat.headers)
    assert after.status_code in (401, 404), after.text
