"""Traces of scenario runs (docs/operations.md, "Traces"): with the standard
``OTEL_EXPORTER_OTLP_*`` variables set, a run exports OpenTelemetry spans over OTLP/HTTP
following the GenAI semantic conventions, and the run records its trace id.

The worker's side runs in the test's process, as the workers play a run
(``execute_run``), with tracing turned on from the environment as a worker process turns
it on (:func:`shared.traces.configure`) and flushed as it shuts down
(:func:`shared.traces.shutdown`).  Spar keeps its own tracer provider, never OTel's
process-global one, so each test has a provider of its own.  The collector is a loopback
:class:`~tests.support.otlp.OTLPReceiver` that decodes the protobuf it receives with
``opentelemetry-proto``; the agent and the judge are loopback fakes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from shared import traces
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import create_batch, drain, make_scenario, make_world
from tests.support.factories import Tenant, tenant
from tests.support.fakes import (
    FakeAgent,
    FakeOpenAI,
    FakeServer,
    FakeSimulator,
    Reply,
    openai_completion,
    verdict_from_marker,
)
from tests.support.otlp import OTLPReceiver, ReceivedSpan
from tests.support.scenario_setup import (
    allow_domain,
    create_http_agent,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    start_run,
    turn,
)

EVALUATION = "gen_ai.evaluation.result"
SECRETS = {"agent_token": "tok-7c1f9e-never-exported", "judge_key": "sk-judge-4b2d-never-exported"}
# The judge answers as a provider does: with the dated model behind the alias it was asked.
JUDGE_MODEL, JUDGE_RESPONSE_MODEL = "judge-model", "judge-model-2026-01-15"


def judge_answer(request: Any) -> Reply:
    return Reply(
        json=openai_completion(
            verdict_from_marker(request.json),
            model=JUDGE_RESPONSE_MODEL,
            prompt_tokens=101,
            completion_tokens=13,
        )
    )


@pytest.fixture(autouse=True)
def _tracing_stopped() -> Iterator[None]:
    """No test leaves tracing on for the next, whatever it asserted."""
    yield
    traces.shutdown()


@pytest.fixture
def collector() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as receiver:
        yield receiver


@pytest.fixture
def tracing(collector: OTLPReceiver, monkeypatch: pytest.MonkeyPatch) -> OTLPReceiver:
    """Tracing turned on as a worker process turns it on: the collector's address in
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter adds ``/v1/traces``), a header for it in
    ``OTEL_EXPORTER_OTLP_HEADERS``, no ``OTEL_SERVICE_NAME``."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-tenant=spar-tests")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    assert traces.configure("spar-worker")
    assert traces.enabled()
    return collector


def exported(collector: OTLPReceiver) -> list[ReceivedSpan]:
    """Everything the process exported, flushed as a worker flushes when it stops."""
    traces.shutdown()
    return collector.spans()


