"""What a replay's run re-judges (DESIGN §5.11): the stored transcript of the run it replays.

A replay's run (``replay_of_run_id``) plays the scenario as it is now (its snapshot, taken
when the replay was created: the current criteria, per turn by position, and the current
conversation criteria) on the conversation its source run stored: each turn's user message,
the agent's reply (redacted, as stored), its tool calls and knowledge, the simulated turns
and how the simulated conversation ended.  Neither the agent nor the simulator is called;
the judge is (the agent's current one).

It cannot be replayed, and ends in error saying why, when the source run is gone or ended
in error (no whole transcript), when the scenario was deleted, or when the scenario's
scripted turns changed in number since the source run played them ("scenario changed").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import msgspec
from sqlalchemy import exists, select

from shared.db.engine import Database
from shared.db.models import Scenario, ScenarioRun, TurnResult
from shared.outbound.schemas import ToolCall
from shared.scenarios.records import Snapshot

SCENARIO_CHANGED = "scenario changed"


class NotReplayable(Exception):
    """The source run's transcript cannot be re-judged with the scenario as it is now."""


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """One turn of the source run as it was committed."""

    turn_index: int
    user_message: str
    response_content: str
    tool_calls: list[ToolCall]
    knowledge: list[Any] | None
    redacted_keys: list[str]
    refusal: bool
    source: str


@dataclass(frozen=True, slots=True)
class Transcript:
    """The source run's conversation: its played turns by index, its simulated turns in
    order, and how its simulated conversation ended."""

    run_id: UUID
    turns: dict[int, StoredTurn]
    simulated: list[StoredTurn] = field(default_factory=list)
    simulation_outcome: str | None = None


async def load(
    database: Database, *, run_id: UUID, source_id: UUID, snapshot: Snapshot
) -> Transcript:
    """The transcript the replay's run ``run_id`` re-judges with ``snapshot`` (its own,
    the scenario as it is now); raises :class:`NotReplayable` saying why it cannot."""
    async with database.transaction() as session:
        replay = await session.get(ScenarioRun, run_id)
        source = await session.get(ScenarioRun, source_id)
        if source is None:
            raise NotReplayable(f"replay: the replayed run {source_id} no longer exists")
        if source.status == "error":
            raise NotReplayable(
                f"replay: the replayed run {source_id} ended in error, its conversation is "
                f"incomplete ({source.error_message})"
            )
        scenario_id = replay.scenario_id if replay is not None else source.scenario_id
        if not await session.scalar(select(exists().where(Scenario.id == scenario_id))):
            raise NotReplayable(
                f"{SCENARIO_CHANGED}: scenario {scenario_id} was deleted since run "
                f"{source_id} played it"
            )
        then = len((source.snapshot or {}).get("turns") or [])
        now = len(snapshot.turns)
        if now != then:
            raise NotReplayable(
                f"{SCENARIO_CHANGED}: it has {now} scripted turn{'s' * (now != 1)} now, "
                f"{then} when run {source_id} played it"
            )
        rows = await session.scalars(
            select(TurnResult)
            .where(TurnResult.run_id == source_id, TurnResult.skipped.is_(False))
            .order_by(TurnResult.turn_index)
        )
        turns = [
            StoredTurn(
                turn_index=row.turn_index,
                user_message=row.user_message,
                response_content=row.response_content,
                tool_calls=msgspec.convert(row.tool_calls or [], list[ToolCall]),
                knowledge=row.knowledge,
                redacted_keys=list(row.redacted_keys or []),
                refusal=row.refusal,
                source=row.source,
            )
            for row in rows
        ]
        return Transcript(
            run_id=source_id,
            turns={turn.turn_index: turn for turn in turns},
            simulated=[turn for turn in turns if turn.source == "simulated"],
            simulation_outcome=source.simulation_outcome,
        )
