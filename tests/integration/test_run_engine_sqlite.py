"""The run engine on the embedded default (SQLite, ``spar dev``).

On PostgreSQL every state change of a run is one statement (``shared.scenarios.store``);
elsewhere the same changes run as short transactions, and a batch's runs are fanned out
with snapshots built in Python.  This module plays a batch through that second path, end
to end, on a migrated SQLite file.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from api.app import create_app
from shared.batches.services import dispatch_committed
from shared.db.migrate import upgrade
from shared.scenarios.runner import execute_run, finish
from shared.settings import Settings
from tests.support.factories import tenant
from tests.support.fakes import FakeAgent


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Echo: {body['message']}") as fake:
        yield fake


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[tuple[Litestar, AsyncTestClient, Settings]]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'spar.db'}",
        secret_key="test-secret-key-do-not-use-in-production",
        egress_allow_private=True,
    )
    upgrade(settings.database_url)
    app = create_app(settings)
    async with AsyncTestClient(app=app, base_url="http://testserver.local") as client:
        yield app, client, settings


def turn(message: str, expected: str) -> dict[str, Any]:
    return {
        "user_message": message,
        "criteria": [{"question": expected, "criteria_type": "contains"}],
    }


async def test_a_batch_plays_to_the_end_with_exact_counts_on_sqlite(
    sqlite: tuple[Litestar, AsyncTestClient, Settings], agent: FakeAgent
) -> None:
    app, client, settings = sqlite
    t = await tenant(client)
    headers = t.owner.headers
    base = f"/v1/orgs/{t.id}"
    for body, path in (
        ({"domain": "127.0.0.1"}, "allowed-domains/"),
        ({"name": "bot", "kind": "http", "endpoint_url": f"{agent.url}/chat"}, "agents"),
    ):
        response = await client.post(f"{base}/{path}", json=body, headers=headers)
        assert response.status_code == 201, response.text
    agent_id = response.json()["id"]
    shapes = {
        "pass": [turn("hello {{ name }}", "hello ada"), turn("bye", "bye")],
        "fail": [turn("hello", "never said")],
        "stop": [{**turn("hello", "never said"), "required": True}, turn("unreached", "x")],
    }
    for n in range(7):
        kind = list(shapes)[n % 3]
        body = {"name": f"{kind} {n}", "tags": ["lite"], "customer_context": {"name": "Ada"}}
        response = await client.post(
            f"{base}/scenarios", json={**body, "turns": shapes[kind]}, headers=headers
        )
        assert response.status_code == 201, response.text
    response = await client.post(
        f"{base}/scenarios/batch-runs/",
        json={"agent_id": agent_id, "tags": ["lite"], "max_concurrency": 2},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    batch_id = response.json()["id"]
    factory = app.state.session_factory

    pending = deque(await dispatch_committed(factory, UUID(batch_id)))
    assert len(pending) == 2
    played = 0
    while pending:
        run_id = pending.popleft()
        pending.extend(await execute_run(factory, settings, run_id) or [])
        played += 1
        assert await execute_run(factory, settings, run_id) is None  # a redelivery: no-op
        assert await finish(factory, run_id, "passed") is None

    read = await client.get(f"{base}/scenarios/batch-runs/{batch_id}", headers=headers)
    done = read.json()
    assert played == 7
    assert done["status"] == "completed", done
    assert (done["passed_scenarios"], done["failed_scenarios"], done["error_scenarios"]) == (
        3,
        4,
        0,
    )
    assert done["completed_scenarios"] == done["total_scenarios"] == 7
    by_name = {r["scenario_name"]: r for r in done["runs"]}
    assert (by_name["pass 0"]["passed_turns"], by_name["pass 0"]["total_turns"]) == (2, 2)
    assert (by_name["stop 2"]["status"], by_name["stop 2"]["passed_turns"]) == ("failed", 0)
    run = await client.get(f"{base}/scenarios/runs/{by_name['pass 0']['id']}", headers=headers)
    turns = run.json()["turn_results"]
    assert [t["response_content"] for t in turns] == ["Echo: hello Ada", "Echo: bye"]
    assert [t["user_message"] for t in turns] == ["hello Ada", "bye"]
    assert run.json()["batch_run_id"] == batch_id
    stopped = await client.get(f"{base}/scenarios/runs/{by_name['stop 2']['id']}", headers=headers)
    results = stopped.json()["turn_results"]
    assert [(t["status"], t["stopped_early"], t["passed"]) for t in results] == [
        ("failed", True, False),
        ("skipped", False, False),
    ]
    assert (results[1]["user_message"], results[1]["response_content"]) == ("", "")
    assert results[1]["criteria_results"] == []
    listed = await client.get(f"{base}/scenarios/runs?batch_run_id={batch_id}", headers=headers)
    assert listed.json()["total"] == 7
    # Every agent call belongs to a turn written once: 3 x 2 + 2 x 1 + 2 x 1.
    assert len(agent.requests) == 10
