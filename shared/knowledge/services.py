"""Knowledge rules (DESIGN §5.4): collections, document uploads, bookmarks and search.

Uploading stores the document ``queued`` and sends it, once the caller commits, to the
``documents`` actor (:mod:`shared.knowledge.processing`), which makes its chunks.  Search
reads only chunks of ``ready`` documents of the caller's organization, ranked by
PostgreSQL full-text search.  Every function runs in its caller's transaction; the API's
reads (``read_*``, ``list_*``) run straight on psycopg, on the request's ``db_reads``
connection, each in one statement compiled once.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import dramatiq
from psycopg import AsyncConnection
from sqlalchemy import (
    Float,
    Select,
    Text,
    bindparam,
    cast,
    delete,
    func,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import TSQUERY
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db import shapes
from shared.db.models import (
    Agent,
    KnowledgeBookmarkAgent,
    KnowledgeChunk,
    KnowledgeCollection,
    KnowledgeDocument,
)
from shared.db.queries import InOrg, Parent, all_in_org, flush_unique, one_in_org
from shared.errors import InvalidInput, TooLarge, UnsupportedMediaType
from shared.identity.access import OrgAccess
from shared.knowledge import schemas
from shared.knowledge.schemas import DEFAULT_SEARCH_CONFIG, LANGUAGES, ProcessingStatus
from shared.paging import Paging
from shared.queue import PROCESS_DOCUMENT, send_after_commit
from shared.settings import Settings


def search_config(language: str | None) -> str:
    """The text search configuration of a document's language."""
    return LANGUAGES.get((language or "").lower(), DEFAULT_SEARCH_CONFIG)


# --- collections ----------------------------------------------------------------------------------


_COLLECTIONS = KnowledgeCollection.__table__
_DOCUMENTS = KnowledgeDocument.__table__

# A collection as its body shows it, its documents counted in the same statement.
_COLLECTION_READS = InOrg(
    _COLLECTIONS,
    shapes.labeled(
        schemas.CollectionRead,
        _COLLECTIONS,
        document_count=select(func.count(_DOCUMENTS.c.id))
        .where(_DOCUMENTS.c.collection_id == _COLLECTIONS.c.id)
        .scalar_subquery(),
    ),
)


async def create_collection(
    session: AsyncSession, *, access: OrgAccess, body: schemas.CollectionCreate
) -> KnowledgeCollection:
    collection = KnowledgeCollection(
        organization_id=access.organization_id,
        name=body.name,
        description=body.description,
        created_by_user_id=access.principal.user_id,
    )
    session.add(collection)
    await flush_unique(session, "a collection with this name exists")
    return collection


async def read_collection(
    connection: AsyncConnection[Any], *, access: OrgAccess, collection_id: UUID
) -> Any:
    """The collection with its ``document_count``; 404 for another organization's."""
    return await _COLLECTION_READS.one(
        connection, access.organization_id, collection_id, "collection"
    )


