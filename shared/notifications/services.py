"""Webhook endpoints and their delivery logs (DESIGN §5.13): what an endpoint may hold, its
signing secret, reading deliveries back and sending one again.

An endpoint's host is not checked against the organization's allowed domains when it is
saved: the allow-list may change in either order, and what counts is the call.  Each
delivery goes through the egress policy (:mod:`shared.notifications.deliveries`); one to a
host that is not allowed fails its attempt, naming the host in its ``last_error``, and is
retried as any failed attempt is.

Every function here runs in its caller's transaction; a delivery it sends again goes to the
``notifications`` queue once the caller commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import dramatiq
from psycopg import AsyncConnection
from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.crypto import secret_box
from shared.db import shapes
from shared.db.base import utcnow
from shared.db.models import NotificationEvent, WebhookDelivery, WebhookEndpoint
from shared.db.queries import CountedPage, InOrg, Parent, one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.notifications import schemas
from shared.notifications.schemas import DeliveryStatus
from shared.outbound.services import check_url
from shared.paging import Paging
from shared.queue import DELIVER_WEBHOOK, send_after_commit
from shared.security import new_webhook_secret
from shared.settings import Settings

# How long a delivery is retried for, from its first attempt (or its redelivery).
RETRY_FOR = timedelta(hours=24)
DEACTIVATED = "the endpoint was deactivated"


def _check_url(url: str) -> None:
    check_url(url, ("body", "url"))
    if urlsplit(url).username is not None:
        raise InvalidInput(
            ("body", "url"),
            "URLs with user info are refused: the receiver verifies the signature instead",
            input=url,
        )


# --- endpoints ------------------------------------------------------------------------------------


async def create_endpoint(
    session: AsyncSession,
    *,
    settings: Settings,
    access: OrgAccess,
    body: schemas.WebhookEndpointCreate,
) -> tuple[WebhookEndpoint, str]:
    """The endpoint and its signing secret (only ever returned here)."""
    _check_url(body.url)
    secret = new_webhook_secret()
    endpoint = WebhookEndpoint(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        url=body.url,
        events=schemas.stored_events(body.events),
        description=body.description,
        active=body.active,
        secret_encrypted=secret_box(settings.secret_key).encrypt(secret),
        created_by_user_id=access.principal.user_id,
    )
    session.add(endpoint)
    await session.flush()
    return endpoint, secret


async def get_endpoint(
    session: AsyncSession, *, access: OrgAccess, endpoint_id: UUID
) -> WebhookEndpoint:
    return await one_in_org(
        session, WebhookEndpoint, access.organization_id, endpoint_id, "webhook endpoint"
    )


# An organization's endpoints as their bodies read them, straight on psycopg: the columns of
# a WebhookEndpointRead, never the signing secret.
_ENDPOINTS = InOrg(
    WebhookEndpoint.__table__,
    shapes.columns_read(schemas.WebhookEndpointRead, WebhookEndpoint.__table__),
)


async def read_endpoint(
    connection: AsyncConnection[Any], *, access: OrgAccess, endpoint_id: UUID
) -> Any:
    """The endpoint, as :class:`schemas.WebhookEndpointRead` reads it; 404 for another
    organization's."""
    return await _ENDPOINTS.one(connection, access.organization_id, endpoint_id, "webhook endpoint")


async def list_endpoints(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await _ENDPOINTS.read(connection, paging, access.organization_id)


async def update_endpoint(
    session: AsyncSession,
    *,
    access: OrgAccess,
    endpoint_id: UUID,
    body: schemas.WebhookEndpointUpdate,
) -> WebhookEndpoint:
    """Apply the fields sent.  Turning an endpoint on clears why it was turned off and its
    failures so far; turning it off ends its pending deliveries ``failed``."""
    endpoint = await get_endpoint(session, access=access, endpoint_id=endpoint_id)
    computed: dict[str, Any] = {}
    if isinstance(body.url, str):
        _check_url(body.url)
    if isinstance(body.events, list):
        computed["events"] = schemas.stored_events(body.events)
    if body.active is True and not endpoint.active:
        computed.update(disabled_reason=None, disabled_at=None, failing_since=None)
    elif body.active is False and endpoint.active:
        # The endpoint's row before its deliveries', as an attempt's outcome takes them.
        await session.execute(
            select(WebhookEndpoint.id)
            .where(WebhookEndpoint.id == endpoint.id)
            .with_for_update(key_share=True)
        )
        await fail_pending(session, endpoint_id=endpoint.id, reason=DEACTIVATED)
    body.apply_to(endpoint, **computed)
    await session.flush()
    return endpoint


async def delete_endpoint(session: AsyncSession, *, access: OrgAccess, endpoint_id: UUID) -> None:
    """Delete it and its delivery log; nothing more is sent to it."""
    await session.delete(await get_endpoint(session, access=access, endpoint_id=endpoint_id))
    await session.flush()


async def fail_pending(session: AsyncSession, *, endpoint_id: UUID, reason: str) -> int:
    """End the endpoint's deliveries waiting for an attempt ``failed``, with ``reason``: the
    number ended.  One in flight ends by its attempt's outcome."""
    ended = await session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.endpoint_id == endpoint_id,
            WebhookDelivery.status == DeliveryStatus.PENDING,
        )
        .values(
            status=DeliveryStatus.FAILED,
            last_error=reason,
            next_attempt_at=None,
            completed_at=utcnow(),
        )
        .returning(WebhookDelivery.id)
    )
    return len(ended.all())


