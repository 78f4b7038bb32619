"""The benchmark's loopback fakes: Spar's agent protocol and OpenAI chat completions, each
answering after a fixed latency, in an asyncio process of their own; the judge optionally
behind a token bucket that answers 429 with a Retry-After past its rate.

They stand for services on other machines, so they must cost the machine under test as
little as possible and keep their latency exact: one event loop, ``asyncio.sleep`` for
the latency, and a minimal HTTP/1.1 server (keep-alive, ``Content-Length`` bodies: what
Spar's client sends) written on asyncio's protocol layer — a framework's routing and
request objects would take a good share of a CPU that the benchmark is measuring Spar on.

:func:`serve_threaded` serves the same two as Python's stdlib ``ThreadingHTTPServer``, a
thread per connection and the latency slept on it, inside the caller's process
(``bench/batch.py --fakes threaded``): the way many users' own test agents are written,
and the slowest plausible fake, sharing its process's GIL with the load generator.

Run by ``bench/batch.py`` and ``bench/ratelimit.py``; on its own::

    python bench/fakes.py   # prints {"agent": <port>, "judge": <port>} once listening

* ``POST http://127.0.0.1:<agent>/chat`` — protocol ``spar``: ``{"content", "usage"}``;
* ``POST http://127.0.0.1:<judge>/v1/chat/completions`` — a chat completion whose content
  is a PASS verdict, as the judge asks;
* ``POST http://127.0.0.1:<judge>/_latency`` ``{"agent_s", "judge_s"}`` sets the latency;
* ``POST http://127.0.0.1:<judge>/_limit`` ``{"rate", "burst", "retry_after"}`` puts the
  judge's chat completions behind a token bucket (:class:`TokenBucket`): ``rate`` requests
  a second, bursts of ``burst``; past it a 429 at once, its wait in the form
  ``retry_after`` names (:data:`RETRY_AFTER_FORMS`); ``{"rate": null}`` lifts it;
* ``POST http://127.0.0.1:<judge>/_verdicts`` ``{"fail_every": n}``: every n-th chat
  completion from then on is a FAIL verdict (``null``: every one a PASS again), so that two
  batches of the same scenarios end differently;
* ``GET http://127.0.0.1:<judge>/_stats`` answers the requests served so far, the judge's
  429s and the peak of its concurrent calls (admitted and not yet answered).
"""

from __future__ import annotations

import asyncio
import http.server
import itertools
import json
import math
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

# status, body, latency in seconds, and any headers of the answer
Reply = tuple[int, Any, float] | tuple[int, Any, float, dict[str, str]]
Handler = Callable[[str, str, Any], Reply]
LOCK = threading.Lock()  # the threaded servers' handlers share State

VERDICT = json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "ok"})
FAILED = json.dumps({"verdict": "FAIL", "critique": "not so", "evidence": "ok"})
_ids = itertools.count(1)


# How a 429 says when to come back: ``Retry-After`` in whole seconds (RFC 9110), as an
# HTTP date (whole seconds too), or OpenAI's ``retry-after-ms`` alone.
RETRY_AFTER_FORMS = ("seconds", "http-date", "ms")
REFUSED = "X-Bench-Refused"  # marks a refused judge call: it was never in flight


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; a request takes one or is refused
    with the seconds until the next one."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> float:
        """0 if a token was taken, else the wait in seconds until one is there."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


def retry_after(wait_s: float, form: str) -> dict[str, str]:
    """The header a 429 carries for a wait of ``wait_s``, rounded up to the form's unit."""
    if form == "ms":
        return {"retry-after-ms": str(math.ceil(wait_s * 1000))}
    if form == "http-date":
        return {"Retry-After": formatdate(math.ceil(time.time() + wait_s), usegmt=True)}
    return {"Retry-After": str(max(1, math.ceil(wait_s)))}


class State:
    agent_s = 0.0
    judge_s = 0.0
    served = {"agent": 0, "judge": 0}
    bucket: TokenBucket | None = None
    retry_after = "seconds"
    refused = 0  # the judge's 429s
    in_flight = 0  # judge calls admitted and not yet answered
    peak = 0
    fail_every: int | None = None  # every n-th verdict a FAIL (``/_verdicts``)
    verdicts = 0  # verdicts given since


def answered(path: str) -> None:
    """After an answer has been sent (its latency over): a judge call is no longer in flight."""
    if path.endswith("/chat/completions"):
        State.in_flight -= 1


def agent(method: str, path: str, body: Any) -> Reply:
    if method != "POST" or not isinstance(body, dict) or "message" not in body:
        return 400, {"error": "expected a spar agent request"}, 0.0
    State.served["agent"] += 1
    reply = {
        "content": f"Echo: {body['message']}",
        "usage": {"input_tokens": 17, "output_tokens": 3},
    }
    return 200, reply, State.agent_s


