"""Query helpers every domain's services share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.interfaces import ORMOption

from shared.errors import Conflict, NotFound
from shared.paging import Paging, paginate

T = TypeVar("T")


async def one_in_org(
    session: AsyncSession,
    model: type[T],
    org_id: UUID,
    row_id: UUID,
    what: str,
    *,
    load: Sequence[ORMOption] = (),
    **options: Any,
) -> T:
    """The row ``row_id`` of ``model`` if it belongs to ``org_id``; otherwise 404 — another
    organization's id reads exactly like a missing one.  ``load``: loader options (its
    relationships to load with it); ``options``: execution options."""
    query = select(model).where(model.id == row_id, model.organization_id == org_id)  # type: ignore[attr-defined]
    if load:
        query = query.options(*load)
    if options:
        query = query.execution_options(**options)
    row = await session.scalar(query)
    if row is None:
        raise NotFound(f"{what} not found")
    return row


async def page_in_org(
    session: AsyncSession, model: type[T], org_id: UUID, paging: Paging
) -> tuple[list[T], int]:
    """One page of ``model``'s rows in ``org_id``, in the order every listing uses, and
    their total."""
    query = select(model).where(model.organization_id == org_id)  # type: ignore[attr-defined]
    return await paginate(session, query, paging, model.created_at, model.id)  # type: ignore[attr-defined]


async def all_in_org(
    session: AsyncSession, model: Any, org_id: UUID, ids: Iterable[UUID], what: str
) -> None:
    """404 naming every id of ``ids`` that is not a row of ``model`` in ``org_id``: another
    organization's ids read exactly like missing ones."""
    wanted = set(ids)
    if not wanted:
        return
    found = set(
        await session.scalars(
            select(model.id).where(model.id.in_(wanted), model.organization_id == org_id)
        )
    )
    missing = wanted - found
    if missing:
        raise NotFound(f"{what} not found: {', '.join(sorted(map(str, missing)))}")


async def flush_unique(session: AsyncSession, message: str) -> None:
    """Flush, turning a unique-constraint violation into a 409 with ``message``."""
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(message) from None
