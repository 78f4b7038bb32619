"""OpenTelemetry traces of scenario runs (docs/operations.md, "Traces"): the process's
tracer, and the spans of the calls a run makes out (agents, the judge, the simulator).

**On** only with the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``.  A process's entry point calls :func:`configure` once (a
worker process as it boots, ``spar dev`` as it starts) and :func:`shutdown` as it stops,
which exports what is still buffered.  Spans leave through a BatchSpanProcessor over
OTLP/HTTP (protobuf); the exporter reads its other standard variables itself (headers,
timeout, compression, certificates), the resource ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``, the provider ``OTEL_TRACES_SAMPLER``.

**Free when off.**  Until tracing starts the module's tracer is ``None``, and every helper
checks that first: it returns the undecorated call, or one shared no-op context manager,
before building a span, a name or an attribute dict.  The SDK and the exporter are not even
imported.

**Spar's own provider.**  The tracer comes from a TracerProvider this module holds, never
from OTel's process-global one: that one can be set only once per process, so tests could
not make one each, and an application embedding Spar keeps its own.

**Conventions**: the GenAI semantic conventions as ``opentelemetry-semantic-conventions``
0.66b2 defines them, from its constants (pinned in pyproject: they are still in
development).  An http agent's call is an ``invoke_agent`` span, an LLM's (an llm agent's,
the judge's, the simulator's) a ``chat`` span, both of kind CLIENT.  They are made only in
a run's trace (:mod:`shared.scenarios.tracing`, which makes the run's and the turns'
spans): a judge called by a calibration makes none.

**Never exported**: what a conversation says (messages, replies, prompts, the judge's
evidence, error messages, which can quote an answer), credentials, headers, and of a URL
anything but its host and port.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.trace import SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("spar.traces")
P = ParamSpec("P")
R = TypeVar("R")

# The schema of the conventions the pinned package was generated from (its newest).
SCHEMA_URL = Schemas.V1_44_0.value
CHAT = gen_ai.GenAiOperationNameValues.CHAT.value
INVOKE_AGENT = gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
JSON = gen_ai.GenAiOutputTypeValues.JSON.value
# Spar's provider types by the conventions' names; ``openai_compatible`` has none (it is
# whatever speaks OpenAI's API), so it goes as Spar calls it, a custom value as allowed.
PROVIDER_NAMES = {
    "openai": gen_ai.GenAiProviderNameValues.OPENAI.value,
    "anthropic": gen_ai.GenAiProviderNameValues.ANTHROPIC.value,
}
CALL_KIND = "spar.call.kind"  # whose LLM call: agent, judge, simulator

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
# The run's span, in the run's context; the LLM call's span, in the call's.
_root: ContextVar[Span | None] = ContextVar("spar_trace_root", default=None)
_call: ContextVar[Span | None] = ContextVar("spar_trace_call", default=None)
OFF: AbstractContextManager[None] = nullcontext()  # what the span helpers give when off


# --- the process's tracer ------------------------------------------------------------------------


def enabled() -> bool:
    return _tracer is not None


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for traces: an OTLP endpoint, and neither the SDK
    disabled nor the traces exporter ``none``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def configure(default_service: str) -> bool:
    """Start tracing if the environment asks for it (:func:`wanted`), exporting over
    OTLP/HTTP as the standard variables say, as ``OTEL_SERVICE_NAME`` (or the
    ``service.name`` of ``OTEL_RESOURCE_ATTRIBUTES``), else ``default_service``.  Whether
    tracing is on.  Once per process: a second call changes nothing."""
    if _tracer is not None:
        return True
    if not wanted():
        return False
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(variable, "").strip()
        if protocol and protocol != "http/protobuf":
            log.warning("%s=%s: Spar exports traces over http/protobuf only", variable, protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    start(OTLPSpanExporter(), default_service=default_service)
    return True


def start(exporter: SpanExporter, *, default_service: str) -> None:
    """Trace to ``exporter`` through a batch span processor (replacing any tracing already
    started, which is shut down first)."""
    global _tracer, _provider
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    shutdown()
    resource = Resource.create({SERVICE_VERSION: _version()})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider = provider
    _tracer = provider.get_tracer("spar", _version(), schema_url=SCHEMA_URL)


def shutdown() -> None:
    """Stop tracing, exporting the spans still buffered first (bounded by the exporter's
    timeout, ``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s by default).  Nothing when off."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spar")
    except PackageNotFoundError:
        return "unknown"


# --- spans ---------------------------------------------------------------------------------------


def root(name: str, attributes: dict[str, Any]) -> AbstractContextManager[Span | None]:
    """A new trace whose root span is ``name`` (a run's), current inside the block; the
    spans of this module are made only inside one."""
    if _tracer is None:
        return OFF
    span = _tracer.start_span(name, context=context_api.Context(), attributes=attributes)
    return _active(span, _root)


def child(
    name: str, attributes: dict[str, Any], kind: SpanKind = SpanKind.INTERNAL
) -> AbstractContextManager[Span | None]:
    """A span ``name`` under the current one, current inside the block; nothing outside a
    run's trace."""
    if _tracer is None or _root.get() is None:
        return OFF
    return _active(_tracer.start_span(name, kind=kind, attributes=attributes))


