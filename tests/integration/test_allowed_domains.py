"""Allowed domains (spec 5-7, DESIGN §3 PATCH/DELETE, §5.1 egress allow-list).

An entry is a host name, an IP address or ``*.suffix`` (normalised to lower case, without
a trailing dot, IPv6 without brackets), with extra headers and query parameters whose
values may reference credentials as ``{{credentials.KEY}}``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.factories import Tenant, single_validation_entry, tenant

DOMAIN_FIELDS = {"id", "organization_id", "domain", "headers", "query_params"}
DOMAIN_FIELDS |= {"created_at", "updated_at"}


def domains_path(t: Tenant, *, slash: bool = True) -> str:
    return f"/v1/orgs/{t.id}/allowed-domains" + ("/" if slash else "")


async def create(client: AsyncTestClient, t: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(domains_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    return response.json()


async def put_credential(client: AsyncTestClient, t: Tenant, key: str) -> None:
    response = await client.put(
        f"/v1/orgs/{t.id}/credentials/{key}", json={"value": "v"}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text


def parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None, f"timestamp without zone: {value}"
    return parsed


async def count_rows(db: AsyncSession) -> int:
    return int(await db.scalar(text("SELECT count(*) FROM allowed_domains")) or 0)


# --- create / read ------------------------------------------------------------------------------


async def test_create_returns_the_entry_and_get_reads_it_back(client: AsyncTestClient) -> None:
    t = await tenant(client)
    body = {
        "domain": "API.Example.COM.",
        "headers": {"X-Api-Version": "2024-01-01"},
        "query_params": {"region": "eu"},
    }
    response = await client.post(domains_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created) == DOMAIN_FIELDS
    uuid.UUID(created["id"])
    assert created["organization_id"] == t.id
    assert created["domain"] == "api.example.com"
    assert created["headers"] == {"X-Api-Version": "2024-01-01"}
    assert created["query_params"] == {"region": "eu"}
    assert parse_time(created["created_at"]) <= parse_time(created["updated_at"])

    response = await client.get(f"{domains_path(t)}{created['id']}", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json() == created


async def test_headers_and_query_params_default_to_empty(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create(client, t, {"domain": "example.org"})
    assert created["headers"] == {}
    assert created["query_params"] == {}


async def test_routes_answer_with_and_without_trailing_slash(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.post(
        domains_path(t, slash=False), json={"domain": "one.example.com"}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    response = await client.post(
        domains_path(t, slash=True), json={"domain": "two.example.com"}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    for slash in (False, True):
        response = await client.get(domains_path(t, slash=slash), headers=t.owner.headers)
        assert response.status_code == 200, response.text
        listing = response.json()
        assert listing["total"] == 2
        assert [d["domain"] for d in listing["domains"]] == ["one.example.com", "two.example.com"]


ACCEPTED = [
    ("api.example.com", "api.example.com"),
    ("*.example.com", "*.example.com"),
    ("*.Example.Com.", "*.example.com"),
    ("localhost", "localhost"),
    ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("10.0.0.1", "10.0.0.1"),
    ("::1", "::1"),
    ("[::1]", "::1"),
    ("2001:DB8::1", "2001:db8::1"),
    ("a" * 63 + ".com", "a" * 63 + ".com"),
]

# (input, expected error type or None when only the location is pinned)
REJECTED: list[tuple[str, str | None]] = [
    ("", "string_too_short"),
    ("a" * 256, "string_too_long"),
    ("https://a.com", None),
    ("a.com/path", None),
    ("a.com:8080", None),
    ("user@a.com", None),
    ("*.com", None),
    ("*", None),
    ("a.*.com", None),
    ("*.*.example.com", None),
    ("-bad.com", None),
    ("bad-.com", None),
    ("exa mple.com", None),
    ("a..com", None),
    (".", None),
    ("a.com?x=1", None),
    ("a" * 64 + ".com", None),
]


async def test_accepted_domains_are_normalised(client: AsyncTestClient) -> None:
    t = await tenant(client)
    problems = []
    for raw, stored in ACCEPTED:
        response = await client.post(domains_path(t), json={"domain": raw}, headers=t.owner.headers)
        if response.status_code != 201:
            problems.append(f"{raw!r}: {response.status_code} {response.text[:200]}")
            continue
        created = response.json()
        fetched = await client.get(f"{domains_path(t)}{created['id']}", headers=t.owner.headers)
        if created["domain"] != stored or fetched.json()["domain"] != stored:
            problems.append(f"{raw!r}: stored {created['domain']!r}, expected {stored!r}")
        # Free the name: some inputs normalise to the same entry.
        deleted = await client.delete(f"{domains_path(t)}{created['id']}", headers=t.owner.headers)
        assert deleted.status_code == 204, deleted.text
    assert not problems, "\n".join(problems)


async def test_invalid_domains_are_422_on_body_domain(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    problems = []
    for raw, error_type in REJECTED:
        response = await client.post(domains_path(t), json={"domain": raw}, headers=t.owner.headers)
        where = f"{raw[:40]!r}"
        if response.status_code != 422:
            problems.append(f"{where}: expected 422, got {response.status_code} {response.text}")
            continue
        entry = single_validation_entry(response)
        if entry["loc"] != ["body", "domain"]:
            problems.append(f"{where}: loc {entry['loc']}")
        if error_type is not None and entry["type"] != error_type:
            problems.append(f"{where}: type {entry['type']!r}, expected {error_type!r}")
    assert not problems, "\n".join(problems)
    assert await count_rows(db) == 0


async def test_missing_domain_is_422(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.post(domains_path(t), json={"headers": {}}, headers=t.owner.headers)
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "domain"]
    assert entry["type"] == "missing"


async def test_unknown_field_is_refused(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.post(
        domains_path(t),
        json={"domain": "a.example.com", "organization_id": str(uuid.uuid4())},
        headers=t.owner.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "organization_id"]


# --- headers and query parameters ----------------------------------------------------------------


async def test_invalid_header_name_is_422_located_at_the_header(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    response = await client.post(
        domains_path(t),
        json={"domain": "a.example.com", "headers": {"Bad Header": "x"}},
        headers=t.owner.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "headers", "Bad Header"]
    for bad_name in ("X:Colon", "Ünicode", "X\tTab"):
        response = await client.post(
            domains_path(t),
            json={"domain": "a.example.com", "headers": {bad_name: "x"}},
            headers=t.owner.headers,
        )
        assert response.status_code == 422, f"{bad_name!r}: {response.text}"
    assert await count_rows(db) == 0


async def test_line_breaks_in_values_are_422(client: AsyncTestClient, db: AsyncSession) -> None:
    t = await tenant(client)
    for value in ("a\r\nX-Injected: 1", "a\nb", "a\rb"):
        response = await client.post(
            domains_path(t),
            json={"domain": "a.example.com", "headers": {"X-Token": value}},
            headers=t.owner.headers,
        )
        entry = single_validation_entry(response)
        assert entry["loc"] == ["body", "headers", "X-Token"], repr(value)
        response = await client.post(
            domains_path(t),
            json={"domain": "a.example.com", "query_params": {"token": value}},
            headers=t.owner.headers,
        )
        entry = single_validation_entry(response)
        assert entry["loc"] == ["body", "query_params", "token"], repr(value)
    assert await count_rows(db) == 0


async def test_query_param_names_need_not_be_header_tokens(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create(
        client, t, {"domain": "a.example.com", "query_params": {"filter[name]": "x y"}}
    )
    assert created["query_params"] == {"filter[name]": "x y"}


async def test_reference_to_a_missing_credential_is_422(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    response = await client.post(
        domains_path(t),
        json={
            "domain": "a.example.com",
            "headers": {"Authorization": "Bearer {{credentials.missing}}"},
        },
        headers=t.owner.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"][:2] == ["body", "headers"]
    assert "missing" in entry["msg"]
    response = await client.post(
        domains_path(t),
        json={"domain": "a.example.com", "query_params": {"key": "{{ credentials.missing }}"}},
        headers=t.owner.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"][:2] == ["body", "query_params"]
    assert await count_rows(db) == 0


async def test_reference_to_an_existing_credential_is_accepted_and_kept_verbatim(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    await put_credential(client, t, "api_key")
    body = {
        "domain": "a.example.com",
        "headers": {"Authorization": "Bearer {{credentials.api_key}}"},
        "query_params": {"key": "{{ credentials.api_key }}"},
    }
    created = await create(client, t, body)
    # The reference is stored, never the value it resolves to.
    assert created["headers"] == body["headers"]
    assert created["query_params"] == body["query_params"]


async def test_a_credential_of_another_organization_does_not_satisfy_a_reference(
    client: AsyncTestClient,
) -> None:
    a = await tenant(client)
    b = await tenant(client)
    await put_credential(client, b, "shared_name")
    response = await client.post(
        domains_path(a),
        json={"domain": "a.example.com", "headers": {"X-Key": "{{credentials.shared_name}}"}},
        headers=a.owner.headers,
    )
    assert single_validation_entry(response)["loc"][:2] == ["body", "headers"]


# --- listing ------------------------------------------------------------------------------------


async def test_list_pages_with_limit_and_offset_in_creation_order(client: AsyncTestClient) -> None:
    t = await tenant(client)
    names = [f"host{i}.example.com" for i in range(5)]
    for name in names:
        await create(client, t, {"domain": name})

    async def page(query: str) -> dict[str, Any]:
        response = await client.get(f"{domains_path(t)}?{query}", headers=t.owner.headers)
        assert response.status_code == 200, response.text
        return response.json()

    full = await page("")
    assert set(full) == {"domains", "total"}
    assert full["total"] == 5
    assert [d["domain"] for d in full["domains"]] == names
    assert all(set(d) == DOMAIN_FIELDS for d in full["domains"])

    second = await page("limit=2&offset=2")
    assert second["total"] == 5
    assert [d["domain"] for d in second["domains"]] == names[2:4]
    last = await page("limit=2&offset=4")
    assert [d["domain"] for d in last["domains"]] == names[4:]
    beyond = await page("limit=2&offset=10")
    assert beyond == {"domains": [], "total": 5}

    for query, loc in (
        ("limit=0", ["query", "limit"]),
        ("limit=501", ["query", "limit"]),
        ("offset=-1", ["query", "offset"]),
    ):
        response = await client.get(f"{domains_path(t)}?{query}", headers=t.owner.headers)
        assert single_validation_entry(response)["loc"] == loc, query


async def test_list_shows_only_the_organizations_own_entries(client: AsyncTestClient) -> None:
    a = await tenant(client)
    b = await tenant(client)
    await create(client, a, {"domain": "a.example.com"})
    await create(client, b, {"domain": "b.example.com"})
    response = await client.get(domains_path(a), headers=a.owner.headers)
    assert [d["domain"] for d in response.json()["domains"]] == ["a.example.com"]
    assert response.json()["total"] == 1


# --- update -------------------------------------------------------------------------------------


async def test_patch_changes_only_the_fields_sent(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create(
        client,
        t,
        {"domain": "a.example.com", "headers": {"X-A": "1"}, "query_params": {"q": "1"}},
    )
    path = f"{domains_path(t)}{created['id']}"

    response = await client.patch(path, json={"headers": {"X-B": "2"}}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["headers"] == {"X-B": "2"}
    assert updated["query_params"] == {"q": "1"}
    assert updated["domain"] == "a.example.com"
    assert updated["id"] == created["id"]
    assert updated["created_at"] == created["created_at"]
    assert parse_time(updated["updated_at"]) > parse_time(created["updated_at"])

    response = await client.patch(path, json={"domain": "B.Example.com."}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json()["domain"] == "b.example.com"
    assert response.json()["headers"] == {"X-B": "2"}

    response = await client.patch(path, json={"query_params": {}}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json()["query_params"] == {}

    response = await client.patch(path, json={}, headers=t.owner.headers)
    assert response.status_code == 200, response.text

    response = await client.get(path, headers=t.owner.headers)
    got = response.json()
    assert (got["domain"], got["headers"], got["query_params"]) == (
        "b.example.com",
        {"X-B": "2"},
        {},
    )


async def test_patch_validates_like_create_and_leaves_the_entry_untouched(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    created = await create(client, t, {"domain": "a.example.com", "headers": {"X-A": "1"}})
    path = f"{domains_path(t)}{created['id']}"
    cases = [
        ({"domain": "https://a.example.com"}, ["body", "domain"]),
        ({"domain": ""}, ["body", "domain"]),
        ({"headers": {"Bad Header": "x"}}, ["body", "headers", "Bad Header"]),
        ({"headers": {"X-A": "a\r\nb"}}, ["body", "headers", "X-A"]),
        ({"domain": "b.example.com", "headers": {"X-K": "{{credentials.nope}}"}}, None),
    ]
    for body, loc in cases:
        response = await client.patch(path, json=body, headers=t.owner.headers)
        entry = single_validation_entry(response)
        if loc is not None:
            assert entry["loc"] == loc, body
    response = await client.get(path, headers=t.owner.headers)
    assert response.json() == created


async def test_patch_onto_an_existing_domain_is_409(client: AsyncTestClient) -> None:
    t = await tenant(client)
    await create(client, t, {"domain": "a.example.com"})
    other = await create(client, t, {"domain": "b.example.com"})
    path = f"{domains_path(t)}{other['id']}"
    response = await client.patch(path, json={"domain": "A.EXAMPLE.COM"}, headers=t.owner.headers)
    assert response.status_code == 409, response.text
    assert isinstance(response.json()["detail"], str)
    response = await client.get(path, headers=t.owner.headers)
    assert response.json()["domain"] == "b.example.com"


# --- duplicates, delete, missing ----------------------------------------------------------------


async def test_duplicate_domain_is_409_even_when_spelled_differently(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    await create(client, t, {"domain": "api.example.com"})
    for spelling in ("api.example.com", "API.Example.com", "api.example.com."):
        response = await client.post(
            domains_path(t), json={"domain": spelling}, headers=t.owner.headers
        )
        assert response.status_code == 409, f"{spelling}: {response.text}"
        assert "api.example.com" in response.json()["detail"]
    assert await count_rows(db) == 1
    # The same domain in another organization is fine.
    other = await tenant(client)
    await create(client, other, {"domain": "api.example.com"})


async def test_delete_is_204_then_404(client: AsyncTestClient, db: AsyncSession) -> None:
    t = await tenant(client)
    keep = await create(client, t, {"domain": "keep.example.com"})
    gone = await create(client, t, {"domain": "gone.example.com"})
    path = f"{domains_path(t)}{gone['id']}"
    response = await client.delete(path, headers=t.owner.headers)
    assert response.status_code == 204, response.text
    assert response.content == b""
    for method in ("GET", "DELETE"):
        response = await client.request(method, path, headers=t.owner.headers)
        assert response.status_code == 404, f"{method}: {response.text}"
        assert isinstance(response.json()["detail"], str)
    response = await client.patch(path, json={"domain": "x.example.com"}, headers=t.owner.headers)
    assert response.status_code == 404, response.text
    assert await count_rows(db) == 1
    listing = (await client.get(domains_path(t), headers=t.owner.headers)).json()
    assert [d["id"] for d in listing["domains"]] == [keep["id"]]
    # The name is free again.
    await create(client, t, {"domain": "gone.example.com"})


async def test_unknown_and_malformed_ids(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.get(f"{domains_path(t)}{uuid.uuid4()}", headers=t.owner.headers)
    assert response.status_code == 404, response.text
    response = await client.get(f"{domains_path(t)}not-a-uuid", headers=t.owner.headers)
    assert single_validation_entry(response)["loc"] == ["path", "domain_id"]


async def test_raw_row_holds_the_normalised_domain(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    created = await create(client, t, {"domain": "*.Example.NET.", "headers": {"X-A": "1"}})
    row = (
        await db.execute(
            text("SELECT organization_id, domain, headers FROM allowed_domains WHERE id = :id"),
            {"id": uuid.UUID(created["id"])},
        )
    ).one()
    assert str(row.organization_id) == t.id
    assert row.domain == "*.example.net"
    assert row.headers == {"X-A": "1"}
