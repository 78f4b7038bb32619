"""Attempting a webhook delivery, on the ``notifications`` queue (DESIGN §5.13).

An attempt POSTs the event's Standard Webhooks envelope ``{type, timestamp, data}`` to the
endpoint, signed by the ``standardwebhooks`` package with the endpoint's secret:
``webhook-id`` (the delivery's, the same on every attempt and redelivery),
``webhook-timestamp`` (the attempt's) and ``webhook-signature``.  It goes out through the
egress policy like every call Spar makes (:mod:`shared.outbound.egress`): the host must be
on the organization's allowed domains, private addresses are refused unless
``SPAR_EGRESS_ALLOW_PRIVATE``, one attempt of at most :data:`ATTEMPT_TIMEOUT_S`.

A 2xx answer ends the delivery ``succeeded``.  Anything else (another status, no answer, a
host that is not allowed) is a failed attempt, logged with its reason and kept in the row
(``last_response_code``, at most 1 KiB of ``last_response_body``, ``last_error``), then
retried after :func:`retry_delay`: 5 s, 20 s, 80 s, … four times longer each time, at
most 2 hours apart, ±10 %, for 24 hours from the delivery's first attempt
(``retry_until``); the attempt that would pass them ends it ``failed``.

**Where the schedule lives.**  In the row (``next_attempt_at``), not in the broker: the
claim takes a delivery only once it is due, and the sweeper sends every due delivery whose
message is lost.  A retry due within :data:`SHORT_WAIT_S` is also sent as a delayed
message, so the first retries come within seconds; the hour-long waits are the sweeper's,
and no message waits in a worker's memory for hours, nor is lost with Redis.

**Disabling.**  An endpoint remembers its first failed attempt since its last success
(``failing_since``).  A failed attempt 24 hours after it turns the endpoint off (``active``
false, ``disabled_reason`` and ``disabled_at`` say why and when) and ends its pending
deliveries ``failed``; turning it back on (``PATCH active: true``) starts afresh.

Each attempt is one unit of work (:mod:`shared.work`): claimed (``pending`` and due, to
``sending``), its outcome recorded only while it is still ``sending``, its deliveries
bounded.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import aiohttp
import dramatiq
import msgspec
from sqlalchemy import or_, select, update
from standardwebhooks import Webhook

from shared import work
from shared.crypto import secret_box
from shared.db.base import NOW, utcnow
from shared.db.engine import Database
from shared.db.models import NotificationEvent, WebhookDelivery, WebhookEndpoint
from shared.notifications.schemas import DeliveryStatus
from shared.notifications.services import RETRY_FOR, envelope, fail_pending, webhook_id
from shared.outbound.configuration import load_egress_policy
from shared.outbound.egress import EgressClient, EgressError, Resolver, storable, system_resolver
from shared.queue import DELIVER_WEBHOOK, send_after_commit
from shared.settings import Settings
from shared.work import WEBHOOK_DELIVERIES

log = logging.getLogger("spar.notifications")

ATTEMPT_TIMEOUT_S = 15.0
MAX_LOGGED_BODY = 1024
FIRST_RETRY_S = 5.0
RETRY_FACTOR = 4
MAX_RETRY_S = 2 * 3600.0
JITTER = 0.1
SHORT_WAIT_S = 60.0
DUE_MARGIN_MS = 250
USER_AGENT = "Spar-Webhooks/1"


def retry_delay(attempts: int) -> timedelta:
    """How long after its ``attempts``-th failed attempt a delivery is tried again."""
    base = min(FIRST_RETRY_S * RETRY_FACTOR ** max(attempts - 1, 0), MAX_RETRY_S)
    return timedelta(seconds=base * random.uniform(1 - JITTER, 1 + JITTER))  # noqa: S311


def _where(url: str) -> str:
    """The endpoint as logs and errors name it: no query, which may hold a token."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def _head(body: bytes) -> str:
    """At most :data:`MAX_LOGGED_BODY` bytes of an answer's body, as storable text."""
    text = storable(body[:MAX_LOGGED_BODY].decode("utf-8", errors="replace"))
    while len(text.encode()) > MAX_LOGGED_BODY:  # a character cut in two became U+FFFD
        text = text[:-1]
    return text


