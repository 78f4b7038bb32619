"""Outbound limits (shared.outbound.limits): one adaptive concurrency limit per destination,
against a loopback provider that enforces a token bucket and answers 429 with each
Retry-After form.  Every behaviour is checked on both implementations of the one interface:
Redis (shared by every process) and in-process (``spar dev``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from uuid import UUID, uuid4

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from rich.console import Console
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.ui.session import COOKIE
from client.reports import progress_bar
from shared import metrics
from shared.batches.schemas import BatchRunRead, BatchStatus, RateLimitedRead
from shared.batches.window import dispatch_committed
from shared.db.engine import Database
from shared.outbound.egress import DomainRule, EgressClient, EgressPolicy
from shared.outbound.limits import (
    PROBE_S,
    Destination,
    DestinationLimiter,
    LocalLimiter,
    RateLimited,
    RedisLimiter,
)
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import (
    Background,
    create_batch,
    get_batch,
    make_scenario,
    make_world,
    read_events,
)
from tests.support.factories import tenant
from tests.support.fakes import FakeAgent, FakeServer, RecordedRequest, Reply
from tests.support.processes import free_port
from tests.support.ratelimited import FORMS, TokenBucketOpenAI
from tests.support.scenario_setup import (
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

IMPLEMENTATIONS = ["redis", "local"]


LEASE_S = 30.0  # a slot's lease in these tests


def make_limiter(
    kind: str,
    settings: Settings,
    *,
    max_concurrency: int,
    wait_s: float = 30.0,
    probe_s: float = PROBE_S,
) -> DestinationLimiter:
    if kind == "redis":
        assert settings.redis_url
        return redis_limiter(
            settings.redis_url, max_concurrency=max_concurrency, wait_s=wait_s, probe_s=probe_s
        )
    return LocalLimiter(
        max_concurrency=max_concurrency, wait_s=wait_s, lease_s=LEASE_S, probe_s=probe_s
    )


def redis_limiter(
    url: str, *, max_concurrency: int, wait_s: float = 30.0, probe_s: float = PROBE_S
) -> RedisLimiter:
    """The limiter on the Redis at ``url`` (the tests' own, or one of a test's own)."""
    return RedisLimiter(
        url, max_concurrency=max_concurrency, wait_s=wait_s, lease_s=LEASE_S, probe_s=probe_s
    )


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest) -> str:
    return str(request.param)


PROBE_TEST_S = 1.5  # the tests' probe period: short, so that the end of one is seen


@pytest.fixture
async def limiter(implementation: str, settings: Settings) -> AsyncIterator[DestinationLimiter]:
    made = make_limiter(
        implementation, settings, max_concurrency=8, wait_s=30.0, probe_s=PROBE_TEST_S
    )
    yield made
    await made.close()


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply="Hello, how can I help?") as fake:
        yield fake


def destination(kind: str = "judge") -> Destination:
    return Destination(str(uuid4()), kind, "api.example.com")


def rate_limited_count(kind: str) -> float:
    return metrics.OUTBOUND_RATE_LIMITED.labels(kind)._value.get()


# --- the limit itself ---------------------------------------------------------------------------


async def test_a_refusal_halves_the_limit_once_per_burst_and_successes_bring_it_back(
    limiter: DestinationLimiter,
) -> None:
    """AIMD: the refusals of calls already under way when the limit was cut do not cut it
    again; a refusal holds the destination for its Retry-After; each success adds about
    1/limit: for the probe period after a cut up to one below the limit refused, then up
    to the maximum."""
    where = destination()
    leases = [await limiter.acquire(where, refused_since=None) for _ in range(8)]
    for lease in leases:  # a whole burst refused: one cut
        await limiter.release(lease, status=429, retry_after_s=0.2)
    assert metrics.OUTBOUND_LIMIT.labels("judge")._value.get() == 4

    # Held for the Retry-After: a new call waits, and the wait is not lost on it.
    started = asyncio.get_running_loop().time()
    lease = await limiter.acquire(where, refused_since=None)
    assert asyncio.get_running_loop().time() - started >= 0.15
    assert lease.refused_since is not None  # held back by a rate limit: the clock runs

    # Four slots now, not eight: a fifth call waits until one is given back.
    more = [await limiter.acquire(where, refused_since=None) for _ in range(3)]
    fifth = asyncio.create_task(limiter.acquire(where, refused_since=None))
    await asyncio.sleep(0.15)
    assert not fifth.done()
    await limiter.release(lease, status=200, retry_after_s=None)
    more.append(await asyncio.wait_for(fifth, 2))

    # Recovery: successes bring the limit back, first to one below the limit refused (8)
    # while the probe period lasts ...
    for held in more:
        await limiter.release(held, status=200, retry_after_s=None)

    async def successes(count: int) -> float:
        for _ in range(count):
            held = await limiter.acquire(where, refused_since=None)
            await limiter.release(held, status=200, retry_after_s=None)
        return metrics.OUTBOUND_LIMIT.labels("judge")._value.get()

    assert await successes(40) == 7
    # ... then to the maximum, never past it.
    await asyncio.sleep(PROBE_TEST_S)
    assert await successes(40) == 8


async def test_destinations_of_other_kinds_and_organizations_are_not_held(
    limiter: DestinationLimiter,
) -> None:
    """A throttled judge does not slow the agent's calls, even on the same host, nor
    another organization's judge."""
    judge = destination("judge")
    lease = await limiter.acquire(judge, refused_since=None)
    await limiter.release(lease, status=429, retry_after_s=30)
    agent = Destination(judge.organization_id, "agent", judge.host)
    other = Destination(str(uuid4()), "judge", judge.host)
    for where in (agent, other):
        lease = await asyncio.wait_for(limiter.acquire(where, refused_since=None), 1)
        await limiter.release(lease, status=200, retry_after_s=None)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(limiter.acquire(judge, refused_since=None), 0.3)


