"""Loopback fakes of the services Spar calls: real HTTP servers speaking the real protocols.

Every fake is a real HTTP/1.1 server on ``127.0.0.1`` (an ephemeral port) served from a
background thread, so Spar's own code — the egress client, the LLM and agent clients —
runs unchanged against it.  Each fake:

* is a context manager (``with FakeOpenAI() as openai: ...``), or ``start()`` / ``stop()``;
* exposes ``.url`` (``http://127.0.0.1:<port>``, no trailing slash) and ``.port``;
* records every request it receives in ``.requests`` (a list of :class:`RecordedRequest`:
  method, path, query, lower-cased headers, raw body and parsed JSON body), recorded
  *before* any scripted delay, so a request whose client gave up is still seen (request
  bodies must come with a Content-Length, as Spar's client sends them; chunked uploads are not
  read);
* is scriptable: ``enqueue(Reply(...), ...)`` queues canned responses served one per
  request, in order; when the queue is empty the fake answers with its protocol's
  normal reply (or the ``default`` :class:`Reply` of a :class:`FakeServer`).

Protocol fakes:

* :class:`FakeOpenAI` — ``POST …/chat/completions`` → a chat completion;
* :class:`FakeAnthropic` — ``POST …/v1/messages`` → an Anthropic message;
* :class:`FakeAgent` — Spar's agent protocol ``spar``: ``POST <endpoint>`` →
  ``{"content", "usage": {"input_tokens", "output_tokens"}, "tool_calls"}``;
* :class:`FakeServer` — anything else (status codes, redirects, ``Retry-After``);
* :class:`FakeEchoAgent`, :class:`FakeEchoJudge` — an agent and a judge that tell back the
  headers and query string they received (secret-redaction tests);
* :class:`FakeSimulator` — a simulated user's provider (OpenAI chat completions answering
  the simulator's structured output ``{message, done, outcome}``), done after a given
  number of exchanges or never;
* :class:`FakeFlakyAgent` — an agent that fails exactly m of every n conversations of a
  scenario, whatever order they arrive in (repetitions, pass^k).

The protocol fakes take ``reply``: a string, or a function of the parsed JSON request
body returning the reply text, so a scenario can answer according to what it was sent.
Their answers (completions, messages, error bodies) are built from the official SDKs' own
types (``openai.types``, ``anthropic.types``), so they have the shape the real APIs give.
Each can also play the refusals of today's models: ``FakeOpenAI(reasoning_models=...)``
answers 400 ``unsupported_parameter`` to ``max_tokens`` and ``unsupported_value`` to a
``temperature`` other than 1 for those models, as OpenAI's o-series and gpt-5 do;
``FakeAnthropic(current_models=...)`` answers 400 to ``temperature`` and to a forced
``tool_choice`` for those models (Claude models after Opus 4.6, which always think), and
``FakeAnthropic(legacy_models=...)`` answers 400 to ``output_config`` (models before
structured outputs).

Typical use in a test module::

    @pytest.fixture
    def openai() -> Iterator[FakeOpenAI]:
        with FakeOpenAI(reply="hello") as fake:
            yield fake

    async def test_x(openai: FakeOpenAI) -> None:
        openai.enqueue(Reply(status=503), Reply(status=503))  # two failures, then normal
        ...
        assert openai.requests[-1].json["model"] == "gpt-test"

:func:`loopback_only_http` gives an egress HTTP session that refuses (before any
connection) to talk to anything but a loopback address: pass it as the egress client's
``http=`` in tests that must never leave the machine even if the code under test regressed.
"""

from __future__ import annotations

import asyncio
import base64
import html
import ipaddress
import itertools
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import aiohttp
from anthropic.types import ErrorResponse as AnthropicErrorResponse
from anthropic.types import Message, TextBlock, ToolUseBlock, Usage
from openai.types import CompletionUsage
from openai.types import ErrorObject as OpenAIErrorObject
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
)
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function

from shared.outbound.egress import new_http_session

__all__ = [
    "FakeAgent",
    "FakeAnthropic",
    "FakeEchoAgent",
    "FakeEchoJudge",
    "FakeFlakyAgent",
    "FakeOpenAI",
    "FakeServer",
    "FakeSimulator",
    "NonLoopbackTraffic",
    "RecordedRequest",
    "Reply",
    "anthropic_error",
    "anthropic_message",
    "echo_of_request",
    "exchanges_shown",
    "loopback_only_http",
    "openai_completion",
    "openai_error",
    "simulator_answer",
    "unused_loopback_url",
]

