"""Knowledge over REST (spec 17-20, DESIGN §3 and §5.4): collections, uploads and their
processing (run as the ``documents`` actor runs it, ``process_document``), status,
bookmarks, search and its ranking, permissions and tenant isolation."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import REGISTRY
from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from scheduler.sweeper import sweep
from shared.db.models import KnowledgeChunk, KnowledgeDocument
from shared.queue import PROCESS_DOCUMENT
from shared.settings import Settings
from tests.support.factories import (
    Tenant,
    create_token,
    single_validation_entry,
    stub_broker,
    tenant,
)
from tests.support.knowledge import collection, kb, process, upload
from tests.support.knowledge_corpus import DOCUMENTS, QUERIES
from tests.support.scenario_setup import create_http_agent

DOCUMENT_FIELDS = {
    "id",
    "collectionId",
    "filename",
    "mimeType",
    "bytesIngested",
    "processingStatus",
    "processingProgress",
    "createdAt",
    "relativePath",
    "organizationId",
    "title",
    "processingError",
    "language",
    "bookmarkMode",
}


def processed(status: str) -> float:
    """``spar_documents_processed_total{status}`` of this process (the worker's, here)."""
    return REGISTRY.get_sample_value("spar_documents_processed_total", {"status": status}) or 0.0


async def status(client: AsyncTestClient, t: Tenant, document_id: str) -> dict[str, Any]:
    response = await client.get(kb(t, "documents", document_id, "status"), headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def search(client: AsyncTestClient, t: Tenant, query: str, **fields: Any) -> list[dict]:
    response = await client.post(
        kb(t, "search"), json={"query": query, **fields}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


POLICY = """# Refund policy

Refunds reach the original payment method within 5 business days.

## Exceptions

### Gift cards

Gift cards are not refundable.
"""


# --- collections ----------------------------------------------------------------------------------


async def test_collections_are_created_listed_read_and_deleted_with_their_documents(
    client: AsyncTestClient, app: Litestar, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    dup = await client.post(
        kb(t, "collections"), json={"name": "policies"}, headers=t.owner.headers
    )
    assert dup.status_code == 409
    doc = await upload(client, t, cid, POLICY)
    await process(app, doc["id"])

    got = (await client.get(kb(t, "collections", cid), headers=t.owner.headers)).json()
    assert (got["name"], got["documentCount"], got["organizationId"]) == ("policies", 1, t.id)
    listed = (await client.get(kb(t, "collections"), headers=t.owner.headers)).json()
    assert listed["total"] == 1 and listed["collections"][0]["id"] == cid
    docs = (
        await client.get(kb(t, "collections", cid, "documents"), headers=t.owner.headers)
    ).json()
    assert [d["id"] for d in docs["documents"]] == [doc["id"]]

    deleted = await client.delete(kb(t, "collections", cid), headers=t.owner.headers)
    assert deleted.status_code == 204
    assert (
        await client.get(kb(t, "documents", doc["id"]), headers=t.owner.headers)
    ).status_code == 404
    assert await db.scalar(select(func.count()).select_from(KnowledgeChunk)) == 0
    assert await search(client, t, "refund") == []


# --- upload and processing ------------------------------------------------------------------------


async def test_upload_answers_201_queued_and_processing_makes_it_ready(
    client: AsyncTestClient, app: Litestar, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    content = POLICY.replace("5 business days.", "5 business days (in € or ¥ alike).")
    doc = await upload(client, t, cid, content, relativePath="policies/refunds.md")
    assert set(doc) == DOCUMENT_FIELDS
    assert (doc["processingStatus"], doc["processingProgress"]) == ("queued", 0)
    assert doc["bytesIngested"] == len(content.encode()) > len(content)  # UTF-8 bytes
    assert (doc["mimeType"], doc["bookmarkMode"], doc["title"]) == ("text/markdown", "none", None)

    # Every change of the row is logged by a trigger: progress must move as it goes.
    await db.execute(text("CREATE TABLE progress_log (status text, progress int)"))
    await db.execute(
        text(
            "CREATE FUNCTION log_progress() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO progress_log VALUES (NEW.processing_status, NEW.processing_progress);"
            " RETURN NULL; END $$"
        )
    )
    await db.execute(
        text(
            "CREATE TRIGGER progress AFTER UPDATE ON knowledge_documents "
            "FOR EACH ROW EXECUTE FUNCTION log_progress()"
        )
    )
    await db.commit()
    ready_before = processed("ready")
    try:
        await process(app, doc["id"])
        log = (await db.execute(text("SELECT status, progress FROM progress_log"))).all()
    finally:
        await db.execute(text("DROP TRIGGER progress ON knowledge_documents"))
        await db.execute(text("DROP FUNCTION log_progress()"))
        await db.execute(text("DROP TABLE progress_log"))
        await db.commit()
    progress = [p for _, p in log]
    assert log[0] == ("processing", 0) and log[-1] == ("ready", 100)
    assert progress == sorted(progress) and len(set(progress)) >= 3, log

    done = await status(client, t, doc["id"])
    assert (done["documentId"], done["status"], done["progress"]) == (doc["id"], "ready", 100)
    assert done["error"] is None
    assert processed("ready") - ready_before == 1
    meta = done["metadata"]
    # Two chunks: "Exceptions" has no body of its own, only its "Gift cards" subsection.
    assert (meta["chunkCount"], meta["characterCount"], meta["headingCount"]) == (
        2,
        len(content),
        3,
    )
    assert meta["headings"][1] == {"level": 2, "text": "Exceptions"}
    read = (await client.get(kb(t, "documents", doc["id"]), headers=t.owner.headers)).json()
    assert read["title"] == "Refund policy" and read["processingStatus"] == "ready"

    hits = await search(client, t, "are gift cards refundable")
    assert hits[0]["documentId"] == doc["id"]
    assert hits[0]["headingPath"] == ["Refund policy", "Exceptions", "Gift cards"]
    assert hits[0]["content"] == "Gift cards are not refundable."
    assert hits[0]["title"] == "Refund policy" and hits[0]["score"] > 0

    await process(app, doc["id"])  # a redelivery: nothing changes
    assert await db.scalar(select(func.count()).select_from(KnowledgeChunk)) == 2


async def test_plain_text_is_chunked_by_paragraph(client: AsyncTestClient, app: Litestar) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    doc = await upload(
        client,
        t,
        cid,
        "Opening hours are nine to five.\n\nParking is free behind the store.",
        mimeType="text/plain",
        filename="notes.txt",
    )
    await process(app, doc["id"])
    hits = await search(client, t, "where to park")
    assert hits[0]["headingPath"] == [] and "Parking is free" in hits[0]["content"]
    assert hits[0]["title"] == "notes.txt"


@pytest.mark.parametrize(
    ("change", "status_code", "loc"),
    [
        ({"content": ""}, 422, ["body", "content"]),
        ({"content": "  \n\n "}, 422, ["body", "content"]),
        ({"content": "bad \u0000 byte"}, 422, ["body", "content"]),
        ({"filename": ""}, 422, ["body", "filename"]),
        ({"mimeType": "application/pdf"}, 415, None),
        ({"mimeType": "text/html"}, 415, None),
        ({"language": "klingon"}, 422, ["body", "language"]),
        ({"collectionId": "not-a-uuid"}, 422, ["body", "collectionId"]),
        ({"collection_id": str(uuid4())}, 422, ["body", "collection_id"]),
    ],
)
async def test_bad_uploads_get_a_clear_answer_and_store_nothing(
    client: AsyncTestClient,
    db: AsyncSession,
    change: dict[str, Any],
    status_code: int,
    loc: list[str] | None,
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    body = {"collectionId": cid, "filename": "a.md", "content": "# A\n\ntext", **change}
    response = await client.post(
        kb(t, "documents", "structured"), json=body, headers=t.owner.headers
    )
    assert response.status_code == status_code, response.text
    if loc is not None:
        assert single_validation_entry(response)["loc"] == loc
    else:
        assert "mimeType" in response.json()["detail"]
    assert await db.scalar(select(func.count()).select_from(KnowledgeDocument)) == 0


async def test_invalid_utf8_and_oversized_content_are_refused(
    client: AsyncTestClient, settings, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    raw = b'{"collectionId": "' + cid.encode() + b'", "filename": "a.md", "content": "\xff\xfe"}'
    response = await client.post(
        kb(t, "documents", "structured"),
        content=raw,
        headers={**t.owner.headers, "content-type": "application/json"},
    )
    assert single_validation_entry(response)["type"] == "json_invalid"
    limit = settings.knowledge_max_bytes
    body = {"collectionId": cid, "filename": "big.md", "content": "é" * (limit // 2 + 1)}
    response = await client.post(
        kb(t, "documents", "structured"), json=body, headers=t.owner.headers
    )
    assert response.status_code == 413
    assert str(limit) in response.json()["detail"]
    assert await db.scalar(select(func.count()).select_from(KnowledgeDocument)) == 0


async def test_a_5_mib_single_line_and_a_10000_heading_document_process_cleanly(
    client: AsyncTestClient, app: Litestar, settings, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    line = ("lorem" * (settings.knowledge_max_bytes // 5))[: settings.knowledge_max_bytes]
    long_line = await upload(client, t, cid, line, filename="line.md")
    headings = "".join(f"# Heading {i}\n\nbody of section {i}\n\n" for i in range(10_000))
    many = await upload(client, t, cid, headings, filename="headings.md")
    await process(app, long_line["id"])
    await process(app, many["id"])
    first, second = await status(client, t, long_line["id"]), await status(client, t, many["id"])
    assert first["status"] == "ready", first
    assert first["metadata"]["chunkCount"] == -(-len(line) // 2000)
    assert second["status"] == "ready", second
    assert second["metadata"]["chunkCount"] == 10_000
    assert second["metadata"]["headingCount"] == 10_000
    assert len(second["metadata"]["headings"]) == 200  # listed up to 200
    hits = await search(client, t, "section 7777")
    assert hits and hits[0]["headingPath"] == ["Heading 7777"]


async def test_too_many_sections_fail_with_a_reason_not_a_stuck_processing(
    client: AsyncTestClient, app: Litestar
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    doc = await upload(client, t, cid, "".join(f"# h{i}\nx\n" for i in range(20_001)))
    failed_before = processed("failed")
    await process(app, doc["id"])
    done = await status(client, t, doc["id"])
    assert done["status"] == "failed" and "20000 chunks" in done["error"], done
    assert processed("failed") - failed_before == 1
    await process(app, doc["id"])  # a redelivery: ended already, counted once
    assert processed("failed") - failed_before == 1


async def test_a_document_deleted_mid_processing_leaves_no_chunk(
    client: AsyncTestClient, app: Litestar, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    big = "".join(f"## Part {i}\n\n{'words ' * 150}\n\n" for i in range(2500))
    doc = await upload(client, t, cid, big)
    task = asyncio.create_task(process(app, doc["id"]))
    for _ in range(3000):  # until chunks are being written
        if (await status(client, t, doc["id"]))["progress"] > 10:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("processing never got to writing chunks")
    # Deleted in this loop, beside the actor (the test client would block the loop while
    # its request waits for the chunks' transaction): the statement the API runs.
    await db.execute(delete(KnowledgeDocument).where(KnowledgeDocument.id == UUID(doc["id"])))
    await db.commit()
    await task  # abandons cleanly: no exception
    assert await db.scalar(select(func.count()).select_from(KnowledgeChunk)) == 0
    assert await db.scalar(select(func.count()).select_from(KnowledgeDocument)) == 0


async def test_a_reupload_of_a_path_replaces_the_old_version_atomically(
    client: AsyncTestClient, app: Litestar, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    path = {"relativePath": "policies/shipping.md"}
    old = await upload(client, t, cid, "# Shipping\n\nDelivery takes 5 days by truck.", **path)
    await process(app, old["id"])
    new = await upload(client, t, cid, "# Shipping\n\nDelivery takes 2 days by drone.", **path)
    # Until the new version is ready, search finds the old one only.
    hits = await search(client, t, "delivery days")
    assert [h["documentId"] for h in hits] == [old["id"]]
    await process(app, new["id"])
    hits = await search(client, t, "delivery days")
    assert [h["documentId"] for h in hits] == [new["id"]]
    assert (
        await client.get(kb(t, "documents", old["id"]), headers=t.owner.headers)
    ).status_code == 404
    # An older upload finishing after a newer one is dropped, not resurrected.
    stale = await upload(client, t, cid, "# Shipping\n\nDelivery by pigeon.", **path)
    newest = await upload(client, t, cid, "# Shipping\n\nDelivery by bicycle.", **path)
    await process(app, newest["id"])
    await process(app, stale["id"])
    hits = await search(client, t, "delivery")
    assert [h["documentId"] for h in hits] == [newest["id"]]
    remaining = await db.scalar(select(func.count()).select_from(KnowledgeDocument))
    assert remaining == 1


# --- search ---------------------------------------------------------------------------------------


async def test_named_queries_rank_their_document_first_in_a_32_document_corpus(
    client: AsyncTestClient, app: Litestar
) -> None:
    t, other = await tenant(client), await tenant(client)
    cid = await collection(client, t)
    ids: dict[str, str] = {}
    for filename, content in DOCUMENTS.items():
        doc = await upload(client, t, cid, content, filename=filename, language="en")
        ids[filename] = doc["id"]
    for document_id in ids.values():
        await process(app, document_id)
    # Another organization's copy of a document, and a document not yet processed.
    theirs = await collection(client, other)
    await upload(client, other, theirs, DOCUMENTS["refunds.md"], filename="refunds.md")
    pending = await upload(client, t, cid, "# Refunds\n\nrefunded refund refunds money")

    misses = []
    for query, expected in QUERIES:
        hits = await search(client, t, query, limit=5)
        if not hits or hits[0]["documentId"] != ids[expected]:
            misses.append((query, expected, [h["title"] for h in hits]))
        assert all(h["documentId"] != pending["id"] for h in hits)
    assert not misses, json.dumps(misses, indent=1)
    assert len(DOCUMENTS) >= 30

    scores = [h["score"] for h in await search(client, t, "refund money", limit=10)]
    assert scores == sorted(scores, reverse=True)
    # Limit, collection filter, another organization's collection.
    assert len(await search(client, t, "the", limit=1)) <= 1
    other_cid = await collection(client, t, "empty")
    # The collections, spelled collectionIds like the rest of the knowledge API, or
    # collection_ids as before.
    for spelling in ("collectionIds", "collection_ids"):
        assert await search(client, t, "refund", **{spelling: [other_cid]}) == [], spelling
        assert await search(client, t, "refund", **{spelling: [cid]}), spelling
        response = await client.post(
            kb(t, "search"), json={"query": "refund", spelling: [theirs]}, headers=t.owner.headers
        )
        assert response.status_code == 404
    both = await client.post(
        kb(t, "search"),
        json={"query": "refund", "collectionIds": [cid], "collection_ids": [cid]},
        headers=t.owner.headers,
    )
    assert single_validation_entry(both)["loc"] == ["body", "collection_ids"]
    document = (await client.get("/schema/openapi.json")).json()
    assert "collectionIds" in document["components"]["schemas"]["SearchBody"]["properties"]
    for bad in [{"query": ""}, {"query": "x", "limit": 0}, {"query": "x", "limit": 51}]:
        response = await client.post(kb(t, "search"), json=bad, headers=t.owner.headers)
        assert response.status_code == 422


# --- bookmarks ------------------------------------------------------------------------------------


async def test_bookmarks_are_read_and_replaced_with_this_organizations_agents(
    client: AsyncTestClient, app: Litestar
) -> None:
    t, other = await tenant(client), await tenant(client)
    cid = await collection(client, t)
    doc = await upload(client, t, cid, POLICY)
    url = kb(t, "documents", doc["id"], "bookmark")
    first = (await client.get(url, headers=t.owner.headers)).json()
    assert first == {"bookmarkMode": "none", "usageDescription": None, "agentIds": []}
    mine = await create_http_agent(client, t, "http://127.0.0.1:9")
    theirs = await create_http_agent(client, other, "http://127.0.0.1:9")

    body = {
        "bookmarkMode": "on_demand",
        "usageDescription": "refund questions",
        "agentIds": [mine["id"], mine["id"]],
    }
    put = await client.put(url, json=body, headers=t.owner.headers)
    assert put.status_code == 200, put.text
    assert put.json() == {
        "bookmarkMode": "on_demand",
        "usageDescription": "refund questions",
        "agentIds": [mine["id"]],
    }
    assert (await client.get(kb(t, "documents", doc["id"]), headers=t.owner.headers)).json()[
        "bookmarkMode"
    ] == "on_demand"
    refused = await client.put(
        url, json={"bookmarkMode": "always", "agentIds": [theirs["id"]]}, headers=t.owner.headers
    )
    assert refused.status_code == 404 and theirs["id"] in refused.json()["detail"]
    bad = await client.put(url, json={"bookmarkMode": "sometimes"}, headers=t.owner.headers)
    assert single_validation_entry(bad)["loc"] == ["body", "bookmarkMode"]
    assert (await client.get(url, headers=t.owner.headers)).json()["agentIds"] == [mine["id"]]
    # Deleting the agent takes it off the bookmark.
    await client.delete(f"/v1/orgs/{t.id}/agents/{mine['id']}", headers=t.owner.headers)
    assert (await client.get(url, headers=t.owner.headers)).json()["agentIds"] == []


# --- permissions and tenants ----------------------------------------------------------------------


async def test_permissions_and_the_status_endpoint_for_any_member(
    client: AsyncTestClient, app: Litestar
) -> None:
    t = await tenant(client, with_roles=("MEMBER", "VIEWER", "GUEST"))
    cid = await collection(client, t)
    doc = await upload(client, t, cid, POLICY)
    member, viewer, guest = (t.members[r].headers for r in ("MEMBER", "VIEWER", "GUEST"))
    upload_body = {"collectionId": cid, "filename": "b.md", "content": "# B\n\nb"}

    # Status: authentication only, even a GUEST (spec 18).
    assert (
        await client.get(kb(t, "documents", doc["id"], "status"), headers=guest)
    ).status_code == 200
    assert (await client.get(kb(t, "documents", doc["id"]), headers=guest)).status_code == 403
    assert (await client.get(kb(t, "documents", doc["id"]), headers=viewer)).status_code == 200
    assert (
        await client.post(kb(t, "documents", "structured"), json=upload_body, headers=viewer)
    ).status_code == 403
    assert (
        await client.post(kb(t, "documents", "structured"), json=upload_body, headers=member)
    ).status_code == 201
    # knowledge:delete: not a MEMBER's.
    assert (await client.delete(kb(t, "collections", cid), headers=member)).status_code == 403
    assert (await client.delete(kb(t, "documents", doc["id"]), headers=member)).status_code == 403
    token = await create_token(client, t.owner, t.id, permissions=["knowledge:read"])
    assert (
        await client.post(kb(t, "search"), json={"query": "x"}, headers=token.headers)
    ).status_code == 200
    assert (
        await client.delete(kb(t, "collections", cid), headers=token.headers)
    ).status_code == 403
    assert (
        await client.get(kb(t, "documents", doc["id"], "status"), headers=token.headers)
    ).status_code == 200


async def test_without_knowledge_read_the_status_shows_counts_but_no_headings(
    client: AsyncTestClient, app: Litestar
) -> None:
    t = await tenant(client, with_roles=("VIEWER", "GUEST"))
    cid = await collection(client, t)
    doc = await upload(client, t, cid, POLICY)
    await process(app, doc["id"])
    empty = await upload(client, t, cid, "# Only a heading\n")
    await process(app, empty["id"])
    url = kb(t, "documents", doc["id"], "status")
    no_read = await create_token(client, t.owner, t.id, permissions=["triggers:read"])
    reader = await create_token(client, t.owner, t.id, permissions=["knowledge:read"])
    counts = {"chunkCount": 2, "characterCount": len(POLICY), "headingCount": 3}

    for headers in (t.members["GUEST"].headers, no_read.headers):
        response = await client.get(url, headers=headers)
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["status"], body["progress"], body["error"]) == ("ready", 100, None)
        assert body["metadata"] == counts
        assert "Exceptions" not in response.text
        # Spar's own reason for a failure is no content of the document: it stays.
        failed = await client.get(kb(t, "documents", empty["id"], "status"), headers=headers)
        assert failed.json()["error"] == "the document has no text to index", failed.text
        assert "Only a heading" not in failed.text

    for headers in (t.members["VIEWER"].headers, reader.headers):
        metadata = (await client.get(url, headers=headers)).json()["metadata"]
        assert {k: metadata[k] for k in counts} == counts
        assert metadata["headings"][1] == {"level": 2, "text": "Exceptions"}


async def test_another_organizations_ids_answer_404(client: AsyncTestClient, app: Litestar) -> None:
    t, other = await tenant(client), await tenant(client)
    theirs = await collection(client, other)
    doc = await upload(client, other, theirs, POLICY)
    await process(app, doc["id"])
    h = t.owner.headers
    for response in [
        await client.get(kb(t, "collections", theirs), headers=h),
        await client.delete(kb(t, "collections", theirs), headers=h),
        await client.get(kb(t, "collections", theirs, "documents"), headers=h),
        await client.get(kb(t, "documents", doc["id"]), headers=h),
        await client.get(kb(t, "documents", doc["id"], "status"), headers=h),
        await client.get(kb(t, "documents", doc["id"], "bookmark"), headers=h),
        await client.put(
            kb(t, "documents", doc["id"], "bookmark"), json={"bookmarkMode": "none"}, headers=h
        ),
        await client.delete(kb(t, "documents", doc["id"]), headers=h),
        await client.post(
            kb(t, "documents", "structured"),
            json={"collectionId": theirs, "filename": "x.md", "content": "x"},
            headers=h,
        ),
    ]:
        assert response.status_code == 404, response.text
    assert await search(client, t, "refund") == []
    still = await client.get(kb(other, "documents", doc["id"]), headers=other.owner.headers)
    assert still.json()["processingStatus"] == "ready"


async def test_the_sweeper_resends_a_document_whose_message_was_lost(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession
) -> None:
    t = await tenant(client)
    cid = await collection(client, t)
    doc = await upload(client, t, cid, POLICY)
    broker = stub_broker()
    await sweep(app.state.database, broker, settings)
    assert broker.queues[PROCESS_DOCUMENT[0]].qsize() == 0  # just uploaded
    stale = datetime.now(UTC) - timedelta(minutes=10)
    await db.execute(text("UPDATE knowledge_documents SET updated_at = :at"), {"at": stale})
    await db.commit()
    await sweep(app.state.database, broker, settings)
    await sweep(app.state.database, broker, settings)  # touched: not again at once
    assert broker.queues[PROCESS_DOCUMENT[0]].qsize() == 1
    await process(app, doc["id"])
    assert (await status(client, t, doc["id"]))["status"] == "ready"
