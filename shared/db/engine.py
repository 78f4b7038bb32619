"""Async engines and sessions, made lazily inside the process and loop that uses them.

A statement's parameters hold what requests sent (prompts, messages, payloads): an engine
never puts them into an error's text (``hide_parameters``; see also
:mod:`shared.db.errors`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from psycopg import AsyncConnection
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from shared.db.direct import (
    POSTGRES_OPTIONS,
    Lease,
    close_direct_pool,
    direct_pool,
    json_text,
)
from shared.queue import send_committed
from shared.settings import Settings

# JSON columns (snapshots, cost summaries, results) are written on every turn: msgspec is
# several times faster than the standard library at both ends.
_JSON = {"json_serializer": json_text, "json_deserializer": msgspec.json.decode}


def create_engine(settings: Settings, *, pre_ping: bool = True) -> AsyncEngine:
    """The process's engine.  ``pre_ping`` checks a pooled connection that has been idle
    for a while before lending it (one more round trip): the API wants it, so that a
    request never meets a connection that died with a database restart.  Workers do
    without it: a delivery that meets one fails, invalidates the pool, and is retried and
    resumed."""
    engine = create_async_engine(
        settings.require_database_url(),
        **_JSON,
        connect_args={"options": POSTGRES_OPTIONS},
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        hide_parameters=True,
    )
    if pre_ping:
        _ping_idle_connections(engine)
    return engine


# A connection back in the pool less than this long ago is lent without a ping.  Under load
# every connection comes back within milliseconds and a ping on each check-out was a round
# trip per transaction (two per request); a database restart takes longer than this, so a
# connection that outlived one has been idle for longer and is pinged.
PING_AFTER_IDLE_S = 1.0
_CHECKED_IN = "spar_checked_in"


def _ping_idle_connections(engine: AsyncEngine) -> None:
    """``pool_pre_ping`` for connections idle more than :data:`PING_AFTER_IDLE_S`: a dead
    one is replaced (the pool retries the check-out) before the caller sees it."""
    sync_engine = engine.sync_engine
    dialect = sync_engine.dialect

    @event.listens_for(sync_engine, "checkin")
    def _checked_in(_dbapi_connection, record):  # type: ignore[no-untyped-def]
        record.info[_CHECKED_IN] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _checked_out(dbapi_connection, record, _proxy):  # type: ignore[no-untyped-def]
        since = record.info.get(_CHECKED_IN)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # a new connection, or one in use a moment ago
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(str(exc)) from exc


def autocommit(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` with its connections in autocommit (same pool): for work that only reads,
    or whose statements each stand alone, without BEGIN and COMMIT round trips."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")


class Database:
    """The process's database, and the one way code opens a unit of work on it.

    * :meth:`transaction`: one session, committed when the block ends, rolled back if it
      raises; once committed, the messages it asked for are sent
      (:func:`shared.queue.send_committed`).  ``read_only``: the same session in
      autocommit, for work that only reads (inside a READ COMMITTED transaction each
      statement takes its own snapshot anyway).  The request's session (``api.deps``), the
      workers', the scheduler's and the CLI's all come from here; the services they call
      take that session and never commit.
    * :meth:`connection`: a connection of the run engine's direct pool
      (:mod:`shared.db.direct`), in autocommit: each statement is its own transaction.
      The run engine's.
    * :meth:`lease`: the same, held across blocks: the API's on every request, for the
      authorization guard's lookup and then the frequent reads (``db_reads``: listings,
      ``/auth/me``) on the same connection.
    * :attr:`autocommit`: the engine in autocommit (same pool), under the read-only
      sessions.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.autocommit = autocommit(engine)
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def transaction(self, *, read_only: bool = False) -> AsyncIterator[AsyncSession]:
        session = self._sessions(bind=self.autocommit) if read_only else self._sessions()
        async with session:
            try:
                yield session
                await session.commit()
            except BaseException:
                await session.rollback()
                raise
        await send_committed(session)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with (await direct_pool(self.engine)).connection() as connection:
            yield connection

    def lease(self) -> Lease:
        """A connection of the direct pool held across several blocks (:class:`Lease`)."""
        return Lease(self.engine)

    async def dispose(self) -> None:
        """Close the engine's pool and the direct pool beside it."""
        await close_direct_pool(self.engine)
        await self.engine.dispose()
