"""Per-process resources for code outside a request (workers, the scheduler).

Created lazily on first use, inside the process and event loop that uses them (never at
import time in a parent that forks): settings, the database (:class:`shared.db.engine.Database`),
one pooled HTTP session for egress, and the outbound limiter (:mod:`shared.outbound.limits`:
Redis when ``SPAR_REDIS_URL`` is set, else in-process).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

from shared.db.direct import direct_pool
from shared.db.engine import Database, create_engine
from shared.outbound.egress import new_http_session
from shared.outbound.limits import DestinationLimiter, limiter_for
from shared.settings import Settings, get_settings


@dataclass
class Runtime:
    settings: Settings
    database: Database
    _http: aiohttp.ClientSession | None = field(default=None, repr=False)
    _limiter: DestinationLimiter | None = field(default=None, repr=False)

    @property
    def http(self) -> aiohttp.ClientSession:
        """The process's egress session, made on first use in the running event loop."""
        if self._http is None:
            self._http = new_http_session()
        return self._http

    @property
    def limiter(self) -> DestinationLimiter:
        """The process's outbound limiter, made on first use in the running event loop."""
        if self._limiter is None:
            self._limiter = limiter_for(self.settings)
        return self._limiter

    async def warm_up(self, timeout_s: float = 30.0) -> None:
        """Open now what the first messages would otherwise wait for: the connections of the
        run engine's database pool (a batch's first window arrives all at once).  Raises
        ``PoolTimeout`` when the database does not let them open within ``timeout_s``;
        the process still recovers: the next use opens a new pool."""
        await (await direct_pool(self.database.engine)).wait(timeout=timeout_s)

    async def close_limiter(self) -> None:
        """The outbound limiter closed, if it was made: the slots queued for release given
        back first (:meth:`DestinationLimiter.close`).  Made again by its next use."""
        if self._limiter is not None:
            limiter, self._limiter = self._limiter, None
            await limiter.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._limiter is not None:
            await self._limiter.close()
        await self.database.dispose()


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        settings = get_settings()
        _runtime = Runtime(
            settings=settings, database=Database(create_engine(settings, pre_ping=False))
        )
    return _runtime
