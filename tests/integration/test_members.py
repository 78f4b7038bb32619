"""Organization members: listing (spec 2), inviting by email, changing a role (spec 3),
removing; nobody becomes OWNER and nobody grants what they lack (DESIGN §3, §4)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from litestar.testing import AsyncTestClient

from shared.identity.permissions import SYSTEM_ROLES
from tests.support.design import PERMISSION_CATALOGUE
from tests.support.factories import (
    Caller,
    Tenant,
    add_member,
    create_org,
    create_token,
    member_holding,
    register,
    roles_by_name,
    tenant,
    unique_email,
)

MEMBER_FIELDS = {
    "id",
    "user_id",
    "organization_id",
    "role_id",
    "created_at",
    "role",
    "user",
    "organization",
}


def members_path(org_id: str, user_id: str | None = None) -> str:
    base = f"/v1/organizations/{org_id}/members"
    return f"{base}/{user_id}" if user_id else base


async def invite(
    client: AsyncTestClient, caller: Caller, org_id: str, role_id: str, email: str | None = None
) -> Any:
    return await client.post(
        members_path(org_id),
        json={"email": email or unique_email("invitee"), "role_id": role_id},
        headers=caller.headers,
    )


async def invited(client: AsyncTestClient, org: Tenant, role: str) -> str:
    """A member who was invited with ``role`` and never registered (a target, not a caller)."""
    response = await invite(client, org.owner, org.id, org.roles[role])
    assert response.status_code == 201, response.text
    return response.json()["user_id"]


async def set_role(
    client: AsyncTestClient, caller: Caller, org_id: str, user_id: str, role_id: str
) -> Any:
    return await client.patch(
        members_path(org_id, user_id), json={"role_id": role_id}, headers=caller.headers
    )


async def listed(client: AsyncTestClient, caller: Caller, org_id: str) -> dict[str, dict[str, Any]]:
    """The organization's members as the caller sees them, by user id."""
    response = await client.get(members_path(org_id), headers=caller.headers)
    assert response.status_code == 200, response.text
    return {m["user_id"]: m for m in response.json()["members"]}


async def access_in(client: AsyncTestClient, caller: Caller, org_id: str) -> dict[str, Any] | None:
    """The caller's role and permissions in ``org_id`` according to /v1/auth/me."""
    response = await client.get("/v1/auth/me", headers=caller.headers)
    assert response.status_code == 200, response.text
    return next((o for o in response.json()["organizations"] if o["id"] == org_id), None)


