"""Webhook endpoint endpoints (DESIGN §5.13): create, list, read, change, delete, the
delivery log and a redelivery."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, delete, get, patch, post
from litestar.datastructures import State
from litestar.params import JSONBody, QueryParameter
from litestar.status_codes import HTTP_202_ACCEPTED

from api.deps import Access, Config, DbReads, DbSession, Page, PathId, listing, reading
from shared.identity.access import requires
from shared.notifications import schemas, services
from shared.notifications.schemas import DeliveryStatus


class WebhookEndpointController(Controller):
    path = "/orgs/{org_id:str}/webhook-endpoints"
    tags = ["webhook endpoints"]

    @post("/", operation_id="createWebhookEndpoint", access=requires("notifications:write"))
    async def create_endpoint(
        self,
        db_session: DbSession,
        settings: Config,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.WebhookEndpointCreate],
    ) -> schemas.WebhookEndpointCreated:
        """Create an endpoint that is sent the `events` chosen: the only response that
        carries its signing `secret` (`whsec_…`).  Its host is checked against the allowed
        domains when a delivery is made, not now."""
        endpoint, secret = await services.create_endpoint(
            db_session, settings=settings, access=access, body=data
        )
        return schemas.WebhookEndpointCreated.from_row(endpoint, secret=secret)

    @get("/", operation_id="listWebhookEndpoints", access=requires("notifications:read"))
    async def list_endpoints(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.WebhookEndpointList:
        """The organization's webhook endpoints, paged."""
        return listing(
            schemas.WebhookEndpointList,
            await reading(db_reads, services.list_endpoints, access=access, paging=paging),
        )

    @get(
        "/{endpoint_id:str}",
        operation_id="getWebhookEndpoint",
        access=requires("notifications:read"),
    )
    async def get_endpoint(
        self, db_reads: DbReads, access: Access, org_id: PathId, endpoint_id: PathId
    ) -> schemas.WebhookEndpointRead:
        """One webhook endpoint; `disabled_reason` says why Spar turned it off, if it did."""
        return schemas.WebhookEndpointRead.from_row(
            await reading(db_reads, services.read_endpoint, access=access, endpoint_id=endpoint_id)
        )

    @patch(
        "/{endpoint_id:str}",
        operation_id="updateWebhookEndpoint",
        access=requires("notifications:write"),
    )
    async def update_endpoint(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        endpoint_id: PathId,
        data: JSONBody[schemas.WebhookEndpointUpdate],
    ) -> schemas.WebhookEndpointRead:
        """Change an endpoint; omitted fields stay.  `active: true` turns a disabled one
        back on; `active: false` ends its pending deliveries `failed`."""
        return schemas.WebhookEndpointRead.from_row(
            await services.update_endpoint(
                db_session, access=access, endpoint_id=endpoint_id, body=data
            )
        )

    @delete(
        "/{endpoint_id:str}",
        operation_id="deleteWebhookEndpoint",
        access=requires("notifications:write"),
    )
    async def delete_endpoint(
        self, db_session: DbSession, access: Access, org_id: PathId, endpoint_id: PathId
    ) -> None:
        """Delete an endpoint and its delivery log."""
        await services.delete_endpoint(db_session, access=access, endpoint_id=endpoint_id)

    @get(
        "/{endpoint_id:str}/deliveries",
        operation_id="listWebhookDeliveries",
        access=requires("notifications:read"),
    )
    async def list_deliveries(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        endpoint_id: PathId,
        paging: Page,
        status: Annotated[DeliveryStatus | None, QueryParameter()] = None,
    ) -> schemas.DeliveryList:
        """The endpoint's deliveries, newest first: each one's status, attempts, the last
        answer's code and (at most 1 KiB of) body, the last error and the body sent;
        `status` keeps those in that state."""
        rows, total = await reading(
            db_reads,
            services.list_deliveries,
            access=access,
            endpoint_id=endpoint_id,
            paging=paging,
            status=status,
        )
        return schemas.DeliveryList(
            deliveries=[services.delivery_read(d, e) for d, e in rows], total=total
        )

    @post(
        "/{endpoint_id:str}/deliveries/{delivery_id:str}/redeliver",
        operation_id="redeliverWebhook",
        access=requires("notifications:write"),
        status_code=HTTP_202_ACCEPTED,
    )
    async def redeliver(
        self,
        db_session: DbSession,
        state: State,
        access: Access,
        org_id: PathId,
        endpoint_id: PathId,
        delivery_id: PathId,
    ) -> schemas.DeliveryRead:
        """Send an ended delivery again now, with the same body and `webhook-id` (receivers
        drop what they already processed), and 24 hours of retries.  409 while it is still
        being delivered or when the endpoint is inactive."""
        delivery, event = await services.redeliver(
            db_session,
            access=access,
            endpoint_id=endpoint_id,
            delivery_id=delivery_id,
            broker=state.broker,
        )
        return services.delivery_read(delivery, event)


CONTROLLERS = [WebhookEndpointController]
