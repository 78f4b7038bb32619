"""Per-process resources for code outside a request (workers, scheduler, CLI).

Created lazily on first use, inside the process and event loop that uses them (never at
import time in a parent that forks): settings, the database engine and session factory,
and one pooled HTTP session for egress.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from shared.db.direct import direct_pool
from shared.db.engine import create_engine, create_session_factory, dispose_engine, session_scope
from shared.outbound.egress import new_http_session
from shared.settings import Settings, get_settings


@dataclass
class Runtime:
    settings: Settings
    engine: AsyncEngine
    session_factory: async_sessionmaker[AsyncSession]
    _http: aiohttp.ClientSession | None = field(default=None, repr=False)

    @property
    def http(self) -> aiohttp.ClientSession:
        """The process's egress session, made on first use in the running event loop."""
        if self._http is None:
            self._http = new_http_session()
        return self._http

    async def warm_up(self, timeout_s: float = 30.0) -> None:
        """Open now what the first messages would otherwise wait for: the connections of the
        run engine's database pool (a batch's first window arrives all at once).  Raises
        ``PoolTimeout`` when the database does not let them open within ``timeout_s``;
        the process still recovers: the next use opens a new pool."""
        await (await direct_pool(self.engine)).wait(timeout=timeout_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        await dispose_engine(self.engine)


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        settings = get_settings()
        engine = create_engine(settings, pre_ping=False)
        _runtime = Runtime(
            settings=settings, engine=engine, session_factory=create_session_factory(engine)
        )
    return _runtime


@asynccontextmanager
async def provide_session(
    factory: async_sessionmaker[AsyncSession] | None = None,
) -> AsyncIterator[AsyncSession]:
    """The one way to get a database session outside a request (actors, the scheduler, the
    CLI): one transaction, committed when the block ends, rolled back if it raises.  The
    block owns the transaction; the services it calls never commit.  ``factory`` defaults
    to the process's; code handed one (the run engine, tests) passes it."""
    async with session_scope(factory or get_runtime().session_factory) as session:
        yield session
