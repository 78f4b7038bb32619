"""What the API tells operators about each request: a request id, an access log line and
its metrics (:mod:`api.metrics`, which also serves ``GET /metrics``)."""

from __future__ import annotations

import logging
import time

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from api.metrics import observe_request
from shared.logs import accept_request_id, request_id

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
