"""Request and response bodies of knowledge (spec 17-20, DESIGN §3 and §5.4).

Knowledge fields are camelCase, as the spec writes them; the search request takes
``collectionIds`` too, and still ``collection_ids`` (the DESIGN's spelling, which it took
first).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

import msgspec

from shared.schemas import Input, Name255, Output, text

MimeType = Literal["text/markdown", "text/plain"]
MIME_TYPES: tuple[str, ...] = get_args(MimeType)
BookmarkMode = Literal["none", "always", "on_demand"]

# ISO 639-1 codes (and the configuration names themselves) -> PostgreSQL's built-in text
# search configurations: stemming and stop words of that language.
LANGUAGES = {
    "ar": "arabic",
    "da": "danish",
    "de": "german",
    "el": "greek",
    "en": "english",
    "es": "spanish",
    "fi": "finnish",
    "fr": "french",
    "hu": "hungarian",
    "id": "indonesian",
    "it": "italian",
    "lt": "lithuanian",
    "nb": "norwegian",
    "ne": "nepali",
    "nl": "dutch",
    "no": "norwegian",
    "pt": "portuguese",
    "ro": "romanian",
    "ru": "russian",
    "sv": "swedish",
    "ta": "tamil",
    "tr": "turkish",
}
DEFAULT_SEARCH_CONFIG = "english"  # a document whose language is not given


class ProcessingStatus(enum.StrEnum):
    """``queued`` -> ``processing`` (progress 0-100) -> ``ready`` or ``failed``."""

    QUEUED = "queued"
    PROCESSING = "processing"
    READY = "ready"
    FAILED = "failed"


class CollectionCreate(Input):
    name: Name255
    description: Annotated[str, text(0, 10_000)] | None = None


class CollectionRead(Output, rename="camel"):
    id: UUID
    organization_id: UUID
    name: str
    description: str | None
    document_count: int
    created_at: datetime
    updated_at: datetime


class CollectionList(Output):
    collections: list[CollectionRead]
    total: int


class DocumentUpload(Input, rename="camel"):
    collection_id: UUID
    filename: Annotated[str, text(1, 255)]
    # Checked further by the service: not empty, within SPAR_KNOWLEDGE_MAX_BYTES.
    content: Annotated[str, text(0)]
    mime_type: Annotated[str, text(1, 255)] = "text/markdown"
    relative_path: Annotated[str, text(1, 1024)] | None = None
    title: Annotated[str, text(1, 255)] | None = None
    language: (
        Annotated[str, text(2, 16, description="ISO 639-1 code (en, de, fr...) for stemming.")]
        | None
    ) = None


class DocumentRead(Output, rename="camel"):
    id: UUID
    collection_id: UUID
    filename: str
    mime_type: MimeType
    bytes_ingested: int
    processing_status: ProcessingStatus
    processing_progress: int
    created_at: datetime
    relative_path: str | None
    organization_id: UUID | None
    title: str | None
    processing_error: str | None
    language: str | None
    bookmark_mode: BookmarkMode = "none"


class DocumentList(Output):
    documents: list[DocumentRead]
    total: int


class DocumentStatus(Output, rename="camel"):
    document_id: str
    status: ProcessingStatus
    progress: int
    error: str | None
    metadata: dict[str, Any]


class BookmarkPut(Input, rename="camel"):
    bookmark_mode: BookmarkMode
    usage_description: Annotated[str, text(0, 10_000)] | None = None
    agent_ids: Annotated[list[UUID], msgspec.Meta(max_length=100)] = []

    def changes(self) -> dict[str, Any]:
        """What the PUT sets on the document: ``agent_ids`` are rows of their own."""
        sent = super().changes()
        del sent["agent_ids"]
        return sent


class BookmarkRead(Output, rename="camel"):
    bookmark_mode: BookmarkMode
    usage_description: str | None
    agent_ids: list[UUID]


CollectionIds = Annotated[
    list[UUID],
    msgspec.Meta(max_length=100, description="Only chunks of documents in these collections."),
]


class SearchBody(Input, rename="camel"):
    query: Annotated[str, text(1, 1000)]
    collection_ids: CollectionIds | None = None
    # The spelling the search took first, kept working: the same as collectionIds.
    collection_ids_as_before: (
        Annotated[
            list[UUID],
            msgspec.Meta(
                max_length=100, description="The same as `collectionIds` (an older spelling)."
            ),
        ]
        | None
    ) = msgspec.field(default=None, name="collection_ids")
    limit: Annotated[int, msgspec.Meta(ge=1, le=50)] = 10


class SearchHit(Output, rename="camel"):
    document_id: UUID
    chunk_id: UUID
    title: str
    heading_path: list[str]
    content: str
    score: float


class SearchResults(Output):
    results: list[SearchHit]


class GivenKnowledge(msgspec.Struct, frozen=True, rename="camel"):
    """What an llm agent was given in a turn: a whole ``always`` document (``chunk_id``
    none), or one chunk retrieved ``on_demand`` for the turn's message (with its score)."""

    document_id: UUID
    title: str
    mode: Literal["always", "on_demand"]
    chunk_id: UUID | None = None
    heading_path: list[str] = []
    score: float | None = None
