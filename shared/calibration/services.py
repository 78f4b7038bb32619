"""Judge calibration (DESIGN §5.6): labelled examples judged by the agent's judge through
the runs' own judge module (:mod:`shared.llm.judge`), and the agreement measured.

The endpoint records the calibration, sends it to the ``calibration`` actor and waits up
to ``SPAR_CALIBRATION_WAIT_S`` for it.  Recording commits on its own (``start``), ahead of
the request's transaction: the actor must see the row while the request still waits.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import aiohttp
import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared import work
from shared.calibration import schemas
from shared.calibration.schemas import CalibrationStatus
from shared.calibration.stats import Confusion, wilson
from shared.db.engine import Database
from shared.db.models import Agent, Calibration, Criterion, Organization, Scenario, ScenarioTurn
from shared.db.queries import one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.llm.judge import JudgeError, judge
from shared.outbound.configuration import judge_provider_of, load_outbound
from shared.outbound.egress import EgressClient, EgressError
from shared.outbound.services import agent_in_org
from shared.paging import Paging, paginate
from shared.queue import CALIBRATE, send_after_commit
from shared.settings import Settings
from shared.work import CALIBRATIONS

WAIT_POLL_S = 0.1


# --- starting and reading ---------------------------------------------------------------------


async def start(
    database: Database,
    *,
    settings: Settings,
    access: OrgAccess,
    agent_id: UUID,
    body: schemas.CalibrateBody,
    broker: Any,
) -> UUID:
    """Record the calibration ``queued`` and send it to the actor, committed."""
    if len(body.examples) > settings.calibration_max_examples:
        raise InvalidInput(
            ("body", "examples"),
            f"at most {settings.calibration_max_examples} examples per calibration",
            type="too_long",
            ctx={"max_length": settings.calibration_max_examples},
        )
    seen: set[str] = set()
    for index, example in enumerate(body.examples):
        if example.id in seen:
            raise InvalidInput(
                ("body", "examples", str(index), "id"),
                f"example id {example.id!r} is used twice",
                input=example.id,
            )
        seen.add(example.id)
        if (example.criterion_question is None) == (example.criteria_id is None):
            raise InvalidInput(
                ("body", "examples", str(index), "criterion_question"),
                "give criterion_question or criteria_id, not both",
                type="missing" if example.criterion_question is None else "value_error",
            )
    async with database.transaction() as session:
        agent = await agent_in_org(session, access.organization_id, agent_id)
        judge_id = await judge_provider_of(session, access.organization_id, agent.judge_provider_id)
        if judge_id is None:
            raise Conflict(
                "the agent has no judge: set its judge_provider_id or an LLM provider with "
                "is_default_judge"
            )
        criteria = await _criteria(
            session,
            access.organization_id,
            {e.criteria_id for e in body.examples if e.criteria_id is not None},
        )
        missing = {e.criteria_id for e in body.examples if e.criteria_id} - criteria.keys()
        if missing:
            raise NotFound(f"criterion not found: {', '.join(sorted(map(str, missing)))}")
        examples = [_stored(example, criteria) for example in body.examples]
        calibration = Calibration(
            id=uuid.uuid4(),
            organization_id=access.organization_id,
            agent_id=agent.id,
            status=CalibrationStatus.QUEUED,
            examples=msgspec.to_builtins(examples),
            example_count=len(examples),
            criterion_versions={
                str(c.id): criterion_version(
                    c.question, c.few_shot_examples, judge_id, agent.judge_model
                )
                for c, _ in criteria.values()
            },
            criterion_places={str(c.id): place for c, place in criteria.values()},
            judge_provider_id=judge_id,
            judge_model=agent.judge_model,
            attempts=0,
            created_by_user_id=access.principal.user_id,
        )
        session.add(calibration)
        await session.flush()
        send_after_commit(session, broker, CALIBRATE, str(calibration.id))
    return calibration.id


async def _criteria(
    session: AsyncSession, org_id: UUID, ids: set[UUID]
) -> dict[UUID, tuple[Criterion, str]]:
    """The organization's scenario criteria among ``ids``, each with its place in its
    scenario (:func:`place_of`)."""
    if not ids:
        return {}
    rows = await session.execute(
        select(Criterion, ScenarioTurn.scenario_id, ScenarioTurn.order_index)
        .join(ScenarioTurn, ScenarioTurn.id == Criterion.turn_id)
        .join(Scenario, Scenario.id == ScenarioTurn.scenario_id)
        .where(Criterion.id.in_(ids), Scenario.organization_id == org_id)
    )
    return {
        c.id: (c, place_of(scenario_id, turn_index, c.order_index))
        for c, scenario_id, turn_index in rows
    }


def place_of(scenario_id: UUID, turn_index: int, criterion_index: int) -> str:
    """Where a criterion sits in its scenario: kept when an edit gives it a new id."""
    return f"{scenario_id}/{turn_index}/{criterion_index}"


def criterion_version(
    question: str, few_shot_examples: Sequence[Any], judge_id: UUID | None, judge_model: str | None
) -> str:
    """What a calibration of a criterion measured: a hash of its question, its few-shot
    examples and the judge (provider and model) that judged it."""
    identity = [question, list(few_shot_examples or []), str(judge_id), judge_model]
    return hashlib.sha256(msgspec.json.encode(identity)).hexdigest()[:16]


def _stored(
    example: schemas.LabeledExample, criteria: dict[UUID, tuple[Criterion, str]]
) -> schemas.StoredExample:
    criterion = criteria[example.criteria_id][0] if example.criteria_id else None
    return schemas.StoredExample(
        id=example.id,
        user_message=example.user_message,
        agent_response=example.agent_response,
        human_verdict=example.human_verdict,
        criterion_question=criterion.question if criterion else example.criterion_question or "",
        criteria_id=example.criteria_id,
        few_shot_examples=list(criterion.few_shot_examples) if criterion else [],
        tags=list(example.tags),
    )


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


async def get_calibration(
    session: AsyncSession, *, access: OrgAccess, calibration_id: UUID
) -> Calibration:
    return await one_in_org(
        session, Calibration, access.organization_id, calibration_id, "calibration"
    )


async def list_calibrations(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[Calibration], int]:
    query = select(Calibration).where(Calibration.organization_id == access.organization_id)
    return await paginate(session, query, paging, Calibration.created_at.desc(), Calibration.id)


async def criterion_status(
    session: AsyncSession, calibration: Calibration
) -> list[schemas.CriterionCalibration]:
    """Each criterion the calibration measured, stale if it or the agent's judge changed."""
    if not calibration.criterion_versions:
        return []
    ids = {UUID(i) for i in calibration.criterion_versions}
    current = await _criteria(session, calibration.organization_id, ids)
    agent = await session.get(Agent, calibration.agent_id) if calibration.agent_id else None
    judge_id = None
    if agent is not None:
        judge_id = await judge_provider_of(
            session, calibration.organization_id, agent.judge_provider_id
        )
    statuses = []
    for raw_id, version in sorted(calibration.criterion_versions.items()):
        criterion = current[UUID(raw_id)][0] if UUID(raw_id) in current else None
        reason = None
        if criterion is None:
            reason = "the criterion no longer exists (its scenario was edited or deleted)"
        elif agent is None:
            reason = "the agent was deleted"
        elif (
            criterion_version(
                criterion.question, criterion.few_shot_examples, judge_id, agent.judge_model
            )
            != version
        ):
            reason = "the criterion's question or few-shot examples, or the judge, changed"
        statuses.append(
            schemas.CriterionCalibration(
                criteria_id=UUID(raw_id), version=version, stale=reason is not None, reason=reason
            )
        )
    return statuses


