"""Platform tokens: an organization's machine credentials (``pat_…``), each with its own
permissions; shown in full once, at creation, then only by a preview.

Every function takes the caller's session (the API's reads: its connection of the direct
pool) and access (an ADMIN's or OWNER's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy.ext.asyncio import AsyncSession

from shared import security
from shared.db import shapes
from shared.db.base import utcnow
from shared.db.models import PlatformToken
from shared.db.queries import InOrg, one_in_org
from shared.errors import InvalidInput
from shared.identity import schemas
from shared.identity.access import OrgAccess
from shared.identity.permissions import ordered
from shared.paging import Paging


async def create_platform_token(
    session: AsyncSession, *, access: OrgAccess, body: schemas.PlatformTokenCreate
) -> schemas.PlatformTokenCreated:
    """The new token: its listing entry plus the full token, shown this once."""
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
    return schemas.PlatformTokenCreated.from_row(pat, token=raw)


# The API's reads of tokens, straight on psycopg: the columns their body shows, so that a
# token's digest is never read.
_table = PlatformToken.__table__
_TOKENS = InOrg(_table, shapes.columns_read(schemas.PlatformTokenRead, _table))


async def list_platform_tokens(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await _TOKENS.read(connection, paging, access.organization_id)


async def read_platform_token(
    connection: AsyncConnection[Any], *, access: OrgAccess, token_id: UUID
) -> Any:
    return await _TOKENS.one(connection, access.organization_id, token_id, "platform token")


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
        await session.flush()
