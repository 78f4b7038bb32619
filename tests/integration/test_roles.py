"""Roles: the five system roles, custom roles (name + permissions), and deleting a custom
role, whose members fall back to GUEST (spec 9, DESIGN §3, §4)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import uuid4

from litestar.testing import AsyncTestClient

from tests.support.design import PERMISSION_CATALOGUE as ALL_PERMISSIONS
from tests.support.factories import Caller, Tenant, add_member, tenant

READS = {p for p in ALL_PERMISSIONS if p.endswith(":read")}
ROLE_FIELDS = {
    "id",
    "organization_id",
    "name",
    "is_system",
    "permissions",
    "created_at",
    "updated_at",
}


def roles_path(org_id: str, role_id: str | None = None) -> str:
    base = f"/v1/orgs/{org_id}/roles"
    return f"{base}/{role_id}" if role_id else base


async def create_role(
    client: AsyncTestClient, caller: Caller, org_id: str, name: str, permissions: list[str]
) -> Any:
    return await client.post(
        roles_path(org_id), json={"name": name, "permissions": permissions}, headers=caller.headers
    )


async def access_in(client: AsyncTestClient, caller: Caller, org_id: str) -> dict[str, Any]:
    """The caller's role and permissions in ``org_id`` according to /v1/auth/me."""
    response = await client.get("/v1/auth/me", headers=caller.headers)
    assert response.status_code == 200, response.text
    return next(o for o in response.json()["organizations"] if o["id"] == org_id)


async def membership(client: AsyncTestClient, org: Tenant, user_id: str) -> dict[str, Any]:
    response = await client.get(
        f"/v1/organizations/{org.id}/members/{user_id}", headers=org.owner.headers
    )
    assert response.status_code == 200, response.text
    return response.json()


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


# --- system roles ------------------------------------------------------------------------------


