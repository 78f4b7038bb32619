"""The benchmark's loopback fakes: Spar's agent protocol and OpenAI chat completions, each
answering after a fixed latency, in an asyncio process of their own.

They stand for services on other machines, so they must cost the machine under test as
little as possible and keep their latency exact: one event loop, ``asyncio.sleep`` for
the latency, and a minimal HTTP/1.1 server (keep-alive, ``Content-Length`` bodies: what
Spar's client sends) written on asyncio's protocol layer — a framework's routing and
request objects would take a good share of a CPU that the benchmark is measuring Spar on.

Run by ``bench/batch.py``; on its own::

    python bench/fakes.py   # prints {"agent": <port>, "judge": <port>} once listening

* ``POST http://127.0.0.1:<agent>/chat`` — protocol ``spar``: ``{"content", "usage"}``;
* ``POST http://127.0.0.1:<judge>/v1/chat/completions`` — a chat completion whose content
  is a PASS verdict, as the judge asks;
* ``POST http://127.0.0.1:<judge>/_latency`` ``{"agent_s", "judge_s"}`` sets the latency;
* ``GET http://127.0.0.1:<judge>/_stats`` answers the requests served so far.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

VERDICT = json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "ok"})
_ids = itertools.count(1)


class State:
    agent_s = 0.0
    judge_s = 0.0
    served = {"agent": 0, "judge": 0}


def agent(method: str, path: str, body: Any) -> tuple[int, Any, float]:
    if method != "POST" or not isinstance(body, dict) or "message" not in body:
        return 400, {"error": "expected a spar agent request"}, 0.0
    State.served["agent"] += 1
    reply = {
        "content": f"Echo: {body['message']}",
        "usage": {"input_tokens": 17, "output_tokens": 3},
    }
    return 200, reply, State.agent_s


def judge(method: str, path: str, body: Any) -> tuple[int, Any, float]:
    if method == "POST" and path == "/_latency":
        State.agent_s, State.judge_s = float(body["agent_s"]), float(body["judge_s"])
        return 200, {"agent_s": State.agent_s, "judge_s": State.judge_s}, 0.0
    if method == "GET" and path == "/_stats":
        return 200, State.served, 0.0
    if method != "POST" or not path.endswith("/chat/completions") or not isinstance(body, dict):
        return 404, {"error": {"message": f"no route {method} {path}"}}, 0.0
    State.served["judge"] += 1
    completion = {
        "id": f"chatcmpl-bench{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "judge"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": VERDICT},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }
    return 200, completion, State.judge_s


Handler = Callable[[str, str, Any], tuple[int, Any, float]]
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found"}


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
        status, payload, delay = self._handler(method, path, body)
        content = json.dumps(payload).encode()
        response = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n"
        ).encode() + content
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bytes] = loop.create_future()
        if delay:
            loop.call_later(delay, ready.set_result, response)
        else:
            ready.set_result(response)
        return ready

    async def _write_replies(self) -> None:
        while (ready := await self._replies.get()) is not None:
            response = await ready
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(response)


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
