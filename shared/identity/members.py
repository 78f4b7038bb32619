"""Members: who belongs to an organization and with which role; inviting by email, giving
another role, removing.

The OWNER role is never granted here and its holder never changed or removed; the ADMIN
role is given or taken only by an OWNER or ADMIN; nobody manages a member holding more
than they do.  Every function takes the caller's session (the API's reads: its connection
of the direct pool) and access.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import Uuid, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db import shapes
from shared.db.base import utcnow
from shared.db.direct import Statement
from shared.db.models import Membership, Organization, Role, User
from shared.db.queries import CountedPage, flush_unique, found
from shared.errors import Conflict, NotFound, PermissionDenied
from shared.identity import schemas
from shared.identity.access import OrgAccess
from shared.identity.accounts import normalize_email
from shared.identity.permissions import ADMIN, OWNER
from shared.identity.roles import get_role
from shared.paging import Paging

# A member as its body reads: the membership with its user, role and organization as JSON
# objects (each by its primary key), in one statement.  The API's reads run it straight on
# psycopg; the answers of writes in their session (their rows not committed yet).
_memberships = Membership.__table__


def _part(shape: shapes.Shape, table: Any, key: Any) -> Any:
    """The row of ``table`` whose id is ``key`` as a JSON object of ``shape``."""
    return select(shapes.json_object(shape, table)).where(table.c.id == key).scalar_subquery()


_MEMBER_COLUMNS = shapes.labeled(
    schemas.MemberRead,
    _memberships,
    role=_part(schemas.RoleInfo, Role.__table__, _memberships.c.role_id),
    user=_part(schemas.UserRead, User.__table__, _memberships.c.user_id),
    organization=_part(
        schemas.OrganizationRead, Organization.__table__, _memberships.c.organization_id
    ),
)
_IN_ORG = _memberships.c.organization_id == bindparam("p_org", type_=Uuid())
_MEMBERS = CountedPage(_memberships, _IN_ORG, _MEMBER_COLUMNS)
_MEMBER_QUERY = select(*_MEMBER_COLUMNS).where(
    _IN_ORG, _memberships.c.user_id == bindparam("p_user", type_=Uuid())
)
_MEMBER = Statement(_MEMBER_QUERY)


async def list_members(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[list[Any], int]:
    return await _MEMBERS.read(connection, paging, p_org=access.organization_id)


async def read_member(connection: AsyncConnection[Any], *, access: OrgAccess, user_id: UUID) -> Any:
    return found(
        await _MEMBER.objects(connection, p_org=access.organization_id, p_user=user_id), "member"
    )


async def get_member(
    session: AsyncSession, *, access: OrgAccess, user_id: UUID
) -> schemas.MemberRead:
    """The member as :func:`read_member` reads it, in ``session``'s transaction: the answer
    of an invitation or a role change, before it commits."""
    given = {"p_org": access.organization_id, "p_user": user_id}
    rows = (await session.execute(_MEMBER_QUERY, given)).all()
    return schemas.MemberRead.from_row(found(rows, "member"))


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
    role = await get_role(session, access=access, role_id=role_id)
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
