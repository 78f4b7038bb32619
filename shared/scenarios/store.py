"""Where the run engine reads and writes a run: its claim, its turns, its end.

A batch executes these thousands of times a minute, so they are built once, as Core
statements, and each state change costs as little as the backend allows:

every state change is **one statement that commits on its own** (data-modifying CTEs),
executed straight on psycopg (:mod:`shared.db.direct`): the claim with the turns already
committed; a turn with its criterion results and the run's cost; a run's end with its
batch's side (:func:`shared.batches.window.settle`: its count and its successor's
hand-out) and, when a failed required turn stopped it, the turns left unplayed, recorded
as skipped.  Atomic by itself, with no BEGIN or COMMIT round trip, and its row locks
released the moment it ends — the batch row, which every run of a batch writes, is never
held across a round trip to a busy worker.

Every change is guarded in SQL, so a redelivered message changes nothing twice: a claim
only takes a run that is pending, or running with a dead heartbeat (:mod:`shared.work`),
and counts the delivery; a turn is written only while the run is
``running`` and once per ``(run, turn_index)``, an end only moves a ``pending`` or
``running`` run.  No parameter is named after a column: Core would add it to an
UPDATE's SET clause.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import msgspec
import psycopg
from psycopg import AsyncConnection
from sqlalchemy import (
    Boolean,
    Integer,
    Text,
    Update,
    Uuid,
    bindparam,
    column,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by

from shared import work
from shared.batches import window
from shared.db.base import NOW, utcnow
from shared.db.direct import Statement
from shared.db.engine import Database
from shared.db.models import CriterionResult, Organization, ScenarioRun, TurnResult
from shared.scenarios.records import (
    CostSummary,
    CriterionRecord,
    DoneTurn,
    Snapshot,
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


async def _write(database: Database, statement: Statement, params: dict[str, Any]) -> Sequence[Any]:
    """A write recording what the agent and the judge said: it waits out a database that is
    away (:func:`shared.work.persist`) rather than have a redelivery call them again."""

    async def once() -> Sequence[Any]:
        async with database.connection() as conn:
            return await statement.rows(conn, **params)

    return await work.persist(once)


# --- the claim -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    organization_id: UUID
    agent_id: UUID
    session_id: str | None
    snapshot: Snapshot
    cost_summary: CostSummary
    outbound_version: int  # the organization's, for the outbound configuration cache
    business_information: str
    done: list[DoneTurn]
    attempts: int  # deliveries that claimed the run, this one included (shared.work)


_CLAIM = RUNS.claim(_run, started_at=func.coalesce(_runs.c.started_at, NOW)).returning(
    _runs.c.organization_id,
    _runs.c.agent_id,
    _runs.c.session_id,
    _runs.c.snapshot,
    _runs.c.cost_summary,
    _runs.c.attempts,
    select(_orgs.c.outbound_version)
    .where(_orgs.c.id == _runs.c.organization_id)
    .scalar_subquery()
    .label("outbound_version"),
    select(_orgs.c.business_information)
    .where(_orgs.c.id == _runs.c.organization_id)
    .scalar_subquery()
    .label("business_information"),
)
_DONE_FIELDS = DoneTurn.__struct_fields__

# The claim and the turns already committed in one statement (the turns as one JSON array).
_claimed = _CLAIM.cte("claimed")
_done = (
    select(
        func.coalesce(
            func.jsonb_agg(
                aggregate_order_by(
                    func.jsonb_build_object(
                        *(part for name in _DONE_FIELDS for part in (name, _turns.c[name]))
                    ),
                    _turns.c.turn_index,
                )
            ),
            literal_column("'[]'::jsonb"),
        )
    )
    .where(_turns.c.run_id == _run)
    .scalar_subquery()
)
_CLAIM_IN_ONE = Statement(select(_claimed, _done.label("done")))


async def claim(database: Database, settings: Settings, run_id: UUID) -> Claimed | None:
    """Move the run to ``running`` and read what playing it needs, the turns already
    committed included; ``None`` if it is terminal, gone, or being played by a delivery
    whose heartbeat is alive (:mod:`shared.work`).  Should a delivery thought dead still
    play, the turn writes settle which of the two goes on."""
    # Before waiting for a connection: the run started when it was claimed.
    params = claim_params(settings)
    async with database.connection() as conn:
        runs = await _CLAIM_IN_ONE.rows(conn, p_run=run_id, **params)
    if not runs:
        return None
    run = runs[0]
    return Claimed(
        organization_id=run.organization_id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        snapshot=msgspec.convert(run.snapshot, Snapshot),
        cost_summary=msgspec.convert(run.cost_summary or {}, CostSummary),
        outbound_version=run.outbound_version,
        business_information=run.business_information or "",
        done=msgspec.convert(run.done, list[DoneTurn]),
        attempts=run.attempts,
    )


# --- turns and the end ----------------------------------------------------------------------------

# Each locks the run row first: deliveries of one run write one at a time.
_TOUCH = (
    update(_runs)
    .where(_runs.c.id == _run, _runs.c.status == "running")
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
    )
    .returning(_runs.c.id, _runs.c.batch_run_id, _runs.c.status)
)
# The last turn and the run's end, together: the turn is written only while the run runs.
_TOUCH_AND_END = (
    update(_runs)
    .where(_runs.c.id == _run, _runs.c.status == "running")
    .values(
        cost_summary=bindparam("p_cost"),
        status=bindparam("p_status"),
        completed_at=NOW,
        updated_at=NOW,
    )
    .returning(_runs.c.id, _runs.c.batch_run_id, _runs.c.status)
)
_TURN_COLUMNS = (
    "id",
    "run_id",
    "turn_index",
    "user_message",
    "response_content",
    "passed",
    "stopped_early",
    "skipped",
    "created_at",
    "knowledge",
    "redacted_keys",
)
_RESULT_COLUMNS = (
    "id",
    "turn_result_id",
    "criteria_id",
    "order_index",
    "verdict",
    "critique",
    "evidence",
    "input_tokens",
    "output_tokens",
)
_turn_values = (
    bindparam("p_turn", type_=Uuid()),
    bindparam("p_turn_index", type_=Integer()),
    bindparam("p_user_message", type_=Text()),
    bindparam("p_response", type_=Text()),
    bindparam("p_passed", type_=Boolean()),
    bindparam("p_stopped", type_=Boolean()),
)
# The criterion results arrive as one JSON array: the statement is the same for any number.
_results_given = (
    func.jsonb_to_recordset(bindparam("p_results", type_=JSONB()))
    .table_valued(
        column("id", Uuid()),
        column("criteria_id", Uuid()),
        column("order_index", Integer()),
        column("verdict", Text()),
        column("critique", Text()),
        column("evidence", Text()),
        column("input_tokens", Integer()),
        column("output_tokens", Integer()),
    )
    .render_derived(with_types=True)
)
# The turns a stopped run leaves unplayed (ids and indexes), one JSON array too.
_skipped_given = (
    func.jsonb_to_recordset(bindparam("p_skipped", type_=JSONB()))
    .table_valued(column("id", Uuid()), column("turn_index", Integer()))
    .render_derived(with_types=True)
)


def _in_one(run_change: Update, *, turn: bool, end: bool) -> Statement:
    """``run_change`` (an UPDATE of the run ``RETURNING id, batch_run_id`` and, to end it,
    ``status``) with, in the same statement, the turn and its criterion results written
    after it (``turn``) and its batch's side of the end (``end``:
    :func:`shared.batches.window.settle`, which locks the batch row last); with both, the
    turns left unplayed (``:p_skipped``) are written too."""
    run = run_change.cte("run")
    counts = [select(func.count()).select_from(run).scalar_subquery().label("changed")]
    if turn:
        written = (
            insert(_turns)
            .from_select(
                _TURN_COLUMNS,
                select(
                    _turn_values[0],
                    run.c.id,
                    *_turn_values[1:],
                    false(),
                    NOW,
                    bindparam("p_knowledge", type_=JSONB()),
                    bindparam("p_redacted_keys", type_=JSONB()),
                ),
            )
            .returning(_turns.c.id, _turns.c.run_id)
            .cte("turn")
        )
        results = (
            insert(_results)
            .from_select(
                _RESULT_COLUMNS,
                select(
                    _results_given.c.id,
                    written.c.id,
                    *(_results_given.c[name] for name in _RESULT_COLUMNS[2:]),
                ).select_from(written.join(_results_given, true())),
            )
            .returning(_results.c.id)
            .cte("results")
        )
        counts.append(select(func.count()).select_from(results).scalar_subquery().label("results"))
    if turn and end:
        empty = literal("")
        skipped = (
            insert(_turns)
            .from_select(
                _TURN_COLUMNS,
                select(
                    _skipped_given.c.id,
                    written.c.run_id,
                    _skipped_given.c.turn_index,
                    empty,
                    empty,
                    false(),
                    false(),
                    true(),
                    NOW,
                    null(),
                    literal_column("'[]'::jsonb"),
                ).select_from(written.join(_skipped_given, true())),
            )
            .returning(_turns.c.id)
            .cte("skipped")
        )
        counts.append(select(func.count()).select_from(skipped).scalar_subquery().label("skipped"))
    if end:
        counts += window.settle(run)
    return Statement(select(*counts))


_RECORD_IN_ONE = _in_one(_TOUCH, turn=True, end=False)
_RECORD_AND_END_IN_ONE = _in_one(_TOUCH_AND_END, turn=True, end=True)
_END_IN_ONE = _in_one(_END, turn=False, end=True)


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
        "p_turn": turn.id,
        "p_turn_index": turn.turn_index,
        "p_user_message": turn.user_message,
        "p_response": turn.response_content,
        "p_passed": turn.passed,
        "p_stopped": turn.stopped_early,
        "p_results": results,
        "p_knowledge": turn.knowledge,
        "p_redacted_keys": turn.redacted_keys,
    }
    if end is None:
        if skipped:
            raise ValueError("turns are skipped only by the run's end")
        statement = _RECORD_IN_ONE
    else:
        statement = _RECORD_AND_END_IN_ONE
        params["p_status"] = end
        params["p_skipped"] = [{"id": uuid.uuid4(), "turn_index": index} for index in skipped]
    try:
        (written,) = await _write(database, statement, params)
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
) -> list[UUID] | None:
    """Move a ``pending`` or ``running`` run to ``status`` and, atomically with it, count it
    in its batch and hand out the run that takes its place.

    ``None`` when this changed nothing (the run was already terminal); otherwise the
    successors to send (none outside a batch, or when nothing is left to hand out)."""
    params = {"p_run": run_id, "p_status": status, "p_error": error, "now": utcnow()}
    (ended,) = await _write(database, _END_IN_ONE, params)
    if not ended.changed:
        return None
    return [ended.successor] if ended.successor is not None else []


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
    turn = {
        **nobody,
        "p_cost": CostSummary(),
        "p_turn": uuid.uuid4(),
        "p_turn_index": 0,
        "p_user_message": "",
        "p_response": "",
        "p_passed": True,
        "p_stopped": False,
        "p_results": [],
        "p_knowledge": None,
        "p_redacted_keys": [],
    }
    await _CLAIM_IN_ONE.rows(connection, **nobody, p_stale=now)
    await _RECORD_IN_ONE.rows(connection, **turn)
    await _RECORD_AND_END_IN_ONE.rows(connection, **turn, p_status=RunStatus.PASSED, p_skipped=[])
    await _END_IN_ONE.rows(connection, **nobody, p_status=RunStatus.ERROR, p_error=None)
