"""Batch runs: create / read (spec 15) / list / cancel, the sliding dispatch window, exact
counters, the stuck-run sweeper and the live progress stream (DESIGN §3, §5.3).

Execution happens in-process, exactly as the actors do it: ``dispatch_committed`` hands
out the first runs of a batch's window, ``execute_run`` plays one run against a loopback
:class:`FakeAgent` and returns the successors its end handed out.  Criteria are the free
deterministic checks, so no judge is needed: the fake agent echoes the user message,
``contains "hello"`` passes on ``hello …`` turns and ``contains "never-said"`` fails.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import msgspec
import psycopg
import pytest
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import iter_queue
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from scheduler.sweeper import sweep
from shared.batches import services as batch_services
from shared.batches.window import dispatch_committed
from shared.db.base import utcnow
from shared.db.models import (
    BatchRun,
    Criterion,
    CriterionResult,
    Scenario,
    ScenarioRun,
    ScenarioTurn,
)
from shared.identity.access import OrgAccess, Principal
from shared.queue import RUN_SCENARIO
from shared.scenarios import runner, store
from shared.scenarios.records import CostSummary, CriterionRecord, TurnRecord
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import (
    Background,
    World,
    create_batch,
    drain,
    error_turn,
    failing_turn,
    get_batch,
    make_scenario,
    make_world,
    passing_turn,
    read_events,
)
from tests.support.factories import (
    create_token,
    single_validation_entry,
    stub_broker,
)
from tests.support.fakes import FakeAgent

BATCH_FIELDS = {
    "id",
    "organization_id",
    "agent_id",
    "agent_name",
    "status",
    "total_scenarios",
    "completed_scenarios",
    "passed_scenarios",
    "failed_scenarios",
    "error_scenarios",
    "max_concurrency",
    "repetitions",
    "baseline_batch_id",
    "judge_repetitions",
    "replay_of",
    "started_at",
    "completed_at",
    "created_at",
    "updated_at",
    "error_message",
}
SUMMARY_FIELDS = {
    "id",
    "scenario_id",
    "scenario_name",
    "status",
    "passed_turns",
    "total_turns",
    "started_at",
    "completed_at",
}
TERMINAL = {"passed", "failed", "error"}
# What the detail adds to a batch's body.
DETAIL_FIELDS = {
    "runs",
    "judge_trust",
    "rate_limited",
    "scenarios",
    "pass_hat_k",
    "pass_at_k",
    "flaky_scenarios",
    "comparison",
    "judge_flip_rate",
    "replays",
}


# --- setup ----------------------------------------------------------------------------------------


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Echo: {body['message']}") as fake:
        yield fake


def assert_counts_add_up(batch: dict[str, Any]) -> None:
    assert batch["completed_scenarios"] == (
        batch["passed_scenarios"] + batch["failed_scenarios"] + batch["error_scenarios"]
    ), batch
    assert batch["completed_scenarios"] <= batch["total_scenarios"], batch


async def in_flight(db: AsyncSession, batch_id: str | UUID) -> int:
    """Runs of the batch handed out and not yet terminal: what the window bounds."""
    count = await db.scalar(
        select(func.count())
        .select_from(ScenarioRun)
        .where(
            ScenarioRun.batch_run_id == UUID(str(batch_id)),
            ScenarioRun.dispatched_at.is_not(None),
            ScenarioRun.status.in_(("pending", "running")),
        )
    )
    await db.commit()
    return int(count or 0)


def sent_runs(broker: StubBroker) -> list[str]:
    """Drain the ``runs`` queue of a stub broker: the run ids sent, in order."""
    ids = []
    for data in iter_queue(broker.queues[RUN_SCENARIO[0]]):
        message = Message.decode(data)
        assert message.actor_name == RUN_SCENARIO[1]
        ids.append(message.args[0])
    return ids


# --- create ---------------------------------------------------------------------------------------


async def test_create_by_ids_answers_201_queued_and_get_shows_the_runs(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    one = await make_scenario(client, w, "one", turns=[passing_turn(0), passing_turn(1)])
    two = await make_scenario(client, w, "two")
    await make_scenario(client, w, "not chosen")
    batch = await create_batch(client, w, scenario_ids=[one["id"], two["id"]], max_concurrency=4)
    assert BATCH_FIELDS <= set(batch) <= BATCH_FIELDS | {"runs"}, sorted(batch)
    UUID(batch["id"])
    assert batch["status"] == "queued"
    assert batch["organization_id"] == w.t.id
    assert batch["agent_id"] == w.agent_id
    assert batch["agent_name"] == "bot"
    assert batch["total_scenarios"] == 2
    assert batch["max_concurrency"] == 4
    for counter in ("completed", "passed", "failed", "error"):
        assert batch[f"{counter}_scenarios"] == 0
    assert batch["started_at"] is None and batch["completed_at"] is None
    assert batch["error_message"] is None

    read = await get_batch(client, w, batch["id"])
    assert set(read) == BATCH_FIELDS | DETAIL_FIELDS
    assert read["judge_trust"] is None  # not over yet
    assert (batch["repetitions"], batch["baseline_batch_id"]) == (1, None)  # the defaults
    assert {k: v for k, v in read.items() if k not in DETAIL_FIELDS | {"updated_at"}} == {
        k: v for k, v in batch.items() if k not in {"runs", "updated_at"}
    }
    # Nothing tried yet: each scenario with no trial, pass^1 and pass@k unknown.
    assert [(s["scenario_name"], s["trials"], s["passes"]) for s in read["scenarios"]] == [
        ("one", 0, 0),
        ("two", 0, 0),
    ]
    assert (read["pass_hat_k"], read["pass_at_k"], read["flaky_scenarios"]) == ([None], None, 0)
    assert read["comparison"] is None
    runs = read["runs"]
    assert all(set(r) == SUMMARY_FIELDS for r in runs), runs
    assert [(r["scenario_id"], r["scenario_name"]) for r in runs] == [
        (one["id"], "one"),
        (two["id"], "two"),
    ]
    assert [(r["status"], r["passed_turns"], r["total_turns"]) for r in runs] == [
        ("pending", 0, 2),
        ("pending", 0, 1),
    ]
    assert len({r["id"] for r in runs}) == 2
    # Nothing runs inside the request.
    assert agent.requests == []


async def test_create_by_tags_and_by_ids_and_tags_is_a_union_without_duplicates(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    a = await make_scenario(client, w, "a", tags=["smoke"])
    b = await make_scenario(client, w, "b", tags=["smoke", "nightly"])
    c = await make_scenario(client, w, "c", tags=["nightly"])
    d = await make_scenario(client, w, "d")
    await make_scenario(client, w, "e", tags=["other"])

    by_tag = await create_batch(client, w, tags=["smoke"])
    assert by_tag["total_scenarios"] == 2
    assert by_tag["max_concurrency"] == 10  # the default
    names = [r["scenario_name"] for r in (await get_batch(client, w, by_tag["id"]))["runs"]]
    assert sorted(names) == ["a", "b"]

    # b carries both tags and c is named and tagged: each scenario still runs once.
    both = await create_batch(
        client, w, scenario_ids=[a["id"], c["id"], d["id"], a["id"]], tags=["nightly", "smoke"]
    )
    assert both["total_scenarios"] == 4
    runs = (await get_batch(client, w, both["id"]))["runs"]
    assert sorted(r["scenario_id"] for r in runs) == sorted([a["id"], b["id"], c["id"], d["id"]])


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, None),
        ({"scenario_ids": [], "tags": []}, None),
        ({"tags": ["smoke"], "max_concurrency": 0}, ["body", "max_concurrency"]),
        ({"tags": ["smoke"], "max_concurrency": 101}, ["body", "max_concurrency"]),
        ({"tags": ["smoke"], "priority": "high"}, ["body", "priority"]),
        ({"tags": ["smoke"], "scenario_ids": ["not-a-uuid"]}, None),
        ({"tags": [""]}, None),
        ({"scenario_ids": [str(uuid.uuid4()) for _ in range(10_001)]}, ["body", "scenario_ids"]),
        ({"tags": [f"t{n}" for n in range(51)]}, ["body", "tags"]),
    ],
    ids=[
        "neither",
        "both-empty",
        "concurrency-0",
        "concurrency-101",
        "unknown-field",
        "bad-id",
        "empty-tag",
        "over-10000-ids",
        "over-50-tags",
    ],
)
async def test_create_refuses_invalid_bodies_with_422(
    client: AsyncTestClient, agent: FakeAgent, body: dict[str, Any], loc: list[str] | None
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, tags=["smoke"])
    response = await client.post(
        f"{w.batches}/", json={"agent_id": w.agent_id, **body}, headers=w.headers
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail, detail
    assert detail[0]["loc"][0] == "body", detail
    if loc is not None:
        assert detail[0]["loc"] == loc, detail
    assert await count_batches(client, w) == 0


async def count_batches(client: AsyncTestClient, w: World) -> int:
    response = await client.get(f"{w.batches}/", headers=w.headers)
    assert response.status_code == 200, response.text
    return response.json()["total"]


async def test_create_refuses_missing_agent_in_body(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, tags=["smoke"])
    response = await client.post(f"{w.batches}/", json={"tags": ["smoke"]}, headers=w.headers)
    assert response.status_code == 422, response.text


async def test_tags_matching_nothing_is_422(client: AsyncTestClient, agent: FakeAgent) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, tags=["smoke"])
    response = await client.post(
        f"{w.batches}/",
        json={"agent_id": w.agent_id, "tags": ["nothing-has-it"]},
        headers=w.headers,
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == "body"
    assert await count_batches(client, w) == 0


async def test_foreign_or_unknown_scenarios_and_agents_are_404(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    other = await make_world(client, agent)
    mine = await make_scenario(client, w, tags=["smoke"])
    theirs = await make_scenario(client, other, tags=["smoke"])

    for ids in ([theirs["id"]], [mine["id"], theirs["id"]], [str(uuid.uuid4())]):
        response = await client.post(
            f"{w.batches}/", json={"agent_id": w.agent_id, "scenario_ids": ids}, headers=w.headers
        )
        assert response.status_code == 404, response.text
        assert set(response.json()) == {"detail"}

    # Another organization's agent, or none at all.
    for agent_id in (other.agent_id, str(uuid.uuid4())):
        response = await client.post(
            f"{w.batches}/",
            json={"agent_id": agent_id, "scenario_ids": [mine["id"]]},
            headers=w.headers,
        )
        assert response.status_code == 404, response.text

    # Tags only ever match the caller's own scenarios: the other org's "smoke" is not taken.
    batch = await create_batch(client, w, tags=["smoke"])
    assert batch["total_scenarios"] == 1
    runs = (await get_batch(client, w, batch["id"]))["runs"]
    assert [r["scenario_id"] for r in runs] == [mine["id"]]
    assert await count_batches(client, w) == 1
    assert await count_batches(client, other) == 0


# --- read and list --------------------------------------------------------------------------------


async def test_listing_filters_by_status_and_pages(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, tags=["smoke"])
    made = [await create_batch(client, w, tags=["smoke"]) for _ in range(3)]
    cancelled = await client.post(f"{w.batches}/{made[1]['id']}/cancel", headers=w.headers)
    assert cancelled.status_code == 200, cancelled.text

    everything = (await client.get(f"{w.batches}/", headers=w.headers)).json()
    assert set(everything) == {"batch_runs", "total"}
    assert everything["total"] == 3
    assert [b["id"] for b in everything["batch_runs"]] == [b["id"] for b in made]
    assert all("runs" not in b for b in everything["batch_runs"])
    assert all(set(b) == BATCH_FIELDS for b in everything["batch_runs"])

    queued = (await client.get(f"{w.batches}/?status=queued", headers=w.headers)).json()
    assert queued["total"] == 2
    assert [b["id"] for b in queued["batch_runs"]] == [made[0]["id"], made[2]["id"]]
    errored = (await client.get(f"{w.batches}/?status=error", headers=w.headers)).json()
    assert [b["id"] for b in errored["batch_runs"]] == [made[1]["id"]]
    assert errored["total"] == 1
    none = (await client.get(f"{w.batches}/?status=completed", headers=w.headers)).json()
    assert none == {"batch_runs": [], "total": 0}

    first = (await client.get(f"{w.batches}/?limit=2", headers=w.headers)).json()
    second = (await client.get(f"{w.batches}/?limit=2&offset=2", headers=w.headers)).json()
    assert first["total"] == second["total"] == 3
    assert [b["id"] for b in first["batch_runs"] + second["batch_runs"]] == [b["id"] for b in made]
    for query in ("status=bogus", "limit=0", "limit=501", "offset=-1"):
        response = await client.get(f"{w.batches}/?{query}", headers=w.headers)
        assert response.status_code == 422, (query, response.text)
        assert response.json()["detail"][0]["loc"][0] == "query"


async def test_runs_of_a_batch_are_listed_by_batch_run_id(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    other = await make_world(client, agent)
    one = await make_scenario(client, w, "one", tags=["a"])
    two = await make_scenario(client, w, "two", tags=["a"], turns=[failing_turn()])
    first = await create_batch(client, w, tags=["a"])
    second = await create_batch(client, w, scenario_ids=[one["id"]])
    single = await client.post(
        f"/v1/orgs/{w.t.id}/scenarios/{one['id']}/run",
        json={"agent_id": w.agent_id},
        headers=w.headers,
    )
    assert single.status_code == 201, single.text
    await make_scenario(client, other, "theirs", tags=["a"])
    theirs = await create_batch(client, other, tags=["a"])
    await drain(app, settings, first["id"])

    async def listed(world: World, query: str) -> dict[str, Any]:
        response = await client.get(f"{world.runs}?{query}", headers=world.headers)
        assert response.status_code == 200, response.text
        return response.json()

    detail = await get_batch(client, w, first["id"])
    of_first = await listed(w, f"batch_run_id={first['id']}")
    assert of_first["total"] == 2
    assert sorted(r["id"] for r in of_first["runs"]) == sorted(r["id"] for r in detail["runs"])
    assert all(r["batch_run_id"] == first["id"] for r in of_first["runs"])
    assert all("turn_results" not in r for r in of_first["runs"])
    of_second = await listed(w, f"batch_run_id={second['id']}")
    assert [r["batch_run_id"] for r in of_second["runs"]] == [second["id"]]
    # The filter combines with the others.
    failed = await listed(w, f"batch_run_id={first['id']}&status=failed")
    assert ([r["scenario_id"] for r in failed["runs"]], failed["total"]) == ([two["id"]], 1)
    assert (await listed(w, f"batch_run_id={second['id']}&status=passed"))["total"] == 0
    # Without the filter, the single run is there too, in no batch; a run read says which.
    everything = await listed(w, "")
    assert everything["total"] == 4
    by_batch = sorted(str(r["batch_run_id"]) for r in everything["runs"])
    assert by_batch == sorted([first["id"], first["id"], second["id"], "None"])
    run = await client.get(f"{w.runs}/{detail['runs'][0]['id']}", headers=w.headers)
    assert run.json()["batch_run_id"] == first["id"]
    assert (await client.get(f"{w.runs}/{single.json()['id']}", headers=w.headers)).json()[
        "batch_run_id"
    ] is None

    # Another organization's batch, or none at all, matches nothing (as a foreign scenario or
    # agent does): its runs stay invisible either way.
    for world, batch_id in ((w, theirs["id"]), (other, first["id"]), (w, str(uuid.uuid4()))):
        assert await listed(world, f"batch_run_id={batch_id}") == {"runs": [], "total": 0}
    assert (await listed(other, f"batch_run_id={theirs['id']}"))["total"] == 1
    response = await client.get(f"{w.runs}?batch_run_id=nope", headers=w.headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "batch_run_id"]


async def test_unknown_or_malformed_batch_ids(client: AsyncTestClient, agent: FakeAgent) -> None:
    w = await make_world(client, agent)
    missing = str(uuid.uuid4())
    assert (await client.get(f"{w.batches}/{missing}", headers=w.headers)).status_code == 404
    assert (
        await client.post(f"{w.batches}/{missing}/cancel", headers=w.headers)
    ).status_code == 404
    assert (await client.get(f"{w.batches}/{missing}/events", headers=w.headers)).status_code == 404
    response = await client.get(f"{w.batches}/not-a-uuid", headers=w.headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == "path"


# --- permissions and isolation --------------------------------------------------------------------


async def test_permissions_run_to_create_and_cancel_read_to_read(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent, with_roles=("MEMBER", "VIEWER", "GUEST"))
    await make_scenario(client, w, tags=["smoke"])
    body = {"agent_id": w.agent_id, "tags": ["smoke"]}
    member, viewer, guest = (w.t.members[r] for r in ("MEMBER", "VIEWER", "GUEST"))

    response = await client.post(f"{w.batches}/", json=body, headers=viewer.headers)
    assert response.status_code == 403, response.text
    response = await client.post(f"{w.batches}/", json=body, headers=guest.headers)
    assert response.status_code == 403, response.text
    response = await client.post(f"{w.batches}/", json=body, headers=member.headers)
    assert response.status_code == 201, response.text
    batch_id = response.json()["id"]

    for caller, expected in ((viewer, 200), (member, 200), (guest, 403)):
        for path in (f"{w.batches}/", f"{w.batches}/{batch_id}"):
            response = await client.get(path, headers=caller.headers)
            assert response.status_code == expected, (path, response.text)
    response = await client.get(f"{w.batches}/{batch_id}/events", headers=guest.headers)
    assert response.status_code == 403, response.text

    for caller in (viewer, guest):
        response = await client.post(f"{w.batches}/{batch_id}/cancel", headers=caller.headers)
        assert response.status_code == 403, response.text
    assert (await get_batch(client, w, batch_id))["status"] == "queued"

    # Platform tokens: the same permissions decide.
    reader = await create_token(client, w.t.owner, w.t.id, ["scenarios:read"])
    runner_token = await create_token(
        client, w.t.owner, w.t.id, ["scenarios:read", "scenarios:run"]
    )
    response = await client.post(f"{w.batches}/", json=body, headers=reader.headers)
    assert response.status_code == 403, response.text
    response = await client.get(f"{w.batches}/{batch_id}", headers=reader.headers)
    assert response.status_code == 200, response.text
    response = await client.post(f"{w.batches}/", json=body, headers=runner_token.headers)
    assert response.status_code == 201, response.text
    response = await client.post(f"{w.batches}/{batch_id}/cancel", headers=member.headers)
    assert response.status_code == 200, response.text

    response = await client.get(f"{w.batches}/")
    assert response.status_code == 401, response.text


async def test_another_organizations_batch_is_404_everywhere(
    client: AsyncTestClient, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    other = await make_world(client, agent)
    await make_scenario(client, w, tags=["smoke"])
    batch = await create_batch(client, w, tags=["smoke"])
    # Through the other org's own path, with its owner's token.
    for method, path in (
        ("GET", f"{other.batches}/{batch['id']}"),
        ("POST", f"{other.batches}/{batch['id']}/cancel"),
        ("GET", f"{other.batches}/{batch['id']}/events"),
        ("GET", f"{other.batches}/compare?a={batch['id']}&b={batch['id']}"),
    ):
        response = await client.request(method, path, headers=other.headers)
        assert response.status_code == 404, (path, response.text)
    listing = (await client.get(f"{other.batches}/", headers=other.headers)).json()
    assert listing == {"batch_runs": [], "total": 0}
    # Through the owning org's path by a non-member: indistinguishable from missing.
    for method, path in (
        ("GET", f"{w.batches}/{batch['id']}"),
        ("POST", f"{w.batches}/{batch['id']}/cancel"),
        ("GET", f"{w.batches}/{batch['id']}/events"),
        ("GET", f"{w.batches}/"),
    ):
        response = await client.request(method, path, headers=other.headers)
        assert response.status_code == 404, (path, response.text)
    assert (await get_batch(client, w, batch["id"]))["status"] == "queued"


async def test_two_batches_compare_scenario_by_scenario_regressions_first(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    steady = await make_scenario(client, w, name="steady", turns=[passing_turn()], tags=["s"])
    await make_scenario(client, w, name="flaky", turns=[passing_turn(1)], tags=["s"])
    reworded = await make_scenario(client, w, name="reworded", turns=[passing_turn(2)], tags=["s"])
    renamed = await make_scenario(client, w, name="renamed", turns=[passing_turn(3)], tags=["s"])
    before = await create_batch(client, w, tags=["s"])
    await drain(app, settings, before["id"])
    # The second batch: the agent now fails "flaky"; "reworded" was edited so that it fails
    # (not the agent's doing); "renamed" only changed its name and description (what it
    # plays is the same), and a new scenario runs only there.
    agent.reply = lambda body: "Hi" if body["message"] == "hello 1" else f"Echo: {body['message']}"
    for scenario, change in (
        (reworded, {"turns": [failing_turn(2)]}),
        (
            renamed,
            {"name": "renamed again", "description": "the same turns", "turns": [passing_turn(3)]},
        ),
    ):
        edited = await client.put(
            f"/v1/orgs/{w.t.id}/scenarios/{scenario['id']}", json=change, headers=w.headers
        )
        assert edited.status_code == 200, edited.text
    await make_scenario(client, w, name="new", turns=[passing_turn()], tags=["s"])
    after = await create_batch(client, w, tags=["s"])
    await drain(app, settings, after["id"])

    response = await client.get(
        f"{w.batches}/compare?a={before['id']}&b={after['id']}", headers=w.headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["a"]["id"], body["b"]["id"]) == (before["id"], after["id"])
    assert (body["regressions"], body["fixes"], body["edited"]) == (1, 0, 1)
    rows = [(r["scenario_name"], r["change"]) for r in body["scenarios"]]
    assert rows == [
        ("flaky", "regressed"),
        ("reworded", "edited"),  # passed, then failed: the edit's doing, not a regression
        ("new", "only_in_b"),
        ("renamed again", "unchanged"),
        ("steady", "unchanged"),
    ]
    regressed, edited = body["scenarios"][:2]
    assert (regressed["a"]["status"], regressed["b"]["status"]) == ("passed", "failed")
    assert (edited["a"]["status"], edited["b"]["status"]) == ("passed", "failed")
    assert body["scenarios"][2]["a"] is None
    assert body["scenarios"][4]["scenario_id"] == steady["id"]
    # The other way round, the regression is a fix; the edit is an edit.
    back = await client.get(
        f"{w.batches}/compare?a={after['id']}&b={before['id']}", headers=w.headers
    )
    assert (back.json()["regressions"], back.json()["fixes"], back.json()["edited"]) == (0, 1, 1)
    missing = await client.get(f"{w.batches}/compare?a={before['id']}", headers=w.headers)
    assert single_validation_entry(missing)["loc"] == ["query", "b"]


async def test_a_comparison_tells_errors_from_runs_not_ended_and_links_each_first_run(
    client: AsyncTestClient, app: Litestar, agent: FakeAgent
) -> None:
    """Two scenarios of two repetitions each.  X is cancelled before its dispatch: every run
    ends in error.  Y hands out one run and is cancelled: that run is still in flight, its
    three others end in error.  Neither has a trial, so what tells them apart is how many
    runs errored and how many have not ended."""
    w = await make_world(client, agent)
    for name in ("one", "two"):
        await make_scenario(client, w, name=name, tags=["c"])

    async def cancelled(handed_out: int) -> dict[str, Any]:
        batch = await create_batch(client, w, tags=["c"], repetitions=2, max_concurrency=1)
        if handed_out:
            assert len(await dispatch_committed(app.state.database, UUID(batch["id"]))) == 1
        response = await client.post(f"{w.batches}/{batch['id']}/cancel", headers=w.headers)
        assert response.status_code == 200, response.text
        return await get_batch(client, w, batch["id"])

    x, y = await cancelled(handed_out=0), await cancelled(handed_out=1)
    in_flight = y["runs"][0]  # the first of the batch's order is the one handed out
    assert in_flight["status"] not in ("passed", "failed", "error")
    assert sorted(r["status"] for r in y["runs"][1:]) == ["error"] * 3

    body = (
        await client.get(f"{w.batches}/compare?a={x['id']}&b={y['id']}", headers=w.headers)
    ).json()
    changes = {r["scenario_id"]: r["change"] for r in body["scenarios"]}
    other = next(s for s in changes if s != in_flight["scenario_id"])
    # (2 errors, 0 not ended) against (1, 1): changed; (2, 0) against (2, 0): unchanged.
    assert changes == {in_flight["scenario_id"]: "changed", other: "unchanged"}
    assert all(r["a_trials"] == r["b_trials"] == 0 for r in body["scenarios"])
    assert all(r["p_value"] is None for r in body["scenarios"])
    assert body["pass_rate_difference"] is None  # no scenario with trials on both sides
    # Each side links the scenario's first run in its batch's order.
    for row in body["scenarios"]:
        for side, batch in (("a", x), ("b", y)):
            first = next(r for r in batch["runs"] if r["scenario_id"] == row["scenario_id"])
            assert row[side] == first
    # A batch against itself: every scenario unchanged.
    itself = await client.get(f"{w.batches}/compare?a={y['id']}&b={y['id']}", headers=w.headers)
    assert {r["change"] for r in itself.json()["scenarios"]} == {"unchanged"}
    assert len(itself.json()["scenarios"]) == 2


# --- the dispatch window --------------------------------------------------------------------------


async def test_the_window_hands_out_at_most_max_concurrency_and_refills_one_for_one(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(10):
        await make_scenario(client, w, f"s{n}", tags=["window"])
    batch = await create_batch(client, w, tags=["window"], max_concurrency=3)
    batch_id = UUID(batch["id"])
    database = app.state.database
    order = [UUID(r["id"]) for r in (await get_batch(client, w, batch["id"]))["runs"]]

    first = await dispatch_committed(database, batch_id)
    assert first == order[:3]  # in the batch's order
    assert await in_flight(db, batch_id) == 3
    running = await get_batch(client, w, batch["id"])
    assert running["status"] == "running"
    assert running["started_at"] is not None
    assert await dispatch_committed(database, batch_id) == []
    assert await dispatch_committed(database, batch_id) == []

    # A run's end hands out its successor in the same transaction: the window stays full.
    assert await execute_run(database, settings, first[0]) == [order[3]]
    assert await in_flight(db, batch_id) == 3
    assert await dispatch_committed(database, batch_id) == []

    # The rest, as the workers would; the window never holds more than 3.
    pending = deque([*first[1:], order[3]])
    while pending:
        run_id = pending.popleft()
        assert await in_flight(db, batch_id) <= 3
        pending.extend(await execute_run(database, settings, run_id) or [])
    done = await get_batch(client, w, batch["id"])
    assert done["status"] == "completed"
    assert done["completed_scenarios"] == done["passed_scenarios"] == 10
    assert len(agent.requests) == 10


async def test_concurrent_dispatches_never_exceed_the_window(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(20):
        await make_scenario(client, w, f"s{n}", tags=["race"])
    batch = await create_batch(client, w, tags=["race"], max_concurrency=5)
    batch_id = UUID(batch["id"])
    database = app.state.database

    handed = await asyncio.gather(*(dispatch_committed(database, batch_id) for _ in range(8)))
    ids = [run_id for part in handed for run_id in part]
    assert len(ids) == 5, handed
    assert len(set(ids)) == 5
    assert await in_flight(db, batch_id) == 5

    # Finishing runs and dispatching concurrently: still never more than the window.
    handed = await asyncio.gather(
        *(execute_run(database, settings, r) for r in ids[:3]),
        *(dispatch_committed(database, batch_id) for _ in range(8)),
    )
    assert all(part is not None for part in handed[:3]), handed  # each run ended once
    more = [run_id for part in handed for run_id in part or []]
    assert len(more) == len(set(more)) == 3, handed
    assert not set(more) & set(ids)
    assert await in_flight(db, batch_id) == 5


async def waiting_on_locks(watch: AsyncConnection) -> int:
    """The backends of this database waiting for a lock (a row's) now."""
    waiting = await watch.scalar(
        text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    )
    await watch.commit()  # the statistics are read again, not the transaction's snapshot
    return int(waiting or 0)


async def settle_waiting(watch: AsyncConnection, at_least: int) -> int:
    """The backends waiting for a lock once at least ``at_least`` do and every statement
    that could take a connection has had the time to take one."""
    for _ in range(100):
        if await waiting_on_locks(watch) >= at_least:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    return await waiting_on_locks(watch)


async def test_a_batchs_runs_ending_together_in_a_process_take_its_row_once_per_group(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    """A window's runs end together: the first end of a batch is written alone, those that
    arrive while it waits for the batch's row wait in the process, holding no connection,
    and are then written together: each counted once, each handed one successor."""
    database = app.state.database
    size = database.engine.pool.size()
    w = await make_world(client, agent)
    for n in range(2 * size + 1):
        await make_scenario(client, w, f"s{n}", tags=["queue"])
    batch = await create_batch(client, w, tags=["queue"], max_concurrency=size + 1)
    batch_id = UUID(batch["id"])
    *ending, other = await dispatch_committed(database, batch_id)
    assert len(ending) == size

    # Another transaction holds the batch's row, as a run's end does while it commits.
    await db.execute(select(BatchRun.id).where(BatchRun.id == batch_id).with_for_update())
    first = asyncio.create_task(runner.finish(database, ending[0], "failed", batch_id=batch_id))
    async with database.engine.connect() as watch:
        assert await settle_waiting(watch, 1) == 1
        ends = [
            asyncio.create_task(runner.finish(database, run_id, "passed", batch_id=batch_id))
            for run_id in ending[1:]
        ]
        assert await settle_waiting(watch, 1) == 1  # the others wait in the process
        claimed = await asyncio.wait_for(store.claim(database, settings, other), timeout=5)
        assert claimed is not None and claimed.attempts == 1
    assert not first.done() and not any(end.done() for end in ends)

    await db.commit()
    handed = [await first, *await asyncio.gather(*ends)]
    assert all(len(successors) == 1 for successors in handed), handed
    successors = {run_id for (run_id,) in handed}
    assert len(successors) == size and not successors & {*ending, other}
    assert (
        await db.scalar(
            select(func.count())
            .select_from(ScenarioRun)
            .where(ScenarioRun.batch_run_id == batch_id, ScenarioRun.dispatched_at.is_not(None))
        )
        == 2 * size + 1
    )
    mid = await get_batch(client, w, batch["id"])
    counted = ("completed_scenarios", "failed_scenarios", "passed_scenarios")
    assert [mid["status"], *(mid[key] for key in counted)] == ["running", size, 1, size - 1]
    assert_counts_add_up(mid)


async def test_ends_waiting_on_their_batches_rows_leave_connections_to_the_others(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    """Ends of many batches each queue on their batch's row, each holding a connection
    while it waits: they hold at most half of the pool, so a run handed out meanwhile is
    still claimed, and every end is counted once its row is free."""
    database = app.state.database
    size = database.engine.pool.size()
    w = await make_world(client, agent)
    batches, ending = [], []
    for n in range(size + 1):
        await make_scenario(client, w, f"s{n}", tags=[f"q{n}"])
        batch = await create_batch(client, w, tags=[f"q{n}"], max_concurrency=1)
        batches.append(UUID(batch["id"]))
        ending += await dispatch_committed(database, batches[-1])
    *ending, other = ending
    *batches, _ = batches

    await db.execute(select(BatchRun.id).where(BatchRun.id.in_(batches)).with_for_update())
    ends = [
        asyncio.create_task(runner.finish(database, run_id, "failed", batch_id=batch_id))
        for run_id, batch_id in zip(ending, batches, strict=True)
    ]
    async with database.engine.connect() as watch:
        assert await settle_waiting(watch, size // 2) == size // 2
        claimed = await asyncio.wait_for(store.claim(database, settings, other), timeout=5)
        assert claimed is not None and claimed.attempts == 1
    assert not any(end.done() for end in ends)

    await db.commit()
    assert await asyncio.gather(*ends) == [[]] * size  # nothing left to hand out
    done = (
        await db.execute(
            select(BatchRun.status, BatchRun.completed_scenarios, BatchRun.failed_scenarios).where(
                BatchRun.id.in_(batches)
            )
        )
    ).all()
    assert sorted(tuple(row) for row in done) == [("completed", 1, 1)] * size


async def test_a_group_of_ends_counts_only_the_runs_it_moved(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    db: AsyncSession,
    agent: FakeAgent,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A group written together may hold an end another delivery made first (it changes
    nothing and is not counted), a turn another delivery wrote first or a value the
    database refuses (the group cannot commit: its ends are then written one by one, and
    only that one fails).  Each kind of end goes in a group: a run's last turn, an end, a
    conversation concluded with its criteria's verdicts."""
    database = app.state.database
    w = await make_world(client, agent)
    for n in range(10):
        await make_scenario(client, w, f"s{n}", tags=["group"])
    batch = await create_batch(client, w, tags=["group"], max_concurrency=10)
    batch_id = UUID(batch["id"])
    runs = await dispatch_committed(database, batch_id)
    held, twice, played, concluded, held_again, written, last, held_third, refused, pending = runs
    for run_id in (played, concluded, written):
        assert await store.claim(database, settings, run_id) is not None
    turn = TurnRecord.unplayed  # a turn (a new row each time)
    verdict = CriterionRecord(
        id=uuid.uuid4(),
        criteria_id=uuid.uuid4(),
        order_index=0,
        verdict="PASS",
        critique="",
        evidence="",
    )
    assert await store.record_turn(database, written, turn(0), [], CostSummary()) == []

    async def group(first: UUID, *ends: Any, return_exceptions: bool = False) -> list[Any]:
        """``ends`` written as one group, while the end of ``first`` waits for the batch's row."""
        await db.execute(select(BatchRun.id).where(BatchRun.id == batch_id).with_for_update())
        alone = asyncio.create_task(runner.finish(database, first, "passed", batch_id=batch_id))
        async with database.engine.connect() as watch:
            assert await settle_waiting(watch, 1) == 1
        together = [asyncio.create_task(end) for end in ends]
        await asyncio.sleep(0.1)  # all waiting in the process
        await db.commit()
        return [await alone, *await asyncio.gather(*together, return_exceptions=return_exceptions)]

    caplog.set_level(logging.INFO, logger=store.__name__)

    def one_by_one() -> int:
        return sum("written one by one" in record.getMessage() for record in caplog.records)

    # Two deliveries of one run in one group: the second finds it ended.
    outcomes = await group(
        held,
        runner.finish(database, twice, "failed", batch_id=batch_id),
        runner.finish(database, twice, "error", "late", batch_id=batch_id),
        store.record_turn(
            database, played, turn(0), [], CostSummary(), batch_id=batch_id, end="passed"
        ),
        store.conclude(
            database,
            concluded,
            "passed",
            CostSummary(),
            batch_id=batch_id,
            outcome=None,
            results=[verdict],
        ),
    )
    assert outcomes == [[], [], None, [], []]
    assert one_by_one() == 0
    mid = await get_batch(client, w, batch["id"])
    counted = ("completed_scenarios", "passed_scenarios", "failed_scenarios", "error_scenarios")
    assert [mid[key] for key in counted] == [4, 3, 1, 0]
    judged = select(CriterionResult.criteria_id).where(CriterionResult.run_id == concluded)
    assert list(await db.scalars(judged)) == [verdict.criteria_id]

    # A turn another delivery wrote first: that end is refused, the group's other is counted.
    outcomes = await group(
        held_again,
        store.record_turn(
            database, written, turn(0), [], CostSummary(), batch_id=batch_id, end="passed"
        ),
        runner.finish(database, last, "error", "stopped", batch_id=batch_id),
    )
    assert outcomes == [[], None, []]
    assert one_by_one() == 1
    done = await get_batch(client, w, batch["id"])
    assert [done["status"], *(done[key] for key in counted)] == ["running", 6, 4, 1, 1]
    assert_counts_add_up(done)

    # A value the database refuses in one end (PostgreSQL's text holds no NUL): that end
    # fails, the other end of its group is counted as if it had been written alone.
    outcomes = await group(
        held_third,
        runner.finish(database, refused, "error", "bad\x00value", batch_id=batch_id),
        runner.finish(database, pending, "failed", batch_id=batch_id),
        return_exceptions=True,
    )
    assert outcomes[0] == [] and outcomes[2] == [], outcomes
    assert isinstance(outcomes[1], psycopg.DataError), outcomes
    assert one_by_one() == 2
    done = await get_batch(client, w, batch["id"])
    assert [done["status"], *(done[key] for key in counted)] == ["running", 8, 5, 2, 1]
    assert_counts_add_up(done)
    statuses = await db.execute(
        select(ScenarioRun.id, ScenarioRun.status).where(ScenarioRun.batch_run_id == batch_id)
    )
    assert {run_id: status for run_id, status in statuses} == {
        held: "passed",
        twice: "failed",
        played: "passed",
        concluded: "passed",
        held_again: "passed",
        written: "running",
        last: "error",
        held_third: "passed",
        refused: "pending",
        pending: "failed",
    }


# --- counters -------------------------------------------------------------------------------------


async def test_counters_are_exact_and_the_batch_completes(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    kinds = {
        "pass-a": [passing_turn(0), passing_turn(1)],
        "pass-b": [passing_turn(0)],
        "pass-c": [passing_turn(0), passing_turn(1), passing_turn(2)],
        "fail-a": [passing_turn(0), failing_turn(1)],
        "fail-b": [failing_turn(0)],
        "stop-a": [{**failing_turn(0), "required": True}, passing_turn(1), passing_turn(2)],
        "error-a": [error_turn()],
    }
    for name, turns in kinds.items():
        await make_scenario(client, w, name, tags=["mix"], turns=turns)
    batch = await create_batch(client, w, tags=["mix"], max_concurrency=2)
    database = app.state.database
    pending = deque(await dispatch_committed(database, UUID(batch["id"])))
    while pending:
        pending.extend(await execute_run(database, settings, pending.popleft()) or [])
        assert_counts_add_up(await get_batch(client, w, batch["id"]))

    done = await get_batch(client, w, batch["id"])
    assert done["status"] == "completed", done
    assert done["total_scenarios"] == done["completed_scenarios"] == 7
    assert (done["passed_scenarios"], done["failed_scenarios"], done["error_scenarios"]) == (
        3,
        3,
        1,
    )
    assert_counts_add_up(done)
    assert done["completed_at"] is not None
    assert done["started_at"] is not None
    assert done["started_at"] <= done["completed_at"]
    assert done["error_message"] is None
    summaries = {r["scenario_name"]: r for r in done["runs"]}
    assert {
        n: (r["status"], r["passed_turns"], r["total_turns"]) for n, r in summaries.items()
    } == {
        "pass-a": ("passed", 2, 2),
        "pass-b": ("passed", 1, 1),
        "pass-c": ("passed", 3, 3),
        "fail-a": ("failed", 1, 2),
        "fail-b": ("failed", 0, 1),
        "stop-a": ("failed", 0, 3),  # its two skipped turns count in total_turns only
        "error-a": ("error", 0, 1),
    }
    # The summaries agree with the runs' own turn results, skipped turns included.
    for name, summary in summaries.items():
        run = await client.get(f"{w.runs}/{summary['id']}", headers=w.headers)
        results = run.json()["turn_results"]
        assert summary["passed_turns"] == sum(r["status"] == "passed" for r in results), name
        if summary["status"] != "error":
            assert summary["total_turns"] == len(results), name
    stopped = await client.get(f"{w.runs}/{summaries['stop-a']['id']}", headers=w.headers)
    assert [r["status"] for r in stopped.json()["turn_results"]] == ["failed", "skipped", "skipped"]
    # The counters match the runs themselves.
    statuses = [r["status"] for r in done["runs"]]
    assert statuses.count("passed") == done["passed_scenarios"]
    assert statuses.count("failed") == done["failed_scenarios"]
    assert statuses.count("error") == done["error_scenarios"]

    # Executing terminal runs again (a redelivered message) counts nothing and calls no one.
    calls = len(agent.requests)
    for summary in done["runs"]:
        assert await execute_run(database, settings, UUID(summary["id"])) is None
        assert await runner.finish(database, UUID(summary["id"]), "passed") is None
    again = await get_batch(client, w, batch["id"])
    assert {k: again[k] for k in BATCH_FIELDS} == {k: done[k] for k in BATCH_FIELDS}
    assert len(agent.requests) == calls


async def test_finishing_a_run_twice_counts_it_once(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(3):
        await make_scenario(client, w, f"s{n}", tags=["twice"])
    batch = await create_batch(client, w, tags=["twice"], max_concurrency=3)
    batch_id = UUID(batch["id"])
    database = app.state.database
    first, second, third = await dispatch_committed(database, batch_id)

    # Two deliveries racing to finish the same run: one of them counts it.
    results = await asyncio.gather(*(runner.finish(database, first, "failed") for _ in range(4)))
    # One counted it (nothing left to hand out in its place); the others changed nothing.
    assert results.count([]) == 1 and results.count(None) == 3, results
    assert await runner.finish(database, first, "passed") is None
    mid = await get_batch(client, w, batch["id"])
    assert (mid["completed_scenarios"], mid["failed_scenarios"], mid["passed_scenarios"]) == (
        1,
        1,
        0,
    )
    assert mid["status"] == "running"

    # A run executed by two deliveries at once is counted once too.
    outcomes = await asyncio.gather(
        execute_run(database, settings, second), execute_run(database, settings, second)
    )
    assert outcomes.count([]) == 1 and outcomes.count(None) == 1, outcomes
    assert await execute_run(database, settings, third) == []
    done = await get_batch(client, w, batch["id"])
    assert done["status"] == "completed"
    assert (done["completed_scenarios"], done["passed_scenarios"], done["failed_scenarios"]) == (
        3,
        2,
        1,
    )
    assert_counts_add_up(done)


# --- cancel ---------------------------------------------------------------------------------------


async def test_cancel_stops_dispatch_and_still_counts_runs_in_flight(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(5):
        await make_scenario(client, w, f"s{n}", tags=["cancel"])
    batch = await create_batch(client, w, tags=["cancel"], max_concurrency=2)
    batch_id = UUID(batch["id"])
    database = app.state.database
    handed = await dispatch_committed(database, batch_id)
    assert len(handed) == 2

    response = await client.post(f"{w.batches}/{batch['id']}/cancel", headers=w.headers)
    assert response.status_code == 200, response.text
    cancelled = response.json()
    assert cancelled["status"] == "error"
    assert cancelled["error_message"] == "cancelled"
    assert cancelled["completed_at"] is not None
    # The three never handed out end as cancelled errors, counted.
    assert cancelled["total_scenarios"] == 5
    assert cancelled["completed_scenarios"] == cancelled["error_scenarios"] == 3
    assert_counts_add_up(cancelled)

    read = await get_batch(client, w, batch["id"])
    by_id = {UUID(r["id"]): r for r in read["runs"]}
    assert [by_id[r]["status"] for r in handed] == ["pending", "pending"]
    rest = [r for r in by_id if r not in handed]
    assert [by_id[r]["status"] for r in rest] == ["error"] * 3
    for run_id in rest:
        run = await client.get(f"/v1/orgs/{w.t.id}/scenarios/runs/{run_id}", headers=w.headers)
        assert run.json()["error_message"] == "cancelled"
        assert run.json()["completed_at"] is not None

    # Nothing more is handed out, even once the window frees up.
    assert await dispatch_committed(database, batch_id) == []
    assert await execute_run(database, settings, handed[0]) == []  # counted, no successor
    assert await dispatch_committed(database, batch_id) == []
    after_one = await get_batch(client, w, batch["id"])
    assert after_one["completed_scenarios"] == 4
    assert after_one["passed_scenarios"] == 1
    assert after_one["status"] == "error"
    assert_counts_add_up(after_one)
    await execute_run(database, settings, handed[1])
    final = await get_batch(client, w, batch["id"])
    assert final["status"] == "error"
    assert final["error_message"] == "cancelled"
    assert final["completed_scenarios"] == final["total_scenarios"] == 5
    assert (final["passed_scenarios"], final["failed_scenarios"], final["error_scenarios"]) == (
        2,
        0,
        3,
    )
    assert all(r["status"] in TERMINAL for r in final["runs"])
    assert await in_flight(db, batch_id) == 0
    assert len(agent.requests) == 2  # the cancelled runs never reached the agent

    again = await client.post(f"{w.batches}/{batch['id']}/cancel", headers=w.headers)
    assert again.status_code == 409, again.text
    assert set(again.json()) == {"detail"}


async def test_a_completed_batch_cannot_be_cancelled(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, tags=["done"])
    batch = await create_batch(client, w, tags=["done"])
    await drain(app, settings, batch["id"])
    assert (await get_batch(client, w, batch["id"]))["status"] == "completed"
    response = await client.post(f"{w.batches}/{batch['id']}/cancel", headers=w.headers)
    assert response.status_code == 409, response.text
    done = await get_batch(client, w, batch["id"])
    assert done["status"] == "completed"
    assert done["error_message"] is None


async def test_a_cancel_racing_with_runs_ending_neither_deadlocks_nor_miscounts(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    """A run's end locks its successor, then the batch row; a cancel locks the runs it
    cancels, then the batch row.  Racing, they must neither deadlock nor lose a count."""
    w = await make_world(client, agent)
    for n in range(30):
        await make_scenario(client, w, f"s{n}", tags=["race-cancel"])
    batch = await create_batch(client, w, tags=["race-cancel"], max_concurrency=6)
    batch_id = UUID(batch["id"])
    database = app.state.database
    handed = await dispatch_committed(database, batch_id)

    # The service itself, in this event loop, so that it truly interleaves with the runs (a
    # request through the test client would block this loop until answered).
    access = OrgAccess(
        principal=Principal(kind="user", token_id=uuid.uuid4(), user_id=uuid.uuid4()),
        organization_id=UUID(w.t.id),
        permissions=frozenset({"scenarios:run"}),
    )

    async def cancel() -> str:
        await asyncio.sleep(0.005)
        async with database.transaction() as session:
            return (
                await batch_services.cancel_batch(session, access=access, batch_id=batch_id)
            ).status

    *ended, status = await asyncio.gather(
        *(execute_run(database, settings, run_id) for run_id in handed), cancel()
    )

    assert status == "error"
    successors = [run_id for part in ended for run_id in part or []]
    for run_id in successors:  # handed out before the cancel: they run and are counted
        await execute_run(database, settings, run_id)
    final = await get_batch(client, w, batch["id"])
    assert final["status"] == "error" and final["error_message"] == "cancelled"
    assert final["completed_scenarios"] == final["total_scenarios"] == 30, final
    assert final["passed_scenarios"] == len(handed) + len(successors)
    assert final["error_scenarios"] == 30 - len(handed) - len(successors)
    assert_counts_add_up(final)
    assert await in_flight(db, batch_id) == 0
    statuses = [r["status"] for r in final["runs"]]
    assert statuses.count("passed") == final["passed_scenarios"]


# --- snapshots ------------------------------------------------------------------------------------


async def test_a_batch_runs_snapshot_is_the_one_a_single_run_takes(
    client: AsyncTestClient, app: Litestar, db: AsyncSession, agent: FakeAgent
) -> None:
    """PostgreSQL builds a batch's snapshots itself (one INSERT … SELECT); a single run's is
    built in Python.  Both must be the same document."""
    w = await make_world(client, agent)
    rich = {
        "name": "rich ünïcode scenario",
        "tags": ["snap"],
        "customer_context": {"name": "Ada", "booking": {"id": "B-1", "nights": 3}, "vip": True},
        "turns": [
            {
                "user_message": "Hi {{ name }}, about {{ booking.id }}",
                "required": True,
                "criteria": [
                    {
                        "question": "Does it greet [q:a]?",
                        "criteria_type": "llm_evaluated",
                        "few_shot_examples": [
                            {"response": "Hello!", "verdict": "PASS", "critique": "greets"},
                            {"response": "What?", "verdict": "FAIL", "critique": "rude"},
                        ],
                    },
                    {"question": "B-\\d+", "criteria_type": "regex"},
                ],
            },
            {"user_message": "No criteria here", "required": False, "criteria": []},
            {
                "user_message": "Bye",
                "criteria": [{"question": "bye", "criteria_type": "not_contains"}],
            },
        ],
    }
    made = await client.post(f"/v1/orgs/{w.t.id}/scenarios", json=rich, headers=w.headers)
    assert made.status_code == 201, made.text
    single = await client.post(
        f"/v1/orgs/{w.t.id}/scenarios/{made.json()['id']}/run",
        json={"agent_id": w.agent_id},
        headers=w.headers,
    )
    assert single.status_code == 201, single.text
    batch = await create_batch(client, w, tags=["snap"])

    stored = dict(
        (
            await db.execute(
                select(ScenarioRun.batch_run_id.is_(None), ScenarioRun.snapshot).where(
                    ScenarioRun.scenario_id == UUID(made.json()["id"])
                )
            )
        ).all()
    )
    await db.commit()
    assert stored[True] == stored[False]
    assert [t["user_message"] for t in stored[False]["turns"]] == [
        "Hi {{ name }}, about {{ booking.id }}",
        "No criteria here",
        "Bye",
    ]
    assert stored[False]["turns"][1]["criteria"] == []
    assert stored[False]["turns"][0]["criteria"][0]["few_shot_examples"][1]["verdict"] == "FAIL"
    assert (await get_batch(client, w, batch["id"]))["runs"][0]["total_turns"] == 3


# --- the sweeper ----------------------------------------------------------------------------------


async def push_back(
    db: AsyncSession, run_ids: list[str], seconds: float = 120, **values: Any
) -> None:
    await db.execute(
        update(ScenarioRun)
        .where(ScenarioRun.id.in_([UUID(r) for r in run_ids]))
        .values(updated_at=utcnow() - timedelta(seconds=seconds), **values)
    )
    await db.commit()


async def start_single_run(client: AsyncTestClient, w: World, scenario_id: str) -> str:
    response = await client.post(
        f"/v1/orgs/{w.t.id}/scenarios/{scenario_id}/run",
        json={"agent_id": w.agent_id},
        headers=w.headers,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def test_the_sweeper_resends_stalled_runs_and_refills_active_batches(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    scenario = await make_scenario(client, w, tags=["sweep"])
    for n in range(2):
        await make_scenario(client, w, f"more {n}", tags=["sweep"])
    database = app.state.database
    broker = stub_broker()
    thirty = msgspec.structs.replace(settings, run_stall_s=30.0)

    stalled_pending = await start_single_run(client, w, scenario["id"])
    stalled_running = await start_single_run(client, w, scenario["id"])
    fresh = await start_single_run(client, w, scenario["id"])
    old_but_done = await start_single_run(client, w, scenario["id"])
    await push_back(db, [stalled_pending])
    await push_back(db, [stalled_running], status="running")
    await push_back(db, [old_but_done], status="passed")

    batch = await create_batch(client, w, tags=["sweep"], max_concurrency=1)
    batch_runs = [r["id"] for r in (await get_batch(client, w, batch["id"]))["runs"]]
    assert len(batch_runs) == 3
    # Old but never handed out: the window's to dispatch, not the sweeper's to re-send.
    await push_back(db, batch_runs)

    assert await sweep(database, broker, thirty) == (2, 1)
    sent = sent_runs(broker)
    assert sorted(sent) == sorted([stalled_pending, stalled_running, batch_runs[0]])
    assert fresh not in sent and old_but_done not in sent
    assert (await get_batch(client, w, batch["id"]))["status"] == "running"
    assert await in_flight(db, batch["id"]) == 1

    # The re-sent runs were touched: the next pass waits a full stall period; the window is full.
    assert await sweep(database, broker, thirty) == (0, 0)
    assert sent_runs(broker) == []

    # The dispatched batch run makes no progress (its message was lost): it is re-sent.
    await push_back(db, [batch_runs[0]])
    assert await sweep(database, broker, thirty) == (1, 0)
    assert sent_runs(broker) == [batch_runs[0]]

    # A run's end hands out its successor; if the worker dies before sending it, the
    # successor makes no progress and is re-sent like any stalled run.
    assert await runner.finish(database, UUID(batch_runs[0]), "passed") == [UUID(batch_runs[1])]
    assert await sweep(database, broker, thirty) == (0, 0)
    await push_back(db, [batch_runs[1]])
    assert await sweep(database, broker, thirty) == (1, 0)
    assert sent_runs(broker) == [batch_runs[1]]

    # A re-sent run executes normally; nothing is lost or doubled.
    await execute_run(database, settings, UUID(stalled_running))
    run = await client.get(f"/v1/orgs/{w.t.id}/scenarios/runs/{stalled_running}", headers=w.headers)
    assert run.json()["status"] == "passed", run.text


async def test_a_handed_out_batch_run_whose_message_was_lost_is_resent_after_the_heartbeat_timeout(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    """A batch run is handed out by its predecessor's end and its message sent right after
    the commit: a worker killed in between loses the message.  It is expected to start at
    once, so the sweeper sends it again once it made no progress for the heartbeat timeout,
    not the stall period; a run outside a batch waits the stall period as before."""
    w = await make_world(client, agent)
    scenario = await make_scenario(client, w, tags=["handed"])
    await make_scenario(client, w, "second", tags=["handed"])
    database = app.state.database
    broker = stub_broker()
    timing = msgspec.structs.replace(settings, run_stall_s=300.0, run_heartbeat_timeout_s=30.0)
    single = await start_single_run(client, w, scenario["id"])
    batch = await create_batch(client, w, tags=["handed"], max_concurrency=1)
    first, second = [r["id"] for r in (await get_batch(client, w, batch["id"]))["runs"]]
    assert await runner.finish(database, UUID(first), "passed") == [UUID(second)]
    sent_runs(broker)  # what creating them sent
    await push_back(db, [second, single], seconds=40)  # past the heartbeat timeout only
    assert await sweep(database, broker, timing) == (1, 0)
    assert sent_runs(broker) == [second]
    await push_back(db, [single], seconds=400)  # past the stall period
    assert await sweep(database, broker, timing) == (1, 0)
    assert sent_runs(broker) == [single]


async def test_the_sweeper_ignores_finished_and_cancelled_batches(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(3):
        await make_scenario(client, w, f"s{n}", tags=["idle"])
    done = await create_batch(client, w, tags=["idle"], max_concurrency=1)
    await drain(app, settings, done["id"])
    cancelled = await create_batch(client, w, tags=["idle"], max_concurrency=1)
    response = await client.post(f"{w.batches}/{cancelled['id']}/cancel", headers=w.headers)
    assert response.status_code == 200, response.text
    every = [
        r["id"] for b in (done, cancelled) for r in (await get_batch(client, w, b["id"]))["runs"]
    ]
    await push_back(db, every)
    broker = stub_broker()
    thirty = msgspec.structs.replace(settings, run_stall_s=30.0)
    assert await sweep(app.state.database, broker, thirty) == (0, 0)
    assert sent_runs(broker) == []


# --- live progress (SSE) --------------------------------------------------------------------------


async def test_events_of_a_finished_batch_stream_every_run_then_end(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(4):
        await make_scenario(client, w, f"s{n}", tags=["sse"])
    await make_scenario(client, w, "bad", tags=["sse"], turns=[failing_turn()])
    batch = await create_batch(client, w, tags=["sse"], max_concurrency=2)
    await drain(app, settings, batch["id"])
    final = await get_batch(client, w, batch["id"])

    events = await read_events(client, w, batch["id"])
    names = [name for name, _ in events]
    assert names[-1] == "end", names
    assert names.count("end") == 1
    assert "progress" in names
    runs = [data for name, data in events if name == "run"]
    assert sorted(r["id"] for r in runs) == sorted(r["id"] for r in final["runs"])
    by_id = {r["id"]: r for r in final["runs"]}
    for run in runs:
        # Each event is the batch detail's summary of the run: name and turn counts too.
        assert run == by_id[run["id"]]
        assert set(run) == SUMMARY_FIELDS
        assert run["completed_at"] is not None
    assert sorted((r["scenario_name"], r["passed_turns"], r["total_turns"]) for r in runs) == [
        ("bad", 0, 1),
        ("s0", 1, 1),
        ("s1", 1, 1),
        ("s2", 1, 1),
        ("s3", 1, 1),
    ]
    end = events[-1][1]
    assert end["status"] == "completed"
    assert end["completed_scenarios"] == end["total_scenarios"] == 5
    assert (end["passed_scenarios"], end["failed_scenarios"]) == (4, 1)
    progress = [data for name, data in events if name == "progress"]
    assert progress[-1]["completed_scenarios"] == 5


async def test_events_follow_a_batch_live_until_it_ends(
    client: AsyncTestClient, settings: Settings, agent: FakeAgent
) -> None:
    w = await make_world(client, agent)
    for n in range(4):
        await make_scenario(client, w, f"s{n}", tags=["live"])
    batch = await create_batch(client, w, tags=["live"], max_concurrency=1)

    async def work(database: Any) -> None:
        # One run at a time, slower than the stream polls (every 0.5 s), so each step shows.
        await asyncio.sleep(1.0)
        pending = deque(await dispatch_committed(database, UUID(batch["id"])))
        while pending:
            pending.extend(await execute_run(database, settings, pending.popleft()) or [])
            await asyncio.sleep(1.0)

    with Background(settings, batch["id"], work):
        events = await read_events(client, w, batch["id"])
    names = [name for name, _ in events]
    assert names[0] == "progress", names
    assert events[0][1]["status"] == "queued"
    assert names[-1] == "end" and names.count("end") == 1, names
    assert events[-1][1]["status"] == "completed"
    assert events[-1][1]["completed_scenarios"] == 4
    # Counts streamed as they changed (the stream polls every 0.5 s and runs end 1 s
    # apart, so intermediate steps show), never going back, never repeated.
    progress = [data for name, data in events if name == "progress"]
    completed = [p["completed_scenarios"] for p in progress]
    assert completed == sorted(completed), completed
    assert completed[0] == 0 and completed[-1] == 4, completed
    assert len(set(completed)) >= 4, completed
    assert all(a != b for a, b in itertools.pairwise(progress)), "a repeated event"
    # Every finished run reported once.
    runs = [data["id"] for name, data in events if name == "run"]
    assert len(runs) == len(set(runs)) == 4


async def test_events_of_a_cancelled_batch_report_the_runs_still_in_flight(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    """After a cancel, the runs in flight still finish and are counted (§5.3): the stream
    reports them too ("an event per finished run", counts "on every change"), and its final
    event carries the final counts."""
    w = await make_world(client, agent)
    for n in range(5):
        await make_scenario(client, w, f"s{n}", tags=["cancel-live"])
    batch = await create_batch(client, w, tags=["cancel-live"], max_concurrency=2)
    handed = await dispatch_committed(app.state.database, UUID(batch["id"]))
    assert len(handed) == 2
    response = await client.post(f"{w.batches}/{batch['id']}/cancel", headers=w.headers)
    assert response.status_code == 200, response.text

    async def finish_in_flight(database: Any) -> None:
        await asyncio.sleep(1.0)
        for run_id in handed:
            await execute_run(database, settings, run_id)

    with Background(settings, batch["id"], finish_in_flight):
        events = await read_events(client, w, batch["id"])
    final = await get_batch(client, w, batch["id"])
    assert final["completed_scenarios"] == 5, final
    runs = [data["id"] for name, data in events if name == "run"]
    assert events[-1][0] == "end"
    assert events[-1][1]["completed_scenarios"] == 5, events[-1]
    assert sorted(runs) == sorted(r["id"] for r in final["runs"]), events


# --- bulk -----------------------------------------------------------------------------------------

BULK = 5_000


async def insert_scenarios(db: AsyncSession, org_id: str, count: int, tag: str) -> list[UUID]:
    """``count`` one-turn scenarios straight into the tables (5,000 POSTs would take minutes)."""
    now = utcnow()
    org = UUID(org_id)
    scenario_ids = [uuid.uuid4() for _ in range(count)]
    turn_ids = [uuid.uuid4() for _ in range(count)]
    await db.execute(
        insert(Scenario),
        [
            {
                "id": sid,
                "organization_id": org,
                "name": f"bulk {n}",
                "description": None,
                "tags": [tag],
                "customer_context": {},
                "created_at": now + timedelta(microseconds=n),
                "updated_at": now,
            }
            for n, sid in enumerate(scenario_ids)
        ],
    )
    await db.execute(
        insert(ScenarioTurn),
        [
            {
                "id": tid,
                "scenario_id": sid,
                "order_index": 0,
                "user_message": "hello",
                "required": False,
            }
            for sid, tid in zip(scenario_ids, turn_ids, strict=True)
        ],
    )
    await db.execute(
        insert(Criterion),
        [
            {
                "id": uuid.uuid4(),
                "turn_id": tid,
                "order_index": 0,
                "question": "hello",
                "criteria_type": "contains",
                "few_shot_examples": [],
            }
            for tid in turn_ids
        ],
    )
    await db.commit()
    return scenario_ids


@pytest.mark.parametrize("by", ["tags", "scenario_ids"])
async def test_a_5000_scenario_batch_is_created_by_one_request_with_every_run(
    client: AsyncTestClient, app: Litestar, db: AsyncSession, agent: FakeAgent, by: str
) -> None:
    w = await make_world(client, agent)
    warm = await make_scenario(client, w, "warm-up")
    await create_batch(client, w, scenario_ids=[warm["id"]])  # first-request costs aside
    ids = await insert_scenarios(db, w.t.id, BULK, "bulk")
    body = {"tags": ["bulk"]} if by == "tags" else {"scenario_ids": [str(i) for i in ids]}

    # How fast is bench/batch.py's to say ("submit answered in"): speed is measured there,
    # against a baseline of the same run, never by a timed test.
    response = await client.post(
        f"{w.batches}/",
        json={"agent_id": w.agent_id, "max_concurrency": 100, **body},
        headers=w.headers,
    )
    assert response.status_code == 201, response.text
    batch = response.json()
    assert batch["status"] == "queued"
    assert batch["total_scenarios"] == BULK

    runs = await db.scalar(
        select(func.count())
        .select_from(ScenarioRun)
        .where(ScenarioRun.batch_run_id == UUID(batch["id"]), ScenarioRun.status == "pending")
    )
    scenarios = await db.scalar(
        select(func.count(func.distinct(ScenarioRun.scenario_id))).where(
            ScenarioRun.batch_run_id == UUID(batch["id"])
        )
    )
    stored = await db.get(BatchRun, UUID(batch["id"]))
    await db.commit()
    assert runs == scenarios == BULK
    assert stored is not None and stored.total_scenarios == BULK
    # The window holds at most max_concurrency of them.
    handed = await dispatch_committed(app.state.database, UUID(batch["id"]))
    assert len(handed) == 100
    read = await get_batch(client, w, batch["id"])
    assert len(read["runs"]) == BULK
    assert sum(r["total_turns"] for r in read["runs"]) == BULK
