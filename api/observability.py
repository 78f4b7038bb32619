"""What the API tells operators: a request id, an access log line and metrics per request,
and ``GET /metrics`` (Prometheus text format).

``/metrics`` sits outside ``/v1``, beside the health probes: it names routes, queues,
actors and provider types, never an organization or a resource, so it holds no tenant
data.  With ``SPAR_METRICS_TOKEN`` set it answers only ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.exceptions import NotAuthorizedException
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from shared.logs import accept_request_id, request_id
from shared.metrics import CONTENT_TYPE, exposition, observe_request

REQUEST_ID_HEADER = "x-request-id"
_QUIET_ROUTES = ("/health", "/metrics")  # probes and scrapes: logged at DEBUG only

access_log = logging.getLogger("spar.access")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


class ObservabilityMiddleware:
    """Per request: the request id (a valid ``X-Request-ID`` or a new one) in the logging
    context and the response's ``X-Request-ID``, the HTTP metrics by route template, and
    one access log line (method, path, status, duration; never headers or bodies)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = accept_request_id(_header(scope, REQUEST_ID_HEADER.encode()))
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500  # unless a response starts

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    (REQUEST_ID_HEADER.encode(), rid.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            route = scope.get("path_template") or "unmatched"
            method = scope["method"]
            observe_request(method, route, status, seconds)
            access_log.log(
                logging.DEBUG if route.startswith(_QUIET_ROUTES) else logging.INFO,
                "%s %s %s",
                method,
                scope["path"],
                status,
                extra={"route": route, "status": status, "duration_ms": round(seconds * 1000, 1)},
            )
            request_id.reset(token)


def _authorized(request: Request[Any, Any, Any], token: str | None) -> bool:
    if token is None:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


@get("/metrics", include_in_schema=False)
async def metrics(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """Prometheus metrics of this API's processes and the queues' depth and age."""
    if not _authorized(request, state.settings.metrics_token):
        raise NotAuthorizedException("a valid metrics token is required")
    body = await asyncio.to_thread(exposition, state.broker)
    return Response(body, media_type=CONTENT_TYPE)
