"""Signed outbound webhooks (DESIGN §5.13), delivered to a loopback receiver as the
``notifications`` workers deliver them (in-process): recorded with the event's source,
signed per Standard Webhooks (checked with the ``standardwebhooks`` reference library,
never with Spar's own code), retried with the same ``webhook-id``, logged, redelivered,
refused by the egress policy, and an endpoint disabled after 24 hours of failures."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from standardwebhooks import Webhook

from scheduler.sweeper import sweep
from shared.batches.comparisons import store_due
from shared.calibration.judging import judge_examples
from shared.db.base import utcnow
from shared.db.models import NotificationEvent, WebhookDelivery, WebhookEndpoint
from shared.notifications.announce import announce
from shared.notifications.deliveries import MAX_RETRY_S, deliver, retry_delay
from shared.queue import PollingRedisBroker
from shared.settings import Settings
from shared.triggers.executions import execute
from shared.work import NOTIFICATION_EVENTS, WEBHOOK_DELIVERIES
from tests.support.batches import create_batch, drain, get_batch, make_scenario, make_world
from tests.support.calibration import EXAMPLES
from tests.support.factories import Tenant, held_in_redis, stub_broker, tenant
from tests.support.fakes import (
    FakeAgent,
    FakeOpenAI,
    FakeServer,
    RecordedRequest,
    Reply,
    verdict_from_marker,
)
from tests.support.loop import ticking_while_redis_holds_writes
from tests.support.notifications import (
    announce_recorded,
    create_endpoint,
    deliveries,
    endpoints_path,
    play_notifications,
    sent,
)
from tests.support.scenario_setup import outbound_setup
from tests.support.triggers import create, scheduled
from tests.support.triggers import path as trigger_path
from tests.support.triggers import webhook as webhook_trigger

DELIVERY_FIELDS = {
    "id",
    "endpoint_id",
    "event_id",
    "event_type",
    "webhook_id",
    "status",
    "attempts",
    "next_attempt_at",
    "last_attempt_at",
    "last_response_code",
    "last_response_body",
    "last_error",
    "payload",
    "created_at",
    "completed_at",
}


@pytest.fixture
def receiver() -> Iterator[FakeServer]:
    with FakeServer(Reply(status=204)) as fake:
        yield fake


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent() as fake:
        yield fake


async def failed_execution(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    agent_id: str,
    broker: Any,
) -> str:
    """A trigger execution that fails (its message template cannot render the payload),
    played as its worker plays it: its id."""
    trigger = await create(client, t, webhook_trigger(agent_id))
    fired = await client.post(
        trigger_path(t, trigger["id"], "fire"), json={"payload": {}}, headers=t.owner.headers
    )
    assert fired.status_code == 202, fired.text
    execution_id = fired.json()["id"]
    await execute(app.state.database, settings, UUID(execution_id), broker=broker)
    return str(execution_id)


def verified(secret: str, request: RecordedRequest) -> Any:
    """The body of a delivery whose Standard Webhooks signature the reference library
    accepts under ``secret`` (it raises otherwise)."""
    return Webhook(secret).verify(request.body, request.headers)


async def make_due(db: AsyncSession, **also: Any) -> None:
    """Every delivery due now, as if its wait had passed (and ``also`` set)."""
    await db.execute(update(WebhookDelivery).values(next_attempt_at=utcnow(), **also))
    await db.commit()


def at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


# --- signed, retried, logged ----------------------------------------------------------------------


async def test_a_failed_attempt_is_retried_with_the_same_webhook_id_and_both_verify(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
    db: AsyncSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    endpoint = await create_endpoint(
        client, t, f"{receiver.url}/hooks?team=evals", "trigger.execution.failed"
    )
    receiver.enqueue(Reply(status=503, body="busy " + "x" * 3000))
    broker = stub_broker()

    execution_id = await failed_execution(client, app, settings, t, setup.agent_id, broker)
    await play_notifications(app, settings, broker)  # announced, then a first attempt
    (first,) = receiver.requests
    (row,) = await deliveries(client, t, endpoint["id"])
    assert set(row) == DELIVERY_FIELDS
    assert (row["status"], row["attempts"], row["event_type"]) == (
        "pending",
        1,
        "trigger.execution.failed",
    )
    assert row["last_response_code"] == 503
    assert row["last_response_body"].startswith("busy xxx")
    assert len(row["last_response_body"].encode()) == 1024
    assert "503" in row["last_error"] and "team=evals" not in row["last_error"]
    wait = at(row["next_attempt_at"]) - at(row["last_attempt_at"])
    assert timedelta(seconds=4) < wait < timedelta(seconds=6), wait
    # The first retry is on its way, a few seconds from now (the delay queue).
    (retry,) = sent(broker, "notifications.DQ")
    assert retry.args == (row["id"],)
    assert 4_000 <= retry.options["eta"] - retry.message_timestamp <= 6_000

    # Not due yet: a delivery of the message now sends nothing.
    await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)
    assert len(receiver.requests) == 1
    await make_due(db)
    await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)

    first, second = receiver.requests
    assert first.path == second.path == "/hooks" and first.query == {"team": ["evals"]}
    assert first.header("webhook-id") == second.header("webhook-id") == row["webhook_id"]
    assert first.header("content-type") == "application/json"
    assert first.header("user-agent") == "Spar-Webhooks/1"
    assert first.body == second.body
    payload = verified(endpoint["secret"], first)
    assert verified(endpoint["secret"], second) == payload
    assert set(payload) == {"type", "timestamp", "data"}
    assert payload["type"] == "trigger.execution.failed"
    assert at(payload["timestamp"]) <= utcnow()
    data = payload["data"]
    assert data["execution"]["id"] == execution_id
    assert data["execution"]["status"] == "failed"
    assert "template" in data["execution"]["error"]
    assert data["trigger"]["name"] == "on deploy"
    org = f"/orgs/{t.id}"
    assert data["links"]["api"] == (
        f"{settings.public_base_url}/v1{org}/triggers/{data['trigger']['id']}"
        f"/executions/{execution_id}"
    )
    assert data["links"]["ui"] == f"{settings.public_base_url}/ui{org}/batches"
    assert row["payload"] == payload

    (done,) = await deliveries(client, t, endpoint["id"])
    assert (done["status"], done["attempts"], done["last_response_code"]) == ("succeeded", 2, 204)
    assert done["last_error"] is None and done["next_attempt_at"] is None
    assert done["completed_at"] is not None
    # Delivered: a late message changes nothing.
    await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)
    assert len(receiver.requests) == 2
    assert endpoint["secret"] not in caplog.text
    assert endpoint["secret"][6:] not in caplog.text
    assert f"delivery {row['id']}" in caplog.text and "503" in caplog.text


async def test_a_retry_due_soon_is_sent_after_its_commit_without_holding_up_the_event_loop(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
    db: AsyncSession,
    own_redis_url: str,
) -> None:
    """The message of a retry due within a minute is sent once the attempt's outcome has
    committed, from a thread: while Redis makes the send wait, the worker's event loop
    (every conversation of the process) goes on; it stood still for the whole wait."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_endpoint(client, t, f"{receiver.url}/hooks", "trigger.execution.failed")
    receiver.enqueue(Reply(status=503), Reply(status=503))
    broker = stub_broker()
    await failed_execution(client, app, settings, t, setup.agent_id, broker)
    await play_notifications(app, settings, broker)  # announced, then a first attempt
    (first_retry,) = sent(broker, "notifications.DQ")
    await make_due(db)

    queues = PollingRedisBroker(url=own_redis_url, work_poll_ms=1000, heartbeat_timeout_s=30)
    queues.declare_queue("notifications")
    async with ticking_while_redis_holds_writes(own_redis_url, 1000) as ticks:
        await deliver(app.state.database, settings, UUID(first_retry.args[0]), broker=queues)
    assert len(receiver.requests) == 2
    assert ticks.count >= 40, ticks.count  # the loop ran meanwhile (about 90; few if blocked)
    (retry,) = held_in_redis(own_redis_url, "notifications.DQ")
    assert retry.args == first_retry.args
    assert 18_000 <= retry.options["eta"] - retry.message_timestamp <= 22_500  # 20 s ± 10 %