@contextmanager
def _active(span: Span, holder: ContextVar[Span | None] | None = None) -> Iterator[Span]:
    """``span`` current (and in ``holder``) inside the block, ended after it.  An exception
    leaving the block marks it failed by its type alone: never its message, which can quote
    what an agent or a provider answered (OTel's own ``use_span`` would record both)."""
    token = context_api.attach(trace_api.set_span_in_context(span))
    held = holder.set(span) if holder is not None else None
    try:
        yield span
    except BaseException as exc:  # a cancelled delivery too
        failed(span, error_type(exc))
        raise
    finally:
        if holder is not None and held is not None:
            holder.reset(held)
        context_api.detach(token)
        span.end()


def run_span() -> Span | None:
    """The span of the run being played in this context (``None`` when off or outside)."""
    return None if _tracer is None else _root.get()


def current() -> Span | None:
    """The innermost span of this context in a run's trace (``None`` when off or outside)."""
    if _tracer is None or _root.get() is None:
        return None
    return trace_api.get_current_span()


def trace_id(span: Span) -> str | None:
    """``span``'s trace id in 32 hex digits; ``None`` when the sampler dropped the trace
    (no span of it is exported)."""
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.trace_flags.sampled else None


def error_type(exc: BaseException) -> str:
    """The conventions' ``error.type`` of an exception: its fully qualified class name."""
    kind = type(exc)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def failed(span: Span, kind: str) -> None:
    """Mark ``span`` failed with ``error.type`` ``kind`` and no description."""
    span.set_status(Status(StatusCode.ERROR))
    span.set_attribute(ERROR_TYPE, kind)


# --- calls out -----------------------------------------------------------------------------------


def _server(url: str | None) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of ``url``: nothing else of it (a path or a
    query can carry a credential)."""
    if not url:
        return {}
    parts = urlsplit(url)
    if not parts.hostname:
        return {}
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    return {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port} if port else {}


def _chat(kind: str, provider: Any, model: str | None) -> tuple[str, dict[str, Any]]:
    """The name and attributes of a ``chat`` span to ``provider`` (a ProviderConfig)."""
    model = model or provider.default_model
    attributes = {
        gen_ai.GEN_AI_OPERATION_NAME: CHAT,
        gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER_NAMES.get(provider.provider, provider.provider),
        gen_ai.GEN_AI_REQUEST_MODEL: model,
        CALL_KIND: kind,
        **_server(provider.base_url),
    }
    return f"{CHAT} {model}", attributes


def _usage(span: Span, input_tokens: int, output_tokens: int) -> None:
    span.set_attribute(gen_ai.GEN_AI_USAGE_INPUT_TOKENS, input_tokens)
    span.set_attribute(gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens)


async def _traced_call(
    name: str, attributes: dict[str, Any], call: Awaitable[Any], usage_always: bool = True
) -> Any:
    """Await ``call`` in a CLIENT span; its result's token usage on the span.  (The
    decorators below are plain functions handing back the call's own coroutine when off,
    this one when on: off, a traced call costs no coroutine of its own.)"""
    with child(name, attributes, SpanKind.CLIENT) as span:
        token = _call.set(span)
        try:
            result = await call
        finally:
            _call.reset(token)
        if span is not None and (usage_always or result.input_tokens or result.output_tokens):
            _usage(span, result.input_tokens, result.output_tokens)
        return result


def agent_span(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Trace ``call_agent(egress, agent, *, session_id, ...)``: an http agent's call as
    ``invoke_agent {name}`` (its token usage when it reports one), an llm agent's as
    ``chat {model}`` to its provider; both with the agent's name and id and the
    conversation (``session_id``)."""

    @functools.wraps(fn)
    def traced(*args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
        if _tracer is None or _root.get() is None:
            return fn(*args, **kwargs)  # the call's own coroutine: not one more of ours
        agent: Any = args[1]
        described = {gen_ai.GEN_AI_AGENT_NAME: agent.name, gen_ai.GEN_AI_AGENT_ID: str(agent.id)}
        if kwargs.get("session_id"):
            described[gen_ai.GEN_AI_CONVERSATION_ID] = kwargs["session_id"]
        if agent.kind == "llm" and agent.provider is not None:
            name, attributes = _chat("agent", agent.provider, agent.model)
            return _traced_call(name, {**attributes, **described}, fn(*args, **kwargs))
        attributes = {
            gen_ai.GEN_AI_OPERATION_NAME: INVOKE_AGENT,
            **described,
            **_server(agent.endpoint_url),
            "spar.agent.protocol": agent.protocol or "spar",
        }
        return _traced_call(
            f"{INVOKE_AGENT} {agent.name}",
            attributes,
            fn(*args, **kwargs),
            usage_always=False,
        )

    return traced


def llm_span(kind: str) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Trace a structured LLM call ``fn(egress, provider, *, model=None, ...)`` returning
    something with ``input_tokens`` and ``output_tokens`` (the judge's Judgement, the
    simulator's answer) as one ``chat {model}`` span, its retries included, of ``kind``
    (``spar.call.kind``: judge, simulator), asking for JSON."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        def traced(*args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
            if _tracer is None or _root.get() is None:
                return fn(*args, **kwargs)
            name, attributes = _chat(kind, args[1], kwargs.get("model"))  # type: ignore[arg-type]
            attributes[gen_ai.GEN_AI_OUTPUT_TYPE] = JSON
            return _traced_call(name, attributes, fn(*args, **kwargs))

        return traced

    return decorate


def response_model(model: str) -> None:
    """The model that answered the LLM call being traced (``gen_ai.response.model``)."""
    if _tracer is None:
        return
    span = _call.get()
    if span is not None:
        span.set_attribute(gen_ai.GEN_AI_RESPONSE_MODEL, model)
