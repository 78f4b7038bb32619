"""Authentication: what runs on every request, turning a bearer token into its principal
and, for a route inside an organization, the principal's access there.

One indexed round trip per request, no cache: a revoked token, a removed member or a
changed role is seen by the very next request.  The lookups are compiled once and run
straight on psycopg (:mod:`shared.db.direct`): SQLAlchemy's execution layer cost more CPU
than the rest of the guard, on every request.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import bindparam, select, update

from shared import security
from shared.db.base import utcnow
from shared.db.direct import Statement
from shared.db.models import Membership, PlatformToken, Role, User, UserToken
from shared.errors import NotFound, Unauthorized
from shared.identity.access import OrgAccess, Principal

PLATFORM_TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)

# The guard's lookups, built once.  A user token comes with its user and, for a route inside
# an organization, the user's role there (outer joins: no membership, no role): one
# indexed round trip answers the whole question.
_user_token = (
    select(
        UserToken.id,
        UserToken.revoked_at,
        UserToken.expires_at,
        User.id.label("user_id"),
        User.is_active,
        User.status,
    )
    .join(User, User.id == UserToken.user_id)
    .where(UserToken.token_digest == bindparam("digest"))
)
_USER_TOKEN = Statement(_user_token)
_USER_TOKEN_IN_ORG = Statement(
    _user_token.add_columns(Membership.role_id, Role.name, Role.is_system, Role.permissions)
    .outerjoin(
        Membership,
        (Membership.user_id == User.id) & (Membership.organization_id == bindparam("org_id")),
    )
    .outerjoin(Role, Role.id == Membership.role_id)
)
_PLATFORM_TOKEN = Statement(
    select(
        PlatformToken.id,
        PlatformToken.is_active,
        PlatformToken.expires_at,
        PlatformToken.organization_id,
        PlatformToken.permissions,
        PlatformToken.last_used_at,
    ).where(PlatformToken.token_digest == bindparam("digest"))
)
# At most one write a minute per token, guarded in SQL so that concurrent requests agree
# (``updated_at`` set as SQLAlchemy's ``onupdate`` would).
_TOUCH_PLATFORM_TOKEN = Statement(
    update(PlatformToken)
    .where(
        PlatformToken.id == bindparam("p_id"),
        (PlatformToken.last_used_at.is_(None))
        | (PlatformToken.last_used_at < bindparam("p_stale")),
    )
    .values(last_used_at=bindparam("p_now"), updated_at=bindparam("p_now"))
    .returning(PlatformToken.id)
)


async def authenticate(
    connection: AsyncConnection[Any], *, raw_token: str, org_id: UUID | None = None
) -> tuple[Principal, OrgAccess | None]:
    """Resolve a bearer token to its principal and, given ``org_id``, its access there.

    Raises :class:`Unauthorized` for a token that is unknown, revoked or expired (before
    anything else), then :class:`NotFound` if the principal has no access to ``org_id``.
    ``connection`` (psycopg's) should be in autocommit: reads only, and at most one write
    a minute.
    """
    now = utcnow()
    digest = security.token_digest(raw_token)
    if raw_token.startswith(security.USER_TOKEN_PREFIX):
        if org_id is None:
            rows = await _USER_TOKEN.rows(connection, digest=digest)
        else:
            rows = await _USER_TOKEN_IN_ORG.rows(connection, digest=digest, org_id=org_id)
        row = rows[0] if rows else None
        if row is None:
            raise Unauthorized("invalid token")
        if row.revoked_at is not None:
            raise Unauthorized("token has been revoked")
        if row.expires_at <= now:
            raise Unauthorized("token has expired")
        if not row.is_active or row.status != "active":
            raise Unauthorized("account is not active")
        principal = Principal(kind="user", token_id=row.id, user_id=row.user_id)
        if org_id is None:
            return principal, None
        role = (row.name, row.is_system, row.permissions) if row.role_id is not None else None
        return principal, resolve_access(principal, org_id, role)
    if raw_token.startswith(security.PLATFORM_TOKEN_PREFIX):
        pats = await _PLATFORM_TOKEN.rows(connection, digest=digest)
        pat = pats[0] if pats else None
        if pat is None:
            raise Unauthorized("invalid token")
        if not pat.is_active:
            raise Unauthorized("token has been revoked")
        if pat.expires_at is not None and pat.expires_at <= now:
            raise Unauthorized("token has expired")
        stale = now - PLATFORM_TOKEN_TOUCH_INTERVAL
        if pat.last_used_at is None or pat.last_used_at < stale:
            # Skipped in Python when the row just read is fresh.
            await _TOUCH_PLATFORM_TOKEN.rows(connection, p_id=pat.id, p_stale=stale, p_now=now)
        principal = Principal(
            kind="platform_token",
            token_id=pat.id,
            organization_id=pat.organization_id,
            permissions=frozenset(pat.permissions),
        )
        return principal, None if org_id is None else resolve_access(principal, org_id, None)
    raise Unauthorized("invalid token")


def resolve_access(
    principal: Principal, org_id: UUID, role: tuple[str, bool, list[str]] | None
) -> OrgAccess:
    """The principal's access to ``org_id``, given a user's role there (name, is_system,
    permissions; None for no membership); a non-member sees the organization as missing."""
    if principal.is_user:
        if role is None:
            raise NotFound("organization not found")
        name, is_system, permissions = role
        return OrgAccess(
            principal=principal,
            organization_id=org_id,
            permissions=frozenset(permissions),
            role_name=name if is_system else None,
        )
    if principal.organization_id != org_id:
        raise NotFound("organization not found")
    return OrgAccess(principal=principal, organization_id=org_id, permissions=principal.permissions)
