"""Credentials (DESIGN §3, §5.1; spec 8 usage).

``PUT /v1/orgs/{org_id}/credentials/{key}`` creates (201) or replaces (200); the value is
write-only, encrypted at rest, and never appears in any answer.  The usage operation
lists exactly the providers whose ``credential_key`` is the key and the domains whose
header or query values hold ``{{credentials.KEY}}``; a referenced credential cannot be
deleted (409 naming the references).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.crypto import secret_box
from shared.settings import Settings
from tests.support.factories import Tenant, tenant

SECRET = "sk-test-4f9c1e7b-THE-PLAINTEXT"
OTHER_SECRET = "sk-test-0000-REPLACEMENT-VALUE"
CREDENTIAL_FIELDS = {"key", "description", "created_at", "updated_at"}


def credentials_path(t: Tenant, key: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/credentials"
    return base if key is None else f"{base}/{key}"


async def put(
    client: AsyncTestClient, t: Tenant, key: str, value: str = SECRET, description: str = ""
) -> Any:
    return await client.put(
        credentials_path(t, key),
        json={"value": value, "description": description},
        headers=t.owner.headers,
    )


async def put_ok(client: AsyncTestClient, t: Tenant, key: str, value: str = SECRET) -> None:
    response = await put(client, t, key, value)
    assert response.status_code in (200, 201), response.text


async def create_provider(
    client: AsyncTestClient, t: Tenant, name: str, credential_key: str | None
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/orgs/{t.id}/llm-providers",
        json={
            "name": name,
            "provider": "openai",
            "default_model": "gpt-4o-mini",
            "credential_key": credential_key,
        },
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


async def create_domain(
    client: AsyncTestClient,
    t: Tenant,
    domain: str,
    headers: dict[str, str] | None = None,
    query_params: dict[str, str] | None = None,
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/orgs/{t.id}/allowed-domains/",
        json={"domain": domain, "headers": headers or {}, "query_params": query_params or {}},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def single_error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    entries = response.json()["detail"]
    assert isinstance(entries, list) and len(entries) == 1, entries
    entry = entries[0]
    assert set(entry) == {"loc", "msg", "type", "input", "ctx"}, entry
    return entry


async def ciphertext_of(db: AsyncSession, org_id: str, key: str) -> str:
    value = await db.scalar(
        text("SELECT ciphertext FROM credentials WHERE organization_id = :org AND key = :key"),
        {"org": uuid.UUID(org_id), "key": key},
    )
    assert value is not None, f"no row for credential {key}"
    await db.commit()  # end the read transaction so the next read sees later commits
    return value


async def count_credentials(db: AsyncSession) -> int:
    value = int(await db.scalar(text("SELECT count(*) FROM credentials")) or 0)
    await db.commit()
    return value


# --- put and list -------------------------------------------------------------------------------


async def test_put_creates_201_then_replaces_200_without_ever_showing_the_value(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    response = await put(client, t, "openai_key", SECRET, "the OpenAI key")
    assert response.status_code == 201, response.text
    assert SECRET not in response.text
    created = response.json()
    assert set(created) == CREDENTIAL_FIELDS
    assert created["key"] == "openai_key"
    assert created["description"] == "the OpenAI key"

    response = await put(client, t, "openai_key", OTHER_SECRET, "rotated")
    assert response.status_code == 200, response.text
    assert OTHER_SECRET not in response.text and SECRET not in response.text
    replaced = response.json()
    assert set(replaced) == CREDENTIAL_FIELDS
    assert replaced["key"] == "openai_key"
    assert replaced["description"] == "rotated"
    assert replaced["created_at"] == created["created_at"]
    assert parse_time(replaced["updated_at"]) > parse_time(created["updated_at"])

    response = await client.get(credentials_path(t), headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert SECRET not in response.text and OTHER_SECRET not in response.text
    listing = response.json()
    assert listing == {"credentials": [replaced], "total": 1}


async def test_a_new_credential_is_not_updated_before_it_was_created(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    """created_at <= updated_at, in the answer and in the row (as for every other resource)."""
    t = await tenant(client)
    created = (await put(client, t, "k")).json()
    assert parse_time(created["created_at"]) <= parse_time(created["updated_at"]), created
    row = (
        await db.execute(text("SELECT created_at, updated_at FROM credentials WHERE key = 'k'"))
    ).one()
    await db.commit()
    assert row.created_at <= row.updated_at, row


async def test_description_is_optional_and_defaults_to_empty(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.put(
        credentials_path(t, "k"), json={"value": SECRET}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    assert response.json()["description"] == ""


async def test_listing_pages_and_never_contains_values(client: AsyncTestClient) -> None:
    t = await tenant(client)
    keys = ["alpha", "beta.key", "gamma-key", "DELTA_1"]
    for i, key in enumerate(keys):
        await put_ok(client, t, key, f"{SECRET}-{i}")
    response = await client.get(credentials_path(t), headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert SECRET not in response.text
    listing = response.json()
    assert set(listing) == {"credentials", "total"}
    assert listing["total"] == 4
    assert [c["key"] for c in listing["credentials"]] == keys
    assert all(set(c) == CREDENTIAL_FIELDS for c in listing["credentials"])

    response = await client.get(f"{credentials_path(t)}?limit=2&offset=1", headers=t.owner.headers)
    page = response.json()
    assert page["total"] == 4
    assert [c["key"] for c in page["credentials"]] == keys[1:3]
    # With a trailing slash too.
    response = await client.get(f"{credentials_path(t)}/", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json()["total"] == 4


async def test_listing_is_per_organization(client: AsyncTestClient) -> None:
    a = await tenant(client)
    b = await tenant(client)
    await put_ok(client, a, "same_key", "value-of-a")
    await put_ok(client, b, "same_key", "value-of-b")
    await put_ok(client, b, "only_b")
    response = await client.get(credentials_path(a), headers=a.owner.headers)
    assert [c["key"] for c in response.json()["credentials"]] == ["same_key"]
    assert response.json()["total"] == 1


async def test_bad_keys_in_the_path_are_422(client: AsyncTestClient, db: AsyncSession) -> None:
    t = await tenant(client)
    problems = []
    for bad in ("bad key", "k" * 129, "a$b", "ключ"):
        for method, body in (("PUT", {"value": SECRET}), ("DELETE", None), ("GET", None)):
            path = credentials_path(t, bad) + ("/usage" if method == "GET" else "")
            response = await client.request(method, path, json=body, headers=t.owner.headers)
            where = f"{method} {bad[:20]!r}"
            if response.status_code != 422:
                problems.append(f"{where}: {response.status_code} {response.text[:200]}")
                continue
            entries = response.json()["detail"]
            if [e["loc"] for e in entries] != [["path", "key"]]:
                problems.append(f"{where}: {entries}")
    assert not problems, "\n".join(problems)
    assert await count_credentials(db) == 0


async def test_longest_key_and_every_allowed_character_are_accepted(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    for key in ("k" * 128, "Az09_.-"):
        response = await put(client, t, key)
        assert response.status_code == 201, response.text
        assert response.json()["key"] == key


async def test_empty_or_missing_value_is_422(client: AsyncTestClient, db: AsyncSession) -> None:
    t = await tenant(client)
    response = await client.put(
        credentials_path(t, "k"), json={"value": ""}, headers=t.owner.headers
    )
    entry = single_error(response)
    assert entry["loc"] == ["body", "value"]
    assert entry["type"] == "string_too_short"
    response = await client.put(
        credentials_path(t, "k"), json={"description": "no value"}, headers=t.owner.headers
    )
    entry = single_error(response)
    assert entry["loc"] == ["body", "value"]
    assert entry["type"] == "missing"
    assert await count_credentials(db) == 0


async def test_values_with_cr_lf_or_nul_are_422_and_never_stored(
    client: AsyncTestClient, db: AsyncSession, settings: Settings
) -> None:
    """A value is sent in outbound header and query values as it is: a CR or LF would end
    the header early (``X-Injected: yes`` becomes a header of its own), a NUL cuts it."""
    t = await tenant(client)
    await put_ok(client, t, "k", SECRET)
    for value in (
        "abcdefgh-secret\r\nX-Injected: yes",
        "line\nbreak",
        "carriage\rreturn",
        "nul\x00inside",
        "\r\n",
    ):
        for key in ("k", "fresh"):
            entry = single_error(await put(client, t, key, value))
            assert entry["loc"] == ["body", "value"], entry
            assert entry["type"] == "string_pattern_mismatch", entry
            assert entry["input"] is None, "a credential's value is never echoed"
    assert await count_credentials(db) == 1
    stored = await ciphertext_of(db, t.id, "k")
    assert secret_box(settings.secret_key).decrypt(stored) == SECRET
    # Other characters (a tab, spaces, non-ASCII) are still values.
    await put_ok(client, t, "tabbed", "Bearer\tsk live é")


async def test_a_failed_replace_keeps_the_old_value(
    client: AsyncTestClient, db: AsyncSession, settings: Settings
) -> None:
    t = await tenant(client)
    await put_ok(client, t, "k", SECRET)
    response = await client.put(
        credentials_path(t, "k"), json={"value": ""}, headers=t.owner.headers
    )
    assert response.status_code == 422, response.text
    stored = await ciphertext_of(db, t.id, "k")
    assert secret_box(settings.secret_key).decrypt(stored) == SECRET


# --- at rest ------------------------------------------------------------------------------------


async def test_row_holds_ciphertext_that_decrypts_to_the_value(
    client: AsyncTestClient, db: AsyncSession, settings: Settings
) -> None:
    t = await tenant(client)
    await put_ok(client, t, "k", SECRET)
    first = await ciphertext_of(db, t.id, "k")
    assert SECRET not in first
    assert "THE-PLAINTEXT" not in first
    box = secret_box(settings.secret_key)
    assert box.decrypt(first) == SECRET

    # No column of the row holds the plaintext.
    row = (await db.execute(text("SELECT * FROM credentials WHERE key = 'k'"))).mappings().one()
    await db.commit()
    assert all(SECRET not in str(value) for value in row.values()), dict(row)

    await put_ok(client, t, "k", OTHER_SECRET)
    second = await ciphertext_of(db, t.id, "k")
    assert second != first
    assert OTHER_SECRET not in second
    assert box.decrypt(second) == OTHER_SECRET

    # Putting the same value again still writes a fresh ciphertext.
    await put_ok(client, t, "k", OTHER_SECRET)
    third = await ciphertext_of(db, t.id, "k")
    assert third != second
    assert box.decrypt(third) == OTHER_SECRET


# --- usage (spec 8) -------------------------------------------------------------------------------


async def test_usage_lists_exactly_the_referencing_providers_and_domains(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    for key in ("KEY", "KEY2", "OTHER"):
        await put_ok(client, t, key)

    p_key = await create_provider(client, t, "uses KEY", "KEY")
    await create_provider(client, t, "uses KEY2", "KEY2")
    await create_provider(client, t, "no credential", None)
    p_key_again = await create_provider(client, t, "also KEY", "KEY")

    d_header = await create_domain(
        client, t, "header.example.com", headers={"Authorization": "Bearer {{credentials.KEY}}"}
    )
    d_query_spaced = await create_domain(
        client, t, "query.example.com", query_params={"api_key": "{{ credentials.KEY }}"}
    )
    await create_domain(client, t, "prefix.example.com", headers={"X-Key": "{{credentials.KEY2}}"})
    await create_domain(client, t, "other.example.com", query_params={"k": "{{credentials.OTHER}}"})
    await create_domain(client, t, "plain.example.com", headers={"X-Key": "KEY credentials.KEY"})
    d_both = await create_domain(
        client,
        t,
        "both.example.com",
        headers={"X-A": "{{credentials.OTHER}}", "X-B": "pre-{{credentials.KEY}}-post"},
    )

    response = await client.get(f"{credentials_path(t, 'KEY')}/usage", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    usage = response.json()
    assert set(usage) == {"llm_providers", "domains"}
    assert sorted((p["id"], p["provider"]) for p in usage["llm_providers"]) == sorted(
        [(p_key["id"], "openai"), (p_key_again["id"], "openai")]
    )
    assert all({"id", "provider"} <= set(p) for p in usage["llm_providers"])
    assert sorted((d["id"], d["domain"]) for d in usage["domains"]) == sorted(
        [
            (d_header["id"], "header.example.com"),
            (d_query_spaced["id"], "query.example.com"),
            (d_both["id"], "both.example.com"),
        ]
    )
    assert all(set(d) == {"id", "domain"} for d in usage["domains"])
    assert SECRET not in response.text

    response = await client.get(f"{credentials_path(t, 'KEY2')}/usage", headers=t.owner.headers)
    usage2 = response.json()
    assert [p["name"] for p in usage2["llm_providers"]] == ["uses KEY2"]
    assert [d["domain"] for d in usage2["domains"]] == ["prefix.example.com"]


async def test_usage_of_an_unreferenced_credential_is_empty(client: AsyncTestClient) -> None:
    t = await tenant(client)
    await put_ok(client, t, "lonely")
    response = await client.get(f"{credentials_path(t, 'lonely')}/usage", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json() == {"llm_providers": [], "domains": []}


async def test_usage_follows_reference_changes(client: AsyncTestClient) -> None:
    t = await tenant(client)
    await put_ok(client, t, "KEY")
    await put_ok(client, t, "NEW")
    provider = await create_provider(client, t, "p", "KEY")
    domain = await create_domain(client, t, "a.example.com", headers={"X": "{{credentials.KEY}}"})
    usage_path = f"{credentials_path(t, 'KEY')}/usage"

    response = await client.patch(
        f"/v1/orgs/{t.id}/llm-providers/{provider['id']}",
        json={"credential_key": "NEW"},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text
    response = await client.patch(
        f"/v1/orgs/{t.id}/allowed-domains/{domain['id']}",
        json={"headers": {"X": "{{credentials.NEW}}"}},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text

    usage = (await client.get(usage_path, headers=t.owner.headers)).json()
    assert usage == {"llm_providers": [], "domains": []}
    new_usage = (
        await client.get(f"{credentials_path(t, 'NEW')}/usage", headers=t.owner.headers)
    ).json()
    assert [p["id"] for p in new_usage["llm_providers"]] == [provider["id"]]
    assert [d["id"] for d in new_usage["domains"]] == [domain["id"]]


async def test_usage_of_an_unknown_key_is_404(client: AsyncTestClient) -> None:
    t = await tenant(client)
    await put_ok(client, t, "KEY")
    for key in ("nope", "KEY2", "key"):
        response = await client.get(f"{credentials_path(t, key)}/usage", headers=t.owner.headers)
        assert response.status_code == 404, f"{key}: {response.text}"
        assert isinstance(response.json()["detail"], str)


async def test_usage_ignores_references_of_another_organization(client: AsyncTestClient) -> None:
    a = await tenant(client)
    b = await tenant(client)
    await put_ok(client, a, "KEY")
    await put_ok(client, b, "KEY")
    await create_provider(client, b, "b provider", "KEY")
    await create_domain(client, b, "b.example.com", headers={"X": "{{credentials.KEY}}"})
    response = await client.get(f"{credentials_path(a, 'KEY')}/usage", headers=a.owner.headers)
    assert response.json() == {"llm_providers": [], "domains": []}
    # And a's credential can be deleted although b's namesake is in use.
    response = await client.delete(credentials_path(a, "KEY"), headers=a.owner.headers)
    assert response.status_code == 204, response.text


# --- delete -------------------------------------------------------------------------------------


async def test_delete_of_a_referenced_credential_is_409_naming_the_references(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    await put_ok(client, t, "KEY")
    provider = await create_provider(client, t, "Primary OpenAI", "KEY")
    domain = await create_domain(
        client, t, "api.example.com", query_params={"key": "{{ credentials.KEY }}"}
    )

    response = await client.delete(credentials_path(t, "KEY"), headers=t.owner.headers)
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    assert "Primary OpenAI" in detail or provider["id"] in detail, detail
    assert "api.example.com" in detail or domain["id"] in detail, detail
    assert await count_credentials(db) == 1

    # Only the domain left: still 409, now naming just the domain.
    response = await client.delete(
        f"/v1/orgs/{t.id}/llm-providers/{provider['id']}", headers=t.owner.headers
    )
    assert response.status_code == 204, response.text
    response = await client.delete(credentials_path(t, "KEY"), headers=t.owner.headers)
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "api.example.com" in detail or domain["id"] in detail, detail
    assert "Primary OpenAI" not in detail and provider["id"] not in detail, detail

    response = await client.patch(
        f"/v1/orgs/{t.id}/allowed-domains/{domain['id']}",
        json={"query_params": {}},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text

    response = await client.delete(credentials_path(t, "KEY"), headers=t.owner.headers)
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert await count_credentials(db) == 0
    response = await client.delete(credentials_path(t, "KEY"), headers=t.owner.headers)
    assert response.status_code == 404, response.text
    response = await client.get(f"{credentials_path(t, 'KEY')}/usage", headers=t.owner.headers)
    assert response.status_code == 404, response.text
    listing = (await client.get(credentials_path(t), headers=t.owner.headers)).json()
    assert listing == {"credentials": [], "total": 0}


async def test_delete_of_an_unreferenced_credential_leaves_the_others(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    await put_ok(client, t, "KEY")
    await put_ok(client, t, "KEY2")
    await create_domain(client, t, "a.example.com", headers={"X": "{{credentials.KEY2}}"})
    response = await client.delete(credentials_path(t, "KEY"), headers=t.owner.headers)
    assert response.status_code == 204, response.text
    listing = (await client.get(credentials_path(t), headers=t.owner.headers)).json()
    assert [c["key"] for c in listing["credentials"]] == ["KEY2"]


async def test_delete_of_an_unknown_credential_is_404(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.delete(credentials_path(t, "never"), headers=t.owner.headers)
    assert response.status_code == 404, response.text
    assert isinstance(response.json()["detail"], str)
