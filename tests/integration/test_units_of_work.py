"""No unit of work is stranded (issue 21, ``shared.work``): runs, trigger executions,
knowledge documents and calibrations are claimed one way, kept alive by a heartbeat, sent
again by the sweeper when their worker or their message is lost, and end terminal with
the reason when they keep failing.  And what comes back from outside is stored cleaned:
text PostgreSQL cannot hold never crashes the write that records it.

Everything is real (PostgreSQL, Redis, the API, the run engine); the failures are real
too: a PostgreSQL trigger that refuses a write, a stored credential holding a line break.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import httpx
import msgspec
import pytest
import redis
from dramatiq import Message
from litestar import Litestar
from litestar.testing import AsyncTestClient
from psycopg_pool import PoolTimeout
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from api.app import create_app
from scheduler.sweeper import BROKER_MARK, mark_broker, sweep
from shared.batches.window import dispatch_committed
from shared.calibration.judging import judge_examples
from shared.crypto import secret_box
from shared.db.base import utcnow
from shared.db.engine import Database, create_engine
from shared.db.models import (
    Credential,
    ScenarioRun,
)
from shared.knowledge.processing import process_document
from shared.queue import (
    CALIBRATE,
    PROCESS_DOCUMENT,
    RUN_SCENARIO,
    PollingRedisBroker,
    get_broker,
    send_after_commit,
)
from shared.runtime import Runtime
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from shared.triggers.executions import execute as execute_trigger
from shared.work import CALIBRATIONS, DOCUMENTS, RUNS, TRIGGER_EXECUTIONS, Work, perform
from tests.support.factories import Tenant, held_in_redis, stub_broker, tenant
from tests.support.fakes import FakeAgent, FakeOpenAI, Reply
from tests.support.live_server import LiveServer
from tests.support.loop import ticking_while_redis_holds_writes
from tests.support.proxy import DatabaseProxy
from tests.support.scenario_setup import (
    allow_domain,
    create_http_agent,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)
from workers.warmup import warm_up

NUL_REPLY = "nul \u0000 inside"
CLEANED = "nul \ufffd inside"


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent() as fake:
        yield fake


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    verdict = {"verdict": "PASS", "critique": "fine \u0000 and \ud800 alone", "evidence": "ok"}
    with FakeOpenAI(reply=json.dumps(verdict)) as fake:
        yield fake


async def run_once(app: Litestar, settings: Settings, run_id: str) -> Any:
    return await execute_run(app.state.database, settings, UUID(run_id))


# --- text PostgreSQL cannot store -----------------------------------------------------------------


async def test_a_reply_and_a_critique_holding_nul_are_stored_cleaned(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    agent.reply = NUL_REPLY
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url, judge.url)
    scenario = await create_scenario(
        client,
        t,
        turns=[turn("Hi", criterion("inside", "contains"), criterion("Polite?"))],
    )
    run = await start_run(client, t, scenario["id"], setup.agent_id)
    await run_once(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done["error_message"]
    (result,) = done["turn_results"]
    assert result["response_content"] == CLEANED
    critiques = [c["critique"] for c in result["criteria_results"]]
    assert "fine \ufffd and \ufffd alone" in critiques, critiques


async def test_an_llm_agents_output_holding_nul_is_stored_cleaned(
    client: AsyncTestClient, app: Litestar, settings: Settings
) -> None:
    with FakeOpenAI(reply=NUL_REPLY) as provider:
        t = await tenant(client)
        await allow_domain(client, t)
        made = await create_judge_provider(client, t, provider.url, is_default_judge=False)
        response = await client.post(
            f"/v1/orgs/{t.id}/agents",
            json={"name": "llm", "kind": "llm", "llm_provider_id": made["id"]},
            headers=t.owner.headers,
        )
        assert response.status_code == 201, response.text
        scenario = await create_scenario(
            client, t, turns=[turn("Hi", criterion("inside", "contains"))]
        )
        run = await start_run(client, t, scenario["id"], response.json()["id"])
        await run_once(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    assert done["turn_results"][0]["response_content"] == CLEANED


async def test_an_error_body_holding_nul_ends_the_run_in_error_with_it_cleaned(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    agent.enqueue(*[Reply(status=500, body=b"broken \\u0000 \x00 here")] * 3)
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    scenario = await create_scenario(client, t)
    run = await start_run(client, t, scenario["id"], setup.agent_id)
    await run_once(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "error", done
    assert "agent answered HTTP 500: broken \\u0000 \ufffd here" in done["error_message"]


async def test_a_stored_credential_with_a_line_break_ends_the_run_naming_the_header(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    """A value saved before ``PUT`` refused line breaks is never sent: the run ends in
    error naming the header (never the value), instead of crashing the HTTP client."""
    t = await tenant(client)
    response = await client.put(
        f"/v1/orgs/{t.id}/credentials/agent-key",
        json={"value": "abcdefgh-secret"},
        headers=t.owner.headers,
    )
    assert response.status_code in (200, 201), response.text
    injected = "abcdefgh-secret\r\nX-Injected: yes"
    await db.execute(
        update(Credential)
        .where(Credential.key == "agent-key")
        .values(ciphertext=secret_box(settings.secret_key).encrypt(injected))
    )
    await db.commit()
    await allow_domain(client, t, headers={"X-Agent-Key": "{{credentials.agent-key}}"})
    made = await create_http_agent(client, t, agent.url)
    scenario = await create_scenario(client, t)
    run = await start_run(client, t, scenario["id"], made["id"])
    await run_once(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "error", done
    assert "header 'X-Agent-Key'" in done["error_message"], done["error_message"]
    assert "abcdefgh-secret" not in done["error_message"]
    assert agent.requests == []


# --- a unit that keeps failing ends, with the reason ----------------------------------------------


@pytest.fixture
async def poisoned_turns(db: AsyncSession) -> AsyncIterator[None]:
    """PostgreSQL refuses to record any turn whose user message is ``poison``: a write that
    fails on every delivery, whatever the code does."""
    await db.execute(
        text(
            "CREATE FUNCTION spar_test_poison() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF NEW.user_message = 'poison' THEN RAISE EXCEPTION 'poisoned turn'; END IF; "
            "RETURN NEW; END $$"
        )
    )
    await db.execute(
        text(
            "CREATE TRIGGER spar_test_poison BEFORE INSERT ON turn_results "
            "FOR EACH ROW EXECUTE FUNCTION spar_test_poison()"
        )
    )
    await db.commit()
    try:
        yield
    finally:
        await db.execute(text("DROP TRIGGER spar_test_poison ON turn_results"))
        await db.execute(text("DROP FUNCTION spar_test_poison()"))
        await db.commit()


async def suite_batch(
    client: AsyncTestClient, t: Tenant, agent_id: str, *, max_concurrency: int
) -> tuple[str, str]:
    """A batch of the tenant's scenarios tagged ``suite``, created over the API: its id
    and its path."""
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios/batch-runs",
        json={"agent_id": agent_id, "tags": ["suite"], "max_concurrency": max_concurrency},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    batch_id = response.json()["id"]
    return batch_id, f"/v1/orgs/{t.id}/scenarios/batch-runs/{batch_id}"


async def test_a_run_that_keeps_failing_ends_in_error_and_its_batch_completes(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
    poisoned_turns: None,
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, name="fine", tags=["suite"])
    await create_scenario(client, t, name="poisoned", tags=["suite"], turns=[turn("poison")])
    batch_id, batch_path = await suite_batch(client, t, setup.agent_id, max_concurrency=2)
    listed = (await client.get(batch_path, headers=t.owner.headers)).json()["runs"]
    runs = {r["scenario_name"]: r["id"] for r in listed}
    handed = await dispatch_committed(app.state.database, UUID(batch_id))
    assert sorted(map(str, handed)) == sorted(runs.values())

    await run_once(app, settings, runs["fine"])
    # Each delivery fails at the write; Dramatiq would deliver it again, and again.
    for delivery in range(1, RUNS.max_deliveries):
        with pytest.raises(Exception, match="poisoned turn"):
            await run_once(app, settings, runs["poisoned"])
        stuck = await get_run(client, t, runs["poisoned"])
        assert stuck["status"] == "running", (delivery, stuck)
    # The last delivery it is allowed ends it, with the reason.
    assert await run_once(app, settings, runs["poisoned"]) == []
    done = await get_run(client, t, runs["poisoned"])
    assert done["status"] == "error", done
    assert done["error_message"] == (
        f"error: RaiseException: poisoned turn (after {RUNS.max_deliveries} deliveries)"
    )
    # Its batch is not held up: completed, counted once.
    batch = (await client.get(batch_path, headers=t.owner.headers)).json()
    assert batch["status"] == "completed", batch
    assert (batch["passed_scenarios"], batch["error_scenarios"]) == (1, 1)
    assert batch["completed_scenarios"] == batch["total_scenarios"] == 2
    # Any later delivery changes nothing.
    assert await run_once(app, settings, runs["poisoned"]) is None


async def test_a_run_whose_stored_row_cannot_be_read_ends_in_error_at_its_first_delivery(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    """A run whose snapshot is stored in a shape the workers do not read (written by
    another version, say) would fail every delivery before its play begins, where the
    deliveries are not counted against it, and be sent again forever: it ends in error at
    once, naming where its row could not be read, and its batch completes."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    await create_scenario(client, t, name="unreadable", tags=["suite"])
    batch_id, batch_path = await suite_batch(client, t, setup.agent_id, max_concurrency=1)
    (run_id,) = await dispatch_committed(app.state.database, UUID(batch_id))
    await db.execute(
        text('UPDATE scenario_runs SET snapshot = \'{"turns": "none"}\' WHERE id = :run'),
        {"run": run_id},
    )
    await db.commit()
    assert await run_once(app, settings, str(run_id)) == []
    status, error = (
        await db.execute(
            text("SELECT status, error_message FROM scenario_runs WHERE id = :run"),
            {"run": run_id},
        )
    ).one()
    assert status == "error" and error.startswith("cannot start: "), error
    assert "snapshot" in error and "none" not in error, error
    batch = (await client.get(batch_path, headers=t.owner.headers)).json()
    assert (batch["status"], batch["error_scenarios"]) == ("completed", 1), batch
    assert agent.requests == []