async def test_a_dead_holders_slot_frees_when_its_lease_ends(
    implementation: str, settings: Settings
) -> None:
    """A process killed mid-call never gives its slot back: the lease ends it."""
    made = make_limiter(implementation, settings, max_concurrency=1)
    made.lease_s = 0.3
    try:
        where = destination()
        await made.acquire(where, refused_since=None)  # never released
        lease = await asyncio.wait_for(made.acquire(where, refused_since=None), 2)
        await made.release(lease, status=200, retry_after_s=None)
    finally:
        await made.close()


# --- calls and runs through it ----------------------------------------------------------------


async def test_runs_under_a_token_bucket_judge_end_without_error(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    implementation: str,
) -> None:
    """A judge at 20 requests/s (bursts of 3) and 8 runs of 2 judged turns at once: every
    run passes; the judge refused (in each Retry-After form) and the refusals were counted,
    not spent as attempts."""
    made_limiter = make_limiter(implementation, settings, max_concurrency=8)
    refused_before = rate_limited_count("judge")
    with TokenBucketOpenAI(rate=20, burst=3) as judge:
        t = await tenant(client)
        made = await outbound_setup(client, t, agent.url, judge.url)
        scenario = await create_scenario(
            client,
            t,
            turns=[turn("Hi", criterion("Polite?")), turn("Bye", criterion("Polite?"))],
        )
        runs = [await start_run(client, t, scenario["id"], made.agent_id) for _ in range(8)]
        try:
            await asyncio.gather(
                *(
                    execute_run(app.state.database, settings, UUID(r["id"]), limiter=made_limiter)
                    for r in runs
                )
            )
        finally:
            await made_limiter.close()
        statuses = [(await get_run(client, t, r["id"]))["status"] for r in runs]
    assert statuses == ["passed"] * 8
    assert judge.served == 16
    assert judge.refused > 0
    assert set(judge.forms) == set(FORMS), judge.forms
    assert rate_limited_count("judge") - refused_before == judge.refused
    assert metrics.OUTBOUND_WAITING.labels("judge")._value.get() == 0  # none left waiting


async def test_a_provider_refusing_past_the_wait_ends_the_run_in_error_naming_it(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    implementation: str,
) -> None:
    made_limiter = make_limiter(implementation, settings, max_concurrency=8, wait_s=0.6)
    with TokenBucketOpenAI(rate=20, burst=3, refuse_always=True) as judge:
        t = await tenant(client)
        made = await outbound_setup(client, t, agent.url, judge.url)
        scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Polite?"))])
        run = await start_run(client, t, scenario["id"], made.agent_id)
        try:
            await execute_run(app.state.database, settings, UUID(run["id"]), limiter=made_limiter)
        finally:
            await made_limiter.close()
        ended = await get_run(client, t, run["id"])
    assert ended["status"] == "error"
    message = ended["error_message"]
    assert "rate limited by 127.0.0.1 (judge calls)" in message, message
    assert "SPAR_RATE_LIMIT_WAIT_S" in message
    assert judge.refused >= 3  # it kept trying past the three attempts a failure has