@dataclass(frozen=True, slots=True)
class _Answer:
    code: int | None
    body: str | None
    error: str | None

    @property
    def succeeded(self) -> bool:
        return self.code is not None and 200 <= self.code < 300


# A waiting delivery only once it is due; one in flight with a dead heartbeat at once.
_CLAIM = (
    WEBHOOK_DELIVERIES.claim()
    .where(
        or_(
            WebhookDelivery.status != WEBHOOK_DELIVERIES.waiting,
            WebhookDelivery.next_attempt_at <= NOW,
        )
    )
    .returning(WebhookDelivery.id, WebhookDelivery.attempts)
)


async def deliver(
    database: Database,
    settings: Settings,
    delivery_id: UUID,
    *,
    broker: dramatiq.Broker,
    http: aiohttp.ClientSession | None = None,
    resolver: Resolver = system_resolver,
) -> None:
    """Make the attempt of ``delivery_id`` that is due (the ``deliver_webhook`` actor's
    body); nothing for a delivery that has ended, is not due yet, or is in flight."""
    async with database.transaction() as session:
        claimed = (
            await work.execute_claim(session, _CLAIM, settings=settings, unit_id=delivery_id)
        ).one_or_none()
    if claimed is None:
        return

    async def play() -> None:
        await _attempt(database, settings, delivery_id, broker, http, resolver)

    async def give_up(reason: str) -> None:
        # Spar's failure, not the endpoint's: the delivery ends, the endpoint's count stays.
        answer = _Answer(None, None, reason)
        await _record(database, delivery_id, claimed.attempts, answer, broker, final=True)

    await work.perform(
        WEBHOOK_DELIVERIES,
        database,
        settings,
        delivery_id,
        claimed.attempts,
        play=play,
        give_up=give_up,
    )


async def _attempt(
    database: Database,
    settings: Settings,
    delivery_id: UUID,
    broker: dramatiq.Broker,
    http: aiohttp.ClientSession | None,
    resolver: Resolver,
) -> None:
    async with database.transaction() as session:
        row = (
            await session.execute(
                select(WebhookDelivery, WebhookEndpoint, NotificationEvent)
                .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
                .join(NotificationEvent, NotificationEvent.id == WebhookDelivery.event_id)
                .where(WebhookDelivery.id == delivery_id)
            )
        ).one_or_none()
        if row is None:
            return
        delivery, endpoint, event = row
        policy = await load_egress_policy(
            session, settings=settings, org_id=endpoint.organization_id
        )
    answer = await _post(
        endpoint,
        webhook_id(delivery.id),
        msgspec.json.encode(envelope(event)),
        settings=settings,
        egress=EgressClient(
            policy,
            http=http,
            resolver=resolver,
            timeout_s=ATTEMPT_TIMEOUT_S,
            max_attempts=1,  # the retries are this module's, over 24 hours
            organization_id=endpoint.organization_id,
        ),
    )
    await _record(database, delivery_id, delivery.attempts, answer, broker)


async def _post(
    endpoint: WebhookEndpoint, message_id: str, body: bytes, *, settings: Settings, egress: Any
) -> _Answer:
    """One signed POST of ``body``, and what came of it."""
    secret = secret_box(settings.secret_key).decrypt(endpoint.secret_encrypted)
    sent_at = utcnow()
    headers = {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, sent_at, body.decode()),
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
    }
    try:
        # Raw: the bytes signed are the bytes sent.
        response = await egress.request(
            "POST", endpoint.url, json=msgspec.Raw(body), headers=headers, kind="webhook"
        )
    except EgressError as exc:
        return _Answer(None, None, str(exc)[:2000])
    text = _head(response.content)
    code = response.status_code
    error = None if 200 <= code < 300 else f"{_where(endpoint.url)} answered {code}"
    return _Answer(code, text, error)


