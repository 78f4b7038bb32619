"""Query helpers every domain's services share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import BigInteger, Integer, bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.interfaces import ORMOption

from shared.db.direct import Statement
from shared.errors import Conflict, NotFound
from shared.paging import Paging

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


@cache
def _page_in_org_statements(model: Any) -> tuple[Statement, Statement]:
    """The count and the page of ``model``'s rows in an organization, compiled once."""
    table = model.__table__
    in_org = table.c.organization_id == bindparam("p_org", type_=table.c.organization_id.type)
    count = select(func.count()).select_from(table).where(in_org)
    page = (
        select(table)
        .where(in_org)
        .order_by(table.c.created_at, table.c.id)
        .limit(bindparam("p_limit", type_=Integer()))
        .offset(bindparam("p_offset", type_=BigInteger()))
    )
    return Statement(count), Statement(page)


async def page_in_org(
    connection: AsyncConnection[Any], model: Any, org_id: UUID, paging: Paging
) -> tuple[Sequence[Any], int]:
    """One page of ``model``'s rows in ``org_id``, in the order every listing uses, and
    their total.  The rows hold the table's columns as attributes (what ``from_row`` reads),
    not ORM objects: the statements run straight on psycopg (``connection``: the request's
    ``db_reads``), where SQLAlchemy's ORM cost most of a listing's CPU."""
    count, page = _page_in_org_statements(model)
    ((total,),) = await count.rows(connection, p_org=org_id)
    rows = await page.objects(
        connection, p_org=org_id, p_limit=paging.limit, p_offset=paging.offset
    )
    return rows, total


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
