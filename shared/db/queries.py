"""Query helpers every domain's services share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import BigInteger, Column, Integer, Table, and_, bindparam, func, select, true
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


def found(rows: Sequence[T], what: str) -> T:
    """The one row of ``rows`` (a read by id); 404 ``<what> not found`` when there is none."""
    if not rows:
        raise NotFound(f"{what} not found")
    return rows[0]


@dataclass(frozen=True, slots=True)
class Parent:
    """What a listing of rows that belong to another is under: ``key``, a column of the
    listed table, names a row of ``table``, an organization's (its ``organization_id``);
    ``what`` names that row in the 404 when it is not the organization's."""

    table: Table
    key: Column[Any]
    what: str


class CountedPage:
    """A listing's page and its total in one statement, compiled once: ``columns`` (an
    ``id`` and a ``created_at`` among them) of ``table``'s rows where ``wanted``, in the
    order every listing uses, ``:p_limit`` of them after ``:p_offset``, each beside the
    count of them all (``newest_first``: the same order reversed, for pages that show the
    latest first).  The page is joined to its count, not the count to the page: an
    empty page is still one row (its columns null), to read the total from.

    Under a ``parent`` (the executions of a trigger), the rows are those whose key is
    ``:p_parent``, and the count and page are joined to that parent's row in the
    organization ``:p_org``: no row at all when it is not the organization's, which
    :meth:`read` answers with a 404.  The parent's check and the listing in one statement.

    One round trip where a count and a page were two: on psycopg directly a round trip is
    most of what a listing costs the API's CPU (and PostgreSQL's).  Run straight on psycopg
    (``connection``: the request's ``db_reads``), no ORM."""

    def __init__(
        self,
        table: Any,
        wanted: Any,
        columns: Sequence[Any],
        *,
        newest_first: bool = False,
        parent: Parent | None = None,
    ) -> None:
        def order(source: Any) -> tuple[Any, ...]:
            keys = (source.c.created_at, source.c.id)
            return tuple(key.desc() for key in keys) if newest_first else keys

        if parent is not None:
            parent_id = bindparam("p_parent", type_=parent.key.type)
            wanted = and_(wanted, parent.key == parent_id)
        page = (
            select(*columns)
            .where(wanted)
            .order_by(*order(table))
            .limit(bindparam("p_limit", type_=Integer()))
            .offset(bindparam("p_offset", type_=BigInteger()))
            .subquery("page")
        )
        counted = (
            select(func.count().label("listing_total"))
            .select_from(table)
            .where(wanted)
            .subquery("counted")
        )
        listing = select(counted.c.listing_total, *page.c).order_by(*order(page))
        if parent is None:
            listing = listing.select_from(counted.outerjoin(page, true()))
        else:
            owner = parent.table.c
            listing = listing.select_from(
                parent.table.join(counted, true()).outerjoin(page, true())
            ).where(
                owner.id == parent_id,
                owner.organization_id == bindparam("p_org", type_=owner.organization_id.type),
            )
        self._parent = parent
        self._statement = Statement(listing)

    async def read(
        self, connection: AsyncConnection[Any], paging: Paging, **given: Any
    ) -> tuple[list[Any], int]:
        """The page's rows (objects with an attribute per column: what ``from_row`` reads)
        and the total, ``given`` the statement's parameters; 404 under a parent that is not
        the organization's."""
        rows = await self._statement.objects(
            connection, p_limit=paging.limit, p_offset=paging.offset, **given
        )
        if self._parent is not None:
            found(rows, self._parent.what)
        return [row for row in rows if row.id is not None], rows[0].listing_total


