"""What a worker process does once, as it boots, so that its first messages do not.

A batch's first window reaches a worker as a burst: a few dozen runs at once, each
waiting on the same cold paths at the same moment — connections not yet open, each
connection's first execution of each statement, the first configuration load (which every
run of the window waits on), the process's HTTP session not yet made.  All of it is
done here, before the worker takes any message, on ids that name no row: no tenant's data
is read, written or locked.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack, suppress
from uuid import uuid4

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import configure_mappers

from shared.batches.window import dispatch_committed
from shared.db.engine import Database
from shared.errors import NotFound
from shared.outbound import configuration as outbound
from shared.runtime import Runtime
from shared.scenarios import sandbox, store


async def warm_up(runtime: Runtime) -> None:
    # The ORM's mappers, configured on their first use otherwise: a third of a second of
    # CPU that the first window's runs would wait on.
    configure_mappers()
    await runtime.warm_up()
    await _open_engine_pool(runtime.database.engine, runtime.settings.db_pool_size)
    await _rehearse_run_engine(runtime.database, runtime.settings.db_pool_size)
    await _rehearse_sessions(runtime)
    await sandbox.warm_up()  # a renderer for message templates, started in this loop
    runtime.http  # noqa: B018 - the process's egress session, made in this loop
    runtime.limiter  # noqa: B018 - and its outbound limiter


async def _open_engine_pool(engine: AsyncEngine, size: int) -> None:
    """Fill ``engine``'s pool: a new batch's dispatch and its first runs' configuration load
    (SQLAlchemy sessions) then find connections open instead of each opening one."""
    async with AsyncExitStack() as stack:
        await asyncio.gather(*(stack.enter_async_context(engine.connect()) for _ in range(size)))


async def _rehearse_run_engine(database: Database, size: int) -> None:
    """Every run-engine statement once on each connection of the run engine's pool (its
    ``size`` connections held at once)."""
    async with AsyncExitStack() as stack:
        connections = await asyncio.gather(
            *(stack.enter_async_context(database.connection()) for _ in range(size))
        )
        await asyncio.gather(*(store.rehearse(connection) for connection in connections))


async def _rehearse_sessions(runtime: Runtime) -> None:
    """A batch's dispatch and a run's configuration load, for ids that name nothing."""
    database, settings = runtime.database, runtime.settings
    await dispatch_committed(database, uuid4())
    org = uuid4()
    with suppress(NotFound):  # the agent's read finds none: the credentials are not read
        await outbound.load_outbound(database, settings, org, uuid4(), 0)
    async with database.transaction() as session:
        await outbound.load_egress_policy(session, settings=settings, org_id=org)
        with suppress(NotFound):
            await outbound.load_provider(
                session, settings=settings, org_id=org, provider_id=uuid4()
            )
