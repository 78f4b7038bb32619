"""Scenario and scenario-run endpoints (spec 10-14, DESIGN §3 runs)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from litestar import Controller, delete, get, post, put
from litestar.datastructures import State
from litestar.params import JSONBody, QueryParameter

from api.deps import Access, DbReads, DbSession, Page, PathId, reading
from shared.identity.access import requires
from shared.scenarios import schemas, services
from shared.schemas import TEXT_PATTERN


class ScenarioController(Controller):
    path = "/orgs/{org_id:str}/scenarios"
    tags = ["scenarios"]

    @get("/", operation_id="listScenarios", access=requires("scenarios:read"))
    async def list_scenarios(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        paging: Page,
        tag: Annotated[
            str | None,
            QueryParameter(
                description="Only scenarios with this tag.",
                min_length=1,
                max_length=100,
                pattern=TEXT_PATTERN,
            ),
        ] = None,
    ) -> schemas.ScenarioList:
        """The organization's scenarios, paged; `tag` keeps those with that tag."""
        rows, total = await reading(
            db_reads, services.list_scenarios, access=access, paging=paging, tag=tag
        )
        return schemas.ScenarioList(scenarios=rows, total=total)

    @post("/", operation_id="createScenario", access=requires("scenarios:write"))
    async def create_scenario(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.ScenarioCreate],
    ) -> schemas.ScenarioRead:
        """Create a scenario with its turns and criteria."""
        return schemas.ScenarioRead.from_row(
            await services.create_scenario(db_session, access=access, body=data)
        )

    @get("/runs", operation_id="listScenarioRuns", access=requires("scenarios:read"))
    async def list_runs(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        paging: Page,
        scenario_id: Annotated[UUID | None, QueryParameter()] = None,
        agent_id: Annotated[UUID | None, QueryParameter()] = None,
        status: Annotated[schemas.RunStatus | None, QueryParameter()] = None,
        batch_run_id: Annotated[
            UUID | None, QueryParameter(description="Only the runs of this batch run.")
        ] = None,
    ) -> schemas.ScenarioRunList:
        """Scenario runs without their results, paged; filter by scenario, agent, batch, status."""
        runs, total = await reading(
            db_reads,
            services.list_runs,
            access=access,
            paging=paging,
            scenario_id=scenario_id,
            agent_id=agent_id,
            batch_run_id=batch_run_id,
            status=status,
        )
        return schemas.ScenarioRunList(
            runs=[services.run_read(r, with_results=False) for r in runs], total=total
        )

    @get("/runs/{run_id:str}", operation_id="getScenarioRun", access=requires("scenarios:read"))
    async def get_run(
        self, db_reads: DbReads, access: Access, org_id: PathId, run_id: PathId
    ) -> schemas.ScenarioRunRead:
        """A run with its turn and criterion results."""
        run = await reading(db_reads, services.get_run, access=access, run_id=run_id)
        return services.run_read(run, with_results=True)

    @get("/{scenario_id:str}", operation_id="getScenario", access=requires("scenarios:read"))
    async def get_scenario(
        self, db_reads: DbReads, access: Access, org_id: PathId, scenario_id: PathId
    ) -> schemas.ScenarioRead:
        """One scenario with its turns and criteria."""
        return schemas.ScenarioRead.from_row(
            await reading(db_reads, services.read_scenario, access=access, scenario_id=scenario_id)
        )

    @put("/{scenario_id:str}", operation_id="updateScenario", access=requires("scenarios:write"))
    async def update_scenario(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        scenario_id: PathId,
        data: JSONBody[schemas.ScenarioUpdate],
    ) -> schemas.ScenarioRead:
        """Update the given fields; `turns`, when given, replaces every turn."""
        scenario = await services.update_scenario(
            db_session, access=access, scenario_id=scenario_id, body=data
        )
        return schemas.ScenarioRead.from_row(scenario)

    @delete("/{scenario_id:str}", operation_id="deleteScenario", access=requires("scenarios:write"))
    async def delete_scenario(
        self, db_session: DbSession, access: Access, org_id: PathId, scenario_id: PathId
    ) -> None:
        """Delete a scenario."""
        await services.delete_scenario(db_session, access=access, scenario_id=scenario_id)

    @post("/{scenario_id:str}/run", operation_id="runScenario", access=requires("scenarios:run"))
    async def run_scenario(
        self,
        db_session: DbSession,
        state: State,
        access: Access,
        org_id: PathId,
        scenario_id: PathId,
        data: JSONBody[schemas.RunCreate],
    ) -> schemas.ScenarioRunRead:
        """Start a run against the agent: 201 with the pending run; poll it until terminal."""
        run = await services.start_run(
            db_session, access=access, scenario_id=scenario_id, body=data, broker=state.broker
        )
        return services.run_read(run, with_results=True)


CONTROLLERS = [ScenarioController]
