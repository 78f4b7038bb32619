"""The process's tracer (:mod:`shared.traces`): when the standard variables turn it on, the
service it names, and what its helpers do off and outside a run's trace.  What a run
exports is ``tests/integration/test_traces.py``'s."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import traces
from shared.outbound.agents import AgentConfig
from shared.scenarios import tracing

ENDPOINT = "http://127.0.0.1:4318"
AGENT = AgentConfig(id=uuid.uuid4(), name="bot", kind="http", endpoint_url="https://a.test/x?k=1")


@pytest.fixture(autouse=True)
def _tracing_stopped() -> Iterator[None]:
    yield
    traces.shutdown()


@pytest.mark.parametrize(
    ("variables", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_traces_are_on_only_when_an_otlp_endpoint_is_set(
    variables: dict[str, str], on: bool
) -> None:
    assert traces.wanted(variables) is on


def _service(exporter: InMemorySpanExporter) -> Any:
    with traces.root("scenario_run s", {"spar.run.id": "r"}):
        pass
    traces.shutdown()
    (span,) = exporter.get_finished_spans()
    return span.resource.attributes


@pytest.mark.parametrize(
    ("variables", "service"),
    [
        ({}, "spar-worker"),
        ({"OTEL_SERVICE_NAME": "nightly-evals"}, "nightly-evals"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=evals,deployment.environment=ci"}, "evals"),
    ],
)
def test_the_service_is_the_processs_unless_the_standard_variables_name_one(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], service: str
) -> None:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    traces.start(exporter, default_service="spar-worker")
    resource = _service(exporter)
    assert resource["service.name"] == service
    assert resource["service.version"]


async def answer(_egress: object, _agent: object, **_: object) -> Any:
    return type("Reply", (), {"input_tokens": 1, "output_tokens": 2})()


def test_off_every_hook_hands_back_what_it_was_given_and_builds_nothing() -> None:
    assert not traces.enabled()
    play = answer  # any coroutine function

    assert tracing.traced(None, uuid.uuid4(), None, play) is play  # type: ignore[arg-type]
    assert tracing.turn(0) is traces.OFF
    assert traces.root("scenario_run s", {}) is traces.OFF
    assert traces.child("turn 0", {}) is traces.OFF
    assert traces.current() is None and traces.run_span() is None
    # A traced call is the call itself: its own coroutine, no wrapper of ours around it.
    call = traces.agent_span(answer)(None, AGENT, session_id="s")
    assert call.cr_code is answer.__code__  # type: ignore[attr-defined]
    asyncio.run(call)  # type: ignore[arg-type]


def test_on_calls_outside_a_runs_trace_make_no_span() -> None:
    """A judge called by a calibration, an agent by a trigger execution: no trace."""
    exporter = InMemorySpanExporter()
    traces.start(exporter, default_service="spar-worker")

    async def outside_then_inside() -> None:
        await traces.agent_span(answer)(None, AGENT, session_id="s")
        with tracing.turn(0):
            pass
        with traces.root("scenario_run s", {}):
            await traces.agent_span(answer)(None, AGENT, session_id="s")

    asyncio.run(outside_then_inside())
    traces.shutdown()
    spans = exporter.get_finished_spans()
    assert sorted(span.name for span in spans) == ["invoke_agent bot", "scenario_run s"]
    (call,) = (span for span in spans if span.name == "invoke_agent bot")
    # Of the agent's URL, its host and port only: never its path or query.
    assert (call.attributes["server.address"], call.attributes["server.port"]) == ("a.test", 443)
    assert not any("k=1" in str(value) for value in call.attributes.values())
