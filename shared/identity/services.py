"""Identity rules: accounts and sessions, organizations, members, roles and platform tokens.

Every function takes the caller's session (the caller owns the transaction) and, for work
inside an organization, the caller's :class:`OrgAccess`, already resolved by the guard.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from uuid import UUID

import msgspec
from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from shared import security
from shared.db.base import utcnow
from shared.db.models import Membership, Organization, PlatformToken, Role, User, UserToken
from shared.db.queries import flush_unique, one_in_org
from shared.errors import Conflict, InvalidInput, NotFound, PermissionDenied, Unauthorized
from shared.identity import schemas
from shared.identity.access import OrgAccess, Principal
from shared.identity.permissions import ADMIN, GUEST, OWNER, SYSTEM_ROLES, ordered
from shared.identity.throttle import LoginThrottle
from shared.paging import Paging, paginate
from shared.schemas import iana_zones
from shared.settings import Settings

PLATFORM_TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)


# --- shared checks ---------------------------------------------------------------------------


def normalize_email(email: str) -> str:
    return email.strip().lower()


def check_timezone(name: str, loc: tuple[str, ...] = ("body", "timezone")) -> str:
    if name not in iana_zones():
        raise InvalidInput(loc, "Unknown IANA time zone", input=name)
    return name


# --- accounts and sessions -------------------------------------------------------------------


async def _issue_user_token(
    session: AsyncSession, settings: Settings, user_id: UUID
) -> tuple[str, datetime]:
    token = security.new_token(security.USER_TOKEN_PREFIX)
    expires_at = utcnow() + timedelta(seconds=settings.user_token_ttl_s)
    session.add(
        UserToken(user_id=user_id, token_digest=security.token_digest(token), expires_at=expires_at)
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


async def logout(session: AsyncSession, *, principal: Principal) -> None:
    await session.execute(
        update(UserToken)
        .where(UserToken.id == principal.token_id, UserToken.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )


# The guard's lookups, built once.  A user token comes with its user and, for a route inside
# an organization, the user's role there (outer joins: no membership, no role): one
# indexed round trip answers the whole question, so revocation is seen by the very next
# request without any cache.
_USER_TOKEN = (
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
_USER_TOKEN_IN_ORG = (
    _USER_TOKEN.add_columns(Membership.role_id, Role.name, Role.is_system, Role.permissions)
    .outerjoin(
        Membership,
        (Membership.user_id == User.id) & (Membership.organization_id == bindparam("org_id")),
    )
    .outerjoin(Role, Role.id == Membership.role_id)
)
_PLATFORM_TOKEN = select(
    PlatformToken.id,
    PlatformToken.is_active,
    PlatformToken.expires_at,
    PlatformToken.organization_id,
    PlatformToken.permissions,
    PlatformToken.last_used_at,
).where(PlatformToken.token_digest == bindparam("digest"))


async def authenticate(
    connection: AsyncConnection, raw_token: str, org_id: UUID | None = None
) -> tuple[Principal, OrgAccess | None]:
    """Resolve a bearer token to its principal and, given ``org_id``, its access there.

    Raises :class:`Unauthorized` for a token that is unknown, revoked or expired (before
    anything else), then :class:`NotFound` if the principal has no access to ``org_id``.
    ``connection`` should be in autocommit: reads only, and at most one write a minute.
    """
    now = utcnow()
    digest = security.token_digest(raw_token)
    if raw_token.startswith(security.USER_TOKEN_PREFIX):
        if org_id is None:
            result = await connection.execute(_USER_TOKEN, {"digest": digest})
        else:
            result = await connection.execute(
                _USER_TOKEN_IN_ORG, {"digest": digest, "org_id": org_id}
            )
        row = result.one_or_none()
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
        pat = (await connection.execute(_PLATFORM_TOKEN, {"digest": digest})).one_or_none()
        if pat is None:
            raise Unauthorized("invalid token")
        if not pat.is_active:
            raise Unauthorized("token has been revoked")
        if pat.expires_at is not None and pat.expires_at <= now:
            raise Unauthorized("token has expired")
        stale = now - PLATFORM_TOKEN_TOUCH_INTERVAL
        if pat.last_used_at is None or pat.last_used_at < stale:
            # At most one write a minute per token: skipped in Python when the row just read
            # is fresh, guarded in SQL so that concurrent requests agree.
            await connection.execute(
                update(PlatformToken)
                .where(
                    PlatformToken.id == pat.id,
                    (PlatformToken.last_used_at.is_(None)) | (PlatformToken.last_used_at < stale),
                )
                .values(last_used_at=now)
            )
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


async def get_user(session: AsyncSession, *, user_id: UUID) -> User:
    user = await session.get(User, user_id)
    if user is None:
        raise NotFound("user not found")
    return user


async def me(session: AsyncSession, *, principal: Principal) -> schemas.Me:
    user = await get_user(session, user_id=principal.user_id)  # type: ignore[arg-type]
    rows = (
        await session.execute(
            select(Organization, Role)
            .join(Membership, Membership.organization_id == Organization.id)
            .join(Role, Role.id == Membership.role_id)
            .where(Membership.user_id == user.id)
            .order_by(Organization.created_at, Organization.id)
        )
    ).all()
    organizations = [
        schemas.OrganizationWithAccess(
            **msgspec.structs.asdict(schemas.OrganizationRead.from_row(org)),
            role=schemas.RoleInfo.from_row(role),
            permissions=ordered(role.permissions),
        )
        for org, role in rows
    ]
    return schemas.Me(user=schemas.UserRead.from_row(user), organizations=organizations)


# --- organizations ---------------------------------------------------------------------------


async def create_organization(
    session: AsyncSession, *, principal: Principal, body: schemas.OrganizationCreate
) -> Organization:
    if not principal.is_user:
        raise PermissionDenied("platform tokens cannot create organizations")
    check_timezone(body.timezone)
    org = Organization(
        name=body.name,
        business_information=body.business_information,
        timezone=body.timezone,
        created_by_user_id=principal.user_id,
        owner_user_id=principal.user_id,
    )
    session.add(org)
    await session.flush()
    roles = {
        name: Role(organization_id=org.id, name=name, is_system=True, permissions=list(perms))
        for name, perms in SYSTEM_ROLES.items()
    }
    session.add_all(roles.values())
    await session.flush()
    session.add(
        Membership(organization_id=org.id, user_id=principal.user_id, role_id=roles[OWNER].id)
    )
    await session.flush()
    return org


async def list_organizations(
    session: AsyncSession, *, principal: Principal, paging: Paging
) -> tuple[list[Organization], int]:
    query = select(Organization)
    if principal.is_user:
        query = query.join(Membership, Membership.organization_id == Organization.id).where(
            Membership.user_id == principal.user_id
        )
    else:
        query = query.where(Organization.id == principal.organization_id)
    return await paginate(session, query, paging, Organization.created_at, Organization.id)


async def get_organization(session: AsyncSession, *, access: OrgAccess) -> Organization:
    org = await session.get(Organization, access.organization_id)
    if org is None:
        raise NotFound("organization not found")
    return org


async def update_organization(
    session: AsyncSession, *, access: OrgAccess, body: schemas.OrganizationUpdate
) -> Organization:
    org = await get_organization(session, access=access)
    if body.timezone is not schemas.UNSET:
        org.timezone = check_timezone(body.timezone)
    if body.name is not schemas.UNSET:
        org.name = body.name
    if body.business_information is not schemas.UNSET:
        org.business_information = body.business_information
    org.updated_at = utcnow()
    await session.flush()
    return org


async def delete_organization(session: AsyncSession, *, access: OrgAccess) -> None:
    org = await get_organization(session, access=access)
    # Memberships reference roles; remove them first so the cascade order cannot matter.
    await session.execute(delete(Membership).where(Membership.organization_id == org.id))
    await session.delete(org)
    await session.flush()


# --- roles -------------------------------------------------------------------------------------


async def _role_in_org(session: AsyncSession, org_id: UUID, role_id: UUID) -> Role:
    return await one_in_org(session, Role, org_id, role_id, "role")


async def _managed_role(session: AsyncSession, access: OrgAccess, role_id: UUID, verb: str) -> Role:
    """The custom role ``role_id``, locked, if the caller may change or delete it: nobody
    touches a role that holds a permission they lack (they could strip it from others)."""
    role = await session.scalar(
        select(Role)
        .where(Role.id == role_id, Role.organization_id == access.organization_id)
        .with_for_update()
    )
    if role is None:
        raise NotFound("role not found")
    if role.is_system:
        raise Conflict(f"system roles cannot be {verb}d")
    access.require_grantable(role.permissions, f"cannot {verb} a role holding permissions you lack")
    return role


async def _system_role(session: AsyncSession, org_id: UUID, name: str) -> Role:
    return await session.scalar(
        select(Role).where(Role.organization_id == org_id, Role.name == name, Role.is_system)
    )


async def list_roles(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[Role], int]:
    query = select(Role).where(Role.organization_id == access.organization_id)
    return await paginate(session, query, paging, Role.created_at, Role.id)


async def get_role(session: AsyncSession, *, access: OrgAccess, role_id: UUID) -> Role:
    return await _role_in_org(session, access.organization_id, role_id)


async def create_role(
    session: AsyncSession, *, access: OrgAccess, body: schemas.RoleCreate
) -> Role:
    access.require_grantable(body.permissions)
    role = Role(
        organization_id=access.organization_id,
        name=body.name,
        is_system=False,
        permissions=ordered(body.permissions),
    )
    session.add(role)
    await flush_unique(session, f"a role named {body.name!r} already exists")
    return role


async def update_role(
    session: AsyncSession, *, access: OrgAccess, role_id: UUID, body: schemas.RoleUpdate
) -> Role:
    role = await _managed_role(session, access, role_id, "change")
    if body.permissions is not schemas.UNSET:
        # The role holds nothing the caller lacks, so neither can a removal; check additions.
        access.require_grantable(body.permissions)
        role.permissions = ordered(body.permissions)
    if body.name is not schemas.UNSET:
        role.name = body.name
    role.updated_at = utcnow()
    await flush_unique(session, f"a role named {role.name!r} already exists")
    return role


async def delete_role(session: AsyncSession, *, access: OrgAccess, role_id: UUID) -> None:
    """Delete a custom role; its members fall back to GUEST and so lose its permissions."""
    role = await _managed_role(session, access, role_id, "delete")
    guest = await _system_role(session, access.organization_id, GUEST)
    await session.execute(
        update(Membership)
        .where(Membership.organization_id == access.organization_id, Membership.role_id == role.id)
        .values(role_id=guest.id)
        .execution_options(synchronize_session=False)
    )
    await session.delete(role)
    await session.flush()


# --- members -----------------------------------------------------------------------------------


def _member_query(org_id: UUID):  # type: ignore[no-untyped-def]
    return (
        select(Membership, User, Role, Organization)
        .join(User, User.id == Membership.user_id)
        .join(Role, Role.id == Membership.role_id)
        .join(Organization, Organization.id == Membership.organization_id)
        .where(Membership.organization_id == org_id)
    )


def member_read(row: tuple[Membership, User, Role, Organization]) -> schemas.MemberRead:
    membership, user, role, org = row
    # The row's parts, not its relationships (those raise rather than load lazily).
    return schemas.MemberRead(
        id=membership.id,
        user_id=membership.user_id,
        organization_id=membership.organization_id,
        role_id=membership.role_id,
        created_at=membership.created_at,
        role=schemas.RoleInfo.from_row(role),
        user=schemas.UserRead.from_row(user),
        organization=schemas.OrganizationRead.from_row(org),
    )


async def list_members(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[schemas.MemberRead], int]:
    rows, total = await paginate(
        session, _member_query(access.organization_id), paging, Membership.created_at, Membership.id
    )
    return [member_read(row) for row in rows], total


async def get_member(
    session: AsyncSession, *, access: OrgAccess, user_id: UUID
) -> schemas.MemberRead:
    row = (
        await session.execute(
            _member_query(access.organization_id).where(Membership.user_id == user_id)
        )
    ).one_or_none()
    if row is None:
        raise NotFound("member not found")
    return member_read(row)


def _is_system(role: Role, name: str) -> bool:
    return role.is_system and role.name == name


def _require_admin_for(access: OrgAccess, role: Role, action: str) -> None:
    """The ADMIN role is given, taken away and its members removed only by a user whose
    role is OWNER or ADMIN.  Being an ADMIN is more than its permissions (it manages
    platform tokens), so holding every permission, as a custom role or a platform token
    may, is not enough: it would make an ADMIN, or unmake every one."""
    if _is_system(role, ADMIN):
        access.require_role(ADMIN, action)


async def _grantable_role(session: AsyncSession, access: OrgAccess, role_id: UUID) -> Role:
    role = await _role_in_org(session, access.organization_id, role_id)
    if _is_system(role, OWNER):
        raise PermissionDenied("the OWNER role cannot be granted through the member endpoints")
    _require_admin_for(access, role, "granting the ADMIN role")
    access.require_grantable(role.permissions)
    return role


async def _managed_membership(
    session: AsyncSession, access: OrgAccess, user_id: UUID, action: str
) -> tuple[Membership, Role]:
    """The target membership, if the caller may act on it: never the owner, an ADMIN only
    as an OWNER or ADMIN, never a member holding more than the caller."""
    row = (
        await session.execute(
            select(Membership, Role)
            .join(Role, Role.id == Membership.role_id)
            .where(
                Membership.organization_id == access.organization_id, Membership.user_id == user_id
            )
            .with_for_update(of=Membership)
        )
    ).one_or_none()
    if row is None:
        raise NotFound("member not found")
    membership, role = row
    if _is_system(role, OWNER):
        raise Conflict(f"the organization owner cannot be {action}")
    _require_admin_for(access, role, "changing or removing an ADMIN")
    access.require_grantable(
        role.permissions, "cannot manage a member holding permissions you lack"
    )
    return membership, role


async def invite_member(
    session: AsyncSession, *, access: OrgAccess, body: schemas.MemberInvite
) -> schemas.MemberRead:
    """Add a member by email; an unknown email becomes an ``invited`` user without a password."""
    role = await _grantable_role(session, access, body.role_id)
    email = normalize_email(body.email)
    user = await session.scalar(select(User).where(User.email == email))
    if user is None:
        user = User(email=email, status="invited", invited_at=utcnow(), password_hash=None)
        session.add(user)
        await flush_unique(session, "an account with this email was created concurrently")
    session.add(
        Membership(organization_id=access.organization_id, user_id=user.id, role_id=role.id)
    )
    await flush_unique(session, "this user is already a member of the organization")
    return await get_member(session, access=access, user_id=user.id)


async def change_member_role(
    session: AsyncSession, *, access: OrgAccess, user_id: UUID, body: schemas.MemberRoleUpdate
) -> schemas.MemberRead:
    membership, _ = await _managed_membership(session, access, user_id, "re-roled")
    role = await _grantable_role(session, access, body.role_id)
    membership.role_id = role.id
    await session.flush()
    return await get_member(session, access=access, user_id=user_id)


async def remove_member(session: AsyncSession, *, access: OrgAccess, user_id: UUID) -> None:
    membership, _ = await _managed_membership(session, access, user_id, "removed")
    await session.delete(membership)
    await session.flush()


# --- platform tokens ---------------------------------------------------------------------------


async def create_platform_token(
    session: AsyncSession, *, access: OrgAccess, body: schemas.PlatformTokenCreate
) -> tuple[PlatformToken, str]:
    access.require_grantable(body.permissions)
    if body.expires_at is not None:
        if body.expires_at.tzinfo is None:
            raise InvalidInput(
                ("body", "expires_at"), "expires_at needs a time zone", input=str(body.expires_at)
            )
        if body.expires_at <= utcnow():
            raise InvalidInput(
                ("body", "expires_at"),
                "expires_at must be in the future",
                input=body.expires_at.isoformat(),
            )
    raw = security.new_token(security.PLATFORM_TOKEN_PREFIX)
    pat = PlatformToken(
        organization_id=access.organization_id,
        name=body.name,
        permissions=ordered(body.permissions),
        token_digest=security.token_digest(raw),
        token_preview=security.token_preview(raw),
        expires_at=body.expires_at,
        created_by_user_id=access.principal.user_id,
    )
    session.add(pat)
    await session.flush()
    return pat, raw


async def list_platform_tokens(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[PlatformToken], int]:
    query = select(PlatformToken).where(PlatformToken.organization_id == access.organization_id)
    return await paginate(session, query, paging, PlatformToken.created_at, PlatformToken.id)


async def get_platform_token(
    session: AsyncSession, *, access: OrgAccess, token_id: UUID
) -> PlatformToken:
    return await one_in_org(
        session, PlatformToken, access.organization_id, token_id, "platform token"
    )


async def revoke_platform_token(
    session: AsyncSession, *, access: OrgAccess, token_id: UUID
) -> None:
    pat = await get_platform_token(session, access=access, token_id=token_id)
    if pat.is_active:
        pat.is_active = False
        pat.updated_at = utcnow()
        await session.flush()


# --- response shapes -----------------------------------------------------------------------------


def role_read(role: Role) -> schemas.RoleRead:
    return msgspec.structs.replace(
        schemas.RoleRead.from_row(role), permissions=ordered(role.permissions)
    )


def platform_token_read(pat: PlatformToken) -> schemas.PlatformTokenRead:
    return msgspec.structs.replace(
        schemas.PlatformTokenRead.from_row(pat), permissions=ordered(pat.permissions)
    )


def platform_token_created(pat: PlatformToken, raw_token: str) -> schemas.PlatformTokenCreated:
    """The create answer: the listing entry plus the full token, shown this once."""
    return schemas.PlatformTokenCreated(
        **msgspec.structs.asdict(platform_token_read(pat)), token=raw_token
    )
