"""Roles: an organization's system roles (fixed) and custom roles (a name and permissions).

Nobody creates, changes or deletes a role holding a permission they lack: they could grant
it, or strip it from others.  Every function takes the caller's session (the API's reads:
its connection of the direct pool) and access.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.models import Membership, Role
from shared.db.queries import flush_unique, one_in_org, page_in_org, row_in_org
from shared.errors import Conflict, NotFound
from shared.identity import schemas
from shared.identity.access import OrgAccess
from shared.identity.permissions import GUEST, ordered
from shared.paging import Paging


async def list_roles(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await page_in_org(connection, Role, access.organization_id, paging)


async def read_role(connection: AsyncConnection[Any], *, access: OrgAccess, role_id: UUID) -> Any:
    return await row_in_org(connection, Role, access.organization_id, role_id, "role")


async def get_role(session: AsyncSession, *, access: OrgAccess, role_id: UUID) -> Role:
    return await one_in_org(session, Role, access.organization_id, role_id, "role")


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
    computed: dict[str, Any] = {}
    if body.permissions is not schemas.UNSET:
        # The role holds nothing the caller lacks, so neither can a removal; check additions.
        access.require_grantable(body.permissions)
        computed["permissions"] = ordered(body.permissions)
    body.apply_to(role, **computed)
    await flush_unique(session, f"a role named {role.name!r} already exists")
    return role


async def delete_role(session: AsyncSession, *, access: OrgAccess, role_id: UUID) -> None:
    """Delete a custom role; its members fall back to GUEST and so lose its permissions."""
    role = await _managed_role(session, access, role_id, "delete")
    guest = await session.scalar(
        select(Role.id).where(
            Role.organization_id == access.organization_id, Role.name == GUEST, Role.is_system
        )
    )
    await session.execute(
        update(Membership)
        .where(Membership.organization_id == access.organization_id, Membership.role_id == role.id)
        .values(role_id=guest)
        .execution_options(synchronize_session=False)
    )
    await session.delete(role)
    await session.flush()