async def test_a_redelivery_sends_the_same_webhook_id_and_body_again(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    endpoint = await create_endpoint(client, t, receiver.url, "trigger.execution.failed")
    broker = stub_broker()
    await failed_execution(client, app, settings, t, setup.agent_id, broker)
    await play_notifications(app, settings, broker)
    (row,) = await deliveries(client, t, endpoint["id"])
    assert row["status"] == "succeeded"
    redeliver = endpoints_path(t, endpoint["id"], "deliveries", row["id"], "redeliver")

    response = await client.post(redeliver, headers=t.owner.headers)
    assert response.status_code == 202, response.text
    again = response.json()
    assert (again["id"], again["webhook_id"]) == (row["id"], row["webhook_id"])
    assert (again["status"], again["attempts"]) == ("pending", 0)
    # Still on its way: not twice at once.
    twice = await client.post(redeliver, headers=t.owner.headers)
    assert twice.status_code == 409, twice.text
    # What the API sent once it committed, played as the worker plays it.
    await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)

    first, second = receiver.requests
    assert first.header("webhook-id") == second.header("webhook-id") == row["webhook_id"]
    assert first.body == second.body
    assert verified(endpoint["secret"], second)["type"] == "trigger.execution.failed"
    (done,) = await deliveries(client, t, endpoint["id"])
    assert (done["status"], done["attempts"]) == ("succeeded", 1)

    paused = await client.patch(
        endpoints_path(t, endpoint["id"]), json={"active": False}, headers=t.owner.headers
    )
    assert paused.status_code == 200
    inactive = await client.post(redeliver, headers=t.owner.headers)
    assert inactive.status_code == 409 and "inactive" in inactive.json()["detail"]
    other = await tenant(client)  # another organization: the delivery is not theirs
    assert (await client.post(redeliver, headers=other.owner.headers)).status_code == 404
    log = endpoints_path(other, endpoint["id"], "deliveries")
    assert (await client.get(log, headers=other.owner.headers)).status_code == 404
    for status, listed in (("succeeded", [done]), ("failed", [])):
        response = await client.get(
            endpoints_path(t, endpoint["id"], "deliveries") + f"?status={status}",
            headers=t.owner.headers,
        )
        assert response.json() == {"deliveries": listed, "total": len(listed)}
    theirs = await create_endpoint(client, other, receiver.url)
    under_theirs = endpoints_path(other, theirs["id"], "deliveries", row["id"], "redeliver")
    assert (await client.post(under_theirs, headers=other.owner.headers)).status_code == 404
    assert len(receiver.requests) == 2


