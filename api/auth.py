"""The one authorization mechanism: every route under /v1 declares an ``access`` rule.

``authorize`` (a guard on the /v1 router) authenticates the bearer token, resolves the
caller's access to the organization in the path (``org_id``) and enforces the route's
rule.  The outcome is kept on the connection for the ``principal`` / ``access``
dependencies.  Order of answers: 401 (no valid token), 404 (not a member, or another
organization's id), 403 (member, but not allowed).

The web UI (``api/ui``) declares the same rules on its routes and enforces them with the
same :func:`enforce`; only where the token comes from differs (its session cookie).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import ValidationException
from litestar.handlers import BaseRouteHandler

from api.lease import READS_ON_LEASE, request_lease
from shared.errors import PermissionDenied, Unauthorized
from shared.identity import authentication
from shared.identity.access import AccessRule, OrgAccess, Principal

ACCESS_KEY = "access"
_PRINCIPAL_STATE = "spar_principal"
_ACCESS_STATE = "spar_org_access"


def bearer_token(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token")
    return token.strip()


def _org_id(connection: ASGIConnection[Any, Any, Any, Any]) -> UUID | None:
    raw = connection.path_params.get("org_id")
    if raw is None:
        return None
    try:
        return raw if isinstance(raw, UUID) else UUID(str(raw))
    except ValueError:
        # Same entry the handler's own validation would give, before any lookup is made.
        raise ValidationException(
            detail="Invalid UUID",
            extra=[{"message": "Invalid UUID", "key": "org_id", "source": "path"}],
        ) from None


async def authenticate(
    connection: ASGIConnection[Any, Any, Any, Any],
    token: str,
    org_id: UUID | None = None,
    *,
    keep: bool = False,
) -> tuple[Principal, OrgAccess | None]:
    """The token's principal and, given ``org_id``, its access there (401, then 404).

    One autocommit round trip for token, user and role (no BEGIN, no COMMIT), on the
    request's connection of the direct pool (:mod:`api.lease`): the handler's session may
    not be wanted, and a session opened here could not be closed if the request failed
    before the handler's dependencies.  The connection is given back at once unless
    ``keep``: the guard keeps it for a handler that reads on it."""
    lease = request_lease(connection)
    try:
        return await authentication.authenticate(
            await lease.connection(), raw_token=token, org_id=org_id
        )
    finally:
        if not keep:
            await lease.give_back()


async def authorize(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """The /v1 guard: the caller's token is the ``Authorization: Bearer`` header's."""
    await enforce(connection, handler, bearer_token)


async def enforce(
    connection: ASGIConnection[Any, Any, Any, Any],
    handler: BaseRouteHandler,
    token_of: Callable[[ASGIConnection[Any, Any, Any, Any]], str],
) -> None:
    """Enforce the handler's access rule for the caller whose token ``token_of`` reads
    (raising :class:`Unauthorized` when there is none)."""
    rule: AccessRule | None = handler.opt.get(ACCESS_KEY)
    if rule is None:
        if handler.http_methods == {"OPTIONS"}:  # Litestar's automatic OPTIONS answers
            return
        # create_app refuses to start with such a route; this is belt and braces.
        raise PermissionDenied("route has no access rule")
    if rule.public:
        return
    token = token_of(connection)
    try:
        org_id, malformed = _org_id(connection), None
    except ValidationException as exc:
        org_id, malformed = None, exc
    # 401 before anything else, then 404 for an organization out of reach.
    principal, access = await authenticate(
        connection,
        token,
        org_id if malformed is None else None,
        keep=handler.opt.get(READS_ON_LEASE, False),
    )
    if malformed is not None:
        raise malformed
    if rule.user_only and not principal.is_user:
        raise PermissionDenied("this endpoint is for users; platform tokens cannot use it")
    if rule.permission or rule.role:
        if access is None:
            raise PermissionDenied("this rule needs an organization in the path")
        if rule.role:
            access.require_role(rule.role)
        if rule.permission:
            access.require(rule.permission)
    connection.state[_PRINCIPAL_STATE] = principal
    connection.state[_ACCESS_STATE] = access


def provide_principal(request: Request[Any, Any, Any]) -> Principal:
    principal: Principal | None = request.state.get(_PRINCIPAL_STATE)
    if principal is None:
        raise Unauthorized("missing bearer token")
    return principal


def provide_access(request: Request[Any, Any, Any]) -> OrgAccess:
    access: OrgAccess | None = request.state.get(_ACCESS_STATE)
    if access is None:
        raise PermissionDenied("this route is not scoped to an organization")
    return access
