"""Liveness and readiness probes (public, outside /v1)."""

from __future__ import annotations

from typing import Literal

import msgspec
from litestar import Controller, Response, get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_503_SERVICE_UNAVAILABLE
from sqlalchemy import text

from api.http import reject_unknown_query
from shared.queue import in_broker_thread


class HealthStatus(msgspec.Struct):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = {}


class HealthController(Controller):
    path = "/health"
    tags = ["health"]
    include_in_schema = True
    guards = [reject_unknown_query]

    @get("/live", operation_id="healthLive")
    async def live(self) -> HealthStatus:
        """The process is up."""
        return HealthStatus(status="ok")

    @get(
        "/ready",
        operation_id="healthReady",
        responses={
            HTTP_503_SERVICE_UNAVAILABLE: ResponseSpec(
                HealthStatus, description="The database or the broker does not answer."
            )
        },
    )
    async def ready(self, state: State) -> Response[HealthStatus]:
        """The process can serve: the database and the broker answer (503 otherwise)."""
        checks: dict[str, str] = {}
        try:
            async with state.database.transaction() as session:
                await session.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as exc:  # a probe reports, it does not raise
            checks["database"] = f"error: {type(exc).__name__}"
        if state.settings.redis_url:
            try:
                await in_broker_thread(state.broker.client.ping)
                checks["broker"] = "ok"
            except Exception as exc:  # a probe reports, it does not raise
                checks["broker"] = f"error: {type(exc).__name__}"
        ok = all(value == "ok" for value in checks.values())
        return Response(
            HealthStatus(status="ok" if ok else "unavailable", checks=checks),
            status_code=200 if ok else HTTP_503_SERVICE_UNAVAILABLE,
        )
