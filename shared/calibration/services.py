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
from psycopg import AsyncConnection
from sqlalchemy import Text, cast, func, literal, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import UUID as PostgresUUID
from sqlalchemy.ext.asyncio import AsyncSession

from shared.calibration import schemas
from shared.calibration.schemas import CalibrationStatus
from shared.calibration.stats import Confusion, wilson
from shared.db.models import Agent, Calibration, Criterion, LLMProvider, Scenario, ScenarioTurn
from shared.db.queries import InOrg
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.outbound.configuration import judge_provider_of
from shared.outbound.services import agent_in_org
from shared.paging import Paging
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


# A criterion's version now, by (criterion id, judge provider id, judge model): within one
# statement's rows a criterion's question and examples are the same in every row, so a
# page of calibrations of the same criteria and judge hashes each once.
_Versions = dict[tuple[str, str | None, str | None], str]


def _criterion_statuses(row: Any, versions: _Versions) -> list[schemas.CriterionCalibration]:
    """Each criterion a calibration measured (``row.criterion_versions``), stale if it is no
    longer among the organization's criteria (``row.criteria_now``), if the agent is gone
    (``row.judge_now`` null), or if its question, its few-shot examples or the judge changed
    since: what :func:`_calibration_reads` reads of a calibration.  ``versions``: the
    versions now already worked out from the same statement's rows, added to."""
    current = row.criteria_now or {}  # by the id's text, as criterion_versions
    judge = row.judge_now
    statuses = []
    for raw_id, version in sorted(row.criterion_versions.items()):
        criterion = current.get(raw_id)
        reason = None
        if criterion is None:
            reason = "the criterion no longer exists (its scenario was edited or deleted)"
        elif judge is None:
            reason = "the agent was deleted"
        else:
            key = (raw_id, judge["provider_id"], judge["model"])
            now = versions.get(key)
            if now is None:
                now = versions[key] = criterion_version(
                    criterion["question"],
                    criterion["few_shot_examples"],
                    UUID(judge["provider_id"]) if judge["provider_id"] else None,
                    judge["model"],
                    conversation=criterion["conversation"],
                )
            if now != version:
                reason = "the criterion's question or few-shot examples, or the judge, changed"
        statuses.append(
            schemas.CriterionCalibration(
                criteria_id=UUID(raw_id), version=version, stale=reason is not None, reason=reason
            )
        )
    return statuses


# --- reading, straight on psycopg: a calibration's body and what its staleness needs, in
# one statement (for a listing, one statement for the whole page)

_CALIBRATIONS = Calibration.__table__


def _judge_now() -> Any:
    """``{provider_id, model}``: the judge the calibration's agent uses now, its own
    provider else the organization's default judge (:func:`judge_provider_of`); NULL when
    the agent is gone."""
    agents, providers = Agent.__table__, LLMProvider.__table__
    default = (
        select(providers.c.id)
        .where(
            providers.c.organization_id == _CALIBRATIONS.c.organization_id,
            providers.c.is_default_judge,
        )
        .order_by(providers.c.created_at, providers.c.id)
        .limit(1)
        .correlate(_CALIBRATIONS)  # two levels down: not found by SQLAlchemy on its own
        .scalar_subquery()
    )
    return (
        select(
            func.jsonb_build_object(
                "provider_id",
                func.coalesce(agents.c.judge_provider_id, default),
                "model",
                agents.c.judge_model,
            )
        )
        .where(agents.c.id == _CALIBRATIONS.c.agent_id)
        .scalar_subquery()
    )


def _criteria_now() -> Any:
    """``{criterion id: {question, few_shot_examples, conversation}}`` of the criteria the
    calibration measured that are still the organization's (as :func:`_criteria` finds
    them), each read down its primary key; NULL when there is none."""
    criteria, turns, scenarios = Criterion.__table__, ScenarioTurn.__table__, Scenario.__table__
    measured = select(
        cast(func.jsonb_object_keys(_CALIBRATIONS.c.criterion_versions), PostgresUUID)
    ).correlate(_CALIBRATIONS)  # two levels down, as the default judge above
    scenario_id = func.coalesce(turns.c.scenario_id, criteria.c.scenario_id)
    return (
        select(
            func.jsonb_object_agg(
                criteria.c.id,
                func.jsonb_build_object(
                    "question",
                    criteria.c.question,
                    "few_shot_examples",
                    criteria.c.few_shot_examples,
                    "conversation",
                    criteria.c.scenario_id.is_not(None),
                ),
            )
        )
        .select_from(
            criteria.outerjoin(turns, turns.c.id == criteria.c.turn_id).join(
                scenarios, scenarios.c.id == scenario_id
            )
        )
        .where(
            criteria.c.id.in_(measured),
            scenarios.c.organization_id == _CALIBRATIONS.c.organization_id,
        )
        .scalar_subquery()
    )


def _calibration_reads(*, with_results: bool) -> InOrg:
    """The organization's calibrations as their bodies read them: the columns shown, the
    metrics (``with_results``: with the per-example results and per-tag agreement, which
    can be long), and what their criteria's staleness is decided by."""
    c = _CALIBRATIONS.c
    metrics: Any = c.metrics
    if not with_results:
        for left_out in ("results", "by_tag"):
            metrics = metrics.op("-", return_type=JSONB())(literal(left_out, Text()))
    return InOrg(
        _CALIBRATIONS,
        [
            c.id,
            c.status,
            c.agent_id,
            c.example_count,
            c.created_at,
            c.completed_at,
            c.error,
            metrics.label("metrics"),
            c.criterion_versions,
            _judge_now().label("judge_now"),
            _criteria_now().label("criteria_now"),
        ],
        newest_first=True,
    )


_CALIBRATION = _calibration_reads(with_results=True)
_CALIBRATION_PAGES = _calibration_reads(with_results=False)


def _body(row: Any, versions: _Versions) -> schemas.CalibrationRead:
    """A calibration's body from its row (:func:`_calibration_reads`)."""
    return schemas.CalibrationRead.from_row(
        row, criteria=_criterion_statuses(row, versions), **(row.metrics or {})
    )


async def read_calibration(
    connection: AsyncConnection[Any], *, access: OrgAccess, calibration_id: UUID
) -> schemas.CalibrationRead:
    """A calibration: its status, its metrics and results once completed, its criteria's
    staleness; 404 for another organization's."""
    row = await _CALIBRATION.one(connection, access.organization_id, calibration_id, "calibration")
    return _body(row, {})


async def list_calibrations(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[list[schemas.CalibrationRead], int]:
    """A page of the organization's calibrations, newest first, without per-example
    results or per-tag agreement."""
    rows, total = await _CALIBRATION_PAGES.read(connection, paging, access.organization_id)
    versions: _Versions = {}
    return [_body(row, versions) for row in rows], total


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
