"""Scenario rules: turns and criteria stored in order, and runs started from a snapshot."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import dramatiq
import msgspec
from psycopg import AsyncConnection
from sqlalchemy import (
    CTE,
    ColumnElement,
    FromClause,
    Select,
    Subquery,
    Text,
    Uuid,
    bindparam,
    cast,
    func,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload
from sqlalchemy.orm.attributes import flag_modified

from shared.db import shapes
from shared.db.direct import Statement, read_together
from shared.db.models import (
    Criterion,
    CriterionResult,
    Scenario,
    ScenarioRun,
    ScenarioTurn,
    TurnResult,
)
from shared.db.queries import CountedPage, InOrg
from shared.errors import InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.outbound.services import agent_in_org, provider_in_org
from shared.paging import Paging
from shared.queue import RUN_SCENARIO, send_after_commit
from shared.scenarios import schemas, templates
from shared.scenarios.records import Snapshot, SnapshotCriterion, SnapshotTurn
from shared.scenarios.rules import check_conversation_criteria, check_scenario, check_turns


def _criterion(position: int, criterion: schemas.CriterionCreate, **place: UUID) -> Criterion:
    """A criterion row at ``position``, of a turn (``turn_id``) or of its scenario's whole
    conversation (``scenario_id``, or set by the relationship it is added to)."""
    return Criterion(
        order_index=position,
        question=criterion.question,
        criteria_type=criterion.criteria_type,
        few_shot_examples=[
            {"response": e.response, "verdict": e.verdict, "critique": e.critique}
            for e in criterion.few_shot_examples
        ],
        expected_arguments=criterion.expected_arguments,
        **place,
    )


def _build_turns(scenario_id: UUID, turns: list[schemas.ScenarioTurnCreate]) -> list[ScenarioTurn]:
    built = []
    for index, turn in enumerate(turns):
        turn_id = uuid.uuid4()
        built.append(
            ScenarioTurn(
                id=turn_id,
                scenario_id=scenario_id,
                order_index=index,
                user_message=turn.user_message,
                required=turn.required,
                criteria=[
                    _criterion(position, criterion, turn_id=turn_id)
                    for position, criterion in enumerate(turn.criteria)
                ],
            )
        )
    return built


def _build_conversation_criteria(criteria: list[schemas.CriterionCreate]) -> list[Criterion]:
    return [_criterion(position, criterion) for position, criterion in enumerate(criteria)]


async def _check_simulation(
    session: AsyncSession, access: OrgAccess, simulation: schemas.SimulationCreate | None
) -> None:
    """A simulated user's provider is one of the organization's (404 otherwise, as every
    reference to another organization's row)."""
    if simulation is not None and simulation.provider_id is not None:
        await provider_in_org(
            session, org_id=access.organization_id, provider_id=simulation.provider_id
        )


def _with_turns(query: Select[Any]) -> Select[Any]:
    return query.options(
        selectinload(Scenario.turns).selectinload(ScenarioTurn.criteria),
        selectinload(Scenario.conversation_criteria),
    )


async def get_scenario(
    session: AsyncSession, *, access: OrgAccess, scenario_id: UUID, lock: bool = False
) -> Scenario:
    """The scenario with its turns; with ``lock``, once no other transaction changes it,
    and none can until this one ends (FOR NO KEY UPDATE: runs that merely reference it
    are still created meanwhile)."""
    query = select(Scenario).where(
        Scenario.id == scenario_id, Scenario.organization_id == access.organization_id
    )
    if lock:
        query = query.with_for_update(key_share=True)
    scenario = await session.scalar(_with_turns(query).execution_options(populate_existing=True))
    if scenario is None:
        raise NotFound("scenario not found")
    return scenario


@dataclass(frozen=True, slots=True)
class _Detail:
    """A row of the organization read with its turns, and the items (criteria, verdicts)
    of each turn and of the row's whole conversation: three statements sent at once
    (:func:`shared.db.direct.read_together`), nested as the row's ORM object would hold
    them, for :meth:`shared.schemas.Output.from_row`."""

    row: Statement  # the row ``p_id``, given ``p_org``
    turns: Statement  # its turns, in order
    items: Statement  # the items of its turns and its own, in order
    turn_key: str  # an item's column naming its turn (null for the row's own)
    turns_as: str  # the row's attribute for its turns
    items_as: str  # a turn's attribute for its items
    own_as: str  # the row's attribute for its own items
    missing: str  # the 404's message

    @classmethod
    def of(
        cls,
        columns: list[Any],
        *,
        turns: Any,
        turn_order: str,
        items: Any,
        parent_key: str,
        turn_key: str,
        names: tuple[str, str, str],
        missing: str,
    ) -> _Detail:
        """The detail of the rows ``columns`` are of: ``turns`` and ``items`` (tables)
        name their row by the column ``parent_key``, an item its turn by ``turn_key``;
        ``names``: the attributes for the row's turns, a turn's items and the row's own."""
        row_id = bindparam("p_id", type_=Uuid())
        table = columns[0].table
        in_org = table.c.organization_id == bindparam("p_org", type_=Uuid())
        turn_ids = select(turns.c.id).where(turns.c[parent_key] == row_id)
        # Two selects, not one with an OR and a subquery, which PostgreSQL answers by
        # scanning the whole table (every organization's items): each reads down its index.
        both = union_all(
            select(items).where(items.c[parent_key] == row_id),
            select(items).where(items.c[turn_key].in_(turn_ids)),
        ).subquery("items")
        return cls(
            Statement(select(*columns).where(table.c.id == row_id, in_org)),
            Statement(
                select(turns).where(turns.c[parent_key] == row_id).order_by(turns.c[turn_order])
            ),
            Statement(select(both).order_by(both.c.order_index)),
            turn_key,
            *names,
            missing,
        )

    async def read(self, connection: AsyncConnection[Any], access: OrgAccess, row_id: UUID) -> Any:
        """The row ``row_id``; 404 for another organization's, as for a missing one."""
        found, turns, items = await read_together(
            connection,
            (self.row, {"p_id": row_id, "p_org": access.organization_id}),
            (self.turns, {"p_id": row_id}),
            (self.items, {"p_id": row_id}),
        )
        if not found:
            raise NotFound(self.missing)
        (row,) = found
        on_turn: dict[UUID, list[Any]] = {}
        own: list[Any] = []
        for item in items:
            turn_id = getattr(item, self.turn_key)
            (own if turn_id is None else on_turn.setdefault(turn_id, [])).append(item)
        # The items of a turn committed after the turns were read are left out with it.
        for turn in turns:
            setattr(turn, self.items_as, on_turn.get(turn.id, []))
        setattr(row, self.turns_as, turns)
        setattr(row, self.own_as, own)
        return row


# A scenario as its detail shows it: the scenario, its turns in order, and its criteria
# (its turns' and its conversation's) in order.
_SCENARIO_DETAIL = _Detail.of(
    list(Scenario.__table__.c),
    turns=ScenarioTurn.__table__,
    turn_order="order_index",
    items=Criterion.__table__,
    parent_key="scenario_id",
    turn_key="turn_id",
    names=("turns", "criteria", "conversation_criteria"),
    missing="scenario not found",
)


async def read_scenario(
    connection: AsyncConnection[Any], *, access: OrgAccess, scenario_id: UUID
) -> Any:
    """The scenario with its turns (each with its ``criteria``) and its
    ``conversation_criteria``, for its detail: an object with an attribute per column, as
    :meth:`schemas.ScenarioRead.from_row` reads a :class:`Scenario`.  One round trip,
    without an ORM session (:func:`get_scenario` loads it for a change).  404 for another
    organization's scenario, as for a missing one."""
    return await _SCENARIO_DETAIL.read(connection, access, scenario_id)


async def create_scenario(
    session: AsyncSession, *, access: OrgAccess, body: schemas.ScenarioCreate
) -> Scenario:
    check_scenario(body)
    await _check_simulation(session, access, body.simulation)
    scenario_id = uuid.uuid4()
    scenario = Scenario(
        id=scenario_id,
        organization_id=access.organization_id,
        name=body.name,
        description=body.description,
        tags=list(dict.fromkeys(body.tags)),
        customer_context=body.customer_context,
        created_by_user_id=access.principal.user_id,
        turns=_build_turns(scenario_id, body.turns),
        simulation=msgspec.to_builtins(body.simulation),
        conversation_criteria=_build_conversation_criteria(body.conversation_criteria),
    )
    session.add(scenario)
    await session.flush()
    return await get_scenario(session, access=access, scenario_id=scenario_id)


async def update_scenario(
    session: AsyncSession, *, access: OrgAccess, scenario_id: UUID, body: schemas.ScenarioUpdate
) -> Scenario:
    # Locked: two PUTs replacing the turns at once would each delete the same old turns
    # and insert their own at the same order_index.  One after the other, the last wins.
    scenario = await get_scenario(session, access=access, scenario_id=scenario_id, lock=True)
    context = (
        scenario.customer_context
        if body.customer_context is schemas.UNSET
        else body.customer_context
    )
    if body.simulation is not schemas.UNSET:
        await _check_simulation(session, access, body.simulation)
    if body.conversation_criteria not in (schemas.UNSET, None):
        check_conversation_criteria(body.conversation_criteria)
        scenario.conversation_criteria.clear()
        await session.flush()  # the old criteria go before new order_index rows
        scenario.conversation_criteria.extend(
            _build_conversation_criteria(body.conversation_criteria)
        )
    if body.turns not in (schemas.UNSET, None):
        check_turns(body.turns, context)
        scenario.turns.clear()
        await session.flush()  # old turns (and their criteria) go before new order_index rows
        scenario.turns.extend(_build_turns(scenario.id, body.turns))
    elif body.customer_context is not schemas.UNSET:
        # The turns kept must still render with the new context.
        for turn in scenario.turns:
            problem = templates.problem(turn.user_message, context)
            if problem is not None:
                raise InvalidInput(
                    ("body", "customer_context"),
                    f"turn {turn.order_index}: {problem}",
                    input=body.customer_context,
                )
    body.apply_to(scenario)
    # A PUT changes the scenario even when it only replaces the turns: its row is written,
    # so that the model moves updated_at.
    flag_modified(scenario, "name")
    await session.flush()
    return await get_scenario(session, access=access, scenario_id=scenario_id)


async def delete_scenario(session: AsyncSession, *, access: OrgAccess, scenario_id: UUID) -> None:
    """Delete the scenario; its runs keep their history (they hold a snapshot)."""
    scenario = await get_scenario(session, access=access, scenario_id=scenario_id)
    await session.delete(scenario)
    await session.flush()


def tag_filter(tags: list[str]) -> Any:
    """Scenarios carrying any of ``tags`` (JSONB containment)."""
    return or_(*(Scenario.tags.contains([tag]) for tag in tags))


def _scenario_listing(tagged: bool) -> CountedPage:
    """An organization's scenarios (``tagged``: those carrying the tag ``p_tags`` holds),
    each row a :class:`schemas.ScenarioSummary`'s columns."""
    wanted = Scenario.organization_id == bindparam("p_org", type_=Scenario.organization_id.type)
    if tagged:
        wanted = wanted & Scenario.tags.contains(bindparam("p_tags", type_=JSONB()))
    turn_count = (
        select(func.count(ScenarioTurn.id))
        .where(ScenarioTurn.scenario_id == Scenario.id)
        .scalar_subquery()
    )
    table = Scenario.__table__
    return CountedPage(
        table, wanted, shapes.labeled(schemas.ScenarioSummary, table, turn_count=turn_count)
    )


# Compiled once: the listing runs straight on psycopg (no ORM).
_SCENARIOS = {tagged: _scenario_listing(tagged) for tagged in (False, True)}


async def list_scenarios(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging, tag: str | None
) -> tuple[list[schemas.ScenarioSummary], int]:
    params: dict[str, Any] = {"p_org": access.organization_id}
    if tag is not None:
        params["p_tags"] = [tag]
    rows, total = await _SCENARIOS[tag is not None].read(connection, paging, **params)
    return [schemas.ScenarioSummary.from_row(row) for row in rows], total


async def snapshot_of(session: AsyncSession, *, org_id: UUID, scenario_id: UUID) -> Any | None:
    """The organization's scenario as a run executes it (``None`` if there is none): its
    snapshot, built by :func:`snapshot_source` like a batch's."""
    picked = (
        select(Scenario.id)
        .where(Scenario.id == scenario_id, Scenario.organization_id == org_id)
        .subquery("picked")
    )
    return await session.scalar(select(snapshot_source(picked).c.snapshot))


def snapshot_source(scenario_ids: FromClause) -> Subquery:
    """``(scenario_id, snapshot, position)`` for the scenarios whose ids ``scenario_ids``
    (one ``id`` column) lists: each snapshot built by PostgreSQL as JSONB, in the shape
    :class:`shared.scenarios.records.Snapshot` decodes (its fields are the Structs':
    :mod:`shared.db.shapes`), and its position in creation order (from 1).  A batch of
    thousands of runs is fanned out by one ``INSERT … SELECT`` without its snapshots
    crossing the wire; the criteria and turns are aggregated once per turn and per
    scenario, not by a subquery per row.  A single run's snapshot is built by it too
    (:func:`snapshot_of`)."""
    wanted = select(scenario_ids.c.id).scalar_subquery()
    turns = _snapshot_turns(wanted, _snapshot_criteria(wanted))
    conversation = _snapshot_conversation_criteria(wanted)
    scenario = Scenario.__table__
    return (
        select(
            scenario.c.id.label("scenario_id"),
            shapes.json_object(
                Snapshot,
                scenario,
                turns=func.coalesce(turns.c.entries, _EMPTY),
                conversation_criteria=func.coalesce(conversation.c.entries, _EMPTY),
            ).label("snapshot"),
            func.row_number()
            .over(order_by=(scenario.c.created_at, scenario.c.id))
            .label("position"),
        )
        .select_from(
            scenario_ids.join(scenario, scenario.c.id == scenario_ids.c.id)
            .outerjoin(turns, turns.c.scenario_id == scenario.c.id)
            .outerjoin(conversation, conversation.c.scenario_id == scenario.c.id)
        )
        .subquery("snapshot_source")
    )  # fmt: skip


_EMPTY = literal_column("'[]'::jsonb")


def _criteria_entries() -> Any:
    """A criterion row as one JSON entry of a snapshot, aggregated in order."""
    criterion = Criterion.__table__
    entry = shapes.json_object(SnapshotCriterion, criterion, id=cast(criterion.c.id, Text))
    return func.jsonb_agg(aggregate_order_by(entry, criterion.c.order_index)).label("entries")


def _snapshot_criteria(wanted: ColumnElement[Any]) -> CTE:
    """``(turn_id, entries)``: each turn's criteria of the ``wanted`` scenarios, as one JSON
    array in order."""
    criterion = Criterion.__table__
    turn = ScenarioTurn.__table__
    return (
        select(criterion.c.turn_id, _criteria_entries())
        .join(turn, turn.c.id == criterion.c.turn_id)
        .where(turn.c.scenario_id.in_(wanted))
        .group_by(criterion.c.turn_id)
        .cte("snapshot_criteria")
    )


def _snapshot_conversation_criteria(wanted: ColumnElement[Any]) -> CTE:
    """``(scenario_id, entries)``: the conversation criteria of each ``wanted`` scenario,
    as one JSON array in order."""
    criterion = Criterion.__table__
    return (
        select(criterion.c.scenario_id, _criteria_entries())
        .where(criterion.c.scenario_id.in_(wanted))
        .group_by(criterion.c.scenario_id)
        .cte("snapshot_conversation_criteria")
    )


def _snapshot_turns(wanted: ColumnElement[Any], criteria: CTE) -> CTE:
    """``(scenario_id, entries)``: each ``wanted`` scenario's turns with their ``criteria``,
    as one JSON array in order."""
    turn = ScenarioTurn.__table__
    entry = shapes.json_object(
        SnapshotTurn,
        turn,
        id=cast(turn.c.id, Text),
        criteria=func.coalesce(criteria.c.entries, _EMPTY),
    )
    return (
        select(
            turn.c.scenario_id,
            func.jsonb_agg(aggregate_order_by(entry, turn.c.order_index)).label("entries"),
        )
        .outerjoin(criteria, criteria.c.turn_id == turn.c.id)
        .where(turn.c.scenario_id.in_(wanted))
        .group_by(turn.c.scenario_id)
        .cte("snapshot_turns")
    )


async def start_run(
    session: AsyncSession,
    *,
    access: OrgAccess,
    scenario_id: UUID,
    body: schemas.RunCreate,
    broker: dramatiq.Broker,
) -> ScenarioRun:
    """A pending run of the scenario against the agent, sent to the ``runs`` queue once the
    caller commits."""
    snapshot = await snapshot_of(session, org_id=access.organization_id, scenario_id=scenario_id)
    if snapshot is None:
        raise NotFound("scenario not found")
    await agent_in_org(session, org_id=access.organization_id, agent_id=body.agent_id)
    run = ScenarioRun(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        scenario_id=scenario_id,
        agent_id=body.agent_id,
        status="pending",
        snapshot=snapshot,
        created_by_user_id=access.principal.user_id,
        turn_results=[],
        conversation_results=[],
    )
    run.session_id = f"spar-{run.id}"
    session.add(run)
    await session.flush()
    send_after_commit(session, broker, RUN_SCENARIO, str(run.id))
    return run


# A run's detail: the run (its snapshot names each criterion's question), its turns in
# order, and every verdict on them or on the whole conversation, in each criterion's order.
_RUN_DETAIL = _Detail.of(
    [
        *shapes.columns_read(schemas.ScenarioRunRead, ScenarioRun.__table__),
        ScenarioRun.__table__.c.snapshot,
    ],
    turns=TurnResult.__table__,
    turn_order="turn_index",
    items=CriterionResult.__table__,
    parent_key="run_id",
    turn_key="turn_result_id",
    names=("turn_results", "criteria_results", "conversation_results"),
    missing="scenario run not found",
)


async def get_run(connection: AsyncConnection[Any], *, access: OrgAccess, run_id: UUID) -> Any:
    """The run with its turns' and criteria's results (``turn_results``, each with its
    ``criteria_results``) and its conversation criteria's (``conversation_results``): an
    object with an attribute per column, as :func:`run_read` reads a
    :class:`ScenarioRun`.  One round trip, without an ORM session: what a user reads of
    each run.  404 for another organization's run, as for a missing one."""
    return await _RUN_DETAIL.read(connection, access, run_id)


# An organization's runs, each row the listing's columns of a ScenarioRunRead (the table's,
# without the run's snapshot): a CI job lists its batch's runs, straight on psycopg, no ORM.
_RUNS = InOrg(
    ScenarioRun.__table__,
    shapes.columns_read(schemas.ScenarioRunRead, ScenarioRun.__table__),
    filters=("scenario_id", "agent_id", "batch_run_id", "status"),
)


async def list_runs(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    paging: Paging,
    scenario_id: UUID | None = None,
    agent_id: UUID | None = None,
    batch_run_id: UUID | None = None,
    status: str | None = None,
) -> tuple[list[Any], int]:
    """The organization's runs, oldest first, filtered by what is given (a batch of another
    organization, like its scenarios and agents, matches nothing): rows with an attribute
    per column, which :func:`run_read` reads as it reads a :class:`ScenarioRun`."""
    return await _RUNS.read(
        connection,
        paging,
        access.organization_id,
        scenario_id=scenario_id,
        agent_id=agent_id,
        batch_run_id=batch_run_id,
        status=status,
    )


# --- response shapes ---------------------------------------------------------------------------


def run_read(run: Any, *, with_results: bool) -> schemas.ScenarioRunRead:
    """The body of ``run`` (a :class:`ScenarioRun`, or a row of the listing); with
    ``with_results``, its turns' results and its conversation criteria's (loaded with the
    run)."""
    results: list[schemas.ScenarioTurnResultRead] | schemas.UnsetType = schemas.UNSET
    conversation: list[schemas.CriterionResultRead] | schemas.UnsetType = schemas.UNSET
    if with_results:
        snapshot = msgspec.convert(run.snapshot, Snapshot)
        asked = {
            UUID(c.id): c
            for c in itertools.chain(
                (c for turn in snapshot.turns for c in turn.criteria),
                snapshot.conversation_criteria,
            )
        }

        def read(result: CriterionResult) -> schemas.CriterionResultRead:
            return schemas.CriterionResultRead.from_row(
                result,
                question=asked[result.criteria_id].question,
                criteria_type=asked[result.criteria_id].criteria_type,
            )

        results = [
            schemas.ScenarioTurnResultRead.from_row(
                turn,
                status="skipped" if turn.skipped else "passed" if turn.passed else "failed",
                redacted_keys=turn.redacted_keys or [],
                criteria_results=[read(result) for result in turn.criteria_results],
            )
            for turn in run.turn_results
        ]
        conversation = [read(result) for result in run.conversation_results]
    return schemas.ScenarioRunRead.from_row(
        run, turn_results=results, conversation_results=conversation
    )
