"""The sweeper's job for batches with a baseline: store the comparison of every completed
batch whose comparison is due (:func:`shared.batches.services.store_comparison`), read or
not, so that a batch nobody looks at has it all the same.  Each batch in a transaction of
its own; the write is guarded there, so a reader storing it at the same moment does no
harm."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import aliased

from shared.batches import services
from shared.batches.schemas import BatchStatus
from shared.db.engine import Database
from shared.db.models import BatchRun

DUE_PER_PASS = 100


async def store_due(database: Database) -> int:
    """Store the comparison of up to :data:`DUE_PER_PASS` completed batches whose
    comparison is due: none stored yet, the baseline over (ended, every run counted: as
    :func:`shared.batches.services.is_over`); how many were stored."""
    baseline = aliased(BatchRun)
    async with database.transaction() as session:
        due = list(
            await session.scalars(
                select(BatchRun.id)
                .join(baseline, baseline.id == BatchRun.baseline_batch_id)
                .where(
                    BatchRun.comparison.is_(None),
                    BatchRun.status == BatchStatus.COMPLETED,
                    baseline.status.in_((BatchStatus.COMPLETED, BatchStatus.ERROR)),
                    baseline.completed_scenarios >= baseline.total_scenarios,
                )
                .order_by(BatchRun.id)
                .limit(DUE_PER_PASS)
            )
        )
    stored = 0
    for batch_id in due:
        async with database.transaction() as session:
            batch = await session.get(BatchRun, batch_id)
            if batch is not None and await services.store_comparison(session, batch=batch):
                stored += 1
    return stored