async def test_a_500_is_still_retried_a_bounded_number_of_times(
    limiter: DestinationLimiter,
) -> None:
    with FakeServer(default=Reply(status=500, json={"error": "boom"})) as fake:
        egress = EgressClient(
            EgressPolicy([DomainRule("127.0.0.1")], allow_private=True),
            backoff_s=0.01,
            limiter=limiter,
            organization_id=uuid4(),
        )
        response = await egress.request("POST", f"{fake.url}/v1/chat", json={}, kind="judge")
    assert (response.status_code, response.attempts, len(fake.requests)) == (500, 3, 3)


async def test_the_wait_for_the_destination_does_not_use_up_the_calls_timeout(
    limiter: DestinationLimiter,
) -> None:
    """Refused for longer than the call's own timeout, the call still succeeds: waiting is
    not the call's time (SPAR_RATE_LIMIT_WAIT_S bounds it)."""
    with FakeServer(default=Reply(json={"ok": True})) as fake:
        fake.enqueue(*[Reply(status=429, headers={"retry-after-ms": "150"})] * 4)
        egress = EgressClient(
            EgressPolicy([DomainRule("127.0.0.1")], allow_private=True),
            timeout_s=0.4,
            limiter=limiter,
            organization_id=uuid4(),
        )
        response = await egress.request("POST", f"{fake.url}/v1/chat", json={})
    assert (response.status_code, response.attempts, len(fake.requests)) == (200, 1, 5)


async def test_calls_queued_for_a_full_destination_longer_than_their_timeout_succeed(
    implementation: str, settings: Settings
) -> None:
    """A thousand conversations at one agent queue for its slots: a call waiting for one
    longer than its own timeout still goes out (the wait stops its clock), and answers."""
    made = make_limiter(implementation, settings, max_concurrency=1)
    try:
        with FakeServer(default=Reply(json={"ok": True}, delay=0.25)) as fake:
            egress = EgressClient(
                EgressPolicy([DomainRule("127.0.0.1")], allow_private=True),
                timeout_s=0.5,
                limiter=made,
                organization_id=uuid4(),
            )
            calls = [egress.request("POST", f"{fake.url}/v1/chat", json={}) for _ in range(5)]
            responses = await asyncio.gather(*calls)
    finally:
        await made.close()
    # The last waited about a second for its slot: twice its timeout.
    assert [r.status_code for r in responses] == [200] * 5
    assert len(fake.requests) == 5


async def test_a_call_held_past_the_wait_raises_rate_limited(
    implementation: str, settings: Settings
) -> None:
    made = make_limiter(implementation, settings, max_concurrency=2, wait_s=0.3)
    try:
        where = destination()
        lease = await made.acquire(where, refused_since=None)
        await made.release(lease, status=503, retry_after_s=30)
        with pytest.raises(RateLimited, match=r"rate limited by api\.example\.com"):
            await asyncio.wait_for(made.acquire(where, refused_since=None), 2)
    finally:
        await made.close()


# --- visible: the batch detail and `spar batch run` ---------------------------------------------


