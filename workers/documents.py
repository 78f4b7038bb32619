"""The actor that processes knowledge documents (queue ``documents``).

Thin: the rules live in :mod:`shared.knowledge.processing`.
"""

from __future__ import annotations

from uuid import UUID

from shared.knowledge.processing import process_document as process
from shared.runtime import get_runtime
from shared.work import DOCUMENTS
from workers.broker import unit_actor


@unit_actor(
    DOCUMENTS,
    min_backoff=1_000,
    max_backoff=30_000,
    time_limit=15 * 60 * 1000,
)
async def process_document(document_id: str) -> None:
    runtime = get_runtime()
    await process(runtime.database, runtime.settings, UUID(document_id))
