"""The scheduler's side of triggers, in this process on the test database (DESIGN §5.7):
slots recorded exactly once whoever records them, the grace time, leadership, and the
cron that mirrors trigger changes through LISTEN/NOTIFY.  Two real ``spar scheduler``
processes are in ``tests/e2e/test_scheduler_failover.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import REGISTRY
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from scheduler.cron import TriggerCron
from scheduler.leader import Leadership
from scheduler.main import lead_forever
from scheduler.sweeper import sweep
from shared.db.models import BatchRun, Trigger, TriggerExecution
from shared.queue import RUN_TRIGGER
from shared.settings import Settings
from shared.triggers.executions import execute
from shared.triggers.firing import fire_due, scheduled_trigger
from tests.support.factories import Tenant, stub_broker, tenant
from tests.support.fakes import FakeAgent
from tests.support.scenario_setup import create_scenario, outbound_setup
from tests.support.triggers import create, path, scheduled

GRACE = timedelta(minutes=5)


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent() as fake:
        yield fake


async def minutely(client: AsyncTestClient, t: Tenant, agent_url: str, **fields: Any):
    setup = await outbound_setup(client, t, agent_url)
    return await create(
        client,
        t,
        scheduled(setup.agent_id, cron_expression="* * * * *", timezone="UTC", **fields),
    )


async def started_at(db: AsyncSession, trigger_id: str, at: datetime) -> None:
    """As if the trigger had existed since ``at``, and no scheduler had run since."""
    await db.execute(update(Trigger).where(Trigger.id == UUID(trigger_id)).values(schedule_from=at))
    await db.commit()


def half_past() -> datetime:
    """The current minute's 30th second: ``now`` for ``fire_due``, clear of any boundary."""
    return minute(datetime.now(UTC)) + timedelta(seconds=30)


def slots_back(now: datetime, count: int) -> datetime:
    """A ``schedule_from`` that leaves ``count`` minute slots due up to ``now``."""
    return minute(now) - timedelta(minutes=count - 1, seconds=1)


async def slots(db: AsyncSession, trigger_id: str) -> list[tuple[datetime, str]]:
    rows = await db.execute(
        select(TriggerExecution.scheduled_for, TriggerExecution.status)
        .where(TriggerExecution.trigger_id == UUID(trigger_id))
        .order_by(TriggerExecution.scheduled_for)
    )
    await db.commit()
    return [tuple(row) for row in rows]


def minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def sample(name: str, **labels: str) -> float:
    """A metric of this process's registry (what ``spar scheduler --metrics-port`` serves)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_due_slots_are_recorded_once_however_many_record_them(
    client: AsyncTestClient, app: Litestar, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await minutely(client, t, agent.url)
    now = half_past()
    await started_at(db, trigger["id"], slots_back(now, 4))
    database = app.state.database
    broker = stub_broker()

    async def record() -> int:
        async with database.transaction() as session:
            mirrored = await scheduled_trigger(session, trigger_id=UUID(trigger["id"]))
            assert mirrored is not None
            fired = await fire_due(session, trigger=mirrored, now=now, grace=GRACE, broker=broker)
        return len(fired.queued)

    counts = await asyncio.gather(*(record() for _ in range(5)))
    recorded = await slots(db, trigger["id"])
    assert [s for s, _ in recorded] == [minute(now) - timedelta(minutes=i) for i in (3, 2, 1, 0)]
    assert {status for _, status in recorded} == {"queued"}
    assert sum(counts) == 4  # four slots, each queued by exactly one of the five
    assert broker.queues[RUN_TRIGGER[0]].qsize() == 4  # and sent once each
    assert await record() == 0  # nothing is due any more


async def test_slots_older_than_the_grace_time_are_recorded_missed_not_run(
    client: AsyncTestClient, app: Litestar, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await minutely(client, t, agent.url)
    now = half_past()
    await started_at(db, trigger["id"], slots_back(now, 9))
    broker = stub_broker()
    async with app.state.database.transaction() as session:
        mirrored = await scheduled_trigger(session, trigger_id=UUID(trigger["id"]))
        fired = await fire_due(session, trigger=mirrored, now=now, grace=GRACE, broker=broker)
    # Within 5 minutes of 12:00:30: 11:56 to 12:00; 11:52 to 11:55 missed.
    assert (len(fired.queued), fired.missed) == (5, 4)
    recorded = await slots(db, trigger["id"])
    assert [status for _, status in recorded] == ["missed"] * 4 + ["queued"] * 5
    assert recorded[4][0] >= now - GRACE > recorded[3][0]
    assert broker.queues[RUN_TRIGGER[0]].qsize() == 5
    listed = await client.get(
        f"{path(t, trigger['id'], 'executions')}?status=missed", headers=t.owner.headers
    )
    assert listed.json()["total"] == 4
    assert all(e["completed_at"] and e["attempts"] == 0 for e in listed.json()["executions"])


async def test_paused_and_resumed_trigger_does_not_catch_up_the_pause(
    client: AsyncTestClient, app: Litestar, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await minutely(client, t, agent.url)
    await started_at(db, trigger["id"], datetime.now(UTC) - timedelta(minutes=3))
    one = path(t, trigger["id"])
    await client.patch(one, json={"status": "inactive"}, headers=t.owner.headers)
    async with app.state.database.transaction() as session:
        assert await scheduled_trigger(session, trigger_id=UUID(trigger["id"])) is None
    await client.patch(one, json={"status": "active"}, headers=t.owner.headers)
    async with app.state.database.transaction() as session:
        mirrored = await scheduled_trigger(session, trigger_id=UUID(trigger["id"]))
        fired = await fire_due(
            session, trigger=mirrored, now=datetime.now(UTC), grace=GRACE, broker=stub_broker()
        )
    assert fired.queued == [] and fired.missed == 0


async def test_a_scheduled_batch_run_trigger_creates_one_batch_per_slot(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    t = await tenant(client)
    await create_scenario(client, t, tags=["nightly"])
    await create_scenario(client, t, tags=["nightly"])
    trigger = await minutely(client, t, agent.url, action="batch_run", tags=["nightly"])
    now = half_past()
    await started_at(db, trigger["id"], slots_back(now, 2))
    database = app.state.database
    broker = stub_broker()

    async def scheduler_pass() -> None:  # what each of two schedulers would do
        async with database.transaction() as session:
            mirrored = await scheduled_trigger(session, trigger_id=UUID(trigger["id"]))
            if mirrored is not None:
                await fire_due(session, trigger=mirrored, now=now, grace=GRACE, broker=broker)

    await asyncio.gather(scheduler_pass(), scheduler_pass())
    recorded = await db.scalars(
        select(TriggerExecution.id).where(TriggerExecution.trigger_id == UUID(trigger["id"]))
    )
    ids = list(recorded)
    await db.commit()
    assert len(ids) == 2  # the slot a minute ago and this minute's
    # Every execution delivered twice, concurrently.
    await asyncio.gather(
        *(execute(database, settings, i, broker=broker) for i in ids for _ in range(2))
    )
    batches = list(await db.scalars(select(BatchRun)))
    await db.commit()
    assert len(batches) == 2
    assert all(b.total_scenarios == 2 for b in batches)
    executions = list(await db.scalars(select(TriggerExecution)))
    assert {e.batch_run_id for e in executions} == {b.id for b in batches}


async def test_only_one_process_leads_and_a_standby_takes_over(app: Litestar, client) -> None:
    first, second = Leadership(app.state.database.engine), Leadership(app.state.database.engine)
    try:
        assert await first.try_acquire()
        assert not await second.try_acquire()
        assert await first.try_acquire()  # still held
        await first.release()
        assert await second.try_acquire()
        assert not await first.try_acquire()
    finally:
        await first.release()
        await second.release()


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_s} s")
        await asyncio.sleep(0.05)


async def test_the_cron_picks_up_creates_edits_pauses_and_deletes_when_notified(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    db: AsyncSession,
) -> None:
    # Polling every 10 minutes: each change below lands long before a poll could bring
    # it (wait_until gives up after 5 s), so only NOTIFY can have brought it.
    quick = msgspec.structs.replace(settings, trigger_poll_s=600.0, leader_retry_s=0.5)
    broker = stub_broker()
    cron = TriggerCron(app.state.database, broker, quick)
    leadership = Leadership(app.state.database.engine)
    stop = asyncio.Event()
    queued_before = sample("spar_trigger_slots_total", outcome="queued")
    task = asyncio.create_task(
        lead_forever(app.state.database, broker, quick, stop, leadership, cron)
    )
    try:
        await wait_until(lambda: cron.running)
        assert sample("spar_scheduler_leading") == 1
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        trigger = await create(client, t, scheduled(setup.agent_id, cron_expression="0 3 * * *"))
        tid = trigger["id"]
        await wait_until(lambda: tid in cron.jobs())
        at_three = cron.jobs()[tid]
        assert at_three == datetime.fromisoformat(trigger["next_run_at"])

        await client.patch(
            path(t, tid), json={"cron_expression": "30 4 * * *"}, headers=t.owner.headers
        )
        await wait_until(lambda: cron.jobs().get(tid) not in (None, at_three))
        assert cron.jobs()[tid].minute == 30

        await client.patch(path(t, tid), json={"status": "inactive"}, headers=t.owner.headers)
        await wait_until(lambda: tid not in cron.jobs())
        await client.patch(path(t, tid), json={"status": "active"}, headers=t.owner.headers)
        await wait_until(lambda: tid in cron.jobs())
        await client.delete(path(t, tid), headers=t.owner.headers)
        await wait_until(lambda: tid not in cron.jobs())

        # A trigger whose slots passed while nothing ran: caught up when the change lands.
        late = await create(
            client, t, scheduled(setup.agent_id, cron_expression="* * * * *", timezone="UTC")
        )
        await started_at(db, late["id"], datetime.now(UTC) - timedelta(minutes=2.5))
        await wait_until(lambda: broker.queues[RUN_TRIGGER[0]].qsize() >= 2)
        recorded = await slots(db, late["id"])
        assert len(recorded) in (2, 3)  # the minute may turn meanwhile
        assert {status for _, status in recorded} == {"queued"}
        fired = sample("spar_trigger_slots_total", outcome="queued") - queued_before
        assert fired == len(recorded)
    finally:
        stop.set()
        await task
        await leadership.release()
    assert not cron.running
    assert sample("spar_scheduler_leading") == 0


async def test_the_sweeper_resends_an_execution_whose_message_was_lost(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, db: AsyncSession
) -> None:
    t = await tenant(client)
    trigger = await minutely(client, t, agent.url)
    fired = (await client.post(path(t, trigger["id"], "fire"), headers=t.owner.headers)).json()
    broker = stub_broker()
    database = app.state.database
    resent_before = sample("spar_sweeper_resent_total", kind="trigger_executions")
    await sweep(database, broker, settings)
    assert broker.queues[RUN_TRIGGER[0]].qsize() == 0  # just queued: its message is on its way
    await db.execute(
        update(TriggerExecution).values(updated_at=datetime.now(UTC) - timedelta(minutes=2))
    )
    await db.commit()
    await sweep(database, broker, settings)
    assert broker.queues[RUN_TRIGGER[0]].qsize() == 1
    await sweep(database, broker, settings)  # sent again; not again at once
    assert broker.queues[RUN_TRIGGER[0]].qsize() == 1
    count = await db.scalar(select(func.count()).select_from(TriggerExecution))
    assert count == 1 and fired["status"] == "queued"
    assert sample("spar_sweeper_resent_total", kind="trigger_executions") - resent_before == 1