_ids = itertools.count(1)


# --- what a fake records and what it answers -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str  # without the query string
    query: dict[str, list[str]]  # parse_qs, blank values kept
    raw_query: str
    headers: dict[str, str]  # names lower-cased (HTTP header names are case-insensitive)
    body: bytes
    received_at: float  # time.monotonic()

    @property
    def json(self) -> Any:
        """The body parsed as JSON, or ``None`` when empty or not JSON."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def query_value(self, name: str) -> str | None:
        """The single value of query parameter ``name`` (``None`` if absent)."""
        values = self.query.get(name)
        return values[0] if values else None


@dataclass(frozen=True, slots=True)
class Reply:
    """A canned response.  ``body`` (bytes or str, sent as is) wins over ``json``."""

    status: int = 200
    json: Any = None
    body: bytes | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering

    @classmethod
    def redirect(cls, location: str, status: int = 302) -> Reply:
        return cls(status=status, headers={"Location": location})

    def encoded(self) -> tuple[bytes, str | None]:
        """The body bytes and the content type to announce (if the reply sets none)."""
        if self.body is not None:
            raw = self.body.encode() if isinstance(self.body, str) else self.body
            return raw, "text/plain; charset=utf-8"
        if self.json is not None:
            return json.dumps(self.json).encode(), "application/json"
        return b"", None


Responder = Callable[[RecordedRequest], Reply]


# --- the server ----------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for kept-alive or delayed connections
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (read timeout) makes the delayed answer fail: expected.
        pass


class FakeServer:
    """A scriptable HTTP server on 127.0.0.1; answers every method on every path.

    ``default`` is the answer when the queue is empty: a :class:`Reply`, or a function of
    the :class:`RecordedRequest` returning one.  Subclasses override :meth:`handle`.
    """

    def __init__(self, default: Reply | Responder | None = None) -> None:
        self.default: Reply | Responder = default if default is not None else Reply(json={})
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._received = threading.Condition(self._lock)
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> Self:
        if self._server is not None:
            return self
        self._server = _HTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # scripting

    def enqueue(self, *replies: Reply) -> None:
        """Answer the next requests with ``replies``, in order, before the normal answer."""
        with self._lock:
            self._queue.extend(replies)

    def reset(self) -> None:
        """Forget recorded requests and queued replies."""
        with self._lock:
            self.requests.clear()
            self._queue.clear()

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block the calling thread until at least ``count`` requests arrived (else
        ``TimeoutError``).  From async code use :meth:`requests_received`."""
        with self._received:
            if not self._received.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"{len(self.requests)} requests received, wanted {count}")
            return list(self.requests)

    async def requests_received(self, count: int, wait_s: float = 5.0) -> list[RecordedRequest]:
        """:meth:`wait_for_requests` without blocking the event loop (``wait_s`` bounds it:
        the waiting thread cannot be cancelled)."""
        return await asyncio.to_thread(self.wait_for_requests, count, wait_s)

    @property
    def paths(self) -> list[str]:
        return [request.path for request in self.requests]

    def handle(self, request: RecordedRequest) -> Reply:
        """The answer when nothing is queued; protocol fakes override this."""
        return self.default(request) if callable(self.default) else self.default

    # internals

    def _record_and_choose(self, request: RecordedRequest) -> Reply:
        with self._received:
            self.requests.append(request)
            self._received.notify_all()
            queued = self._queue.popleft() if self._queue else None
        return queued if queued is not None else self.handle(request)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "SparFake/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                request = RecordedRequest(
                    method=self.command,
                    path=parts.path,
                    query=parse_qs(parts.query, keep_blank_values=True),
                    raw_query=parts.query,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                    received_at=time.monotonic(),
                )
                reply = fake._record_and_choose(request)
                if reply.delay:
                    time.sleep(reply.delay)
                payload, content_type = reply.encoded()
                self.send_response(reply.status)
                names = {name.lower() for name in reply.headers}
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if content_type and "content-type" not in names:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

        return Handler


# --- protocol fakes ------------------------------------------------------------------------------

ReplyText = str | Callable[[Any], str]


def _reply_text(reply: ReplyText, body: Any) -> str:
    return reply(body) if callable(reply) else reply


