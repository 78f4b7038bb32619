"""A batch's detail as the API and the UI read it: straight on psycopg
(:func:`shared.batches.services.read_detail`); the first read of a batch that is over also
asks for its judge trust and stores its comparison when due
(:func:`shared.batches.services.settle`), in a transaction of its own."""

from __future__ import annotations

from uuid import UUID

import dramatiq

from shared.batches import schemas, services
from shared.db.direct import Lease
from shared.db.engine import Database
from shared.identity.access import OrgAccess
from shared.outbound.limits import DestinationLimiter


async def batch_detail(
    reads: Lease,
    database: Database,
    *,
    access: OrgAccess,
    batch_id: UUID,
    broker: dramatiq.Broker,
    limiter: DestinationLimiter,
) -> schemas.BatchRunRead:
    """The batch's detail, read on the connection of ``reads`` (given back once read).  A
    read that finds a write due gives the connection back before it opens the write's
    transaction (a request never waits for one pool while it holds the other), and reads
    again once it has committed."""
    settled = False
    while True:
        try:
            detail = await services.read_detail(
                await reads.connection(),
                access=access,
                batch_id=batch_id,
                limiter=limiter,
                settled=settled,
            )
        finally:
            await reads.give_back()
        if detail is not None:
            return detail
        async with database.transaction() as session:
            await services.settle(session, access=access, batch_id=batch_id, broker=broker)
        settled = True