async def calibration_read(
    session: AsyncSession, calibration: Calibration, *, with_results: bool = True
) -> schemas.CalibrationRead:
    fields: dict[str, Any] = {
        "id": calibration.id,
        "status": calibration.status,
        "agent_id": calibration.agent_id,
        "example_count": calibration.example_count,
        "created_at": calibration.created_at,
        "completed_at": calibration.completed_at,
        "error": calibration.error,
        "criteria": await criterion_status(session, calibration),
    }
    if calibration.metrics is not None:
        metrics = dict(calibration.metrics)
        if not with_results:
            metrics.pop("results", None)
            metrics.pop("by_tag", None)
        fields |= metrics
    return msgspec.convert(fields, schemas.CalibrationRead)


# --- judging (the calibration actor) ----------------------------------------------------------


def _agreement(decided: Sequence[tuple[str, str]], undecided: int) -> schemas.Agreement:
    confusion = Confusion.of(decided)

    def interval(successes: int, trials: int) -> schemas.Interval:
        low, high = wilson(successes, trials)
        return schemas.Interval(low=round(low, 6), high=round(high, 6))

    return schemas.Agreement(
        total=confusion.total + undecided,
        agreements=confusion.agreements,
        agreement_rate=confusion.agreement_rate,
        true_positives=confusion.true_positives,
        true_negatives=confusion.true_negatives,
        false_positives=confusion.false_positives,
        false_negatives=confusion.false_negatives,
        tpr=confusion.tpr,
        tnr=confusion.tnr,
        kappa=confusion.kappa,
        undecided=undecided,
        agreement_rate_interval=interval(confusion.agreements, confusion.total),
        tpr_interval=interval(confusion.true_positives, confusion.positives),
        tnr_interval=interval(confusion.true_negatives, confusion.negatives),
    )


