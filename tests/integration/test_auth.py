"""Accounts and user tokens: register, login, logout, /auth/me (spec endpoint 1, spec §5,
DESIGN §2 and §4)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.app import create_app
from shared.settings import Settings
from tests.support.design import ALL_PERMISSIONS, READS
from tests.support.factories import (
    PASSWORD,
    add_member,
    create_org,
    create_token,
    register,
    roles_by_name,
    tenant,
    unique_email,
)

READ_PERMISSIONS = READS

USER_FIELDS = {
    "id",
    "email",
    "first_name",
    "last_name",
    "is_active",
    "timezone",
    "created_at",
    "updated_at",
    "status",
    "invited_at",
}


def _body(email: str | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "email": email or unique_email(),
        "password": PASSWORD,
        "first_name": "Ada",
        "last_name": "Lovelace",
        **fields,
    }


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _parse(timestamp: str) -> datetime:
    parsed = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None, f"timestamp without a time zone: {timestamp}"
    return parsed


def _only_error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and len(detail) == 1, detail
    entry = detail[0]
    assert set(entry) == {"loc", "msg", "type", "input", "ctx"}, entry
    return entry


async def _login(client: AsyncTestClient, email: str, password: str = PASSWORD) -> Any:
    return await client.post("/v1/auth/login", json={"email": email, "password": password})


# --- register ------------------------------------------------------------------------------


async def test_register_answers_201_with_user_and_bearer_token(client: AsyncTestClient) -> None:
    email = unique_email("ada")
    before = datetime.now(UTC)
    response = await client.post("/v1/auth/register", json=_body(email, timezone="Europe/Paris"))

    assert response.status_code == 201, response.text
    data = response.json()
    assert set(data) == {"user", "access_token", "token_type", "expires_at"}
    user = data["user"]
    assert set(user) == USER_FIELDS
    assert user["email"] == email
    assert user["first_name"] == "Ada"
    assert user["last_name"] == "Lovelace"
    assert user["timezone"] == "Europe/Paris"
    assert user["is_active"] is True
    assert user["status"] == "active"
    assert user["invited_at"] is None
    assert before - timedelta(seconds=5) <= _parse(user["created_at"]) <= datetime.now(UTC)
    _parse(user["updated_at"])
    assert data["access_token"].startswith("ust_")
    assert len(data["access_token"]) > 20
    assert data["token_type"] == "bearer"
    assert _parse(data["expires_at"]) > datetime.now(UTC) + timedelta(hours=1)


async def test_register_timezone_defaults_to_utc(client: AsyncTestClient) -> None:
    response = await client.post("/v1/auth/register", json=_body())

    assert response.status_code == 201, response.text
    assert response.json()["user"]["timezone"] == "UTC"


async def test_register_response_never_contains_the_password_or_a_hash(
    client: AsyncTestClient,
) -> None:
    response = await client.post("/v1/auth/register", json=_body())

    assert response.status_code == 201, response.text
    assert PASSWORD not in response.text
    assert "argon2" not in response.text
    assert "password" not in response.text


async def test_register_token_works_on_auth_me(client: AsyncTestClient) -> None:
    response = await client.post("/v1/auth/register", json=_body())
    data = response.json()

    me = await client.get("/v1/auth/me", headers=_bearer(data["access_token"]))

    assert me.status_code == 200, me.text
    assert me.json()["user"]["id"] == data["user"]["id"]
    assert me.json()["organizations"] == []


async def test_register_normalises_email_to_lower_case(client: AsyncTestClient) -> None:
    response = await client.post("/v1/auth/register", json=_body("Ada.Lovelace@Example.COM"))

    assert response.status_code == 201, response.text
    assert response.json()["user"]["email"] == "ada.lovelace@example.com"


async def test_register_same_email_twice_answers_409(client: AsyncTestClient) -> None:
    email = unique_email()
    await register(client, email)

    response = await client.post("/v1/auth/register", json=_body(email))

    assert response.status_code == 409, response.text
    assert isinstance(response.json()["detail"], str)


async def test_register_same_email_in_another_case_answers_409(client: AsyncTestClient) -> None:
    await register(client, "grace@example.com")

    response = await client.post("/v1/auth/register", json=_body("GRACE@Example.com"))

    assert response.status_code == 409, response.text
    assert set(response.json()) == {"detail"}
    assert isinstance(response.json()["detail"], str)


async def test_register_duplicate_does_not_replace_the_existing_password(
    client: AsyncTestClient,
) -> None:
    email = unique_email()
    await register(client, email)

    await client.post("/v1/auth/register", json=_body(email, password="another-password-1"))

    assert (await _login(client, email)).status_code == 200
    assert (await _login(client, email, "another-password-1")).status_code == 401


async def test_register_missing_password_answers_422(client: AsyncTestClient) -> None:
    body = _body()
    del body["password"]

    entry = _only_error(await client.post("/v1/auth/register", json=body))

    assert entry["loc"] == ["body", "password"]
    assert entry["type"] == "missing"


async def test_register_short_password_answers_422_string_too_short(
    client: AsyncTestClient,
) -> None:
    entry = _only_error(await client.post("/v1/auth/register", json=_body(password="short")))

    assert entry["loc"] == ["body", "password"]
    assert entry["type"] == "string_too_short"
    assert entry["ctx"] == {"min_length": 8}


async def test_register_password_of_exactly_8_characters_is_accepted(
    client: AsyncTestClient,
) -> None:
    response = await client.post("/v1/auth/register", json=_body(password="12345678"))

    assert response.status_code == 201, response.text


@pytest.mark.parametrize("email", ["not-an-email", "two@@example.com", "no-dot@example", "a b@c.d"])
async def test_register_malformed_email_answers_422(client: AsyncTestClient, email: str) -> None:
    entry = _only_error(await client.post("/v1/auth/register", json=_body(email)))

    assert entry["loc"] == ["body", "email"]
    assert entry["type"] == "string_pattern_mismatch"
    assert entry["input"] == email


async def test_register_unknown_field_answers_422_extra_forbidden(
    client: AsyncTestClient,
) -> None:
    entry = _only_error(await client.post("/v1/auth/register", json=_body(is_admin=True)))

    assert entry["loc"] == ["body", "is_admin"]
    assert entry["type"] == "extra_forbidden"


async def test_register_cannot_set_status_through_extra_fields(client: AsyncTestClient) -> None:
    entry = _only_error(await client.post("/v1/auth/register", json=_body(status="invited")))

    assert entry["loc"] == ["body", "status"]
    assert entry["type"] == "extra_forbidden"


async def test_register_unknown_timezone_answers_422(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    email = unique_email()

    entry = _only_error(
        await client.post("/v1/auth/register", json=_body(email, timezone="Mars/Olympus"))
    )

    assert entry["loc"] == ["body", "timezone"]
    assert entry["input"] == "Mars/Olympus"
    count = await db.scalar(text("SELECT count(*) FROM users WHERE email = :e"), {"e": email})
    assert count == 0


@pytest.mark.parametrize(
    "raw",
    [b'{"email": }', b"not json", b'{"email": "a@b.co"} trailing', b'{"email": "a@b.co", "pass'],
    ids=["invalid-character", "not-json", "trailing-characters", "truncated"],
)
async def test_register_malformed_json_answers_422_json_invalid(
    client: AsyncTestClient, raw: bytes
) -> None:
    response = await client.post(
        "/v1/auth/register", content=raw, headers={"Content-Type": "application/json"}
    )

    entry = _only_error(response)
    assert entry["loc"] == ["body"]
    assert entry["type"] == "json_invalid"


async def test_register_when_registration_is_disabled_answers_403(
    settings: Settings, db: AsyncSession
) -> None:
    closed = create_app(msgspec.structs.replace(settings, allow_registration=False))
    email = unique_email()

    async with AsyncTestClient(app=closed, base_url="http://testserver.local") as closed_client:
        response = await closed_client.post("/v1/auth/register", json=_body(email))

    assert response.status_code == 403, response.text
    assert isinstance(response.json()["detail"], str)
    count = await db.scalar(text("SELECT count(*) FROM users WHERE email = :e"), {"e": email})
    assert count == 0


# --- login -----------------------------------------------------------------------------------


async def test_login_answers_200_with_a_new_bearer_token(client: AsyncTestClient) -> None:
    user = await register(client)

    response = await _login(client, user.email)

    assert response.status_code == 200, response.text
    data = response.json()
    assert set(data) == {"access_token", "token_type", "expires_at"}
    assert data["access_token"].startswith("ust_")
    assert data["access_token"] != user.token
    assert data["token_type"] == "bearer"
    assert _parse(data["expires_at"]) > datetime.now(UTC) + timedelta(hours=1)


async def test_login_token_works_on_auth_me(client: AsyncTestClient) -> None:
    user = await register(client)
    token = (await _login(client, user.email)).json()["access_token"]

    me = await client.get("/v1/auth/me", headers=_bearer(token))

    assert me.status_code == 200, me.text
    assert me.json()["user"]["id"] == user.id


async def test_login_email_is_case_insensitive(client: AsyncTestClient) -> None:
    user = await register(client, "Mixed.Case@example.com")

    response = await _login(client, "mixed.CASE@EXAMPLE.com")

    assert response.status_code == 200, response.text
    me = await client.get("/v1/auth/me", headers=_bearer(response.json()["access_token"]))
    assert me.json()["user"]["id"] == user.id


async def test_wrong_password_and_unknown_email_answer_the_same_401(
    client: AsyncTestClient,
) -> None:
    user = await register(client)

    wrong_password = await _login(client, user.email, "not-the-password")
    unknown_email = await _login(client, unique_email("nobody"))

    assert wrong_password.status_code == 401, wrong_password.text
    assert unknown_email.status_code == 401, unknown_email.text
    assert wrong_password.json() == unknown_email.json()
    assert isinstance(wrong_password.json()["detail"], str)
    assert "access_token" not in wrong_password.text


async def test_login_missing_password_answers_422(client: AsyncTestClient) -> None:
    entry = _only_error(await client.post("/v1/auth/login", json={"email": "a@example.com"}))

    assert entry["loc"] == ["body", "password"]
    assert entry["type"] == "missing"


# --- invited users ---------------------------------------------------------------------------


async def test_invited_user_has_status_invited_and_cannot_log_in(
    client: AsyncTestClient,
) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    roles = await roles_by_name(client, owner, org["id"])
    email = unique_email("invitee")

    invite = await client.post(
        f"/v1/organizations/{org['id']}/members",
        json={"email": email, "role_id": roles["VIEWER"]},
        headers=owner.headers,
    )

    assert invite.status_code == 201, invite.text
    invited = invite.json()["user"]
    assert invited["email"] == email
    assert invited["status"] == "invited"
    assert invited["invited_at"] is not None
    _parse(invited["invited_at"])
    assert invite.json()["role"]["name"] == "VIEWER"
    for password in (PASSWORD, "anything-at-all"):
        response = await _login(client, email, password)
        assert response.status_code == 401, response.text


async def test_registering_an_invited_email_activates_it_and_keeps_the_membership(
    client: AsyncTestClient,
) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    roles = await roles_by_name(client, owner, org["id"])
    email = unique_email("invitee")
    invite = await client.post(
        f"/v1/organizations/{org['id']}/members",
        json={"email": email, "role_id": roles["MEMBER"]},
        headers=owner.headers,
    )
    invited_user_id = invite.json()["user_id"]

    response = await client.post("/v1/auth/register", json=_body(email.upper()))

    assert response.status_code == 201, response.text
    user = response.json()["user"]
    assert user["id"] == invited_user_id
    assert user["status"] == "active"
    assert user["first_name"] == "Ada"
    me = await client.get("/v1/auth/me", headers=_bearer(response.json()["access_token"]))
    assert me.status_code == 200, me.text
    [entry] = me.json()["organizations"]
    assert entry["id"] == org["id"]
    assert entry["role"] == {"id": roles["MEMBER"], "name": "MEMBER", "is_system": True}
    assert (await _login(client, email)).status_code == 200


async def test_an_activated_invitation_cannot_be_registered_again(client: AsyncTestClient) -> None:
    owner = await register(client)
    org = await create_org(client, owner)
    roles = await roles_by_name(client, owner, org["id"])
    member = await add_member(client, owner, org["id"], roles["VIEWER"])

    response = await client.post(
        "/v1/auth/register", json=_body(member.email, password="hijacked-password")
    )

    assert response.status_code == 409, response.text
    assert (await _login(client, member.email, "hijacked-password")).status_code == 401


# --- /auth/me --------------------------------------------------------------------------------


async def test_auth_me_lists_each_organization_with_role_and_permissions(
    client: AsyncTestClient,
) -> None:
    org = await tenant(client, with_roles=("VIEWER",))
    other_owner = await register(client)
    other_org = await create_org(client, other_owner, name="Other")

    owner_me = await client.get("/v1/auth/me", headers=org.owner.headers)
    viewer_me = await client.get("/v1/auth/me", headers=org.members["VIEWER"].headers)

    assert owner_me.status_code == 200, owner_me.text
    data = owner_me.json()
    assert data["user"]["id"] == org.owner.id
    assert set(data["user"]) == USER_FIELDS
    [owned] = data["organizations"]
    assert owned["id"] == org.id
    assert owned["name"] == "Acme"
    assert owned["owner_user_id"] == org.owner.id
    assert owned["role"] == {"id": org.roles["OWNER"], "name": "OWNER", "is_system": True}
    assert set(owned["permissions"]) == ALL_PERMISSIONS
    assert len(owned["permissions"]) == 24

    assert viewer_me.status_code == 200, viewer_me.text
    [viewed] = viewer_me.json()["organizations"]
    assert viewed["id"] == org.id
    assert viewed["role"] == {"id": org.roles["VIEWER"], "name": "VIEWER", "is_system": True}
    assert sorted(viewed["permissions"]) == sorted(READ_PERMISSIONS)
    assert other_org["id"] not in owner_me.text


async def test_auth_me_lists_every_organization_of_the_user(client: AsyncTestClient) -> None:
    user = await register(client)
    first = await create_org(client, user, name="First")
    second = await create_org(client, user, name="Second")

    response = await client.get("/v1/auth/me", headers=user.headers)

    assert response.status_code == 200, response.text
    organizations = response.json()["organizations"]
    assert {o["id"] for o in organizations} == {first["id"], second["id"]}
    assert all(o["role"]["name"] == "OWNER" for o in organizations)


async def test_platform_token_on_auth_me_answers_403(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read", "members:read"])

    response = await client.get("/v1/auth/me", headers=pat.headers)

    assert response.status_code == 403, response.text
    assert isinstance(response.json()["detail"], str)


async def test_auth_me_without_authorization_answers_401_with_www_authenticate(
    client: AsyncTestClient,
) -> None:
    response = await client.get("/v1/auth/me")

    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate") == "Bearer"
    assert isinstance(response.json()["detail"], str)


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer garbage",
        "Basic xyz",
        "Bearer ust_unknown",
        "Bearer pat_unknown",
        "Bearer ",
        "Bearer",
        "ust_unknown",
    ],
)
async def test_auth_me_with_an_invalid_authorization_answers_401(
    client: AsyncTestClient, authorization: str
) -> None:
    await register(client)  # a real token exists: the bad ones must not resolve to it

    response = await client.get("/v1/auth/me", headers={"Authorization": authorization})

    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate") == "Bearer"


async def test_basic_scheme_carrying_a_valid_token_answers_401(client: AsyncTestClient) -> None:
    user = await register(client)

    response = await client.get("/v1/auth/me", headers={"Authorization": f"Basic {user.token}"})

    assert response.status_code == 401, response.text


async def test_bearer_scheme_is_case_insensitive(client: AsyncTestClient) -> None:
    user = await register(client)

    response = await client.get("/v1/auth/me", headers={"Authorization": f"bearer {user.token}"})

    assert response.status_code == 200, response.text


# --- logout ----------------------------------------------------------------------------------


async def test_logout_revokes_only_the_presented_token(client: AsyncTestClient) -> None:
    user = await register(client)
    second = (await _login(client, user.email)).json()["access_token"]

    response = await client.post("/v1/auth/logout", headers=user.headers)

    assert response.status_code == 204, response.text
    assert response.content == b""
    assert (await client.get("/v1/auth/me", headers=user.headers)).status_code == 401
    still = await client.get("/v1/auth/me", headers=_bearer(second))
    assert still.status_code == 200, still.text
    assert still.json()["user"]["id"] == user.id


async def test_logout_with_a_revoked_token_answers_401(client: AsyncTestClient) -> None:
    user = await register(client)
    await client.post("/v1/auth/logout", headers=user.headers)

    response = await client.post("/v1/auth/logout", headers=user.headers)

    assert response.status_code == 401, response.text


async def test_logout_without_a_token_answers_401(client: AsyncTestClient) -> None:
    response = await client.post("/v1/auth/logout")

    assert response.status_code == 401, response.text


async def test_logout_with_a_platform_token_answers_403(client: AsyncTestClient) -> None:
    org = await tenant(client)
    pat = await create_token(client, org.owner, org.id, ["org:read"])

    response = await client.post("/v1/auth/logout", headers=pat.headers)

    assert response.status_code == 403, response.text
    assert (await client.get(f"/v1/organizations/{org.id}", headers=pat.headers)).status_code == 200


# --- token storage, expiry, deactivated accounts ---------------------------------------------


async def test_expired_user_token_answers_401(client: AsyncTestClient, db: AsyncSession) -> None:
    user = await register(client)
    assert (await client.get("/v1/auth/me", headers=user.headers)).status_code == 200

    await db.execute(
        text("UPDATE user_tokens SET expires_at = :t WHERE token_digest = :d"),
        {
            "t": datetime.now(UTC) - timedelta(seconds=1),
            "d": hashlib.sha256(user.token.encode()).hexdigest(),
        },
    )
    await db.commit()

    response = await client.get("/v1/auth/me", headers=user.headers)
    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate") == "Bearer"


async def test_user_token_expiry_in_the_database_matches_the_response(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    response = await client.post("/v1/auth/register", json=_body())
    data = response.json()

    stored = await db.scalar(
        text("SELECT expires_at FROM user_tokens WHERE token_digest = :d"),
        {"d": hashlib.sha256(data["access_token"].encode()).hexdigest()},
    )

    assert stored is not None
    assert abs(stored - _parse(data["expires_at"])) < timedelta(seconds=1)


async def test_user_tokens_are_stored_only_as_sha256_digests(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    user = await register(client)
    login_token = (await _login(client, user.email)).json()["access_token"]

    rows = (await db.execute(text("SELECT t::text AS row, token_digest FROM user_tokens t"))).all()

    assert len(rows) == 2
    digests = {row.token_digest for row in rows}
    assert digests == {
        hashlib.sha256(user.token.encode()).hexdigest(),
        hashlib.sha256(login_token.encode()).hexdigest(),
    }
    for row in rows:
        for token in (user.token, login_token):
            assert token not in row.row
            assert token.removeprefix("ust_") not in row.row


async def test_passwords_are_stored_as_argon2id_hashes(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    user = await register(client)

    row = (
        await db.execute(
            text("SELECT u::text AS row, password_hash FROM users u WHERE id = :id"),
            {"id": user.id},
        )
    ).one()

    assert row.password_hash.startswith("$argon2id$")
    assert PASSWORD not in row.row


async def test_deactivated_user_token_answers_401(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    user = await register(client)

    await db.execute(text("UPDATE users SET is_active = false WHERE id = :id"), {"id": user.id})
    await db.commit()

    response = await client.get("/v1/auth/me", headers=user.headers)
    assert response.status_code == 401, response.text


async def test_deactivated_user_cannot_log_in(client: AsyncTestClient, db: AsyncSession) -> None:
    user = await register(client)
    wrong_password = await _login(client, user.email, "not-the-password")

    await db.execute(text("UPDATE users SET is_active = false WHERE id = :id"), {"id": user.id})
    await db.commit()

    response = await _login(client, user.email)
    assert response.status_code == 401, response.text
    assert response.json() == wrong_password.json()