class InOrg:
    """An organization's rows of ``table`` (``columns``: all of them when not given), read
    straight on psycopg: one of them by its id (:meth:`one`), or their listing (under a
    ``parent``: of one parent's, :class:`CountedPage`) narrowed by the equality
    ``filters`` it allows: ``read(..., status=x)`` keeps the rows whose ``status`` is
    ``x``; a filter given ``None`` is not applied.  One :class:`CountedPage` per set of
    filters asked for, compiled at its first use."""

    def __init__(
        self,
        table: Any,
        columns: Sequence[Any] | None = None,
        *,
        filters: Sequence[str] = (),
        newest_first: bool = False,
        parent: Parent | None = None,
    ) -> None:
        self._table = table
        self._parent = parent
        self._columns = list(table.c if columns is None else columns)
        self._filters = frozenset(filters)
        self._newest_first = newest_first
        self._pages: dict[frozenset[str], CountedPage] = {}
        self._by_id: Statement | None = None

    def page(self, *filters: str) -> CountedPage:
        """The listing narrowed by ``filters``: the organization is ``:p_org``, each filter
        ``:p_<its column>``."""
        names = frozenset(filters)
        if not names <= self._filters:
            unknown = ", ".join(sorted(names - self._filters))
            raise ValueError(f"not filters of this listing: {unknown}")
        page = self._pages.get(names)
        if page is None:
            c = self._table.c
            wanted = and_(
                c.organization_id == bindparam("p_org", type_=c.organization_id.type),
                *(c[name] == bindparam(f"p_{name}", type_=c[name].type) for name in sorted(names)),
            )
            page = CountedPage(
                self._table,
                wanted,
                self._columns,
                newest_first=self._newest_first,
                parent=self._parent,
            )
            self._pages[names] = page
        return page

    def by_id(self) -> Statement:
        """The row ``:p_id`` if it belongs to the organization ``:p_org`` (no row
        otherwise), compiled at its first use: for a read that sends it with others at
        once (:func:`shared.db.direct.read_together`); :meth:`one` reads it alone."""
        if self._by_id is None:
            c = self._table.c
            self._by_id = Statement(
                select(*self._columns).where(
                    c.id == bindparam("p_id", type_=c.id.type),
                    c.organization_id == bindparam("p_org", type_=c.organization_id.type),
                )
            )
        return self._by_id

    async def one(
        self, connection: AsyncConnection[Any], org_id: UUID, row_id: UUID, what: str
    ) -> Any:
        """The row ``row_id`` (an object with an attribute per column: what ``from_row``
        reads) if it belongs to ``org_id``; otherwise 404, as :func:`one_in_org`."""
        return found(await self.by_id().objects(connection, p_id=row_id, p_org=org_id), what)

    async def read(
        self,
        connection: AsyncConnection[Any],
        paging: Paging,
        org_id: UUID,
        *,
        parent_id: UUID | None = None,
        **filters: Any,
    ) -> tuple[list[Any], int]:
        """One page of the organization's rows (under a parent: those of ``parent_id``),
        and their total, narrowed by the ``filters`` given a value
        (:meth:`CountedPage.read`)."""
        given = {name: value for name, value in filters.items() if value is not None}
        under = {} if self._parent is None else {"p_parent": parent_id}
        page = self.page(*given)
        return await page.read(
            connection,
            paging,
            p_org=org_id,
            **under,
            **{f"p_{name}": value for name, value in given.items()},
        )


@cache
def _in_org(model: Any) -> InOrg:
    return InOrg(model.__table__)


async def row_in_org(
    connection: AsyncConnection[Any], model: Any, org_id: UUID, row_id: UUID, what: str
) -> Any:
    """:func:`one_in_org` for a read straight on psycopg (``connection``: the request's
    ``db_reads``): the row holds the table's columns as attributes, it is not an ORM
    object (:meth:`InOrg.one`)."""
    return await _in_org(model).one(connection, org_id, row_id, what)


async def page_in_org(
    connection: AsyncConnection[Any], model: Any, org_id: UUID, paging: Paging
) -> tuple[Sequence[Any], int]:
    """One page of ``model``'s rows in ``org_id``, in the order every listing uses, and
    their total (:class:`InOrg`): the rows hold the table's columns as attributes, not ORM
    objects."""
    return await _in_org(model).read(connection, paging, org_id)


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
