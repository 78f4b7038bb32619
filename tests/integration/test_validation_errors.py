"""Validation errors: 422 with the spec's exact body, and nothing created by a bad request.

Body (spec §7, DESIGN §2): ``{"detail": [{"loc": [...], "msg": str, "type": str,
"input": ..., "ctx": {...}}]}`` with ``loc`` starting at ``body``, ``query`` or ``path``.
Also: authentication comes before validation, unknown routes and wrong methods answer
``{"detail": ...}``, no request answers 500 or leaks a traceback, and the paging defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from litestar import Litestar, put
from litestar.params import JSONBody
from litestar.testing import AsyncTestClient, TestClient

from api.exceptions import EXCEPTION_HANDLERS
from shared.errors import InvalidInput
from shared.outbound.schemas import CredentialPut
from tests.support.factories import (
    Tenant,
    create_token,
    register,
    single_validation_entry,
    tenant,
    unique_email,
)

ANY = object()  # the entry's value is not pinned beyond its JSON type (checked apart)


@dataclass
class Bad:
    """One bad request and the one validation entry it must answer."""

    name: str
    method: str
    path: str
    loc: list[str]
    type: str | set[str]
    input: Any
    ctx: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None


def entry_problems(bad: Bad, status: int, text: str, body: Any) -> list[str]:
    where = f"{bad.name} ({bad.method} {bad.path})"
    if status != 422:
        return [f"{where}: expected 422, got {status} {text[:300]}"]
    if not isinstance(body, dict) or set(body) != {"detail"}:
        return [f"{where}: body is not {{'detail': [...]}}: {text[:300]}"]
    entries = body["detail"]
    if not isinstance(entries, list) or len(entries) != 1:
        return [f"{where}: expected exactly one entry, got {entries!r}"]
    entry = entries[0]
    if not isinstance(entry, dict) or set(entry) != {"loc", "msg", "type", "input", "ctx"}:
        return [f"{where}: entry keys are not loc/msg/type/input/ctx: {entry!r}"]
    problems = []
    if entry["loc"] != bad.loc:
        problems.append(f"loc {entry['loc']!r} != {bad.loc!r}")
    if not isinstance(entry["msg"], str) or not entry["msg"]:
        problems.append(f"msg {entry['msg']!r} is not a message")
    types = bad.type if isinstance(bad.type, set) else {bad.type}
    if entry["type"] not in types:
        problems.append(f"type {entry['type']!r} not in {sorted(types)}")
    if bad.input is not ANY and entry["input"] != bad.input:
        problems.append(f"input {entry['input']!r} != {bad.input!r}")
    if entry["ctx"] != bad.ctx:
        problems.append(f"ctx {entry['ctx']!r} != {bad.ctx!r}")
    return [f"{where}: {p} (entry {entry!r})" for p in problems]


def no_leak(method: str, path: str, status: int, text: str) -> list[str]:
    problems = []
    if status >= 500:
        problems.append(f"{method} {path}: answered {status} {text[:300]}")
    if "Traceback" in text or 'File "' in text:
        problems.append(f"{method} {path}: leaks a traceback: {text[:300]}")
    return problems


async def send(client: AsyncTestClient, bad: Bad, headers: dict[str, str]) -> Any:
    if bad.content is not None:
        return await client.request(
            bad.method,
            bad.path,
            content=bad.content,
            headers={**headers, "Content-Type": "application/json"},
        )
    return await client.request(bad.method, bad.path, json=bad.json, headers=headers)


async def check_all(client: AsyncTestClient, bads: list[Bad], headers: dict[str, str]) -> list[str]:
    problems: list[str] = []
    for bad in bads:
        response = await send(client, bad, headers)
        problems += no_leak(bad.method, bad.path, response.status_code, response.text)
        try:
            body = response.json()
        except ValueError:
            body = None
        problems += entry_problems(bad, response.status_code, response.text, body)
    return problems


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(problems)


async def totals(client: AsyncTestClient, t: Tenant) -> dict[str, int]:
    """How many organizations, members, roles and platform tokens the owner can see."""
    counts = {}
    for key, path in {
        "organizations": "/v1/organizations",
        "members": f"/v1/organizations/{t.id}/members",
        "roles": f"/v1/orgs/{t.id}/roles",
        "tokens": f"/v1/orgs/{t.id}/platform-tokens/",
    }.items():
        response = await client.get(path, headers=t.owner.headers)
        assert response.status_code == 200, f"GET {path}: {response.text}"
        counts[key] = response.json()["total"]
    return counts


def listings(t: Tenant) -> dict[str, str]:
    return {
        "organizations": "/v1/organizations",
        "members": f"/v1/organizations/{t.id}/members",
        "roles": f"/v1/orgs/{t.id}/roles",
        "platform tokens": f"/v1/orgs/{t.id}/platform-tokens/",
    }


# --- paging --------------------------------------------------------------------------------------


async def test_paging_parameters_out_of_bounds(client: AsyncTestClient) -> None:
    t = await tenant(client)
    bads: list[Bad] = []
    for name, path in listings(t).items():
        bads += [
            Bad(f"{name} limit=0", "GET", f"{path}?limit=0", ["query", "limit"],
                "greater_than_equal", "0", {"ge": 1}),
            Bad(f"{name} limit=501", "GET", f"{path}?limit=501", ["query", "limit"],
                "less_than_equal", "501", {"le": 500}),
            Bad(f"{name} limit=-5", "GET", f"{path}?limit=-5", ["query", "limit"],
                "greater_than_equal", "-5", {"ge": 1}),
            Bad(f"{name} offset=-1", "GET", f"{path}?offset=-1", ["query", "offset"],
                "greater_than_equal", "-1", {"ge": 0}),
            Bad(f"{name} limit=abc", "GET", f"{path}?limit=abc", ["query", "limit"],
                {"int_type", "int_parsing"}, "abc"),
            Bad(f"{name} offset=1.5", "GET", f"{path}?offset=1.5", ["query", "offset"],
                {"int_type", "int_parsing"}, "1.5"),
        ]  # fmt: skip
    problems = await check_all(client, bads, t.owner.headers)
    # The bounds themselves are accepted.
    for name, path in listings(t).items():
        for query in ("limit=1", "limit=500", "offset=0", "limit=1&offset=1000"):
            response = await client.get(f"{path}?{query}", headers=t.owner.headers)
            if response.status_code != 200:
                problems.append(f"{name} ?{query}: {response.status_code} {response.text[:300]}")
    assert not problems, report(problems)


async def test_paging_defaults_limit_50_and_total_counts_everything(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    roles = f"/v1/orgs/{t.id}/roles"
    for i in range(55):
        response = await client.post(
            roles, json={"name": f"custom {i:02d}", "permissions": []}, headers=t.owner.headers
        )
        assert response.status_code == 201, response.text
    everything = await client.get(f"{roles}?limit=500", headers=t.owner.headers)
    assert everything.status_code == 200, everything.text
    all_ids = [r["id"] for r in everything.json()["roles"]]
    assert len(all_ids) == 60, f"5 system roles + 55 custom ones, listed {len(all_ids)}"
    assert everything.json()["total"] == 60

    default = await client.get(roles, headers=t.owner.headers)
    assert default.status_code == 200, default.text
    body = default.json()
    assert body["total"] == 60, f"total counts every role, not the page: {body['total']}"
    assert [r["id"] for r in body["roles"]] == all_ids[:50], "default page is the first 50"

    rest = await client.get(f"{roles}?offset=50", headers=t.owner.headers)
    assert rest.status_code == 200, rest.text
    assert [r["id"] for r in rest.json()["roles"]] == all_ids[50:]
    assert rest.json()["total"] == 60

    beyond = await client.get(f"{roles}?offset=60", headers=t.owner.headers)
    assert beyond.status_code == 200, beyond.text
    assert beyond.json() == {"roles": [], "total": 60}

    # Stable order: oldest first, the system roles (created with the organization) ahead.
    names = [r["name"] for r in everything.json()["roles"]]
    assert set(names[:5]) == {"OWNER", "ADMIN", "MEMBER", "VIEWER", "GUEST"}, names[:5]
    assert names[5:] == [f"custom {i:02d}" for i in range(55)], names[5:]


# --- path ids ------------------------------------------------------------------------------------


async def test_malformed_path_ids(client: AsyncTestClient) -> None:
    t = await tenant(client)
    token = await create_token(client, t.owner, t.id, [])
    org = t.id
    member = t.owner.id
    role = t.roles["GUEST"]
    bad_id = "not-a-uuid"

    def path_bad(name: str, method: str, path: str, key: str, json: Any = None) -> Bad:
        return Bad(name, method, path, ["path", key], "uuid_parsing", bad_id, json=json)

    bads = [
        path_bad("organization get", "GET", f"/v1/organizations/{bad_id}", "org_id"),
        path_bad(
            "organization patch", "PATCH", f"/v1/organizations/{bad_id}", "org_id", {"name": "x"}
        ),
        path_bad("organization delete", "DELETE", f"/v1/organizations/{bad_id}", "org_id"),
        path_bad("members list", "GET", f"/v1/organizations/{bad_id}/members", "org_id"),
        path_bad("roles list", "GET", f"/v1/orgs/{bad_id}/roles", "org_id"),
        path_bad("platform tokens list", "GET", f"/v1/orgs/{bad_id}/platform-tokens/", "org_id"),
        path_bad("member get", "GET", f"/v1/organizations/{org}/members/{bad_id}", "user_id"),
        path_bad(
            "member patch",
            "PATCH",
            f"/v1/organizations/{org}/members/{bad_id}",
            "user_id",
            {"role_id": role},
        ),
        path_bad("member delete", "DELETE", f"/v1/organizations/{org}/members/{bad_id}", "user_id"),
        path_bad("role get", "GET", f"/v1/orgs/{org}/roles/{bad_id}", "role_id"),
        path_bad("role patch", "PATCH", f"/v1/orgs/{org}/roles/{bad_id}", "role_id", {"name": "x"}),
        path_bad("role delete", "DELETE", f"/v1/orgs/{org}/roles/{bad_id}", "role_id"),
        path_bad(
            "platform token get", "GET", f"/v1/orgs/{org}/platform-tokens/{bad_id}", "token_id"
        ),
        path_bad(
            "platform token revoke",
            "DELETE",
            f"/v1/orgs/{org}/platform-tokens/{bad_id}",
            "token_id",
        ),
    ]
    before = await totals(client, t)
    problems = await check_all(client, bads, t.owner.headers)
    assert not problems, report(problems)
    assert await totals(client, t) == before
    # The valid ids used above still answer: the 422s came from the malformed part only.
    for path in (
        f"/v1/organizations/{org}/members/{member}",
        f"/v1/orgs/{org}/roles/{role}",
        f"/v1/orgs/{org}/platform-tokens/{token.id}",
    ):
        response = await client.get(path, headers=t.owner.headers)
        assert response.status_code == 200, f"GET {path}: {response.text}"


# --- bodies --------------------------------------------------------------------------------------


async def test_bad_bodies_answer_the_exact_entry_and_create_nothing(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    org = t.id
    orgs = "/v1/organizations"
    members = f"/v1/organizations/{org}/members"
    roles = f"/v1/orgs/{org}/roles"
    tokens = f"/v1/orgs/{org}/platform-tokens/"
    long_name = "x" * 256
    guest = t.roles["GUEST"]

    bads = [
        # organizations
        Bad("org create: missing name", "POST", orgs, ["body", "name"], "missing",
            None, json={}),
        Bad("org create: name is a number", "POST", orgs, ["body", "name"], "str_type",
            5, json={"name": 5}),
        Bad("org create: name of 256 chars", "POST", orgs, ["body", "name"],
            "string_too_long", long_name, {"max_length": 255}, json={"name": long_name}),
        Bad("org create: empty name", "POST", orgs, ["body", "name"], "string_too_short",
            "", {"min_length": 1}, json={"name": ""}),
        Bad("org create: unknown field", "POST", orgs, ["body", "owner_user_id"],
            "extra_forbidden", t.owner.id,
            json={"name": "Acme", "owner_user_id": t.owner.id}),
        Bad("org create: name is null", "POST", orgs, ["body", "name"], "str_type",
            None, json={"name": None}),
        Bad("org create: JSON array body", "POST", orgs, ["body"],
            {"object_type", "dict_type", "model_attributes_type"}, [{"name": "Acme"}],
            json=[{"name": "Acme"}]),
        Bad("org create: JSON string body", "POST", orgs, ["body"],
            {"object_type", "dict_type", "model_attributes_type"}, "Acme", json="Acme"),
        Bad("org create: malformed JSON", "POST", orgs, ["body"], "json_invalid", ANY,
            content=b'{"name": "Acme"'),
        Bad("org create: not JSON at all", "POST", orgs, ["body"], "json_invalid", ANY,
            content=b"name=Acme"),
        # roles
        Bad("role create: unknown permission", "POST", roles, ["body", "permissions", "0"],
            {"enum", "literal_error"}, "nope", json={"name": "r", "permissions": ["nope"]}),
        Bad("role create: second permission not a string", "POST", roles,
            ["body", "permissions", "1"], "str_type", 3,
            json={"name": "r", "permissions": ["org:read", 3]}),
        Bad("role create: missing permissions", "POST", roles, ["body", "permissions"],
            "missing", None, json={"name": "r"}),
        Bad("role create: name of 101 chars", "POST", roles, ["body", "name"],
            "string_too_long", "r" * 101, {"max_length": 100},
            json={"name": "r" * 101, "permissions": []}),
        Bad("role create: unknown field", "POST", roles, ["body", "is_system"],
            "extra_forbidden", True, json={"name": "r", "permissions": [], "is_system": True}),
        # members
        Bad("member invite: role_id not a uuid", "POST", members, ["body", "role_id"],
            "uuid_parsing", "zz", json={"email": unique_email(), "role_id": "zz"}),
        Bad("member invite: missing email", "POST", members, ["body", "email"], "missing",
            None, json={"role_id": guest}),
        Bad("member invite: unknown field", "POST", members, ["body", "status"],
            "extra_forbidden", "active",
            json={"email": unique_email(), "role_id": guest, "status": "active"}),
        # platform tokens
        Bad("token create: name of 256 chars", "POST", tokens, ["body", "name"],
            "string_too_long", long_name, {"max_length": 255},
            json={"name": long_name, "permissions": []}),
        Bad("token create: unknown permission", "POST", tokens,
            ["body", "permissions", "0"], {"enum", "literal_error"}, "root",
            json={"name": "ci", "permissions": ["root"]}),
        Bad("token create: unknown field", "POST", tokens, ["body", "token"],
            "extra_forbidden", "pat_mine",
            json={"name": "ci", "permissions": [], "token": "pat_mine"}),
    ]  # fmt: skip
    before = await totals(client, t)
    problems: list[str] = []
    for bad in bads:
        problems += await check_all(client, [bad], t.owner.headers)
        after = await totals(client, t)
        if after != before:
            problems.append(f"{bad.name}: listing totals changed {before} -> {after}")
            before = after
    assert not problems, report(problems)


async def test_bad_update_bodies_change_nothing(client: AsyncTestClient) -> None:
    t = await tenant(client, with_roles=("VIEWER",))
    org = f"/v1/organizations/{t.id}"
    response = await client.post(
        f"/v1/orgs/{t.id}/roles",
        json={"name": "custom", "permissions": ["org:read"]},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    role = f"/v1/orgs/{t.id}/roles/{response.json()['id']}"
    member = f"{org}/members/{t.members['VIEWER'].id}"
    bads = [
        Bad("org patch: name is a list", "PATCH", org, ["body", "name"], "str_type",
            ["x"], json={"name": ["x"]}),
        Bad("org patch: name of 256 chars", "PATCH", org, ["body", "name"],
            "string_too_long", "y" * 256, {"max_length": 255}, json={"name": "y" * 256}),
        Bad("org patch: unknown field", "PATCH", org, ["body", "owner_user_id"],
            "extra_forbidden", t.members["VIEWER"].id,
            json={"owner_user_id": t.members["VIEWER"].id}),
        Bad("role patch: unknown permission", "PATCH", role, ["body", "permissions", "0"],
            {"enum", "literal_error"}, "everything", json={"permissions": ["everything"]}),
        Bad("role patch: empty name", "PATCH", role, ["body", "name"], "string_too_short",
            "", {"min_length": 1}, json={"name": ""}),
        Bad("member patch: missing role_id", "PATCH", member, ["body", "role_id"],
            "missing", None, json={}),
        Bad("member patch: role_id not a uuid", "PATCH", member, ["body", "role_id"],
            "uuid_parsing", "OWNER", json={"role_id": "OWNER"}),
    ]  # fmt: skip
    before = {}
    for path in (org, role, member):
        response = await client.get(path, headers=t.owner.headers)
        assert response.status_code == 200, response.text
        before[path] = response.json()
    problems = await check_all(client, bads, t.owner.headers)
    for path, old in before.items():
        response = await client.get(path, headers=t.owner.headers)
        if response.json() != old:
            problems.append(f"{path} changed: {old!r} -> {response.json()!r}")
    assert not problems, report(problems)


async def test_missing_body_names_the_body(client: AsyncTestClient) -> None:
    """An empty POST body is missing as a whole: loc ["body"], not a field of the server's."""
    t = await tenant(client)
    bads = [
        Bad("org create: no body", "POST", "/v1/organizations", ["body"], "missing", None),
        Bad("role create: no body", "POST", f"/v1/orgs/{t.id}/roles", ["body"], "missing", None),
    ]
    before = await totals(client, t)
    problems = await check_all(client, bads, t.owner.headers)
    assert not problems, report(problems)
    assert await totals(client, t) == before