def openai_completion(
    content: str | None,
    *,
    refusal: str | None = None,
    model: str = "gpt-fake",
    prompt_tokens: int = 11,
    completion_tokens: int = 7,
    finish_reason: str = "stop",
    tool_calls: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` object as the OpenAI API returns it (``openai.types``'s
    ``ChatCompletion``); a refusal has ``content`` None and ``refusal`` set; ``tool_calls``
    are function calls ``(name, arguments as the JSON string the API sends)``."""
    calls = [
        ChatCompletionMessageFunctionToolCall(
            id=f"call_fake{next(_ids)}",
            type="function",
            function=Function(name=name, arguments=arguments),
        )
        for name, arguments in tool_calls or ()
    ]
    completion = ChatCompletion(
        id=f"chatcmpl-fake{next(_ids)}",
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                index=0,
                message=ChatCompletionMessage(
                    role="assistant",
                    content=content,
                    refusal=refusal,
                    **({"tool_calls": calls} if calls else {}),
                ),
                finish_reason=finish_reason,  # type: ignore[arg-type]
                logprobs=None,
            )
        ],
        usage=CompletionUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        ),
    )
    return completion.to_dict(mode="json")


def openai_error(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """An OpenAI error body: ``{"error": ErrorObject}``."""
    error = OpenAIErrorObject(message=message, type=type, param=param, code=code)
    return {"error": error.to_dict(mode="json")}


def anthropic_message(
    text: str | None,
    *,
    model: str = "claude-fake",
    input_tokens: int = 13,
    output_tokens: int = 5,
    stop_reason: str = "end_turn",
    tool_use: tuple[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ``message`` object as the Anthropic Messages API returns it (``anthropic.types``'s
    ``Message``): a text block (none when ``text`` is None), and a ``tool_use`` block
    ``(name, input)`` when given."""
    blocks: list[Any] = [] if text is None else [TextBlock(type="text", text=text)]
    if tool_use is not None:
        name, arguments = tool_use
        blocks.append(
            ToolUseBlock(type="tool_use", id=f"toolu_fake{next(_ids)}", name=name, input=arguments)
        )
    message = Message(
        id=f"msg_fake{next(_ids)}",
        type="message",
        role="assistant",
        model=model,
        content=blocks,
        stop_reason=stop_reason,  # type: ignore[arg-type]
        stop_sequence=None,
        usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
    )
    return message.to_dict(mode="json")


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    """An Anthropic error body (``anthropic.types.ErrorResponse``), e.g.
    ``anthropic_error("overloaded_error", "Overloaded")``, what a 529 carries."""
    response = AnthropicErrorResponse.model_validate(
        {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": f"req_fake{next(_ids)}",
        }
    )
    return response.to_dict(mode="json")


def _not_found(request: RecordedRequest) -> Reply:
    return Reply(
        status=404,
        json={"error": {"message": f"no route {request.method} {request.path}"}},
    )


class FakeOpenAI(FakeServer):
    """OpenAI chat completions: ``POST <anything>/chat/completions``.

    The answer echoes the request's ``model``; ``reply`` is the assistant text (or a
    function of the request body); ``prompt_tokens`` / ``completion_tokens`` the usage.
    Use ``f"{fake.url}/v1"`` as a provider ``base_url``, or ``f"{fake.url}/v1/chat/completions"``
    as the endpoint of an ``openai_chat`` agent.  For the models in ``reasoning_models`` it
    refuses what OpenAI's reasoning models refuse (``max_tokens``; a ``temperature`` other
    than 1) with the API's own 400 answers.
    """

    def __init__(
        self,
        reply: ReplyText = "Hello from the fake OpenAI.",
        *,
        prompt_tokens: int = 11,
        completion_tokens: int = 7,
        reasoning_models: Collection[str] = (),
    ) -> None:
        super().__init__()
        self.reply = reply
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.reasoning_models = frozenset(reasoning_models)

    def handle(self, request: RecordedRequest) -> Reply:
        if request.method != "POST" or not request.path.endswith("/chat/completions"):
            return _not_found(request)
        body = request.json
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return Reply(status=400, json=openai_error("messages is required", param="messages"))
        if body.get("model") in self.reasoning_models:
            refused = _refused_by_a_reasoning_model(body)
            if refused is not None:
                return refused
        return Reply(
            json=openai_completion(
                _reply_text(self.reply, body),
                model=str(body.get("model") or "gpt-fake"),
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
            )
        )


def _refused_by_a_reasoning_model(body: dict[str, Any]) -> Reply | None:
    """OpenAI's 400 to a reasoning model (o-series, gpt-5) sent what it does not take."""
    if "max_tokens" in body:
        return Reply(
            status=400,
            json=openai_error(
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                param="max_tokens",
                code="unsupported_parameter",
            ),
        )
    if body.get("temperature", 1) != 1:
        return Reply(
            status=400,
            json=openai_error(
                f"Unsupported value: 'temperature' does not support {body['temperature']} with "
                "this model. Only the default (1) value is supported.",
                param="temperature",
                code="unsupported_value",
            ),
        )
    return None


class FakeAnthropic(FakeServer):
    """Anthropic messages: ``POST <anything>/v1/messages``; use ``fake.url`` as base_url.

    A request that forces a tool (``tool_choice`` ``{"type": "tool", "name": …}``) is
    answered with that tool's ``tool_use`` block, its input the reply text read as JSON.
    ``current_models`` refuse ``temperature`` and a forced tool (400), as Claude models
    after Opus 4.6 do; ``legacy_models`` refuse ``output_config`` (400), as models before
    structured outputs do.
    """

    def __init__(
        self,
        reply: ReplyText = "Hello from the fake Anthropic.",
        *,
        input_tokens: int = 13,
        output_tokens: int = 5,
        current_models: Collection[str] = (),
        legacy_models: Collection[str] = (),
    ) -> None:
        super().__init__()
        self.reply = reply
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.current_models = frozenset(current_models)
        self.legacy_models = frozenset(legacy_models)

    def handle(self, request: RecordedRequest) -> Reply:
        if request.method != "POST" or not request.path.endswith("/v1/messages"):
            return _not_found(request)
        body = request.json
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _anthropic_400("messages: Field required")
        model = str(body.get("model") or "claude-fake")
        forced = body.get("tool_choice") or {}
        forced_tool = forced.get("name") if forced.get("type") == "tool" else None
        if model in self.current_models and "temperature" in body:
            return _anthropic_400("`temperature` is deprecated for this model.")
        if model in self.current_models and forced_tool is not None:
            return _anthropic_400("Thinking may not be enabled when tool_choice forces tool use.")
        if model in self.legacy_models and "output_config" in body:
            return _anthropic_400(f"output_config.format: not supported by {model}")
        text = _reply_text(self.reply, body)
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if forced_tool is not None:
            try:
                arguments = json.loads(text)
            except ValueError:
                arguments = {}
            return Reply(
                json=anthropic_message(
                    None,
                    model=model,
                    stop_reason="tool_use",
                    tool_use=(forced_tool, arguments if isinstance(arguments, dict) else {}),
                    **usage,
                )
            )
        return Reply(json=anthropic_message(text, model=model, **usage))


def _anthropic_400(message: str) -> Reply:
    return Reply(status=400, json=anthropic_error("invalid_request_error", message))


ToolCalls = Any | Callable[[Any], Any]


class FakeAgent(FakeServer):
    """An agent under test speaking protocol ``spar`` on ``POST <any path>``.

    ``reply`` is the reply text or a function of the request body (``{"session_id",
    "message", "messages", "customer_context", "metadata"}``).  ``usage=None`` leaves the
    optional ``usage`` out of the answer.  ``tool_calls`` (a list, or a function of the
    request body returning one) is sent as the answer's ``tool_calls``, as is (so it may
    be malformed); ``None`` leaves the field out.
    """

    def __init__(
        self,
        reply: ReplyText = "Hello from the fake agent.",
        *,
        usage: tuple[int, int] | None = (17, 3),
        tool_calls: ToolCalls = None,
    ) -> None:
        super().__init__()
        self.reply = reply
        self.usage = usage
        self.tool_calls = tool_calls

    def handle(self, request: RecordedRequest) -> Reply:
        if request.method != "POST":
            return _not_found(request)
        body = request.json
        if not isinstance(body, dict) or "message" not in body:
            return Reply(status=400, json={"error": "expected a spar agent request"})
        answer: dict[str, Any] = {"content": _reply_text(self.reply, body)}
        if self.usage is not None:
            answer["usage"] = {"input_tokens": self.usage[0], "output_tokens": self.usage[1]}
        calls = self.tool_calls(body) if callable(self.tool_calls) else self.tool_calls
        if calls is not None:
            answer["tool_calls"] = calls
        return Reply(json=answer)


class FakeFlakyAgent(FakeAgent):
    """An agent that fails a known share of a scenario's conversations, whatever order they
    arrive in: a message carrying ``[fails m/n]`` gets ``"I cannot help."`` in exactly m of
    every n conversations (``session_id``) sending that message (the last m of each n to
    arrive: with ``[fails 4/8]`` a first batch of four runs passes and the next four fail),
    and is echoed (``"Echo: …"``) in the others; every later turn of a conversation is
    answered as its first was.  Any other message is echoed."""

    FAILING = "I cannot help."
    _MARK = re.compile(r"\[fails (\d+)/(\d+)\]")

    def __init__(self) -> None:
        super().__init__(reply=self._answer)
        self._decided = threading.Lock()
        self._conversations: dict[str, dict[str, bool]] = {}  # message -> session -> fails
        self._fails: dict[str, bool] = {}  # session -> fails

    def _answer(self, body: dict[str, Any]) -> str:
        message, session = str(body["message"]), str(body["session_id"])
        mark = self._MARK.search(message)
        with self._decided:
            if mark is not None and session not in self._fails:
                failing, every = int(mark.group(1)), int(mark.group(2))
                seen = self._conversations.setdefault(message, {})
                seen[session] = self._fails[session] = len(seen) % every >= every - failing
            fails = self._fails.get(session, False)
        return self.FAILING if fails else f"Echo: {message}"


def echo_of_request(request: RecordedRequest, known: tuple[str, ...] = ()) -> str:
    """What a careless service that tells back everything it was sent would say: its
    headers as received (plain and as JSON), its query string raw and decoded, each header
    value base64-encoded, the base64 of the headers' JSON and the headers HTML-escaped (both
    also read as UTF-8, as a Go server reads them, where this Python server reads Latin-1),
    and ``known`` strings it learnt some other way."""
    as_utf8 = {name: _as_utf8(value) for name, value in request.headers.items()}
    lines = [f"{name}: {value}" for name, value in request.headers.items()]
    lines.append(f"query: {request.raw_query}")
    lines.append(
        json.dumps(
            {
                "headers": request.headers,
                "query": request.query,
                "base64": {
                    name: base64.b64encode(value.encode()).decode()
                    for name, value in request.headers.items()
                },
                "known": list(known),
            }
        )
    )
    for headers in (request.headers, as_utf8):
        document = json.dumps(headers, ensure_ascii=False).encode()
        lines.append(f"headers as base64 of JSON: {base64.b64encode(document).decode()}")
        lines.extend(html.escape(f"{name}: {value}") for name, value in headers.items())
    lines.extend(known)
    return "\n".join(lines)


def _as_utf8(header: str) -> str:
    """A header value as received (its bytes as Latin-1, as http.server decodes them), read
    as UTF-8 instead."""
    return header.encode("latin-1").decode("utf-8", "replace")


class FakeEchoAgent(FakeServer):
    """An agent that puts what it received (:func:`echo_of_request`) in its reply: protocol
    ``openai_chat`` on paths ending in ``/chat/completions``, protocol ``spar`` elsewhere.

    ``known`` are strings the agent also repeats; with ``fail_with`` set to a status it
    answers that status with the echo as the body, as an error page quoting the request.
    """

    def __init__(self, *, known: tuple[str, ...] = (), fail_with: int | None = None) -> None:
        super().__init__()
        self.known = known
        self.fail_with = fail_with

    def handle(self, request: RecordedRequest) -> Reply:
        if request.method != "POST":
            return _not_found(request)
        echo = echo_of_request(request, self.known)
        if self.fail_with is not None:
            return Reply(status=self.fail_with, body=echo)
        if request.path.endswith("/chat/completions"):
            return Reply(json=openai_completion(echo))
        return Reply(json={"content": echo, "usage": {"input_tokens": 17, "output_tokens": 3}})


class FakeEchoJudge(FakeOpenAI):
    """An OpenAI-compatible judge that passes everything, quoting what it was sent: the
    critique holds its prompt and :func:`echo_of_request`, the evidence the echo again."""

    def handle(self, request: RecordedRequest) -> Reply:
        body = request.json
        if not request.path.endswith("/chat/completions") or not isinstance(body, dict):
            return _not_found(request)
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])
        echo = echo_of_request(request)
        verdict = {"verdict": "PASS", "critique": f"{prompt}\n{echo}", "evidence": echo}
        return Reply(json=openai_completion(json.dumps(verdict)))


def simulator_answer(message: str = "", *, done: bool = False, outcome: str | None = None) -> str:
    """The simulator's structured answer as the model writes it (the completion's text)."""
    return json.dumps({"message": message, "done": done, "outcome": outcome})


# The simulator's prompt says how far the conversation is (shared.llm.simulator).
_EXCHANGES = re.compile(r"Conversation so far \((\d+) exchanges;")


def exchanges_shown(request: RecordedRequest) -> int:
    """How many exchanges (a user message and the agent's reply) the conversation shown to
    the simulator held: which turn the request was for."""
    prompt = "\n".join(str(m.get("content", "")) for m in request.json["messages"])
    found = _EXCHANGES.search(prompt)
    if found is None:
        raise AssertionError(f"not a simulator's request: {prompt[:200]!r}")
    return int(found.group(1))


class FakeSimulator(FakeOpenAI):
    """A simulated user's provider (``POST …/chat/completions``, structured output): shown
    a conversation of ``n`` exchanges, the customer says ``f"{say} {n}"``; once the
    conversation has ``done_at`` exchanges it answers ``done`` with ``outcome`` instead
    (``done_at=None``: never).  ``enqueue`` an :func:`openai_completion` of something else
    to have it answer that first (empty, garbage)."""

    def __init__(
        self,
        *,
        done_at: int | None = None,
        outcome: str = "goal_reached",
        say: str = "customer message",
    ) -> None:
        super().__init__(reply=self._answer, prompt_tokens=29, completion_tokens=13)
        self.done_at = done_at
        self.outcome = outcome
        self.say = say

    def _answer(self, body: dict[str, Any]) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
        found = _EXCHANGES.search(prompt)
        exchanges = int(found.group(1)) if found else 0
        if self.done_at is not None and exchanges >= self.done_at:
            return simulator_answer(done=True, outcome=self.outcome)
        return simulator_answer(f"{self.say} {exchanges}")

    def asked_per_exchange(self) -> dict[int, int]:
        """How many times it was asked for each turn: by the exchanges it was shown."""
        counts: dict[int, int] = {}
        for request in self.requests:
            n = exchanges_shown(request)
            counts[n] = counts.get(n, 0) + 1
        return counts


# --- helpers -------------------------------------------------------------------------------------


def unused_loopback_url() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class NonLoopbackTraffic(Exception):
    """Raised instead of connecting anywhere but loopback."""


def _is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name: would need DNS
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class _LoopbackOnlyConnector(aiohttp.TCPConnector):
    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        if not _is_loopback(req.url.host or ""):
            raise NonLoopbackTraffic(f"refusing to connect to {req.url.host!r}")
        return await super().connect(req, traces, timeout)


def loopback_only_http() -> aiohttp.ClientSession:
    """An egress HTTP session (:func:`new_http_session`) that only ever connects to loopback
    IP addresses.

    Anything else raises :class:`NonLoopbackTraffic` (not an ``aiohttp`` error, so no retry
    swallows it) before a socket is opened.  Make it inside the test's event loop and close
    it (``async with``) after use.
    """
    return new_http_session(_LoopbackOnlyConnector(use_dns_cache=False))


def verdict_from_marker(body: dict[str, Any]) -> str:
    """The fake judge's answer: the verdict the question asks for ([judge:PASS] or
    [judge:FAIL]); garbage for [judge:garbage] (the judge module retries, then gives up)."""
    prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
    if "[judge:garbage]" in prompt:
        return "I refuse to answer in JSON."
    verdict = "PASS" if "[judge:PASS]" in prompt else "FAIL"
    return json.dumps({"verdict": verdict, "critique": f"judged {verdict}", "evidence": "-"})


_VOTES = re.compile(r"\[judge:votes (\d+)/(\d+)\]")


class VoteQuota:
    """A judge's answer (``FakeOpenAI(reply=VoteQuota())``) that flips by quota: a prompt
    carrying ``[judge:votes p/n]`` is passed by exactly p of every n calls made with that
    same prompt (the first p of each n to arrive), whatever order concurrent votes arrive
    in; any other prompt as :func:`verdict_from_marker` answers it.  ``calls`` counts the
    calls per quota marker."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
        found = _VOTES.search(prompt)
        if found is None:
            return verdict_from_marker(body)
        passes, every = int(found.group(1)), int(found.group(2))
        with self._lock:
            n = self._seen.get(prompt, 0)
            self._seen[prompt] = n + 1
            self.calls[found.group(0)] = self.calls.get(found.group(0), 0) + 1
        verdict = "PASS" if n % every < passes else "FAIL"
        critique = f"vote {n % every + 1} of {every}: {verdict}"
        return json.dumps({"verdict": verdict, "critique": critique, "evidence": verdict})
