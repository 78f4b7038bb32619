"""Triggers over REST (spec 21, DESIGN §3 and §5.7): create, read, change, delete, the
executions listing and a manual fire, with their validation, permissions and tenant
isolation; and what an execution does, run as the ``triggers`` actor runs it
(``execute(session_factory, settings, execution_id, broker=...)``) against a loopback
:class:`FakeAgent`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import BatchRun, TriggerExecution
from shared.queue import DISPATCH_BATCH
from shared.settings import Settings
from shared.triggers.executions import execute
from tests.support.factories import (
    Tenant,
    create_org,
    create_token,
    member_holding,
    single_validation_entry,
    stub_broker,
    tenant,
)
from tests.support.fakes import FakeAgent, Reply
from tests.support.scenario_setup import create_scenario, outbound_setup
from tests.support.triggers import create, path, scheduled, webhook

READ_FIELDS = {
    "id",
    "organization_id",
    "name",
    "trigger_type",
    "status",
    "agent_id",
    "message",
    "cron_expression",
    "timezone",
    "action",
    "scenario_ids",
    "tags",
    "max_concurrency",
    "repetitions",
    "webhook_url",
    "next_run_at",
    "created_at",
    "updated_at",
}
EXECUTION_FIELDS = {
    "id",
    "trigger_id",
    "source",
    "status",
    "scheduled_for",
    "webhook_id",
    "payload",
    "message",
    "response",
    "batch_run_id",
    "error",
    "attempts",
    "created_at",
    "started_at",
    "completed_at",
}


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"got: {body['message']}") as fake:
        yield fake


async def run_execution(app: Litestar, settings: Settings, execution_id: str, **kw: Any) -> None:
    await execute(
        app.state.database,
        settings,
        UUID(execution_id),
        broker=kw.pop("broker", None) or stub_broker(),
        **kw,
    )


async def get_execution(client: AsyncTestClient, t: Tenant, trigger_id: str, execution_id: str):
    response = await client.get(
        path(t, trigger_id, "executions", execution_id), headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    return response.json()


# --- create and read ------------------------------------------------------------------------------


async def test_create_answers_201_active_with_url_and_secret_shown_once(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, scheduled(setup.agent_id))

    assert set(created) == READ_FIELDS | {"webhook_secret"}
    assert created["status"] == "active"
    assert created["organization_id"] == t.id
    assert created["webhook_url"] == f"http://testserver.local/v1/hooks/triggers/{created['id']}"
    assert created["webhook_secret"].startswith("whsec_")
    assert len(created["webhook_secret"]) > 40
    assert created["action"] == "message"
    # 02:00 in Amsterdam is 00:00 or 01:00 UTC: the next slot is a real future instant.
    next_run = datetime.fromisoformat(created["next_run_at"])
    assert next_run > datetime.now(UTC)
    assert next_run.astimezone(UTC).hour in (0, 1) and next_run.minute == 0

    got = await client.get(path(t, created["id"]), headers=t.owner.headers)
    assert got.status_code == 200
    assert set(got.json()) == READ_FIELDS  # the secret is never shown again
    listed = await client.get(path(t), headers=t.owner.headers)
    assert listed.json()["total"] == 1
    assert set(listed.json()["triggers"][0]) == READ_FIELDS
    assert created["webhook_secret"] not in listed.text + got.text
    # Read back as it was created, field for field.
    shown = {name: value for name, value in created.items() if name != "webhook_secret"}
    assert got.json() == listed.json()["triggers"][0] == shown

    # Stored encrypted: the secret's text is nowhere in the row.
    row = (await db.execute(text("SELECT t::text FROM triggers t"))).scalar_one()
    assert created["webhook_secret"] not in row
    assert created["webhook_secret"][len("whsec_") :] not in row


async def test_a_webhook_trigger_needs_no_cron_and_has_no_next_run(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, webhook(setup.agent_id))
    assert created["trigger_type"] == "webhook"
    assert created["cron_expression"] is None and created["next_run_at"] is None
    # Filters of the listing.
    await create(client, t, scheduled(setup.agent_id))
    for query, expected in [
        ("trigger_type=webhook", {"on deploy"}),
        ("trigger_type=scheduled", {"nightly"}),
        ("status=inactive", set()),
    ]:
        listed = await client.get(f"{path(t)}?{query}", headers=t.owner.headers)
        assert {tr["name"] for tr in listed.json()["triggers"]} == expected, query


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"name": ""}, ["body", "name"]),
        ({"name": "x" * 256}, ["body", "name"]),
        ({"cron_expression": "* * * *"}, ["body", "cron_expression"]),
        ({"cron_expression": "* * * * * *"}, ["body", "cron_expression"]),
        ({"cron_expression": "61 * * * *"}, ["body", "cron_expression"]),
        ({"cron_expression": "* * * * 8"}, ["body", "cron_expression"]),
        ({"cron_expression": "0 0 30 2 *"}, ["body", "cron_expression"]),
        ({"timezone": "Mars/Olympus"}, ["body", "timezone"]),
        ({"timezone": "localtime"}, ["body", "timezone"]),
        ({"trigger_type": "hourly"}, ["body", "trigger_type"]),
        ({"cron_expression": None}, ["body", "cron_expression"]),
        ({"timezone": None}, ["body", "timezone"]),
        ({"message": ""}, ["body", "message"]),
        ({"message": "{{ trigger.nme }}"}, ["body", "message"]),
        ({"message": "{{ customer }}"}, ["body", "message"]),
        ({"message": "{% if %}"}, ["body", "message"]),
        ({"action": "batch_run"}, ["body", "scenario_ids"]),
        ({"tags": ["smoke"]}, ["body", "action"]),
        ({"max_concurrency": 0}, ["body", "max_concurrency"]),
        ({"status": "active"}, ["body", "status"]),  # set by the server
    ],
)
async def test_invalid_triggers_answer_422_and_store_nothing(
    client: AsyncTestClient, agent: FakeAgent, change: dict[str, Any], loc: list[str]
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    response = await client.post(
        path(t), json=scheduled(setup.agent_id, **change), headers=t.owner.headers
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == loc, entry
    listed = await client.get(path(t), headers=t.owner.headers)
    assert listed.json()["total"] == 0


async def test_only_a_message_trigger_needs_a_message(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    """A ``batch_run`` trigger sends no message: it is created without one (the create
    body's schema does not require it), while a ``message`` trigger without one, or a
    trigger turned into one without one, answers 422 naming ``message``."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, tags=["smoke"])
    suite = scheduled(setup.agent_id, action="batch_run", tags=["smoke"])
    del suite["message"]
    created = await create(client, t, suite)
    assert (created["action"], created["message"]) == ("batch_run", "")

    bare = scheduled(setup.agent_id)
    del bare["message"]
    refused = await client.post(path(t), json=bare, headers=t.owner.headers)
    entry = single_validation_entry(refused)
    assert (entry["loc"], entry["type"]) == (["body", "message"], "missing"), entry
    turned = await client.patch(
        path(t, created["id"]), json={"action": "message", "tags": []}, headers=t.owner.headers
    )
    assert single_validation_entry(turned)["loc"] == ["body", "message"]
    given = await client.patch(
        path(t, created["id"]),
        json={"action": "message", "tags": [], "message": "hello"},
        headers=t.owner.headers,
    )
    assert given.status_code == 200, given.text

    schema = (await client.get("/schema/openapi.json")).json()["components"]["schemas"]
    assert "message" not in schema["TriggerCreate"]["required"]


async def test_a_webhook_trigger_refuses_a_cron_expression(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    response = await client.post(
        path(t), json=webhook(setup.agent_id, cron_expression="* * * * *"), headers=t.owner.headers
    )
    assert single_validation_entry(response)["loc"] == ["body", "cron_expression"]


async def test_another_organizations_agent_or_scenario_answers_404(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t, other = await tenant(client), await tenant(client)
    mine = await outbound_setup(client, t, agent.url)
    theirs = await outbound_setup(client, other, agent.url)
    response = await client.post(path(t), json=scheduled(theirs.agent_id), headers=t.owner.headers)
    assert response.status_code == 404
    assert response.json() == {"detail": "agent not found"}
    foreign = await create_scenario(client, other)
    response = await client.post(
        path(t),
        json=scheduled(mine.agent_id, action="batch_run", scenario_ids=[foreign["id"]]),
        headers=t.owner.headers,
    )
    assert response.status_code == 404
    assert foreign["id"] in response.json()["detail"]


# --- change and delete ----------------------------------------------------------------------------


async def test_patch_changes_fields_pauses_and_resumes(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, scheduled(setup.agent_id))
    url = path(t, created["id"])

    changed = await client.patch(
        url,
        json={
            "name": "hourly",
            "message": "ping",
            "cron_expression": "15 * * * 1-5",
            "timezone": "America/New_York",
        },
        headers=t.owner.headers,
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["name"], body["message"], body["cron_expression"], body["timezone"]) == (
        "hourly",
        "ping",
        "15 * * * 1-5",
        "America/New_York",
    )
    next_run = datetime.fromisoformat(body["next_run_at"])
    assert next_run.minute == 15 and next_run.astimezone(UTC).weekday() < 6

    paused = await client.patch(url, json={"status": "inactive"}, headers=t.owner.headers)
    assert paused.json()["status"] == "inactive" and paused.json()["next_run_at"] is None
    resumed = await client.patch(url, json={"status": "active"}, headers=t.owner.headers)
    assert resumed.json()["status"] == "active" and resumed.json()["next_run_at"] is not None

    for bad, loc in [
        ({"cron_expression": "every minute"}, ["body", "cron_expression"]),
        ({"timezone": "Nowhere/City"}, ["body", "timezone"]),
        ({"status": "paused"}, ["body", "status"]),
        ({"trigger_type": "webhook"}, ["body", "trigger_type"]),
        ({"name": ""}, ["body", "name"]),
    ]:
        response = await client.patch(url, json=bad, headers=t.owner.headers)
        assert single_validation_entry(response)["loc"] == loc, bad
    after = await client.get(url, headers=t.owner.headers)
    assert after.json()["cron_expression"] == "15 * * * 1-5"


async def test_delete_removes_it_and_its_agent_can_then_be_deleted(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, scheduled(setup.agent_id))
    agent_url = f"/v1/orgs/{t.id}/agents/{setup.agent_id}"
    refused = await client.delete(agent_url, headers=t.owner.headers)
    assert refused.status_code == 409
    assert "nightly" in refused.json()["detail"]

    assert (await client.delete(path(t, created["id"]), headers=t.owner.headers)).status_code == 204
    assert (await client.get(path(t, created["id"]), headers=t.owner.headers)).status_code == 404
    assert (await client.delete(path(t, created["id"]), headers=t.owner.headers)).status_code == 404
    assert (await client.delete(agent_url, headers=t.owner.headers)).status_code == 204


# --- permissions and tenant isolation -------------------------------------------------------------


async def test_reading_needs_triggers_read_and_writing_triggers_write(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client, with_roles=("MEMBER", "VIEWER", "GUEST"))
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, scheduled(setup.agent_id))
    one = path(t, created["id"])
    viewer, guest, member = (t.members[r].headers for r in ("VIEWER", "GUEST", "MEMBER"))

    assert (await client.get(path(t), headers=viewer)).status_code == 200
    assert (await client.get(one, headers=viewer)).status_code == 200
    assert (await client.get(f"{one}/executions", headers=viewer)).status_code == 200
    for denied in [
        client.post(path(t), json=scheduled(setup.agent_id), headers=viewer),
        client.patch(one, json={"name": "x"}, headers=viewer),
        client.delete(one, headers=viewer),
        client.post(f"{one}/fire", headers=viewer),
        client.get(path(t), headers=guest),
        client.get(one, headers=guest),
    ]:
        response = await denied
        assert response.status_code == 403, response.text
    assert (await client.patch(one, json={"name": "m"}, headers=member)).status_code == 200

    read_only = await create_token(client, t.owner, t.id, permissions=["triggers:read"])
    assert (await client.get(path(t), headers=read_only.headers)).status_code == 200
    response = await client.post(f"{one}/fire", headers=read_only.headers)
    assert response.status_code == 403
    writer = await create_token(
        client, t.owner, t.id, permissions=["triggers:read", "triggers:write"]
    )
    assert (await client.post(f"{one}/fire", headers=writer.headers)).status_code == 202


async def test_another_organizations_trigger_ids_answer_404(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t, other = await tenant(client), await tenant(client)
    setup = await outbound_setup(client, other, agent.url)
    theirs = await create(client, other, scheduled(setup.agent_id))
    fired = await client.post(path(other, theirs["id"], "fire"), headers=other.owner.headers)
    execution_id = fired.json()["id"]
    one = path(t, theirs["id"])
    for response in [
        await client.get(one, headers=t.owner.headers),
        await client.patch(one, json={"name": "mine now"}, headers=t.owner.headers),
        await client.delete(one, headers=t.owner.headers),
        await client.get(f"{one}/executions", headers=t.owner.headers),
        await client.get(f"{one}/executions/{execution_id}", headers=t.owner.headers),
        await client.post(f"{one}/fire", headers=t.owner.headers),
    ]:
        assert response.status_code == 404, response.text
    # The other organization's id with this one's trigger: still 404.
    mine = await create(client, t, scheduled((await outbound_setup(client, t, agent.url)).agent_id))
    response = await client.get(
        path(t, mine["id"], "executions", execution_id), headers=t.owner.headers
    )
    assert response.status_code == 404
    unchanged = await client.get(path(other, theirs["id"]), headers=other.owner.headers)
    assert unchanged.json()["name"] == "nightly"
    listed = await client.get(path(t), headers=t.owner.headers)
    assert [tr["id"] for tr in listed.json()["triggers"]] == [mine["id"]]
    # The executions of a trigger: 404 for theirs without executions and for an unknown
    # id, an empty page for this organization's own trigger that has none (in a status).
    idle = await create(client, other, scheduled(setup.agent_id))
    for trigger_id in (idle["id"], str(uuid4())):
        response = await client.get(path(t, trigger_id, "executions"), headers=t.owner.headers)
        assert response.status_code == 404, response.text
    for query in ("", "?status=failed"):
        empty = await client.get(path(t, mine["id"], "executions") + query, headers=t.owner.headers)
        assert empty.status_code == 200, empty.text
        assert empty.json() == {"executions": [], "total": 0}
    theirs_failed = await client.get(
        path(other, theirs["id"], "executions") + "?status=failed", headers=other.owner.headers
    )
    assert theirs_failed.json() == {"executions": [], "total": 0}


# --- a trigger that runs scenarios needs scenarios:run (docs/permissions.md) ---------------------

TRIGGERS_ONLY = ["triggers:read", "triggers:write"]


async def test_a_role_without_scenarios_run_neither_creates_nor_fires_a_batch_run_trigger(
    client: AsyncTestClient, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, tags=["smoke"])
    writer = await member_holding(client, t, TRIGGERS_ONLY)
    token = await create_token(client, t.owner, t.id, TRIGGERS_ONLY)
    # Running scenarios in an organization of their own gives the writer nothing here.
    await create_org(client, writer, name="the writer's own")
    suite = scheduled(setup.agent_id, action="batch_run", tags=["smoke"])
    existing = await create(client, t, suite)

    for caller in (writer, token):
        created = await client.post(path(t), json=suite, headers=caller.headers)
        fired = await client.post(path(t, existing["id"], "fire"), headers=caller.headers)
        for response in (created, fired):
            assert response.status_code == 403, response.text
            assert "scenarios:run" in response.json()["detail"]

    listed = await client.get(path(t), headers=t.owner.headers)
    assert [tr["id"] for tr in listed.json()["triggers"]] == [existing["id"]]
    executions = await client.get(path(t, existing["id"], "executions"), headers=t.owner.headers)
    assert executions.json()["total"] == 0
    assert await db.scalar(select(func.count()).select_from(BatchRun)) == 0
    # A trigger that only sends a message needs nothing beyond triggers:write.
    message = await client.post(path(t), json=scheduled(setup.agent_id), headers=writer.headers)
    assert message.status_code == 201, message.text
    fired = await client.post(path(t, message.json()["id"], "fire"), headers=writer.headers)
    assert fired.status_code == 202, fired.text


async def test_changing_what_a_trigger_runs_needs_scenarios_run_but_pausing_it_does_not(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, name="smoke", tags=["smoke"])
    slow = await create_scenario(client, t, name="slow", tags=["slow"])
    writer = await member_holding(client, t, TRIGGERS_ONLY)
    message = await create(client, t, scheduled(setup.agent_id))
    suite = await create(client, t, scheduled(setup.agent_id, action="batch_run", tags=["smoke"]))
    one = path(t, suite["id"])

    for url, change in [
        (path(t, message["id"]), {"action": "batch_run", "tags": ["smoke"]}),
        (one, {"tags": ["smoke", "slow"]}),
        (one, {"scenario_ids": [slow["id"]]}),
        (one, {"cron_expression": "* * * * *"}),
        (one, {"action": "message", "tags": []}),
    ]:
        response = await client.patch(url, json=change, headers=writer.headers)
        assert response.status_code == 403, (change, response.text)
        assert "scenarios:run" in response.json()["detail"]
    # A new webhook secret is a way to start the suite: not without scenarios:run either.
    rotated = await client.post(f"{one}/rotate-secret", headers=writer.headers)
    assert rotated.status_code == 403, rotated.text

    # Pausing only stops the suite; resuming starts it again.
    paused = await client.patch(one, json={"status": "inactive"}, headers=writer.headers)
    assert paused.status_code == 200, paused.text
    resumed = await client.patch(one, json={"status": "active"}, headers=writer.headers)
    assert resumed.status_code == 403, resumed.text

    after = (await client.get(one, headers=t.owner.headers)).json()
    assert (after["action"], after["tags"], after["scenario_ids"], after["status"]) == (
        "batch_run",
        ["smoke"],
        [],
        "inactive",
    )
    assert after["cron_expression"] == "0 2 * * *"
    unchanged = (await client.get(path(t, message["id"]), headers=t.owner.headers)).json()
    assert unchanged["action"] == "message"
    # The message trigger is still the writer's to change, and deleting the suite stops it.
    renamed = await client.patch(
        path(t, message["id"]), json={"name": "renamed"}, headers=writer.headers
    )
    assert renamed.status_code == 200, renamed.text
    assert (await client.delete(one, headers=writer.headers)).status_code == 204


async def test_with_scenarios_run_a_role_creates_changes_and_fires_a_batch_run_trigger(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, tags=["smoke"])
    runner = await member_holding(client, t, [*TRIGGERS_ONLY, "scenarios:run"])

    created = await client.post(
        path(t),
        json=scheduled(setup.agent_id, action="batch_run", tags=["smoke"]),
        headers=runner.headers,
    )
    assert created.status_code == 201, created.text
    one = path(t, created.json()["id"])
    changed = await client.patch(one, json={"max_concurrency": 3}, headers=runner.headers)
    assert changed.status_code == 200, changed.text
    fired = await client.post(f"{one}/fire", headers=runner.headers)
    assert fired.status_code == 202, fired.text

    await run_execution(app, settings, fired.json()["id"])
    done = await get_execution(client, t, created.json()["id"], fired.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["batch_run_id"] is not None


# --- executions -----------------------------------------------------------------------------------


async def test_a_manual_fire_sends_the_rendered_message_and_records_the_reply(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, webhook(setup.agent_id))
    fired = await client.post(
        path(t, created["id"], "fire"),
        json={"payload": {"version": "v1.2.3"}},
        headers=t.owner.headers,
    )
    assert fired.status_code == 202, fired.text
    queued = fired.json()
    assert set(queued) == EXECUTION_FIELDS
    assert (queued["status"], queued["source"], queued["attempts"]) == ("queued", "manual", 0)

    await run_execution(app, settings, queued["id"])
    done = await get_execution(client, t, created["id"], queued["id"])
    assert done["status"] == "succeeded", done
    assert done["message"] == "Deployed v1.2.3 (on deploy)"
    assert done["response"] == "got: Deployed v1.2.3 (on deploy)"
    assert done["attempts"] == 1 and done["error"] is None
    assert done["started_at"] <= done["completed_at"]
    (request,) = agent.requests
    assert request.json["session_id"] == f"spar-trigger-{queued['id']}"
    assert request.json["metadata"]["trigger_id"] == created["id"]

    # A redelivered message changes nothing and calls nobody.
    await run_execution(app, settings, queued["id"])
    assert len(agent.requests) == 1
    assert (await get_execution(client, t, created["id"], queued["id"]))["attempts"] == 1


async def test_now_is_rendered_in_the_triggers_zone(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(
        client, t, scheduled(setup.agent_id, message="{{ now }}", timezone="Asia/Kolkata")
    )
    fired = (await client.post(path(t, created["id"], "fire"), headers=t.owner.headers)).json()
    await run_execution(app, settings, fired["id"])
    done = await get_execution(client, t, created["id"], fired["id"])
    sent = datetime.fromisoformat(done["message"])
    assert sent.utcoffset() is not None and sent.utcoffset().total_seconds() == 5.5 * 3600
    assert abs((sent - datetime.now(UTC)).total_seconds()) < 60


async def test_a_trigger_message_burning_cpu_fails_its_execution_naming_the_template(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    loops = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}hi"
    created = await create(client, t, scheduled(setup.agent_id, message=loops))
    fired = (await client.post(path(t, created["id"], "fire"), headers=t.owner.headers)).json()
    await run_execution(app, settings, fired["id"])
    done = await get_execution(client, t, created["id"], fired["id"])
    assert done["status"] == "failed", done
    assert done["error"] == (
        "trigger message template failed: rendering used more than 1 s of CPU"
    ), done
    assert agent.requests == []


async def test_a_failing_agent_or_a_template_error_fails_the_execution(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, webhook(setup.agent_id))
    trigger = path(t, created["id"])

    # The payload lacks "version": the template cannot render; the agent is not called.
    fired = (
        await client.post(f"{trigger}/fire", json={"payload": {}}, headers=t.owner.headers)
    ).json()
    await run_execution(app, settings, fired["id"])
    done = await get_execution(client, t, created["id"], fired["id"])
    assert done["status"] == "failed" and "template" in done["error"], done
    assert agent.requests == []

    agent.enqueue(*[Reply(status=500, json={"error": "down"})] * 3)
    fired = (
        await client.post(
            f"{trigger}/fire", json={"payload": {"version": "2"}}, headers=t.owner.headers
        )
    ).json()
    await run_execution(app, settings, fired["id"])
    done = await get_execution(client, t, created["id"], fired["id"])
    assert done["status"] == "failed" and "500" in done["error"], done
    assert done["message"] == "Deployed 2 (on deploy)" and done["response"] is None

    listed = await client.get(f"{trigger}/executions?status=failed", headers=t.owner.headers)
    assert listed.json()["total"] == 2


async def test_executions_list_newest_first_paged_and_filtered(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    created = await create(client, t, scheduled(setup.agent_id, message="hi"))
    url = path(t, created["id"])
    fired = [
        (await client.post(f"{url}/fire", json={"payload": {"n": n}}, headers=t.owner.headers))
        for n in range(3)
    ]
    ids = [response.json()["id"] for response in fired]
    await run_execution(app, settings, ids[1])

    page = await client.get(f"{url}/executions?limit=2", headers=t.owner.headers)
    assert page.json()["total"] == 3
    assert [e["id"] for e in page.json()["executions"]] == [ids[2], ids[1]]
    rest = await client.get(f"{url}/executions?limit=2&offset=2", headers=t.owner.headers)
    assert [e["id"] for e in rest.json()["executions"]] == [ids[0]]
    queued = await client.get(f"{url}/executions?status=queued", headers=t.owner.headers)
    assert [e["id"] for e in queued.json()["executions"]] == [ids[2], ids[0]]
    # Listed and read as the fire answered them, field for field.
    assert queued.json()["executions"] == [fired[2].json(), fired[0].json()]
    assert await get_execution(client, t, created["id"], ids[0]) == fired[0].json()
    assert set(fired[0].json()) == EXECUTION_FIELDS
    bad = await client.get(f"{url}/executions?status=done", headers=t.owner.headers)
    assert single_validation_entry(bad)["loc"] == ["query", "status"]


async def test_a_batch_run_trigger_creates_exactly_one_batch_however_often_delivered(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    tagged = [await create_scenario(client, t, name=f"s{i}", tags=["smoke"]) for i in range(3)]
    await create_scenario(client, t, name="other", tags=["slow"])
    created = await create(
        client,
        t,
        scheduled(setup.agent_id, action="batch_run", tags=["smoke"], max_concurrency=2),
    )
    assert created["action"] == "batch_run" and created["tags"] == ["smoke"]
    fired = (await client.post(path(t, created["id"], "fire"), headers=t.owner.headers)).json()

    broker = stub_broker()
    # Four deliveries at once, then one more: one batch.
    await asyncio.gather(
        *(run_execution(app, settings, fired["id"], broker=broker) for _ in range(4))
    )
    await run_execution(app, settings, fired["id"], broker=broker)
    done = await get_execution(client, t, created["id"], fired["id"])
    assert done["status"] == "succeeded", done
    batches = list(await db.scalars(select(BatchRun)))
    assert len(batches) == 1
    (batch,) = batches
    assert str(batch.id) == done["batch_run_id"]
    assert (batch.total_scenarios, batch.max_concurrency) == (len(tagged), 2)
    assert str(batch.agent_id) == setup.agent_id
    assert broker.queues[DISPATCH_BATCH[0]].qsize() == 1  # its first window asked for once
    listed = await client.get(f"/v1/orgs/{t.id}/scenarios/batch-runs", headers=t.owner.headers)
    assert listed.json()["total"] == 1


async def test_a_batch_run_trigger_whose_scenarios_are_gone_fails_with_the_reason(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    scenario = await create_scenario(client, t)
    created = await create(
        client, t, scheduled(setup.agent_id, action="batch_run", scenario_ids=[scenario["id"]])
    )
    await client.delete(f"/v1/orgs/{t.id}/scenarios/{scenario['id']}", headers=t.owner.headers)
    fired = (await client.post(path(t, created["id"], "fire"), headers=t.owner.headers)).json()
    await run_execution(app, settings, fired["id"])
    done = await get_execution(client, t, created["id"], fired["id"])
    assert done["status"] == "failed"
    assert scenario["id"] in done["error"] and done["batch_run_id"] is None
    assert await db.scalar(select(func.count()).select_from(BatchRun)) == 0


async def test_an_unknown_execution_id_is_ignored_by_the_actor(
    app: Litestar, settings: Settings, client: AsyncTestClient, db: AsyncSession
) -> None:
    await run_execution(app, settings, str(uuid4()))
    assert await db.scalar(select(func.count()).select_from(TriggerExecution)) == 0