# --- order of checks, routing -------------------------------------------------------------------


async def test_authentication_comes_before_validation(client: AsyncTestClient) -> None:
    t = await tenant(client)
    requests = [
        ("POST", "/v1/organizations", {"name": 5}),
        ("POST", "/v1/organizations", None),
        ("POST", f"/v1/orgs/{t.id}/roles", {"name": "r", "permissions": ["nope"]}),
        ("GET", f"/v1/orgs/{t.id}/roles?limit=0", None),
        ("GET", "/v1/organizations/not-a-uuid", None),
        ("PATCH", f"/v1/orgs/{t.id}/roles/not-a-uuid", {"name": ""}),
    ]
    problems: list[str] = []
    for headers_name, headers in (
        ("no token", {}),
        ("unknown user token", {"Authorization": "Bearer ust_not-a-real-token"}),
        ("unknown platform token", {"Authorization": "Bearer pat_not-a-real-token"}),
        ("not a bearer scheme", {"Authorization": f"Basic {t.owner.token}"}),
    ):
        for method, path, body in requests:
            response = await client.request(method, path, json=body, headers=headers)
            where = f"{method} {path} with {headers_name}"
            problems += no_leak(method, path, response.status_code, response.text)
            if response.status_code != 401:
                problems.append(f"{where}: expected 401, got {response.status_code}")
            elif not isinstance(response.json().get("detail"), str):
                problems.append(f"{where}: 401 body is not {{'detail': str}}: {response.text}")
    before = await totals(client, t)
    assert before["organizations"] == 1 and before["roles"] == 5, before
    assert not problems, report(problems)