def judge(method: str, path: str, body: Any) -> Reply:
    if method == "POST" and path == "/_latency":
        State.agent_s, State.judge_s = float(body["agent_s"]), float(body["judge_s"])
        return 200, {"agent_s": State.agent_s, "judge_s": State.judge_s}, 0.0
    if method == "POST" and path == "/_limit":
        rate = body.get("rate")
        State.bucket = TokenBucket(float(rate), int(body.get("burst", 1))) if rate else None
        State.retry_after = str(body.get("retry_after", "seconds"))
        State.refused, State.peak = 0, State.in_flight
        return 200, {"rate": rate, "retry_after": State.retry_after}, 0.0
    if method == "POST" and path == "/_verdicts":
        State.fail_every, State.verdicts = body.get("fail_every"), 0
        return 200, {"fail_every": State.fail_every}, 0.0
    if method == "GET" and path == "/_stats":
        return 200, {**State.served, "judge_429": State.refused, "judge_peak": State.peak}, 0.0
    if method != "POST" or not path.endswith("/chat/completions") or not isinstance(body, dict):
        return 404, {"error": {"message": f"no route {method} {path}"}}, 0.0
    if State.bucket is not None and (wait := State.bucket.take()):
        State.refused += 1
        refusal = {
            "error": {
                "message": "Rate limit reached for requests",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }
        }
        return 429, refusal, 0.0, retry_after(wait, State.retry_after) | {REFUSED: "1"}
    State.served["judge"] += 1
    State.in_flight += 1
    State.peak = max(State.peak, State.in_flight)
    State.verdicts += 1
    fails = State.fail_every is not None and State.verdicts % State.fail_every == 0
    completion = {
        "id": f"chatcmpl-bench{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "judge"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": FAILED if fails else VERDICT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }
    return 200, completion, State.judge_s


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}


def _answer(
    status: int, payload: Any, headers: dict[str, str]
) -> tuple[bytes, dict[str, str], bool]:
    """The answer's body and headers, and whether the call was admitted (not refused)."""
    admitted = headers.pop(REFUSED, None) is None and status == 200
    content = json.dumps(payload).encode()
    headers = {**headers, "Content-Type": "application/json", "Content-Length": str(len(content))}
    return content, headers, admitted


def _response(status: int, payload: Any, headers: dict[str, str]) -> tuple[bytes, bool]:
    """The HTTP/1.1 answer's bytes, and whether the call was admitted (not refused)."""
    content, headers, admitted = _answer(status, payload, headers)
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n{lines}\r\n"
    return head.encode() + content, admitted


class _HTTP(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; each request answered in order, after its latency."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._replies: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._writer = asyncio.get_running_loop().create_task(self._write_replies())

    def connection_lost(self, exc: Exception | None) -> None:
        self._replies.put_nowait(None)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self._buffer) < end + 4 + length:
                return
            body = self._buffer[end + 4 : end + 4 + length]
            self._buffer = self._buffer[end + 4 + length :]
            method, target, _ = head[0].split(" ", 2)
            self._replies.put_nowait(self._answer(method, target.split("?", 1)[0], body))

    def _answer(self, method: str, path: str, raw: bytes) -> asyncio.Future[bytes]:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        status, payload, delay, *headers = self._handler(method, path, body)
        response, admitted = _response(status, payload, (headers or [{}])[0])
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bytes] = loop.create_future()

        def send() -> None:
            ready.set_result(response)
            if admitted:
                answered(path)

        if delay:
            loop.call_later(delay, send)
        else:
            send()
        return ready

    async def _write_replies(self) -> None:
        while (ready := await self._replies.get()) is not None:
            response = await ready
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(response)


class _Threaded(http.server.BaseHTTPRequestHandler):
    """One thread per connection (``ThreadingHTTPServer``), the latency slept on it, and the
    stdlib's defaults: HTTP/1.0, so a connection (and a thread) per request.  How many users
    write their own test agents, and the slowest plausible fake."""

    handler: Handler

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = self.path.split("?", 1)[0]
        with LOCK:
            status, payload, delay, *headers = type(self).handler(self.command, path, body)
        content, fields, admitted = _answer(status, payload, dict((headers or [{}])[0]))
        if delay:
            time.sleep(delay)
        # As the stdlib answers: its status line (HTTP/1.0, so the connection closes after
        # the answer), its Server and Date headers.
        self.send_response(status)
        for name, value in fields.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(content)
        if admitted:
            with LOCK:
                answered(path)

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _ThreadingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: K connections open at once


def serve_threaded() -> tuple[dict[str, int], Callable[[], None]]:
    """The agent and the judge as stdlib threaded servers in this process (each on a
    thread of its own): their ports, and how to stop them."""
    ports, servers = {}, []
    for name, handler in (("agent", agent), ("judge", judge)):
        kind = type(f"_Threaded_{name}", (_Threaded,), {"handler": staticmethod(handler)})
        server = _ThreadingServer(("127.0.0.1", 0), kind)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        ports[name] = server.server_address[1]
        servers.append(server)

    def stop() -> None:
        for server in servers:
            server.shutdown()
            server.server_close()

    return ports, stop


async def serve() -> None:
    loop = asyncio.get_running_loop()
    ports = {}
    for name, handler in (("agent", agent), ("judge", judge)):
        server = await loop.create_server(
            lambda handler=handler: _HTTP(handler), "127.0.0.1", 0, backlog=1024
        )
        ports[name] = server.sockets[0].getsockname()[1]
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve())
