"""The run engine's short path to PostgreSQL: statements written with SQLAlchemy Core,
compiled once, executed straight on psycopg from a small pool of autocommit connections.

SQLAlchemy's asyncio layer costs about half a millisecond of CPU and several event-loop
hand-offs per statement (greenlet switches, pool check-out, reset and check-in).  A
worker holding a hundred conversations executes thousands of statements a minute, and
there those hand-offs, queued behind everything else on its loop, became most of a run's
overhead.  The statements stay SQLAlchemy's — one source of truth, built from the models'
tables — only their execution skips the layer.  Used where every statement is a complete
state change on its own (:mod:`shared.scenarios.store`), so autocommit is what is wanted.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, TypeVar

import msgspec
from psycopg import AsyncConnection, AsyncRawCursor
from psycopg.rows import dict_row, kwargs_row, namedtuple_row
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import JSON, BindParameter, Table
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Compiled
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import visitors
from sqlalchemy.sql.expression import Executable

# Numbered placeholders ($1, $2: PostgreSQL's own), executed on psycopg's raw cursors: the
# text goes to the server as it is.  With psycopg's %(name)s placeholders every execution
# parsed the text for them again, and psycopg caches that parse only for statements of up
# to 4 KB: a run's last statement is 6.5 KB, and its execution cost the worker 477-516 µs
# of CPU, 301-309 µs on a raw cursor (measured on this 2-core VM, 2026-11-28).
_DIALECT = PGDialect_psycopg(paramstyle="numeric_dollar")
S = TypeVar("S", bound=msgspec.Struct)

# Session settings of every PostgreSQL connection Spar makes (these and the engine's).  No
# JIT: Spar's statements are short, and on a large fan-out (a batch's runs inserted with
# their snapshots) the planner's estimates had PostgreSQL spend a third of a second
# compiling a query that then ran in less.  Time zone UTC: what SQLAlchemy's columns hand
# back (``UTCDateTime``), psycopg hands back too on this path, without a conversion per value.
POSTGRES_OPTIONS = "-c jit=off -c TimeZone=UTC"
# The run engine's own writes commit asynchronously: a commit returns (and releases its row
# locks) before its WAL reaches the disk.  Every batch run's end writes its batch's row, and
# with synchronous commits a batch's ends queue behind one another's disk flushes; a
# window of runs ending together then waits tens of milliseconds for that row.  What
# asynchronous commit can lose is the last fraction of a second of commits if PostgreSQL
# itself crashes (never a worker crash; never consistency): run progress that at-least-once
# delivery replays anyway — a lost turn is played again, a lost end is redone once, and the
# sweeper re-sends the runs it concerned.  Everything else (the API's writes) stays
# synchronous, but for the bookkeeping of its guard, which reads on this pool (a platform
# token's ``last_used_at``, once a minute: losing one costs a minute of that timestamp).
RUN_ENGINE_OPTIONS = "-c synchronous_commit=off"


def json_text(value: object) -> str:
    """``value`` as JSON text, by msgspec (UUIDs and datetimes included)."""
    return msgspec.json.encode(value).decode()


class StatementRefused(ValueError):
    """A statement :class:`Statement` will not compile: it would not do what it says."""


# Rows as objects with an attribute per column (:meth:`Statement.objects`).
_OBJECTS = kwargs_row(SimpleNamespace)


class Statement:
    """A Core statement compiled once for psycopg.  Its constants travel with it; the named
    parameters it leaves open must all be given at each execution.

    Refused when built (:class:`StatementRefused`), so at import for a module's statements:

    * a parameter named after a column of a table it reads or writes: SQLAlchemy names
      the automatic binds of ``.values(col=…)`` after their columns, and one given by that
      name would be added to an UPDATE's SET clause (the convention: ``p_`` names);
    * a ``None`` constant (``.values(col=None)``, ``literal(None)``): compiled as a
      parameter whose value is ``None``, it could not be told from an open one that must be
      given, and is not sent at all (``null()`` says NULL);
    * a column left to a Python-side default (``updated_at``'s ``onupdate``): SQLAlchemy
      computes it as it executes, and this execution skips SQLAlchemy;
    * an expanding ``IN`` (``col.in_([...])``): SQLAlchemy renders its list as it executes.
    """

    def __init__(self, statement: Executable) -> None:
        compiled = statement.compile(dialect=_DIALECT)
        _refuse(statement, compiled)
        self.sql = str(compiled)
        self._order: Sequence[str] = compiled.positiontup or ()  # the name of each $n
        self._constants = {k: v for k, v in compiled.params.items() if v is not None}
        self._required = {k for k, v in compiled.params.items() if v is None}
        self._json = {
            name
            for name, bind in compiled.binds.items()
            if isinstance(bind.type.dialect_impl(_DIALECT), JSON)
        }

    def arguments(self, given: Mapping[str, Any]) -> list[Any]:
        """The values of :attr:`sql`'s ``$1``, ``$2``, ...: ``given`` and the statement's
        constants, in order (for a raw cursor: ``AsyncRawCursor``)."""
        missing = self._required - given.keys()
        if missing:
            raise TypeError(f"missing statement parameters: {', '.join(sorted(missing))}")
        params = {**self._constants, **given}
        for name in self._json & given.keys():
            # None is SQL NULL, as for any other parameter (not the JSON value null).
            if given[name] is not None:
                params[name] = Jsonb(given[name], dumps=json_text)
        return [params[name] for name in self._order]

    async def rows(self, connection: AsyncConnection[Any], **given: Any) -> Sequence[Any]:
        async with await self._sent(connection, namedtuple_row, given) as cursor:
            return await cursor.fetchall()

    async def sent(self, connection: AsyncConnection[Any], **given: Any) -> AsyncRawCursor[Any]:
        """The statement sent on ``connection`` in pipeline mode (``connection.pipeline()``),
        not waited for: its cursor's ``fetchall`` reads its rows once the pipeline is synced."""
        return await self._sent(connection, namedtuple_row, given)

    async def _sent(
        self, connection: AsyncConnection[Any], row_factory: Any, given: dict[str, Any]
    ) -> AsyncRawCursor[Any]:
        """The one place a statement is executed: on a raw cursor making rows with
        ``row_factory``."""
        cursor = AsyncRawCursor(connection, row_factory=row_factory)
        await cursor.execute(self.sql, self.arguments(given))
        return cursor

    async def objects(self, connection: AsyncConnection[Any], **given: Any) -> list[Any]:
        """The rows as objects with an attribute per column: what
        :meth:`shared.schemas.Output.from_row` reads, as it reads an ORM object (a named
        tuple would be read as an array)."""
        async with await self._sent(connection, _OBJECTS, given) as cursor:
            return await cursor.fetchall()

    async def structs(
        self, connection: AsyncConnection[Any], shape: type[S], **given: Any
    ) -> list[S]:
        """The rows as ``shape``, each column given to the field of its name (nested JSON
        decoded into the field's type): a column is found by its name, never its place."""
        async with await self._sent(connection, dict_row, given) as cursor:
            return msgspec.convert(await cursor.fetchall(), list[shape])  # type: ignore[valid-type]


async def read_together(
    connection: AsyncConnection[Any], *reads: tuple[Statement, dict[str, Any]]
) -> list[list[Any]]:
    """Each ``(statement, its parameters)``'s rows as objects (:meth:`Statement.objects`),
    the statements sent at once in pipeline mode: one round trip for reads that do not
    wait for one another's answers.  On an autocommit connection each reads its own
    moment: a row committed between two of them can be in the second and not the first."""
    async with connection.pipeline():
        cursors = [await statement._sent(connection, _OBJECTS, given) for statement, given in reads]
    rows = []
    for cursor in cursors:
        async with cursor:
            rows.append(await cursor.fetchall())
    return rows


def _refuse(statement: Executable, compiled: Compiled) -> None:
    # A Python-side default (``onupdate=utcnow``) is computed by SQLAlchemy's execution,
    # which this one skips: the statement must set the column itself.
    prefetched = [*compiled.insert_prefetch, *compiled.update_prefetch]  # type: ignore[attr-defined]
    if prefetched:
        raise StatementRefused(
            f"{prefetched[0].name} has a Python-side default SQLAlchemy computes when it "
            "executes: set it in the statement (NOW)"
        )
    if compiled.post_compile_params:  # type: ignore[attr-defined]
        raise StatementRefused(
            "an expanding IN (a list given to in_()) is rendered as the statement executes: "
            "give its values as literal() constants, or a list to = ANY(:p_...)"
        )
    binds: Mapping[str, BindParameter[Any]] = compiled.binds  # type: ignore[attr-defined]
    columns = {
        column.name
        for element in visitors.iterate(statement)  # type: ignore[arg-type]
        if isinstance(element, Table)
        for column in element.columns
    }
    for name, bind in binds.items():
        if name.startswith("%("):  # an anonymous bind's key: the same bind is under its name too
            continue
        automatic = bind.unique or getattr(bind, "_is_crud", False)  # SQLAlchemy's own
        if not automatic and bind.key in columns:
            raise StatementRefused(f"parameter :{name} is named after a column: name it p_{name}")
        if bind.value is None and not bind.required and bind.callable is None:
            raise StatementRefused(f"a None constant (compiled as :{name}): write null() for NULL")


async def _configure(connection: AsyncConnection[Any]) -> None:
    set_json_loads(msgspec.json.decode, connection)


# One pool per engine and event loop: a pool's connections belong to the loop they were
# made in (the test suite drives one engine from two loops).
_pools: dict[tuple[AsyncEngine, asyncio.AbstractEventLoop], AsyncConnectionPool] = {}
_opened: weakref.WeakSet[AsyncConnectionPool] = weakref.WeakSet()


async def direct_pool(engine: AsyncEngine) -> AsyncConnectionPool:
    """The psycopg pool beside ``engine`` (same database, autocommit connections) for the
    running event loop, opened on first use; :func:`close_direct_pool` closes it.

    A pool that was closed (psycopg_pool's ``wait()`` closes a pool it could not fill in
    time, as when the database was slow or away while a worker booted) cannot be opened
    again: a new one takes its place, so the process recovers once the database is back."""
    key = (engine, asyncio.get_running_loop())
    pool = _pools.get(key)
    if pool is not None and pool.closed and pool in _opened:  # closed by a failed wait()
        pool = None
    if pool is None:
        size = engine.pool.size()  # type: ignore[attr-defined]  # SPAR_DB_POOL_SIZE
        pool = AsyncConnectionPool(
            engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
            # All connections made up front: work arrives in bursts (a batch's first window
            # is handed out at once), and a statement waiting for a new connection waits
            # for a whole handshake.
            min_size=size,
            max_size=size,
            kwargs={
                "autocommit": True,
                # Prepared at first use, not psycopg's fifth: a statement's executions are
                # spread over the pool's connections, so at the default most of them were
                # planned afresh (measured in bench/batch.py: a run's final statement was
                # planned 201 times in 220 executions, 3.7 ms of PostgreSQL's CPU each).
                "prepare_threshold": 0,
                "options": f"{POSTGRES_OPTIONS} {RUN_ENGINE_OPTIONS}",
            },
            configure=_configure,
            open=False,
            name="spar-direct",
        )
        _pools[key] = pool
    if pool.closed:  # new: opened here (concurrent first callers all open it: idempotent)
        await pool.open()
        _opened.add(pool)
    return pool


class Lease:
    """A connection of ``engine``'s direct pool taken at its first use and held until given
    back, for uses that are not one block of code: the API's guard looks the token up on
    it and the handler reads on it after (one check-out per request where there were
    two).  Whoever makes a lease makes sure it is given back (:meth:`give_back`, which
    does nothing when nothing is held); a connection given back in a transaction, or in
    the middle of a statement, is rolled back or replaced by its pool."""

    __slots__ = ("_connection", "_engine", "_pool")

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._pool: AsyncConnectionPool | None = None
        self._connection: AsyncConnection[Any] | None = None

    async def connection(self) -> AsyncConnection[Any]:
        """The connection held, taken from the pool if none is."""
        if self._connection is None:
            self._pool = await direct_pool(self._engine)
            self._connection = await self._pool.getconn()
        return self._connection

    async def give_back(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and self._pool is not None:
            await self._pool.putconn(connection)


async def close_direct_pool(engine: AsyncEngine) -> None:
    """Close the pool :func:`direct_pool` made for ``engine`` in the running event loop."""
    pool = _pools.pop((engine, asyncio.get_running_loop()), None)
    if pool is not None:
        await pool.close()
