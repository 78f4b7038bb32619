"""Per-process resources for code outside a request (workers, scheduler, CLI).

Created lazily on first use, inside the process and event loop that uses them (never at
import time in a parent that forks): settings, the database engine and session factory,
and one pooled HTTP client for egress.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from shared.db.engine import create_engine, create_session_factory, session_scope
from shared.settings import Settings, get_settings


@dataclass
class Runtime:
    settings: Settings
    engine: AsyncEngine
    session_factory: async_sessionmaker[AsyncSession]
    http: httpx.AsyncClient

    async def close(self) -> None:
        await self.http.aclose()
        await self.engine.dispose()


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        settings = get_settings()
        engine = create_engine(settings)
        _runtime = Runtime(
            settings=settings,
            engine=engine,
            session_factory=create_session_factory(engine),
            http=httpx.AsyncClient(
                trust_env=False,
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
            ),
        )
    return _runtime


@asynccontextmanager
async def provide_session() -> AsyncIterator[AsyncSession]:
    """The one way to get a database session outside a request."""
    async with session_scope(get_runtime().session_factory) as session:
        yield session