async def fired_trigger(client: AsyncTestClient, t: Tenant, agent_id: str) -> tuple[str, str]:
    """A webhook trigger sending ``ping`` to the agent, fired by hand: the trigger's id and
    its execution's, ``queued``."""
    response = await client.post(
        f"/v1/orgs/{t.id}/triggers/",
        json={"name": "hook", "trigger_type": "webhook", "agent_id": agent_id, "message": "ping"},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    trigger_id = response.json()["id"]
    fired = await client.post(
        f"/v1/orgs/{t.id}/triggers/{trigger_id}/fire", headers=t.owner.headers
    )
    assert fired.status_code == 202, fired.text
    return trigger_id, fired.json()["id"]


async def _waiting_unit_of_each_kind(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    t: Tenant,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> dict[str, str]:
    """One unit of each kind, each waiting for its message: run, execution, document,
    calibration."""
    setup = await outbound_setup(client, t, agent.url, judge.url)
    h = t.owner.headers
    scenario = await create_scenario(client, t)
    run = await start_run(client, t, scenario["id"], setup.agent_id)
    _, execution_id = await fired_trigger(client, t, setup.agent_id)
    collection = await client.post(
        f"/v1/orgs/{t.id}/knowledge/collections/", json={"name": "docs"}, headers=h
    )
    assert collection.status_code == 201, collection.text
    document = await client.post(
        f"/v1/orgs/{t.id}/knowledge/documents/structured",
        json={
            "collectionId": collection.json()["id"],
            "filename": "a.md",
            "content": "# A\n\ntext",
        },
        headers=h,
    )
    assert document.status_code == 201, document.text
    calibration = await impatient.post(
        f"/v1/orgs/{t.id}/scenarios/calibrate?agent_id={setup.agent_id}",
        json={
            "examples": [
                {
                    "id": "1",
                    "user_message": "q",
                    "agent_response": "a",
                    "criterion_question": "ok?",
                    "human_verdict": "PASS",
                    "human_critique": "",
                    "tags": [],
                }
            ]
        },
        headers=h,
    )
    assert calibration.status_code == 202, calibration.text
    return {
        "run": run["id"],
        "trigger_execution": execution_id,
        "document": document.json()["id"],
        "calibration": calibration.json()["id"],
    }


KINDS: dict[str, Work] = {
    "run": RUNS,
    "trigger_execution": TRIGGER_EXECUTIONS,
    "document": DOCUMENTS,
    "calibration": CALIBRATIONS,
}


async def deliver(app: Litestar, settings: Settings, kind: str, unit_id: str) -> None:
    database, unit = app.state.database, UUID(unit_id)
    if kind == "run":
        await execute_run(database, settings, unit)
    elif kind == "trigger_execution":
        await execute_trigger(database, settings, unit, broker=app.state.broker)
    elif kind == "document":
        await process_document(database, settings, unit)
    else:
        await judge_examples(database, settings, unit)


async def set_running(db: AsyncSession, kind: str, unit_id: str, **values: Any) -> None:
    """Put the unit in its running status, with ``values`` (columns) set too."""
    work = KINDS[kind]
    model = work.model
    await db.execute(
        update(model)
        .where(model.id == UUID(unit_id))
        .values({work.status_column: work.running, **values})
    )
    await db.commit()


async def unit_state(db: AsyncSession, kind: str, unit_id: str) -> tuple[str, str | None, int]:
    work = KINDS[kind]
    model = work.model
    error_column = {
        "run": "error_message",
        "trigger_execution": "error",
        "document": "processing_error",
        "calibration": "error",
    }[kind]
    error = getattr(model, error_column)
    row = (
        await db.execute(
            select(
                getattr(model, work.status_column), error, getattr(model, work.attempts_column)
            ).where(model.id == UUID(unit_id))
        )
    ).one()
    await db.commit()
    return row[0], row[1], row[2]


async def test_every_kind_of_unit_whose_workers_kept_dying_ends_in_error(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """Claimed as many times as allowed by deliveries that never finished (workers killed
    on it): the next delivery ends it in error instead of playing it yet again."""
    t = await tenant(client)
    units = await _waiting_unit_of_each_kind(client, impatient, t, agent, judge)
    long_ago = utcnow() - timedelta(hours=1)
    for kind, unit_id in units.items():
        work = KINDS[kind]
        await set_running(
            db, kind, unit_id, heartbeat_at=long_ago, **{work.attempts_column: work.max_deliveries}
        )
    for kind, unit_id in units.items():
        await deliver(app, settings, kind, unit_id)
        work = KINDS[kind]
        status, error, attempts = await unit_state(db, kind, unit_id)
        assert status == ("error" if kind == "run" else "failed"), (kind, status)
        assert error == (
            f"error: gave up after {work.max_deliveries} deliveries that did not finish"
        ), (kind, error)
        assert attempts == work.max_deliveries + 1
    assert agent.requests == [] and judge.requests == [], "nothing was played again"


# --- heartbeats and the sweeper -------------------------------------------------------------------


async def test_a_unit_with_a_live_heartbeat_is_neither_claimed_again_nor_resent(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    t = await tenant(client)
    units = await _waiting_unit_of_each_kind(client, impatient, t, agent, judge)
    long_ago = utcnow() - timedelta(hours=1)
    for beat, stale in ((utcnow(), False), (long_ago, True)):
        for kind, unit_id in units.items():
            await set_running(db, kind, unit_id, heartbeat_at=beat, updated_at=long_ago)
        broker = stub_broker()
        await sweep(app.state.database, broker, settings)
        sent = {
            queue: _drain(broker, queue)
            for queue in ("runs", "triggers", "documents", "calibration")
        }
        expected = {
            "runs": [units["run"]] if stale else [],
            "triggers": [units["trigger_execution"]] if stale else [],
            "documents": [units["document"]] if stale else [],
            "calibration": [units["calibration"]] if stale else [],
        }
        assert sent == expected, (stale, sent)
        if not stale:
            # A delivery finds it in flight elsewhere: nothing is claimed or played.
            for kind, unit_id in units.items():
                await deliver(app, settings, kind, unit_id)
                status, _, attempts = await unit_state(db, kind, unit_id)
                assert status == KINDS[kind].running and attempts == 0, (kind, status)
    # Once re-sent, each is claimed and played to its end.
    for kind, unit_id in units.items():
        await deliver(app, settings, kind, unit_id)
        status, _, attempts = await unit_state(db, kind, unit_id)
        assert status in {"passed", "succeeded", "ready", "completed"}, (kind, status)
        assert attempts == 1


async def test_a_released_unit_is_not_stamped_alive_again_by_a_late_heartbeat(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """A delivery stopped from outside releases its unit (heartbeat cleared) for the next;
    a beat of its process that read the unit before the release and stamps after it must
    not make the unit look alive again (the next delivery would leave it for the heartbeat
    timeout)."""
    t = await tenant(client)
    units = await _waiting_unit_of_each_kind(client, impatient, t, agent, judge)
    for kind, unit_id in units.items():
        work = KINDS[kind]
        await set_running(db, kind, unit_id, heartbeat_at=utcnow())
        _, _, delivery = await unit_state(db, kind, unit_id)
        async with app.state.database.connection() as conn:
            await work._release.rows(conn, p_unit=UUID(unit_id), p_delivery=delivery)
            await work._beat.rows(conn, p_units=[UUID(unit_id)], now=utcnow())
        heartbeat = await db.scalar(select(work.heartbeat).where(work.id == UUID(unit_id)))
        await db.commit()
        assert heartbeat is None, kind
        await deliver(app, settings, kind, unit_id)
        status, _, _ = await unit_state(db, kind, unit_id)
        assert status in {"passed", "succeeded", "ready", "completed"}, (kind, status)


async def test_a_delivery_taken_for_dead_leaves_the_next_ones_heartbeat_when_it_gives_up(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """A delivery whose heartbeat lapsed (its loop starved, say) is taken for dead and its
    unit claimed again; when it then fails, its release must not clear the heartbeat of
    the delivery now playing the unit, or a third would claim it and call out again."""
    t = await tenant(client)
    units = await _waiting_unit_of_each_kind(client, impatient, t, agent, judge)
    for kind, unit_id in units.items():
        work = KINDS[kind]
        await set_running(db, kind, unit_id, heartbeat_at=utcnow(), **{work.attempts_column: 2})

        async def fails() -> None:
            raise RuntimeError("the delivery taken for dead fails late")

        async def give_up(reason: str) -> None:
            raise AssertionError(f"not its last delivery: {reason}")

        with pytest.raises(RuntimeError, match="fails late"):
            await perform(
                work, app.state.database, settings, UUID(unit_id), 1, play=fails, give_up=give_up
            )
        heartbeat = await db.scalar(select(work.heartbeat).where(work.id == UUID(unit_id)))
        await db.commit()
        assert heartbeat is not None, kind  # still the live delivery's
        await deliver(app, settings, kind, unit_id)  # a third: it finds the unit in flight
        status, _, attempts = await unit_state(db, kind, unit_id)
        assert (status, attempts) == (work.running, 2), kind


async def test_a_heartbeat_skips_a_unit_another_transaction_holds(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """A beat stamps a process's units in one statement, in no set order: it must never
    wait for one whose row another transaction holds (its delivery writing a turn, or a
    group of a batch's ends holding several runs), or it could hold a unit that
    transaction waits for next: a deadlock, found in ``bench/batch.py --thousand`` (a
    batch 1 s late).  The held unit's delivery is alive; the next beat stamps it."""
    first, second = [
        await _waiting_unit_of_each_kind(client, impatient, await tenant(client), agent, judge)
        for _ in range(2)
    ]
    long_ago = utcnow() - timedelta(hours=1)
    for kind in first:
        work = KINDS[kind]
        held, free = UUID(first[kind]), UUID(second[kind])
        for unit_id in (held, free):
            await set_running(db, kind, str(unit_id), heartbeat_at=long_ago)
        await db.execute(select(work.id).where(work.id == held).with_for_update())
        async with app.state.database.connection() as conn:
            stamped = await asyncio.wait_for(
                work._beat.rows(conn, p_units=[held, free], now=utcnow()), timeout=5
            )
        await db.commit()
        assert [row.id for row in stamped] == [free], kind
        read = await db.execute(select(work.id, work.heartbeat).where(work.id.in_([held, free])))
        beats = {unit_id: heartbeat for unit_id, heartbeat in read}
        await db.commit()
        assert beats[held] == long_ago and beats[free] > long_ago, kind


async def test_a_heartbeat_stamps_a_unit_whose_row_is_only_referenced_meanwhile(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """A transaction that only references a unit's row (inserting a row whose foreign key
    names it takes KEY SHARE: a run's turn as it is written) does not make a beat skip it:
    the beat locks no more than its own update does."""
    units = await _waiting_unit_of_each_kind(client, impatient, await tenant(client), agent, judge)
    long_ago = utcnow() - timedelta(hours=1)
    for kind, unit_id in units.items():
        work = KINDS[kind]
        await set_running(db, kind, unit_id, heartbeat_at=long_ago)
        await db.execute(
            select(work.id)
            .where(work.id == UUID(unit_id))
            .with_for_update(key_share=True, read=True)
        )
        async with app.state.database.connection() as conn:
            stamped = await asyncio.wait_for(
                work._beat.rows(conn, p_units=[UUID(unit_id)], now=utcnow()), timeout=5
            )
        await db.commit()
        assert [row.id for row in stamped] == [UUID(unit_id)], kind


def _drain(broker: Any, queue: str) -> list[str]:
    """The ids sent to ``queue`` of a stub broker."""
    found = []
    pending = broker.queues[queue]
    while not pending.empty():
        found.append(Message.decode(pending.get_nowait()).args[0])
    return found


async def test_a_slow_agent_call_keeps_its_run_alive_with_heartbeats(
    client: AsyncTestClient, app: Litestar, settings: Settings, db: AsyncSession
) -> None:
    """The heartbeat beats on its own, whatever the run waits on: an agent answering after
    four seconds, longer than the heartbeat timeout, keeps its run's heartbeat fresh, and
    the sweeper leaves it alone."""
    quick = msgspec.structs.replace(settings, run_heartbeat_timeout_s=3.0)  # a beat each 0.5 s

    def slow(body: dict[str, Any]) -> str:
        time.sleep(4.0)
        return "done"

    with FakeAgent(reply=slow) as agent:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        scenario = await create_scenario(client, t, turns=[turn("Hi")])
        run = await start_run(client, t, scenario["id"], setup.agent_id)
        task = asyncio.create_task(run_once(app, quick, run["id"]))
        await agent.requests_received(1, wait_s=10)
        beats = set()
        broker = stub_broker()
        while not task.done():
            beat = await db.scalar(
                select(ScenarioRun.heartbeat_at).where(ScenarioRun.id == UUID(run["id"]))
            )
            await db.commit()
            beats.add(beat)
            await sweep(app.state.database, broker, quick)
            await asyncio.sleep(0.25)
        await task
    assert len(beats) >= 4, f"the heartbeat was stamped {len(beats)} times in 4 s"
    assert _drain(broker, "runs") == [], "the sweeper re-sent a run whose heartbeat was alive"
    assert (await get_run(client, t, run["id"]))["status"] == "passed"


async def test_the_sweeper_resends_every_waiting_unit_when_redis_lost_its_messages(
    client: AsyncTestClient,
    impatient: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
    db: AsyncSession,
) -> None:
    """A Redis restarted without persistence holds no message: every unit still waiting
    for one is sent again at the next pass, not after ``SPAR_RUN_STALL_S``."""
    t = await tenant(client)
    await _waiting_unit_of_each_kind(client, impatient, t, agent, judge)
    await db.execute(update(ScenarioRun).values(dispatched_at=utcnow()))
    await db.commit()
    broker = get_broker(settings)
    r = redis.Redis.from_url(settings.redis_url)
    r.flushdb()

    def queued() -> dict[str, int]:
        return {
            queue: int(r.hlen(f"dramatiq:{queue}.msgs"))
            for queue in ("runs", "triggers", "documents", "calibration")
        }

    try:
        await sweep(app.state.database, broker, settings)  # no mark yet: a loss
        assert queued() == {"runs": 1, "triggers": 1, "documents": 1, "calibration": 1}
        assert r.exists(BROKER_MARK)
        await sweep(app.state.database, broker, settings)  # nothing lost since
        assert queued() == {"runs": 1, "triggers": 1, "documents": 1, "calibration": 1}
        r.flushdb()  # what a restart without persistence does
        await sweep(app.state.database, broker, settings)
        assert queued() == {"runs": 1, "triggers": 1, "documents": 1, "calibration": 1}
    finally:
        r.flushdb()


# --- Redis slow or away as work is sent -----------------------------------------------------------


@pytest.fixture
async def served_with_own_redis(
    settings: Settings, own_redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Settings]]:
    """A client of the API served on a loopback port (requests that overlap), whose broker
    is a ``redis-server`` of the test's own, and those settings."""
    own = msgspec.structs.replace(settings, redis_url=own_redis_url)
    with LiveServer(create_app(own)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            yield http, own


async def test_a_request_that_sends_while_redis_is_slow_holds_up_no_other_request(
    served_with_own_redis: tuple[httpx.AsyncClient, Settings], client: AsyncTestClient
) -> None:
    """A run's message is sent after its commit from a thread: another request of the
    same API process is answered while Redis makes the send wait (it waited for the whole
    pause before), and the run's message is queued once Redis goes on."""
    http, own = served_with_own_redis
    t = await tenant(http)
    setup = await outbound_setup(http, t, "http://127.0.0.1:9/agent")
    scenario = await create_scenario(http, t, turns=[turn("Hi")])
    r = redis.Redis.from_url(own.redis_url)
    quick = redis.Redis.from_url(own.redis_url, socket_timeout=0.3)
    r.execute_command("CLIENT", "PAUSE", "3000", "ALL")
    run_started = asyncio.create_task(start_run(http, t, scenario["id"], setup.agent_id))
    await asyncio.sleep(0.3)
    live = await http.get("/health/live")
    assert live.status_code == 200
    # Answered while Redis still holds every command, the run's send included (before,
    # only once Redis let go).
    with pytest.raises(redis.TimeoutError):
        quick.ping()
    run = await run_started
    assert [m.args[0] for m in held_in_redis(own.redis_url, "runs")] == [run["id"]]


async def test_a_run_started_while_redis_is_away_is_made_and_the_sweeper_sends_it(
    served_with_own_redis: tuple[httpx.AsyncClient, Settings],
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis away as a run is started: the run is committed, so the request answers 201
    (it answered 500, and a caller who retried made a second run), the failed send is
    logged, and once the run's stall period is over the sweeper sends its message."""
    http, own = served_with_own_redis
    t = await tenant(http)
    setup = await outbound_setup(http, t, "http://127.0.0.1:9/agent")
    scenario = await create_scenario(http, t, turns=[turn("Hi")])
    redis.Redis.from_url(own.redis_url).shutdown(nosave=True)
    with caplog.at_level(logging.WARNING, logger="spar.queue"):
        run = await start_run(http, t, scenario["id"], setup.agent_id)
    assert run["status"] == "pending"
    assert "could not send run_scenario after its commit (ConnectionError" in caplog.text
    listed = await http.get(f"/v1/orgs/{t.id}/scenarios/runs", headers=t.owner.headers)
    assert [r["id"] for r in listed.json()["runs"]] == [run["id"]]

    broker = get_broker(settings)
    r = redis.Redis.from_url(settings.redis_url)
    r.flushdb()
    mark_broker(broker)  # nothing lost by this broker: only the run's stall sends it
    try:
        await asyncio.sleep(0.1)
        stalled = msgspec.structs.replace(settings, run_stall_s=0.05)
        assert await sweep(app.state.database, broker, stalled) == (1, 0)
        assert [m.args[0] for m in held_in_redis(settings.redis_url, "runs")] == [run["id"]]
    finally:
        r.flushdb()


async def test_a_commits_messages_go_in_order_and_those_redis_did_not_take_are_logged(
    client: AsyncTestClient, app: Litestar, caplog: pytest.LogCaptureFixture
) -> None:
    """The messages a transaction asked for go in order once it commits; the first that
    cannot be sent stops the sending, and the log names it and those after it (sent again
    later), not those already sent."""
    sent_to = stub_broker()
    nobody = "redis://127.0.0.1:1/0"  # no server on port 1: refused at once
    away = PollingRedisBroker(url=nobody, work_poll_ms=1000, heartbeat_timeout_s=30)
    with caplog.at_level(logging.WARNING, logger="spar.queue"):
        async with app.state.database.transaction() as session:
            send_after_commit(session, sent_to, RUN_SCENARIO, "first")
            send_after_commit(session, away, PROCESS_DOCUMENT, "second")
            send_after_commit(session, sent_to, CALIBRATE, "third")
    assert _drain(sent_to, "runs") == ["first"]
    assert _drain(sent_to, "calibration") == []
    assert (
        "could not send calibrate, process_document after its commit (ConnectionError"
        in caplog.text
    )
    assert "run_scenario" not in caplog.text


async def test_the_sweeper_sends_without_holding_up_the_schedulers_event_loop(
    client: AsyncTestClient, app: Litestar, settings: Settings, own_redis_url: str
) -> None:
    """The sweeper's reads and sends go to Redis from a thread: while Redis makes them wait,
    the scheduler's event loop (the triggers' cron jobs) goes on; it stood still before."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, "http://127.0.0.1:9/agent")
    scenario = await create_scenario(client, t, turns=[turn("Hi")])
    run = await start_run(client, t, scenario["id"], setup.agent_id)
    own = msgspec.structs.replace(settings, redis_url=own_redis_url)
    broker = get_broker(own)
    async with ticking_while_redis_holds_writes(own_redis_url, 800) as ticks:
        # A Redis of its own, never marked: it lost what it held, so the run is sent.
        swept = await sweep(app.state.database, broker, own)
    assert swept == (1, 0)
    assert ticks.count >= 30, ticks.count  # the loop ran meanwhile (about 70; few if blocked)
    assert [m.args[0] for m in held_in_redis(own_redis_url, "runs")] == [run["id"]]
    assert redis.Redis.from_url(own_redis_url).exists(BROKER_MARK)


# --- the database away ----------------------------------------------------------------------------


@pytest.fixture
def proxy(database_url: str) -> Iterator[DatabaseProxy]:
    with DatabaseProxy(database_url) as made:
        yield made


@asynccontextmanager
async def runtime_through(proxy: DatabaseProxy, settings: Settings) -> AsyncIterator[Runtime]:
    """A worker's runtime whose database connections all go through ``proxy``."""
    through = msgspec.structs.replace(settings, database_url=proxy.url)
    runtime = Runtime(settings=through, database=Database(create_engine(through, pre_ping=False)))
    try:
        yield runtime
    finally:
        await runtime.close()


async def test_an_execution_whose_database_goes_away_as_the_agent_answers_calls_it_once(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    proxy: DatabaseProxy,
) -> None:
    """The agent answers; at that moment every database connection dies and none can be
    made for two seconds (a restart, no free slot): the reply is still recorded by the
    delivery that got it, and the agent is called once."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    trigger_id, execution_id = await fired_trigger(client, t, setup.agent_id)

    def answer_as_the_database_goes(body: dict[str, Any]) -> str:
        proxy.cut()
        threading.Timer(2.0, proxy.restore).start()
        return "pong"

    agent.reply = answer_as_the_database_goes
    async with runtime_through(proxy, settings) as runtime:
        await execute_trigger(
            runtime.database,
            runtime.settings,
            UUID(execution_id),
            broker=app.state.broker,
            http=runtime.http,
        )
    listed = await client.get(
        f"/v1/orgs/{t.id}/triggers/{trigger_id}/executions", headers=t.owner.headers
    )
    (execution,) = listed.json()["executions"]
    assert execution["status"] == "succeeded", execution
    assert execution["response"] == "pong"
    assert len(agent.requests) == 1


async def test_a_workers_boot_warm_up_rehearses_every_path_without_an_error(
    settings: Settings,
) -> None:
    """What ``before_worker_boot`` runs (it logs and goes on when this raises): each
    rehearsed call must still match the signature of what it rehearses."""
    runtime = Runtime(settings=settings, database=Database(create_engine(settings, pre_ping=False)))
    try:
        await warm_up(runtime)
    finally:
        await runtime.close()


async def test_a_worker_whose_database_was_slow_at_boot_recovers(
    client: AsyncTestClient,
    settings: Settings,
    agent: FakeAgent,
    proxy: DatabaseProxy,
) -> None:
    """Its warm-up gives up on filling the run engine's pool (psycopg_pool then closes the
    pool); once the database answers, the worker's runs play as if nothing happened."""
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)
    scenario = await create_scenario(client, t)
    run = await start_run(client, t, scenario["id"], setup.agent_id)
    proxy.hold()
    async with runtime_through(proxy, settings) as runtime:
        with pytest.raises(PoolTimeout):
            await runtime.warm_up(timeout_s=0.5)
        proxy.release()
        await execute_run(runtime.database, runtime.settings, UUID(run["id"]))
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