async def test_the_batch_detail_names_the_destination_holding_it_back(
    client: AsyncTestClient, settings: Settings, agent: FakeAgent
) -> None:
    """While a running batch's agent host refuses (as a worker records it in Redis), the
    detail says which destination and since when; another organization's batch of an agent
    on the same host is not held back by it."""
    w = await make_world(client, agent)
    other = await make_world(client, agent)
    mine = await make_scenario(client, w)
    theirs = await make_scenario(client, other)
    batch = await create_batch(client, w, scenario_ids=[mine["id"]])
    others = await create_batch(client, other, scenario_ids=[theirs["id"]])
    assert (await get_batch(client, w, batch["id"]))["rate_limited"] is None

    worker_limiter = make_limiter("redis", settings, max_concurrency=8)
    try:
        where = Destination(str(w.t.id), "agent", "127.0.0.1")
        lease = await worker_limiter.acquire(where, refused_since=None)
        await worker_limiter.release(lease, status=429, retry_after_s=5)
    finally:
        await worker_limiter.close()

    limited = (await get_batch(client, w, batch["id"]))["rate_limited"]
    assert limited is not None
    assert (limited["destination"], limited["kind"]) == ("127.0.0.1", "agent")
    since = datetime.fromisoformat(limited["since"])
    assert abs((datetime.now(UTC) - since).total_seconds()) < 5
    assert (await get_batch(client, other, others["id"]))["rate_limited"] is None
    listed = await client.get(f"{w.batches}/", headers=w.headers)
    assert "rate_limited" not in listed.json()["batch_runs"][0]  # the detail's only

    # The results page says it too: on the page, and in what its live script polls.
    cookie = {"Cookie": f"{COOKIE}={w.t.owner.token}"}
    page = await client.get(f"/ui/orgs/{w.t.id}/batches/{batch['id']}", headers=cookie)
    assert page.status_code == 200, page.text
    assert "Held back by the rate limit of 127.0.0.1 (agent calls)" in page.text
    polled = await client.get(f"/ui/orgs/{w.t.id}/batches/{batch['id']}/progress", headers=cookie)
    assert polled.json()["batch"]["rate_limited"]["destination"] == "127.0.0.1"
    page = await client.get(
        f"/ui/orgs/{other.t.id}/batches/{others['id']}",
        headers={"Cookie": f"{COOKIE}={other.t.owner.token}"},
    )
    assert "Held back by the rate limit" not in page.text

    # And the event stream's progress events, until the batch is played out (by a worker
    # with no limiter here) and the stream ends with it.
    async def play(database: Database) -> None:
        await asyncio.sleep(1.0)
        pending = deque(await dispatch_committed(database, UUID(batch["id"])))
        while pending:
            pending.extend(await execute_run(database, settings, pending.popleft()) or [])

    with Background(settings, batch["id"], play):
        events = await read_events(client, w, batch["id"])
    progress = [data for name, data in events if name == "progress"]
    assert progress[0]["rate_limited"]["destination"] == "127.0.0.1", progress[0]
    assert progress[0]["rate_limited"]["kind"] == "agent"
    assert events[-1][0] == "end" and events[-1][1]["status"] == "completed", events[-1]


def test_spar_batch_run_says_which_rate_limit_holds_the_batch_back() -> None:
    now = datetime.now(UTC)
    batch = BatchRunRead(
        id=uuid4(),
        organization_id=uuid4(),
        agent_id=uuid4(),
        agent_name="bot",
        status=BatchStatus.RUNNING,
        total_scenarios=4,
        completed_scenarios=1,
        passed_scenarios=1,
        failed_scenarios=0,
        error_scenarios=0,
        max_concurrency=4,
        started_at=now,
        completed_at=None,
        created_at=now,
        updated_at=now,
        rate_limited=RateLimitedRead(destination="api.openai.com", kind="judge", since=now),
    )
    console = Console(record=True, width=200, force_terminal=False)
    with progress_bar(console, 4) as show:
        show(batch)
    text = console.export_text()
    assert "held back by the rate limit of api.openai.com (judge calls) since" in text, text


async def test_the_redis_limiters_calls_sent_together_keep_the_limit_and_survive_a_script_flush(
    settings: Settings,
) -> None:
    """The Redis limiter sends the scripts of concurrent calls in one pipeline: each call
    still gets its own answer (never more holders than the limit, every slot given back),
    and scripts Redis has forgotten (a restart, ``SCRIPT FLUSH``) are loaded again."""
    import redis.asyncio as aioredis

    assert settings.redis_url
    made = make_limiter("redis", settings, max_concurrency=5)
    where = destination()
    holding = peak = 0

    async def call() -> None:
        nonlocal holding, peak
        lease = await made.acquire(where, refused_since=None)
        holding += 1
        peak = max(peak, holding)
        await asyncio.sleep(0.01)
        holding -= 1
        await made.release(lease, status=200, retry_after_s=None)

    admin = aioredis.Redis.from_url(settings.redis_url)
    try:
        await asyncio.gather(*(call() for _ in range(40)))
        await admin.script_flush()
        await asyncio.gather(*(call() for _ in range(40)))
        assert peak == 5, peak  # the limit, reached and never passed
        assert await admin.zcard(where.key + ":holders") == 0  # every slot given back
    finally:
        await admin.aclose()
        await made.close()


def loopback_egress(limiter: DestinationLimiter, organization: UUID) -> EgressClient:
    """Calls to loopback servers, limited by ``limiter``, as ``organization``'s."""
    return EgressClient(
        EgressPolicy([DomainRule("127.0.0.1")], allow_private=True),
        limiter=limiter,
        organization_id=organization,
    )


