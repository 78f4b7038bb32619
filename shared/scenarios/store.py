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
held across a round trip to a busy worker.  The one exception is a group of a batch's ends
(below): a transaction of several such statements, still sent in one round trip.

A run's end writes its batch's row last, and a batch's runs end together (a window in
lockstep), so its ends would queue on that row one after the other.  A process writes its
ends of one batch one group at a time (:func:`_end`): the first alone, in one statement;
those that arrive while it is written wait in the process, and are then written together
in one transaction sent at once — each run's statement, the batch's side of them all in
one statement, the commit — so the batch row is taken once per group, not once per run.
Groups of different batches hold at most half of the pool's connections at once, so that
the claims and turns of the process's other runs never wait for one behind them.

Every change is guarded in SQL, so a redelivered message changes nothing twice: a claim
only takes a run that is pending, or running with a dead heartbeat (:mod:`shared.work`),
and counts the delivery; a turn is written only while the run is
``running`` with no simulation outcome yet and once per ``(run, turn_index)``, an
outcome only once, an end only moves a ``pending`` or ``running`` run.  No parameter is
named after a column: Core would add it to an UPDATE's SET clause.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any
from uuid import UUID

import msgspec
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import (
    ARRAY,
    Insert,
    String,
    Update,
    Uuid,
    any_,
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
from shared.db.errors import database_unavailable
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

log = logging.getLogger(__name__)
_runs = ScenarioRun.__table__
_turns = TurnResult.__table__
_results = CriterionResult.__table__
_orgs = Organization.__table__
_run = bindparam("p_run", type_=Uuid())
# Two comparisons, not IN: an IN list is re-rendered on every execution.
_open = or_(_runs.c.status == OPEN_STATUSES[0], _runs.c.status == OPEN_STATUSES[1])


async def _write(database: Database, statement: Statement, params: dict[str, Any]) -> Sequence[Any]:
    """A write recording what the agent and the judge said: it waits out a database that is
    away (:func:`shared.work.persist`) rather than have a redelivery call them again."""

    async def once() -> Sequence[Any]:
        async with database.connection() as conn:
            return await statement.rows(conn, **params)

    return await work.persist(once)


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


class Unreadable(Exception):
    """A claimed run whose stored row cannot be read as :class:`Claimed` (its snapshot
    written in a shape this code does not read): it can never be played.  The message says
    where (a path in the row, never a value)."""


async def claim(database: Database, settings: Settings, run_id: UUID) -> Claimed | None:
    """Move the run to ``running`` and read what playing it needs, the turns already
    committed included; ``None`` if it is terminal, gone, or being played by a delivery
    whose heartbeat is alive (:mod:`shared.work`).  Should a delivery thought dead still
    play, the turn writes settle which of the two goes on.  Raises :class:`Unreadable`,
    the run claimed, when its row cannot be read: the caller ends it."""
    # Before waiting for a connection: the run started when it was claimed.
    params = claim_params(settings)
    async with database.connection() as conn:
        try:
            claimed = await _CLAIM.structs(conn, Claimed, p_run=run_id, **params)
        except msgspec.ValidationError as exc:
            raise Unreadable(f"its stored row cannot be read ({exc})") from None
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
_END_RUN = (
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
_CONCLUDE_RUN = (
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


def _in_one(
    run_change: Update, *, turn: bool, end: bool, conversation: bool = False, batch: bool = True
) -> Statement:
    """``run_change`` (an UPDATE of the run ``RETURNING id, batch_run_id`` and, to end it,
    ``status``) with, in the same statement, the turn and its criterion results written
    after it (``turn``), the conversation criteria's results (``conversation``) and, to end
    it (``end``), its batch's side (``batch``: :func:`shared.batches.window.settle`, which
    locks the batch row last); with a turn and the end, the turns left unplayed
    (``:p_skipped``) are written too."""
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
    if end and batch:
        counts += window.settle(run)
    return Statement(select(*counts))


@dataclass(frozen=True, slots=True)
class _Ending:
    """A run's end in its two forms: ``alone``, with its batch's side, committing on its
    own; ``together``, the run's side only, for a transaction that ends several runs of a
    batch and then settles them all (:data:`_SETTLE_TOGETHER`)."""

    alone: Statement
    together: Statement

    @classmethod
    def of(cls, run_change: Update, *, turn: bool, conversation: bool = False) -> _Ending:
        def form(batch: bool) -> Statement:
            return _in_one(run_change, turn=turn, end=True, conversation=conversation, batch=batch)

        return cls(alone=form(True), together=form(False))


_RECORD_IN_ONE = _in_one(_TOUCH, turn=True, end=False)
_RECORD_AND_END = _Ending.of(_TOUCH_AND_END, turn=True)
_END = _Ending.of(_END_RUN, turn=False)
_CONCLUDE = _Ending.of(_CONCLUDE_RUN, turn=False, conversation=True)

# The batch's side of the runs a group's transaction ended (:func:`_together`): those of
# ``:p_runs`` this very transaction moved — their row version is its own (``xmin``) — and
# not those another delivery had ended before it (their statements changed nothing).
_ended_together = (
    select(_runs.c.batch_run_id, _runs.c.status)
    .where(
        _runs.c.id == any_(bindparam("p_runs", type_=ARRAY(Uuid()))),
        _runs.c.batch_run_id == bindparam("p_batch", type_=Uuid()),
        literal_column(f"{_runs.name}.xmin") == literal_column("pg_current_xact_id()::xid"),
    )
    .cte("ended")
)
_SETTLE_TOGETHER = Statement(
    select(*window.settle(_ended_together, batch_id=bindparam("p_batch", type_=Uuid())))
)


async def record_turn(
    database: Database,
    run_id: UUID,
    turn: TurnRecord,
    results: list[CriterionRecord],
    cost: CostSummary,
    *,
    batch_id: UUID | None = None,
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
    try:
        if end is None:
            if skipped:
                raise ValueError("turns are skipped only by the run's end")
            (written,) = await _write(database, _RECORD_IN_ONE, params)
            return [] if written.changed else None
        params["p_status"] = end
        params["p_skipped"] = [TurnRecord.unplayed(index) for index in skipped]
        return await _end(database, batch_id, _RECORD_AND_END, params)
    except psycopg.IntegrityError:
        return None


async def end(
    database: Database,
    run_id: UUID,
    status: RunStatus,
    error: str | None,
    error_turn: ErrorTurn | None = None,
    *,
    batch_id: UUID | None = None,
) -> list[UUID] | None:
    """Move a ``pending`` or ``running`` run of the batch ``batch_id`` (``None``: of none) to
    ``status`` (with the ``error`` and the ``error_turn`` it ended on, for ``error``) and,
    atomically with it, count it in its batch and hand out the run that takes its place.

    ``None`` when this changed nothing (the run was already terminal); otherwise the
    successors to send (none outside a batch, or when nothing is left to hand out)."""
    params = {
        "p_run": run_id,
        "p_status": status,
        "p_error": error,
        "p_error_turn": error_turn,
        "now": utcnow(),
    }
    return await _end(database, batch_id, _END, params)


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
    batch_id: UUID | None = None,
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
        return await _end(database, batch_id, _CONCLUDE, params)
    except psycopg.IntegrityError:
        return None


# --- a batch's ends, written together -------------------------------------------------------------


@dataclass(slots=True)
class _End:
    """A run's end waiting to be written: the statement, its parameters, its outcome (what
    :func:`_end` returns)."""

    ending: _Ending
    params: dict[str, Any]
    done: asyncio.Future[list[UUID] | None]


class _Ends:
    """The run ends of a process's direct pool: the room they have (half of its
    connections, at least one), and, for each batch one of whose groups is being written,
    the ends waiting for the next."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.room = asyncio.Semaphore(max(1, pool.max_size // 2))
        self.waiting: dict[UUID, list[_End]] = {}
        self.writers: set[asyncio.Task[None]] = set()


# Each direct pool's (one per engine and event loop), gone with it.
_ends: weakref.WeakKeyDictionary[AsyncConnectionPool, _Ends] = weakref.WeakKeyDictionary()


async def _end(
    database: Database, batch_id: UUID | None, ending: _Ending, params: dict[str, Any]
) -> list[UUID] | None:
    """End a run (``params["p_run"]``) of the batch ``batch_id``: ``None`` when its
    statement changed nothing, else the successors its end handed out.

    A batch's runs end together, and each end writes the batch row last: one after the
    other, they queued on it (``bench/batch.py --thousand``, 2026-11-28: a window's last
    commit came 230-340 ms after its runs' last answers on average, a turn's 3-13 ms).
    So the process writes a batch's ends one group at a time: an end that finds none of the
    batch's being written goes alone at once; those that arrive meanwhile are written
    together next (:func:`_write_ends`).  A run outside a batch has no batch row to queue on."""
    if batch_id is None:
        return await _alone(database, ending, params)
    pool = await direct_pool(database.engine)
    ends = _ends.get(pool)
    if ends is None:
        ends = _ends[pool] = _Ends(pool)
    end = _End(ending, params, asyncio.get_running_loop().create_future())
    waiting = ends.waiting.get(batch_id)
    if waiting is not None:
        waiting.append(end)
    else:
        ends.waiting[batch_id] = [end]
        writer = asyncio.create_task(_write_ends(database, ends, batch_id))
        ends.writers.add(writer)
        writer.add_done_callback(ends.writers.discard)
    return await end.done


async def _write_ends(database: Database, ends: _Ends, batch_id: UUID) -> None:
    """Write the batch's waiting ends, all those waiting at each pass together, until none
    is left; each end's caller gets its outcome, or the error that stopped its write."""
    group: list[_End] = []
    try:
        while ends.waiting[batch_id]:
            async with ends.room:
                group, ends.waiting[batch_id] = ends.waiting[batch_id], []
                outcomes = await _outcomes(database, batch_id, group)
            for end, outcome in zip(group, outcomes, strict=True):
                if end.done.done():  # its caller was cancelled
                    continue
                if isinstance(outcome, BaseException):
                    end.done.set_exception(outcome)
                else:
                    end.done.set_result(outcome)
            group = []
    finally:
        for end in [*group, *ends.waiting.pop(batch_id, [])]:
            end.done.cancel()


async def _outcomes(
    database: Database, batch_id: UUID, group: list[_End]
) -> list[list[UUID] | None | BaseException]:
    """What writing each end of ``group`` came to: together when there are several, alone
    otherwise, or when one of them cannot be written (a turn another delivery wrote first,
    a value the database refuses): then each on its own, as it would have been, so that
    what one run's end meets is that run's alone.  The database away (past
    :func:`shared.work.persist`'s wait) fails them all: each would meet it."""
    if len(group) > 1:
        try:
            return await work.persist(partial(_together, database, batch_id, group))
        except Exception as exc:
            if database_unavailable(exc):
                return [exc] * len(group)
            diag = getattr(exc, "diag", None)  # a database error's (no value of the run's)
            code = (diag.constraint_name or diag.sqlstate) if diag is not None else None
            log.info(
                "a group of %d ends written one by one: %s (%s)",
                len(group),
                type(exc).__name__,
                code or "-",
            )
    outcomes: list[list[UUID] | None | BaseException] = []
    for end in group:
        try:
            outcomes.append(await _alone(database, end.ending, end.params))
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


async def _alone(database: Database, ending: _Ending, params: dict[str, Any]) -> list[UUID] | None:
    """One run's end with its batch's side, in one statement that commits on its own."""
    (ended,) = await _write(database, ending.alone, params)
    return list(ended.successors or ()) if ended.changed else None


async def _together(
    database: Database, batch_id: UUID, group: list[_End]
) -> list[list[UUID] | None]:
    """End the runs of ``group`` (of the batch ``batch_id``) in one transaction sent at once:
    each run's statement, the batch's side of those they moved (:data:`_SETTLE_TOGETHER`:
    one count, as many successors handed out), the commit.  One round trip, and the batch
    row is held from the settle to the commit only, never across a round trip.  The runs
    are locked in one order (by id), so two groups never wait for each other in a cycle."""
    in_order = sorted(group, key=lambda end: end.params["p_run"])
    async with database.connection() as conn:
        try:
            async with conn.pipeline():
                await conn.execute(b"BEGIN")
                sent = [await end.ending.together.sent(conn, **end.params) for end in in_order]
                settled = await _SETTLE_TOGETHER.sent(
                    conn,
                    p_batch=batch_id,
                    p_runs=[end.params["p_run"] for end in in_order],
                    now=utcnow(),
                )
                await conn.execute(b"COMMIT")
        except psycopg.Error:
            if not conn.broken:
                await conn.rollback()  # a statement failed: the pipeline skipped the commit
            raise
        changed = {}
        for end, cursor in zip(in_order, sent, strict=True):
            (ended,) = await cursor.fetchall()
            changed[id(end)] = bool(ended.changed)
        (counted,) = await settled.fetchall()
    successors = list(counted.successors or ())
    # Every run moved was counted, and handed out at most one successor each.
    return [
        ([successors.pop()] if successors else []) if changed[id(end)] else None for end in group
    ]


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
    endings = {
        _RECORD_AND_END: {**turn, "p_status": RunStatus.PASSED, "p_skipped": []},
        _END: {**nobody, "p_status": RunStatus.ERROR, "p_error": None, "p_error_turn": None},
        _CONCLUDE: {
            **nobody,
            "p_cost": CostSummary(),
            "p_status": RunStatus.PASSED,
            "p_outcome": None,
            "p_conversation": [],
        },
    }
    for ending, params in endings.items():
        await ending.alone.rows(connection, **params)
        await ending.together.rows(connection, **params)
    await _SETTLE_TOGETHER.rows(connection, p_batch=uuid.uuid4(), p_runs=[nobody["p_run"]], now=now)
    await _SETTLE_OUTCOME.rows(connection, **nobody, p_cost=CostSummary(), p_outcome="gave_up")
