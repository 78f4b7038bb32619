"""Knowledge through the API: a collection, an upload, and its processing run as the
``documents`` actor runs it (``process_document``)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.knowledge.processing import process_document
from tests.support.factories import Tenant


def kb(t: Tenant, *rest: str) -> str:
    return "/".join([f"/v1/orgs/{t.id}/knowledge", *rest])


async def collection(client: AsyncTestClient, t: Tenant, name: str = "policies") -> str:
    response = await client.post(kb(t, "collections"), json={"name": name}, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def upload(
    client: AsyncTestClient, t: Tenant, collection_id: str, content: str, **fields: Any
) -> dict[str, Any]:
    body = {"collectionId": collection_id, "filename": "doc.md", "content": content, **fields}
    response = await client.post(
        kb(t, "documents", "structured"), json=body, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    return response.json()


async def process(app: Litestar, document_id: str) -> None:
    await process_document(app.state.database, app.state.settings, UUID(document_id))
