"""Trigger rules (DESIGN §5.7 and §5.8): what a trigger may hold, its webhook secret, the
executions a manual fire or a signed webhook starts, and reading them back.

The scheduler's side (which slots are due, exactly once each) is
:mod:`shared.triggers.firing`; what an execution does, :mod:`shared.triggers.executions`.
Every function here runs in its caller's transaction; an execution it starts is sent to
the ``triggers`` queue once the caller commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import dramatiq
import msgspec
from psycopg import AsyncConnection
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from standardwebhooks import Webhook, WebhookVerificationError

from shared.crypto import secret_box
from shared.db import shapes
from shared.db.base import utcnow
from shared.db.models import Scenario, Trigger, TriggerExecution
from shared.db.queries import InOrg, Parent, all_in_org, one_in_org
from shared.errors import Conflict, InvalidInput, NotFound, Unauthorized
from shared.identity.access import OrgAccess
from shared.identity.accounts import check_timezone
from shared.outbound.services import agent_in_org
from shared.paging import Paging
from shared.queue import RUN_TRIGGER, send_after_commit
from shared.scenarios import templates
from shared.schemas import UnstorableJson, check_json
from shared.security import new_webhook_secret
from shared.settings import Settings
from shared.triggers import schemas
from shared.triggers.schedule import Schedule, ScheduleError, check
from shared.triggers.schemas import ExecutionSource, ExecutionStatus, TriggerStatus

MAX_WEBHOOK_BODY = 256 * 1024
# What a message template may name.  ``payload`` is the webhook's body (or a manual fire's),
# whose shape only the sender knows: its paths are not checked at save.
TEMPLATE_VARIABLES = ("trigger", "now", "payload")


def webhook_url(settings: Settings, trigger_id: UUID) -> str:
    return f"{settings.public_base_url}/v1/hooks/triggers/{trigger_id}"


def template_trigger(trigger: Trigger) -> dict[str, Any]:
    """What a message template sees as ``trigger``."""
    return {
        "id": str(trigger.id),
        "name": trigger.name,
        "type": trigger.trigger_type,
        "agent_id": str(trigger.agent_id),
        "cron_expression": trigger.cron_expression,
        "timezone": trigger.timezone or "UTC",
    }


def schedule_of(trigger: Any) -> Schedule | None:
    """The schedule of a scheduled trigger (checked at save, so it parses): ``trigger`` a
    :class:`Trigger` or a row of :data:`_TRIGGERS`."""
    if trigger.trigger_type != "scheduled" or not trigger.cron_expression:
        return None
    return _schedule(trigger.cron_expression, trigger.timezone or "UTC")


@lru_cache(maxsize=1024)
def _schedule(expression: str, timezone: str) -> Schedule:
    # Parsed once per expression and zone, not per body: a listing computes the next slot
    # of every scheduled trigger on its page, and the parse cost twice what that does.
    return Schedule(expression, timezone)


def trigger_read(
    trigger: Any, settings: Settings, *, secret: str | None = None
) -> schemas.TriggerRead:
    """The body of ``trigger`` (a :class:`Trigger`, or a row of :data:`_TRIGGERS`); with
    ``secret``, the create response's."""
    schedule = schedule_of(trigger)
    next_run_at = None
    if schedule is not None and trigger.status == TriggerStatus.ACTIVE:
        next_run_at = schedule.next_after(max(utcnow(), trigger.schedule_from))
    computed = {"webhook_url": webhook_url(settings, trigger.id), "next_run_at": next_run_at}
    if secret is not None:
        return schemas.TriggerCreated.from_row(trigger, webhook_secret=secret, **computed)
    return schemas.TriggerRead.from_row(trigger, **computed)


# --- the rules a trigger's fields obey ------------------------------------------------------------