# --- the egress policy ----------------------------------------------------------------------------


async def test_an_endpoint_on_a_host_not_allowed_is_refused_and_the_log_names_the_host(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)  # allows 127.0.0.1 only
    # Accepted when saved: the allow-list is checked at each delivery.
    refused = await create_endpoint(
        client, t, "http://hooks.not-allowed.example/spar", "trigger.execution.failed"
    )
    broker = stub_broker()
    await failed_execution(client, app, settings, t, setup.agent_id, broker)
    await play_notifications(app, settings, broker)

    (row,) = await deliveries(client, t, refused["id"])
    assert (row["status"], row["attempts"], row["last_response_code"]) == ("pending", 1, None)
    assert (
        "'hooks.not-allowed.example' is not on the organization's allowed domains"
        in (row["last_error"])
    )
    assert "hooks.not-allowed.example" in caplog.text and row["id"] in caplog.text
    assert receiver.requests == []


async def test_an_endpoint_at_a_private_address_is_refused_unless_private_egress_is_allowed(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
) -> None:
    public_only = msgspec.structs.replace(settings, egress_allow_private=False)
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    endpoint = await create_endpoint(client, t, receiver.url, "trigger.execution.failed")
    broker = stub_broker()
    await failed_execution(client, app, settings, t, setup.agent_id, broker)
    await play_notifications(app, public_only, broker)

    (row,) = await deliveries(client, t, endpoint["id"])
    assert row["status"] == "pending"
    assert "resolves to 127.0.0.1, a private or reserved address" in row["last_error"]
    assert receiver.requests == []


# --- giving up and disabling ----------------------------------------------------------------------


