"""Where the run engine reads and writes a run: its claim, its turns, its end.

A batch executes these thousands of times a minute, so they are built once, as Core
statements, and each state change costs as little as the backend allows:

every state change is **one statement that commits on its own** (data-modifying CTEs),
executed straight on psycopg (:mod:`shared.db.direct`): the claim with the turns already
committed; a turn with its criterion results and the run's cost; a simulated
conversation's outcome with the cost of the simulator's last answer; a run's end with its
batch's side (:func:`shared.batches.window.settle`: its count and its successor's
hand-out) and, when a failed required turn stopped it, the turns left unplayed, recorded
as skipped, or, when the conversation went on to its end, the verdicts of its
conversation criteria.  Atomic by itself, with no BEGIN or COMMIT round trip, and its row locks
released the moment it ends — the batch row, which every run of a batch writes, is never
held across a round trip to a busy worker.

A run's end waits for its batch's row, and a window of runs ending together queues on it,
each waiting run's statement holding a connection of the pool: those statements may hold at
most half of the pool's connections at once (:func:`_room_to_end`), so that the claims and
turns of the process's other runs never wait for one behind them.

Every change is guarded in SQL, so a redelivered message changes nothing twice: a claim
only takes a run that is pending, or running with a dead heartbeat (:mod:`shared.work`),
and counts the delivery; a turn is written only while the run is
``running`` with no simulation outcome yet and once per ``(run, turn_index)``, an
outcome only once, an end only moves a ``pending`` or ``running`` run.  No parameter is
named after a column: Core would add it to an UPDATE's SET clause.
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import (
    Insert,
    String,
    Update,
    Uuid,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by

from shared import work
from shared.batches import window
from shared.db import shapes
from shared.db.base import NOW, utcnow
from shared.db.direct import Statement, direct_pool
from shared.db.engine import Database
from shared.db.models import CriterionResult, Organization, ScenarioRun, TurnResult
from shared.scenarios.records import (
    Claimed,
    CostSummary,
    CriterionRecord,
    DoneTurn,
    ErrorTurn,
    TurnRecord,
)
from shared.scenarios.schemas import OPEN_STATUSES, RunStatus
from shared.settings import Settings
from shared.work import RUNS, claim_params

_runs = ScenarioRun.__table__
_turns = TurnResult.__table__
_results = CriterionResult.__table__
_orgs = Organization.__table__
_run = bindparam("p_run", type_=Uuid())
# Two comparisons, not IN: an IN list is re-rendered on every execution.
_open = or_(_runs.c.status == OPEN_STATUSES[0], _runs.c.status == OPEN_STATUSES[1])


async def _write(
    database: Database, statement: Statement, params: dict[str, Any], *, ends: bool = False
) -> Sequence[Any]:
    """A write recording what the agent and the judge said: it waits out a database that is
    away (:func:`shared.work.persist`) rather than have a redelivery call them again.
    ``ends``: the statement ends the run, and writes its batch's row (:func:`_room_to_end`)."""

    async def once() -> Sequence[Any]:
        async with database.connection() as conn:
            return await statement.rows(conn, **params)

    async def once_ending() -> Sequence[Any]:
        async with await _room_to_end(database):
            return await once()

    return await work.persist(once_ending if ends else once)


