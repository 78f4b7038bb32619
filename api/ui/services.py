"""What the UI's pages show that no API body carries as such: a run's transcript with the
question of each criterion beside its verdict (from the run's snapshot)."""

from __future__ import annotations

from uuid import UUID

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from shared.identity.access import OrgAccess
from shared.scenarios import services as scenarios
from shared.scenarios.records import Snapshot, SnapshotCriterion
from shared.scenarios.schemas import ScenarioRunRead


class Transcript(msgspec.Struct, frozen=True):
    run: ScenarioRunRead
    scenario_name: str
    criteria: dict[UUID, SnapshotCriterion]  # what each criterion asked, by its id


async def transcript(session: AsyncSession, *, access: OrgAccess, run_id: UUID) -> Transcript:
    """The run of the organization with its turns and verdicts (404 for another's run)."""
    run = await scenarios.get_run(session, access=access, run_id=run_id)
    snapshot = msgspec.convert(run.snapshot, Snapshot)
    return Transcript(
        run=scenarios.run_read(run, with_results=True),
        scenario_name=snapshot.name,
        criteria={UUID(c.id): c for turn in snapshot.turns for c in turn.criteria},
    )
