"""Request-scoped dependencies shared by every controller."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated
from uuid import UUID

from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import provide_access, provide_principal
from shared.identity.access import OrgAccess, Principal
from shared.paging import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET, Paging
from shared.settings import Settings

# Handler parameter types: dependencies are named explicitly, path ids are UUIDs (a
# malformed one answers 422 with loc ["path", ...]).
DbSession = NamedDependency[AsyncSession]
Access = NamedDependency[OrgAccess]
Caller = NamedDependency[Principal]
Page = NamedDependency[Paging]
Config = NamedDependency[Settings]
PathId = FromPath[UUID]


async def provide_db_session(state: State) -> AsyncIterator[AsyncSession]:
    """One transaction per request: committed after the handler, rolled back on error."""
    async with state.session_factory() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise


def provide_settings(state: State) -> Settings:
    return state.settings


def provide_paging(
    limit: Annotated[
        int, QueryParameter(ge=1, le=MAX_LIMIT, description="Page size (1-500).")
    ] = DEFAULT_LIMIT,
    offset: Annotated[int, QueryParameter(ge=0, le=MAX_OFFSET, description="Items to skip.")] = 0,
) -> Paging:
    return Paging(limit=limit, offset=offset)


DEPENDENCIES = {
    "db_session": Provide(provide_db_session),
    "settings": Provide(provide_settings, sync_to_thread=False),
    "paging": Provide(provide_paging, sync_to_thread=False),
    "principal": Provide(provide_principal),
    "access": Provide(provide_access),
}
