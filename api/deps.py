"""Request-scoped dependencies shared by every controller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from functools import cache
from typing import Annotated, Any, TypeVar, get_args
from uuid import UUID

import msgspec
from litestar import Litestar, Request
from litestar._kwargs import KwargsModel
from litestar._kwargs.dependencies import DependencyContainer
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, QueryParameter
from litestar.routes import HTTPRoute
from sqlalchemy.ext.asyncio import AsyncSession

from api.auth import provide_access, provide_principal
from api.lease import READS_ON_LEASE, request_lease
from shared.db.direct import Lease
from shared.identity.access import OrgAccess, Principal
from shared.paging import DEFAULT_LIMIT, MAX_LIMIT, MAX_OFFSET, Paging
from shared.schemas import Output
from shared.settings import Settings

Listing = TypeVar("Listing", bound=Output)
T = TypeVar("T")

# Handler parameter types: dependencies are named explicitly, path ids are UUIDs (a
# malformed one answers 422 with loc ["path", ...]).
DbSession = NamedDependency[AsyncSession]
DbReads = NamedDependency[Lease]
Access = NamedDependency[OrgAccess]
Caller = NamedDependency[Principal]
Page = NamedDependency[Paging]
Config = NamedDependency[Settings]
PathId = FromPath[UUID]

# The documented maximum is read as a JSON number (a double): 2**63 - 1 would round up to
# 2**63, an offset the API refuses.  2**53 - 1 is exact, and far past any real listing.
OFFSET_LIMIT = min(MAX_OFFSET, 2**53 - 1)


# Requests that only read.  Inside a READ COMMITTED transaction every statement takes its
# own snapshot anyway, so their statements run in autocommit: same answers, without the
# BEGIN and COMMIT round trips.
_READ_METHODS = frozenset({"GET", "HEAD"})


async def provide_db_session(
    state: State, request: Request[Any, Any, Any]
) -> AsyncIterator[AsyncSession]:
    """One transaction per request (:meth:`Database.transaction`): committed after the
    handler, rolled back on error; a GET or HEAD reads in autocommit."""
    async with state.database.transaction(read_only=request.method in _READ_METHODS) as session:
        yield session


def provide_db_reads(request: Request[Any, Any, Any]) -> Lease:
    """The request's connection of the direct pool (:mod:`api.lease`, autocommit), the one
    its guard looked the token up on, for a handler's reads that are all statements
    compiled once (:class:`shared.db.direct.Statement`): the frequent reads (listings,
    ``/auth/me``), where opening, committing and closing an ORM session cost more CPU than
    the rest of the request.  The handler reads with :func:`reading`, which gives the
    connection back as soon as the read answers; :class:`api.lease.LeaseMiddleware` gives
    it back if the request ends before (a query parameter out of range)."""
    return request_lease(request)


async def reading(lease: Lease, read: Callable[..., Awaitable[T]], **arguments: Any) -> T:
    """``read(connection, **arguments)`` on the connection of ``lease``, given back as soon
    as it answers."""
    try:
        return await read(await lease.connection(), **arguments)
    finally:
        await lease.give_back()


def provide_settings(state: State) -> Settings:
    return state.settings


def provide_paging(
    limit: Annotated[
        int, QueryParameter(ge=1, le=MAX_LIMIT, description="Page size (1-500).")
    ] = DEFAULT_LIMIT,
    offset: Annotated[int, QueryParameter(ge=0, le=OFFSET_LIMIT, description="Items to skip.")] = 0,
) -> Paging:
    return Paging(limit=limit, offset=offset)


def listing(body: type[Listing], page: tuple[Sequence[Any], int]) -> Listing:
    """The listing ``body`` (its items, then ``total``) of one page of rows and their total
    (a listing service's answer): each row as the items' body, by ``from_row``."""
    name, read = _items_of(body)
    rows, total = page
    return body(**{name: [read.from_row(row) for row in rows]}, total=total)


@cache
def _items_of(body: type[Output]) -> tuple[str, type[Output]]:
    """A listing body's items field and their body (``msgspec.structs.fields`` evaluates the
    class's annotations at each call: once per body, not per request)."""
    items, _ = msgspec.structs.fields(body)
    (read,) = get_args(items.type)
    return items.name, read


def declare_lease_readers(app: Litestar) -> None:
    """Record on each handler whether it reads on the request's lease (``db_reads``): the
    guard keeps the connection it looked the token up on for such a handler only."""
    for handler, kwargs_model in _handlers(app):
        handler.opt[READS_ON_LEASE] = any(
            dependency.key == "db_reads"
            for batch in kwargs_model.dependency_batches
            for dependency in batch
        )


def resolve_in_turn(app: Litestar) -> None:
    """Have every handler of ``app`` resolve its dependencies one after another.

    Litestar resolves a request's independent dependencies concurrently, each in a task of
    an anyio task group.  Spar's providers that can run together await no I/O (they read
    the request, its state or the guard's outcome; ``db_session``'s session connects at
    its first statement; ``org_name``, which reads, needs the session), so the
    concurrency bought nothing, and the group's tasks and cancel scopes were the
    largest single cost of a listing: 17 % of its CPU, by py-spy under bench/api.py.  In
    each of Litestar's batches, the providers without a generator come first, so a query
    parameter out of range (``paging``) is refused before any generator is entered."""
    for _, kwargs_model in _handlers(app):
        kwargs_model.dependency_batches = [
            {dependency}
            for batch in kwargs_model.dependency_batches
            for dependency in sorted(batch, key=_generators_last)
        ]


def _handlers(app: Litestar) -> Iterator[tuple[HTTPRouteHandler, KwargsModel]]:
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            yield from route.route_handler_map.values()


def _generators_last(dependency: DependencyContainer) -> tuple[bool, str]:
    provide = dependency.provide
    generator = provide.has_sync_generator_dependency or provide.has_async_generator_dependency
    return generator, dependency.key


DEPENDENCIES = {
    "db_session": Provide(provide_db_session),
    "db_reads": Provide(provide_db_reads, sync_to_thread=False),
    "settings": Provide(provide_settings, sync_to_thread=False),
    "paging": Provide(provide_paging, sync_to_thread=False),
    "principal": Provide(provide_principal, sync_to_thread=False),
    "access": Provide(provide_access, sync_to_thread=False),
}
