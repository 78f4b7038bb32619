"""Judging a calibration (DESIGN §5.6): the jobs around what
:mod:`shared.calibration.services` records.  The ``calibration`` actor judges every
example with the agent's judge, through the runs' own judge module
(:mod:`shared.llm.judge`), and stores the agreement measured; the endpoint records the
calibration and waits up to ``SPAR_CALIBRATION_WAIT_S`` for it.

Recording commits on its own (:func:`calibrate`), ahead of the request's transaction: the
actor must see the row while the request still waits.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import aiohttp
import dramatiq
import msgspec
from sqlalchemy import select

from shared import work
from shared.calibration import schemas, services
from shared.calibration.schemas import CalibrationStatus
from shared.db.engine import Database
from shared.db.models import Calibration, Organization
from shared.errors import NotFound
from shared.identity.access import OrgAccess
from shared.llm.judge import JudgeError, judge
from shared.notifications import outbox
from shared.outbound.configuration import load_outbound
from shared.outbound.egress import EgressClient, EgressError
from shared.outbound.limits import DestinationLimiter
from shared.settings import Settings
from shared.work import CALIBRATIONS

WAIT_POLL_S = 0.1


async def calibrate(
    database: Database,
    *,
    settings: Settings,
    access: OrgAccess,
    agent_id: UUID,
    body: schemas.CalibrateBody,
    broker: dramatiq.Broker,
) -> tuple[UUID, Calibration | None]:
    """Record the calibration and send it to the actor, committed; then wait for it: its
    id, and the calibration once over (``None`` if still judging after
    ``SPAR_CALIBRATION_WAIT_S``)."""
    async with database.transaction() as session:
        calibration_id = await services.start(
            session, settings=settings, access=access, agent_id=agent_id, body=body, broker=broker
        )
    done = await wait(database, calibration_id, seconds=settings.calibration_wait_s)
    return calibration_id, done


async def wait(database: Database, calibration_id: UUID, *, seconds: float) -> Calibration | None:
    """The calibration once it is over (``completed`` or ``failed``), or ``None`` if it
    is still judging after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        async with database.transaction() as session:
            calibration = await session.get(Calibration, calibration_id)
        if calibration is not None and calibration.status in (
            CalibrationStatus.COMPLETED,
            CalibrationStatus.FAILED,
        ):
            return calibration
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(WAIT_POLL_S)


# --- judging (the calibration actor) ----------------------------------------------------------


_CLAIM = CALIBRATIONS.claim().returning(Calibration)


async def _claim(
    database: Database, settings: Settings, calibration_id: UUID
) -> tuple[Calibration, str, int] | None:
    async with database.transaction() as session:
        claimed = (
            await work.execute_claim(
                session,
                select(Calibration).from_statement(_CLAIM),
                settings=settings,
                unit_id=calibration_id,
            )
        ).scalar()
        if claimed is None:
            return None
        row = (
            await session.execute(
                select(Organization.business_information, Organization.outbound_version).where(
                    Organization.id == claimed.organization_id
                )
            )
        ).one()
        return claimed, row.business_information or "", row.outbound_version


async def _end(database: Database, calibration_id: UUID, status: str, **fields: Any) -> None:
    """End a ``running`` calibration (:func:`shared.work.finish`: its verdicts cost the
    judge's calls)."""
    await work.finish(CALIBRATIONS, database, calibration_id, status, **fields)


async def judge_examples(
    database: Database,
    settings: Settings,
    calibration_id: UUID,
    *,
    http: aiohttp.ClientSession | None = None,
    limiter: DestinationLimiter | None = None,
    broker: dramatiq.Broker | None = None,
) -> None:
    """Judge every example (at most ``SPAR_CALIBRATION_CONCURRENCY`` at once) with the
    agent's judge and store the metrics, recording ``calibration.completed`` for the
    organization's webhooks in the same commit (announced through ``broker``, else by the
    sweeper).  Idempotent: an ended calibration is left alone, and a redelivered one is
    judged again from the start."""
    claimed = await _claim(database, settings, calibration_id)
    if claimed is None:
        return
    calibration, business_information, version = claimed

    async def give_up(reason: str) -> None:
        await _end(database, calibration_id, status=CalibrationStatus.FAILED, error=reason)

    await work.perform(
        CALIBRATIONS,
        database,
        settings,
        calibration_id,
        calibration.attempts,
        play=lambda: _judge(
            database,
            settings,
            calibration,
            business_information,
            version,
            http=http,
            limiter=limiter,
            broker=broker,
        ),
        give_up=give_up,
    )


async def _judge(
    database: Database,
    settings: Settings,
    calibration: Calibration,
    business_information: str,
    version: int,
    *,
    http: aiohttp.ClientSession | None,
    limiter: DestinationLimiter | None,
    broker: dramatiq.Broker | None,
) -> None:
    calibration_id = calibration.id
    if calibration.agent_id is None:
        await _end(
            database, calibration_id, status=CalibrationStatus.FAILED, error="the agent was deleted"
        )
        return
    try:
        outbound = await load_outbound(
            database, settings, calibration.organization_id, calibration.agent_id, version
        )
    except NotFound as exc:
        await _end(database, calibration_id, status=CalibrationStatus.FAILED, error=exc.detail)
        return
    if outbound.judge is None:
        await _end(
            database,
            calibration_id,
            status=CalibrationStatus.FAILED,
            error="the agent has no judge",
        )
        return
    examples = msgspec.convert(calibration.examples, list[schemas.StoredExample])
    egress = EgressClient(
        outbound.policy,
        http=http,
        timeout_s=settings.egress_timeout_s,
        limiter=limiter,
        organization_id=calibration.organization_id,
    )
    gate = asyncio.Semaphore(settings.calibration_concurrency)

    async def one(example: schemas.StoredExample) -> tuple[str | None, str]:
        async with gate:
            try:
                result = await judge(
                    egress,
                    outbound.judge,  # type: ignore[arg-type]
                    question=example.criterion_question,
                    conversation=[
                        {"role": "user", "content": example.user_message},
                        {"role": "assistant", "content": example.agent_response},
                    ],
                    few_shot_examples=list(example.few_shot_examples),
                    business_information=business_information,
                    model=outbound.agent.judge_model,
                    whole_conversation=example.conversation,
                )
            except (JudgeError, EgressError) as exc:
                return None, f"undecided: {exc}"[:2000]
            return result.verdict, result.critique

    verdicts = await asyncio.gather(*(one(example) for example in examples))
    metrics = services.measure(examples, verdicts)
    await _end(
        database,
        calibration_id,
        status=CalibrationStatus.COMPLETED,
        metrics=msgspec.to_builtins(metrics),
        then=lambda session: outbox.emit(
            session,
            event_type=outbox.CALIBRATION_COMPLETED,
            organization_id=calibration.organization_id,
            subject_id=calibration_id,
            broker=broker,
        ),
    )