def measure(
    examples: Sequence[schemas.StoredExample], verdicts: Sequence[tuple[str | None, str]]
) -> schemas.CalibrationMetrics:
    """The metrics of examples and the judge's (verdict, critique) on each (verdict
    ``None``: undecided, counted apart, never as agreement)."""
    results = [
        schemas.CalibrationResultItem(
            example_id=example.id,
            criterion=example.criterion_question,
            human_verdict=example.human_verdict,
            judge_verdict=verdict,
            agrees=verdict == example.human_verdict,
            judge_critique=critique,
        )
        for example, (verdict, critique) in zip(examples, verdicts, strict=True)
    ]

    def of(items: Sequence[schemas.CalibrationResultItem]) -> schemas.Agreement:
        decided = [(r.human_verdict, r.judge_verdict) for r in items if r.judge_verdict]
        return _agreement(decided, sum(1 for r in items if r.judge_verdict is None))

    tags = sorted({tag for example in examples for tag in example.tags})
    by_tag = {
        tag: of([r for r, e in zip(results, examples, strict=True) if tag in e.tags])
        for tag in tags
    }
    overall = of(results)
    return schemas.CalibrationMetrics(
        **msgspec.structs.asdict(overall), results=results, by_tag=by_tag
    )


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
) -> None:
    """Judge every example (at most ``SPAR_CALIBRATION_CONCURRENCY`` at once) with the
    agent's judge and store the metrics.  Idempotent: an ended calibration is left alone,
    and a redelivered one is judged again from the start."""
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
            database, settings, calibration, business_information, version, http=http
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
    egress = EgressClient(outbound.policy, http=http, timeout_s=settings.egress_timeout_s)
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
                )
            except (JudgeError, EgressError) as exc:
                return None, f"undecided: {exc}"[:2000]
            return result.verdict, result.critique

    verdicts = await asyncio.gather(*(one(example) for example in examples))
    metrics = measure(examples, verdicts)
    await _end(
        database,
        calibration_id,
        status=CalibrationStatus.COMPLETED,
        metrics=msgspec.to_builtins(metrics),
    )