async def list_collections(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[list[Any], int]:
    """A page of the organization's collections, each with its ``document_count``."""
    return await _COLLECTION_READS.read(connection, paging, access.organization_id)


async def delete_collection(
    session: AsyncSession, *, access: OrgAccess, collection_id: UUID
) -> None:
    """The collection, its documents and their chunks (cascades), in one statement; a
    document being processed meanwhile is abandoned by its actor."""
    collection = await one_in_org(
        session, KnowledgeCollection, access.organization_id, collection_id, "collection"
    )
    await session.execute(
        delete(KnowledgeCollection).where(KnowledgeCollection.id == collection.id)
    )


# --- documents ------------------------------------------------------------------------------------


async def upload(
    session: AsyncSession,
    *,
    settings: Settings,
    access: OrgAccess,
    body: schemas.DocumentUpload,
    broker: dramatiq.Broker,
) -> KnowledgeDocument:
    """Store the document ``queued`` (spec 17), sent to the ``documents`` actor once the
    caller commits.  415 for a type other than markdown or plain text, 413 past
    ``SPAR_KNOWLEDGE_MAX_BYTES``, 422 for empty content or an unknown language."""
    await one_in_org(
        session, KnowledgeCollection, access.organization_id, body.collection_id, "collection"
    )
    mime_type = body.mime_type.split(";")[0].strip().lower()
    if mime_type not in schemas.MIME_TYPES:
        raise UnsupportedMediaType(
            f"mimeType {body.mime_type!r} is not supported: use text/markdown or text/plain"
        )
    size = len(body.content.encode())
    if size > settings.knowledge_max_bytes:
        raise TooLarge(
            f"content is {size} bytes; the limit is {settings.knowledge_max_bytes} bytes"
        )
    if not body.content.strip():
        raise InvalidInput(("body", "content"), "content is empty", type="string_too_short")
    if body.language is not None and body.language.lower() not in LANGUAGES:
        raise InvalidInput(
            ("body", "language"),
            f"unsupported language; use one of {', '.join(sorted(LANGUAGES))}",
            input=body.language,
        )
    document = KnowledgeDocument(
        id=uuid.uuid4(),
        organization_id=access.organization_id,
        collection_id=body.collection_id,
        filename=body.filename,
        mime_type=mime_type,
        relative_path=body.relative_path,
        title=body.title,
        language=body.language.lower() if body.language else None,
        content=body.content,
        bytes_ingested=size,
        processing_status=ProcessingStatus.QUEUED,
        processing_progress=0,
        processing_attempts=0,
        doc_metadata={},
        bookmark_mode="none",
        created_by_user_id=access.principal.user_id,
    )
    session.add(document)
    await session.flush()
    send_after_commit(session, broker, PROCESS_DOCUMENT, str(document.id))
    return document


async def get_document(
    session: AsyncSession, *, access: OrgAccess, document_id: UUID
) -> KnowledgeDocument:
    return await one_in_org(
        session, KnowledgeDocument, access.organization_id, document_id, "document"
    )


# What a document's body shows: never its content, which can be megabytes.
_DOCUMENT_COLUMNS = shapes.columns_read(schemas.DocumentRead, _DOCUMENTS)
_DOCUMENT_READS = InOrg(_DOCUMENTS, _DOCUMENT_COLUMNS)


async def read_document(
    connection: AsyncConnection[Any], *, access: OrgAccess, document_id: UUID
) -> Any:
    return await _DOCUMENT_READS.one(connection, access.organization_id, document_id, "document")


# A collection's documents, oldest first, and the 404 when the collection is not the
# organization's, in one statement.
_COLLECTION_DOCUMENTS = InOrg(
    _DOCUMENTS,
    _DOCUMENT_COLUMNS,
    parent=Parent(_COLLECTIONS, _DOCUMENTS.c.collection_id, "collection"),
)


async def list_documents(
    connection: AsyncConnection[Any], *, access: OrgAccess, collection_id: UUID, paging: Paging
) -> tuple[list[Any], int]:
    """A page of the collection's documents and their total; 404 for another
    organization's collection (or a missing one)."""
    return await _COLLECTION_DOCUMENTS.read(
        connection, paging, access.organization_id, parent_id=collection_id
    )


async def delete_document(session: AsyncSession, *, access: OrgAccess, document_id: UUID) -> None:
    document = await get_document(session, access=access, document_id=document_id)
    await session.execute(delete(KnowledgeDocument).where(KnowledgeDocument.id == document.id))


# What the status metadata shows a caller without knowledge:read: counts, never text out
# of the document (its headings).  Named, not filtered by type: a new key stays hidden
# until someone decides it is not content.
COUNTS_ONLY = ("chunkCount", "characterCount", "headingCount")


# A document's status as its body shows it (the metadata filtered by the caller's permissions).
_STATUS_READS = InOrg(
    _DOCUMENTS,
    shapes.labeled(
        schemas.DocumentStatus,
        _DOCUMENTS,
        document_id=cast(_DOCUMENTS.c.id, Text),
        status=_DOCUMENTS.c.processing_status,
        progress=_DOCUMENTS.c.processing_progress,
        error=_DOCUMENTS.c.processing_error,
    ),
)


async def read_document_status(
    connection: AsyncConnection[Any], *, access: OrgAccess, document_id: UUID
) -> schemas.DocumentStatus:
    """Status, progress and error for any member; the metadata's counts only for a caller
    who may not read knowledge.  The error is Spar's own reason, not the document's text."""
    row = await _STATUS_READS.one(connection, access.organization_id, document_id, "document")
    metadata = row.metadata or {}
    if not access.holds("knowledge:read"):
        metadata = {key: metadata[key] for key in COUNTS_ONLY if key in metadata}
    return schemas.DocumentStatus.from_row(row, metadata=metadata)


# --- bookmarks ------------------------------------------------------------------------------------


def _bookmarked_agents(document_id: Any) -> Select[Any]:
    return (
        select(KnowledgeBookmarkAgent.agent_id)
        .where(KnowledgeBookmarkAgent.document_id == document_id)
        .order_by(KnowledgeBookmarkAgent.agent_id)
    )


async def get_bookmark(
    session: AsyncSession, *, access: OrgAccess, document_id: UUID
) -> schemas.BookmarkRead:
    document = await get_document(session, access=access, document_id=document_id)
    agents = await session.scalars(_bookmarked_agents(document.id))
    return schemas.BookmarkRead.from_row(document, agent_ids=list(agents))


# A document's bookmark with its agents, in one statement.
_BOOKMARK_READS = InOrg(
    _DOCUMENTS,
    shapes.labeled(
        schemas.BookmarkRead,
        _DOCUMENTS,
        agent_ids=func.array(_bookmarked_agents(_DOCUMENTS.c.id).scalar_subquery()),
    ),
)


async def read_bookmark(
    connection: AsyncConnection[Any], *, access: OrgAccess, document_id: UUID
) -> Any:
    """The document's bookmark: its mode, usage description and agents (``agent_ids``)."""
    return await _BOOKMARK_READS.one(connection, access.organization_id, document_id, "document")


async def put_bookmark(
    session: AsyncSession, *, access: OrgAccess, document_id: UUID, body: schemas.BookmarkPut
) -> schemas.BookmarkRead:
    """Replace the document's bookmark: its mode, usage description and agents (all of
    this organization: another's answers 404)."""
    document = await get_document(session, access=access, document_id=document_id)
    wanted = list(dict.fromkeys(body.agent_ids))
    await all_in_org(session, Agent, access.organization_id, wanted, "agent")
    body.apply_to(document)
    await session.execute(
        delete(KnowledgeBookmarkAgent).where(KnowledgeBookmarkAgent.document_id == document.id)
    )
    session.add_all(KnowledgeBookmarkAgent(document_id=document.id, agent_id=a) for a in wanted)
    await session.flush()
    return await get_bookmark(session, access=access, document_id=document.id)


# --- search ---------------------------------------------------------------------------------------


def ranked_chunks(
    org_id: UUID,
    query_text: str,
    configs: Sequence[str],
    *,
    limit: int,
    document_ids: Sequence[UUID] | None = None,
    collection_ids: Sequence[UUID] | None = None,
) -> Select[Any]:
    """Chunks of ready documents of ``org_id`` matching ``query_text``, best first: each
    chunk is ranked by ``ts_rank_cd`` (terms near each other count more; headings and the
    title weigh above the body)."""
    text_param = bindparam("query_text", query_text)
    queries = [_or_query(config, text_param) for config in dict.fromkeys(configs)]
    combined = queries[0]
    for other in queries[1:]:
        combined = combined.op("||")(other)
    # Built once per statement (an InitPlan), not once per row: the GIN index then takes it.
    query = select(combined).scalar_subquery()
    # The matching chunks first, through the GIN index, whatever the planner believes of
    # the documents: right after a burst of uploads their statistics are stale, and a plan
    # probing the index once per document took 0.7 s at 10,000 chunks instead of 8 ms.
    matching = [
        KnowledgeChunk.organization_id == org_id,
        KnowledgeChunk.search_vector.op("@@")(query),
    ]
    if document_ids is not None:
        matching.append(KnowledgeChunk.document_id.in_(document_ids))
    matched = select(KnowledgeChunk).where(*matching).cte("matched").prefix_with("MATERIALIZED")
    score = type_coerce(func.ts_rank_cd(matched.c.search_vector, query), Float)
    statement = (
        select(
            matched.c.id,
            matched.c.document_id,
            matched.c.heading_path,
            matched.c.content,
            func.coalesce(KnowledgeDocument.title, KnowledgeDocument.filename).label("title"),
            score.label("score"),
        )
        .join(KnowledgeDocument, KnowledgeDocument.id == matched.c.document_id)
        .where(KnowledgeDocument.processing_status == ProcessingStatus.READY)
        .order_by(score.desc(), matched.c.id)
        .limit(limit)
    )
    if collection_ids:
        statement = statement.where(KnowledgeDocument.collection_id.in_(collection_ids))
    return statement


def _or_query(config: str, text_param: Any) -> Any:
    """The text's terms in ``config`` joined by OR: ``plainto_tsquery``'s lexemes (stemmed,
    stop words dropped) with its ANDs turned to ORs, so a question in plain words finds
    the passages that share some of its terms; the ranking puts those sharing most first."""
    if config not in set(LANGUAGES.values()):  # named in SQL: only the known configurations
        raise ValueError(f"unknown text search configuration {config!r}")
    anded = func.plainto_tsquery(literal_column(f"'{config}'::regconfig"), text_param)
    return cast(func.replace(cast(anded, Text), " & ", " | "), TSQUERY)


async def search_configs(session: AsyncSession, *, org_id: UUID) -> list[str]:
    """The text search configurations of the organization's ready documents."""
    languages = await session.scalars(
        select(KnowledgeDocument.language)
        .where(
            KnowledgeDocument.organization_id == org_id,
            KnowledgeDocument.processing_status == ProcessingStatus.READY,
        )
        .distinct()
    )
    return sorted({search_config(language) for language in languages}) or [DEFAULT_SEARCH_CONFIG]


async def search(
    session: AsyncSession, *, access: OrgAccess, body: schemas.SearchBody
) -> schemas.SearchResults:
    collection_ids = body.collection_ids
    if body.collection_ids_as_before is not None:
        if collection_ids is not None:
            raise InvalidInput(
                ("body", "collection_ids"), "give collectionIds or collection_ids, not both"
            )
        collection_ids = body.collection_ids_as_before
    await all_in_org(
        session, KnowledgeCollection, access.organization_id, collection_ids or (), "collection"
    )
    configs = await search_configs(session, org_id=access.organization_id)
    rows = await session.execute(
        ranked_chunks(
            access.organization_id,
            body.query,
            configs,
            limit=body.limit,
            collection_ids=collection_ids,
        )
    )
    return schemas.SearchResults(
        results=[
            schemas.SearchHit.from_row(
                row,
                chunk_id=row.id,
                heading_path=row.heading_path or [],
                score=round(float(row.score), 6),
            )
            for row in rows
        ]
    )