async def custom_role(
    client: AsyncTestClient, org: Tenant, name: str, permissions: list[str]
) -> str:
    response = await client.post(
        f"/v1/orgs/{org.id}/roles",
        json={"name": name, "permissions": permissions},
        headers=org.owner.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


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


# --- listing (spec 2) --------------------------------------------------------------------------


async def test_the_member_listing_describes_each_member(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER",))
    viewer = org.members["VIEWER"]

    response = await client.get(members_path(org.id), headers=org.owner.headers)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == 2
    owner_entry, viewer_entry = body["members"]
    assert set(viewer_entry) == MEMBER_FIELDS
    assert viewer_entry["user_id"] == viewer.id
    assert viewer_entry["organization_id"] == org.id
    assert viewer_entry["role_id"] == org.roles["VIEWER"]
    assert viewer_entry["role"] == {"id": org.roles["VIEWER"], "name": "VIEWER", "is_system": True}
    assert viewer_entry["user"]["id"] == viewer.id
    assert viewer_entry["user"]["email"] == viewer.email
    assert viewer_entry["user"]["status"] == "active"
    assert "password_hash" not in viewer_entry["user"]
    assert viewer_entry["organization"]["id"] == org.id
    assert viewer_entry["organization"]["name"] == org.org["name"]
    # The member's organization is the plain Organization: no role, no permissions.
    assert "role" not in viewer_entry["organization"]
    assert "permissions" not in viewer_entry["organization"]
    assert owner_entry["user_id"] == org.owner.id
    assert owner_entry["role"]["name"] == "OWNER"
    assert owner_entry["id"] != viewer_entry["id"]


async def test_the_member_listing_is_paged_in_joining_order(client: AsyncTestClient) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    roles = await roles_by_name(client, owner, org["id"])
    invited = []
    for _ in range(3):
        response = await invite(client, owner, org["id"], roles["GUEST"])
        assert response.status_code == 201, response.text
        invited.append(response.json()["user_id"])
    everyone = [owner.id, *invited]

    full = await client.get(members_path(org["id"]), headers=owner.headers)
    page = await client.get(members_path(org["id"]) + "?limit=2&offset=1", headers=owner.headers)
    past_the_end = await client.get(members_path(org["id"]) + "?offset=10", headers=owner.headers)

    assert [m["user_id"] for m in full.json()["members"]] == everyone
    assert full.json()["total"] == 4
    assert [m["user_id"] for m in page.json()["members"]] == everyone[1:3]
    assert page.json()["total"] == 4
    assert past_the_end.json() == {"members": [], "total": 4}


async def test_the_member_listing_refuses_out_of_range_paging(client: AsyncTestClient) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    path = members_path(org["id"])

    for query, loc in [
        ("limit=0", ["query", "limit"]),
        ("limit=501", ["query", "limit"]),
        ("limit=many", ["query", "limit"]),
        ("offset=-1", ["query", "offset"]),
    ]:
        assert_invalid(await client.get(f"{path}?{query}", headers=owner.headers), loc)
    largest = await client.get(f"{path}?limit=500&offset=0", headers=owner.headers)
    assert largest.status_code == 200, largest.text
    assert largest.json()["total"] == 1


async def test_listing_members_needs_members_read(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER", "GUEST"))

    by_viewer = await client.get(members_path(org.id), headers=org.members["VIEWER"].headers)
    by_guest = await client.get(members_path(org.id), headers=org.members["GUEST"].headers)

    assert by_viewer.status_code == 200, by_viewer.text
    assert by_viewer.json()["total"] == 3
    assert_detail(by_guest, 403)


async def test_members_of_another_organization_are_out_of_sight(client: AsyncTestClient) -> None:
    ours = await tenant(client)
    theirs = await tenant(client)

    listing = await client.get(members_path(theirs.id), headers=ours.owner.headers)
    their_owner_via_our_org = await client.get(
        members_path(ours.id, theirs.owner.id), headers=ours.owner.headers
    )

    assert_detail(listing, 404)
    assert_detail(their_owner_via_our_org, 404)


async def test_reading_one_member(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("MEMBER",))
    member = org.members["MEMBER"]
    entries = await listed(client, org.owner, org.id)

    response = await client.get(members_path(org.id, member.id), headers=member.headers)
    unknown = await client.get(members_path(org.id, str(uuid4())), headers=member.headers)
    malformed = await client.get(members_path(org.id, "nobody"), headers=member.headers)

    assert response.status_code == 200, response.text
    assert response.json() == entries[member.id]
    assert_detail(unknown, 404)
    assert_invalid(malformed, ["path", "user_id"])


# --- inviting ----------------------------------------------------------------------------------


async def test_inviting_an_unknown_email_creates_an_invited_user(client: AsyncTestClient) -> None:
    org = await tenant(client)
    email = unique_email("newcomer")

    response = await invite(client, org.owner, org.id, org.roles["MEMBER"], email=email.upper())

    assert response.status_code == 201, response.text
    member = response.json()
    assert set(member) == MEMBER_FIELDS
    assert member["organization_id"] == org.id
    assert member["role_id"] == org.roles["MEMBER"]
    assert member["role"]["name"] == "MEMBER"
    assert member["user"]["email"] == email
    assert member["user"]["status"] == "invited"
    assert member["user"]["invited_at"] is not None
    assert member["user_id"] == member["user"]["id"]
    # The answer the invitation wrote is what the member's reads show, to the byte.
    assert (await listed(client, org.owner, org.id))[member["user_id"]] == member
    read = await client.get(members_path(org.id, member["user_id"]), headers=org.owner.headers)
    assert read.status_code == 200, read.text
    assert read.json() == member


async def test_an_invited_user_who_registers_keeps_the_membership(client: AsyncTestClient) -> None:
    org = await tenant(client)
    email = unique_email("newcomer")
    invited = (await invite(client, org.owner, org.id, org.roles["VIEWER"], email=email)).json()

    user = await register(client, email)

    assert user.id == invited["user_id"]
    entry = (await listed(client, org.owner, org.id))[user.id]
    assert entry["id"] == invited["id"]
    assert entry["user"]["status"] == "active"
    access = await access_in(client, user, org.id)
    assert access is not None
    assert access["role"]["name"] == "VIEWER"
    assert set(access["permissions"]) == set(SYSTEM_ROLES["VIEWER"])


async def test_inviting_a_registered_user_adds_the_membership_directly(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    user = await register(client)

    response = await invite(client, org.owner, org.id, org.roles["MEMBER"], email=user.email)

    assert response.status_code == 201, response.text
    assert response.json()["user_id"] == user.id
    assert response.json()["user"]["status"] == "active"
    access = await access_in(client, user, org.id)
    assert access is not None
    assert access["role"]["name"] == "MEMBER"
    own_org = await client.get(f"/v1/organizations/{org.id}", headers=user.headers)
    assert own_org.status_code == 200, own_org.text


async def test_inviting_a_current_member_conflicts(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER",))
    pending = unique_email("pending")
    assert (
        await invite(client, org.owner, org.id, org.roles["GUEST"], email=pending)
    ).status_code == 201

    again_pending = await invite(client, org.owner, org.id, org.roles["MEMBER"], email=pending)
    again_viewer = await invite(
        client, org.owner, org.id, org.roles["MEMBER"], email=org.members["VIEWER"].email
    )
    the_owner = await invite(
        client, org.owner, org.id, org.roles["ADMIN"], email=org.owner.email.upper()
    )

    for response in (again_pending, again_viewer, the_owner):
        assert_detail(response, 409)
    roles = {
        m["user"]["email"]: m["role"]["name"]
        for m in (await listed(client, org.owner, org.id)).values()
    }
    assert roles == {
        org.owner.email: "OWNER",
        org.members["VIEWER"].email: "VIEWER",
        pending: "GUEST",
    }


async def test_nobody_is_invited_as_owner(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))

    by_owner = await invite(client, org.owner, org.id, org.roles["OWNER"])
    by_admin = await invite(client, org.members["ADMIN"], org.id, org.roles["OWNER"])

    assert_detail(by_owner, 403)
    assert_detail(by_admin, 403)
    assert len(await listed(client, org.owner, org.id)) == 2


async def test_inviting_with_another_organizations_role_is_not_found(
    client: AsyncTestClient,
) -> None:
    ours = await tenant(client)
    theirs = await tenant(client)

    foreign = await invite(client, ours.owner, ours.id, theirs.roles["MEMBER"])
    unknown = await invite(client, ours.owner, ours.id, str(uuid4()))

    assert_detail(foreign, 404)
    assert_detail(unknown, 404)
    assert list(await listed(client, ours.owner, ours.id)) == [ours.owner.id]


async def test_an_invitation_must_name_a_valid_email_and_role(client: AsyncTestClient) -> None:
    org = await tenant(client)
    path = members_path(org.id)
    headers = org.owner.headers

    bad_email = await client.post(
        path, json={"email": "not-an-email", "role_id": org.roles["MEMBER"]}, headers=headers
    )
    no_role = await client.post(path, json={"email": unique_email()}, headers=headers)
    bad_role = await client.post(
        path, json={"email": unique_email(), "role_id": "admin"}, headers=headers
    )
    extra = await client.post(
        path,
        json={"email": unique_email(), "role_id": org.roles["MEMBER"], "status": "active"},
        headers=headers,
    )

    assert_invalid(bad_email, ["body", "email"])
    assert_invalid(no_role, ["body", "role_id"])
    assert_invalid(bad_role, ["body", "role_id"])
    assert_invalid(extra, ["body", "status"])
    assert list(await listed(client, org.owner, org.id)) == [org.owner.id]


async def test_inviting_needs_members_write(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("MEMBER",))

    response = await invite(client, org.members["MEMBER"], org.id, org.roles["GUEST"])

    assert_detail(response, 403)


# --- changing a role (spec 3) ------------------------------------------------------------------


async def test_changing_a_role_keeps_the_membership_and_grants_the_new_permissions(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client, with_roles=("VIEWER",))
    viewer = org.members["VIEWER"]
    before = (await listed(client, org.owner, org.id))[viewer.id]

    response = await set_role(client, org.owner, org.id, viewer.id, org.roles["ADMIN"])

    assert response.status_code == 200, response.text
    member = response.json()
    assert member["id"] == before["id"]
    assert member["user_id"] == viewer.id
    assert member["created_at"] == before["created_at"]
    assert member["role_id"] == org.roles["ADMIN"]
    assert member["role"]["name"] == "ADMIN"
    access = await access_in(client, viewer, org.id)
    assert access is not None
    assert access["role"]["name"] == "ADMIN"
    assert set(access["permissions"]) == set(SYSTEM_ROLES["ADMIN"])
    # The new permissions take effect at once: an ADMIN may rename the organization.
    renamed = await client.patch(
        f"/v1/organizations/{org.id}", json={"name": "Renamed"}, headers=viewer.headers
    )
    assert renamed.status_code == 200, renamed.text


async def test_a_lowered_role_takes_the_permissions_away(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    admin = org.members["ADMIN"]

    response = await set_role(client, org.owner, org.id, admin.id, org.roles["GUEST"])

    assert response.status_code == 200, response.text
    access = await access_in(client, admin, org.id)
    assert access is not None
    assert access["role"]["name"] == "GUEST"
    assert access["permissions"] == []
    assert_detail(await client.get(members_path(org.id), headers=admin.headers), 403)


async def test_the_owners_role_cannot_be_changed(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))

    by_owner = await set_role(client, org.owner, org.id, org.owner.id, org.roles["ADMIN"])
    by_admin = await set_role(
        client, org.members["ADMIN"], org.id, org.owner.id, org.roles["GUEST"]
    )

    assert_detail(by_owner, 409)
    assert_detail(by_admin, 409)
    access = await access_in(client, org.owner, org.id)
    assert access is not None
    assert access["role"]["name"] == "OWNER"


async def test_nobody_is_promoted_to_owner(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    admin = org.members["ADMIN"]

    by_owner = await set_role(client, org.owner, org.id, admin.id, org.roles["OWNER"])
    by_self = await set_role(client, admin, org.id, admin.id, org.roles["OWNER"])

    assert_detail(by_owner, 403)
    assert_detail(by_self, 403)
    assert (await listed(client, org.owner, org.id))[admin.id]["role"]["name"] == "ADMIN"


async def test_changing_a_role_to_another_organizations_role_is_not_found(
    client: AsyncTestClient,
) -> None:
    ours = await tenant(client)
    theirs = await tenant(client)
    viewer = await invited(client, ours, "VIEWER")

    foreign = await set_role(client, ours.owner, ours.id, viewer, theirs.roles["ADMIN"])
    not_a_member = await set_role(client, ours.owner, ours.id, theirs.owner.id, ours.roles["GUEST"])

    assert_detail(foreign, 404)
    assert_detail(not_a_member, 404)
    assert (await listed(client, ours.owner, ours.id))[viewer]["role_id"] == ours.roles["VIEWER"]
    assert (await access_in(client, theirs.owner, ours.id)) is None


async def test_changing_a_role_needs_a_role_id(client: AsyncTestClient) -> None:
    org = await tenant(client)
    path = members_path(org.id, await invited(client, org, "VIEWER"))

    missing = await client.patch(path, json={}, headers=org.owner.headers)
    malformed = await client.patch(path, json={"role_id": "ADMIN"}, headers=org.owner.headers)

    assert_invalid(missing, ["body", "role_id"])
    assert_invalid(malformed, ["body", "role_id"])


# --- nobody grants what they lack (DESIGN §4) --------------------------------------------------


async def member_manager(client: AsyncTestClient) -> tuple[Tenant, Caller]:
    """An organization and a user whose custom role holds only members:read and members:write."""
    org = await tenant(client)
    role_id = await custom_role(client, org, "People manager", ["members:read", "members:write"])
    return org, await add_member(client, org.owner, org.id, role_id)


async def test_a_member_manager_cannot_invite_or_promote_anyone_to_admin(
    client: AsyncTestClient,
) -> None:
    org, manager = await member_manager(client)
    guest = await invited(client, org, "GUEST")

    invitation = await invite(client, manager, org.id, org.roles["ADMIN"])
    promoted = await set_role(client, manager, org.id, guest, org.roles["ADMIN"])
    promoted_self = await set_role(client, manager, org.id, manager.id, org.roles["ADMIN"])

    assert_detail(invitation, 403)
    assert_detail(promoted, 403)
    assert_detail(promoted_self, 403)
    roles = {
        user_id: m["role"]["name"]
        for user_id, m in (await listed(client, org.owner, org.id)).items()
    }
    assert roles[guest] == "GUEST"
    assert roles[manager.id] == "People manager"
    assert len(roles) == 3


async def test_a_member_manager_cannot_change_or_remove_an_admin(client: AsyncTestClient) -> None:
    org, manager = await member_manager(client)
    admin = await invited(client, org, "ADMIN")

    demoted = await set_role(client, manager, org.id, admin, org.roles["GUEST"])
    removed = await client.delete(members_path(org.id, admin), headers=manager.headers)

    assert_detail(demoted, 403)
    assert_detail(removed, 403)
    assert (await listed(client, org.owner, org.id))[admin]["role"]["name"] == "ADMIN"


async def test_a_member_manager_can_assign_roles_whose_permissions_it_holds(
    client: AsyncTestClient,
) -> None:
    org, manager = await member_manager(client)
    readers = await custom_role(client, org, "Member readers", ["members:read"])

    invitation = await invite(client, manager, org.id, readers)
    newcomer = invitation.json()["user_id"]
    lowered = await set_role(client, manager, org.id, newcomer, org.roles["GUEST"])
    raised = await set_role(client, manager, org.id, newcomer, readers)
    removed = await client.delete(members_path(org.id, newcomer), headers=manager.headers)

    assert invitation.status_code == 201, invitation.text
    assert invitation.json()["role"]["name"] == "Member readers"
    assert lowered.status_code == 200, lowered.text
    assert lowered.json()["role"]["name"] == "GUEST"
    assert raised.status_code == 200, raised.text
    assert raised.json()["role_id"] == readers
    assert removed.status_code == 204, removed.text
    assert newcomer not in await listed(client, org.owner, org.id)


# --- ADMIN takes an OWNER or ADMIN, never a set of permissions (docs/permissions.md) ------------


async def everything_but_the_role(client: AsyncTestClient, org: Tenant) -> Caller:
    """A member whose custom role holds all 24 permissions: what an ADMIN holds, not the role."""
    assert len(PERMISSION_CATALOGUE) == 24
    return await member_holding(client, org, list(PERMISSION_CATALOGUE), name="Everything")


def assert_refused_for_admin(response: Any) -> None:
    assert_detail(response, 403)
    assert "OWNER or ADMIN" in response.json()["detail"], response.text


async def test_a_custom_role_with_every_permission_cannot_make_its_member_admin(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    everything = await everything_but_the_role(client, org)

    promoted_self = await set_role(client, everything, org.id, everything.id, org.roles["ADMIN"])
    token = await client.post(
        f"/v1/orgs/{org.id}/platform-tokens/",
        json={"name": "ci", "permissions": ["org:read"]},
        headers=everything.headers,
    )

    assert_refused_for_admin(promoted_self)
    assert_detail(token, 403)
    access = await access_in(client, everything, org.id)
    assert access is not None
    assert access["role"]["name"] == "Everything"


async def test_a_custom_role_with_every_permission_cannot_invite_or_promote_an_admin(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    everything = await everything_but_the_role(client, org)
    viewer = await invited(client, org, "VIEWER")

    invitation = await invite(client, everything, org.id, org.roles["ADMIN"])
    promoted = await set_role(client, everything, org.id, viewer, org.roles["ADMIN"])
    # The refusal is the ADMIN role's alone: every other role is still theirs to give.
    member = await set_role(client, everything, org.id, viewer, org.roles["MEMBER"])

    assert_refused_for_admin(invitation)
    assert_refused_for_admin(promoted)
    assert member.status_code == 200, member.text
    roles = {m["role"]["name"] for m in (await listed(client, org.owner, org.id)).values()}
    assert roles == {"OWNER", "Everything", "MEMBER"}


async def test_a_platform_token_with_every_permission_cannot_invite_or_promote_an_admin(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    token = await create_token(client, org.owner, org.id, list(PERMISSION_CATALOGUE))
    viewer = await invited(client, org, "VIEWER")

    invitation = await invite(client, token, org.id, org.roles["ADMIN"])
    promoted = await set_role(client, token, org.id, viewer, org.roles["ADMIN"])
    member = await invite(client, token, org.id, org.roles["MEMBER"])

    assert_refused_for_admin(invitation)
    assert_refused_for_admin(promoted)
    assert member.status_code == 201, member.text
    roles = sorted(m["role"]["name"] for m in (await listed(client, org.owner, org.id)).values())
    assert roles == ["MEMBER", "OWNER", "VIEWER"]


async def test_only_an_owner_or_admin_demotes_or_removes_an_admin(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    everything = await everything_but_the_role(client, org)
    token = await create_token(client, org.owner, org.id, list(PERMISSION_CATALOGUE))
    target = await invited(client, org, "ADMIN")

    for caller in (everything, token):
        demoted = await set_role(client, caller, org.id, target, org.roles["GUEST"])
        removed = await client.delete(members_path(org.id, target), headers=caller.headers)
        assert_refused_for_admin(demoted)
        assert_refused_for_admin(removed)
    assert (await listed(client, org.owner, org.id))[target]["role"]["name"] == "ADMIN"

    demoted = await set_role(client, org.members["ADMIN"], org.id, target, org.roles["VIEWER"])
    assert demoted.status_code == 200, demoted.text
    assert demoted.json()["role"]["name"] == "VIEWER"


async def test_an_admin_or_the_owner_invites_and_promotes_admins(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    other = await tenant(client, with_roles=("ADMIN",))
    viewer = await invited(client, org, "VIEWER")

    by_admin = await invite(client, org.members["ADMIN"], org.id, org.roles["ADMIN"])
    by_owner = await invite(client, org.owner, org.id, org.roles["ADMIN"])
    promoted = await set_role(client, org.members["ADMIN"], org.id, viewer, org.roles["ADMIN"])
    # Another organization's ADMIN is nobody here.
    outsider = await invite(client, other.members["ADMIN"], org.id, org.roles["ADMIN"])

    assert by_admin.status_code == 201, by_admin.text
    assert by_owner.status_code == 201, by_owner.text
    assert promoted.status_code == 200, promoted.text
    assert_detail(outsider, 404)
    roles = sorted(m["role"]["name"] for m in (await listed(client, org.owner, org.id)).values())
    assert roles == ["ADMIN", "ADMIN", "ADMIN", "ADMIN", "OWNER"]


# --- removing ----------------------------------------------------------------------------------


async def test_a_removed_member_loses_the_organization(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("MEMBER",))
    member = org.members["MEMBER"]

    response = await client.delete(members_path(org.id, member.id), headers=org.owner.headers)

    assert response.status_code == 204, response.text
    assert response.content == b""
    assert_detail(await client.get(f"/v1/organizations/{org.id}", headers=member.headers), 404)
    assert_detail(await client.get(members_path(org.id), headers=member.headers), 404)
    assert await access_in(client, member, org.id) is None
    assert member.id not in await listed(client, org.owner, org.id)
    assert_detail(await client.get(members_path(org.id, member.id), headers=org.owner.headers), 404)
    assert_detail(
        await client.delete(members_path(org.id, member.id), headers=org.owner.headers), 404
    )


async def test_a_removed_member_can_be_invited_again(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("MEMBER",))
    member = org.members["MEMBER"]
    assert (
        await client.delete(members_path(org.id, member.id), headers=org.owner.headers)
    ).status_code == 204

    response = await invite(client, org.owner, org.id, org.roles["VIEWER"], email=member.email)

    assert response.status_code == 201, response.text
    assert response.json()["user_id"] == member.id
    access = await access_in(client, member, org.id)
    assert access is not None
    assert access["role"]["name"] == "VIEWER"


async def test_an_admin_can_remove_another_admin(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    other_admin = await invited(client, org, "ADMIN")

    response = await client.delete(
        members_path(org.id, other_admin), headers=org.members["ADMIN"].headers
    )

    assert response.status_code == 204, response.text
    assert other_admin not in await listed(client, org.owner, org.id)


async def test_the_owner_cannot_be_removed(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    path = members_path(org.id, org.owner.id)

    by_admin = await client.delete(path, headers=org.members["ADMIN"].headers)
    by_owner = await client.delete(path, headers=org.owner.headers)

    assert_detail(by_admin, 409)
    assert_detail(by_owner, 409)
    assert org.owner.id in await listed(client, org.owner, org.id)


async def test_removing_someone_who_is_not_a_member_is_not_found(client: AsyncTestClient) -> None:
    ours = await tenant(client)
    theirs = await tenant(client)

    unknown = await client.delete(members_path(ours.id, str(uuid4())), headers=ours.owner.headers)
    outsider = await client.delete(
        members_path(ours.id, theirs.owner.id), headers=ours.owner.headers
    )
    across = await client.delete(
        members_path(theirs.id, theirs.owner.id), headers=ours.owner.headers
    )

    for response in (unknown, outsider, across):
        assert_detail(response, 404)
    assert await access_in(client, theirs.owner, theirs.id) is not None


async def test_removing_needs_members_write(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("VIEWER",))
    guest = await invited(client, org, "GUEST")

    response = await client.delete(
        members_path(org.id, guest), headers=org.members["VIEWER"].headers
    )

    assert_detail(response, 403)
    assert guest in await listed(client, org.owner, org.id)
