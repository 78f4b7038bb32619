"""The benchmark's loopback fakes: Spar's agent protocol and OpenAI chat completions, each
answering after a fixed latency, in an asyncio process of their own.

They stand for services on other machines, so they should cost the machine under test as
little as possible and keep their latency exact: one event loop (no thread per request,
no lock shared with the benchmark's own process), ``asyncio.sleep`` for the latency.

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
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web

from tests.support.fakes import openai_completion

VERDICT = json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "ok"})


class State:
    agent_s = 0.0
    judge_s = 0.0
    served = {"agent": 0, "judge": 0}


async def agent(request: web.Request) -> web.Response:
    body: dict[str, Any] = await request.json()
    State.served["agent"] += 1
    if State.agent_s:
        await asyncio.sleep(State.agent_s)
    return web.json_response(
        {"content": f"Echo: {body['message']}", "usage": {"input_tokens": 17, "output_tokens": 3}}
    )


async def judge(request: web.Request) -> web.Response:
    body: dict[str, Any] = await request.json()
    State.served["judge"] += 1
    if State.judge_s:
        await asyncio.sleep(State.judge_s)
    return web.json_response(openai_completion(VERDICT, model=str(body.get("model") or "judge")))


async def latency(request: web.Request) -> web.Response:
    body = await request.json()
    State.agent_s, State.judge_s = float(body["agent_s"]), float(body["judge_s"])
    return web.json_response({"agent_s": State.agent_s, "judge_s": State.judge_s})


async def stats(_: web.Request) -> web.Response:
    return web.json_response(State.served)


async def serve() -> None:
    agent_app = web.Application()
    agent_app.router.add_post("/chat", agent)
    judge_app = web.Application()
    judge_app.router.add_post("/v1/chat/completions", judge)
    judge_app.router.add_post("/_latency", latency)
    judge_app.router.add_get("/_stats", stats)
    ports = {}
    for name, app in (("agent", agent_app), ("judge", judge_app)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        ports[name] = runner.addresses[0][1]
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve())