async def _check(session: AsyncSession, trigger: Trigger) -> None:
    """Refuse a trigger that could never fire as asked (422), or that names another
    organization's agent or scenario (404).  Runs on the fields as they will be stored."""
    if trigger.trigger_type == "scheduled":
        for field in ("cron_expression", "timezone"):
            if not getattr(trigger, field):
                raise InvalidInput(
                    ("body", field), f"{field} is required for scheduled triggers", type="missing"
                )
    elif trigger.cron_expression is not None:
        raise InvalidInput(
            ("body", "cron_expression"),
            "cron_expression is only for scheduled triggers",
            input=trigger.cron_expression,
        )
    if trigger.timezone is not None:
        check_timezone(trigger.timezone)
    if trigger.cron_expression is not None:
        try:
            check(trigger.cron_expression, trigger.timezone or "UTC")
        except ScheduleError as exc:
            raise InvalidInput(
                ("body", "cron_expression"), str(exc), input=trigger.cron_expression
            ) from None
    await agent_in_org(session, org_id=trigger.organization_id, agent_id=trigger.agent_id)
    if trigger.action == "batch_run":
        if not trigger.scenario_ids and not trigger.tags:
            raise InvalidInput(
                ("body", "scenario_ids"),
                "a batch_run trigger needs scenario_ids and/or tags",
                type="missing",
            )
        await all_in_org(
            session,
            Scenario,
            trigger.organization_id,
            (UUID(i) for i in trigger.scenario_ids),
            "scenario",
        )
    elif trigger.scenario_ids or trigger.tags:
        raise InvalidInput(
            ("body", "action"),
            "scenario_ids and tags are only for batch_run triggers",
            input=trigger.action,
        )
    if not trigger.message:
        if trigger.action == "message":
            raise InvalidInput(
                ("body", "message"), "message is required for message triggers", type="missing"
            )
        return  # a batch_run trigger sends no message
    context = {"trigger": template_trigger(trigger), "now": "", "payload": None}
    problem = templates.problem(trigger.message, context)
    if problem is not None:
        raise InvalidInput(("body", "message"), problem, input=trigger.message)


def _require_scenarios_run(access: OrgAccess, doing: str, *actions: str) -> None:
    """A ``batch_run`` trigger starts batch runs, so whoever makes it start them needs
    ``scenarios:run`` as well as ``triggers:write``, as starting a batch by hand would:
    to create one, change one (into, out of or within ``batch_run``; pausing excepted),
    resume it, fire it, or take a new webhook secret for it.  Pausing and deleting only
    stop it.  The schedule and signed webhooks start what was set up, with no caller."""
    if "batch_run" in actions:
        access.require("scenarios:run", doing)


# --- create, read, change, delete ----------------------------------------------------------------


async def create_trigger(
    session: AsyncSession, *, settings: Settings, access: OrgAccess, body: schemas.TriggerCreate
) -> tuple[Trigger, str]:
    """The trigger, ``active``, and its webhook secret (only ever returned here)."""
    _require_scenarios_run(access, "creating a batch_run trigger", body.action)
    secret = new_webhook_secret()
    now = utcnow()
    trigger = Trigger(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        **body.stored(),
        status=TriggerStatus.ACTIVE,
        webhook_secret_encrypted=secret_box(settings.secret_key).encrypt(secret),
        schedule_from=now,
        created_by_user_id=access.principal.user_id,
        created_at=now,
    )
    await _check(session, trigger)
    session.add(trigger)
    await session.flush()
    return trigger, secret


async def rotate_secret(
    session: AsyncSession,
    *,
    settings: Settings,
    access: OrgAccess,
    trigger_id: UUID,
    body: schemas.RotateSecretBody,
) -> tuple[Trigger, str]:
    """A new webhook secret (returned only here); the one it replaces stays valid for
    ``previous_valid_for_s`` seconds, then never again."""
    trigger = await get_trigger(session, access=access, trigger_id=trigger_id)
    # The secret signs webhooks, and a signed webhook starts the trigger.
    _require_scenarios_run(access, "a new secret for a batch_run trigger", trigger.action)
    secret = new_webhook_secret()
    now = utcnow()
    keep = body.previous_valid_for_s > 0
    trigger.previous_secret_encrypted = trigger.webhook_secret_encrypted if keep else None
    trigger.previous_secret_expires_at = (
        now + timedelta(seconds=body.previous_valid_for_s) if keep else None
    )
    trigger.webhook_secret_encrypted = secret_box(settings.secret_key).encrypt(secret)
    await session.flush()  # updated_at, from the model, for the response
    return trigger, secret