async def test_an_endpoint_failing_for_24_hours_is_disabled_and_says_why(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    with FakeServer(Reply(status=500, body="down")) as down:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        endpoint = await create_endpoint(client, t, down.url, "trigger.execution.failed")
        one = endpoints_path(t, endpoint["id"])
        broker = stub_broker()
        for _ in range(2):
            await failed_execution(client, app, settings, t, setup.agent_id, broker)
        await play_notifications(app, settings, broker)
        assert len(down.requests) == 2
        failing_since = await db.scalar(select(WebhookEndpoint.failing_since))
        await db.commit()
        assert failing_since is not None
        # A day of failures later (set, not slept).
        await db.execute(
            update(WebhookEndpoint).values(failing_since=utcnow() - timedelta(hours=24, minutes=1))
        )
        await make_due(db)
        first, second = (UUID(r["id"]) for r in await deliveries(client, t, endpoint["id"]))
        await deliver(app.state.database, settings, first, broker=broker)
        # The other one ended with the endpoint: never attempted again.
        await deliver(app.state.database, settings, second, broker=broker)
        assert len(down.requests) == 3

    body = (await client.get(one, headers=t.owner.headers)).json()
    assert body["active"] is False
    assert body["disabled_reason"].startswith("disabled after 24 hours of failed deliveries")
    assert "answered 500" in body["disabled_reason"]
    assert body["disabled_at"] is not None
    logged = await deliveries(client, t, endpoint["id"])
    assert [d["status"] for d in logged] == ["failed", "failed"]
    assert all(d["next_attempt_at"] is None for d in logged)
    assert {d["last_error"] for d in logged} >= {body["disabled_reason"]}

    # Turned back on by hand: it starts afresh, and is sent what happens next.
    back = await client.patch(one, json={"active": True}, headers=t.owner.headers)
    assert back.json()["active"] is True and back.json()["disabled_reason"] is None
    assert back.json()["disabled_at"] is None
    assert await db.scalar(select(WebhookEndpoint.failing_since)) is None
    await db.commit()
    with FakeServer(Reply(status=200)) as up:
        await client.patch(one, json={"url": up.url}, headers=t.owner.headers)
        await failed_execution(client, app, settings, t, setup.agent_id, broker)
        await play_notifications(app, settings, broker)
        assert len(up.requests) == 1


async def test_a_delivery_past_its_24_hours_of_retries_ends_failed(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    with FakeServer(Reply(status=502)) as down:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        endpoint = await create_endpoint(client, t, down.url, "trigger.execution.failed")
        broker = stub_broker()
        await failed_execution(client, app, settings, t, setup.agent_id, broker)
        await play_notifications(app, settings, broker)
        await make_due(db, retry_until=utcnow())
        (row,) = await deliveries(client, t, endpoint["id"])
        await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)
        await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)
        assert len(down.requests) == 2
    (done,) = await deliveries(client, t, endpoint["id"])
    assert (done["status"], done["attempts"], done["last_response_code"]) == ("failed", 2, 502)
    assert done["next_attempt_at"] is None and done["completed_at"] is not None
    # One failed delivery does not disable its endpoint.
    assert (await client.get(endpoints_path(t, endpoint["id"]), headers=t.owner.headers)).json()[
        "active"
    ] is True


def test_retries_start_within_seconds_grow_fourfold_and_are_capped() -> None:
    for attempts, seconds in ((1, 5), (2, 20), (3, 80), (4, 320)):
        assert seconds * 0.9 <= retry_delay(attempts).total_seconds() <= seconds * 1.1
    assert retry_delay(30).total_seconds() <= MAX_RETRY_S * 1.1
    # As slow as the jitter allows, a day of retries stays within the delivery bound.
    elapsed, attempts = 0.0, 0
    while elapsed <= 24 * 3600:
        attempts += 1
        elapsed += retry_delay(attempts).total_seconds() / 1.1 * 0.9
    assert attempts < WEBHOOK_DELIVERIES.max_deliveries


