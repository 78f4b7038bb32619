"""Webhook endpoints through the API (DESIGN §5.13): their fields, the secret shown once,
validation in the spec's 422 shape, who may read and write them, and other tenants' ids."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import WebhookEndpoint
from tests.support.factories import create_token, single_validation_entry, tenant
from tests.support.notifications import create_endpoint, endpoints_path

READ_FIELDS = {
    "id",
    "organization_id",
    "url",
    "events",
    "description",
    "active",
    "disabled_reason",
    "disabled_at",
    "created_at",
    "updated_at",
}
URL = "https://hooks.example.com/spar?team=evals"


async def test_create_answers_201_with_the_secret_shown_once_and_stored_encrypted(
    client: AsyncTestClient, db: AsyncSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    t = await tenant(client)
    response = await client.post(
        endpoints_path(t),
        json={
            "url": URL,
            "events": ["trigger.execution.failed", "batch.completed", "batch.completed"],
            "description": "alerts channel",
        },
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created) == READ_FIELDS | {"secret"}
    secret = created["secret"]
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert created["url"] == URL
    # Each once, in the catalogue's order.
    assert created["events"] == ["batch.completed", "trigger.execution.failed"]
    assert created["active"] is True and created["disabled_reason"] is None
    assert created["organization_id"] == t.id

    one = await client.get(endpoints_path(t, created["id"]), headers=t.owner.headers)
    listed = await client.get(endpoints_path(t), headers=t.owner.headers)
    patched = await client.patch(
        endpoints_path(t, created["id"]), json={"description": "x"}, headers=t.owner.headers
    )
    for answer in (one, listed, patched):
        assert answer.status_code == 200, answer.text
        assert secret not in answer.text and "secret" not in answer.text
    assert set(one.json()) == READ_FIELDS
    shown = {name: value for name, value in created.items() if name != "secret"}
    assert one.json() == listed.json()["webhook_endpoints"][0] == shown
    assert listed.json()["total"] == 1
    assert [e["id"] for e in listed.json()["webhook_endpoints"]] == [created["id"]]

    stored = await db.scalar(select(WebhookEndpoint).where(WebhookEndpoint.organization_id == t.id))
    assert stored is not None and secret not in stored.secret_encrypted
    assert secret not in caplog.text


async def test_another_endpoint_gets_another_secret(client: AsyncTestClient) -> None:
    t = await tenant(client)
    first = await create_endpoint(client, t, URL)
    second = await create_endpoint(client, t, URL)
    assert first["secret"] != second["secret"]


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        (
            {"url": "ftp://hooks.example.com/x", "events": ["batch.completed"]},
            ["body", "url"],
            None,
        ),
        ({"url": "/relative/path", "events": ["batch.completed"]}, ["body", "url"], None),
        ({"url": "https://", "events": ["batch.completed"]}, ["body", "url"], None),
        ({"url": "http://[::1/hooks", "events": ["batch.completed"]}, ["body", "url"], None),
        (
            {"url": "http://hooks.example.com:99999/", "events": ["batch.completed"]},
            ["body", "url"],
            None,
        ),
        (
            {"url": "https://user:pw@hooks.example.com/", "events": ["batch.completed"]},
            ["body", "url"],
            None,
        ),
        ({"url": URL, "events": []}, ["body", "events"], "too_short"),
        ({"url": URL, "events": ["batch.exploded"]}, ["body", "events", "0"], "enum"),
        ({"url": URL}, ["body", "events"], "missing"),
        ({"events": ["batch.completed"]}, ["body", "url"], "missing"),
        # The secret is Spar's to make, never the caller's.
        (
            {"url": URL, "events": ["batch.completed"], "secret": "whsec_mine"},
            ["body", "secret"],
            "extra_forbidden",
        ),
        ({"url": URL, "events": ["batch.completed"], "active": "yes"}, ["body", "active"], None),
    ],
)
async def test_invalid_endpoints_answer_422_in_the_specs_shape_and_store_nothing(
    client: AsyncTestClient,
    db: AsyncSession,
    body: dict[str, Any],
    loc: list[str],
    kind: str | None,
) -> None:
    t = await tenant(client)
    response = await client.post(endpoints_path(t), json=body, headers=t.owner.headers)
    entry = single_validation_entry(response)
    assert entry["loc"] == loc, entry
    if kind is not None:
        assert entry["type"] == kind, entry
    assert await db.scalar(select(WebhookEndpoint.id)) is None


async def test_a_bad_change_answers_422_and_changes_nothing(client: AsyncTestClient) -> None:
    t = await tenant(client)
    made = await create_endpoint(client, t, URL, "batch.completed")
    one = endpoints_path(t, made["id"])
    for body, loc in (
        ({"url": "mailto:ops@example.com"}, ["body", "url"]),
        ({"events": []}, ["body", "events"]),
        ({"events": ["nope"]}, ["body", "events", "0"]),
        ({"secret": "whsec_x"}, ["body", "secret"]),
    ):
        response = await client.patch(one, json=body, headers=t.owner.headers)
        assert single_validation_entry(response)["loc"] == loc
        assert made["secret"] not in response.text
    unchanged = (await client.get(one, headers=t.owner.headers)).json()
    assert (unchanged["url"], unchanged["events"]) == (URL, ["batch.completed"])


async def test_patch_changes_the_fields_sent_and_delete_removes_it(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    made = await create_endpoint(client, t, URL, "batch.completed", description="first")
    one = endpoints_path(t, made["id"])
    response = await client.patch(
        one,
        json={"url": "http://hooks.example.com/v2", "events": ["calibration.completed"]},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["url"] == "http://hooks.example.com/v2"
    assert body["events"] == ["calibration.completed"]
    assert body["description"] == "first"
    paused = await client.patch(one, json={"active": False}, headers=t.owner.headers)
    assert paused.json()["active"] is False
    assert paused.json()["disabled_reason"] is None  # a user turned it off, Spar did not

    assert (await client.delete(one, headers=t.owner.headers)).status_code == 204
    assert (await client.get(one, headers=t.owner.headers)).status_code == 404
    assert (await client.delete(one, headers=t.owner.headers)).status_code == 404
    listed = await client.get(endpoints_path(t), headers=t.owner.headers)
    assert listed.json() == {"webhook_endpoints": [], "total": 0}


# --- permissions and tenant isolation -------------------------------------------------------------


async def test_every_role_that_reads_everything_reads_them_and_only_owner_and_admin_write(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client, with_roles=("ADMIN", "MEMBER", "VIEWER", "GUEST"))
    made = await create_endpoint(client, t, URL)
    one = endpoints_path(t, made["id"])
    for role in ("ADMIN", "MEMBER", "VIEWER"):
        headers = t.members[role].headers
        assert (await client.get(endpoints_path(t), headers=headers)).status_code == 200
        assert (await client.get(one, headers=headers)).status_code == 200
        assert (await client.get(f"{one}/deliveries", headers=headers)).status_code == 200
    guest = t.members["GUEST"].headers
    assert (await client.get(endpoints_path(t), headers=guest)).status_code == 403
    for role in ("MEMBER", "VIEWER", "GUEST"):
        headers = t.members[role].headers
        for refused in (
            client.post(
                endpoints_path(t), json={"url": URL, "events": ["batch.completed"]}, headers=headers
            ),
            client.patch(one, json={"description": "mine"}, headers=headers),
            client.delete(one, headers=headers),
        ):
            response = await refused
            assert response.status_code == 403, (role, response.text)
    admin = t.members["ADMIN"].headers
    assert (await client.patch(one, json={"description": "a"}, headers=admin)).status_code == 200

    reader = await create_token(client, t.owner, t.id, ["notifications:read"])
    assert (await client.get(one, headers=reader.headers)).status_code == 200
    refused = await client.delete(one, headers=reader.headers)
    assert refused.status_code == 403
    writer = await create_token(client, t.owner, t.id, ["notifications:write"])
    assert (await client.delete(one, headers=writer.headers)).status_code == 204


async def test_another_organizations_endpoint_and_delivery_ids_answer_404(
    client: AsyncTestClient,
) -> None:
    t, other = await tenant(client), await tenant(client)
    theirs = await create_endpoint(client, other, URL)
    mine = await create_endpoint(client, t, URL)
    delivery = "00000000-0000-4000-8000-000000000000"
    for path in (
        endpoints_path(t, theirs["id"]),
        endpoints_path(other, theirs["id"]),
    ):
        for response in (
            await client.get(path, headers=t.owner.headers),
            await client.patch(path, json={"description": "mine"}, headers=t.owner.headers),
            await client.get(f"{path}/deliveries", headers=t.owner.headers),
            await client.post(f"{path}/deliveries/{delivery}/redeliver", headers=t.owner.headers),
            await client.delete(path, headers=t.owner.headers),
        ):
            assert response.status_code == 404, response.text
    unknown = await client.post(
        endpoints_path(t, mine["id"], "deliveries", delivery, "redeliver"),
        headers=t.owner.headers,
    )
    assert unknown.status_code == 404
    still = await client.get(endpoints_path(other, theirs["id"]), headers=other.owner.headers)
    assert still.json()["description"] == ""
    listed = await client.get(endpoints_path(t), headers=t.owner.headers)
    assert [e["id"] for e in listed.json()["webhook_endpoints"]] == [mine["id"]]