def _secrets(trigger: Trigger, settings: Settings) -> list[str]:
    """The secrets a delivery may be signed with: the current one, and the one before a
    rotation until it expires."""
    box = secret_box(settings.secret_key)
    valid = [box.decrypt(trigger.webhook_secret_encrypted)]
    expires = trigger.previous_secret_expires_at
    if trigger.previous_secret_encrypted and expires is not None and expires > utcnow():
        valid.append(box.decrypt(trigger.previous_secret_encrypted))
    return valid


def _verified(secrets_: list[str], body: bytes, headers: Mapping[str, str]) -> bool:
    for secret in secrets_:
        try:
            Webhook(secret).verify(body, dict(headers), json_parse=False)
        except (WebhookVerificationError, ValueError):  # ValueError: malformed headers, UTF-8
            continue
        return True
    return False


async def get_trigger(session: AsyncSession, *, access: OrgAccess, trigger_id: UUID) -> Trigger:
    return await one_in_org(session, Trigger, access.organization_id, trigger_id, "trigger")


# An organization's triggers as their bodies read them, straight on psycopg: the columns of
# a TriggerRead and the start of the schedule (for its next slot), never the secrets.
_TRIGGERS = InOrg(
    Trigger.__table__,
    [
        *shapes.columns_read(schemas.TriggerRead, Trigger.__table__),
        Trigger.__table__.c.schedule_from,
    ],
    filters=("trigger_type", "status"),
)


async def read_trigger(
    connection: AsyncConnection[Any], *, access: OrgAccess, trigger_id: UUID
) -> Any:
    """The trigger, as :func:`trigger_read` reads it; 404 for another organization's."""
    return await _TRIGGERS.one(connection, access.organization_id, trigger_id, "trigger")


async def list_triggers(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    paging: Paging,
    trigger_type: str | None = None,
    status: str | None = None,
) -> tuple[list[Any], int]:
    """The organization's triggers, oldest first, of the type and in the status given:
    rows which :func:`trigger_read` reads as it reads a :class:`Trigger`."""
    return await _TRIGGERS.read(
        connection, paging, access.organization_id, trigger_type=trigger_type, status=status
    )


async def update_trigger(
    session: AsyncSession, *, access: OrgAccess, trigger_id: UUID, body: schemas.TriggerUpdate
) -> Trigger:
    """Apply the fields sent.  Activating a trigger or changing its schedule starts its
    slots afresh: the time it was paused is not caught up."""
    trigger = await get_trigger(session, access=access, trigger_id=trigger_id)
    was = (trigger.status, trigger.cron_expression, trigger.timezone)
    was_action = trigger.action
    changed = {name for name, value in body.changes().items() if getattr(trigger, name) != value}
    body.apply_to(trigger)
    paused_only = changed <= {"status"} and trigger.status == TriggerStatus.INACTIVE
    if changed and not paused_only:
        _require_scenarios_run(
            access, "changing a trigger that is or becomes batch_run", was_action, trigger.action
        )
    await _check(session, trigger)
    if (trigger.status, trigger.cron_expression, trigger.timezone) != was:
        trigger.schedule_from = utcnow()
    await session.flush()
    return trigger


async def delete_trigger(session: AsyncSession, *, access: OrgAccess, trigger_id: UUID) -> None:
    """Delete it and its executions; its webhook URL answers 404 from now on."""
    await session.delete(await get_trigger(session, access=access, trigger_id=trigger_id))
    await session.flush()


# --- executions -----------------------------------------------------------------------------------


# A trigger's executions as their bodies read them, newest first, straight on psycopg.
_EXECUTIONS = InOrg(
    TriggerExecution.__table__,
    shapes.columns_read(schemas.ExecutionRead, TriggerExecution.__table__),
    filters=("status",),
    newest_first=True,
    parent=Parent(Trigger.__table__, TriggerExecution.__table__.c.trigger_id, "trigger"),
)


