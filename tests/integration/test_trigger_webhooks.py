"""The public webhook URL of a trigger (DESIGN §5.8), called the way a sender would: every
delivery signed with the ``standardwebhooks`` reference library under the secret the
create response gave, never with Spar's own code."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import msgspec
import psycopg
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, make_url, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from standardwebhooks import Webhook

from api.app import create_app
from shared.db.models import Trigger, TriggerExecution
from shared.settings import Settings
from shared.triggers.executions import execute
from tests.support.factories import (
    Tenant,
    create_token,
    single_validation_entry,
    stub_broker,
    tenant,
)
from tests.support.fakes import FakeAgent
from tests.support.processes import admin_sql
from tests.support.scenario_setup import outbound_setup


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"ack {body['message']}") as fake:
        yield fake


async def webhook_trigger(
    client: AsyncTestClient, t: Tenant, agent_url: str, **fields: Any
) -> dict[str, Any]:
    setup = await outbound_setup(client, t, agent_url)
    response = await client.post(
        f"/v1/orgs/{t.id}/triggers/",
        json={
            "name": "deploys",
            "trigger_type": "webhook",
            "agent_id": setup.agent_id,
            "message": "Deployed {{ payload.service }} at {{ payload.sha }}",
            **fields,
        },
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


def signed(
    secret: str,
    body: bytes,
    *,
    msg_id: str | None = None,
    at: datetime | None = None,
) -> dict[str, str]:
    """The three Standard Webhooks headers, made by the reference library."""
    msg_id = msg_id or f"msg_{uuid4().hex}"
    at = at or datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def hook(trigger: dict[str, Any]) -> str:
    assert trigger["webhook_url"].startswith("http://testserver.local")
    return trigger["webhook_url"].removeprefix("http://testserver.local")


async def executions(db: AsyncSession) -> int:
    count = await db.scalar(select(func.count()).select_from(TriggerExecution))
    await db.commit()
    return int(count or 0)


BODY = json.dumps({"service": "checkout", "sha": "4f2a9c1"}).encode()


async def test_a_signed_delivery_answers_202_and_runs_the_message_with_its_payload(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    response = await client.post(
        hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
    )
    assert response.status_code == 202, response.text
    assert set(response.json()) == {"execution_id"}
    execution_id = response.json()["execution_id"]

    await execute(app.state.database, settings, UUID(execution_id), broker=stub_broker())
    done = await client.get(
        f"/v1/orgs/{t.id}/triggers/{trigger['id']}/executions/{execution_id}",
        headers=t.owner.headers,
    )
    body = done.json()
    assert (body["status"], body["source"]) == ("succeeded", "webhook")
    assert body["payload"] == {"service": "checkout", "sha": "4f2a9c1"}
    assert body["message"] == "Deployed checkout at 4f2a9c1"
    assert body["response"] == "ack Deployed checkout at 4f2a9c1"
    assert body["webhook_id"].startswith("msg_")


async def test_a_repeated_webhook_id_answers_with_the_original_execution(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    headers = signed(trigger["webhook_secret"], BODY, msg_id="msg_retry_1")
    first = await client.post(hook(trigger), content=BODY, headers=headers)
    # The sender retries: the same id, signed again a little later.
    again = signed(
        trigger["webhook_secret"],
        BODY,
        msg_id="msg_retry_1",
        at=datetime.now(UTC) + timedelta(seconds=30),
    )
    second = await client.post(hook(trigger), content=BODY, headers=again)
    assert first.status_code == second.status_code == 202
    assert second.json() == first.json()
    assert await executions(db) == 1
    # Another id is another delivery.
    other = await client.post(
        hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
    )
    assert other.status_code == 202 and other.json() != first.json()
    assert await executions(db) == 2


@pytest.mark.parametrize(
    "forge",
    [
        "tampered body",
        "wrong secret",
        "stale timestamp",
        "future timestamp",
        "no signature",
        "no id",
        "no timestamp",
        "garbled signature",
        "signature of another id",
        "non-numeric timestamp",
    ],
)
async def test_a_bad_signature_or_timestamp_answers_401_and_starts_nothing(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession, forge: str
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    secret = trigger["webhook_secret"]
    body = BODY
    if forge == "tampered body":
        headers = signed(secret, BODY)
        body = BODY.replace(b"checkout", b"payments")
    elif forge == "wrong secret":
        headers = signed("whsec_" + base64.b64encode(b"x" * 32).decode(), BODY)
    elif forge == "stale timestamp":
        headers = signed(secret, BODY, at=datetime.now(UTC) - timedelta(minutes=6))
    elif forge == "future timestamp":
        headers = signed(secret, BODY, at=datetime.now(UTC) + timedelta(minutes=6))
    elif forge.startswith("no "):
        headers = signed(secret, BODY)
        del headers[
            {"no signature": "webhook-signature", "no id": "webhook-id"}.get(
                forge, "webhook-timestamp"
            )
        ]
    elif forge == "garbled signature":
        headers = {**signed(secret, BODY), "webhook-signature": "v1;not-base64!"}
    elif forge == "signature of another id":
        headers = {**signed(secret, BODY), "webhook-id": "msg_someone_else"}
    else:
        headers = {**signed(secret, BODY), "webhook-timestamp": "yesterday"}
    response = await client.post(hook(trigger), content=body, headers=headers)
    assert response.status_code == 401, response.text
    assert response.json() == {"detail": "invalid webhook signature or timestamp"}
    assert await executions(db) == 0


async def test_an_inactive_trigger_answers_409_and_an_unknown_or_deleted_one_404(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    one = f"/v1/orgs/{t.id}/triggers/{trigger['id']}"
    await client.patch(one, json={"status": "inactive"}, headers=t.owner.headers)
    response = await client.post(
        hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
    )
    assert response.status_code == 409
    assert response.json() == {"detail": "trigger is inactive"}
    # Unsigned, an inactive trigger still answers 401: its state is not told to strangers.
    response = await client.post(hook(trigger), content=BODY)
    assert response.status_code == 401

    response = await client.post(
        f"/v1/hooks/triggers/{uuid4()}",
        content=BODY,
        headers=signed(trigger["webhook_secret"], BODY),
    )
    assert response.status_code == 404
    await client.delete(one, headers=t.owner.headers)
    response = await client.post(
        hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
    )
    assert response.status_code == 404
    assert await executions(db) == 0


async def test_a_body_over_256_kib_answers_413(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    big = json.dumps({"service": "x" * (256 * 1024), "sha": "1"}).encode()
    response = await client.post(
        hook(trigger), content=big, headers=signed(trigger["webhook_secret"], big)
    )
    assert response.status_code == 413, response.text
    # Exactly at the limit is accepted.
    filler = 256 * 1024 - len(json.dumps({"service": "", "sha": "1"}))
    edge = json.dumps({"service": "y" * filler, "sha": "1"}).encode()
    assert len(edge) == 256 * 1024
    response = await client.post(
        hook(trigger), content=edge, headers=signed(trigger["webhook_secret"], edge)
    )
    assert response.status_code == 202, response.text
    assert await executions(db) == 1


async def test_a_signed_body_that_is_not_json_answers_422(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    for body, kind in [(b"service=checkout", "json_invalid"), (b'{"a": "\\u0000"}', None)]:
        response = await client.post(
            hook(trigger), content=body, headers=signed(trigger["webhook_secret"], body)
        )
        entry = single_validation_entry(response)
        assert entry["loc"][0] == "body"
        if kind:
            assert entry["type"] == kind
    assert await executions(db) == 0


async def test_the_hook_needs_no_token_and_ignores_one(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    headers = {**signed(trigger["webhook_secret"], BODY), **t.owner.headers}
    response = await client.post(hook(trigger), content=BODY, headers=headers)
    assert response.status_code == 202
    # A token does not stand in for the signature.
    response = await client.post(hook(trigger), content=BODY, headers=t.owner.headers)
    assert response.status_code == 401


async def test_a_rotated_secret_signs_at_once_and_the_old_one_only_until_it_expires(
    client: AsyncTestClient, db: AsyncSession, agent: FakeAgent
) -> None:
    t, other = await tenant(client), await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    old = trigger["webhook_secret"]
    rotate = f"/v1/orgs/{t.id}/triggers/{trigger['id']}/rotate-secret"
    response = await client.post(rotate, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    new = response.json()["webhook_secret"]
    assert new.startswith("whsec_") and new != old
    assert response.json()["id"] == trigger["id"]
    # The secret is shown in that response only.
    read = await client.get(f"/v1/orgs/{t.id}/triggers/{trigger['id']}", headers=t.owner.headers)
    assert "webhook_secret" not in read.json() and new not in read.text

    def deliver(secret: str) -> Any:
        return client.post(hook(trigger), content=BODY, headers=signed(secret, BODY))

    assert (await deliver(new)).status_code == 202
    assert (await deliver(old)).status_code == 202  # a day of overlap by default
    # Once the overlap is over, the old secret is refused.
    await db.execute(
        update(Trigger)
        .where(Trigger.id == UUID(trigger["id"]))
        .values(previous_secret_expires_at=datetime.now(UTC) - timedelta(seconds=1))
    )
    await db.commit()
    assert (await deliver(old)).status_code == 401
    assert (await deliver(new)).status_code == 202

    # A leaked secret: rotated with no overlap, refused at once.
    response = await client.post(rotate, json={"previous_valid_for_s": 0}, headers=t.owner.headers)
    newest = response.json()["webhook_secret"]
    assert (await deliver(new)).status_code == 401
    assert (await deliver(newest)).status_code == 202
    # Bad bodies, another organization, and a read-only member.
    too_long = await client.post(
        rotate, json={"previous_valid_for_s": 8 * 24 * 3600}, headers=t.owner.headers
    )
    assert single_validation_entry(too_long)["loc"] == ["body", "previous_valid_for_s"]
    foreign = await client.post(
        f"/v1/orgs/{other.id}/triggers/{trigger['id']}/rotate-secret", headers=other.owner.headers
    )
    assert foreign.status_code == 404
    reader = await create_token(client, t.owner, t.id, ["triggers:read"])
    assert (await client.post(rotate, headers=reader.headers)).status_code == 403
    assert (await deliver(newest)).status_code == 202  # none of those changed the secret


# --- the database out of connections -------------------------------------------------------------


def _psycopg_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def two_connection_role(database_url: str) -> Iterator[str]:
    """The test database's URL as a role of this run's own that PostgreSQL lets hold two
    connections (``CONNECTION LIMIT 2``; a superuser has no limit), with the rights the API
    needs there."""
    role = f"spar_two_connections_{os.getpid()}"
    admin_sql(
        database_url,
        f'DROP ROLE IF EXISTS "{role}"',
        f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 2',
    )
    with psycopg.connect(_psycopg_url(database_url), autocommit=True) as conn:
        conn.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
        conn.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"'
        )
        conn.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    try:
        yield make_url(database_url).set(username=role).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(_psycopg_url(database_url), autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
        admin_sql(database_url, f'DROP ROLE IF EXISTS "{role}"')


def assert_unavailable(response: Any) -> None:
    """503 ``{"detail": str}`` with a Retry-After, and nothing of the failure inside."""
    assert response.status_code == 503, response.text
    assert set(response.json()) == {"detail"} and isinstance(response.json()["detail"], str)
    assert int(response.headers["retry-after"]) > 0
    for leak in ("Traceback", "SQL", "SELECT", "psycopg", "connection", "127.0.0.1"):
        assert leak not in response.text, response.text


async def test_a_delivery_while_postgresql_has_no_connection_to_give_answers_503(
    client: AsyncTestClient,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
    two_connection_role: str,
) -> None:
    """PostgreSQL refusing a connection (its limit reached) answers 503 with Retry-After, a
    delivery and an authenticated request alike; once connections are given back, a
    delivery goes through.

    The API has two pools of one connection each here (``SPAR_DB_POOL_SIZE=1``): the run
    engine's, which the guard reads on and which keeps trying to open its connection in the
    background while it is refused, and SQLAlchemy's, which a delivery writes on.  The
    role may hold two connections: given back, one is left for each, whichever takes its
    own first."""
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    starved = create_app(
        msgspec.structs.replace(settings, database_url=two_connection_role, db_pool_size=1)
    )
    role_url = _psycopg_url(two_connection_role)
    async with AsyncTestClient(app=starved, base_url="http://testserver.local") as other:
        with psycopg.connect(role_url), psycopg.connect(role_url):  # all the role may hold
            response = await other.post(
                hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
            )
            assert_unavailable(response)
            assert_unavailable(await other.get("/v1/organizations", headers=t.owner.headers))
        assert await executions(db) == 0
        # PostgreSQL counts a closed connection against the role until its backend has
        # exited, which a loaded machine takes a moment to do: until then a delivery is
        # refused as above, and none is taken.
        deadline = time.monotonic() + 10
        while True:
            response = await other.post(
                hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
            )
            if response.status_code != 503 or time.monotonic() > deadline:
                break
            assert_unavailable(response)
            assert await executions(db) == 0
            await asyncio.sleep(0.1)
        assert response.status_code == 202, response.text
    assert await executions(db) == 1


async def test_a_delivery_while_the_database_is_down_answers_503(
    client: AsyncTestClient, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    trigger = await webhook_trigger(client, t, agent.url)
    down = msgspec.structs.replace(
        settings, database_url="postgresql+psycopg://postgres@127.0.0.1:1/nowhere"
    )
    async with AsyncTestClient(app=create_app(down), base_url="http://testserver.local") as other:
        response = await other.post(
            hook(trigger), content=BODY, headers=signed(trigger["webhook_secret"], BODY)
        )
        assert_unavailable(response)
        assert_unavailable(await other.get("/v1/organizations", headers=t.owner.headers))
