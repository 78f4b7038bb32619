"""A loopback OpenTelemetry collector: OTLP over HTTP, decoded as a collector decodes it.

:class:`OTLPReceiver` is a :class:`~tests.support.fakes.FakeServer` that answers
``POST /v1/traces`` as a collector does (200, an empty ``ExportTraceServiceResponse`` in
protobuf) and reads back what it was sent with ``opentelemetry-proto``'s own
``ExportTraceServiceRequest``: every span as a :class:`ReceivedSpan` (ids in hex, attribute
and event values as Python values, the resource it came from).  Typical use::

    with OTLPReceiver() as collector:
        ...  # tracing on, pointed at collector.url
        spans = collector.spans()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.support.fakes import FakeServer, RecordedRequest, Reply

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector decoded it."""

    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None  # None for a root span
    kind: str  # SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT, ...
    attributes: dict[str, Any]
    events: list[ReceivedEvent]
    status: str  # STATUS_CODE_UNSET, STATUS_CODE_OK, STATUS_CODE_ERROR
    status_message: str
    resource: dict[str, Any]
    scope: str

    def events_named(self, name: str) -> list[ReceivedEvent]:
        return [event for event in self.events if event.name == name]

    def strings(self) -> list[str]:
        """Every string the span carries: its name, status message, attribute and event
        values (a leak check looks through these)."""
        values: list[Any] = [self.name, self.status_message, *self.attributes.values()]
        for event in self.events:
            values += [event.name, *event.attributes.values()]
        flat: list[str] = []
        for value in values:
            flat += [str(v) for v in value] if isinstance(value, list) else [str(value)]
        return flat


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return None if which is None else getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest`` (protobuf)."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        kind=Span.SpanKind.Name(span.kind),
                        attributes=_attributes(span.attributes),
                        events=[
                            ReceivedEvent(event.name, _attributes(event.attributes))
                            for event in span.events
                        ],
                        status=Status.StatusCode.Name(span.status.code),
                        status_message=span.status.message,
                        resource=resource,
                        scope=scope_spans.scope.name,
                    )
                )
    return spans


class OTLPReceiver(FakeServer):
    """A collector on a loopback port accepting OTLP/HTTP protobuf exports."""

    def __init__(self) -> None:
        super().__init__(
            default=Reply(
                body=ExportTraceServiceResponse().SerializeToString(),
                headers={"Content-Type": PROTOBUF},
            )
        )

    def exports(self) -> list[RecordedRequest]:
        """The export requests received: each a ``POST /v1/traces`` of protobuf."""
        for request in self.requests:
            assert (request.method, request.path) == ("POST", TRACES_PATH), request
            assert request.header("content-type") == PROTOBUF, request.headers
        return list(self.requests)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, decoded, in the order received."""
        return [span for request in self.exports() for span in decode(request.body)]
