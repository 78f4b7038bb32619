"""What the UI's pages show that no API body carries as such: a run's transcript under the
name of the scenario it played (from the run's snapshot)."""

from __future__ import annotations

from uuid import UUID

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from shared.identity.access import OrgAccess
from shared.scenarios import services as scenarios
from shared.scenarios.records import Snapshot
from shared.scenarios.schemas import ScenarioRunRead


class Transcript(msgspec.Struct, frozen=True):
    run: ScenarioRunRead
    scenario_name: str


async def transcript(session: AsyncSession, *, access: OrgAccess, run_id: UUID) -> Transcript:
    """The run of the organization with its turns and verdicts (404 for another's run)."""
    run = await scenarios.get_run(session, access=access, run_id=run_id)
    snapshot = msgspec.convert(run.snapshot, Snapshot)
    return Transcript(run=scenarios.run_read(run, with_results=True), scenario_name=snapshot.name)
