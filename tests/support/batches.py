"""Batches of scenario runs through the API: a world (an organization, an http agent at a
loopback :class:`FakeAgent`), scenarios with turns that pass, fail or error, a batch made
and read, a batch played as the workers play it (:func:`drain`), and its event stream read
while work goes on elsewhere (:func:`read_events`, :class:`Background`)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update

from shared.batches.window import dispatch_committed
from shared.db.engine import Database, create_engine
from shared.db.models import BatchRun
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Tenant, tenant
from tests.support.fakes import FakeAgent
from tests.support.sse import parse_sse


@dataclass
class World:
    t: Tenant
    agent_id: str

    @property
    def headers(self) -> dict[str, str]:
        return self.t.owner.headers

    @property
    def batches(self) -> str:
        return f"/v1/orgs/{self.t.id}/scenarios/batch-runs"

    @property
    def runs(self) -> str:
        return f"/v1/orgs/{self.t.id}/scenarios/runs"


async def make_world(
    client: AsyncTestClient, agent: FakeAgent, *, with_roles: tuple[str, ...] = ()
) -> World:
    """An organization that may reach the fake agent, with an http agent pointing at it."""
    t = await tenant(client, with_roles=with_roles)
    domain = await client.post(
        f"/v1/orgs/{t.id}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=t.owner.headers
    )
    assert domain.status_code == 201, domain.text
    made = await client.post(
        f"/v1/orgs/{t.id}/agents",
        json={"name": "bot", "kind": "http", "endpoint_url": f"{agent.url}/chat"},
        headers=t.owner.headers,
    )
    assert made.status_code == 201, made.text
    return World(t=t, agent_id=made.json()["id"])


def passing_turn(n: int = 0) -> dict[str, Any]:
    return {
        "user_message": f"hello {n}",
        "criteria": [{"question": "hello", "criteria_type": "contains"}],
    }


def failing_turn(n: int = 0) -> dict[str, Any]:
    return {
        "user_message": f"hello {n}",
        "criteria": [{"question": "never-said", "criteria_type": "contains"}],
    }


def error_turn() -> dict[str, Any]:
    # Saved (nothing wrong shows before rendering), but the sandbox refuses to build so large
    # a value: the run ends as ``error`` without calling anyone.
    return {
        "user_message": "hello {{ 'x' * 1000000000 }}",
        "criteria": [{"question": "hello", "criteria_type": "contains"}],
    }


async def make_scenario(
    client: AsyncTestClient,
    w: World,
    name: str = "scenario",
    *,
    tags: list[str] | None = None,
    turns: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/orgs/{w.t.id}/scenarios",
        json={"name": name, "tags": tags or [], "turns": turns or [passing_turn()]},
        headers=w.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()


async def create_batch(
    client: AsyncTestClient, w: World, *, expect: int = 201, **body: Any
) -> dict[str, Any]:
    response = await client.post(
        f"{w.batches}/", json={"agent_id": w.agent_id, **body}, headers=w.headers
    )
    assert response.status_code == expect, response.text
    return response.json()


async def get_batch(client: AsyncTestClient, w: World, batch_id: str) -> dict[str, Any]:
    response = await client.get(f"{w.batches}/{batch_id}", headers=w.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def drain(app: Litestar, settings: Settings, batch_id: str) -> list[UUID]:
    """Play the whole batch as the workers do: dispatch, then execute each run and the
    successors its end handed out."""
    database = app.state.database
    pending = deque(await dispatch_committed(database, UUID(batch_id)))
    executed: list[UUID] = []
    while pending:
        run_id = pending.popleft()
        pending.extend(await execute_run(database, settings, run_id) or [])
        executed.append(run_id)
    return executed


# --- live progress (SSE) ------------------------------------------------------------------------


async def read_events(client: AsyncTestClient, w: World, batch_id: str) -> list[tuple[str, Any]]:
    async with client.stream("GET", f"{w.batches}/{batch_id}/events", headers=w.headers) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        body = "".join([chunk async for chunk in resp.aiter_text()])
    return parse_sse(body)


class Background:
    """Work on a batch from another thread, with its own event loop and engine.

    Litestar's test client serves a request on a separate thread while blocking the
    test's event loop until the whole response is read, so whatever must happen *during*
    a stream has to run elsewhere.  If the work fails, the batch is put in ``error`` so
    the stream ends instead of hanging, and :meth:`join` raises the failure.
    """

    def __init__(self, settings: Settings, batch_id: str, work: Any) -> None:
        self._settings = settings
        self._batch_id = UUID(batch_id)
        self._work = work
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.join()

    def join(self) -> None:
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "background work did not finish"
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        database = Database(create_engine(self._settings))
        try:
            await self._work(database)
        except BaseException as exc:
            self._error = exc
            async with database.transaction() as session:
                await session.execute(
                    update(BatchRun)
                    .where(BatchRun.id == self._batch_id)
                    .values(status="error", error_message="test background work failed")
                )
        finally:
            await database.dispose()
