"""Judge calibration endpoints (spec 16, DESIGN §3 and §5.6)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from litestar import Controller, Response, get, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_202_ACCEPTED

from api.deps import Access, Config, DbReads, Page, PathId, reading
from shared.calibration import judging, schemas, services
from shared.identity.access import requires


class CalibrationController(Controller):
    path = "/orgs/{org_id:str}/scenarios"
    tags = ["calibration"]

    @post(
        "/calibrate",
        operation_id="calibrateJudge",
        access=requires("scenarios:run"),
        status_code=HTTP_200_OK,
        # One schema per status: a finished calibration is 200, one still judging 202.
        responses={
            HTTP_200_OK: ResponseSpec(
                schemas.CalibrationRead,
                description="Judged: `completed` with the metrics, or `failed` with `error`.",
            ),
            HTTP_202_ACCEPTED: ResponseSpec(
                schemas.CalibrationPending,
                description="Still judging after SPAR_CALIBRATION_WAIT_S: poll the id.",
            ),
        },
    )
    async def calibrate(
        self,
        state: State,
        settings: Config,
        access: Access,
        org_id: PathId,
        agent_id: Annotated[UUID, QueryParameter(description="The agent whose judge to use.")],
        data: JSONBody[schemas.CalibrateBody],
    ) -> Response[schemas.CalibrationRead | schemas.CalibrationPending]:
        """Judge labelled examples with the agent's judge and measure its agreement with
        the humans: 200 with the metrics, or 202 `{id, status}` if still judging."""
        calibration_id, done = await judging.calibrate(
            state.database,
            settings=settings,
            access=access,
            agent_id=agent_id,
            body=data,
            broker=state.broker,
        )
        if done is None:
            return Response(
                schemas.CalibrationPending(id=calibration_id, status="running"),
                status_code=HTTP_202_ACCEPTED,
            )
        # Read as a GET reads it, on a connection taken now: none is held while judging.
        async with state.database.connection() as connection:
            body = await services.read_calibration(
                connection, access=access, calibration_id=calibration_id
            )
        return Response(body, status_code=HTTP_200_OK)

    @get(
        "/calibrations/{calibration_id:str}",
        operation_id="getCalibration",
        access=requires("scenarios:read"),
    )
    async def get_calibration(
        self, db_reads: DbReads, access: Access, org_id: PathId, calibration_id: PathId
    ) -> schemas.CalibrationRead:
        """A calibration: its status, and its metrics and results once completed."""
        return await reading(
            db_reads, services.read_calibration, access=access, calibration_id=calibration_id
        )

    @get("/calibrations", operation_id="listCalibrations", access=requires("scenarios:read"))
    async def list_calibrations(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.CalibrationList:
        """The organization's calibrations, newest first, without per-example results."""
        calibrations, total = await reading(
            db_reads, services.list_calibrations, access=access, paging=paging
        )
        return schemas.CalibrationList(calibrations=calibrations, total=total)


CONTROLLERS = [CalibrationController]
