"""Webhook endpoints through the API, and the ``notifications`` queue played in-process as its
workers play it: events announced, deliveries attempted against a loopback receiver."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from dramatiq import Message
from dramatiq.brokers.stub import StubBroker
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from shared.db.models import NotificationEvent
from shared.notifications.announce import announce
from shared.notifications.deliveries import deliver
from shared.queue import ANNOUNCE_EVENT, DELIVER_WEBHOOK
from shared.settings import Settings
from tests.support.factories import Tenant


def endpoints_path(t: Tenant, *rest: str) -> str:
    return "/".join([f"/v1/orgs/{t.id}/webhook-endpoints", *rest])


async def create_endpoint(
    client: AsyncTestClient, t: Tenant, url: str, *events: str, **fields: Any
) -> dict[str, Any]:
    """An endpoint at ``url`` taking ``events`` (every event when none is named)."""
    chosen = list(events) or [
        "batch.completed",
        "batch.regressed",
        "trigger.execution.failed",
        "calibration.completed",
    ]
    response = await client.post(
        endpoints_path(t),
        json={"url": url, "events": chosen, **fields},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


async def deliveries(client: AsyncTestClient, t: Tenant, endpoint_id: str) -> list[dict[str, Any]]:
    response = await client.get(
        endpoints_path(t, endpoint_id, "deliveries"), headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    return list(response.json()["deliveries"])


def sent(broker: StubBroker, queue: str = "notifications") -> list[Message[Any]]:
    """The messages waiting on ``queue`` of a stub broker (taken off it)."""
    found = []
    pending = broker.queues[queue]
    while not pending.empty():
        found.append(Message.decode(pending.get_nowait()))
    return found


async def play_notifications(app: Litestar, settings: Settings, broker: StubBroker) -> int:
    """Play what waits on the ``notifications`` queue (not its delay queue), and what that
    sends, until nothing is left: the messages played."""
    played = 0
    while messages := sent(broker):
        for message in messages:
            unit = UUID(message.args[0])
            if (message.queue_name, message.actor_name) == ANNOUNCE_EVENT:
                await announce(app.state.database, settings, unit, broker=broker)
            else:
                assert (message.queue_name, message.actor_name) == DELIVER_WEBHOOK, message
                await deliver(app.state.database, settings, unit, broker=broker)
            played += 1
    return played


async def announce_recorded(app: Litestar, settings: Settings, broker: StubBroker) -> list[UUID]:
    """Announce every event still ``pending`` (as the sweeper would have them), then play
    the deliveries that sends: the events' ids."""
    async with app.state.database.transaction() as session:
        pending = list(
            await session.scalars(
                select(NotificationEvent.id).where(NotificationEvent.status == "pending")
            )
        )
    for event_id in pending:
        await announce(app.state.database, settings, event_id, broker=broker)
    await play_notifications(app, settings, broker)
    return pending
