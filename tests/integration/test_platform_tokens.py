"""Platform tokens: creation, listing, use, last_used_at, revocation, expiry (spec endpoint 4,
spec §5, DESIGN §4)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.factories import Caller, create_org, create_token, register, tenant

LISTING_FIELDS = {
    "id",
    "name",
    "organization_id",
    "permissions",
    "expires_at",
    "last_used_at",
    "is_active",
    "created_at",
    "updated_at",
    "token_preview",
}

# The spec writes the listing with a trailing slash; both spellings must reach it.
SLASHES = pytest.mark.parametrize("slash", ["/", ""], ids=["trailing-slash", "no-slash"])


def _tokens(org_id: str, slash: str = "/") -> str:
    return f"/v1/orgs/{org_id}/platform-tokens{slash}"


def _token(org_id: str, token_id: str) -> str:
    return f"/v1/orgs/{org_id}/platform-tokens/{token_id}"


def _preview(raw: str) -> str:
    body = raw.removeprefix("pat_")
    return f"pat_{body[:4]}…{body[-4:]}"


def _parse(timestamp: str) -> datetime:
    parsed = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None, f"timestamp without a time zone: {timestamp}"
    return parsed


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


async def _listed(client: AsyncTestClient, caller: Caller, org_id: str, token_id: str) -> Any:
    response = await client.get(_token(org_id, token_id), headers=caller.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def _last_used_at(db: AsyncSession, token_id: str) -> datetime | None:
    return await db.scalar(
        text("SELECT last_used_at FROM platform_tokens WHERE id = :id"), {"id": token_id}
    )


# --- creating --------------------------------------------------------------------------------


@SLASHES
async def test_create_answers_201_with_the_listing_fields_and_the_full_token(
    client: AsyncTestClient, slash: str
) -> None:
    org = await tenant(client)

    response = await client.post(
        _tokens(org.id, slash),
        json={"name": "deploy bot", "permissions": ["scenarios:run", "org:read"]},
        headers=org.owner.headers,
    )

    assert response.status_code == 201, response.text
    data = response.json()
    assert set(data) == LISTING_FIELDS | {"token"}
    assert data["token"].startswith("pat_")
    assert len(data["token"]) >= 40
    assert data["name"] == "deploy bot"
    assert data["organization_id"] == org.id
    assert set(data["permissions"]) == {"scenarios:run", "org:read"}
    assert data["expires_at"] is None
    assert data["last_used_at"] is None
    assert data["is_active"] is True
    assert data["token_preview"] == _preview(data["token"])
    _parse(data["created_at"])
    _parse(data["updated_at"])


async def test_each_created_token_is_different(client: AsyncTestClient) -> None:
    org = await tenant(client)

    first = await create_token(client, org.owner, org.id, ["org:read"])
    second = await create_token(client, org.owner, org.id, ["org:read"])

    assert first.token != second.token
    assert first.id != second.id


async def test_admin_can_create_a_token(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))

    response = await client.post(
        _tokens(org.id),
        json={"name": "ci", "permissions": ["members:read"]},
        headers=org.members["ADMIN"].headers,
    )

    assert response.status_code == 201, response.text
    assert response.json()["token"].startswith("pat_")


async def test_create_with_a_future_expiry_echoes_it_and_the_token_works(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    expires_at = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)

    pat = await create_token(
        client, org.owner, org.id, ["org:read"], expires_at=expires_at.isoformat()
    )

    assert _parse(pat.extra["expires_at"]) == expires_at
    response = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)
    assert response.status_code == 200, response.text


async def test_create_with_an_expiry_in_the_past_answers_422(client: AsyncTestClient) -> None:
    org = await tenant(client)
    past = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()

    response = await client.post(
        _tokens(org.id),
        json={"name": "ci", "permissions": ["org:read"], "expires_at": past},
        headers=org.owner.headers,
    )

    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert entry["loc"] == ["body", "expires_at"]
    assert set(entry) == {"loc", "msg", "type", "input", "ctx"}
    listing = await client.get(_tokens(org.id), headers=org.owner.headers)
    assert listing.json()["total"] == 0


async def test_create_with_an_unknown_permission_answers_422(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await client.post(
        _tokens(org.id),
        json={"name": "ci", "permissions": ["org:read", "everything:root"]},
        headers=org.owner.headers,
    )

    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert entry["loc"][:2] == ["body", "permissions"]
    listing = await client.get(_tokens(org.id), headers=org.owner.headers)
    assert listing.json()["total"] == 0


async def test_create_without_permissions_answers_422(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await client.post(_tokens(org.id), json={"name": "ci"}, headers=org.owner.headers)

    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert entry["loc"] == ["body", "permissions"]
    assert entry["type"] == "missing"


@pytest.mark.parametrize("role", ["MEMBER", "VIEWER"])
async def test_member_or_viewer_cannot_create_or_list_tokens(
    client: AsyncTestClient, role: str
) -> None:
    org = await tenant(client, with_roles=(role,))
    existing = await create_token(client, org.owner, org.id, ["org:read"])
    caller = org.members[role]

    created = await client.post(
        _tokens(org.id), json={"name": "mine", "permissions": []}, headers=caller.headers
    )
    listed = await client.get(_tokens(org.id), headers=caller.headers)
    one = await client.get(_token(org.id, existing.id), headers=caller.headers)
    revoked = await client.delete(_token(org.id, existing.id), headers=caller.headers)

    assert created.status_code == 403, created.text
    assert listed.status_code == 403, listed.text
    assert one.status_code == 403, one.text
    assert revoked.status_code == 403, revoked.text
    assert existing.token not in listed.text + one.text
    owner_listing = await client.get(_tokens(org.id), headers=org.owner.headers)
    assert owner_listing.json()["total"] == 1
    assert owner_listing.json()["tokens"][0]["is_active"] is True


async def test_non_member_on_the_token_endpoints_answers_404(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    stranger = await register(client)

    listed = await client.get(_tokens(org.id), headers=stranger.headers)
    created = await client.post(
        _tokens(org.id), json={"name": "x", "permissions": []}, headers=stranger.headers
    )
    revoked = await client.delete(_token(org.id, pat.id), headers=stranger.headers)

    assert listed.status_code == 404, listed.text
    assert created.status_code == 404, created.text
    assert revoked.status_code == 404, revoked.text
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 200


# --- listing and reading ---------------------------------------------------------------------


@SLASHES
async def test_listing_shows_a_preview_and_never_the_token(
    client: AsyncTestClient, slash: str
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["members:read"])

    response = await client.get(_tokens(org.id, slash), headers=org.owner.headers)

    assert response.status_code == 200, response.text
    data = response.json()
    assert set(data) == {"tokens", "total"}
    assert data["total"] == 1
    [entry] = data["tokens"]
    assert set(entry) == LISTING_FIELDS
    assert entry["id"] == pat.id
    assert entry["name"] == "ci"
    assert entry["permissions"] == ["members:read"]
    assert entry["is_active"] is True
    assert entry["token_preview"] == _preview(pat.token)
    assert re.fullmatch(r"pat_.{4}….{4}", entry["token_preview"])
    assert pat.token not in response.text
    assert pat.token.removeprefix("pat_") not in response.text


async def test_get_one_token_shows_the_listing_entry_without_the_token(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read", "roles:read"])

    response = await client.get(_token(org.id, pat.id), headers=org.owner.headers)

    assert response.status_code == 200, response.text
    data = response.json()
    assert set(data) == LISTING_FIELDS
    assert data["id"] == pat.id
    assert data["organization_id"] == org.id
    assert set(data["permissions"]) == {"org:read", "roles:read"}
    assert data["token_preview"] == _preview(pat.token)
    assert pat.token.removeprefix("pat_") not in response.text


async def test_a_token_reads_as_its_creation_answered_but_the_token(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    created = await client.post(
        _tokens(org.id),
        json={"name": "ci", "permissions": ["roles:read", "org:read"]},
        headers=org.owner.headers,
    )
    assert created.status_code == 201, created.text
    entry = {k: v for k, v in created.json().items() if k != "token"}

    read = await client.get(_token(org.id, entry["id"]), headers=org.owner.headers)
    listing = await client.get(_tokens(org.id), headers=org.owner.headers)

    assert read.status_code == 200, read.text
    assert read.json() == entry
    assert listing.status_code == 200, listing.text
    assert listing.json() == {"tokens": [entry], "total": 1}


async def test_listing_pages_with_limit_and_offset_in_creation_order(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    ids = [
        (await create_token(client, org.owner, org.id, ["org:read"], name=f"t{i}")).id
        for i in range(3)
    ]

    first = await client.get(
        _tokens(org.id), params={"limit": 2, "offset": 0}, headers=org.owner.headers
    )
    second = await client.get(
        _tokens(org.id), params={"limit": 2, "offset": 2}, headers=org.owner.headers
    )
    beyond = await client.get(
        _tokens(org.id), params={"limit": 2, "offset": 5}, headers=org.owner.headers
    )

    assert first.status_code == 200, first.text
    assert first.json()["total"] == 3
    assert [t["id"] for t in first.json()["tokens"]] == ids[:2]
    assert second.json()["total"] == 3
    assert [t["id"] for t in second.json()["tokens"]] == ids[2:]
    assert beyond.json() == {"tokens": [], "total": 3}


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 501}, ["query", "limit"]),
        ({"offset": -1}, ["query", "offset"]),
    ],
)
async def test_listing_with_paging_out_of_bounds_answers_422(
    client: AsyncTestClient, params: dict[str, int], loc: list[str]
) -> None:
    org = await tenant(client)

    response = await client.get(_tokens(org.id), params=params, headers=org.owner.headers)

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == loc


async def test_listing_shows_only_the_organizations_own_tokens(client: AsyncTestClient) -> None:
    mine = await tenant(client)
    theirs = await tenant(client)
    own = await create_token(client, mine.owner, mine.id, ["org:read"])
    other = await create_token(client, theirs.owner, theirs.id, ["org:read"])

    response = await client.get(_tokens(mine.id), headers=mine.owner.headers)

    assert response.status_code == 200, response.text
    assert [t["id"] for t in response.json()["tokens"]] == [own.id]
    assert response.json()["total"] == 1
    assert other.id not in response.text


async def test_another_organizations_token_id_answers_404(client: AsyncTestClient) -> None:
    mine = await tenant(client)
    theirs = await tenant(client)
    other = await create_token(client, theirs.owner, theirs.id, ["org:read"])

    read = await client.get(_token(mine.id, other.id), headers=mine.owner.headers)
    revoked = await client.delete(_token(mine.id, other.id), headers=mine.owner.headers)

    assert read.status_code == 404, read.text
    assert revoked.status_code == 404, revoked.text
    assert isinstance(revoked.json()["detail"], str)
    still = await client.get(f"/v1/organizations/{theirs.id}", headers=other.headers)
    assert still.status_code == 200, still.text
    assert (await _listed(client, theirs.owner, theirs.id, other.id))["is_active"] is True


async def test_unknown_token_id_answers_404(client: AsyncTestClient) -> None:
    org = await tenant(client)

    response = await client.get(
        _token(org.id, "00000000-0000-4000-8000-000000000000"), headers=org.owner.headers
    )

    assert response.status_code == 404, response.text


# --- using a token ---------------------------------------------------------------------------


async def test_token_works_inside_its_org_with_exactly_its_permissions(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["members:read"])

    members = await client.get(f"/v1/organizations/{org.id}/members", headers=pat.headers)
    create_role = await client.post(
        f"/v1/orgs/{org.id}/roles",
        json={"name": "Ops", "permissions": ["members:read"]},
        headers=pat.headers,
    )
    list_roles = await client.get(f"/v1/orgs/{org.id}/roles", headers=pat.headers)
    read_org = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)

    assert members.status_code == 200, members.text
    assert members.json()["total"] == 1
    assert members.json()["members"][0]["user_id"] == org.owner.id
    assert create_role.status_code == 403, create_role.text
    assert list_roles.status_code == 403, list_roles.text
    assert read_org.status_code == 403, read_org.text


async def test_token_on_another_organizations_path_answers_404(client: AsyncTestClient) -> None:
    org = await tenant(client)
    other_owner = await register(client)
    other_org = await create_org(client, other_owner, name="Other")
    pat = await create_token(client, org.owner, org.id, ["members:read", "org:read"])

    members = await client.get(f"/v1/organizations/{other_org['id']}/members", headers=pat.headers)
    read_org = await client.get(f"/v1/organizations/{other_org['id']}", headers=pat.headers)

    assert members.status_code == 404, members.text
    assert read_org.status_code == 404, read_org.text


async def test_token_on_auth_me_answers_403(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["members:read"])

    response = await client.get("/v1/auth/me", headers=pat.headers)

    assert response.status_code == 403, response.text


async def test_token_on_the_role_guarded_token_endpoints_answers_403(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    everything = [
        "org:read",
        "org:write",
        "members:read",
        "members:write",
        "roles:read",
        "roles:write",
    ]
    pat = await create_token(client, org.owner, org.id, everything)

    listed = await client.get(_tokens(org.id), headers=pat.headers)
    read = await client.get(_token(org.id, pat.id), headers=pat.headers)
    created = await client.post(
        _tokens(org.id), json={"name": "child", "permissions": ["org:read"]}, headers=pat.headers
    )
    revoked = await client.delete(_token(org.id, pat.id), headers=pat.headers)

    assert listed.status_code == 403, listed.text
    assert read.status_code == 403, read.text
    assert created.status_code == 403, created.text
    assert revoked.status_code == 403, revoked.text
    assert (await _listed(client, org.owner, org.id, pat.id))["is_active"] is True
    total = (await client.get(_tokens(org.id), headers=org.owner.headers)).json()["total"]
    assert total == 1


async def test_token_cannot_create_an_organization(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read", "org:write"])

    response = await client.post("/v1/organizations", json={"name": "Sneaky"}, headers=pat.headers)

    assert response.status_code == 403, response.text
    listing = await client.get("/v1/organizations", headers=org.owner.headers)
    assert [o["name"] for o in listing.json()["organizations"]] == ["Acme"]


async def test_token_cannot_delete_its_organization(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read", "org:write"])

    response = await client.delete(f"/v1/organizations/{org.id}", headers=pat.headers)

    assert response.status_code == 403, response.text
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 200


async def test_token_without_org_write_cannot_rename_its_organization(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])

    response = await client.patch(
        f"/v1/organizations/{org.id}", json={"name": "Renamed"}, headers=pat.headers
    )

    assert response.status_code == 403, response.text
    read = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)
    assert read.json()["name"] == "Acme"


# --- last_used_at ----------------------------------------------------------------------------


async def test_last_used_at_is_null_until_first_use_then_set(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    assert (await _listed(client, org.owner, org.id, pat.id))["last_used_at"] is None

    before = datetime.now(UTC)
    response = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)

    assert response.status_code == 200, response.text
    last_used = (await _listed(client, org.owner, org.id, pat.id))["last_used_at"]
    assert last_used is not None
    assert before - timedelta(seconds=2) <= _parse(last_used) <= datetime.now(UTC)


async def test_last_used_at_is_not_rewritten_within_a_minute(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)
    first = (await _listed(client, org.owner, org.id, pat.id))["last_used_at"]

    response = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)

    assert response.status_code == 200, response.text
    assert (await _listed(client, org.owner, org.id, pat.id))["last_used_at"] == first


async def test_last_used_at_is_rewritten_once_older_than_a_minute(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)
    stale = datetime.now(UTC) - timedelta(minutes=2)
    await db.execute(
        text("UPDATE platform_tokens SET last_used_at = :t WHERE id = :id"),
        {"t": stale, "id": pat.id},
    )
    await db.commit()

    before = datetime.now(UTC)
    response = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)

    assert response.status_code == 200, response.text
    stored = await _last_used_at(db, pat.id)
    assert stored is not None
    assert stored >= before - timedelta(seconds=2)
    listed = (await _listed(client, org.owner, org.id, pat.id))["last_used_at"]
    assert _parse(listed) == stored


async def test_last_used_at_just_under_a_minute_old_is_kept(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    recent = datetime.now(UTC) - timedelta(seconds=50)
    await db.execute(
        text("UPDATE platform_tokens SET last_used_at = :t WHERE id = :id"),
        {"t": recent, "id": pat.id},
    )
    await db.commit()

    response = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)

    assert response.status_code == 200, response.text
    assert await _last_used_at(db, pat.id) == recent


# --- revoking --------------------------------------------------------------------------------


async def test_revoked_platform_token_answers_401(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 200

    response = await client.delete(_token(org.id, pat.id), headers=org.owner.headers)

    assert response.status_code == 204, response.text
    assert response.content == b""
    after = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)
    assert after.status_code == 401, after.text
    assert after.headers.get("www-authenticate") == "Bearer"


async def test_revoked_token_stays_listed_as_inactive(client: AsyncTestClient) -> None:
    org = await tenant(client)
    revoked = await create_token(client, org.owner, org.id, ["org:read"], name="old")
    kept = await create_token(client, org.owner, org.id, ["org:read"], name="new")

    await client.delete(_token(org.id, revoked.id), headers=org.owner.headers)

    listing = await client.get(_tokens(org.id), headers=org.owner.headers)
    assert listing.json()["total"] == 2
    active = {t["id"]: t["is_active"] for t in listing.json()["tokens"]}
    assert active == {revoked.id: False, kept.id: True}
    assert (
        await client.get(f"/v1/organizations/{org.id}", headers=kept.headers)
    ).status_code == 200


async def test_revoking_twice_answers_204(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])

    first = await client.delete(_token(org.id, pat.id), headers=org.owner.headers)
    second = await client.delete(_token(org.id, pat.id), headers=org.owner.headers)

    assert first.status_code == 204, first.text
    assert second.status_code == 204, second.text
    assert (await _listed(client, org.owner, org.id, pat.id))["is_active"] is False
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 401


async def test_admin_can_revoke_a_token_the_owner_created(client: AsyncTestClient) -> None:
    org = await tenant(client, with_roles=("ADMIN",))
    pat = await create_token(client, org.owner, org.id, ["org:read"])

    response = await client.delete(_token(org.id, pat.id), headers=org.members["ADMIN"].headers)

    assert response.status_code == 204, response.text
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 401


# --- expiry and storage ----------------------------------------------------------------------


async def test_platform_token_past_its_expiry_answers_401(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    org = await tenant(client)
    expires_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    pat = await create_token(client, org.owner, org.id, ["org:read"], expires_at=expires_at)
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 200

    await db.execute(
        text("UPDATE platform_tokens SET expires_at = :t WHERE id = :id"),
        {"t": datetime.now(UTC) - timedelta(seconds=1), "id": pat.id},
    )
    await db.commit()

    response = await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)
    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate") == "Bearer"


async def test_unknown_platform_token_answers_401(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])
    forged = pat.token[:-1] + ("A" if pat.token[-1] != "A" else "B")

    response = await client.get(
        f"/v1/organizations/{org.id}", headers={"Authorization": f"Bearer {forged}"}
    )

    assert response.status_code == 401, response.text


async def test_database_row_holds_only_the_digest_and_preview(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])

    row = (
        await db.execute(
            text(
                "SELECT p::text AS row, token_digest, token_preview, created_by_user_id"
                " FROM platform_tokens p WHERE id = :id"
            ),
            {"id": pat.id},
        )
    ).one()

    assert row.token_digest == _digest(pat.token)
    assert re.fullmatch(r"[0-9a-f]{64}", row.token_digest)
    assert row.token_preview == _preview(pat.token)
    assert str(row.created_by_user_id) == org.owner.id
    assert pat.token not in row.row
    assert pat.token.removeprefix("pat_") not in row.row
