"""Accounts: registering, logging in and out (user tokens), and the current user as
``/auth/me`` shows them; the checks an account's fields share with the rest of identity.

Every function takes the caller's session: the caller owns the transaction.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import Uuid, bindparam, func, literal_column, select, update
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from shared import security
from shared.db import shapes
from shared.db.base import utcnow
from shared.db.direct import Statement
from shared.db.models import Membership, Organization, Role, User, UserToken
from shared.db.queries import flush_unique
from shared.errors import Conflict, InvalidInput, NotFound, PermissionDenied, Unauthorized
from shared.identity import schemas
from shared.identity.access import Principal
from shared.identity.permissions import ordered
from shared.identity.throttle import LoginThrottle
from shared.schemas import iana_zones
from shared.settings import Settings


def normalize_email(email: str) -> str:
    return email.strip().lower()


def check_timezone(name: str, loc: tuple[str, ...] = ("body", "timezone")) -> str:
    if name not in iana_zones():
        raise InvalidInput(loc, "Unknown IANA time zone", input=name)
    return name


async def _issue_user_token(
    session: AsyncSession,
    settings: Settings,
    user_id: UUID,
    *,
    browser: bool = False,
    not_after: datetime | None = None,
) -> tuple[str, datetime]:
    token = security.new_token(security.USER_TOKEN_PREFIX)
    expires_at = utcnow() + timedelta(seconds=settings.user_token_ttl_s)
    if not_after is not None:
        expires_at = min(expires_at, not_after)
    session.add(
        UserToken(
            user_id=user_id,
            token_digest=security.token_digest(token),
            expires_at=expires_at,
            browser_session=browser,
        )
    )
    await session.flush()
    return token, expires_at


async def register(
    session: AsyncSession, *, settings: Settings, body: schemas.RegisterBody
) -> tuple[User, str, datetime]:
    """Create an account, or activate one that an invitation created; returns a first token."""
    if not settings.allow_registration:
        raise PermissionDenied("registration is disabled on this server")
    check_timezone(body.timezone)
    # argon2 is deliberately slow: keep it off the event loop.
    password_hash = await asyncio.to_thread(
        security.hash_password, body.password, profile=settings.password_hash_profile
    )
    email = normalize_email(body.email)
    user = await session.scalar(select(User).where(User.email == email).with_for_update())
    if user is not None and user.status != "invited":
        raise Conflict("an account with this email already exists")
    if user is None:
        user = User(email=email)
        session.add(user)
    user.password_hash = password_hash
    user.first_name = body.first_name
    user.last_name = body.last_name
    user.timezone = body.timezone
    user.status = "active"
    await flush_unique(session, "an account with this email already exists")
    token, expires_at = await _issue_user_token(session, settings, user.id)
    return user, token, expires_at


async def login(
    session: AsyncSession,
    *,
    settings: Settings,
    body: schemas.LoginBody,
    throttle: LoginThrottle,
    address: str,
) -> tuple[str, datetime]:
    """Issue a token for a matching email and password; every failure reads the same.

    ``address`` is the client's; the throttle refuses (429) before any password work when
    this account or address has failed too often, whether or not the account exists.
    """
    email = normalize_email(body.email)
    attempt = await throttle.admit(email, address)
    try:
        user = await session.scalar(select(User).where(User.email == email))
        password_ok = await asyncio.to_thread(
            security.verify_password,
            user.password_hash if user else None,
            body.password,
            profile=settings.password_hash_profile,
        )
    except Exception:
        await throttle.abandoned(attempt)
        raise
    if user is None or not password_ok or not user.is_active or user.status != "active":
        raise Unauthorized("invalid email or password")  # the attempt stays counted
    await throttle.succeeded(attempt)
    return await _issue_user_token(session, settings, user.id)


async def browser_session(
    session: AsyncSession, *, settings: Settings, principal: Principal
) -> str:
    """A session token of the principal's user for one browser (the results UI's sign-in,
    given the user's token): a token of its own, marked so, which signing that browser out
    (:func:`end_browser_session`) revokes, and not the token it was made from, which a CLI
    profile or a script may hold.  It expires when that token does, or sooner."""
    if not principal.is_user:
        raise PermissionDenied("only a user's token makes a browser session")
    expires = await session.scalar(
        select(UserToken.expires_at).where(UserToken.id == principal.token_id)
    )
    token, _ = await _issue_user_token(
        session,
        settings,
        principal.user_id,  # type: ignore[arg-type]
        browser=True,
        not_after=expires,
    )
    return token


async def end_browser_session(session: AsyncSession, *, principal: Principal) -> None:
    """Revoke the principal's token if it is a browser session (:func:`browser_session`);
    any other token (login's, a platform token) is left alone."""
    await session.execute(
        update(UserToken)
        .where(
            UserToken.id == principal.token_id,
            UserToken.browser_session,
            UserToken.revoked_at.is_(None),
        )
        .values(revoked_at=utcnow())
    )


async def logout(session: AsyncSession, *, principal: Principal) -> None:
    await session.execute(
        update(UserToken)
        .where(UserToken.id == principal.token_id, UserToken.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )


async def get_user(session: AsyncSession, *, user_id: UUID) -> User:
    user = await session.get(User, user_id)
    if user is None:
        raise NotFound("user not found")
    return user


# GET /auth/me on every page load of a client: one statement compiled once, run straight on
# psycopg (no ORM): the user, and each organization with the user's role there as one JSON
# array, in the order organizations are listed.
_users, _orgs, _roles = User.__table__, Organization.__table__, Role.__table__
_organizations_of_user = (
    select(
        func.coalesce(
            func.jsonb_agg(
                aggregate_order_by(
                    shapes.json_object(
                        schemas.OrganizationWithAccess,
                        _orgs,
                        role=shapes.json_object(schemas.RoleInfo, _roles),
                        permissions=_roles.c.permissions,
                    ),
                    _orgs.c.created_at,
                    _orgs.c.id,
                )
            ),
            literal_column("'[]'::jsonb"),
        )
    )
    .select_from(_orgs)
    .join(Membership, Membership.organization_id == _orgs.c.id)
    .join(_roles, _roles.c.id == Membership.role_id)
    .where(Membership.user_id == _users.c.id)
    .scalar_subquery()
)
_ME = Statement(
    select(
        shapes.json_object(schemas.UserRead, _users).label("user"),
        _organizations_of_user.label("organizations"),
    ).where(_users.c.id == bindparam("p_user", type_=Uuid()))
)


async def me(connection: AsyncConnection[Any], *, principal: Principal) -> schemas.Me:
    found = await _ME.structs(connection, schemas.Me, p_user=principal.user_id)
    if not found:
        raise NotFound("user not found")
    for organization in found[0].organizations:
        organization.permissions = ordered(organization.permissions)
    return found[0]
