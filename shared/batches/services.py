"""Batch runs (DESIGN §5.3): creating one (its runs fanned out in bulk), reading, listing,
cancelling, the progress its event stream reports, and two batches compared.

The window, the hand-over, the counters, the cancel and dispatch live in
:mod:`shared.batches.window`; this module calls them.

Creating a batch resolves its scenarios (ids and/or tags) and inserts ``repetitions``
pending runs per scenario, each with its snapshot, in one ``INSERT … SELECT`` that
PostgreSQL builds the snapshots in (:func:`shared.scenarios.services.snapshot_source`), and
asks for the first window (the ``batches`` actor) once the caller commits: a message is
only a pointer to a committed row.

With repetitions the batch's counters (``total_scenarios``, ``completed_scenarios`` and the
passed, failed and error ones) count runs, as the window does; the detail adds each
scenario's trials and passes and what they say (:mod:`shared.calibration.reliability`).

A batch with a baseline stores its comparison with it once it has completed and the
baseline is over (:func:`store_comparison`): on the first read of its detail, or at the
sweeper's next pass (:func:`shared.batches.comparisons.store_due`), whichever comes
first.  The
comparison is a function of the two batches' runs, all terminal by then, and its bootstrap
is seeded, so whoever computes it computes the same; the write is guarded (``comparison IS
NULL``), so it is stored once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

import dramatiq
import msgspec
from psycopg import AsyncConnection
from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Insert,
    Integer,
    Select,
    Subquery,
    Text,
    Uuid,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.ext.asyncio import AsyncSession

from shared.batches import schemas, window
from shared.batches.schemas import BatchStatus
from shared.batches.window import ACTIVE
from shared.calibration import reliability, trust
from shared.calibration.reliability import Tally
from shared.db import shapes
from shared.db.base import NOW, utcnow
from shared.db.direct import Statement, read_together
from shared.db.models import BatchRun, CriterionResult, Scenario, ScenarioRun, TurnResult
from shared.db.queries import InOrg, found, one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.notifications import outbox
from shared.outbound.configuration import destinations_of
from shared.outbound.limits import Destination, DestinationLimiter
from shared.outbound.services import agent_in_org
from shared.paging import Paging
from shared.queue import DISPATCH_BATCH, send_after_commit
from shared.scenarios.records import Snapshot, SnapshotCriterion
from shared.scenarios.schemas import TERMINAL_STATUSES
from shared.scenarios.services import snapshot_source, tag_filter

_runs = ScenarioRun.__table__
_batches = BatchRun.__table__


async def create_batch(
    session: AsyncSession,
    *,
    access: OrgAccess,
    body: schemas.BatchRunCreate,
    broker: dramatiq.Broker,
) -> BatchRun:
    return await start_batch(
        session,
        organization_id=access.organization_id,
        user_id=access.principal.user_id,
        body=body,
        broker=broker,
    )


async def start_batch(
    session: AsyncSession,
    *,
    organization_id: UUID,
    user_id: UUID | None,
    body: schemas.BatchRunCreate,
    broker: dramatiq.Broker,
) -> BatchRun:
    """The batch and its pending runs, for a caller (``create_batch``) or for a trigger
    firing unattended (``user_id`` is then the trigger's creator, if still a user); its
    first window is asked for once the caller commits."""
    if not body.scenario_ids and not body.tags:
        raise InvalidInput(("body",), "give scenario_ids and/or tags", type="missing")
    agent = await agent_in_org(session, org_id=organization_id, agent_id=body.agent_id)
    conditions = []
    if body.scenario_ids:
        conditions.append(Scenario.id.in_(set(body.scenario_ids)))
    if body.tags:
        conditions.append(tag_filter(list(body.tags)))
    matching = or_(*conditions)
    scenario_ids = list(
        await session.scalars(
            select(Scenario.id).where(Scenario.organization_id == organization_id, matching)
        )
    )
    missing = set(body.scenario_ids) - set(scenario_ids)
    if missing:
        raise NotFound(f"scenario not found: {', '.join(sorted(map(str, missing)))}")
    if not scenario_ids:
        raise InvalidInput(("body", "tags"), "no scenario matches these tags", input=body.tags)
    if body.baseline_batch_id is not None:
        baseline = await one_in_org(
            session, BatchRun, organization_id, body.baseline_batch_id, "baseline batch run"
        )
        if baseline.agent_id != agent.id:
            raise InvalidInput(
                ("body", "baseline_batch_id"),
                "the baseline batch run is of another agent: compare batches of one agent",
                input=str(body.baseline_batch_id),
            )
    now = utcnow()
    batch = BatchRun(
        id=uuid.uuid4(),
        organization_id=organization_id,
        agent_id=agent.id,
        agent_name=agent.name,
        status=BatchStatus.QUEUED,
        max_concurrency=body.max_concurrency,
        repetitions=body.repetitions,
        judge_repetitions=body.judge_repetitions,
        baseline_batch_id=body.baseline_batch_id,
        total_scenarios=len(scenario_ids) * body.repetitions,  # runs
        created_by_user_id=user_id,
        created_at=now,  # the instant its runs are created at (the fan-out's ``now``)
    )
    session.add(batch)
    await session.flush()
    await session.execute(
        _FAN_OUT,
        {
            "p_ids": scenario_ids,
            "p_count": len(scenario_ids),
            "p_repetitions": body.repetitions,
            "p_judge_repetitions": body.judge_repetitions,
            "p_org": organization_id,
            "p_agent": agent.id,
            "p_batch": batch.id,
            "p_user": user_id,
            "now": now,
        },
    )
    send_after_commit(session, broker, DISPATCH_BATCH, str(batch.id))
    return batch


def _fan_out() -> Insert:
    """``:p_repetitions`` pending runs per scenario of ``:p_ids`` (``:p_count`` of them),
    each with its snapshot, built once per scenario and inserted by the database: the
    first run of every scenario, then the second of every one, and so on."""
    picked = (
        func.unnest(bindparam("p_ids", type_=ARRAY(Uuid())))
        .table_valued("id")
        .render_derived(name="picked")
    )
    built = snapshot_source(picked)
    repetition = (
        func.generate_series(0, bindparam("p_repetitions", type_=Integer()) - 1)
        .table_valued("repetition")
        .render_derived(name="repetitions")
    )
    source = (
        select(func.gen_random_uuid().label("id"), built, repetition.c.repetition)
        .select_from(built.join(repetition, true()))
        .subquery("source")
    )
    order = source.c.repetition * bindparam("p_count", type_=Integer())
    return insert_pending_runs(source, order=order + source.c.position - 1)


def insert_pending_runs(
    source: Subquery,
    *,
    order: ColumnElement[Any],
    extra: dict[str, ColumnElement[Any]] | None = None,
) -> Insert:
    """The pending runs of the batch ``:p_batch`` built from ``source`` (a row per run: its
    ``id``, ``scenario_id`` and ``snapshot``) for the agent ``:p_agent`` of ``:p_org``, made
    by ``:p_user``, judged ``:p_judge_repetitions`` times, plus the ``extra`` columns.  Their
    ``created_at`` are ``order`` (from 0) microseconds apart: distinct and ordered, so the
    batch's window dispatches them in that order."""
    columns: dict[str, ColumnElement[Any]] = {
        "id": source.c.id,
        "organization_id": bindparam("p_org", type_=Uuid()),
        "scenario_id": source.c.scenario_id,
        "agent_id": bindparam("p_agent", type_=Uuid()),
        "status": literal_column("'pending'"),
        "session_id": literal_column("'spar-'") + cast(source.c.id, Text),
        "snapshot": source.c.snapshot,
        "cost_summary": literal_column("'{}'::jsonb"),
        "batch_run_id": bindparam("p_batch", type_=Uuid()),
        "created_by_user_id": bindparam("p_user", type_=Uuid()),
        "created_at": NOW + order * literal_column("interval '1 microsecond'"),
        "updated_at": NOW,
        "judge_repetitions": bindparam("p_judge_repetitions", type_=Integer()),
        **(extra or {}),
    }
    return insert(_runs).from_select(list(columns), select(*columns.values()))


_FAN_OUT = _fan_out()


async def get_batch(session: AsyncSession, *, access: OrgAccess, batch_id: UUID) -> BatchRun:
    return await one_in_org(
        session, BatchRun, access.organization_id, batch_id, "batch run", populate_existing=True
    )


# The listing's columns of a batch (of a :class:`BatchRunRead`): the table's, without the
# detail's stored judge trust and comparison.
_LISTED = shapes.columns_read(schemas.BatchRunRead, _batches, leaving=("judge_trust", "comparison"))


def _batch_listing(newest_first: bool) -> InOrg:
    """An organization's batches, each row the listing's columns."""
    return InOrg(_batches, _LISTED, filters=("status", "agent_id"), newest_first=newest_first)


# A CI job polls the listing while its batch runs: straight on psycopg, no ORM.
_BATCHES = {newest_first: _batch_listing(newest_first) for newest_first in (False, True)}


async def list_batches(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    paging: Paging,
    status: str | None = None,
    agent_id: UUID | None = None,
    newest_first: bool = False,
) -> tuple[list[Any], int]:
    """The organization's batches (of one agent, in one status, when given), oldest first
    (the API's stable order) or newest first: rows with an attribute per column, which
    :func:`batch_read` reads as it reads a :class:`BatchRun`."""
    return await _BATCHES[newest_first].read(
        connection, paging, access.organization_id, status=status, agent_id=agent_id
    )


# Its every column (the detail's judge trust and comparison too), for the reads by id.
_BATCH = InOrg(_batches)
# The listing's columns: for the reads that show no judge trust nor comparison (a poll of
# its progress, each second), which can be long.
_PROGRESS = _BATCHES[False]
# The status and counters of the baseline of the batch ``:p_batch`` (no row without one):
# whether its comparison is due (:func:`comparison_due`).
_BASELINE = Statement(
    select(_batches.c.status, _batches.c.completed_scenarios, _batches.c.total_scenarios).where(
        _batches.c.id
        == select(_batches.c.baseline_batch_id)
        .where(
            _batches.c.id == bindparam("p_batch", type_=Uuid()),
            _batches.c.organization_id == bindparam("p_org", type_=Uuid()),
        )
        .scalar_subquery()
    )
)


async def settle(
    session: AsyncSession, *, access: OrgAccess, batch_id: UUID, broker: dramatiq.Broker
) -> None:
    """What a read of the batch's detail writes when it is due (:func:`read_detail` says):
    ask for its judge trust (sent to the ``calibration`` queue after commit), store its
    comparison."""
    batch = await get_batch(session, access=access, batch_id=batch_id)
    # The comparison first: each write locks the batch's row until commit, and the
    # comparison is worked out (its bootstrap) before its write.
    await store_comparison(session, batch=batch)
    await trust.request(session, batch=batch, broker=broker)


async def read_detail(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    batch_id: UUID,
    limiter: DestinationLimiter,
    settled: bool = False,
) -> schemas.BatchRunRead | None:
    """The batch with its counters, a summary of every run, each scenario's trials, the
    rate limit holding it back if one does, once it is over its judge trust and, with a
    baseline, its comparison; or ``None`` when reading it is due to write first
    (:func:`settle`: its judge trust to ask for, its comparison to store), unless
    ``settled`` (just written, whatever that decided).  The batch, its runs' summaries, its
    replays and its baseline's state in one round trip; then, only when needed, a round
    trip each for the judge's votes (with ``judge_repetitions`` over 1) and for where its
    runs call out (while it runs)."""
    org_id = access.organization_id
    given = {"p_batch": batch_id, "p_org": org_id}
    batch_rows, summary_rows, replay_rows, baselines = await read_together(
        connection,
        (_BATCH.by_id(), {"p_id": batch_id, "p_org": org_id}),
        (_summaries(), given),
        (_REPLAYS, given),
        (_BASELINE, given),
    )
    batch = found(batch_rows, "batch run")
    baseline = baselines[0] if baselines else None
    if not settled and (trust.due(batch) or comparison_due(batch, baseline)):
        return None
    flip_rate = None
    if batch.judge_repetitions > 1:
        flip_rate = await _flip_rate(connection, batch_id=batch.id)
    return batch_read(
        batch,
        [schemas.BatchRunItemSummary.from_row(row) for row in summary_rows],
        detail=True,
        limited=await _limited(connection, batch, limiter),
        flip_rate=flip_rate,
        replays=[row.id for row in replay_rows],
    )


async def batch_changes(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    batch_id: UUID,
    since: datetime,
    limiter: DestinationLimiter,
) -> schemas.BatchRunRead:
    """What a viewer of the batch that looked at ``since`` has yet to see: its counters,
    the rate limit holding it back, and the summaries of the runs changed since then
    (:data:`RECENT` before it, so that none is missed).  A page following a batch of
    thousands of runs reads these each second, not every run: the batch and those runs in
    one round trip."""
    org_id = access.organization_id
    batch_rows, summary_rows = await read_together(
        connection,
        (_PROGRESS.by_id(), {"p_id": batch_id, "p_org": org_id}),
        (
            _summaries(changed_since=True),
            {"p_batch": batch_id, "p_org": org_id, "p_since": since - RECENT},
        ),
    )
    batch = found(batch_rows, "batch run")
    runs = [schemas.BatchRunItemSummary.from_row(row) for row in summary_rows]
    return batch_read(batch, runs, limited=await _limited(connection, batch, limiter))


# The votes of the batch's criterion results the judge decided: each way down the indexes,
# a turn's results by its run, a conversation's by the run.
_result, _turn = CriterionResult.__table__, TurnResult.__table__
_of_batch = select(_runs.c.id).where(_runs.c.batch_run_id == bindparam("p_batch", type_=Uuid()))
_votes = union_all(
    select(_result.c.votes)
    .join(_turn, _turn.c.id == _result.c.turn_result_id)
    .where(_turn.c.run_id.in_(_of_batch), _result.c.votes.is_not(None)),
    select(_result.c.votes).where(_result.c.run_id.in_(_of_batch), _result.c.votes.is_not(None)),
).subquery("votes")
_FLIPS = Statement(
    select(
        func.count().label("judged"),
        func.count()
        .filter(
            (_votes.c.votes["PASS"].as_integer() > 0) & (_votes.c.votes["FAIL"].as_integer() > 0)
        )
        .label("flipped"),
    ).select_from(_votes)
)


async def _flip_rate(connection: AsyncConnection[Any], *, batch_id: UUID) -> float | None:
    """Of the batch's criterion results the judge decided (per turn and on the whole
    conversation), the share whose votes were not unanimous; ``None`` before any was."""
    (counts,) = await _FLIPS.objects(connection, p_batch=batch_id)
    return counts.flipped / counts.judged if counts.judged else None


# The batches replaying one, oldest first.
_REPLAYS = Statement(
    select(_batches.c.id)
    .where(
        _batches.c.replay_of == bindparam("p_batch", type_=Uuid()),
        _batches.c.organization_id == bindparam("p_org", type_=Uuid()),
    )
    .order_by(_batches.c.created_at, _batches.c.id)
)


async def batch_destinations(
    connection: AsyncConnection[Any], *, access: OrgAccess, batch_id: UUID
) -> list[Destination]:
    """Where the batch's runs call out (404 when it is not the organization's): its agent's
    and its judge's destinations; none once it is over."""
    batch = await _PROGRESS.one(connection, access.organization_id, batch_id, "batch run")
    return await _destinations(connection, batch)


async def _destinations(connection: AsyncConnection[Any], batch: Any) -> list[Destination]:
    """Where ``batch``'s runs call out; none once it is over (no rate limit holds back a
    batch that calls no more: :func:`rate_limited`), so that reading an ended batch does
    not look its agent and providers up."""
    if batch.agent_id is None or is_over(batch):
        return []
    return await destinations_of(connection, org_id=batch.organization_id, agent_id=batch.agent_id)


async def _limited(
    connection: AsyncConnection[Any], batch: Any, limiter: DestinationLimiter
) -> schemas.RateLimitedRead | None:
    """The rate limit holding ``batch`` back now, if one does (:func:`rate_limited`)."""
    return await rate_limited(
        batch, limiter=limiter, destinations=await _destinations(connection, batch)
    )


async def rate_limited(
    batch: Any, *, limiter: DestinationLimiter, destinations: list[Destination]
) -> schemas.RateLimitedRead | None:
    """Of ``destinations``, the one refusing the batch's calls now (the one refusing
    longest), while the batch runs."""
    if is_over(batch) or not destinations:
        return None
    holding = await limiter.held_back(destinations)
    if holding is None:
        return None
    destination, since = holding
    return schemas.RateLimitedRead(
        destination=destination.host,
        kind=destination.kind,
        since=datetime.fromtimestamp(since, UTC),
    )


# How far back a reader following a batch by its runs' timestamps (``completed_at``,
# ``updated_at``) looks again: a run's change is stamped by its writer just before it
# commits, so one stamped a moment before a look may only be seen by the next.
RECENT = timedelta(seconds=30)


@cache
def _summaries(
    *, ended: bool = False, ended_since: bool = False, changed_since: bool = False
) -> Statement:
    """:func:`_summaries_query` compiled for psycopg, once for each combination used."""
    return Statement(
        _summaries_query(ended=ended, ended_since=ended_since, changed_since=changed_since)
    )


@cache
def _summaries_query(*, ended: bool, ended_since: bool, changed_since: bool) -> Select[Any]:
    """A summary of each run of the batch ``:p_batch`` of the organization ``:p_org`` (the
    batch detail's ``runs`` and the events stream's ``run`` events), in the batch's order;
    with ``ended``, only the terminal runs (those that ended at ``:p_since`` or later, with
    ``ended_since``) in the order they ended; with ``changed_since``, only the runs changed
    at ``:p_since`` or later (every change of a run, its turns' included, stamps its
    ``updated_at``)."""
    runs = _runs.c
    since = bindparam("p_since", type_=runs.updated_at.type)
    query = _summary_query().where(
        runs.batch_run_id == bindparam("p_batch", type_=runs.batch_run_id.type),
        runs.organization_id == bindparam("p_org", type_=runs.organization_id.type),
    )
    if changed_since:
        query = query.where(runs.updated_at >= since)
    if ended:
        query = query.where(
            runs.status.in_([literal(status) for status in TERMINAL_STATUSES])
        ).order_by(runs.completed_at, runs.id)
        if ended_since:
            query = query.where(runs.completed_at >= since)
    else:
        query = query.order_by(runs.created_at, runs.id)
    return query


@cache
def _summary_query() -> Select[Any]:
    """A run's summary, of every run: what :func:`_summaries_query` narrows."""
    runs, turns = _runs.c, TurnResult.__table__.c
    passed_turns = (
        select(func.count(turns.id)).where(turns.run_id == runs.id, turns.passed).scalar_subquery()
    )
    # A simulated user's turns count once played (a scenario names only its scripted ones).
    simulated_turns = (
        select(func.count(turns.id))
        .where(turns.run_id == runs.id, turns.source == "simulated")
        .scalar_subquery()
    )
    # Read off the snapshot by PostgreSQL: the snapshots themselves (every turn and
    # criterion of the scenario) do not cross the wire.
    scripted = runs.snapshot["turns"]
    scripted_turns = case(
        (func.jsonb_typeof(scripted) == "array", func.jsonb_array_length(scripted)), else_=0
    )
    return select(
        runs.id,
        runs.scenario_id,
        runs.status,
        func.coalesce(runs.snapshot["name"].astext, "").label("scenario_name"),
        runs.started_at,
        runs.completed_at,
        passed_turns.label("passed_turns"),
        (scripted_turns + simulated_turns).label("total_turns"),
    )


async def cancel_batch(session: AsyncSession, *, access: OrgAccess, batch_id: UUID) -> BatchRun:
    """Stop dispatching (:func:`shared.batches.window.cancel`): runs not yet handed out end
    as ``error`` (cancelled); runs in flight finish and are counted; the batch ends as
    ``error``."""
    batch = await get_batch(session, access=access, batch_id=batch_id)
    if batch.status not in ACTIVE:
        raise Conflict(f"batch run is already {batch.status}")
    if not await window.cancel(session, batch_id=batch.id):
        # It ended meanwhile: the request rolls back.
        raise Conflict("batch run has already ended")
    return await get_batch(session, access=access, batch_id=batch_id)


def is_over(batch: BatchRun | schemas.BatchRunRead) -> bool:
    """Ended, with every one of its runs counted (a cancelled batch still counts the runs
    that were in flight: it is over after the last of them)."""
    return batch.status in (BatchStatus.COMPLETED, BatchStatus.ERROR) and (
        batch.completed_scenarios >= batch.total_scenarios
    )


class Progress(msgspec.Struct, frozen=True):
    """One look at a batch for its event stream: the batch, its runs ended lately, and
    whether it is over (ended, with every one of its runs counted)."""

    batch: Any  # a row of its table
    ended: list[schemas.BatchRunItemSummary]
    over: bool
    rate_limited: schemas.RateLimitedRead | None = None


async def progress(
    connection: AsyncConnection[Any],
    *,
    access: OrgAccess,
    batch_id: UUID,
    ended_since: datetime | None,
    limiter: DestinationLimiter,
    destinations: list[Destination],
) -> Progress:
    """The batch and its runs that ended at ``ended_since`` or later (all of them without
    it, and always all of them once the batch is over, so no run is ever missed), and which
    of ``destinations`` (:func:`batch_destinations`, looked up once per stream) holds it
    back."""
    org_id = access.organization_id
    batch = await _PROGRESS.one(connection, org_id, batch_id, "batch run")
    over = is_over(batch)
    given: dict[str, Any] = {"p_batch": batch_id, "p_org": org_id}
    if ended_since is not None and not over:
        given["p_since"] = ended_since
    summaries = _summaries(ended=True, ended_since="p_since" in given)
    ended = [
        schemas.BatchRunItemSummary.from_row(row)
        for row in await summaries.objects(connection, **given)
    ]
    limited = await rate_limited(batch, limiter=limiter, destinations=destinations)
    return Progress(batch=batch, ended=ended, over=over, rate_limited=limited)


def batch_read(
    batch: Any,
    runs: list[schemas.BatchRunItemSummary] | None = None,
    *,
    detail: bool = False,
    limited: schemas.RateLimitedRead | None | msgspec.UnsetType = msgspec.UNSET,
    flip_rate: float | None = None,
    replays: list[UUID] | None = None,
) -> schemas.BatchRunRead:
    """The body of ``batch`` (a :class:`BatchRun`, or a row of the listing); the detail's
    also holds its ``runs``, its scenarios' trials, its judge trust, its judge's
    ``flip_rate``, the batches replaying it and its comparison, and the detail's and the
    progress events' the rate limit holding it back (``limited``)."""
    if not detail:
        return schemas.BatchRunRead.from_row(
            batch,
            runs=runs if runs is not None else msgspec.UNSET,
            judge_trust=msgspec.UNSET,
            rate_limited=limited,
            comparison=msgspec.UNSET,
        )
    scenarios = [
        schemas.ScenarioTrials(
            scenario_id=scenario_id,
            scenario_name=played.name,
            trials=played.tally.trials,
            passes=played.tally.passes,
            errors=played.errors,
            flaky=played.tally.flaky,
        )
        for scenario_id, played in _by_scenario(runs or []).items()
    ]
    tallies = [Tally(s.passes, s.trials) for s in scenarios]
    return schemas.BatchRunRead.from_row(
        batch,
        runs=runs if runs is not None else msgspec.UNSET,
        judge_trust=trust.read(batch),
        rate_limited=limited,
        scenarios=scenarios,
        pass_hat_k=reliability.pass_hat_k(tallies, batch.repetitions),
        pass_at_k=reliability.pass_at_k(tallies),
        flaky_scenarios=reliability.flaky(tallies),
        judge_flip_rate=flip_rate,
        replays=replays or [],
    )


# --- comparing two batches ---------------------------------------------------------------------

# How a scenario's outcome moved from batch A to batch B, in the order a comparison lists them.
_CHANGE_ORDER = {
    schemas.Change.REGRESSED: 0,
    schemas.Change.FIXED: 1,
    schemas.Change.CHANGED: 2,
    schemas.Change.EDITED: 3,
    schemas.Change.ONLY_IN_A: 4,
    schemas.Change.ONLY_IN_B: 5,
    schemas.Change.UNCHANGED: 6,
}


def _played(snapshot: str) -> bytes:
    """What a run of the scenario plays, from its snapshot (its JSON text): the customer
    context, each turn's message, whether it is required, and its criteria (questions,
    types, few-shot examples, expected arguments), its simulated user and its conversation
    criteria.  Not the ids (saving turns makes new ones) nor the name."""
    scenario = msgspec.json.decode(snapshot, type=Snapshot)

    def asked(criteria: list[SnapshotCriterion]) -> list[Any]:
        return [
            [c.question, c.criteria_type, c.few_shot_examples, c.expected_arguments]
            for c in criteria
        ]

    return msgspec.json.encode(
        [
            scenario.customer_context,
            [[turn.user_message, turn.required, asked(turn.criteria)] for turn in scenario.turns],
            scenario.simulation,
            asked(scenario.conversation_criteria),
        ]
    )


def _of_pair(batch_id: Any, organization_id: Any) -> tuple[Any, Any]:
    """The rows whose ``batch_id`` column names the batch ``:p_a`` or ``:p_b`` (batches by
    their id, runs by their batch's) and whose ``organization_id`` is ``:p_org``."""
    return (
        batch_id.in_([bindparam("p_a", type_=Uuid()), bindparam("p_b", type_=Uuid())]),
        organization_id == bindparam("p_org", type_=organization_id.type),
    )


def _first_runs() -> Select[Any]:
    """The first run of each scenario in each of the batches ``:p_a`` and ``:p_b`` (in its
    batch's order)."""
    runs = _runs.c
    return (
        select(runs.id, runs.batch_run_id, runs.scenario_id, runs.snapshot)
        .where(*_of_pair(runs.batch_run_id, runs.organization_id))
        .ext(distinct_on(runs.batch_run_id, runs.scenario_id))
        .order_by(runs.batch_run_id, runs.scenario_id, runs.created_at, runs.id)
    )


def _outcomes_query() -> Select[Any]:
    """Each scenario of each of the batches ``:p_a`` and ``:p_b`` (of the organization
    ``:p_org``), in the order of its first run: that run's summary, its batch, and the
    scenario's runs in the batch counted by how they ended (``passes``, ``failures``,
    ``errors``, ``runs``).  One row a scenario however many repetitions it has: a
    comparison does not read every run."""
    runs = _runs.c
    scenario = (runs.batch_run_id, runs.scenario_id)

    def counted(status: str | None = None) -> Any:
        runs_counted = (
            func.count() if status is None else func.count().filter(runs.status == status)
        )
        return runs_counted.over(partition_by=scenario)

    firsts = (
        _first_runs()
        .with_only_columns(
            runs.id,
            counted("passed").label("passes"),
            counted("failed").label("failures"),
            counted("error").label("errors"),
            counted().label("runs"),
        )
        .subquery("firsts")
    )
    return (
        _summary_query()
        .join(firsts, firsts.c.id == runs.id)
        .add_columns(
            runs.batch_run_id, firsts.c.passes, firsts.c.failures, firsts.c.errors, firsts.c.runs
        )
        .order_by(runs.created_at, runs.id)
    )


def _edits_query() -> Select[Any]:
    """The scenarios of both batches ``:p_a`` and ``:p_b`` (of the organization ``:p_org``)
    whose snapshots differ, with each batch's (JSON text, ``a`` and ``b``): what a
    comparison decodes to tell an edited scenario (:func:`_played`).  A batch's runs of one
    scenario share its snapshot (built once per scenario as the batch or its replay is
    made), so its first run's is compared; a ``jsonb`` value has one text (its keys
    ordered), so the same text plays the same and is not read.  The texts are compared, not
    the values: ``jsonb`` holds ``1`` and ``1.0`` equal, where the agent is sent one or the
    other.  Each B row meets its A row by a window over the scenario, not a join: a join
    whose planner misjudged the row counts compared every snapshot of A with every snapshot
    of B."""
    firsts = _first_runs().subquery("firsts")
    in_b = firsts.c.batch_run_id == bindparam("p_b", type_=Uuid())
    snapshot = cast(firsts.c.snapshot, Text)
    paired = select(
        firsts.c.scenario_id,
        in_b.label("in_b"),
        func.lag(snapshot).over(partition_by=firsts.c.scenario_id, order_by=in_b).label("a"),
        snapshot.label("b"),
    ).subquery("paired")
    return select(paired.c.scenario_id, paired.c.a, paired.c.b).where(
        paired.c.in_b, paired.c.a != paired.c.b
    )


# What a comparison reads: its scenarios' outcomes and edits (store_comparison, in its
# session), and both batches with them (compare_batches, straight on psycopg; the listing's
# columns: a comparison shows neither batch's judge trust nor its stored comparison).
_OUTCOMES_QUERY, _EDITS_QUERY = _outcomes_query(), _edits_query()
_OUTCOMES, _EDITS = Statement(_OUTCOMES_QUERY), Statement(_EDITS_QUERY)
_PAIR = Statement(select(*_LISTED).where(*_of_pair(_batches.c.id, _batches.c.organization_id)))


def _edited(rows: Any) -> set[UUID]:
    """Of the rows of :func:`_edits_query`, the scenarios that play otherwise in the two
    batches."""
    return {row.scenario_id for row in rows if _played(row.a) != _played(row.b)}


@dataclass(slots=True)
class _Outcomes:
    """A scenario's runs in one batch, counted by how they ended: its first run (the one a
    comparison links to) and its trials (:class:`reliability.Tally`: a run that ended in
    error is no trial)."""

    name: str
    first: schemas.BatchRunItemSummary
    passes: int = 0
    failures: int = 0
    errors: int = 0
    unfinished: int = 0

    @property
    def tally(self) -> Tally:
        return Tally(self.passes, self.passes + self.failures)


def _by_scenario(runs: list[schemas.BatchRunItemSummary]) -> dict[UUID, _Outcomes]:
    """The runs counted per scenario, in the order of each scenario's first run."""
    outcomes_of: dict[UUID, _Outcomes] = {}
    for run in runs:
        outcomes = outcomes_of.setdefault(run.scenario_id, _Outcomes(run.scenario_name, run))
        if run.status == "passed":
            outcomes.passes += 1
        elif run.status == "failed":
            outcomes.failures += 1
        elif run.status == "error":
            outcomes.errors += 1
        else:
            outcomes.unfinished += 1
    return outcomes_of


def _outcomes(rows: Any) -> dict[UUID, _Outcomes]:
    """The rows of :func:`_outcomes_query`, by scenario, in their order."""
    return {
        row.scenario_id: _Outcomes(
            row.scenario_name,
            schemas.BatchRunItemSummary.from_row(row),
            passes=row.passes,
            failures=row.failures,
            errors=row.errors,
            unfinished=row.runs - row.passes - row.failures - row.errors,
        )
        for row in rows
    }


def _change(a: _Outcomes | None, b: _Outcomes | None, edited: bool) -> schemas.Change:
    """With trials on both sides, a lower pass rate in B is a regression and a higher one a
    fix (with one run a side: passed then failed, failed then passed); otherwise the same
    rates, errors and unfinished runs are unchanged, and any other difference a change."""
    if b is None:
        return schemas.Change.ONLY_IN_A
    if a is None:
        return schemas.Change.ONLY_IN_B
    if edited:
        return schemas.Change.EDITED
    ta, tb = a.tally, b.tally
    if ta.trials and tb.trials:
        # passes_B / trials_B against passes_A / trials_A, in integers.
        order = tb.passes * ta.trials - ta.passes * tb.trials
        if order < 0:
            return schemas.Change.REGRESSED
        if order > 0:
            return schemas.Change.FIXED
    same_rates = bool(ta.trials) == bool(tb.trials)  # equal, or neither has a trial
    if same_rates and (a.errors, a.unfinished) == (b.errors, b.unfinished):
        return schemas.Change.UNCHANGED
    return schemas.Change.CHANGED


async def compare_batches(
    connection: AsyncConnection[Any], *, access: OrgAccess, a_id: UUID, b_id: UUID
) -> schemas.BatchComparison:
    """Two batches of the organization side by side, scenario by scenario (matched by
    ``scenario_id``): regressions (a lower pass rate in B) first, then fixes, other
    changes, scenarios edited between the two (whatever their outcomes), scenarios run in
    one batch only, and the unchanged; each scenario with trials on both sides tested for
    a regression (one-sided Fisher exact), and the mean pass-rate difference over those
    scenarios with its paired bootstrap interval.  Both batches, their scenarios' outcomes
    and their differing snapshots in one round trip."""
    given = {"p_a": a_id, "p_b": b_id, "p_org": access.organization_id}
    batches, outcomes, edits = await read_together(
        connection, (_PAIR, given), (_OUTCOMES, given), (_EDITS, given)
    )
    return _compare(
        found([row for row in batches if row.id == a_id], "batch run"),
        found([row for row in batches if row.id == b_id], "batch run"),
        outcomes,
        edits,
    )


def _compare(batch_a: Any, batch_b: Any, outcomes: Any, snapshots: Any) -> schemas.BatchComparison:
    """The comparison of two batches (their rows), from the rows of their scenarios'
    outcomes (:func:`_outcomes_query`) and differing snapshots (:func:`_edits_query`)."""
    runs_a, runs_b = (
        _outcomes([row for row in outcomes if row.batch_run_id == batch.id])
        for batch in (batch_a, batch_b)
    )
    edits = _edited(snapshots)
    rows, differences = [], []
    for scenario_id in runs_a.keys() | runs_b.keys():
        a, b = runs_a.get(scenario_id), runs_b.get(scenario_id)
        edited = scenario_id in edits
        ta = a.tally if a is not None else Tally(0, 0)
        tb = b.tally if b is not None else Tally(0, 0)
        p_value = None
        if a is not None and b is not None and not edited:
            p_value = reliability.regression_p_value(ta, tb)
            if ta.rate is not None and tb.rate is not None:
                differences.append(tb.rate - ta.rate)
        rows.append(
            schemas.ScenarioComparison(
                scenario_id=scenario_id,
                scenario_name=(b or a).name,  # type: ignore[union-attr]
                change=_change(a, b, edited),
                a_trials=ta.trials,
                a_passes=ta.passes,
                b_trials=tb.trials,
                b_passes=tb.passes,
                p_value=p_value,
                significant=p_value is not None and p_value < reliability.SIGNIFICANCE,
                a=a.first if a is not None else None,
                b=b.first if b is not None else None,
            )
        )
    rows.sort(key=lambda row: (_CHANGE_ORDER[row.change], row.scenario_name, row.scenario_id))
    interval = reliability.paired_bootstrap(differences)
    return schemas.BatchComparison(
        a=batch_read(batch_a),
        b=batch_read(batch_b),
        scenarios=rows,
        regressions=sum(row.change == schemas.Change.REGRESSED for row in rows),
        fixes=sum(row.change == schemas.Change.FIXED for row in rows),
        edited=sum(row.change == schemas.Change.EDITED for row in rows),
        significant_regressions=sum(row.significant for row in rows),
        pass_rate_difference=(
            schemas.PassRateDifference(
                difference=interval.difference,
                low=interval.low,
                high=interval.high,
                pairs=interval.pairs,
                resamples=interval.resamples,
                seed=interval.seed,
            )
            if interval is not None
            else None
        ),
    )


# --- a batch's comparison with its baseline, stored once ---------------------------------------


def comparison_due(batch: Any, baseline: Any | None) -> bool:
    """Whether ``batch`` (a :class:`BatchRun` or a row of its table) is due to store its
    comparison (:func:`store_comparison`): completed, none stored yet, and its
    ``baseline`` (the same, ``None`` without one) over."""
    return (
        batch.status == BatchStatus.COMPLETED
        and batch.comparison is None
        and baseline is not None
        and is_over(baseline)
    )


async def store_comparison(session: AsyncSession, *, batch: BatchRun) -> bool:
    """Store the comparison of ``batch`` (B) with its baseline (A) on it, if it is due: B
    completed, A over, none stored yet.  True when this call stored it.  Guarded in SQL
    (``comparison IS NULL``): of two callers at once, one writes; both computed the same
    (every run of both batches is terminal, the bootstrap seeded)."""
    baseline = None
    if batch.status == BatchStatus.COMPLETED and batch.baseline_batch_id is not None:
        baseline = await session.get(BatchRun, batch.baseline_batch_id)
    if baseline is None or not comparison_due(batch, baseline):
        return False
    given = {"p_a": baseline.id, "p_b": batch.id, "p_org": batch.organization_id}
    outcomes = (await session.execute(_OUTCOMES_QUERY, given)).all()
    snapshots = await session.execute(_EDITS_QUERY, given)
    comparison = _compare(baseline, batch, outcomes, snapshots)
    stored = schemas.StoredComparison(
        baseline_batch_id=baseline.id,
        computed_at=utcnow(),
        regressions=comparison.regressions,
        fixes=comparison.fixes,
        edited=comparison.edited,
        significant_regressions=comparison.significant_regressions,
        pass_rate_difference=comparison.pass_rate_difference,
        scenarios=[
            schemas.ScenarioChange(
                **{name: getattr(row, name) for name in schemas.ScenarioChange.__struct_fields__}
            )
            for row in comparison.scenarios
            if row.change != schemas.Change.UNCHANGED
        ],
    )
    # The comparison, and batch.regressed when it finds a significant regression, in one
    # statement: a GET's session commits each statement on its own.
    stored_it = (
        update(BatchRun)
        .where(BatchRun.id == batch.id, BatchRun.comparison.is_(None))
        .values(comparison=msgspec.to_builtins(stored), updated_at=NOW)
        .returning(BatchRun.id, BatchRun.organization_id, BatchRun.comparison)
        .cte("stored")
    )
    written = (
        await session.execute(
            select(
                select(func.count()).select_from(stored_it).scalar_subquery(),
                outbox.recorded_when_regressed(stored_it),
            ),
            {"now": utcnow()},
        )
    ).one()[0]
    await session.refresh(batch, ["comparison"])
    return written > 0
