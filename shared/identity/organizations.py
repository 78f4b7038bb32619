"""Organizations: creating one (with its system roles and its OWNER), listing those a
caller can see, changing and deleting one.

Every function takes the caller's session (the caller owns the transaction) and, inside an
organization, the caller's :class:`OrgAccess`, already resolved by the guard.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from sqlalchemy import Uuid, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.direct import Statement
from shared.db.models import Membership, Organization, Role
from shared.errors import NotFound, PermissionDenied
from shared.identity import schemas
from shared.identity.access import OrgAccess, Principal
from shared.identity.accounts import check_timezone
from shared.identity.permissions import OWNER, SYSTEM_ROLES
from shared.paging import Paging, paginate


async def create_organization(
    session: AsyncSession, *, principal: Principal, body: schemas.OrganizationCreate
) -> Organization:
    if not principal.is_user:
        raise PermissionDenied("platform tokens cannot create organizations")
    check_timezone(body.timezone)
    org = Organization(
        **body.changes(),
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


_NAME = Statement(
    select(Organization.name).where(Organization.id == bindparam("p_org", type_=Uuid()))
)


async def organization_name(connection: AsyncConnection[Any], *, access: OrgAccess) -> str:
    """The organization's name, for the header of its pages: one statement compiled once,
    on the request's connection of the direct pool."""
    rows = await _NAME.rows(connection, p_org=access.organization_id)
    if not rows:
        raise NotFound("organization not found")
    return str(rows[0].name)


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
        check_timezone(body.timezone)
    body.apply_to(org)
    await session.flush()
    return org


async def delete_organization(session: AsyncSession, *, access: OrgAccess) -> None:
    org = await get_organization(session, access=access)
    # Memberships reference roles; remove them first so the cascade order cannot matter.
    await session.execute(delete(Membership).where(Membership.organization_id == org.id))
    await session.delete(org)
    await session.flush()