async def _record(
    database: Database,
    delivery_id: UUID,
    attempts: int,
    answer: _Answer,
    broker: Any,
    *,
    final: bool = False,
) -> None:
    """Record the attempt's outcome (while the delivery is still ``sending``): succeeded,
    due again, or failed; the endpoint's failures counted, and the endpoint disabled after
    24 hours of them.  ``final``: the delivery is given up (:mod:`shared.work`), failed
    whatever the endpoint's state.  Waits out a database that is away: the receiver has
    the delivery."""
    now = utcnow()

    async def once() -> tuple[str, str] | None:
        async with database.transaction() as session:
            endpoint = await session.scalar(
                select(WebhookEndpoint)
                .join(WebhookDelivery, WebhookDelivery.endpoint_id == WebhookEndpoint.id)
                .where(WebhookDelivery.id == delivery_id)
                .with_for_update(key_share=True, of=WebhookEndpoint)
            )
            # The endpoint first, then the delivery: the lock order of every write to both.
            delivery = await session.scalar(
                select(WebhookDelivery).where(WebhookDelivery.id == delivery_id).with_for_update()
            )
            if endpoint is None or delivery is None or delivery.status != DeliveryStatus.SENDING:
                return None  # another delivery ended it
            ended: dict[str, Any] = {
                "last_attempt_at": now,
                "last_response_code": answer.code,
                "last_response_body": answer.body,
                "last_error": answer.error,
            }
            if final:
                failing_since = endpoint.failing_since
            elif answer.succeeded:
                failing_since = None
            else:
                failing_since = endpoint.failing_since or now
            disable = (
                not final
                and endpoint.active
                and failing_since is not None
                and now - failing_since >= RETRY_FOR
            )
            retry_at = None if answer.succeeded else now + retry_delay(attempts)
            if final:
                status, outcome = DeliveryStatus.FAILED, "given up"
            elif answer.succeeded:
                status, outcome = DeliveryStatus.SUCCEEDED, "delivered"
            elif not endpoint.active or disable:
                status, outcome = DeliveryStatus.FAILED, "failed: the endpoint is inactive"
            elif retry_at is not None and retry_at > delivery.retry_until:
                status, outcome = DeliveryStatus.FAILED, f"failed after {attempts} attempts"
            else:
                status, outcome = DeliveryStatus.PENDING, f"retried at {retry_at:%H:%M:%S} UTC"
            if status == DeliveryStatus.PENDING:
                ended.update(status=status, next_attempt_at=retry_at, heartbeat_at=None)
                assert retry_at is not None
                wait_s = (retry_at - utcnow()).total_seconds()
                if wait_s <= SHORT_WAIT_S:
                    # Never before it is due (a claim would find it early and leave it to
                    # the sweeper): rounded up, with a margin for the clocks of two workers.
                    delay_ms = max(math.ceil(wait_s * 1000), 0) + DUE_MARGIN_MS
                    send_after_commit(
                        session, broker, DELIVER_WEBHOOK, str(delivery_id), delay_ms=delay_ms
                    )
            else:
                ended.update(status=status, next_attempt_at=None, completed_at=now)
            await session.execute(
                update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(ended)
            )
            if failing_since != endpoint.failing_since:
                await session.execute(
                    update(WebhookEndpoint)
                    .where(WebhookEndpoint.id == endpoint.id)
                    .values(failing_since=failing_since, updated_at=WebhookEndpoint.updated_at)
                )
            if disable:
                reason = (
                    f"disabled after 24 hours of failed deliveries (failing since "
                    f"{failing_since:%Y-%m-%d %H:%M:%S} UTC); the last: {answer.error}"
                )
                await session.execute(
                    update(WebhookEndpoint)
                    .where(WebhookEndpoint.id == endpoint.id)
                    .values(active=False, disabled_reason=reason, disabled_at=now)
                )
                await fail_pending(session, endpoint_id=endpoint.id, reason=reason)
                log.warning("webhook endpoint %s %s", endpoint.id, reason)
            return outcome, _where(endpoint.url)

    recorded = await work.persist(once)
    if recorded is None:
        return
    outcome, where = recorded
    if answer.succeeded:
        log.info("webhook delivery %s to %s: %s (%s)", delivery_id, where, outcome, answer.code)
        return
    log.warning(
        "webhook delivery %s to %s: attempt %d failed: %s; %s",
        delivery_id,
        where,
        attempts,
        answer.error,
        outcome,
    )
