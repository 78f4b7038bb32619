"""Leader election: one active scheduler, any number on standby (DESIGN §1).

The leader holds a PostgreSQL session-level advisory lock on a dedicated, long-lived
connection; if its process dies, the connection closes and a standby takes the lock on
its next try.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

LOCK_KEY = 0x5350_4152_5343_4844 & 0x7FFF_FFFF_FFFF_FFFF  # "SPARSCHD"


class Leadership:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None

    @property
    def is_leader(self) -> bool:
        return self._connection is not None

    async def try_acquire(self) -> bool:
        if self._connection is not None:
            try:  # still holding it? (the connection may have dropped)
                await self._connection.execute(text("SELECT 1"))
                return True
            except Exception:
                await self.release()
        connection = await self._engine.connect()
        got = await connection.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": LOCK_KEY})
        await connection.commit()
        if got:
            self._connection = connection
            return True
        await connection.close()
        return False

    async def release(self) -> None:
        if self._connection is not None:
            try:
                await self._connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": LOCK_KEY}
                )
                await self._connection.close()
            except Exception:  # the lock goes with the connection anyway
                await self._connection.invalidate()
            self._connection = None