async def test_deactivating_an_endpoint_ends_its_pending_deliveries_and_it_is_sent_nothing(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    with FakeServer(Reply(status=500)) as down:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        endpoint = await create_endpoint(client, t, down.url, "trigger.execution.failed")
        broker = stub_broker()
        await failed_execution(client, app, settings, t, setup.agent_id, broker)
        await play_notifications(app, settings, broker)
        one = endpoints_path(t, endpoint["id"])
        await client.patch(one, json={"active": False}, headers=t.owner.headers)
        (row,) = await deliveries(client, t, endpoint["id"])
        assert (row["status"], row["last_error"]) == ("failed", "the endpoint was deactivated")
        await make_due(db)
        await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)
        # Nobody listens now: nothing is recorded for the next failure.
        await failed_execution(client, app, settings, t, setup.agent_id, broker)
        assert sent(broker) == []
        assert len(down.requests) == 1
    assert await db.scalar(select(func.count()).select_from(NotificationEvent)) == 1
    await db.commit()


# --- the sweeper ----------------------------------------------------------------------------------


async def test_the_sweeper_sends_a_due_delivery_whose_message_is_lost_and_no_other(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    with FakeServer(Reply(status=500)) as down:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        endpoint = await create_endpoint(client, t, down.url, "trigger.execution.failed")
        broker = stub_broker()
        await failed_execution(client, app, settings, t, setup.agent_id, broker)
        await play_notifications(app, settings, broker)
    (row,) = await deliveries(client, t, endpoint["id"])
    long_ago = utcnow() - timedelta(minutes=5)
    for next_attempt_at, expected in ((utcnow() + timedelta(hours=1), []), (long_ago, [row["id"]])):
        await db.execute(
            update(WebhookDelivery).values(next_attempt_at=next_attempt_at, updated_at=long_ago)
        )
        await db.commit()
        swept = stub_broker()
        await sweep(app.state.database, swept, settings)
        assert [m.args[0] for m in sent(swept)] == expected


# --- the events at their sources ------------------------------------------------------------------


async def test_a_batch_completing_records_batch_completed_with_its_summary_and_page(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
    db: AsyncSession,
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, "greets", tags=["suite"])
    await make_scenario(client, w, "fails", tags=["suite"], turns=[_failing_turn()])
    # Nobody listens yet: the batch completes and nothing is recorded.
    unheard = await create_batch(client, w, tags=["suite"])
    await drain(app, settings, unheard["id"])
    assert await db.scalar(select(func.count()).select_from(NotificationEvent)) == 0
    await db.commit()

    endpoint = await create_endpoint(client, w.t, receiver.url, "batch.completed")
    batch = await create_batch(client, w, tags=["suite"])
    await drain(app, settings, batch["id"])
    # Recorded by the statement that completed the batch, with no message: the sweeper's.
    event = await db.scalar(select(NotificationEvent))
    await db.commit()
    assert event is not None
    assert (event.type, event.subject_id, event.status) == (
        "batch.completed",
        UUID(batch["id"]),
        "pending",
    )
    await db.execute(update(NotificationEvent).values(updated_at=utcnow() - timedelta(minutes=1)))
    await db.commit()
    broker = stub_broker()
    await sweep(app.state.database, broker, settings)
    assert await play_notifications(app, settings, broker) == 2  # announced, then delivered

    (request,) = receiver.requests
    payload = verified(endpoint["secret"], request)
    assert payload["type"] == "batch.completed"
    summary = payload["data"]["batch_run"]
    assert summary["id"] == batch["id"] and summary["status"] == "completed"
    counts = [summary[k] for k in ("total_scenarios", "passed_scenarios", "failed_scenarios")]
    assert counts == [2, 1, 1]
    assert summary["pass_rate"] == 0.5
    assert payload["data"]["links"]["ui"] == (
        f"{settings.public_base_url}/ui/orgs/{w.t.id}/batches/{batch['id']}"
    )
    assert (await deliveries(client, w.t, endpoint["id"]))[0]["status"] == "succeeded"


def _failing_turn() -> dict[str, Any]:
    return {
        "user_message": "hello",
        "criteria": [{"question": "never-said", "criteria_type": "contains"}],
    }


@pytest.mark.parametrize(("repetitions", "sent_one"), [(4, 1), (1, 0)])
async def test_batch_regressed_is_sent_only_for_a_significant_regression(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    receiver: FakeServer,
    repetitions: int,
    sent_one: int,
) -> None:
    """A batch whose scenario passed every run of its baseline and fails every one of its
    own: with 4 runs a side that is significant (one-sided Fisher, p = 1/70) and
    ``batch.regressed`` goes out once the comparison is stored (by the first read of the
    batch's detail here; the sweeper announces what that recorded); with 1 run a side
    (p = 1/2) it is not, and nothing goes."""
    said = {"reply": "hello there"}
    with FakeAgent(reply=lambda body: said["reply"]) as changing:
        w = await make_world(client, changing)
        await make_scenario(client, w, "greets", tags=["suite"])
        endpoint = await create_endpoint(client, w.t, receiver.url, "batch.regressed")
        baseline = await create_batch(client, w, tags=["suite"], repetitions=repetitions)
        await drain(app, settings, baseline["id"])
        said["reply"] = "goodbye"
        batch = await create_batch(
            client, w, tags=["suite"], repetitions=repetitions, baseline_batch_id=baseline["id"]
        )
        await drain(app, settings, batch["id"])
        # The first read of its detail stores the comparison (a GET: each statement commits
        # on its own, so the event is recorded by the very statement that stores it).
        read = await get_batch(client, w, batch["id"])
    assert read["comparison"]["significant_regressions"] == sent_one
    assert await store_due(app.state.database) == 0
    await announce_recorded(app, settings, stub_broker())

    assert len(receiver.requests) == sent_one
    if sent_one:
        payload = verified(endpoint["secret"], receiver.requests[0])
        assert payload["type"] == "batch.regressed"
        comparison = payload["data"]["comparison"]
        assert comparison["baseline_batch_run_id"] == baseline["id"]
        assert comparison["significant_regressions"] == 1
        (scenario,) = comparison["scenarios"]
        assert (scenario["scenario_name"], scenario["change"]) == ("greets", "regressed")
        assert (scenario["a_passes"], scenario["b_passes"]) == (4, 0)
        assert scenario["p_value"] == pytest.approx(1 / 70)
        assert payload["data"]["batch_run"]["id"] == batch["id"]
        assert payload["data"]["links"]["ui"].endswith(f"/batches/{batch['id']}")


async def test_a_nightly_suite_that_regresses_against_the_night_before_posts_batch_regressed(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    receiver: FakeServer,
) -> None:
    """A nightly ``batch_run`` trigger (4 runs of each scenario): the first night passes,
    the second the agent has changed and every run fails; its batch takes the first night's
    as baseline, and once the sweeper stores the comparison a signed ``batch.regressed``
    names the scenario, p = 1/70."""
    said = {"reply": "hello there"}
    with FakeAgent(reply=lambda body: said["reply"]) as changing:
        w = await make_world(client, changing)
        await make_scenario(client, w, "greets", tags=["nightly"])
        endpoint = await create_endpoint(client, w.t, receiver.url, "batch.regressed")
        trigger = await create(
            client,
            w.t,
            scheduled(w.agent_id, action="batch_run", tags=["nightly"], repetitions=4),
        )
        nights = []
        for reply in ("hello there", "goodbye"):
            said["reply"] = reply
            fired = await client.post(trigger_path(w.t, trigger["id"], "fire"), headers=w.headers)
            execution = UUID(fired.json()["id"])
            await execute(app.state.database, settings, execution, broker=stub_broker())
            done = await client.get(
                trigger_path(w.t, trigger["id"], "executions", str(execution)), headers=w.headers
            )
            nights.append(done.json()["batch_run_id"])
            await drain(app, settings, nights[-1])
    assert await store_due(app.state.database) == 1  # the second night's: the first has none
    await announce_recorded(app, settings, stub_broker())

    (request,) = receiver.requests
    payload = verified(endpoint["secret"], request)
    assert payload["type"] == "batch.regressed"
    assert payload["data"]["batch_run"]["id"] == nights[1]
    comparison = payload["data"]["comparison"]
    assert comparison["baseline_batch_run_id"] == nights[0]
    (scenario,) = comparison["scenarios"]
    assert (scenario["scenario_name"], scenario["a_passes"], scenario["b_passes"]) == (
        "greets",
        4,
        0,
    )
    assert scenario["p_value"] == pytest.approx(1 / 70) and scenario["significant"]


async def test_a_calibration_completing_sends_calibration_completed_with_its_agreement(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
) -> None:
    with FakeOpenAI(reply=verdict_from_marker) as judge:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url, judge.url)
        endpoint = await create_endpoint(client, t, receiver.url, "calibration.completed")
        started = await impatient.post(
            f"/v1/orgs/{t.id}/scenarios/calibrate?agent_id={setup.agent_id}",
            json={"examples": EXAMPLES},
            headers=t.owner.headers,
        )
        assert started.status_code == 202, started.text
        calibration_id = started.json()["id"]
        broker = stub_broker()
        await judge_examples(app.state.database, settings, UUID(calibration_id), broker=broker)
        await play_notifications(app, settings, broker)

    (request,) = receiver.requests
    payload = verified(endpoint["secret"], request)
    assert payload["type"] == "calibration.completed"
    summary = payload["data"]["calibration"]
    read = await client.get(
        f"/v1/orgs/{t.id}/scenarios/calibrations/{calibration_id}", headers=t.owner.headers
    )
    expected = read.json()
    assert summary["id"] == calibration_id and summary["example_count"] == len(EXAMPLES)
    for key in ("total", "agreements", "agreement_rate", "tpr", "tnr", "kappa", "undecided"):
        assert summary[key] == expected[key], key
    assert "results" not in summary
    assert payload["data"]["links"]["api"].endswith(f"/scenarios/calibrations/{calibration_id}")


