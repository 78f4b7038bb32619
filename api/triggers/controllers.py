"""Trigger endpoints (spec 21, DESIGN §3): create, list, read, change, delete, the
executions, a manual fire, and the public webhook URL."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Parameter, RequestBody, Schema
from litestar.params import Body, JSONBody, QueryParameter
from litestar.status_codes import (
    HTTP_200_OK,
    HTTP_202_ACCEPTED,
    HTTP_401_UNAUTHORIZED,
    HTTP_409_CONFLICT,
    HTTP_413_REQUEST_ENTITY_TOO_LARGE,
)

from api.deps import Access, Config, DbReads, DbSession, Page, PathId, listing, reading
from api.openapi import operation_reading
from shared.identity.access import PUBLIC, requires
from shared.triggers import schemas, services
from shared.triggers.schemas import ExecutionStatus, TriggerStatus, TriggerType


class TriggerController(Controller):
    path = "/orgs/{org_id:str}/triggers"
    tags = ["triggers"]

    @post("/", operation_id="createTrigger", access=requires("triggers:write"))
    async def create_trigger(
        self,
        db_session: DbSession,
        settings: Config,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.TriggerCreate],
    ) -> schemas.TriggerCreated:
        """Create a trigger, `active`: the only response that carries `webhook_secret`."""
        trigger, secret = await services.create_trigger(
            db_session, settings=settings, access=access, body=data
        )
        return services.trigger_read(trigger, settings, secret=secret)  # type: ignore[return-value]

    @get("/", operation_id="listTriggers", access=requires("triggers:read"))
    async def list_triggers(
        self,
        db_reads: DbReads,
        settings: Config,
        access: Access,
        org_id: PathId,
        paging: Page,
        trigger_type: Annotated[TriggerType | None, QueryParameter()] = None,
        status: Annotated[TriggerStatus | None, QueryParameter()] = None,
    ) -> schemas.TriggerList:
        """The organization's triggers, paged; filter by `trigger_type` and `status`."""
        rows, total = await reading(
            db_reads,
            services.list_triggers,
            access=access,
            paging=paging,
            trigger_type=trigger_type,
            status=status,
        )
        return schemas.TriggerList(
            triggers=[services.trigger_read(t, settings) for t in rows], total=total
        )

    @get("/{trigger_id:str}", operation_id="getTrigger", access=requires("triggers:read"))
    async def get_trigger(
        self,
        db_reads: DbReads,
        settings: Config,
        access: Access,
        org_id: PathId,
        trigger_id: PathId,
    ) -> schemas.TriggerRead:
        """One trigger, with its next slot when it is an active scheduled one."""
        trigger = await reading(
            db_reads, services.read_trigger, access=access, trigger_id=trigger_id
        )
        return services.trigger_read(trigger, settings)

    @patch("/{trigger_id:str}", operation_id="updateTrigger", access=requires("triggers:write"))
    async def update_trigger(
        self,
        db_session: DbSession,
        settings: Config,
        access: Access,
        org_id: PathId,
        trigger_id: PathId,
        data: JSONBody[schemas.TriggerUpdate],
    ) -> schemas.TriggerRead:
        """Change a trigger; `status` pauses (`inactive`) or resumes (`active`) it."""
        trigger = await services.update_trigger(
            db_session, access=access, trigger_id=trigger_id, body=data
        )
        return services.trigger_read(trigger, settings)

    @delete("/{trigger_id:str}", operation_id="deleteTrigger", access=requires("triggers:write"))
    async def delete_trigger(
        self, db_session: DbSession, access: Access, org_id: PathId, trigger_id: PathId
    ) -> None:
        """Delete a trigger and its executions; its webhook URL answers 404 from then on."""
        await services.delete_trigger(db_session, access=access, trigger_id=trigger_id)

    @get(
        "/{trigger_id:str}/executions",
        operation_id="listTriggerExecutions",
        access=requires("triggers:read"),
    )
    async def list_executions(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        trigger_id: PathId,
        paging: Page,
        status: Annotated[ExecutionStatus | None, QueryParameter()] = None,
    ) -> schemas.ExecutionList:
        """The trigger's executions, newest first; `status` keeps those in that state."""
        return listing(
            schemas.ExecutionList,
            await reading(
                db_reads,
                services.list_executions,
                access=access,
                trigger_id=trigger_id,
                paging=paging,
                status=status,
            ),
        )

    @get(
        "/{trigger_id:str}/executions/{execution_id:str}",
        operation_id="getTriggerExecution",
        access=requires("triggers:read"),
    )
    async def get_execution(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        trigger_id: PathId,
        execution_id: PathId,
    ) -> schemas.ExecutionRead:
        """One execution: its status, timings, the message sent and the reply or batch."""
        return schemas.ExecutionRead.from_row(
            await reading(
                db_reads,
                services.read_execution,
                access=access,
                trigger_id=trigger_id,
                execution_id=execution_id,
            )
        )

    @post(
        "/{trigger_id:str}/rotate-secret",
        operation_id="rotateTriggerSecret",
        access=requires("triggers:write"),
        status_code=HTTP_200_OK,
    )
    async def rotate_secret(
        self,
        db_session: DbSession,
        settings: Config,
        access: Access,
        org_id: PathId,
        trigger_id: PathId,
        data: Annotated[schemas.RotateSecretBody | None, Body()] = None,
    ) -> schemas.TriggerCreated:
        """A new `webhook_secret`, shown only in this response.  The secret it replaces
        stays valid for `previous_valid_for_s` seconds (default 86,400; 0 refuses it at
        once, for a secret that leaked), so callers switch without a refused delivery."""
        trigger, secret = await services.rotate_secret(
            db_session,
            settings=settings,
            access=access,
            trigger_id=trigger_id,
            body=data or schemas.RotateSecretBody(),
        )
        return services.trigger_read(trigger, settings, secret=secret)  # type: ignore[return-value]

    @post(
        "/{trigger_id:str}/fire",
        operation_id="fireTrigger",
        access=requires("triggers:write"),
        status_code=HTTP_202_ACCEPTED,
    )
    async def fire(
        self,
        db_session: DbSession,
        state: State,
        access: Access,
        org_id: PathId,
        trigger_id: PathId,
        data: Annotated[schemas.FireBody | None, Body()] = None,
    ) -> schemas.ExecutionRead:
        """Fire now, as a test: an execution `queued`, whatever the trigger's status; the
        optional `payload` is what the message template sees as `payload`."""
        execution = await services.fire(
            db_session,
            access=access,
            trigger_id=trigger_id,
            payload=data.payload if data is not None else None,
            broker=state.broker,
        )
        return schemas.ExecutionRead.from_row(execution)


