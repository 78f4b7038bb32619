"""Repetitions, pass^k, baselines and significance (DESIGN §5.11): each scenario of a batch
run k times under one window, the exact pass^j of known failure shares, the comparison of
a batch with its baseline (exact Fisher p-values, the paired bootstrap interval) stored
once, and a ``batch_run`` trigger's previous batch as the next one's baseline.

The agent (:class:`FakeFlakyAgent`) fails exactly m of every n conversations of a scenario
whose message carries ``[fails m/n]``, whatever order they arrive in, so the counts are
exact while the runs are played as the workers play them (:func:`drain`)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from fractions import Fraction
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from scheduler.sweeper import sweep
from shared.batches import services as batch_services
from shared.batches.comparisons import store_due
from shared.batches.window import dispatch_committed
from shared.db.models import BatchRun, ScenarioRun
from shared.identity.access import OrgAccess, Principal
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from shared.triggers.executions import execute
from tests.support.batches import (
    World,
    create_batch,
    drain,
    error_turn,
    get_batch,
    make_scenario,
    make_world,
)
from tests.support.factories import single_validation_entry, stub_broker
from tests.support.fakes import FakeFlakyAgent
from tests.support.triggers import create, path, scheduled


@pytest.fixture
def agent() -> Iterator[FakeFlakyAgent]:
    with FakeFlakyAgent() as fake:
        yield fake


def turn(message: str) -> dict[str, Any]:
    """A turn that passes when the agent echoes it (``Echo: hello …``) and fails when it
    answers :attr:`FakeFlakyAgent.FAILING`."""
    return {
        "user_message": message,
        "criteria": [{"question": "hello", "criteria_type": "contains"}],
    }


async def suite(client: AsyncTestClient, w: World, tag: str, shares: dict[str, str]) -> None:
    """A scenario per name, its message failing the given share (``"1/4"``; ``""``: never;
    ``"error"``: every run ends in error before calling the agent)."""
    for name, share in shares.items():
        turns = [error_turn()] if share == "error" else [turn(f"hello {name} [fails {share}]")]
        if share == "":
            turns = [turn(f"hello {name}")]
        await make_scenario(client, w, name, tags=[tag], turns=turns)


def by_name(read: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["scenario_name"]: s for s in read["scenarios"]}


async def test_each_scenario_runs_k_times_and_pass_hat_k_is_exact(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: Any
) -> None:
    w = await make_world(client, agent)
    # Four trials each: 4/4, 3/4, 2/4 and 0/4 pass; "crash" errors every time (no trial).
    await suite(
        client,
        w,
        "k",
        {"steady": "", "flaky": "1/4", "half": "2/4", "broken": "4/4", "crash": "error"},
    )
    made = await create_batch(client, w, tags=["k"], repetitions=4, max_concurrency=3)
    assert (made["repetitions"], made["total_scenarios"]) == (4, 20)  # counters count runs

    # One window for all the runs: three handed out, the first run of three scenarios.
    database = app.state.database
    first = await dispatch_committed(database, UUID(made["id"]))
    assert len(first) == 3
    scenario_of = {
        run.id: run.scenario_id
        for run in await db.scalars(
            select(ScenarioRun).where(ScenarioRun.batch_run_id == UUID(made["id"]))
        )
    }
    await db.commit()
    assert len({scenario_of[run_id] for run_id in first}) == 3
    pending = list(first)
    while pending:
        pending.extend(await execute_run(database, settings, pending.pop(0)) or [])

    read = await get_batch(client, w, made["id"])
    assert read["status"] == "completed"
    counters = [read[f"{c}_scenarios"] for c in ("total", "completed", "passed", "failed", "error")]
    assert counters == [20, 20, 9, 7, 4]
    assert Counter(r["scenario_name"] for r in read["runs"]) == dict.fromkeys(
        ("steady", "flaky", "half", "broken", "crash"), 4
    )
    # Each run its own conversation.
    runs = await client.get(f"{w.runs}?batch_run_id={made['id']}&limit=100", headers=w.headers)
    sessions = {run["session_id"] for run in runs.json()["runs"]}
    assert len(sessions) == 20 and len(agent.requests) == 16  # crash never calls the agent

    trials = {
        name: (s["trials"], s["passes"], s["errors"], s["flaky"])
        for name, s in by_name(read).items()
    }
    assert trials == {
        "steady": (4, 4, 0, False),
        "flaky": (4, 3, 0, True),
        "half": (4, 2, 0, True),
        "broken": (4, 0, 0, False),
        "crash": (0, 0, 4, False),  # an error is no trial: it says nothing about the agent
    }
    # The hand-worked table of tests/unit/test_reliability.py: crash has no trial and
    # counts nowhere.
    assert read["pass_hat_k"] == pytest.approx([9 / 16, 5 / 12, 5 / 16, 1 / 4])
    assert read["pass_at_k"] == pytest.approx(3 / 4)
    assert read["flaky_scenarios"] == 2


@pytest.mark.parametrize(
    ("repetitions", "kind"),
    [(0, "constraint"), (21, "constraint"), (1.5, "type"), ("two", "type"), (None, "type")],
)
async def test_repetitions_out_of_range_or_not_an_integer_are_422(
    client: AsyncTestClient, agent: Any, repetitions: Any, kind: str
) -> None:
    w = await make_world(client, agent)
    await make_scenario(client, w, tags=["k"])
    response = await client.post(
        f"{w.batches}/",
        json={"agent_id": w.agent_id, "tags": ["k"], "repetitions": repetitions},
        headers=w.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "repetitions"]
    assert entry["input"] == repetitions
    if kind == "constraint":
        assert entry["ctx"] in ({"ge": 1}, {"le": 20})
    listed = await client.get(f"{w.batches}/", headers=w.headers)
    assert listed.json()["total"] == 0  # nothing made


async def test_a_baseline_is_a_batch_of_the_same_organization_and_agent(
    client: AsyncTestClient, agent: Any
) -> None:
    w = await make_world(client, agent)
    other = await make_world(client, agent)
    await make_scenario(client, w, tags=["k"])
    await make_scenario(client, other, tags=["k"])
    theirs = await create_batch(client, other, tags=["k"])
    second = await client.post(
        f"/v1/orgs/{w.t.id}/agents",
        json={"name": "bot two", "kind": "http", "endpoint_url": f"{agent.url}/chat"},
        headers=w.headers,
    )
    of_another_agent = await create_batch(client, w, tags=["k"], agent_id=second.json()["id"])

    async def attempt(baseline: str) -> Any:
        return await client.post(
            f"{w.batches}/",
            json={"agent_id": w.agent_id, "tags": ["k"], "baseline_batch_id": baseline},
            headers=w.headers,
        )

    # Another organization's batch reads as a missing one.
    for missing in (theirs["id"], str(uuid.uuid4())):
        response = await attempt(missing)
        assert response.status_code == 404, response.text
        assert response.json() == {"detail": "baseline batch run not found"}
    entry = single_validation_entry(await attempt(of_another_agent["id"]))
    assert entry["loc"] == ["body", "baseline_batch_id"]
    assert entry["input"] == of_another_agent["id"] and "another agent" in entry["msg"]
    assert single_validation_entry(await attempt("not-a-uuid"))["loc"] == [
        "body",
        "baseline_batch_id",
    ]
    listed = await client.get(f"{w.batches}/", headers=w.headers)
    assert listed.json()["total"] == 1  # only the other agent's batch

    mine = await create_batch(client, w, tags=["k"])
    follow = await create_batch(client, w, tags=["k"], baseline_batch_id=mine["id"])
    assert follow["baseline_batch_id"] == mine["id"]
    filtered = await client.get(f"{w.batches}/?agent_id={w.agent_id}", headers=w.headers)
    assert [b["id"] for b in filtered.json()["batch_runs"]] == [mine["id"], follow["id"]]
    # Both filters at once: each narrows the other's rows, and the total is the narrowed one.
    by_agent = f"{w.batches}/?agent_id={second.json()['id']}"
    both = (await client.get(f"{by_agent}&status=queued", headers=w.headers)).json()
    assert [b["id"] for b in both["batch_runs"]] == [of_another_agent["id"]]
    assert both["total"] == 1
    none = (await client.get(f"{by_agent}&status=completed", headers=w.headers)).json()
    assert none == {"batch_runs": [], "total": 0}


async def test_a_comparison_with_its_baseline_has_exact_p_values_and_is_stored_once(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: Any
) -> None:
    w = await make_world(client, agent)
    # [fails m/8]: the last m of every 8 conversations fail, so each scenario's 4 runs in
    # the baseline all pass and m of its 4 in the next batch fail: 0/4, 3/4, 1/4 and 4/4.
    await suite(
        client, w, "k", {"lost": "4/8", "dipped": "1/8", "mostly lost": "3/8", "steady": ""}
    )
    baseline = await create_batch(client, w, tags=["k"], repetitions=4)
    await drain(app, settings, baseline["id"])
    candidate = await create_batch(
        client, w, tags=["k"], repetitions=4, baseline_batch_id=baseline["id"]
    )
    await drain(app, settings, candidate["id"])
    row = await db.get(BatchRun, UUID(candidate["id"]))
    assert row is not None and row.status == "completed" and row.comparison is None
    await db.commit()

    compared = await client.get(
        f"{w.batches}/compare?a={baseline['id']}&b={candidate['id']}", headers=w.headers
    )
    body = compared.json()
    rows = {r["scenario_name"]: r for r in body["scenarios"]}
    expected = {
        # 4/4 against 0/4: Fisher's tea table, 1/70.
        "lost": ("regressed", 4, 4, 4, 0, Fraction(1, 70), True),
        # 4/4 against 1/4: C(5,4)/C(8,4) = 5/70.
        "mostly lost": ("regressed", 4, 4, 4, 1, Fraction(5, 70), False),
        # 4/4 against 3/4: C(7,4)/C(8,4) = 35/70.
        "dipped": ("regressed", 4, 4, 4, 3, Fraction(35, 70), False),
        "steady": ("unchanged", 4, 4, 4, 4, Fraction(1), False),
    }
    for name, (change, a_trials, a_passes, b_trials, b_passes, p, significant) in expected.items():
        got = rows[name]
        assert (got["change"], got["a_trials"], got["a_passes"]) == (change, a_trials, a_passes)
        assert (got["b_trials"], got["b_passes"], got["significant"]) == (
            b_trials,
            b_passes,
            significant,
        )
        assert got["p_value"] == pytest.approx(float(p), rel=1e-12), name
    assert [r["scenario_name"] for r in body["scenarios"]] == [
        "dipped",
        "lost",
        "mostly lost",
        "steady",
    ]
    assert (body["regressions"], body["significant_regressions"]) == (3, 1)
    # The pairs' differences, B - A: -1, -3/4, -1/4 and 0: a mean of -1/2.
    difference = body["pass_rate_difference"]
    assert difference["difference"] == pytest.approx(-0.5)
    assert difference["low"] <= -0.5 <= difference["high"] <= 0
    assert (difference["pairs"], difference["resamples"], difference["seed"]) == (4, 2000, 0)

    # The sweeper's pass stores it (nobody has read the batch), once.
    await sweep(app.state.database, stub_broker(), settings)
    row = await db.get(BatchRun, UUID(candidate["id"]), populate_existing=True)
    assert row is not None and row.comparison is not None
    await db.commit()
    assert await store_due(app.state.database) == 0
    stored = (await get_batch(client, w, candidate["id"]))["comparison"]
    assert stored["baseline_batch_id"] == baseline["id"]
    assert (stored["regressions"], stored["significant_regressions"]) == (3, 1)
    assert stored["pass_rate_difference"] == difference  # seeded: the same interval
    assert {r["scenario_name"]: r["p_value"] for r in stored["scenarios"]} == {
        name: rows[name]["p_value"] for name in ("dipped", "lost", "mostly lost")
    }  # the unchanged are left out
    again = (await get_batch(client, w, candidate["id"]))["comparison"]
    assert again == stored  # never computed anew


async def test_a_comparison_waits_for_a_baseline_still_running_and_the_first_read_stores_it(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: Any
) -> None:
    w = await make_world(client, agent)
    await suite(client, w, "k", {"lost": "2/4"})
    baseline = await create_batch(client, w, tags=["k"], repetitions=2)
    candidate = await create_batch(
        client, w, tags=["k"], repetitions=2, baseline_batch_id=baseline["id"]
    )
    await drain(app, settings, candidate["id"])  # its runs arrive first: 2 of 2 pass
    done = await get_batch(client, w, candidate["id"])
    assert done["status"] == "completed" and done["comparison"] is None  # baseline not over
    assert await store_due(app.state.database) == 0
    # Its judge trust asked for by that read, reading it again finds no write due while
    # the baseline runs: read as it is, without a transaction (``None`` would say "write").
    access = OrgAccess(
        principal=Principal(kind="user", token_id=uuid.uuid4(), user_id=uuid.uuid4()),
        organization_id=UUID(w.t.id),
        permissions=frozenset({"scenarios:read"}),
    )
    async with app.state.database.connection() as connection:
        read = await batch_services.read_detail(
            connection,
            access=access,
            batch_id=UUID(candidate["id"]),
            limiter=app.state.limiter,
        )
    assert read is not None and read.comparison is None
    await drain(app, settings, baseline["id"])  # 0 of 2: B did better
    stored = (await get_batch(client, w, candidate["id"]))["comparison"]  # the read stores it
    assert (stored["regressions"], stored["fixes"], stored["significant_regressions"]) == (0, 1, 0)
    (fixed,) = stored["scenarios"]
    assert (fixed["change"], fixed["a_passes"], fixed["b_passes"]) == ("fixed", 0, 2)
    assert fixed["p_value"] == 1.0  # nothing points to a regression
    assert await store_due(app.state.database) == 0
    # A batch with no baseline has no comparison, ever.
    assert (await get_batch(client, w, baseline["id"]))["comparison"] is None


async def test_a_batch_run_triggers_batches_take_its_previous_batch_as_baseline(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession, agent: Any
) -> None:
    w = await make_world(client, agent)
    await suite(client, w, "nightly", {"a": "", "b": "1/2"})
    trigger = await create(
        client,
        w.t,
        scheduled(w.agent_id, action="batch_run", tags=["nightly"], repetitions=2),
    )
    assert trigger["repetitions"] == 2
    made = []
    for night in range(3):
        if night == 1:  # a batch of the agent started by hand is not the trigger's
            await create_batch(client, w, tags=["nightly"])
        fired = await client.post(path(w.t, trigger["id"], "fire"), headers=w.headers)
        await execute(app.state.database, settings, UUID(fired.json()["id"]), broker=stub_broker())
        done = await client.get(
            path(w.t, trigger["id"], "executions", fired.json()["id"]), headers=w.headers
        )
        made.append(await get_batch(client, w, done.json()["batch_run_id"]))
    assert [b["baseline_batch_id"] for b in made] == [None, made[0]["id"], made[1]["id"]]
    assert all((b["repetitions"], b["total_scenarios"]) == (2, 4) for b in made)
    invalid = await client.patch(
        path(w.t, trigger["id"]), json={"repetitions": 0}, headers=w.headers
    )
    assert single_validation_entry(invalid)["loc"] == ["body", "repetitions"]
    changed = await client.patch(
        path(w.t, trigger["id"]), json={"repetitions": 5}, headers=w.headers
    )
    assert changed.json()["repetitions"] == 5