# Each direct pool's (one per engine and event loop), gone with it.
_ending: weakref.WeakKeyDictionary[AsyncConnectionPool, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


async def _room_to_end(database: Database) -> asyncio.Semaphore:
    """The room of the statements that end a run, in this process: half of the direct
    pool's connections (at least one).

    Each of those statements writes its batch's row last, and a batch's runs end together
    (a window in lockstep: same latency, same turns): they queue on that row, each holding
    its connection while it waits.  With nothing to bound them, a window's ends took every
    connection, and the runs handed out in their place waited for one to claim (``bench/
    batch.py --thousand``: 425 ms on average for a connection, 10 ms for the claim itself).
    Bounded to half, they still queue in PostgreSQL, which hands the row from one to the
    next without a round trip to this process."""
    pool = await direct_pool(database.engine)
    room = _ending.get(pool)
    if room is None:
        room = _ending[pool] = asyncio.Semaphore(max(1, pool.max_size // 2))
    return room


# --- the claim -----------------------------------------------------------------------------------


def _of_org(column: Any) -> Any:
    return select(column).where(_orgs.c.id == _runs.c.organization_id).scalar_subquery()


# The turns already committed, as one JSON array of DoneTurn.
_done = (
    select(
        func.coalesce(
            func.jsonb_agg(
                aggregate_order_by(shapes.json_object(DoneTurn, _turns), _turns.c.turn_index)
            ),
            literal_column("'[]'::jsonb"),
        )
    )
    .where(_turns.c.run_id == _run)
    .scalar_subquery()
)
# The claim and everything playing the run needs, the committed turns included, in one
# statement: its columns are Claimed's fields.
_CLAIM = Statement(
    RUNS.claim(_run, started_at=func.coalesce(_runs.c.started_at, NOW)).returning(
        *shapes.labeled(
            Claimed,
            _runs,
            outbound_version=_of_org(_orgs.c.outbound_version),
            business_information=func.coalesce(_of_org(_orgs.c.business_information), ""),
            done=_done,
        )
    )
)


async def claim(database: Database, settings: Settings, run_id: UUID) -> Claimed | None:
    """Move the run to ``running`` and read what playing it needs, the turns already
    committed included; ``None`` if it is terminal, gone, or being played by a delivery
    whose heartbeat is alive (:mod:`shared.work`).  Should a delivery thought dead still
    play, the turn writes settle which of the two goes on."""
    # Before waiting for a connection: the run started when it was claimed.
    params = claim_params(settings)
    async with database.connection() as conn:
        claimed = await _CLAIM.structs(conn, Claimed, p_run=run_id, **params)
    return claimed[0] if claimed else None


# --- turns and the end ----------------------------------------------------------------------------

_outcome = bindparam("p_outcome", type_=String())
# A turn is written only while the conversation goes on: a delivery that learnt its
# simulated user was done has settled it.
_playing = (_runs.c.status == "running", _runs.c.simulation_outcome.is_(None))

# Each locks the run row first: deliveries of one run write one at a time.
_TOUCH = (
    update(_runs)
    .where(_runs.c.id == _run, *_playing)
    .values(cost_summary=bindparam("p_cost"), updated_at=NOW)
    .returning(_runs.c.id, _runs.c.batch_run_id)
)
_END = (
    update(_runs)
    .where(_runs.c.id == _run, _open)
    .values(
        status=bindparam("p_status"),
        completed_at=NOW,
        updated_at=NOW,
        error_message=bindparam("p_error"),
        error_turn=bindparam("p_error_turn", type_=_runs.c.error_turn.type),
    )
    .returning(_runs.c.id, _runs.c.batch_run_id, _runs.c.status)
)
# The last turn and the run's end, together: the turn is written only while the run runs.
_TOUCH_AND_END = (
    update(_runs)
    .where(_runs.c.id == _run, *_playing)
    .values(
        cost_summary=bindparam("p_cost"),
        status=bindparam("p_status"),
        completed_at=NOW,
        updated_at=NOW,
    )
    .returning(_runs.c.id, _runs.c.batch_run_id, _runs.c.status)
)
# How the simulated conversation ended, once: a redelivery never asks the simulator again.
_SETTLE_OUTCOME = Statement(
    update(_runs)
    .where(_runs.c.id == _run, *_playing)
    .values(cost_summary=bindparam("p_cost"), simulation_outcome=_outcome, updated_at=NOW)
    .returning(_runs.c.id)
)
# The end of a conversation that went on past its scripted turns, or has conversation
# criteria: its cost, its outcome (if not settled already) and its status.
_CONCLUDE = (
    update(_runs)
    .where(_runs.c.id == _run, _runs.c.status == "running")
    .values(
        cost_summary=bindparam("p_cost"),
        status=bindparam("p_status"),
        simulation_outcome=func.coalesce(_runs.c.simulation_outcome, _outcome),
        completed_at=NOW,
        updated_at=NOW,
    )
    .returning(_runs.c.id, _runs.c.batch_run_id, _runs.c.status)
)
# The played turn (a TurnRecord), its criterion results, the turns a stopped run leaves
# unplayed and the conversation criteria's results (lists of CriterionRecord and
# TurnRecord) arrive as JSON: the statement is the same for any number of each.
_turn_given = shapes.recordset("p_turn", TurnRecord, _turns, one=True)
_results_given = shapes.recordset("p_results", CriterionRecord, _results)
_skipped_given = shapes.recordset("p_skipped", TurnRecord, _turns)
_conversation_given = shapes.recordset("p_conversation", CriterionRecord, _results)


def _count(cte: Any, label: str) -> Any:
    return select(func.count()).select_from(cte).scalar_subquery().label(label)


def _write_turns(given: Any, run_id: Any, *, after: Any) -> Insert:
    """The turns ``given`` (a recordset of TurnRecord) of the run ``run_id``, written for
    each row of ``after`` (one row, or none: then nothing is written)."""
    row = {**shapes.values(TurnRecord, given), "run_id": run_id, "created_at": NOW}
    return shapes.insert_from(_turns, row, after.join(given, true()))


def _in_one(run_change: Update, *, turn: bool, end: bool, conversation: bool = False) -> Statement:
    """``run_change`` (an UPDATE of the run ``RETURNING id, batch_run_id`` and, to end it,
    ``status``) with, in the same statement, the turn and its criterion results written
    after it (``turn``), the conversation criteria's results (``conversation``) and its
    batch's side of the end (``end``: :func:`shared.batches.window.settle`, which locks the
    batch row last); with a turn and the end, the turns left unplayed (``:p_skipped``) are
    written too."""
    run = run_change.cte("run")
    counts = [_count(run, "changed")]
    if conversation:
        judged = (
            shapes.insert_from(
                _results,
                {**shapes.values(CriterionRecord, _conversation_given), "run_id": run.c.id},
                run.join(_conversation_given, true()),
            )
            .returning(_results.c.id)
            .cte("conversation")
        )
        counts.append(_count(judged, "conversation"))
    if turn:
        written = (
            _write_turns(_turn_given, run.c.id, after=run)
            .returning(_turns.c.id, _turns.c.run_id)
            .cte("turn")
        )
        results = (
            shapes.insert_from(
                _results,
                {**shapes.values(CriterionRecord, _results_given), "turn_result_id": written.c.id},
                written.join(_results_given, true()),
            )
            .returning(_results.c.id)
            .cte("results")
        )
        counts.append(_count(results, "results"))
    if turn and end:
        skipped = (
            _write_turns(_skipped_given, written.c.run_id, after=written)
            .returning(_turns.c.id)
            .cte("skipped")
        )
        counts.append(_count(skipped, "skipped"))
    if end:
        counts += window.settle(run)
    return Statement(select(*counts))


_RECORD_IN_ONE = _in_one(_TOUCH, turn=True, end=False)
_RECORD_AND_END_IN_ONE = _in_one(_TOUCH_AND_END, turn=True, end=True)
_END_IN_ONE = _in_one(_END, turn=False, end=True)
_CONCLUDE_IN_ONE = _in_one(_CONCLUDE, turn=False, end=True, conversation=True)


async def record_turn(
    database: Database,
    run_id: UUID,
    turn: TurnRecord,
    results: list[CriterionRecord],
    cost: CostSummary,
    *,
    end: RunStatus | None = None,
    skipped: Sequence[int] = (),
) -> list[UUID] | None:
    """Write one turn, its criterion results and the run's cost so far, all or nothing —
    and, for the run's last turn, its end as ``end`` (see :func:`end`) with the turns it
    leaves unplayed (``skipped``, their indexes), in the same commit.

    ``None`` when the run is no longer running or the turn is already written (another
    delivery got there first); otherwise the successors the end handed out (none without
    ``end``)."""
    params: dict[str, Any] = {
        "p_run": run_id,
        "p_cost": cost,
        "now": utcnow(),
        "p_turn": turn,
        "p_results": results,
    }
    if end is None:
        if skipped:
            raise ValueError("turns are skipped only by the run's end")
        statement = _RECORD_IN_ONE
    else:
        statement = _RECORD_AND_END_IN_ONE
        params["p_status"] = end
        params["p_skipped"] = [TurnRecord.unplayed(index) for index in skipped]
    try:
        (written,) = await _write(database, statement, params, ends=end is not None)
    except psycopg.IntegrityError:
        return None
    if not written.changed:
        return None
    return [written.successor] if end is not None and written.successor else []


async def end(
    database: Database,
    run_id: UUID,
    status: RunStatus,
    error: str | None,
    error_turn: ErrorTurn | None = None,
) -> list[UUID] | None:
    """Move a ``pending`` or ``running`` run to ``status`` (with the ``error`` and the
    ``error_turn`` it ended on, for ``error``) and, atomically with it, count it in its
    batch and hand out the run that takes its place.

    ``None`` when this changed nothing (the run was already terminal); otherwise the
    successors to send (none outside a batch, or when nothing is left to hand out)."""
    params = {
        "p_run": run_id,
        "p_status": status,
        "p_error": error,
        "p_error_turn": error_turn,
        "now": utcnow(),
    }
    (ended,) = await _write(database, _END_IN_ONE, params, ends=True)
    if not ended.changed:
        return None
    return [ended.successor] if ended.successor is not None else []


async def settle_outcome(database: Database, run_id: UUID, outcome: str, cost: CostSummary) -> bool:
    """Record how the run's simulated conversation ended (with the run's cost so far),
    once: ``False`` when another delivery settled it first or the run is no longer
    running."""
    params = {"p_run": run_id, "p_outcome": outcome, "p_cost": cost, "now": utcnow()}
    return bool(await _write(database, _SETTLE_OUTCOME, params))


async def conclude(
    database: Database,
    run_id: UUID,
    status: RunStatus,
    cost: CostSummary,
    *,
    outcome: str | None,
    results: list[CriterionRecord],
) -> list[UUID] | None:
    """End a running run whose conversation is over as ``status``: its cost, its simulation
    ``outcome`` (unless one is settled already) and its conversation criteria's
    ``results``, with its batch's side (see :func:`end`), in one commit.  ``None`` when
    another delivery ended it first; otherwise the successors to send."""
    params = {
        "p_run": run_id,
        "p_status": status,
        "p_cost": cost,
        "p_outcome": outcome,
        "p_conversation": results,
        "now": utcnow(),
    }
    try:
        (ended,) = await _write(database, _CONCLUDE_IN_ONE, params, ends=True)
    except psycopg.IntegrityError:
        return None
    if not ended.changed:
        return None
    return [ended.successor] if ended.successor is not None else []


# --- the trace ---------------------------------------------------------------------------------

# The run's trace id set to the delivery's, in a statement that also reads what the run's
# span needs beyond the claim, and the trace id it replaces ("previous": the row as it was).
_previous = _runs.alias("previous")
_TRACE = Statement(
    update(_runs)
    .where(_runs.c.id == _run, _runs.c.status == "running", _previous.c.id == _runs.c.id)
    .values(trace_id=bindparam("p_trace"), updated_at=NOW)
    .returning(
        _runs.c.scenario_id,
        _runs.c.batch_run_id,
        _previous.c.trace_id.label("previous_trace_id"),
    )
)


async def trace(database: Database, run_id: UUID, trace_id: str) -> Any | None:
    """Record ``trace_id`` (32 hex digits) as the trace of the running run ``run_id``; its
    ``scenario_id``, ``batch_run_id`` and the ``previous_trace_id`` it replaced, or ``None``
    when the run is not running."""
    async with database.connection() as conn:
        rows = await _TRACE.rows(conn, p_run=run_id, p_trace=trace_id, now=utcnow())
    return rows[0] if rows else None


# --- boot -----------------------------------------------------------------------------------------


async def rehearse(connection: AsyncConnection[Any]) -> None:
    """Execute every statement of the run engine once on ``connection``, for a run id that
    names no run: nothing is read, written or locked (each statement starts from an UPDATE
    of that one run, which matches nothing).  A worker does this at boot on each of its
    connections, so that the first window of a batch — a burst of runs reaching every
    statement at once — does not find each connection's backend planning its first
    statements on cold catalog caches."""
    now = utcnow()
    nobody = {"p_run": uuid.uuid4(), "now": now}
    turn = {**nobody, "p_cost": CostSummary(), "p_turn": TurnRecord.unplayed(0), "p_results": []}
    await _CLAIM.structs(connection, Claimed, **nobody, p_stale=now)
    await _RECORD_IN_ONE.rows(connection, **turn)
    await _RECORD_AND_END_IN_ONE.rows(connection, **turn, p_status=RunStatus.PASSED, p_skipped=[])
    await _END_IN_ONE.rows(
        connection, **nobody, p_status=RunStatus.ERROR, p_error=None, p_error_turn=None
    )
    await _SETTLE_OUTCOME.rows(connection, **nobody, p_cost=CostSummary(), p_outcome="gave_up")
    await _CONCLUDE_IN_ONE.rows(
        connection,
        **nobody,
        p_cost=CostSummary(),
        p_status=RunStatus.PASSED,
        p_outcome=None,
        p_conversation=[],
    )