@contextmanager
def answering_as_redis_pauses(redis_url: str, pause_ms: int) -> Iterator[FakeServer]:
    """A loopback server that pauses the writes of the Redis at ``redis_url`` (a test's own:
    ``own_redis_url``) for ``pause_ms`` as it answers, as a busy Redis would be slow just
    then: every script sent meanwhile waits.  Redis goes on at the end, whatever happened."""
    import redis

    pauser = redis.Redis.from_url(redis_url)

    class PausingRedis(FakeServer):
        def handle(self, request: RecordedRequest) -> Reply:
            pauser.client_pause(pause_ms, all=False)  # WRITE: every script waits
            return Reply(json={"ok": True})

    try:
        with PausingRedis() as fake:
            yield fake
    finally:
        pauser.client_unpause()
        pauser.close()


async def test_a_calls_answer_does_not_wait_for_its_slot_to_be_given_back(
    own_redis_url: str,
) -> None:
    """The slot is given back off the call's path: Redis pausing writes just as the answer
    comes (as a busy Redis would be slow) holds up the release, not the answer.  The slot
    is given back once Redis goes on, and a refusal's hold is in place before the call's
    next attempt asks for a slot (the release is queued ahead of it)."""
    import redis.asyncio as aioredis

    pause_ms = 1500
    made = redis_limiter(own_redis_url, max_concurrency=4)
    admin = aioredis.Redis.from_url(own_redis_url)
    organization = uuid4()
    try:
        with answering_as_redis_pauses(own_redis_url, pause_ms) as fake:
            egress = loopback_egress(made, organization)
            started = asyncio.get_running_loop().time()
            response = await egress.request("POST", f"{fake.url}/v1/chat", json={})
            took = asyncio.get_running_loop().time() - started
            assert response.status_code == 200
            assert took < pause_ms / 1000 / 2, took
            holders = Destination(str(organization), "agent", "127.0.0.1").key + ":holders"
            assert await admin.zcard(holders) == 1  # not given back yet: Redis is paused
            await asyncio.sleep(pause_ms / 1000 - took + 0.5)  # Redis goes on
            assert await admin.zcard(holders) == 0
        with FakeServer(default=Reply(json={"ok": True})) as fake:
            fake.enqueue(Reply(status=429, headers={"retry-after-ms": "300"}))
            egress = loopback_egress(made, organization)
            started = asyncio.get_running_loop().time()
            response = await egress.request("POST", f"{fake.url}/v1/chat", json={})
            assert response.status_code == 200
            assert asyncio.get_running_loop().time() - started >= 0.3
    finally:
        await admin.aclose()
        await made.close()


async def test_a_closing_limiter_gives_back_the_slots_queued_for_release(
    own_redis_url: str,
) -> None:
    """A call does not wait for its slot's release, so a worker that stops just after a
    call still has the release queued: closing the limiter (as the worker stops) sends it
    before the connection goes, even while Redis is slow, rather than leave the slot taken
    for its lease."""
    import redis.asyncio as aioredis

    made = redis_limiter(own_redis_url, max_concurrency=4)
    admin = aioredis.Redis.from_url(own_redis_url)
    organization = uuid4()
    holders = Destination(str(organization), "agent", "127.0.0.1").key + ":holders"
    try:
        with answering_as_redis_pauses(own_redis_url, 800) as fake:
            egress = loopback_egress(made, organization)
            response = await egress.request("POST", f"{fake.url}/v1/chat", json={})
            assert response.status_code == 200
            assert await admin.zcard(holders) == 1  # the release waits for Redis
            await made.close()
            assert await admin.zcard(holders) == 0  # sent before the limiter closed
    finally:
        await admin.aclose()
        await made.close()


async def test_a_closing_limiter_waits_for_a_stalled_redis_only_so_long(
    own_redis_url: str,
) -> None:
    """A Redis that does not answer holds a closing limiter up for ``CLOSE_S`` at most, not
    for a round trip's whole timeout: the releases not sent are dropped (their leases run
    out), and the limiter does not open its connection again once closed."""
    import redis.asyncio as aioredis

    from shared.outbound.limits import CLOSE_S, ROUND_TRIP_S, WIRE_NAME

    made = redis_limiter(own_redis_url, max_concurrency=2)
    admin = aioredis.Redis.from_url(own_redis_url)
    try:
        lease = await made.acquire(destination(), refused_since=None)
        await admin.client_pause(int((ROUND_TRIP_S + 1) * 1000), all=False)
        released = made.release(lease, status=200, retry_after_s=None)
        started = asyncio.get_running_loop().time()
        await made.close()
        took = asyncio.get_running_loop().time() - started
        assert CLOSE_S - 0.5 <= took < ROUND_TRIP_S, took
        assert released.done()  # settled as Redis being away settles it, not left hanging
        await admin.client_unpause()
        await asyncio.sleep(0.3)
        clients = await admin.client_list()
        assert not [c for c in clients if c.get("name") == WIRE_NAME], clients
    finally:
        await admin.client_unpause()
        await admin.aclose()
        await made.close()


