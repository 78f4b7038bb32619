"""Two HTTP details Litestar 2 leaves out, applied once to the built app.

1. ``OPTIONS`` answers ``Allow`` with every method of the path.  Litestar's automatic
   OPTIONS handler reads the methods of the route it was created for; when a path's
   handlers are registered in steps (a controller, then the /v1 router, then the app),
   that route is an early one and lists only some methods (litestar#4169, fixed in 3.0).
   ``complete_allow_headers`` rewrites the header from the route the app really serves.
2. An unknown query parameter answers 422 like an unknown body field, with
   ``loc ["query", name]`` and type ``extra_forbidden``.  ``declare_query_params`` records
   each handler's declared query parameters (its own and its dependencies', e.g. ``limit``
   and ``offset``) in ``handler.opt``; the ``reject_unknown_query`` guard, placed after
   authentication, compares the request's query string with them.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.datastructures import MutableScopeHeaders
from litestar.handlers import BaseRouteHandler
from litestar.routes import HTTPRoute
from litestar.types import Message, Scope

from shared.errors import InvalidInput

QUERY_PARAMS_KEY = "query_params"


def _http_routes(app: Litestar) -> list[HTTPRoute]:
    return [route for route in app.routes if isinstance(route, HTTPRoute)]


def complete_allow_headers(app: Litestar) -> None:
    """Make the automatic OPTIONS answer of every path list all of its methods."""
    allow: dict[int, str] = {}
    for route in _http_routes(app):
        handler, _ = route.route_handler_map["OPTIONS"]
        allow[id(handler)] = ", ".join(sorted(route.methods))

    async def rewrite_allow(message: Message, scope: Scope) -> None:
        if message["type"] != "http.response.start" or scope.get("method") != "OPTIONS":
            return
        methods = allow.get(id(scope.get("route_handler")))
        if methods is not None:
            MutableScopeHeaders.from_message(message)["allow"] = methods

    app.before_send.append(rewrite_allow)


def declare_query_params(app: Litestar) -> None:
    """Record on each handler the query parameters it (or a dependency of it) declares."""
    for route in _http_routes(app):
        for handler, kwargs_model in route.route_handler_map.values():
            handler.opt[QUERY_PARAMS_KEY] = frozenset(
                param.field_alias for param in kwargs_model.expected_query_params
            )


async def reject_unknown_query(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: 422 for the first query parameter the handler does not declare."""
    if not connection.query_params or connection.scope.get("method") == "OPTIONS":
        return
    # Not declared at all (an app built without declare_query_params): accept none.
    known: frozenset[str] = handler.opt.get(QUERY_PARAMS_KEY, frozenset())
    for name in connection.query_params:
        if name not in known:
            raise InvalidInput(
                ("query", name),
                f"Unknown query parameter `{name}`",
                type="extra_forbidden",
                input=connection.query_params.get(name),
            )
