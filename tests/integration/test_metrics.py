"""``GET /metrics`` and what it measures: HTTP requests by route template, queue depth and
age read from Redis at scrape time, actors' messages, and the request id of each request;
the API's own families only, under the Content-Type Prometheus expects, and a worker's
counters at 0 from its start."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import dramatiq
import msgspec
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import exposition
from shared.queue import get_broker
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support import metrics as families
from tests.support.factories import tenant
from tests.support.fakes import FakeAgent, FakeOpenAI
from tests.support.scenario_setup import (
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)
from workers.metrics import count_from_zero
from workers.observability import observe_messages

PASS = '{"verdict": "PASS", "critique": "polite", "evidence": "Hello"}'


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def scrape(client: AsyncTestClient, **headers: str) -> str:
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    # Exactly prometheus_client's: one charset (Prometheus 3 refuses a repeated parameter).
    assert response.headers.get_list("content-type") == [CONTENT_TYPE_LATEST]
    return response.text


# --- HTTP ----------------------------------------------------------------------------------------


async def test_requests_are_measured_by_route_template_never_by_raw_path(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    route = "/v1/orgs/{org_id}/agents"
    for _ in range(3):
        assert (await client.get(f"/v1/orgs/{t.id}/agents", headers=t.owner.headers)).is_success
    missing = await client.get(f"/v1/orgs/{t.id}/agents/{uuid.uuid4()}", headers=t.owner.headers)
    assert missing.status_code == 404

    text = await scrape(client)
    found = samples(text)
    count = (
        "spar_http_request_duration_seconds_count",
        frozenset({("method", "GET"), ("route", route)}),
    )
    assert found[count] >= 3
    bucket = {("method", "GET"), ("route", route), ("le", "+Inf")}
    assert found["spar_http_request_duration_seconds_bucket", frozenset(bucket)] >= 3
    ok = {("method", "GET"), ("route", route), ("status", "200")}
    assert found["spar_http_requests_total", frozenset(ok)] >= 3
    not_found = {("method", "GET"), ("route", route + "/{agent_id}"), ("status", "404")}
    assert found["spar_http_requests_total", frozenset(not_found)] >= 1
    # No organization id, user or token anywhere in what a scrape shows.
    assert t.id not in text
    assert t.owner.token not in text


async def test_the_metrics_route_shows_the_broker_and_every_queue(client: AsyncTestClient) -> None:
    found = samples(await scrape(client))
    assert found["spar_broker_up", frozenset()] == 1
    for queue in ("runs", "batches"):
        assert ("spar_queue_ready_messages", frozenset({("queue", queue)})) in found
        assert ("spar_queue_oldest_message_age_seconds", frozenset({("queue", queue)})) in found


async def test_the_api_exports_its_own_families_only(client: AsyncTestClient) -> None:
    # This process defines every family (the tests import the workers' and the
    # scheduler's modules): the API's scrape still shows only its own.
    assert REGISTRY.get_sample_value("spar_scheduler_leading") is not None
    assert REGISTRY.get_sample_value("spar_runs_in_flight") is not None
    await client.get("/health/live")
    exported = families.spar_families(families.parse(CONTENT_TYPE_LATEST, await scrape(client)))
    assert exported == families.API


async def test_with_a_metrics_token_the_route_needs_it(
    client: AsyncTestClient, app: Litestar, settings: Settings
) -> None:
    app.state.settings = msgspec.structs.replace(settings, metrics_token="scrape-secret")
    try:
        assert (await client.get("/metrics")).status_code == 401
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "spar_broker_up" in await scrape(client, Authorization="Bearer scrape-secret")
    finally:
        app.state.settings = settings


# --- request ids ---------------------------------------------------------------------------------


async def test_a_valid_request_id_is_echoed_and_an_unsafe_one_replaced(
    client: AsyncTestClient,
) -> None:
    given = await client.get("/health/live", headers={"X-Request-ID": "lb-4f2a.7"})
    assert given.headers["x-request-id"] == "lb-4f2a.7"

    unsafe = await client.get("/health/live", headers={"X-Request-ID": "x" * 500})
    made = unsafe.headers["x-request-id"]
    assert len(made) == 32 and made != "x" * 500

    errors = await client.get("/v1/auth/me")  # 401 from the guard still carries one
    assert errors.status_code == 401
    assert errors.headers["x-request-id"]
    assert errors.headers["x-request-id"] != made


async def test_the_access_log_names_the_request_id_and_no_secret(
    client: AsyncTestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="spar.access")
    password = "correct-horse-battery-staple-42"
    response = await client.post(
        "/v1/auth/login",
        json={"email": "nobody@example.com", "password": password},
        headers={"X-Request-ID": "login-trace-1", "Authorization": "Bearer ust_secret_value"},
    )
    assert response.status_code == 401
    (line,) = [r for r in caplog.records if r.name == "spar.access"]
    assert line.getMessage() == "POST /v1/auth/login 401"
    assert line.route == "/v1/auth/login"  # type: ignore[attr-defined]
    logged = "\n".join(caplog.text.splitlines())
    assert password not in logged
    assert "ust_secret_value" not in logged


# --- queues (real Redis) ------------------------------------------------------------------------


@pytest.fixture
def redis_broker(settings: Settings) -> Iterator[RedisBroker]:
    """Dramatiq's Redis broker under a namespace of this test's own (nothing else reads it)."""
    namespace = f"spar-test-{uuid.uuid4().hex}"
    broker = RedisBroker(url=settings.redis_url, namespace=namespace)
    for queue in ("runs", "batches"):
        broker.declare_queue(queue)
    yield broker
    client = redis.Redis.from_url(settings.redis_url)
    keys = list(client.scan_iter(f"{namespace}:*"))
    if keys:
        client.delete(*keys)


def queue_gauges(broker: dramatiq.Broker, queue: str) -> dict[str, float]:
    found = samples(exposition(broker, ()).decode())
    label = frozenset({("queue", queue)})
    return {
        name: found[f"spar_queue_{name}", label]
        for name in (
            "ready_messages",
            "held_messages",
            "delayed_messages",
            "dead_messages",
            "oldest_message_age_seconds",
        )
    }


def message(queue: str, *, age_s: float = 0.0) -> dramatiq.Message:
    return dramatiq.Message(
        queue_name=queue,
        actor_name="run_scenario",
        args=("r",),
        kwargs={},
        options={},
        message_timestamp=int((time.time() - age_s) * 1000),
    )


def test_queue_depth_and_oldest_age_follow_what_redis_holds(redis_broker: RedisBroker) -> None:
    empty = queue_gauges(redis_broker, "runs")
    assert empty["ready_messages"] == 0
    assert empty["oldest_message_age_seconds"] == 0

    redis_broker.enqueue(message("runs", age_s=90))
    redis_broker.enqueue(message("runs"))
    redis_broker.enqueue(message("runs"), delay=60_000)
    waiting = queue_gauges(redis_broker, "runs")
    assert waiting["ready_messages"] == 2
    assert waiting["delayed_messages"] == 1
    assert 90 <= waiting["oldest_message_age_seconds"] < 120
    assert queue_gauges(redis_broker, "batches")["ready_messages"] == 0

    # A worker takes the oldest: it is held, no longer waiting; the next one is the oldest.
    consumer = redis_broker.consume("runs", prefetch=1, timeout=100)
    taken = next(consumer)
    held = queue_gauges(redis_broker, "runs")
    assert held["ready_messages"] == 1
    assert held["held_messages"] == 1
    assert held["oldest_message_age_seconds"] < 30

    consumer.ack(taken)
    consumer.close()
    assert queue_gauges(redis_broker, "runs")["held_messages"] == 0


def test_an_unreachable_broker_reports_down_without_failing_the_scrape() -> None:
    broker = RedisBroker(url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    broker.declare_queue("runs")
    found = samples(exposition(broker, ()).decode())
    assert found["spar_broker_up", frozenset()] == 0
    assert not any(name.startswith("spar_queue_") for name, _ in found)


# --- actors (in-memory broker and worker) ----------------------------------------------------


def test_actor_counters_move_as_a_worker_processes_messages() -> None:
    # A worker's broker (Spar's middleware), of this test's own.
    broker = observe_messages(get_broker.__wrapped__(Settings()))
    queue = "metrics-test"

    @dramatiq.actor(broker=broker, queue_name=queue, max_retries=1, min_backoff=10, max_backoff=10)
    async def measured(fail: bool) -> None:
        if fail:
            raise RuntimeError("failing on purpose")

    labels = {"queue": queue, "actor": "measured"}
    before = {
        "succeeded": value("spar_actor_messages_total", **labels, outcome="succeeded"),
        "failed": value("spar_actor_messages_total", **labels, outcome="failed"),
        "retries": value("spar_actor_message_retries_total", **labels),
        "dead": value("spar_actor_messages_dead_lettered_total", **labels),
        "timed": value("spar_actor_message_duration_seconds_count", **labels),
    }
    measured.send(False)
    measured.send(False)
    measured.send(True)  # fails, is retried once, fails again and is dead-lettered
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
    worker.start()
    try:
        broker.join(queue, timeout=10_000, fail_fast=False)
        worker.join()
    finally:
        worker.stop()

    assert (
        value("spar_actor_messages_total", **labels, outcome="succeeded") - before["succeeded"] == 2
    )
    assert value("spar_actor_messages_total", **labels, outcome="failed") - before["failed"] == 2
    assert value("spar_actor_message_retries_total", **labels) - before["retries"] == 1
    assert value("spar_actor_messages_dead_lettered_total", **labels) - before["dead"] == 1
    assert value("spar_actor_message_duration_seconds_count", **labels) - before["timed"] == 4
    assert value("spar_actor_messages_in_progress", **labels) == 0


def test_a_worker_starts_the_counters_of_the_actors_it_takes_at_zero() -> None:
    """A first dead letter is an ``increase`` only if the series was there, at 0, before."""
    broker = observe_messages(get_broker.__wrapped__(Settings()))
    taken, other = f"zero-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"

    @dramatiq.actor(broker=broker, queue_name=taken)
    def counted() -> None: ...

    @dramatiq.actor(broker=broker, queue_name=other)
    def elsewhere() -> None: ...

    worker = dramatiq.Worker(broker, queues={taken}, worker_threads=1, worker_timeout=50)
    worker.start()
    worker.stop()
    labels = {"queue": taken, "actor": "counted"}
    assert REGISTRY.get_sample_value("spar_actor_messages_dead_lettered_total", labels) == 0
    assert REGISTRY.get_sample_value("spar_actor_message_retries_total", labels) == 0
    for outcome in ("succeeded", "failed", "skipped"):
        assert (
            REGISTRY.get_sample_value("spar_actor_messages_total", {**labels, "outcome": outcome})
            == 0
        )
    # An actor of a queue this worker does not take is another worker's to count.
    elsewhere_labels = {"queue": other, "actor": "elsewhere"}
    assert (
        REGISTRY.get_sample_value("spar_actor_messages_dead_lettered_total", elsewhere_labels)
        is None
    )


def test_a_worker_that_calls_out_starts_the_outbound_limit_series_of_every_kind() -> None:
    count_from_zero(get_broker.__wrapped__(Settings()), {"runs"})
    for kind in ("agent", "judge", "simulator"):
        labels = {"kind": kind}
        assert REGISTRY.get_sample_value("spar_outbound_rate_limited_total", labels) is not None
        assert REGISTRY.get_sample_value("spar_outbound_calls_waiting", labels) is not None
        assert REGISTRY.get_sample_value("spar_outbound_limit", labels) is not None


# --- runs and outbound calls ----------------------------------------------------------------------


async def test_finished_runs_and_agent_and_judge_calls_are_counted(
    client: AsyncTestClient, app: Litestar, settings: Settings
) -> None:
    t = await tenant(client)
    with FakeAgent(reply="Hello there") as agent, FakeOpenAI(reply=PASS) as judge:
        setup = await outbound_setup(client, t, agent.url, judge.url)
        scenario = await create_scenario(client, t, turns=[turn("Hi", criterion("Is it polite?"))])
        agent_calls = {"target": "agent", "kind": "http", "provider": "spar"}
        judge_calls = {"target": "judge", "kind": "llm", "provider": "openai_compatible"}
        before = (
            value("spar_runs_finished_total", status="passed"),
            value("spar_outbound_call_duration_seconds_count", **agent_calls),
            value("spar_outbound_call_duration_seconds_count", **judge_calls),
        )
        run = await start_run(client, t, scenario["id"], setup.agent_id)
        await execute_run(app.state.database, settings, uuid.UUID(run["id"]))
        # A second delivery of the same message finds the run finished: not counted again.
        await execute_run(app.state.database, settings, uuid.UUID(run["id"]))
    assert (await get_run(client, t, run["id"]))["status"] == "passed"
    after = (
        value("spar_runs_finished_total", status="passed"),
        value("spar_outbound_call_duration_seconds_count", **agent_calls),
        value("spar_outbound_call_duration_seconds_count", **judge_calls),
    )
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]
    assert value("spar_runs_in_flight") == 0


async def test_a_run_whose_agent_cannot_be_reached_counts_an_error(
    client: AsyncTestClient, app: Litestar, settings: Settings
) -> None:
    t = await tenant(client)
    with FakeAgent(reply="unused") as agent:
        # The agent's host is not on the allow-list: egress refuses the call.
        setup = await outbound_setup(client, t, agent.url, domain="agents.example.com")
        scenario = await create_scenario(client, t)
        refused = {"target": "agent", "kind": "http", "provider": "spar", "error": "HostNotAllowed"}
        before = (
            value("spar_runs_finished_total", status="error"),
            value("spar_outbound_call_errors_total", **refused),
        )
        run = await start_run(client, t, scenario["id"], setup.agent_id)
        await execute_run(app.state.database, settings, uuid.UUID(run["id"]))
    assert (await get_run(client, t, run["id"]))["status"] == "error"
    assert value("spar_runs_finished_total", status="error") - before[0] == 1
    assert value("spar_outbound_call_errors_total", **refused) - before[1] == 1
    assert agent.requests == []