def _signature_header(name: str, schema: Schema, description: str) -> Parameter:
    return Parameter(
        name=name, param_in="header", required=True, schema=schema, description=description
    )


# The delivery is read as bytes (the signature covers them), so Litestar sees neither the
# body nor the three headers of the Standard Webhooks scheme: the document states them.
WEBHOOK_DELIVERY = operation_reading(
    RequestBody(
        content={
            "application/json": OpenAPIMediaType(
                schema=Schema(description="Any JSON value: the execution's `payload`.")
            )
        },
        required=False,
        description="What the message template sees as `payload`: any JSON, nested at most "
        "32 levels deep, at most 256 KiB; none (or blank) for a null payload.  Signed as sent.",
    ),
    _signature_header(
        "webhook-id",
        Schema(type=OpenAPIType.STRING, max_length=255),
        "The delivery's unique id: a repeated one answers with its first execution.",
    ),
    _signature_header(
        "webhook-timestamp",
        Schema(type=OpenAPIType.INTEGER),
        "When the delivery was signed, in Unix seconds: within 5 minutes of Spar's clock.",
    ),
    _signature_header(
        "webhook-signature",
        Schema(type=OpenAPIType.STRING),
        "`v1,` and the base64 HMAC-SHA256 of `id.timestamp.body` under the trigger's "
        "`whsec_` secret; the scheme's space-separated list of several is accepted.",
    ),
)


class HookController(Controller):
    path = "/hooks/triggers"
    tags = ["webhooks"]

    @post(
        "/{trigger_id:str}",
        operation_id="receiveTriggerWebhook",
        access=PUBLIC,
        status_code=HTTP_202_ACCEPTED,
        request_max_body_size=services.MAX_WEBHOOK_BODY,
        operation_class=WEBHOOK_DELIVERY,
        responses={
            HTTP_401_UNAUTHORIZED: ResponseSpec(
                None, description="Missing or invalid signature, or a timestamp off by 5 min."
            ),
            HTTP_409_CONFLICT: ResponseSpec(None, description="The trigger is inactive."),
            HTTP_413_REQUEST_ENTITY_TOO_LARGE: ResponseSpec(
                None, description="The body is larger than 256 KiB."
            ),
        },
    )
    async def receive(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        settings: Config,
        state: State,
        trigger_id: PathId,
    ) -> Response[schemas.HookAccepted]:
        """A signed delivery starts one execution: 202 with its id.  Signed by the Standard
        Webhooks scheme: `webhook-id`, `webhook-timestamp` (Unix seconds, within 5 minutes
        of Spar's clock) and `webhook-signature` (`v1,` and the base64 HMAC-SHA256 of
        `id.timestamp.body` under the trigger's `whsec_` secret).  A `webhook-id` already
        delivered answers with its original execution and starts nothing."""
        body = await request.body()
        execution_id = await services.receive_webhook(
            db_session,
            settings=settings,
            trigger_id=trigger_id,
            body=body,
            headers=request.headers,
            broker=state.broker,
        )
        return Response(
            schemas.HookAccepted(execution_id=execution_id), status_code=HTTP_202_ACCEPTED
        )


CONTROLLERS = [TriggerController, HookController]
