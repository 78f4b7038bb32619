"""Async engines and sessions, made lazily inside the process and loop that uses them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from sqlalchemy import event
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from shared.db.direct import POSTGRES_OPTIONS, close_direct_pool, json_text
from shared.settings import Settings

# JSON columns (snapshots, cost summaries, results) are written on every turn: msgspec is
# several times faster than the standard library at both ends.
_JSON = {"json_serializer": json_text, "json_deserializer": msgspec.json.decode}


def create_engine(settings: Settings, *, pre_ping: bool = True) -> AsyncEngine:
    """The process's engine.  ``pre_ping`` checks each pooled connection before lending it
    (one more round trip per transaction): the API wants it, so that a request never meets
    a connection that died with a database restart.  Workers do without it: a delivery
    that meets one fails, invalidates the pool, and is retried and resumed."""
    if settings.is_sqlite:
        engine = create_async_engine(settings.database_url, **_JSON)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

        return engine
    return create_async_engine(
        settings.database_url,
        **_JSON,
        connect_args={"options": POSTGRES_OPTIONS},
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=pre_ping,
    )


def create_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def session_scope(factory: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """One unit of work: commit on success, roll back on any error."""
    async with factory() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise


async def dispose_engine(engine: AsyncEngine) -> None:
    """Close the engine's pool and the direct pool beside it (:mod:`shared.db.direct`)."""
    await close_direct_pool(engine)
    await engine.dispose()