async def test_an_organization_starts_with_the_five_system_roles(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await client.get(roles_path(org.id), headers=org.owner.headers)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == 5
    roles = {role["name"]: role for role in body["roles"]}
    assert set(roles) == {"OWNER", "ADMIN", "MEMBER", "VIEWER", "GUEST"}
    for role in roles.values():
        assert set(role) == ROLE_FIELDS
        assert role["is_system"] is True
        assert role["organization_id"] == org.id
    permissions = {name: set(role["permissions"]) for name, role in roles.items()}
    assert len(ALL_PERMISSIONS) == 24
    assert permissions["OWNER"] == set(ALL_PERMISSIONS)
    assert permissions["ADMIN"] == set(ALL_PERMISSIONS)
    assert permissions["MEMBER"] == READS | {
        "scenarios:write",
        "scenarios:run",
        "knowledge:write",
        "triggers:write",
        "agents:write",
    }
    assert permissions["VIEWER"] == READS
    assert permissions["GUEST"] == set()


async def test_each_organization_has_its_own_system_roles(client: AsyncTestClient) -> None:
    first = await tenant(client)
    second = await tenant(client)

    assert set(first.roles) == set(second.roles)
    assert not set(first.roles.values()) & set(second.roles.values())


async def test_the_role_listing_is_paged(client: AsyncTestClient) -> None:
    org = await tenant(client)
    everything = (await client.get(roles_path(org.id), headers=org.owner.headers)).json()["roles"]

    page = await client.get(roles_path(org.id) + "?limit=2&offset=1", headers=org.owner.headers)
    too_big = await client.get(roles_path(org.id) + "?limit=501", headers=org.owner.headers)
    negative = await client.get(roles_path(org.id) + "?offset=-1", headers=org.owner.headers)

    assert page.status_code == 200, page.text
    assert page.json()["total"] == 5
    assert page.json()["roles"] == everything[1:3]
    assert_invalid(too_big, ["query", "limit"])
    assert_invalid(negative, ["query", "offset"])


async def test_system_roles_cannot_be_changed(client: AsyncTestClient) -> None:
    org = await tenant(client)
    before = (
        await client.get(roles_path(org.id, org.roles["GUEST"]), headers=org.owner.headers)
    ).json()

    renamed = await client.patch(
        roles_path(org.id, org.roles["GUEST"]), json={"name": "Visitor"}, headers=org.owner.headers
    )
    widened = await client.patch(
        roles_path(org.id, org.roles["GUEST"]),
        json={"permissions": ["org:read"]},
        headers=org.owner.headers,
    )

    assert_detail(renamed, 409)
    assert_detail(widened, 409)
    after = await client.get(roles_path(org.id, org.roles["GUEST"]), headers=org.owner.headers)
    assert after.json() == before


async def test_deleting_a_system_role_is_refused(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER",))

    for name, role_id in org.roles.items():
        response = await client.delete(roles_path(org.id, role_id), headers=org.owner.headers)
        assert_detail(response, 409)
        still = await client.get(roles_path(org.id, role_id), headers=org.owner.headers)
        assert still.status_code == 200, still.text
        assert still.json()["name"] == name

    listing = await client.get(roles_path(org.id), headers=org.owner.headers)
    assert listing.json()["total"] == 5
    assert (await access_in(client, org.members["VIEWER"], org.id))["role"]["name"] == "VIEWER"


# --- custom roles ------------------------------------------------------------------------------


async def test_creating_a_custom_role(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await create_role(
        client, org.owner, org.id, "Scenario author", ["scenarios:read", "scenarios:write"]
    )

    assert response.status_code == 201, response.text
    role = response.json()
    assert set(role) == ROLE_FIELDS
    assert role["organization_id"] == org.id
    assert role["name"] == "Scenario author"
    assert role["is_system"] is False
    assert set(role["permissions"]) == {"scenarios:read", "scenarios:write"}
    read = await client.get(roles_path(org.id, role["id"]), headers=org.owner.headers)
    assert read.status_code == 200, read.text
    assert read.json() == role
    listing = (await client.get(roles_path(org.id), headers=org.owner.headers)).json()
    assert listing["total"] == 6
    assert role in listing["roles"]


async def test_a_custom_role_lists_each_permission_once(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await create_role(
        client, org.owner, org.id, "Readers", ["org:read", "roles:read", "org:read"]
    )

    assert response.status_code == 201, response.text
    assert sorted(response.json()["permissions"]) == ["org:read", "roles:read"]


async def test_a_custom_role_may_have_no_permissions(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await create_role(client, org.owner, org.id, "Nobody", [])

    assert response.status_code == 201, response.text
    assert response.json()["permissions"] == []


async def test_an_unknown_permission_is_rejected(client: AsyncTestClient) -> None:
    org = await tenant(client)

    unknown = await create_role(client, org.owner, org.id, "Wizard", ["org:read", "magic:cast"])
    upper = await create_role(client, org.owner, org.id, "Shouter", ["ORG:READ"])

    assert_invalid(unknown, ["body", "permissions", "1"])
    assert_invalid(upper, ["body", "permissions", "0"])
    names = await roles_names(client, org)
    assert "Wizard" not in names and "Shouter" not in names


async def roles_names(client: AsyncTestClient, org: Tenant) -> set[str]:
    response = await client.get(roles_path(org.id), headers=org.owner.headers)
    return {role["name"] for role in response.json()["roles"]}


async def test_a_role_name_is_1_to_100_characters_and_permissions_are_required(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    path = roles_path(org.id)
    headers = org.owner.headers

    empty = await client.post(path, json={"name": "", "permissions": []}, headers=headers)
    too_long = await client.post(path, json={"name": "r" * 101, "permissions": []}, headers=headers)
    no_permissions = await client.post(path, json={"name": "Loose"}, headers=headers)
    not_a_list = await client.post(
        path, json={"name": "Loose", "permissions": "org:read"}, headers=headers
    )
    system_flag = await client.post(
        path, json={"name": "Sneaky", "permissions": [], "is_system": True}, headers=headers
    )
    longest = await client.post(path, json={"name": "r" * 100, "permissions": []}, headers=headers)

    assert_invalid(empty, ["body", "name"])
    assert_invalid(too_long, ["body", "name"])
    assert_invalid(no_permissions, ["body", "permissions"])
    assert_invalid(not_a_list, ["body", "permissions"])
    assert_invalid(system_flag, ["body", "is_system"])
    assert longest.status_code == 201, longest.text
    assert await roles_names(client, org) == {
        "OWNER",
        "ADMIN",
        "MEMBER",
        "VIEWER",
        "GUEST",
        "r" * 100,
    }


async def test_a_duplicate_role_name_conflicts(client: AsyncTestClient) -> None:
    org = await tenant(client)
    other = await tenant(client)
    assert (
        await create_role(client, org.owner, org.id, "Auditor", ["org:read"])
    ).status_code == 201

    duplicate = await create_role(client, org.owner, org.id, "Auditor", ["roles:read"])
    system_name = await create_role(client, org.owner, org.id, "ADMIN", [])
    elsewhere = await create_role(client, other.owner, other.id, "Auditor", [])

    assert_detail(duplicate, 409)
    assert_detail(system_name, 409)
    assert elsewhere.status_code == 201, elsewhere.text
    listing = (await client.get(roles_path(org.id), headers=org.owner.headers)).json()
    auditors = [role for role in listing["roles"] if role["name"] == "Auditor"]
    assert len(auditors) == 1
    assert auditors[0]["permissions"] == ["org:read"]
    assert listing["total"] == 6


async def test_updating_a_custom_role_changes_only_the_given_fields(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    role = (await create_role(client, org.owner, org.id, "Auditor", ["org:read"])).json()
    path = roles_path(org.id, role["id"])

    renamed = await client.patch(path, json={"name": "Inspector"}, headers=org.owner.headers)
    widened = await client.patch(
        path, json={"permissions": ["org:read", "members:read"]}, headers=org.owner.headers
    )

    assert renamed.status_code == 200, renamed.text
    assert renamed.json()["name"] == "Inspector"
    assert renamed.json()["permissions"] == ["org:read"]
    assert renamed.json()["id"] == role["id"]
    assert when(renamed.json()["updated_at"]) > when(role["updated_at"])
    assert widened.status_code == 200, widened.text
    assert widened.json()["name"] == "Inspector"
    assert set(widened.json()["permissions"]) == {"org:read", "members:read"}
    read = await client.get(path, headers=org.owner.headers)
    assert read.json() == widened.json()


async def test_changing_a_roles_permissions_changes_what_its_members_may_do(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    role_id = (await create_role(client, org.owner, org.id, "Auditor", ["org:read"])).json()["id"]
    auditor = await add_member(client, org.owner, org.id, role_id)
    members = f"/v1/organizations/{org.id}/members"
    assert_detail(await client.get(members, headers=auditor.headers), 403)

    response = await client.patch(
        roles_path(org.id, role_id),
        json={"permissions": ["members:read"]},
        headers=org.owner.headers,
    )

    assert response.status_code == 200, response.text
    access = await access_in(client, auditor, org.id)
    assert access["role"] == {"id": role_id, "name": "Auditor", "is_system": False}
    assert access["permissions"] == ["members:read"]
    assert (await client.get(members, headers=auditor.headers)).status_code == 200
    assert_detail(await client.get(f"/v1/organizations/{org.id}", headers=auditor.headers), 403)


async def test_renaming_a_role_to_a_taken_name_conflicts(client: AsyncTestClient) -> None:
    org = await tenant(client)
    await create_role(client, org.owner, org.id, "Auditor", [])
    role = (await create_role(client, org.owner, org.id, "Inspector", [])).json()

    taken = await client.patch(
        roles_path(org.id, role["id"]), json={"name": "Auditor"}, headers=org.owner.headers
    )
    system = await client.patch(
        roles_path(org.id, role["id"]), json={"name": "OWNER"}, headers=org.owner.headers
    )
    empty = await client.patch(
        roles_path(org.id, role["id"]), json={"name": ""}, headers=org.owner.headers
    )
    unknown = await client.patch(
        roles_path(org.id, role["id"]), json={"permissions": ["root"]}, headers=org.owner.headers
    )

    assert_detail(taken, 409)
    assert_detail(system, 409)
    assert_invalid(empty, ["body", "name"])
    assert_invalid(unknown, ["body", "permissions", "0"])
    read = await client.get(roles_path(org.id, role["id"]), headers=org.owner.headers)
    assert read.json() == role


async def test_nobody_creates_a_role_with_permissions_they_lack(client: AsyncTestClient) -> None:
    org = await tenant(client)
    manager_role = await create_role(
        client, org.owner, org.id, "Role manager", ["roles:read", "roles:write"]
    )
    manager = await add_member(client, org.owner, org.id, manager_role.json()["id"])

    escalating = await create_role(
        client, manager, org.id, "Key holder", ["roles:read", "credentials:write"]
    )
    modest = await create_role(client, manager, org.id, "Role reader", ["roles:read"])
    widened = await client.patch(
        roles_path(org.id, modest.json()["id"]),
        json={"permissions": ["org:write"]},
        headers=manager.headers,
    )
    own_role = await client.patch(
        roles_path(org.id, manager_role.json()["id"]),
        json={"permissions": ["roles:read", "roles:write", "members:write"]},
        headers=manager.headers,
    )

    assert_detail(escalating, 403)
    assert modest.status_code == 201, modest.text
    assert_detail(widened, 403)
    assert_detail(own_role, 403)
    assert "Key holder" not in await roles_names(client, org)
    assert set((await access_in(client, manager, org.id))["permissions"]) == {
        "roles:read",
        "roles:write",
    }


async def role_manager(client: AsyncTestClient, org: Tenant, permissions: list[str]) -> Caller:
    """A member whose custom role holds ``permissions``."""
    role = await create_role(client, org.owner, org.id, f"Manager {len(permissions)}", permissions)
    assert role.status_code == 201, role.text
    return await add_member(client, org.owner, org.id, role.json()["id"])


async def test_nobody_strips_or_deletes_a_role_holding_permissions_they_lack(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    manager = await role_manager(client, org, ["roles:write"])
    target = (
        await create_role(
            client, org.owner, org.id, "Key holder", ["credentials:read", "credentials:write"]
        )
    ).json()
    holder = await add_member(client, org.owner, org.id, target["id"])
    path = roles_path(org.id, target["id"])

    stripped = await client.patch(
        path, json={"permissions": ["credentials:read"]}, headers=manager.headers
    )
    emptied = await client.patch(path, json={"permissions": []}, headers=manager.headers)
    renamed = await client.patch(path, json={"name": "Nobody"}, headers=manager.headers)
    deleted = await client.delete(path, headers=manager.headers)

    for response in (stripped, emptied, renamed, deleted):
        assert_detail(response, 403)
    assert "credentials:write" in deleted.json()["detail"]
    assert (await client.get(path, headers=org.owner.headers)).json() == target
    access = await access_in(client, holder, org.id)
    assert access["role"]["id"] == target["id"]
    assert "credentials:write" in access["permissions"]


async def test_nobody_adds_or_removes_a_permission_they_lack(client: AsyncTestClient) -> None:
    org = await tenant(client)
    manager = await role_manager(client, org, ["roles:read", "roles:write", "agents:write"])
    role = (await create_role(client, manager, org.id, "Builder", ["agents:write"])).json()
    path = roles_path(org.id, role["id"])

    added = await client.patch(
        path, json={"permissions": ["agents:write", "credentials:write"]}, headers=manager.headers
    )
    swapped = await client.patch(
        path, json={"permissions": ["credentials:read"]}, headers=manager.headers
    )

    assert_detail(added, 403)
    assert "credentials:write" in added.json()["detail"]
    assert_detail(swapped, 403)
    assert (await client.get(path, headers=org.owner.headers)).json() == role


async def test_a_role_within_the_callers_permissions_can_be_changed_and_deleted(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    manager = await role_manager(
        client, org, ["roles:read", "roles:write", "agents:read", "agents:write"]
    )
    owned = (await create_role(client, org.owner, org.id, "Builder", ["agents:write"])).json()
    path = roles_path(org.id, owned["id"])

    widened = await client.patch(
        path, json={"permissions": ["agents:read", "agents:write"]}, headers=manager.headers
    )
    narrowed = await client.patch(
        path, json={"name": "Reader", "permissions": ["agents:read"]}, headers=manager.headers
    )
    deleted = await client.delete(path, headers=manager.headers)

    assert widened.status_code == 200, widened.text
    assert widened.json()["permissions"] == ["agents:read", "agents:write"]
    assert narrowed.status_code == 200, narrowed.text
    assert narrowed.json()["name"] == "Reader"
    assert narrowed.json()["permissions"] == ["agents:read"]
    assert deleted.status_code == 204, deleted.text
    assert "Reader" not in await roles_names(client, org)
    # ADMIN and OWNER hold every permission: any custom role is theirs to edit and delete.
    for caller in (org.members["ADMIN"], org.owner):
        role = (await create_role(client, org.owner, org.id, "Keys", ["credentials:write"])).json()
        path = roles_path(org.id, role["id"])
        stripped = await client.patch(path, json={"permissions": []}, headers=caller.headers)
        assert stripped.status_code == 200, stripped.text
        assert stripped.json()["permissions"] == []
        assert (await client.delete(path, headers=caller.headers)).status_code == 204


async def test_a_viewer_can_list_roles_but_not_create_them(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER", "GUEST"))
    viewer = org.members["VIEWER"]

    listing = await client.get(roles_path(org.id), headers=viewer.headers)
    one = await client.get(roles_path(org.id, org.roles["MEMBER"]), headers=viewer.headers)
    created = await create_role(client, viewer, org.id, "Viewer's own", [])
    by_guest = await client.get(roles_path(org.id), headers=org.members["GUEST"].headers)

    assert listing.status_code == 200, listing.text
    assert listing.json()["total"] == 5
    assert one.status_code == 200, one.text
    assert one.json()["name"] == "MEMBER"
    assert_detail(created, 403)
    assert_detail(by_guest, 403)
    assert "Viewer's own" not in await roles_names(client, org)


# --- deleting (spec 9) -------------------------------------------------------------------------


async def test_deleting_a_custom_role_moves_its_members_to_guest(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER",))
    role_id = (
        await create_role(client, org.owner, org.id, "Auditor", ["org:read", "members:read"])
    ).json()["id"]
    auditor = await add_member(client, org.owner, org.id, role_id)
    before = await membership(client, org, auditor.id)
    assert (
        await client.get(f"/v1/organizations/{org.id}", headers=auditor.headers)
    ).status_code == 200

    response = await client.delete(roles_path(org.id, role_id), headers=org.owner.headers)

    assert response.status_code == 204, response.text
    assert response.content == b""
    access = await access_in(client, auditor, org.id)
    assert access["role"] == {"id": org.roles["GUEST"], "name": "GUEST", "is_system": True}
    assert access["permissions"] == []
    after = await membership(client, org, auditor.id)
    assert after["id"] == before["id"]
    assert after["role_id"] == org.roles["GUEST"]
    assert_detail(await client.get(f"/v1/organizations/{org.id}", headers=auditor.headers), 403)
    assert_detail(
        await client.get(f"/v1/organizations/{org.id}/members", headers=auditor.headers), 403
    )
    # Only the deleted role's members moved.
    assert (await membership(client, org, org.members["VIEWER"].id))["role"]["name"] == "VIEWER"
    assert (await membership(client, org, org.owner.id))["role"]["name"] == "OWNER"


async def test_a_deleted_role_is_gone(client: AsyncTestClient) -> None:
    org = await tenant(client)
    role_id = (await create_role(client, org.owner, org.id, "Temporary", [])).json()["id"]

    response = await client.delete(roles_path(org.id, role_id), headers=org.owner.headers)

    assert response.status_code == 204, response.text
    assert_detail(await client.get(roles_path(org.id, role_id), headers=org.owner.headers), 404)
    assert_detail(await client.delete(roles_path(org.id, role_id), headers=org.owner.headers), 404)
    assert "Temporary" not in await roles_names(client, org)
    invite = await client.post(
        f"/v1/organizations/{org.id}/members",
        json={"email": "late@example.com", "role_id": role_id},
        headers=org.owner.headers,
    )
    assert_detail(invite, 404)
    # The name is free again.
    assert (await create_role(client, org.owner, org.id, "Temporary", [])).status_code == 201


async def test_deleting_a_role_needs_roles_write(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("MEMBER",))
    role_id = (await create_role(client, org.owner, org.id, "Auditor", [])).json()["id"]

    response = await client.delete(
        roles_path(org.id, role_id), headers=org.members["MEMBER"].headers
    )

    assert_detail(response, 403)
    assert (
        await client.get(roles_path(org.id, role_id), headers=org.owner.headers)
    ).status_code == 200


async def test_another_organizations_roles_are_not_found(client: AsyncTestClient) -> None:
    ours = await tenant(client)
    theirs = await tenant(client)
    their_role = (await create_role(client, theirs.owner, theirs.id, "Theirs", ["org:read"])).json()
    path = roles_path(ours.id, their_role["id"])

    read = await client.get(path, headers=ours.owner.headers)
    patched = await client.patch(path, json={"name": "Ours now"}, headers=ours.owner.headers)
    deleted = await client.delete(path, headers=ours.owner.headers)
    system = await client.get(
        roles_path(ours.id, theirs.roles["ADMIN"]), headers=ours.owner.headers
    )
    unknown = await client.get(roles_path(ours.id, str(uuid4())), headers=ours.owner.headers)
    across = await client.get(roles_path(theirs.id), headers=ours.owner.headers)
    malformed = await client.get(roles_path(ours.id, "admin"), headers=ours.owner.headers)

    for response in (read, patched, deleted, system, unknown, across):
        assert_detail(response, 404)
    assert_invalid(malformed, ["path", "role_id"])
    still = await client.get(roles_path(theirs.id, their_role["id"]), headers=theirs.owner.headers)
    assert still.json() == their_role
