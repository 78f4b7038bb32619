"""The request's connection of the direct pool (:class:`shared.db.direct.Lease`).

The authorization guard looks the caller's token up on it, and a handler that reads on
the direct pool (``db_reads``: listings, ``/auth/me``) reads on it after: a request checks
out one connection, not two.  The guard gives it back at once when the handler does not
read on it (a handler with a session writes on the engine's pool), the handler as soon as
its read answers, and :class:`LeaseMiddleware` whatever a request still holds when it ends,
however it ends (a query parameter refused after the guard, an error, a client gone).
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.types import ASGIApp, Receive, Scope, Send

from shared.db.direct import Lease

_LEASE_STATE = "spar_lease"
# In a handler's ``opt``: whether it reads on the request's lease (``api.deps`` records it).
READS_ON_LEASE = "reads_on_lease"


def request_lease(connection: ASGIConnection[Any, Any, Any, Any]) -> Lease:
    """The request's lease, made at its first use (it takes a connection only when one is
    asked of it)."""
    state = connection.scope["state"]
    lease: Lease | None = state.get(_LEASE_STATE)
    if lease is None:
        lease = state[_LEASE_STATE] = connection.app.state.database.lease()
    return lease


class LeaseMiddleware:
    """Gives back the connection a request still holds when it ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            lease: Lease | None = scope.get("state", {}).get(_LEASE_STATE)
            if lease is not None:
                await lease.give_back()
