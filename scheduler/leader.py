"""Leader election: one active scheduler, any number on standby (DESIGN §1).

The leader holds a PostgreSQL session-level advisory lock on a dedicated, long-lived
connection in autocommit; if its process dies, the connection closes and a standby takes
the lock on its next try (every ``SPAR_LEADER_RETRY_S``).  The same connection LISTENs
for trigger changes (``spar_triggers``, notified by a database trigger on ``triggers``),
so the leader hears every change and loses both together.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

LOCK_KEY = 0x5350_4152_5343_4844 & 0x7FFF_FFFF_FFFF_FFFF  # "SPARSCHD"
TRIGGER_CHANNEL = "spar_triggers"


class Leadership:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None

    @property
    def is_leader(self) -> bool:
        return self._connection is not None

    async def try_acquire(self) -> bool:
        """Whether this process leads now: still holds the lock, or just took it."""
        if self._connection is not None:
            try:  # still holding it? (the connection may have dropped)
                await self._connection.execute(text("SELECT 1"))
                return True
            except Exception:
                await self.release()
        connection = await self._engine.connect()
        try:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            got = await connection.scalar(
                text("SELECT pg_try_advisory_lock(:key)"), {"key": LOCK_KEY}
            )
            if got:
                await connection.execute(text(f"LISTEN {TRIGGER_CHANNEL}"))
                self._connection = connection
                return True
        except BaseException:
            await connection.invalidate()
            raise
        await connection.close()
        return False

    async def wait_for_change(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a trigger change; ``True`` if one came (and
        every other notification that came with it is consumed)."""
        if self._connection is None:
            return False
        raw = (await self._connection.get_raw_connection()).driver_connection
        changed = False
        async for _ in raw.notifies(timeout=seconds, stop_after=1):
            changed = True
        if changed:  # a burst of changes is one re-read
            async for _ in raw.notifies(timeout=0.05):
                pass
        return changed

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
