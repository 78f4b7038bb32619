"""The actors of queue ``notifications``: announcing an event (its deliveries recorded) and
attempting a webhook delivery.

Thin: the rules live in :mod:`shared.notifications.announce` and
:mod:`shared.notifications.deliveries`.
"""

from __future__ import annotations

from uuid import UUID

from shared.notifications.announce import announce
from shared.notifications.deliveries import deliver
from shared.runtime import get_runtime
from shared.work import NOTIFICATION_EVENTS, WEBHOOK_DELIVERIES
from workers.broker import broker, unit_actor


@unit_actor(NOTIFICATION_EVENTS, min_backoff=1_000, max_backoff=30_000, time_limit=60 * 1000)
async def announce_event(event_id: str) -> None:
    runtime = get_runtime()
    await announce(runtime.database, runtime.settings, UUID(event_id), broker=broker)


@unit_actor(WEBHOOK_DELIVERIES, min_backoff=1_000, max_backoff=60_000, time_limit=2 * 60 * 1000)
async def deliver_webhook(delivery_id: str) -> None:
    runtime = get_runtime()
    await deliver(
        runtime.database, runtime.settings, UUID(delivery_id), broker=broker, http=runtime.http
    )