def tree(spans: list[ReceivedSpan]) -> dict[str | None, list[ReceivedSpan]]:
    """The spans by their parent's id (``None``: the roots), each list in start order."""
    children: dict[str | None, list[ReceivedSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    return children


def only(spans: list[ReceivedSpan]) -> ReceivedSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


async def world(
    client: AsyncTestClient, agent_url: str, judge_url: str
) -> tuple[Tenant, dict[str, Any]]:
    """An organization that reaches the agent with a credential in a header, and a judge
    called with a credential as its key."""
    t = await tenant(client)
    for key, value in SECRETS.items():
        response = await client.put(
            f"/v1/orgs/{t.id}/credentials/{key}", json={"value": value}, headers=t.owner.headers
        )
        assert response.status_code == 201, response.text
    await allow_domain(client, t, headers={"X-Agent-Token": "{{credentials.agent_token}}"})
    await create_judge_provider(
        client, t, judge_url, default_model=JUDGE_MODEL, credential_key="judge_key"
    )
    agent = await create_http_agent(client, t, agent_url, name="support bot")
    return t, agent


async def play(app: Litestar, settings: Settings, run_id: str) -> None:
    await execute_run(app.state.database, settings, UUID(run_id))


# --- a run's trace -------------------------------------------------------------------------------


async def test_a_run_exports_its_turns_agent_and_judge_calls_and_verdicts(
    client: AsyncTestClient, app: Litestar, settings: Settings, tracing: OTLPReceiver
) -> None:
    # The order number is no hex string: an id or a trace id cannot hold it by chance.
    replies = {"Where is order XK-4411?": "Order XK-4411 ships tomorrow.", "Refund it": "Refunded."}
    with (
        FakeAgent(reply=lambda body: replies[body["message"]]) as agent,
        FakeServer(default=judge_answer) as judge,
    ):
        t, made = await world(client, agent.url, judge.url)
        scenario = await create_scenario(
            client,
            t,
            name="order status",
            turns=[
                turn(
                    "Where is order {{ order }}?",
                    criterion("Does it give the delivery date? [judge:PASS]"),
                    criterion("tomorrow", "contains"),
                ),
                turn("Refund it", criterion("Does it ask for the reason? [judge:FAIL]")),
            ],
            customer_context={"order": "XK-4411"},
        )
        run = await start_run(client, t, scenario["id"], made["id"])
        await play(app, settings, run["id"])
        ports = {"agent": agent.port, "judge": judge.port}
    done = await get_run(client, t, run["id"])
    assert done["status"] == "failed", done
    spans = exported(tracing)

    # One trace, the run's: its id is on the run.
    assert {s.trace_id for s in spans} == {done["trace_id"]}
    assert len(done["trace_id"]) == 32 and int(done["trace_id"], 16)
    children = tree(spans)
    root = only(children[None])
    assert root.name == "scenario_run order status"
    assert root.scope == "spar"
    assert root.resource["service.name"] == "spar-worker"
    assert root.attributes == {
        "spar.run.id": run["id"],
        "spar.run.delivery": 1,
        "spar.scenario.id": scenario["id"],
        "spar.scenario.name": "order status",
        "spar.agent.id": made["id"],
        gen_ai.GEN_AI_CONVERSATION_ID: run["session_id"],
        "spar.run.status": "failed",
    }
    assert root.status == "STATUS_CODE_UNSET"  # a failed test is not a failed operation

    # A span per turn under the run, in order.
    turns = children[root.span_id]
    assert [(s.name, s.attributes) for s in turns] == [
        ("turn 0", {"spar.turn.index": 0, "spar.turn.source": "scripted"}),
        ("turn 1", {"spar.turn.index": 1, "spar.turn.source": "scripted"}),
    ]
    for index, turn_span in enumerate(turns):
        calls = children[turn_span.span_id]
        agent_span, *judge_spans = calls
        # The agent's call: invoke_agent, its name and id, the conversation, its usage.
        assert agent_span.name == "invoke_agent support bot"
        assert agent_span.kind == "SPAN_KIND_CLIENT"
        assert agent_span.attributes == {
            gen_ai.GEN_AI_OPERATION_NAME: "invoke_agent",
            gen_ai.GEN_AI_AGENT_NAME: "support bot",
            gen_ai.GEN_AI_AGENT_ID: made["id"],
            gen_ai.GEN_AI_CONVERSATION_ID: run["session_id"],
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: 17,
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
            "server.address": "127.0.0.1",
            "server.port": ports["agent"],
            "spar.agent.protocol": "spar",
        }
        # The judge's call (one per llm_evaluated criterion): chat, provider, models, usage.
        judge_span = only(judge_spans)
        assert judge_span.name == f"chat {JUDGE_MODEL}"
        assert judge_span.kind == "SPAN_KIND_CLIENT"
        assert judge_span.attributes == {
            gen_ai.GEN_AI_OPERATION_NAME: "chat",
            gen_ai.GEN_AI_PROVIDER_NAME: "openai_compatible",
            gen_ai.GEN_AI_REQUEST_MODEL: JUDGE_MODEL,
            gen_ai.GEN_AI_RESPONSE_MODEL: JUDGE_RESPONSE_MODEL,
            gen_ai.GEN_AI_OUTPUT_TYPE: "json",
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: 101,
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: 13,
            "server.address": "127.0.0.1",
            "server.port": ports["judge"],
            "spar.call.kind": "judge",
        }
        assert children.get(agent_span.span_id) is None and judge_span.span_id not in children
        assert all(s.status == "STATUS_CODE_UNSET" for s in calls), index

    # Each criterion's verdict: an evaluation event on its turn's span.
    first, second = (
        [
            (
                e.attributes[gen_ai.GEN_AI_EVALUATION_NAME],
                e.attributes[gen_ai.GEN_AI_EVALUATION_SCORE_LABEL],
                e.attributes.get(gen_ai.GEN_AI_EVALUATION_EXPLANATION),
                e.attributes["spar.criterion.type"],
            )
            for e in turn_span.events_named(EVALUATION)
        ]
        for turn_span in turns
    )
    assert first == [
        ("Does it give the delivery date? [judge:PASS]", "PASS", "judged PASS", "llm_evaluated"),
        # A check's critique quotes the reply: not exported.
        ("tomorrow", "PASS", None, "contains"),
    ]
    assert second == [
        ("Does it ask for the reason? [judge:FAIL]", "FAIL", "judged FAIL", "llm_evaluated")
    ]
    criteria_ids = [[c["criteria_id"] for c in r["criteria_results"]] for r in done["turn_results"]]
    assert [
        [e.attributes["spar.criterion.id"] for e in s.events_named(EVALUATION)] for s in turns
    ] == criteria_ids

    # Never the conversation, a credential or a header: not even redacted.
    leaks = ["XK-4411", "tomorrow.", "Refund", "Refunded", "X-Agent-Token", *SECRETS.values()]
    for span in spans:
        for value in span.strings():
            assert not any(leak.lower() in value.lower() for leak in leaks), (span.name, value)
    # The exporter sent the standard variables' header, protobuf, to /v1/traces.
    assert all(r.header("x-collector-tenant") == "spar-tests" for r in tracing.exports())


async def test_a_simulated_conversation_traces_its_simulator_calls_and_conversation_verdicts(
    client: AsyncTestClient, app: Litestar, settings: Settings, tracing: OTLPReceiver
) -> None:
    """A simulated user: its turns are spans marked ``simulated``, each simulator call a
    ``chat`` span of kind ``simulator`` under the run (the final ``done`` answer too), and
    the conversation criteria's verdicts events on the run's span."""
    with (
        FakeAgent(reply="Happy to help.") as agent,
        FakeServer(default=judge_answer) as judge,
        FakeSimulator(done_at=2) as simulator,
    ):
        t, made = await world(client, agent.url, judge.url)
        await create_judge_provider(
            client,
            t,
            simulator.url,
            default_model="sim-model",
            is_default_judge=False,
            is_default_simulator=True,
        )
        scenario = await create_scenario(
            client,
            t,
            name="rebooking",
            turns=[turn("I need to rebook")],
            simulation={"persona": "A hurried traveller", "goal": "Rebook to Friday"},
            conversation_criteria=[criterion("Was the customer helped? [judge:PASS]")],
        )
        run = await start_run(client, t, scenario["id"], made["id"])
        await play(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    assert done["simulation_outcome"] == "goal_reached"
    children = tree(exported(tracing))
    root = only(children[None])
    turns = [s for s in children[root.span_id] if s.name.startswith("turn ")]
    assert [(s.name, s.attributes.get("spar.turn.source")) for s in turns] == [
        ("turn 0", "scripted"),
        ("turn 1", "simulated"),
    ]
    simulator_calls = [
        s
        for spans in children.values()
        for s in spans
        if s.attributes.get("spar.call.kind") == "simulator"
    ]
    # Asked for turn 1, then once more, to be told the conversation is done.
    assert len(simulator_calls) == 2, [s.name for s in simulator_calls]
    assert all(s.name == "chat sim-model" for s in simulator_calls)
    assert all(s.attributes[gen_ai.GEN_AI_OPERATION_NAME] == "chat" for s in simulator_calls)
    assert all(s.attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == 29 for s in simulator_calls)
    (verdict,) = root.events_named(EVALUATION)
    assert verdict.attributes[gen_ai.GEN_AI_EVALUATION_SCORE_LABEL] == "PASS"


async def test_an_llm_agent_is_a_chat_span_with_its_provider_model_and_usage(
    client: AsyncTestClient, app: Litestar, settings: Settings, tracing: OTLPReceiver
) -> None:
    with FakeOpenAI(reply="Certainly.", prompt_tokens=500, completion_tokens=50) as model:
        t = await tenant(client)
        await allow_domain(client, t)
        provider = await create_judge_provider(
            client, t, model.url, name="agent model", provider="openai", is_default_judge=False
        )
        made = await client.post(
            f"/v1/orgs/{t.id}/agents",
            json={
                "name": "concierge",
                "kind": "llm",
                "llm_provider_id": provider["id"],
                "model": "agent-model",
                "system_prompt": "You are the concierge.",
            },
            headers=t.owner.headers,
        )
        assert made.status_code == 201, made.text
        agent_id = made.json()["id"]
        scenario = await create_scenario(
            client, t, turns=[turn("Book a table", criterion("certainly", "contains"))]
        )
        run = await start_run(client, t, scenario["id"], agent_id)
        await play(app, settings, run["id"])
        port = model.port
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    children = tree(exported(tracing))
    root = only(children[None])
    assert root.attributes["spar.run.status"] == "passed"
    turn_span = only(children[root.span_id])
    call = only(children[turn_span.span_id])
    assert call.name == "chat agent-model"
    assert call.kind == "SPAN_KIND_CLIENT"
    assert call.attributes == {
        gen_ai.GEN_AI_OPERATION_NAME: "chat",
        gen_ai.GEN_AI_PROVIDER_NAME: "openai",
        gen_ai.GEN_AI_REQUEST_MODEL: "agent-model",
        gen_ai.GEN_AI_RESPONSE_MODEL: "agent-model",
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: 500,
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: 50,
        gen_ai.GEN_AI_AGENT_NAME: "concierge",
        gen_ai.GEN_AI_AGENT_ID: agent_id,
        gen_ai.GEN_AI_CONVERSATION_ID: run["session_id"],
        "server.address": "127.0.0.1",
        "server.port": port,
        "spar.call.kind": "agent",
    }
    assert [e.attributes[gen_ai.GEN_AI_EVALUATION_SCORE_LABEL] for e in turn_span.events] == [
        "PASS"
    ]


async def test_a_run_ending_in_error_marks_its_spans_without_the_error_text(
    client: AsyncTestClient, app: Litestar, settings: Settings, tracing: OTLPReceiver
) -> None:
    leak = "Traceback: db password hunter2-never-exported"
    with FakeAgent() as agent, FakeServer(default=judge_answer) as judge:
        t, made = await world(client, agent.url, judge.url)
        agent.enqueue(*[Reply(status=500, body=leak, headers={"Retry-After": "0"})] * 10)
        scenario = await create_scenario(
            client, t, turns=[turn("Hello", criterion("Polite? [judge:PASS]"))]
        )
        run = await start_run(client, t, scenario["id"], made["id"])
        await play(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "error" and done["error_message"].startswith("agent:"), done
    spans = exported(tracing)
    children = tree(spans)
    root = only(children[None])
    assert root.trace_id == done["trace_id"]
    assert root.status == "STATUS_CODE_ERROR"
    assert root.attributes["spar.run.status"] == "error"
    assert root.attributes["error.type"] == "agent"
    turn_span = only(children[root.span_id])
    assert turn_span.status == "STATUS_CODE_ERROR"
    call = only(children[turn_span.span_id])
    assert call.name == "invoke_agent support bot"
    assert call.status == "STATUS_CODE_ERROR"
    assert call.attributes["error.type"] == "shared.outbound.agents.AgentError"
    assert not turn_span.events  # never judged
    # What the agent answered, which the error message quotes, is never exported.
    for span in spans:
        assert span.status_message == ""
        assert not any("hunter2" in value for value in span.strings()), span


async def test_a_resumed_run_starts_a_new_trace_and_the_run_records_the_latest(
    client: AsyncTestClient, app: Litestar, settings: Settings, tracing: OTLPReceiver
) -> None:
    hang, released = threading.Event(), threading.Event()
    hang.set()

    def reply(body: dict[str, Any]) -> str:
        if body["message"] == "second" and hang.is_set():
            released.wait(10)  # the first delivery's call on turn 2 never gets its answer
        return f"Echo: {body['message']}"

    with FakeAgent(reply=reply) as agent, FakeServer(default=judge_answer) as judge:
        t, made = await world(client, agent.url, judge.url)
        scenario = await create_scenario(
            client,
            t,
            turns=[
                turn("first", criterion("Fine? [judge:PASS]")),
                turn("second", criterion("second", "contains")),
            ],
        )
        run = await start_run(client, t, scenario["id"], made["id"])
        first_delivery = asyncio.create_task(play(app, settings, run["id"]))
        try:
            await agent.requests_received(2, wait_s=10)  # turn 1 committed, turn 2 sent
            first_delivery.cancel()  # the delivery dies (a time limit, a worker stopped)
            with pytest.raises(asyncio.CancelledError):
                await first_delivery
        finally:
            hang.clear()
            released.set()
        interrupted = await get_run(client, t, run["id"])
        assert interrupted["status"] == "running", interrupted
        await play(app, settings, run["id"])  # the redelivery resumes at turn 2
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done

    children = tree(exported(tracing))
    first, second = sorted(children[None], key=lambda s: s.attributes["spar.run.delivery"])
    assert first.trace_id != second.trace_id
    assert interrupted["trace_id"] == first.trace_id
    assert done["trace_id"] == second.trace_id  # the trace the run ended in
    assert second.attributes["spar.run.previous_trace_id"] == first.trace_id
    assert "spar.run.previous_trace_id" not in first.attributes
    assert (first.attributes["spar.run.delivery"], second.attributes["spar.run.delivery"]) == (
        1,
        2,
    )
    # The first trace holds turn 1 and the interrupted turn 2; the second only turn 2.
    assert [s.name for s in children[first.span_id]] == ["turn 0", "turn 1"]
    assert children[first.span_id][1].status == "STATUS_CODE_ERROR"
    assert first.status == "STATUS_CODE_ERROR"
    assert "spar.run.status" not in first.attributes
    assert [s.name for s in children[second.span_id]] == ["turn 1"]
    assert second.attributes["spar.run.status"] == "passed"


async def test_a_batch_runs_traces_name_their_batch(
    client: AsyncTestClient, app: Litestar, settings: Settings, tracing: OTLPReceiver
) -> None:
    with FakeAgent(reply="hello there") as agent:
        w = await make_world(client, agent)
        scenarios = [await make_scenario(client, w, f"s{n}") for n in range(2)]
        batch = await create_batch(client, w, scenario_ids=[s["id"] for s in scenarios])
        await drain(app, settings, batch["id"])
    runs = (await client.get(f"{w.runs}?batch_run_id={batch['id']}", headers=w.headers)).json()[
        "runs"
    ]
    roots = tree(exported(tracing))[None]
    assert sorted((r.attributes["spar.batch.id"], r.trace_id) for r in roots) == sorted(
        (batch["id"], run["trace_id"]) for run in runs
    )
    assert {r.attributes["spar.scenario.name"] for r in roots} == {"s0", "s1"}


# --- off -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variables",
    [
        {},  # no endpoint: off, the default
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "{url}", "OTEL_TRACES_EXPORTER": "none"},
    ],
    ids=["no endpoint", "sdk disabled", "exporter none"],
)
async def test_tracing_off_exports_nothing_and_records_no_trace_id(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    collector: OTLPReceiver,
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(url=collector.url))
    assert not traces.configure("spar-worker")
    assert not traces.enabled()
    with FakeAgent() as agent, FakeServer(default=judge_answer) as judge:
        t, made = await world(client, agent.url, judge.url)
        scenario = await create_scenario(
            client, t, turns=[turn("Hello", criterion("Polite? [judge:PASS]"))]
        )
        run = await start_run(client, t, scenario["id"], made["id"])
        await play(app, settings, run["id"])
    done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done
    assert done["trace_id"] is None
    traces.shutdown()  # nothing to flush
    assert collector.requests == []
