"""The actor that processes knowledge documents (queue ``documents``).

Thin: the rules live in :mod:`shared.knowledge.processing`.
"""

from __future__ import annotations

from uuid import UUID

import dramatiq

from shared.knowledge.processing import process_document as process
from shared.queue import PROCESS_DOCUMENT
from shared.runtime import get_runtime
from shared.work import DOCUMENTS
from workers.broker import broker  # noqa: F401 - the broker the actor is declared on


@dramatiq.actor(
    actor_name=PROCESS_DOCUMENT[1],
    queue_name=PROCESS_DOCUMENT[0],
    # Idempotent and restartable (see shared.knowledge.processing): a retry is safe.  The
    # document's own count of deliveries (shared.work) ends it before these run out.
    max_retries=DOCUMENTS.max_deliveries,
    min_backoff=1_000,
    max_backoff=30_000,
    time_limit=15 * 60 * 1000,
)
async def process_document(document_id: str) -> None:
    runtime = get_runtime()
    await process(runtime.database, runtime.settings, UUID(document_id))