async def test_an_event_whose_message_is_lost_is_announced_by_the_sweeper_once(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
    db: AsyncSession,
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    endpoint = await create_endpoint(client, t, receiver.url, "trigger.execution.failed")
    lost = stub_broker()
    await failed_execution(client, app, settings, t, setup.agent_id, lost)
    (message,) = sent(lost)  # ... and never delivered
    # Announced twice over (the sweeper's message and the lost one turning up): once.
    assert await announce_recorded(app, settings, stub_broker()) != []
    await announce_recorded(app, settings, stub_broker())
    await announce(app.state.database, settings, UUID(message.args[0]), broker=stub_broker())
    assert len(receiver.requests) == 1
    assert len(await deliveries(client, t, endpoint["id"])) == 1
    assert await db.scalar(select(NotificationEvent.status)) == "announced"
    await db.commit()


async def test_a_delivery_and_an_event_whose_workers_kept_dying_end_failed(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    receiver: FakeServer,
    db: AsyncSession,
) -> None:
    """Claimed as many times as allowed by deliveries that never finished: the next one
    ends it ``failed`` with the reason, sends nothing, and leaves the endpoint's count."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    endpoint = await create_endpoint(client, t, receiver.url, "trigger.execution.failed")
    broker = stub_broker()
    await failed_execution(client, app, settings, t, setup.agent_id, broker)
    (announce_message,) = sent(broker)
    long_ago = utcnow() - timedelta(hours=1)
    await db.execute(
        update(NotificationEvent).values(
            status="announcing",
            heartbeat_at=long_ago,
            attempts=NOTIFICATION_EVENTS.max_deliveries,
        )
    )
    await db.commit()
    await announce(app.state.database, settings, UUID(announce_message.args[0]), broker=broker)
    event = await db.scalar(select(NotificationEvent))
    await db.commit()
    assert event is not None and event.status == "failed"
    assert event.error == "error: gave up after 5 deliveries that did not finish"

    await failed_execution(client, app, settings, t, setup.agent_id, broker)
    await play_notifications(app, settings, broker)
    (row,) = await deliveries(client, t, endpoint["id"])
    await db.execute(
        update(WebhookDelivery).values(
            status="sending",
            heartbeat_at=long_ago,
            attempts=WEBHOOK_DELIVERIES.max_deliveries,
        )
    )
    await db.commit()
    await deliver(app.state.database, settings, UUID(row["id"]), broker=broker)
    (done,) = await deliveries(client, t, endpoint["id"])
    assert done["status"] == "failed" and done["next_attempt_at"] is None
    assert done["last_error"] == "error: gave up after 40 deliveries that did not finish"
    assert len(receiver.requests) == 1  # the first round's only
    assert await db.scalar(select(WebhookEndpoint.failing_since)) is None
    await db.commit()
