"""Query helpers every domain's services share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.interfaces import ORMOption

from shared.errors import Conflict, NotFound

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


async def touch_stalled(
    session: AsyncSession,
    model: Any,
    stalled: ColumnElement[bool],
    *,
    now: datetime,
    limit: int,
) -> list[UUID]:
    """The sweeper's take: the ids of up to ``limit`` rows of ``model`` that are
    ``stalled`` (oldest ``updated_at`` first, skipping rows another transaction holds),
    their ``updated_at`` moved to ``now`` so that the next pass leaves them for as long
    again."""
    taken = (
        select(model.id)
        .where(stalled)
        .order_by(model.updated_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return list(
        await session.scalars(
            update(model).where(model.id.in_(taken)).values(updated_at=now).returning(model.id)
        )
    )
