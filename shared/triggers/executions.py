"""What an execution does, on the ``triggers`` queue (DESIGN §5.7): send the trigger's
message to its agent and record the reply, or start a batch run of its suite.

At least once, never twice where it counts:

* the claim (:mod:`shared.work`) moves an execution ``queued`` (or ``running`` with a dead
  heartbeat) to ``running`` and counts the delivery; a finished or missed one, or one a
  live worker is carrying out, is left alone, so a redelivered message does nothing;
* a reply is recorded in the statement that ends the execution, and only if it is still
  ``running``: once the agent's answer is committed, no delivery sends the message again.
  That write waits out a database that is away (a restart, no free connection) instead
  of failing the delivery; a worker dying between the answer and that commit is the one
  case that sends the message twice, under the same ``session_id``, which an agent can
  deduplicate on;
* a batch is created under a lock on the execution row, in the transaction that records
  its id: a second delivery finds the id and creates nothing.  Its baseline is the
  trigger's previous batch (of the same agent), so each night's suite is compared with the
  night before's;
* an execution that ends ``failed`` records ``trigger.execution.failed`` for the
  organization's webhooks in the commit that ends it (:mod:`shared.notifications.outbox`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import aiohttp
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared import work
from shared.batches.schemas import BatchRunCreate
from shared.batches.services import start_batch
from shared.db.base import NOW, utcnow
from shared.db.engine import Database
from shared.db.models import BatchRun, Organization, Trigger, TriggerExecution
from shared.errors import InvalidInput, NotFound
from shared.notifications import outbox
from shared.outbound.agents import call_agent
from shared.outbound.configuration import load_outbound
from shared.outbound.egress import EgressClient, EgressError
from shared.outbound.limits import DestinationLimiter
from shared.scenarios import sandbox
from shared.settings import Settings
from shared.triggers.schemas import ExecutionStatus
from shared.triggers.services import local_now, template_trigger
from shared.work import TRIGGER_EXECUTIONS

log = logging.getLogger("spar.triggers")
MAX_RESPONSE_CHARS = 100_000


@dataclass(frozen=True, slots=True)
class _Claimed:
    execution: TriggerExecution
    trigger: Trigger
    outbound_version: int


_CLAIM = TRIGGER_EXECUTIONS.claim(
    started_at=func.coalesce(TriggerExecution.started_at, NOW)
).returning(TriggerExecution.id)


async def _claim(database: Database, settings: Settings, execution_id: UUID) -> _Claimed | None:
    async with database.transaction() as session:
        claimed = await work.execute_claim(session, _CLAIM, settings=settings, unit_id=execution_id)
        if claimed.scalar() is None:
            return None
        row = (
            await session.execute(
                select(TriggerExecution, Trigger, Organization.outbound_version)
                .join(Trigger, Trigger.id == TriggerExecution.trigger_id)
                .join(Organization, Organization.id == Trigger.organization_id)
                .where(TriggerExecution.id == execution_id)
            )
        ).one()
        return _Claimed(execution=row[0], trigger=row[1], outbound_version=row[2])


async def execute(
    database: Database,
    settings: Settings,
    execution_id: UUID,
    *,
    broker: Any,
    http: aiohttp.ClientSession | None = None,
    limiter: DestinationLimiter | None = None,
) -> None:
    """Carry out the execution ``execution_id`` (the ``triggers`` actor's body), claimed,
    kept alive and given up on as every unit of work is (:mod:`shared.work`)."""
    claimed = await _claim(database, settings, execution_id)
    if claimed is None:
        return

    async def play() -> None:
        if claimed.trigger.action == "batch_run":
            await _start_suite(database, claimed, broker=broker)
        else:
            await _send_message(
                database, settings, claimed, broker=broker, http=http, limiter=limiter
            )

    async def give_up(reason: str) -> None:
        await _fail(database, claimed, broker, error=reason)

    await work.perform(
        TRIGGER_EXECUTIONS,
        database,
        settings,
        execution_id,
        claimed.execution.attempts,
        play=play,
        give_up=give_up,
    )


async def _fail(database: Database, claimed: _Claimed, broker: Any, **values: Any) -> None:
    """End the execution ``failed`` and record ``trigger.execution.failed`` in the same
    commit (:mod:`shared.notifications.outbox`)."""
    await work.finish(
        TRIGGER_EXECUTIONS,
        database,
        claimed.execution.id,
        ExecutionStatus.FAILED,
        then=lambda session: _announce_failure(
            session, claimed.trigger, claimed.execution.id, broker
        ),
        **values,
    )


async def _announce_failure(
    session: AsyncSession, trigger: Trigger, execution_id: UUID, broker: Any
) -> None:
    await outbox.emit(
        session,
        event_type=outbox.TRIGGER_EXECUTION_FAILED,
        organization_id=trigger.organization_id,
        subject_id=execution_id,
        broker=broker,
    )


async def _send_message(
    database: Database,
    settings: Settings,
    claimed: _Claimed,
    *,
    broker: Any,
    http: aiohttp.ClientSession | None,
    limiter: DestinationLimiter | None,
) -> None:
    execution, trigger = claimed.execution, claimed.trigger
    try:
        message = await sandbox.render(
            trigger.message,
            {
                "trigger": template_trigger(trigger),
                "now": local_now(trigger),
                "payload": execution.payload,
            },
        )
    except sandbox.TemplateFailed as exc:
        await _fail(database, claimed, broker, error=f"trigger message template failed: {exc}")
        return
    try:
        outbound = await load_outbound(
            database, settings, trigger.organization_id, trigger.agent_id, claimed.outbound_version
        )
        egress = EgressClient(
            outbound.policy,
            http=http,
            timeout_s=settings.egress_timeout_s,
            limiter=limiter,
            organization_id=trigger.organization_id,
        )
        reply = await call_agent(
            egress,
            outbound.agent,
            session_id=f"spar-trigger-{execution.id}",
            message=message,
            history=[],
            metadata={
                "trigger_id": str(trigger.id),
                "trigger_execution_id": str(execution.id),
                "source": execution.source,
            },
        )
    except (NotFound, EgressError) as exc:
        detail = exc.detail if isinstance(exc, NotFound) else str(exc)
        await _fail(database, claimed, broker, message=message, error=detail[:2000])
        return
    await work.finish(
        TRIGGER_EXECUTIONS,
        database,
        execution.id,
        ExecutionStatus.SUCCEEDED,
        message=message,
        response=reply.content[:MAX_RESPONSE_CHARS],
    )


async def _previous_batch(session: AsyncSession, trigger: Trigger) -> UUID | None:
    """The latest batch the trigger started of its agent (it may have had another): the
    baseline of the next."""
    return await session.scalar(
        select(BatchRun.id)
        .join(TriggerExecution, TriggerExecution.batch_run_id == BatchRun.id)
        .where(TriggerExecution.trigger_id == trigger.id, BatchRun.agent_id == trigger.agent_id)
        .order_by(BatchRun.created_at.desc(), BatchRun.id.desc())
        .limit(1)
    )


async def _start_suite(database: Database, claimed: _Claimed, *, broker: Any) -> None:
    trigger = claimed.trigger
    async with database.transaction() as session:
        execution = await session.scalar(
            select(TriggerExecution)
            .where(TriggerExecution.id == claimed.execution.id)
            .with_for_update()
        )
        if (
            execution is None
            or execution.status != ExecutionStatus.RUNNING
            or execution.batch_run_id is not None
        ):
            return  # another delivery started the suite, or ended the execution
        body = BatchRunCreate(
            agent_id=trigger.agent_id,
            scenario_ids=[UUID(i) for i in trigger.scenario_ids],
            tags=list(trigger.tags),
            max_concurrency=trigger.max_concurrency,
            repetitions=trigger.repetitions,
            baseline_batch_id=await _previous_batch(session, trigger),
        )
        try:
            async with session.begin_nested():
                batch = await start_batch(
                    session,
                    organization_id=trigger.organization_id,
                    user_id=trigger.created_by_user_id,
                    body=body,
                    broker=broker,
                )
        except (NotFound, InvalidInput) as exc:
            execution.status = ExecutionStatus.FAILED
            execution.error = f"could not start the batch run: {exc.detail}"
            await _announce_failure(session, trigger, execution.id, broker)
        else:
            execution.status = ExecutionStatus.SUCCEEDED
            execution.batch_run_id = batch.id
            execution.response = f"batch run {batch.id} of {batch.total_scenarios} scenarios"
        execution.completed_at = utcnow()