async def test_the_redis_limiters_connection_authenticates_selects_its_database_and_reconnects(
    settings: Settings,
) -> None:
    """The limiter's own connection (not redis-py's) logs in with the URL's password, uses
    the URL's database, and, killed by Redis between two calls, is opened again: no call
    fails and the limit's state carries on.  A batch detail's read of a hold goes on that
    same connection: the limiter holds one connection to Redis, no more."""
    import redis.asyncio as aioredis

    from shared.outbound.limits import WIRE_NAME
    from tests.support.processes import private_redis

    assert settings.redis_url
    with private_redis(settings.redis_url) as url:
        if url == settings.redis_url:
            pytest.skip("no redis-server to start a private one with a password")
        admin = aioredis.Redis.from_url(url)
        await admin.config_set("requirepass", "s3cret")
        await admin.aclose()
        port = url.rsplit(":", 1)[1].split("/")[0]
        secured = f"redis://:s3cret@127.0.0.1:{port}"
        admin = aioredis.Redis.from_url(f"{secured}/3")
        made = redis_limiter(f"{secured}/3", max_concurrency=2)
        where = destination()
        try:
            first = [await made.acquire(where, refused_since=None) for _ in range(2)]
            assert await admin.zcard(where.key + ":holders") == 2  # in database 3
            for client in await admin.client_list():
                if client["name"] == WIRE_NAME:
                    await admin.client_kill_filter(_id=client["id"])
            for lease in first:  # on a new connection
                await made.release(lease, status=200, retry_after_s=None)
            assert await admin.zcard(where.key + ":holders") == 0
            again = await made.acquire(where, refused_since=None)
            assert await admin.zcard(where.key + ":holders") == 1
            await made.release(again, status=200, retry_after_s=None)
            refused = await made.acquire(where, refused_since=None)
            await made.release(refused, status=429, retry_after_s=30)
            held = await made.held_back([where])
            assert held is not None and held[0] == where
            clients = await admin.client_list()
            assert [client["name"] for client in clients].count(WIRE_NAME) == 1
            assert len(clients) == 2  # the limiter's and this test's
        finally:
            await admin.aclose()
            await made.close()


async def test_without_redis_calls_go_out_unlimited_rather_than_fail() -> None:
    unreachable = redis_limiter(f"redis://127.0.0.1:{free_port()}/0", max_concurrency=1)
    try:
        where = destination()
        leases = [await unreachable.acquire(where, refused_since=None) for _ in range(3)]
        for lease in leases:
            await unreachable.release(lease, status=429, retry_after_s=30)
        assert await unreachable.held_back([where]) is None
    finally:
        await unreachable.close()


async def test_a_run_waiting_for_its_destination_keeps_its_heartbeat(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent, db: AsyncSession
) -> None:
    """Waiting is not death: while its judge holds it back, the run's heartbeat moves on
    (every 0.5 s here), so the sweeper never takes it for a dead worker's."""
    beating = msgspec.structs.replace(settings, run_heartbeat_timeout_s=3.0)
    made_limiter = make_limiter("local", settings, max_concurrency=4)
    with TokenBucketOpenAI(rate=1000, burst=1000) as judge:
        judge.enqueue(*[Reply(status=429, headers={"retry-after-ms": "400"})] * 4)
        t = await tenant(client)
        made = await outbound_setup(client, t, agent.url, judge.url)
        scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Polite?"))])
        run = await start_run(client, t, scenario["id"], made.agent_id)
        playing = asyncio.create_task(
            execute_run(app.state.database, beating, UUID(run["id"]), limiter=made_limiter)
        )
        beats = set()
        while not playing.done():
            beat = await db.scalar(
                text("SELECT heartbeat_at FROM scenario_runs WHERE id = :id"), {"id": run["id"]}
            )
            await db.commit()
            if beat is not None:
                beats.add(beat)
            await asyncio.sleep(0.1)
        await playing
        ended = await get_run(client, t, run["id"])
    assert ended["status"] == "passed", ended
    assert len(judge.requests) == 5  # four refusals, then the answer
    assert len(beats) >= 3, beats  # claimed, then beating while it waited