# --- the delivery log -----------------------------------------------------------------------------


def webhook_id(delivery_id: UUID) -> str:
    """A delivery's Standard Webhooks ``webhook-id``: one per event and endpoint, the same
    on every attempt and redelivery."""
    return f"msg_{delivery_id.hex}"


def envelope(event: Any) -> dict[str, Any]:
    """What a delivery of ``event`` (a :class:`NotificationEvent`, or what the delivery
    log reads of one) sends: the Standard Webhooks payload."""
    return {"type": event.type, "timestamp": event.created_at, "data": event.data}


def delivery_read(delivery: Any, event: Any) -> schemas.DeliveryRead:
    """The body of ``delivery`` and its ``event`` (ORM objects, or a row of the delivery
    log and its event's part)."""
    return schemas.DeliveryRead.from_row(
        delivery, webhook_id=webhook_id(delivery.id), payload=envelope(event)
    )


# What a delivery's envelope reads of its event (:func:`envelope`): in the delivery log's
# rows, each column as ``envelope_<name>``.
_ENVELOPE = ("type", "created_at", "data")


def _delivery_listing(in_status: bool) -> CountedPage:
    """An endpoint's deliveries in the organization (``in_status``: those in the status
    ``:p_status``), newest first, each row a :class:`schemas.DeliveryRead`'s columns and
    what its envelope reads of its event (``envelope_*``)."""
    deliveries, events = WebhookDelivery.__table__, NotificationEvent.__table__
    c = deliveries.c
    wanted = (c.organization_id == bindparam("p_org", type_=c.organization_id.type)) & (
        events.c.id == c.event_id
    )
    if in_status:
        wanted &= c.status == bindparam("p_status", type_=c.status.type)
    columns = [
        *shapes.columns_read(schemas.DeliveryRead, deliveries),
        *(events.c[name].label(f"envelope_{name}") for name in _ENVELOPE),
    ]
    endpoint = Parent(WebhookEndpoint.__table__, c.endpoint_id, "webhook endpoint")
    return CountedPage(deliveries, wanted, columns, newest_first=True, parent=endpoint)


# Compiled once: the delivery log is read straight on psycopg (no ORM).
_DELIVERIES = {in_status: _delivery_listing(in_status) for in_status in (False, True)}


async def list_deliveries(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    endpoint_id: UUID,
    paging: Paging,
    status: str | None = None,
) -> tuple[list[tuple[Any, Any]], int]:
    """The endpoint's deliveries with their events, newest first (rows which
    :func:`delivery_read` reads as it reads a delivery and its event).  404 when the
    endpoint is not the organization's, in the same statement."""
    params: dict[str, Any] = {"p_org": access.organization_id, "p_parent": endpoint_id}
    if status is not None:
        params["p_status"] = status
    rows, total = await _DELIVERIES[status is not None].read(connection, paging, **params)
    return [
        (row, SimpleNamespace(**{name: getattr(row, f"envelope_{name}") for name in _ENVELOPE}))
        for row in rows
    ], total


async def redeliver(
    session: AsyncSession,
    *,
    access: OrgAccess,
    endpoint_id: UUID,
    delivery_id: UUID,
    broker: dramatiq.Broker,
) -> tuple[WebhookDelivery, NotificationEvent]:
    """Send an ended delivery again, now: the same body and ``webhook-id``, a new round of
    attempts with 24 hours of retries.  409 while it is still being delivered, or when the
    endpoint is inactive (turn it on first)."""
    endpoint = await get_endpoint(session, access=access, endpoint_id=endpoint_id)
    row = (
        await session.execute(
            select(WebhookDelivery, NotificationEvent)
            .join(NotificationEvent, NotificationEvent.id == WebhookDelivery.event_id)
            .where(WebhookDelivery.id == delivery_id, WebhookDelivery.endpoint_id == endpoint.id)
            .with_for_update(of=WebhookDelivery)
        )
    ).one_or_none()
    if row is None:
        raise NotFound("webhook delivery not found")
    delivery, event = row
    if not endpoint.active:
        raise Conflict("the webhook endpoint is inactive: activate it to redeliver")
    if delivery.status in (DeliveryStatus.PENDING, DeliveryStatus.SENDING):
        raise Conflict("the delivery is still being delivered")
    now = utcnow()
    delivery.status = DeliveryStatus.PENDING
    delivery.attempts = 0
    delivery.next_attempt_at = now
    delivery.retry_until = now + RETRY_FOR
    delivery.completed_at = None
    await session.flush()
    send_after_commit(session, broker, DELIVER_WEBHOOK, str(delivery.id))
    return delivery, event
