"""What an ``llm`` agent knows (DESIGN §5.4): the documents bookmarked for it.

* ``always`` documents: their text, in the agent's system context in every turn;
* ``on_demand`` documents: before each answer, the chunks of those documents that best
  match the user's message (full-text search), with each document's usage description,
  in the system context of that turn.  The search is reported as the agent's tool call
  ``search_knowledge`` (DESIGN §5.10): its arguments the query, its output what was
  retrieved (each chunk's document, title, heading path and score), so a scenario can
  check that the agent looked something up (``tool_called``).

A run never sees a document that is not ``ready``: before its first turn it waits for
the agent's bookmarked documents still ``queued`` or ``processing`` (up to
``SPAR_KNOWLEDGE_WAIT_S``), then ends in error naming those still not ready.  Failed
documents are left out.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from uuid import UUID

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.db.engine import Database
from shared.db.models import KnowledgeBookmarkAgent, KnowledgeDocument
from shared.knowledge.schemas import GivenKnowledge, ProcessingStatus
from shared.knowledge.services import ranked_chunks, search_config
from shared.outbound.schemas import ToolCall

RETRIEVED_CHUNKS = 3
MAX_ALWAYS_CHARS = 100_000  # of all always documents together, in the system context
WAIT_POLL_S = 0.5
SEARCH_TOOL = "search_knowledge"


class KnowledgeNotReady(Exception):
    """The agent's documents did not become ready in time; the message names them."""


@dataclass(frozen=True, slots=True)
class _Document:
    id: UUID
    title: str
    mode: str
    usage: str | None
    language: str | None


@dataclass(frozen=True, slots=True)
class TurnKnowledge:
    """What an llm agent is given for one turn."""

    system_context: str  # "" when nothing
    given: list[GivenKnowledge]  # for the turn's result
    tool_calls: list[ToolCall]  # its search of on_demand documents, if it has any


@dataclass(slots=True)
class AgentKnowledge:
    """The knowledge of one agent for one run, loaded once when the run starts."""

    database: Database
    organization_id: UUID
    always: list[tuple[_Document, str]] = field(default_factory=list)
    on_demand: list[_Document] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.always and not self.on_demand

    async def for_message(self, message: str) -> TurnKnowledge:
        """The system context for a turn whose user message is ``message``, what it holds,
        and the search that found its on_demand part."""
        parts: list[str] = []
        given: list[GivenKnowledge] = []
        calls: list[ToolCall] = []
        for document, text in self.always:
            parts.append(f"## {document.title}\n{_usage(document)}{text}")
            given.append(
                GivenKnowledge(document_id=document.id, title=document.title, mode="always")
            )
        if self.on_demand:
            by_id = {d.id: d for d in self.on_demand}
            async with self.database.transaction() as session:
                rows = await session.execute(
                    ranked_chunks(
                        self.organization_id,
                        message,
                        sorted({search_config(d.language) for d in self.on_demand}),
                        limit=RETRIEVED_CHUNKS,
                        document_ids=list(by_id),
                    )
                )
            for row in rows:
                document = by_id[row.document_id]
                path = list(row.heading_path or [])
                if not path or path[0] != document.title:  # the title heads the path once
                    path.insert(0, document.title)
                where = " > ".join(path)
                parts.append(f"## {where}\n{_usage(document)}{row.content}")
                given.append(
                    GivenKnowledge(
                        document_id=document.id,
                        title=document.title,
                        mode="on_demand",
                        chunk_id=row.id,
                        heading_path=list(row.heading_path or []),
                        score=round(float(row.score), 6),
                    )
                )
            found = [g for g in given if g.mode == "on_demand"]
            calls.append(
                ToolCall(
                    name=SEARCH_TOOL,
                    arguments={"query": message},
                    output=msgspec.to_builtins(found),
                )
            )
        if not parts:
            return TurnKnowledge("", given, calls)
        context = "Knowledge you may use to answer:\n\n" + "\n\n".join(parts)
        return TurnKnowledge(context, given, calls)


def _usage(document: _Document) -> str:
    return f"(Use: {document.usage})\n" if document.usage else ""


async def _bookmarked(session: AsyncSession, agent_id: UUID) -> list[KnowledgeDocument]:
    return list(
        await session.scalars(
            select(KnowledgeDocument)
            .join(
                KnowledgeBookmarkAgent, KnowledgeBookmarkAgent.document_id == KnowledgeDocument.id
            )
            .where(
                KnowledgeBookmarkAgent.agent_id == agent_id,
                KnowledgeDocument.bookmark_mode.in_(("always", "on_demand")),
            )
            .order_by(KnowledgeDocument.created_at, KnowledgeDocument.id)
        )
    )


async def load(
    database: Database,
    organization_id: UUID,
    agent_id: UUID,
    *,
    wait_s: float,
) -> AgentKnowledge:
    """The agent's ready knowledge, once none of its documents is still being processed;
    :class:`KnowledgeNotReady` after ``wait_s`` seconds otherwise."""
    deadline = time.monotonic() + wait_s
    while True:
        async with database.transaction() as session:
            documents = await _bookmarked(session, agent_id)
        pending = [
            d
            for d in documents
            if d.processing_status in (ProcessingStatus.QUEUED, ProcessingStatus.PROCESSING)
        ]
        if not pending:
            break
        if time.monotonic() >= deadline:
            names = ", ".join(f"{d.title or d.filename} ({d.id})" for d in pending)
            raise KnowledgeNotReady(f"knowledge documents not ready after {wait_s:g} s: {names}")
        await asyncio.sleep(WAIT_POLL_S)
    knowledge = AgentKnowledge(database=database, organization_id=organization_id)
    budget = MAX_ALWAYS_CHARS
    for d in documents:
        if d.processing_status != ProcessingStatus.READY:
            continue
        document = _Document(
            id=d.id,
            title=d.title or d.filename,
            mode=d.bookmark_mode,
            usage=d.usage_description,
            language=d.language,
        )
        if d.bookmark_mode == "always":
            text = d.content[: max(budget, 0)]
            budget -= len(text)
            knowledge.always.append((document, text))
        else:
            knowledge.on_demand.append(document)
    return knowledge
