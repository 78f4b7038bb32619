"""Processing a document on the ``documents`` queue (DESIGN §5.4): ``queued`` ->
``processing`` (progress 0-100) -> ``ready`` or ``failed``.

At least once, safely:

* the claim (:mod:`shared.work`) takes a ``queued`` document, or a ``processing`` one
  whose heartbeat died (a redelivery after a crash starts it over: its chunks are derived,
  so they are deleted and made again) and counts the delivery; a ``ready`` or ``failed``
  one, or one a live worker is processing, is left alone;
* chunks are written in batches, each batch and the progress after it in one commit; the
  end moves the document to ``ready`` only if it is still ``processing``;
* a document deleted meanwhile (or its collection) takes its chunks with it (the foreign
  keys cascade), and the actor stops at its next write, leaving nothing behind;
* a re-upload of the same ``relativePath`` in a collection replaces the older version in
  the commit that makes the new one ready: search sees one version at every moment, the
  old until the new is ready, then the new; an older upload that finishes after a newer
  one is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import delete, exists, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from shared import work
from shared.db.engine import Database
from shared.db.models import KnowledgeChunk, KnowledgeDocument
from shared.knowledge.chunking import MAX_LISTED_HEADINGS, Parsed, TooManyChunks, parse
from shared.knowledge.schemas import ProcessingStatus
from shared.knowledge.services import search_config
from shared.metrics import DOCUMENTS_PROCESSED
from shared.settings import Settings
from shared.work import DOCUMENTS

log = logging.getLogger("spar.knowledge")
BATCH = 500
PARSED_AT = 10  # progress once the document is parsed; chunks take it to 99

_docs = KnowledgeDocument


@dataclass(frozen=True, slots=True)
class _Claimed:
    id: UUID
    organization_id: UUID
    collection_id: UUID
    content: str
    mime_type: str
    filename: str
    title: str | None
    language: str | None
    relative_path: str | None
    created_at: Any
    attempts: int


class _Abandoned(Exception):
    """The document was deleted (or finished by another delivery) meanwhile."""


_CLAIM = DOCUMENTS.claim(processing_progress=0, processing_error=None).returning(
    _docs.id,
    _docs.organization_id,
    _docs.collection_id,
    _docs.content,
    _docs.mime_type,
    _docs.filename,
    _docs.title,
    _docs.language,
    _docs.relative_path,
    _docs.created_at,
    _docs.processing_attempts,
)


async def _claim(database: Database, settings: Settings, document_id: UUID) -> _Claimed | None:
    async with database.transaction() as session:
        claimed = await work.execute_claim(session, _CLAIM, settings=settings, unit_id=document_id)
        row = claimed.one_or_none()
        if row is None:
            return None
        # Starting over: whatever an earlier delivery wrote is made again.
        await session.execute(delete(KnowledgeChunk).where(KnowledgeChunk.document_id == row.id))
    return _Claimed(*row)


async def process_document(database: Database, settings: Settings, document_id: UUID) -> None:
    """Process the document ``document_id`` (the ``documents`` actor's body), claimed, kept
    alive and given up on as every unit of work is (:mod:`shared.work`)."""
    claimed = await _claim(database, settings, document_id)
    if claimed is None:
        return

    async def give_up(reason: str) -> None:
        await _fail(database, claimed.id, reason)

    await work.perform(
        DOCUMENTS,
        database,
        settings,
        claimed.id,
        claimed.attempts,
        play=lambda: _process(database, claimed),
        give_up=give_up,
    )


async def _process(database: Database, claimed: _Claimed) -> None:
    try:
        # CPU-bound for a large document (a fraction of a second for 5 MiB): off the loop.
        parsed = await asyncio.to_thread(parse, claimed.content, claimed.mime_type)
    except TooManyChunks as exc:
        await _fail(database, claimed.id, str(exc))
        return
    if not parsed.chunks:
        await _fail(database, claimed.id, "the document has no text to index")
        return
    try:
        await _progress(database, claimed.id, PARSED_AT)
        await _write_chunks(database, claimed, parsed)
        await _make_ready(database, claimed, parsed)
    except _Abandoned:
        log.info("document %s was deleted while processing: abandoned", claimed.id)
        DOCUMENTS_PROCESSED.labels("abandoned").inc()
        return
    DOCUMENTS_PROCESSED.labels("ready").inc()


async def _progress(database: Database, document_id: UUID, value: int) -> None:
    async with database.transaction() as session:
        await _set_progress(session, document_id, value)


async def _set_progress(session: AsyncSession, document_id: UUID, value: int) -> None:
    moved = await session.scalar(
        update(_docs)
        .where(_docs.id == document_id, _docs.processing_status == ProcessingStatus.PROCESSING)
        .values(processing_progress=value)
        .returning(_docs.id)
    )
    if moved is None:
        raise _Abandoned


async def _write_chunks(database: Database, claimed: _Claimed, parsed: Parsed) -> None:
    config = search_config(claimed.language)
    title = claimed.title or parsed.first_heading or claimed.filename
    total = len(parsed.chunks)
    for start in range(0, total, BATCH):
        rows = [
            {
                "document_id": claimed.id,
                "organization_id": claimed.organization_id,
                "position": chunk.position,
                "heading_path": list(chunk.heading_path),
                "heading_text": " > ".join([title, *chunk.heading_path]),
                "content": chunk.content,
                "search_config": config,
            }
            for chunk in parsed.chunks[start : start + BATCH]
        ]
        try:
            async with database.transaction() as session:
                await session.execute(insert(KnowledgeChunk), rows)
                done = min(start + BATCH, total)
                await _set_progress(
                    session, claimed.id, PARSED_AT + (99 - PARSED_AT) * done // total
                )
        except IntegrityError:  # the document is gone: its foreign key refuses the chunks
            raise _Abandoned from None


def _metadata(claimed: _Claimed, parsed: Parsed) -> dict[str, Any]:
    return {
        "chunkCount": len(parsed.chunks),
        "characterCount": len(claimed.content),
        "headingCount": len(parsed.headings),
        "headings": [
            {"level": level, "text": text} for level, text in parsed.headings[:MAX_LISTED_HEADINGS]
        ],
    }


async def _make_ready(database: Database, claimed: _Claimed, parsed: Parsed) -> None:
    """``ready``, and the older versions of its path gone, in one commit."""
    async with database.transaction() as session:
        if claimed.relative_path is not None:
            same_path = (
                _docs.collection_id == claimed.collection_id,
                _docs.relative_path == claimed.relative_path,
                _docs.id != claimed.id,
            )
            newer_ready = await session.scalar(
                select(
                    exists().where(
                        *same_path,
                        _docs.created_at > claimed.created_at,
                        _docs.processing_status == ProcessingStatus.READY,
                    )
                )
            )
            if newer_ready:  # a later upload of this path won: this version is dropped
                await session.execute(delete(_docs).where(_docs.id == claimed.id))
                return
            await session.execute(
                delete(_docs).where(*same_path, _docs.created_at <= claimed.created_at)
            )
        ready = await session.scalar(
            update(_docs)
            .where(_docs.id == claimed.id, _docs.processing_status == ProcessingStatus.PROCESSING)
            .values(
                processing_status=ProcessingStatus.READY,
                processing_progress=100,
                title=claimed.title or parsed.first_heading or claimed.filename,
                doc_metadata=_metadata(claimed, parsed),
            )
            .returning(_docs.id)
        )
        if ready is None:
            raise _Abandoned


async def _fail(database: Database, document_id: UUID, reason: str) -> None:
    failed = await work.finish(
        DOCUMENTS, database, document_id, ProcessingStatus.FAILED, processing_error=reason
    )
    if failed:
        DOCUMENTS_PROCESSED.labels("failed").inc()
