"""Knowledge endpoints (spec 17-20, DESIGN §3): collections, documents and their
processing status, bookmarks, and search."""

from __future__ import annotations

from litestar import Controller, delete, get, post, put
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_415_UNSUPPORTED_MEDIA_TYPE

from api.deps import Access, Config, DbReads, DbSession, Page, PathId, listing, reading
from shared.identity.access import AUTHENTICATED, requires
from shared.knowledge import schemas, services

# JSON escaping can make a document's body several times its content: the content's own
# limit (SPAR_KNOWLEDGE_MAX_BYTES, 413) is checked by the service.
MAX_UPLOAD_BODY = 32 * 1024 * 1024


class CollectionController(Controller):
    path = "/orgs/{org_id:str}/knowledge/collections"
    tags = ["knowledge"]

    @post("/", operation_id="createKnowledgeCollection", access=requires("knowledge:write"))
    async def create_collection(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.CollectionCreate],
    ) -> schemas.CollectionRead:
        """A collection for documents; names are unique in the organization (409)."""
        collection = await services.create_collection(db_session, access=access, body=data)
        return schemas.CollectionRead.from_row(collection, document_count=0)

    @get("/", operation_id="listKnowledgeCollections", access=requires("knowledge:read"))
    async def list_collections(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.CollectionList:
        """The organization's collections, paged, with their document counts."""
        return listing(
            schemas.CollectionList,
            await reading(db_reads, services.list_collections, access=access, paging=paging),
        )

    @get(
        "/{collection_id:str}",
        operation_id="getKnowledgeCollection",
        access=requires("knowledge:read"),
    )
    async def get_collection(
        self, db_reads: DbReads, access: Access, org_id: PathId, collection_id: PathId
    ) -> schemas.CollectionRead:
        """One collection."""
        return schemas.CollectionRead.from_row(
            await reading(
                db_reads, services.read_collection, access=access, collection_id=collection_id
            )
        )

    @delete(
        "/{collection_id:str}",
        operation_id="deleteKnowledgeCollection",
        access=requires("knowledge:delete"),
    )
    async def delete_collection(
        self, db_session: DbSession, access: Access, org_id: PathId, collection_id: PathId
    ) -> None:
        """Delete the collection with all its documents and their chunks (spec 20)."""
        await services.delete_collection(db_session, access=access, collection_id=collection_id)

    @get(
        "/{collection_id:str}/documents",
        operation_id="listKnowledgeDocuments",
        access=requires("knowledge:read"),
    )
    async def list_documents(
        self,
        db_reads: DbReads,
        access: Access,
        org_id: PathId,
        collection_id: PathId,
        paging: Page,
    ) -> schemas.DocumentList:
        """The collection's documents, paged, oldest first."""
        return listing(
            schemas.DocumentList,
            await reading(
                db_reads,
                services.list_documents,
                access=access,
                collection_id=collection_id,
                paging=paging,
            ),
        )


class DocumentController(Controller):
    path = "/orgs/{org_id:str}/knowledge"
    tags = ["knowledge"]

    @post(
        "/documents/structured",
        operation_id="uploadKnowledgeDocument",
        access=requires("knowledge:write"),
        request_max_body_size=MAX_UPLOAD_BODY,
        responses={
            HTTP_415_UNSUPPORTED_MEDIA_TYPE: ResponseSpec(
                None, description="`mimeType` is neither text/markdown nor text/plain."
            )
        },
    )
    async def upload(
        self,
        db_session: DbSession,
        settings: Config,
        state: State,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.DocumentUpload],
    ) -> schemas.DocumentRead:
        """Upload a markdown or plain-text document (spec 17): 201, `processingStatus`
        `queued`; a worker chunks and indexes it.  415 for another `mimeType`, 413 past
        the size limit.  A `relativePath` already in the collection is replaced when the
        new version is ready."""
        document = await services.upload(
            db_session, settings=settings, access=access, body=data, broker=state.broker
        )
        return schemas.DocumentRead.from_row(document)

    @get(
        "/documents/{document_id:str}",
        operation_id="getKnowledgeDocument",
        access=requires("knowledge:read"),
    )
    async def get_document(
        self, db_reads: DbReads, access: Access, org_id: PathId, document_id: PathId
    ) -> schemas.DocumentRead:
        """One document."""
        return schemas.DocumentRead.from_row(
            await reading(db_reads, services.read_document, access=access, document_id=document_id)
        )

    @delete(
        "/documents/{document_id:str}",
        operation_id="deleteKnowledgeDocument",
        access=requires("knowledge:delete"),
    )
    async def delete_document(
        self, db_session: DbSession, access: Access, org_id: PathId, document_id: PathId
    ) -> None:
        """Delete a document and its chunks; one being processed is abandoned."""
        await services.delete_document(db_session, access=access, document_id=document_id)

    @get(
        "/documents/{document_id:str}/status",
        operation_id="getKnowledgeDocumentStatus",
        access=AUTHENTICATED,
    )
    async def status(
        self, db_reads: DbReads, access: Access, org_id: PathId, document_id: PathId
    ) -> schemas.DocumentStatus:
        """Processing status, progress, error and metadata (spec 18): any member.  Without
        `knowledge:read`, `metadata` holds only the counts, none of the document's text."""
        return await reading(
            db_reads, services.read_document_status, access=access, document_id=document_id
        )

    @get(
        "/documents/{document_id:str}/bookmark",
        operation_id="getKnowledgeDocumentBookmark",
        access=requires("knowledge:read"),
    )
    async def get_bookmark(
        self, db_reads: DbReads, access: Access, org_id: PathId, document_id: PathId
    ) -> schemas.BookmarkRead:
        """Which agents the document is given to, and how (spec 19)."""
        return schemas.BookmarkRead.from_row(
            await reading(db_reads, services.read_bookmark, access=access, document_id=document_id)
        )

    @put(
        "/documents/{document_id:str}/bookmark",
        operation_id="putKnowledgeDocumentBookmark",
        access=requires("knowledge:write"),
    )
    async def put_bookmark(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        document_id: PathId,
        data: JSONBody[schemas.BookmarkPut],
    ) -> schemas.BookmarkRead:
        """Set `bookmarkMode` (`none`, `always`, `on_demand`), `usageDescription` and the
        `agentIds` (this organization's agents) the document is given to."""
        return await services.put_bookmark(
            db_session, access=access, document_id=document_id, body=data
        )

    @post(
        "/search",
        operation_id="searchKnowledge",
        access=requires("knowledge:read"),
        status_code=HTTP_200_OK,
    )
    async def search(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.SearchBody],
    ) -> schemas.SearchResults:
        """Chunks of ready documents that match `query`, best first (full-text search)."""
        return await services.search(db_session, access=access, body=data)


CONTROLLERS = [CollectionController, DocumentController]
