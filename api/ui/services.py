"""What the UI's pages show that no API body carries as such: a run's transcript under the
name of the scenario it played (from the run's snapshot), a batch's badge, the order its
runs are listed in."""

from __future__ import annotations

from uuid import UUID

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from shared.batches.schemas import BatchRunItemSummary, BatchRunRead, BatchStatus
from shared.identity.access import OrgAccess
from shared.scenarios import services as scenarios
from shared.scenarios.records import Snapshot
from shared.scenarios.schemas import RunStatus, ScenarioRunRead


class Transcript(msgspec.Struct, frozen=True):
    run: ScenarioRunRead
    scenario_name: str


async def transcript(session: AsyncSession, *, access: OrgAccess, run_id: UUID) -> Transcript:
    """The run of the organization with its turns and verdicts (404 for another's run)."""
    run = await scenarios.get_run(session, access=access, run_id=run_id)
    snapshot = msgspec.convert(run.snapshot, Snapshot)
    return Transcript(run=scenarios.run_read(run, with_results=True), scenario_name=snapshot.name)


class Badge(msgspec.Struct, frozen=True):
    """A batch's status as its pages show it: what happened, and its colour (``tone``, a
    run status's: ``passed`` is green, ``failed`` and ``error`` red, ``running`` amber)."""

    text: str
    tone: str


def badge(batch: BatchRunRead) -> Badge:
    """Green only for a batch whose every run passed; a batch that completed with failed or
    errored runs says how many, in red."""
    if batch.status in (BatchStatus.QUEUED, BatchStatus.RUNNING):
        return Badge(batch.status.value, "running")
    bad = []
    if batch.failed_scenarios:
        bad.append(f"{batch.failed_scenarios} failed")
    if batch.error_scenarios:
        errors = batch.error_scenarios
        bad.append(f"{errors} error" if errors == 1 else f"{errors} errors")
    if batch.status == BatchStatus.ERROR:
        return Badge(f"error: {', '.join(bad)}" if bad else "error", "error")
    if not bad:
        return Badge("all passed" if batch.total_scenarios else "completed", "passed")
    return Badge(f"completed: {', '.join(bad)}", "error" if batch.error_scenarios else "failed")


# Failed and errored runs first, then the others in the batch's order.
_FIRST = {RunStatus.ERROR: 0, RunStatus.FAILED: 1}


def runs_in_order(batch: BatchRunRead) -> list[BatchRunItemSummary]:
    """The batch's runs as its page lists them: those that errored, then those that failed,
    then the rest, each in the batch's order."""
    runs = batch.runs if isinstance(batch.runs, list) else []
    return sorted(runs, key=lambda run: _FIRST.get(run.status, 2))