async def test_unknown_route_and_wrong_method(client: AsyncTestClient) -> None:
    t = await tenant(client)
    problems: list[str] = []
    for method, path, expected in (
        ("GET", "/v1/does-not-exist", 404),
        ("GET", f"/v1/orgs/{t.id}/nothing-here", 404),
        ("POST", "/v2/organizations", 404),
        ("PUT", f"/v1/organizations/{t.id}", 405),
        ("DELETE", "/v1/organizations", 405),
        ("POST", "/v1/auth/me", 405),
        ("PUT", f"/v1/orgs/{t.id}/roles", 405),
    ):
        for who, headers in (("owner", t.owner.headers), ("no token", {})):
            response = await client.request(method, path, headers=headers)
            where = f"{method} {path} with {who}"
            problems += no_leak(method, path, response.status_code, response.text)
            if response.status_code != expected:
                problems.append(f"{where}: expected {expected}, got {response.status_code}")
                continue
            body = response.json()
            if not (isinstance(body, dict) and set(body) == {"detail"}):
                problems.append(f"{where}: body is not {{'detail': ...}}: {response.text[:300]}")
            elif not isinstance(body["detail"], str) or not body["detail"]:
                problems.append(f"{where}: detail is not a message: {body!r}")
    assert not problems, report(problems)