async def list_executions(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    trigger_id: UUID,
    paging: Paging,
    status: str | None = None,
) -> tuple[list[Any], int]:
    """The trigger's executions, newest first: rows with an attribute per column.  404 when
    the trigger is not the organization's, in the same statement."""
    return await _EXECUTIONS.read(
        connection, paging, access.organization_id, parent_id=trigger_id, status=status
    )


async def read_execution(
    connection: AsyncConnection[Any], *, access: OrgAccess, trigger_id: UUID, execution_id: UUID
) -> Any:
    """The execution, if it is one of the trigger's in the organization; otherwise 404."""
    execution = await _EXECUTIONS.one(
        connection, access.organization_id, execution_id, "trigger execution"
    )
    if execution.trigger_id != trigger_id:
        raise NotFound("trigger execution not found")
    return execution


def _new_execution(trigger: Trigger, source: ExecutionSource, **fields: Any) -> dict[str, Any]:
    now = utcnow()
    return {
        "id": uuid.uuid4(),
        "trigger_id": trigger.id,
        "organization_id": trigger.organization_id,
        "source": source,
        "status": ExecutionStatus.QUEUED,
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        **fields,
    }


async def fire(
    session: AsyncSession,
    *,
    access: OrgAccess,
    trigger_id: UUID,
    payload: Any = None,
    broker: dramatiq.Broker,
) -> TriggerExecution:
    """A manual test: an execution now, whatever the trigger's status or type."""
    trigger = await get_trigger(session, access=access, trigger_id=trigger_id)
    _require_scenarios_run(access, "firing a batch_run trigger", trigger.action)
    execution = TriggerExecution(**_new_execution(trigger, ExecutionSource.MANUAL, payload=payload))
    session.add(execution)
    await session.flush()
    send_after_commit(session, broker, RUN_TRIGGER, str(execution.id))
    return execution


async def receive_webhook(
    session: AsyncSession,
    *,
    settings: Settings,
    trigger_id: UUID,
    body: bytes,
    headers: Mapping[str, str],
    broker: dramatiq.Broker,
) -> UUID:
    """A delivery to the trigger's webhook URL: the id of the execution it starts.

    Checked in this order: the trigger exists (404), the Standard Webhooks signature and
    timestamp (401), the trigger is active (409), the body is JSON (422).  A ``webhook-id``
    this trigger has seen answers with that delivery's execution and starts nothing."""
    trigger = await session.get(Trigger, trigger_id)
    if trigger is None:
        raise NotFound("trigger not found")
    if not _verified(_secrets(trigger, settings), body, headers):
        raise Unauthorized("invalid webhook signature or timestamp")
    if trigger.status != TriggerStatus.ACTIVE:
        raise Conflict("trigger is inactive")
    webhook_id = headers["webhook-id"]
    if len(webhook_id) > 255:
        raise InvalidInput(("header", "webhook-id"), "webhook-id is longer than 255 characters")
    payload = _payload(body)
    inserted = await session.scalar(
        insert(TriggerExecution)
        .values(_new_execution(trigger, ExecutionSource.WEBHOOK, webhook_id=webhook_id))
        .values(payload=payload)
        .on_conflict_do_nothing(index_elements=["trigger_id", "webhook_id"])
        .returning(TriggerExecution.id)
    )
    if inserted is not None:
        send_after_commit(session, broker, RUN_TRIGGER, str(inserted))
        return inserted
    original = await session.scalar(
        select(TriggerExecution.id).where(
            TriggerExecution.trigger_id == trigger_id, TriggerExecution.webhook_id == webhook_id
        )
    )
    assert original is not None  # the conflicting row: executions are never deleted alone
    return original


def _payload(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidInput(
            ("body",), f"the webhook body is not JSON: {exc}", type="json_invalid"
        ) from None
    try:
        check_json(payload, ("body",))
    except UnstorableJson as exc:
        raise InvalidInput(exc.path, exc.message, type=exc.type, ctx=exc.ctx) from None
    return payload


def local_now(trigger: Trigger, at: datetime | None = None) -> str:
    """``now`` for a message template: ISO 8601 in the trigger's time zone."""
    return (at or datetime.now(UTC)).astimezone(ZoneInfo(trigger.timezone or "UTC")).isoformat()
