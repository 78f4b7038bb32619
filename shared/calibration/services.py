"""Judge calibration (DESIGN §5.6): recording labelled examples for the agent's judge,
reading calibrations back, and the agreement measured.

The judging itself, and the endpoint's wait for it, are jobs: :mod:`shared.calibration.judging`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.calibration import schemas
from shared.calibration.schemas import CalibrationStatus
from shared.calibration.stats import Confusion, wilson
from shared.db.models import Agent, Calibration, Criterion, Scenario, ScenarioTurn
from shared.db.queries import one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.outbound.configuration import judge_provider_of
from shared.outbound.services import agent_in_org
from shared.paging import Paging, paginate
from shared.queue import CALIBRATE, send_after_commit
from shared.settings import Settings

# --- starting and reading ---------------------------------------------------------------------


async def start(
    session: AsyncSession,
    *,
    settings: Settings,
    access: OrgAccess,
    agent_id: UUID,
    body: schemas.CalibrateBody,
    broker: Any,
) -> UUID:
    """Record the calibration ``queued``, sent to the actor once the caller commits."""
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
    agent = await agent_in_org(session, org_id=access.organization_id, agent_id=agent_id)
    judge_id = await judge_provider_of(
        session, org_id=access.organization_id, own=agent.judge_provider_id
    )
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
                c.question,
                c.few_shot_examples,
                judge_id,
                agent.judge_model,
                conversation=c.scenario_id is not None,
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
    """The organization's scenario criteria among ``ids`` (a turn's, or a conversation
    criterion), each with its place in its scenario (:func:`place_of`)."""
    if not ids:
        return {}
    scenario_id = func.coalesce(ScenarioTurn.scenario_id, Criterion.scenario_id)
    rows = await session.execute(
        select(Criterion, scenario_id, ScenarioTurn.order_index)
        .outerjoin(ScenarioTurn, ScenarioTurn.id == Criterion.turn_id)
        .join(Scenario, Scenario.id == scenario_id)
        .where(Criterion.id.in_(ids), Scenario.organization_id == org_id)
    )
    return {
        c.id: (c, place_of(scenario, turn_index, c.order_index)) for c, scenario, turn_index in rows
    }


def place_of(scenario_id: UUID, turn_index: int | None, criterion_index: int) -> str:
    """Where a criterion sits in its scenario (``turn_index`` ``None``: among its
    conversation criteria): kept when an edit gives it a new id."""
    turn = "conversation" if turn_index is None else turn_index
    return f"{scenario_id}/{turn}/{criterion_index}"


def criterion_version(
    question: str,
    few_shot_examples: Sequence[Any],
    judge_id: UUID | None,
    judge_model: str | None,
    *,
    conversation: bool = False,
) -> str:
    """What a calibration of a criterion measured: a hash of its question, its few-shot
    examples, whether it is asked of a whole conversation, and the judge (provider and
    model) that judged it."""
    identity = [question, list(few_shot_examples or []), str(judge_id), judge_model]
    if conversation:
        identity.append("conversation")
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
        conversation=criterion is not None and criterion.scenario_id is not None,
    )


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
    session: AsyncSession, *, calibration: Calibration
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
            session, org_id=calibration.organization_id, own=agent.judge_provider_id
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
                criterion.question,
                criterion.few_shot_examples,
                judge_id,
                agent.judge_model,
                conversation=criterion.scenario_id is not None,
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
    session: AsyncSession, *, calibration: Calibration, with_results: bool = True
) -> schemas.CalibrationRead:
    """The calibration's body: its metrics (once completed) at the top level, the
    per-example results and per-tag agreement only ``with_results``."""
    metrics = dict(calibration.metrics or {})
    if not with_results:
        metrics.pop("results", None)
        metrics.pop("by_tag", None)
    return schemas.CalibrationRead.from_row(
        calibration,
        criteria=await criterion_status(session, calibration=calibration),
        **metrics,
    )


# --- measuring: the judge's verdicts against the humans' ---------------------------------------


def _agreement(decided: Sequence[tuple[str, str]], undecided: int) -> schemas.Agreement:
    confusion = Confusion.of(decided)

    def interval(successes: int, trials: int) -> schemas.Interval:
        low, high = wilson(successes, trials)
        return schemas.Interval(low=round(low, 6), high=round(high, 6))

    return schemas.Agreement.from_row(
        confusion,
        total=confusion.total + undecided,
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
