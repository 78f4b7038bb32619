"""Organizations: creating one (with its system roles and its OWNER), listing those a
caller can see, changing and deleting one.

Every function takes the caller's session (the caller owns the transaction; the API's reads:
its connection of the direct pool) and, inside an organization, the caller's
:class:`OrgAccess`, already resolved by the guard.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from sqlalchemy import Uuid, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db import shapes
from shared.db.direct import Statement
from shared.db.models import Membership, Organization, Role
from shared.db.queries import CountedPage, found
from shared.errors import NotFound, PermissionDenied
from shared.identity import schemas
from shared.identity.access import OrgAccess, Principal
from shared.identity.accounts import check_timezone
from shared.identity.permissions import OWNER, SYSTEM_ROLES
from shared.paging import Paging


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


# The API's reads of organizations, straight on psycopg: statements compiled once.
_orgs = Organization.__table__
_ORGANIZATION_COLUMNS = shapes.columns_read(schemas.OrganizationRead, _orgs)
_ORG = bindparam("p_org", type_=Uuid())
# A user sees the organizations they are a member of; a platform token, its own.
_OF_USER = CountedPage(
    _orgs,
    _orgs.c.id.in_(
        select(Membership.organization_id).where(
            Membership.user_id == bindparam("p_user", type_=Uuid())
        )
    ),
    _ORGANIZATION_COLUMNS,
)
_OF_TOKEN = CountedPage(_orgs, _orgs.c.id == _ORG, _ORGANIZATION_COLUMNS)
_ORGANIZATION = Statement(select(*_ORGANIZATION_COLUMNS).where(_orgs.c.id == _ORG))
_NAME = Statement(select(_orgs.c.name).where(_orgs.c.id == _ORG))


async def read_organizations(
    connection: AsyncConnection[Any], *, principal: Principal, paging: Paging
) -> tuple[list[Any], int]:
    """The organizations the caller sees, paged: a user's, those they are a member of; a
    platform token's, its own."""
    if principal.is_user:
        return await _OF_USER.read(connection, paging, p_user=principal.user_id)
    return await _OF_TOKEN.read(connection, paging, p_org=principal.organization_id)


async def read_organization(connection: AsyncConnection[Any], *, access: OrgAccess) -> Any:
    return found(
        await _ORGANIZATION.objects(connection, p_org=access.organization_id), "organization"
    )


async def organization_name(connection: AsyncConnection[Any], *, access: OrgAccess) -> str:
    """The organization's name, for the header of its pages: one statement compiled once,
    on the request's connection of the direct pool."""
    rows = await _NAME.rows(connection, p_org=access.organization_id)
    return str(found(rows, "organization").name)


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