# --- secret fields: never echoed -----------------------------------------------------------------

# Characters JSON, HTML and URLs each escape their own way, and some beyond ASCII.
SECRET = 'sk-"quoted"\\back/slash+plus<&>é€𝄞-7f3a'


def secret_forms(secret: str) -> set[str]:
    """``secret`` as an answer could carry it: raw, JSON-escaped in ASCII or not."""
    return {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        msgspec.json.encode(secret).decode()[1:-1],
    }


def assert_not_echoed(response: Any, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:300]}"
    for form in secret_forms(SECRET):
        assert form not in response.text, f"{what}: the secret is in the answer: {response.text}"
    assert len(response.content) < 2_000, f"{what}: the answer grows with the input"


def over(length: int) -> str:
    """The secret repeated past ``length`` characters."""
    return SECRET * (length // len(SECRET) + 1)


# What is sent as a secret field's value.
SECRET_VALUES: dict[str, Any] = {
    "NUL inside": f"{SECRET}\x00{SECRET}",
    "CR and LF inside": f"{SECRET}\r\nX-Injected: {SECRET}",
    "an array": [SECRET],
    "an object": {"value": SECRET},
}
CREDENTIAL_VALUES = {**SECRET_VALUES, "over 64 KiB": over(74_000)}
PASSWORDS = {**SECRET_VALUES, "over 128 characters": over(128)}


@pytest.mark.parametrize("kind", CREDENTIAL_VALUES)
async def test_a_refused_credential_value_is_never_echoed(
    client: AsyncTestClient, kind: str
) -> None:
    """74 KB of value used to come back in ``input``; now none of it does."""
    t = await tenant(client)
    response = await client.put(
        f"/v1/orgs/{t.id}/credentials/k",
        json={"value": CREDENTIAL_VALUES[kind]},
        headers=t.owner.headers,
    )
    assert_not_echoed(response, kind)
    entry = single_validation_entry(response)
    assert (entry["loc"], entry["input"]) == (["body", "value"], None), entry


@pytest.mark.parametrize("route", ["register", "login"])
@pytest.mark.parametrize("kind", PASSWORDS)
async def test_a_refused_password_is_never_echoed(
    client: AsyncTestClient, route: str, kind: str
) -> None:
    email = unique_email()
    if route == "login":
        await register(client, email)
    body = {"email": email, "password": PASSWORDS[kind]}
    if route == "register":
        body |= {"first_name": "A", "last_name": "B"}
    response = await client.post(f"/v1/auth/{route}", json=body)
    assert_not_echoed(response, f"{route}, {kind}")
    if kind != "CR and LF inside":  # a password may hold them
        entry = single_validation_entry(response)
        assert (entry["loc"], entry["input"]) == (["body", "password"], None), entry


WHOLE_BODIES = {
    "a JSON array": json.dumps([{"password": SECRET}]).encode(),
    "a JSON string": json.dumps(SECRET).encode(),
    "truncated JSON": f'{{"email": "a@example.com", "password": "{SECRET}'.encode(),
    "a lone surrogate": f'{{"email": "a@example.com", "password": "{SECRET}\\ud800"}}'.encode(),
    "invalid UTF-8": f'{{"email": "a@example.com", "password": "{SECRET}'.encode() + b'\xff"}',
}


@pytest.mark.parametrize("route", ["register", "login"])
@pytest.mark.parametrize("kind", WHOLE_BODIES)
async def test_a_body_holding_a_password_is_never_echoed_whole(
    client: AsyncTestClient, route: str, kind: str
) -> None:
    """Refused as a whole (``loc`` ["body"]), a body that holds a secret field is not
    echoed either: not the decoded body, not a decoder's message about it."""
    response = await client.post(
        f"/v1/auth/{route}",
        content=WHOLE_BODIES[kind],
        headers={"Content-Type": "application/json"},
    )
    assert_not_echoed(response, kind)
    entry = single_validation_entry(response)
    assert (entry["loc"], entry["input"]) == (["body"], None), entry


def test_a_service_refusing_a_secret_field_cannot_echo_it() -> None:
    """Whatever builds the 422 (here a service's InvalidInput that quotes the value in its
    message and its input), a secret field's value stays out of it."""

    @put("/credential", sync_to_thread=False)
    def refuse(data: JSONBody[CredentialPut]) -> None:
        raise InvalidInput(("body", "value"), f"refused {data.value!r}", input=data.value)

    app = Litestar([refuse], exception_handlers=EXCEPTION_HANDLERS)  # type: ignore[arg-type]
    with TestClient(app) as test_client:
        response = test_client.put("/credential", json={"value": SECRET})
    assert_not_echoed(response, "InvalidInput")
    entry = single_validation_entry(response)
    assert (entry["loc"], entry["input"]) == (["body", "value"], None), entry
