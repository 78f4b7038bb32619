"""The results page's live poll reads only what changed since its previous look.

A batch's page polls its progress URL every second; on a batch of thousands of runs,
answering every run's summary each time was thousands of rows per viewer per second.
With ``since`` (the previous answer's ``cursor``) only the runs changed since come back,
with the batch's counters as always.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update

from api.deps import OFFSET_LIMIT
from api.ui.session import COOKIE
from shared.batches.services import RECENT
from shared.batches.window import dispatch_committed
from shared.db.models import ScenarioRun
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import create_batch, make_scenario, make_world
from tests.support.fakes import FakeAgent


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply="Hello, how can I help?") as fake:
        yield fake


async def test_a_poll_with_the_cursor_answers_only_the_runs_changed_since(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    scenarios = [await make_scenario(client, w, f"scenario {n}") for n in range(3)]
    batch = await create_batch(
        client, w, scenario_ids=[s["id"] for s in scenarios], max_concurrency=1
    )
    cookie = {"Cookie": f"{COOKIE}={w.t.owner.token}"}
    url = f"/ui/orgs/{w.t.id}/batches/{batch['id']}/progress"

    async def poll(since: str | None = None) -> dict[str, Any]:
        response = await client.get(url, params={"since": since} if since else {}, headers=cookie)
        assert response.status_code == 200, response.text
        return response.json()

    # The first look (the page's) reads every run.
    first = await poll()
    assert len(first["batch"]["runs"]) == 3
    assert first["batch"]["total_scenarios"] == 3
    # As if the batch had been queued a while ago: its runs last changed before the margin
    # a poll reads back over.
    database = app.state.database
    async with database.transaction() as session:
        await session.execute(
            update(ScenarioRun)
            .where(ScenarioRun.batch_run_id == UUID(batch["id"]))
            .values(updated_at=datetime.fromisoformat(first["cursor"]) - 2 * RECENT)
        )
    cursor = (await poll(first["cursor"]))["cursor"]
    quiet = await poll(cursor)
    assert quiet["batch"]["runs"] == [], "nothing changed: no run is read"
    assert quiet["batch"]["completed_scenarios"] == 0
    assert quiet["over"] is False

    # One run is played to its end by the run engine (one at a time: its end hands out the
    # next, which changes too); the third is left as it was.  The next poll reads the two.
    (played,) = await dispatch_committed(database, UUID(batch["id"]))
    handed = await execute_run(database, settings, played) or []
    assert len(handed) == 1, handed
    changed = await poll(cursor)
    runs = {run["id"]: run for run in changed["batch"]["runs"]}
    assert set(runs) == {str(played), str(handed[0])}
    assert runs[str(played)]["status"] == "passed", runs
    assert runs[str(played)]["completed_at"] is not None
    assert changed["batch"]["completed_scenarios"] == 1, "the counters are always read"
    assert datetime.fromisoformat(changed["cursor"]) >= datetime.fromisoformat(cursor)

    # Without a cursor (an old page's script) every run is answered, as before.
    assert len((await poll())["batch"]["runs"]) == 3
    # A page names the cursor of its own look for its script's first poll.
    page = await client.get(f"/ui/orgs/{w.t.id}/batches/{batch['id']}", headers=cookie)
    since = page.text.split('data-progress-since="', 1)[1].split('"', 1)[0]
    assert abs(datetime.fromisoformat(since) - datetime.fromisoformat(cursor)) < timedelta(
        minutes=5
    )


async def test_the_batch_list_refuses_an_offset_past_the_largest_it_pages_to(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    """An offset no page can reach is the caller's mistake (400, the UI's page for a
    malformed address), not a server error; the largest one the API takes still answers."""
    w = await make_world(client, agent)
    cookie = {"Cookie": f"{COOKIE}={w.t.owner.token}"}
    url = f"/ui/orgs/{w.t.id}/batches/"
    past = await client.get(url, params={"offset": str(2**63)}, headers=cookie)
    assert past.status_code == 400, (past.status_code, past.text[:300])
    assert "this address is malformed" in past.text
    largest = await client.get(url, params={"offset": str(OFFSET_LIMIT)}, headers=cookie)
    assert largest.status_code == 200, largest.text[:300]
