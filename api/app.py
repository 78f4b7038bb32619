"""The Litestar application: routes, the authorization guard, error bodies, OpenAPI."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Litestar, Router
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler

from api.auth import ACCESS_KEY, authorize
from api.batches.controllers import CONTROLLERS as BATCH_CONTROLLERS
from api.calibration.controllers import CONTROLLERS as CALIBRATION_CONTROLLERS
from api.deps import DEPENDENCIES, declare_lease_readers, resolve_in_turn
from api.exceptions import EXCEPTION_HANDLERS
from api.health import HealthController
from api.http import complete_allow_headers, declare_query_params, reject_unknown_query
from api.identity.controllers import CONTROLLERS as IDENTITY_CONTROLLERS
from api.knowledge.controllers import CONTROLLERS as KNOWLEDGE_CONTROLLERS
from api.lease import LeaseMiddleware
from api.metrics import FAMILIES as METRIC_FAMILIES
from api.metrics import metrics
from api.notifications.controllers import CONTROLLERS as NOTIFICATION_CONTROLLERS
from api.observability import ObservabilityMiddleware
from api.openapi import docs_assets, finish_openapi, openapi_config
from api.outbound.controllers import CONTROLLERS as OUTBOUND_CONTROLLERS
from api.requests import SparRequest
from api.scenarios.controllers import CONTROLLERS as SCENARIO_CONTROLLERS
from api.triggers.controllers import CONTROLLERS as TRIGGER_CONTROLLERS
from api.ui.controllers import TEMPLATES, ui_assets, ui_router
from shared.db.engine import Database, create_engine
from shared.heap import settle_startup_heap
from shared.identity.throttle import LoginThrottle
from shared.metrics import mark_process_dead
from shared.outbound.limits import limiter_for
from shared.queue import get_broker
from shared.settings import Settings, get_settings

log = logging.getLogger("spar.api")

V1_CONTROLLERS: list[Any] = [
    *IDENTITY_CONTROLLERS,
    *OUTBOUND_CONTROLLERS,
    *SCENARIO_CONTROLLERS,
    *BATCH_CONTROLLERS,
    *CALIBRATION_CONTROLLERS,
    *KNOWLEDGE_CONTROLLERS,
    *TRIGGER_CONTROLLERS,
    *NOTIFICATION_CONTROLLERS,
]


def _check_access_rules(router: Router) -> None:
    """Refuse to start if any route of ``router`` (/v1, /ui) forgot to declare who may call it."""
    missing = [
        f"{sorted(handler.http_methods)} {route.path}"
        for route in router.routes
        for handler in getattr(route, "route_handlers", [])
        if isinstance(handler, HTTPRouteHandler)
        and handler.http_methods != {"OPTIONS"}  # Litestar's automatic OPTIONS answers
        and ACCESS_KEY not in handler.opt
    ]
    if missing:
        raise RuntimeError(f"routes without an access rule: {', '.join(missing)}")


async def _v1_guard(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """/v1's guards as one: the caller's access (401, 404, 403), then its query (422).  One
    guard, not two: Litestar copies the route handler for each guard of each request."""
    await authorize(connection, handler)
    await reject_unknown_query(connection, handler)


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or get_settings()
    v1 = Router("/v1", route_handlers=V1_CONTROLLERS, guards=[_v1_guard])
    _check_access_rules(v1)
    # The web UI: the same access rules, its token from a cookie; outside /v1 and the schema.
    ui = ui_router()
    _check_access_rules(ui)

    async def open_database(app: Litestar) -> None:
        app.state.database = Database(create_engine(settings))
        app.state.broker = get_broker(settings)
        app.state.login_throttle = LoginThrottle.from_settings(settings)
        # What the batch detail reads of the outbound limits (the workers' write them).
        app.state.limiter = limiter_for(settings)

    async def close_database(app: Litestar) -> None:
        await app.state.login_throttle.close()
        await app.state.limiter.close()
        await app.state.database.dispose()

    app = Litestar(
        route_handlers=[HealthController, metrics, v1, ui, ui_assets(), docs_assets()],
        dependencies=DEPENDENCIES,
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        request_class=SparRequest,
        middleware=[ObservabilityMiddleware, LeaseMiddleware],
        logging_config=None,  # shared.logs sets one format for every process
        openapi_config=openapi_config(),
        template_config=TEMPLATES,
        on_startup=[open_database, settle_startup_heap],
        on_shutdown=[close_database, mark_process_dead],
        debug=False,
    )
    app.state.settings = settings
    app.state.metric_families = METRIC_FAMILIES  # spar dev adds its workers' and scheduler's
    finish_openapi(app)
    complete_allow_headers(app)
    declare_query_params(app)
    resolve_in_turn(app)
    declare_lease_readers(app)
    return app
