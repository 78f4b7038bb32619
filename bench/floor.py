"""The floor under ``bench/batch.py``'s CPU per turn: the same conversations played with
the least a Python service can do, measured beside Spar in the same run.

Each process is one event loop (``bench/batch.py`` runs as many as Spar has workers, the
conversations shared out between them): aiohttp calls the agent (Spar's agent protocol)
and then the judge once per criterion, concurrently (OpenAI chat completions, Spar's own
judge prompt), K conversations at a time, and psycopg writes one row per turn (the turn's
messages and verdicts) on a pool of autocommit connections.  No queue, no claims, no
limits, no retries, no metrics: what is left is the calls' and the write's own cost in the
same libraries Spar uses.  A machine twice as slow doubles it too, so Spar's CPU per turn
divided by the floor's is the figure that can be compared from one day (or machine) to
another.

Run by ``bench/batch.py`` (the floor pass, after the measured batches, against the same
fakes at the same latency); on its own it prints one JSON line::

    python bench/floor.py --agent-url URL --judge-url URL --database-url URL \\
        -n 200 -t 3 -c 2 -k 50

``cpu_s`` is the process's user + system CPU over the conversations (start-up and imports
excluded), ``database_cpu_s`` that of its PostgreSQL backends over the same window;
``started_at`` and ``ended_at`` bound that window (epoch seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import msgspec
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from bench.stack import cpu_seconds, psycopg_dsn
from shared.llm.judge import SYSTEM_PROMPT, VERDICT_SCHEMA, build_prompt

# One of each per process: several run at once, and each counts its own backends' CPU.
TABLE = f"bench_floor_turns_{os.getpid()}"
APPLICATION = f"spar-bench-floor-{os.getpid()}"
JSON = {"Content-Type": "application/json"}


def judge_request(question: str, conversation: list[dict[str, str]]) -> dict[str, Any]:
    """The judge's request for ``question`` on ``conversation``, as ``shared.llm.clients``
    writes it for an OpenAI provider (Spar's prompt: the same body size)."""
    return {
        "model": "judge",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": build_prompt(question, conversation)},
        ],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True},
        },
        "max_tokens": 512,
    }


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Floor:
    def __init__(self, http: aiohttp.ClientSession, db: AsyncConnectionPool, args: Any) -> None:
        self.http, self.db, self.args = http, db, args

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        async with self.http.post(url, data=msgspec.json.encode(body), headers=JSON) as response:
            response.raise_for_status()
            return msgspec.json.decode(await response.read())

    async def _verdict(self, question: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        completion = await self._post(
            f"{self.args.judge_url}/v1/chat/completions", judge_request(question, messages)
        )
        return msgspec.json.decode(completion["choices"][0]["message"]["content"])

    async def conversation(self, n: int) -> None:
        run_id, messages = uuid.uuid4(), []
        for t in range(self.args.turns):
            message = f"question {t} of scenario {n}"
            messages.append({"role": "user", "content": message})
            reply = await self._post(
                f"{self.args.agent_url}/chat",
                {
                    "session_id": str(run_id),
                    "message": message,
                    "messages": messages,
                    "customer_context": {},
                    "metadata": {},
                },
            )
            messages.append({"role": "assistant", "content": reply["content"]})
            verdicts = await asyncio.gather(
                *(
                    self._verdict(f"Does the reply answer question {t}? (criterion {c})", messages)
                    for c in range(self.args.criteria)
                )
            )
            async with self.db.connection() as conn:
                await conn.execute(
                    f"INSERT INTO {TABLE} (run_id, turn, messages, verdicts) "  # noqa: S608
                    "VALUES (%s, %s, %s, %s)",
                    (run_id, t, Jsonb(messages), Jsonb(verdicts)),
                )

    async def play(self) -> None:
        pending = iter(range(self.args.scenarios))

        async def lane() -> None:
            for n in pending:
                await self.conversation(n)

        await asyncio.gather(*(lane() for _ in range(self.args.concurrency)))


async def measure(args: argparse.Namespace) -> dict[str, float]:
    pool = AsyncConnectionPool(
        psycopg_dsn(args.database_url),
        min_size=args.db_pool,
        max_size=args.db_pool,
        kwargs={"autocommit": True, "prepare_threshold": 0, "application_name": APPLICATION},
        open=False,
    )
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, run_id uuid, "
                "turn int, messages jsonb, verdicts jsonb)"
            )
            backends = [
                pid
                for (pid,) in await (
                    await conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                        (APPLICATION,),
                    )
                ).fetchall()
            ]
        connector = aiohttp.TCPConnector(limit=0, use_dns_cache=False)  # no cap on connections
        async with aiohttp.ClientSession(connector=connector) as http:
            floor = Floor(http, pool, args)
            if args.start_at is not None:  # with the other processes of the same floor
                await asyncio.sleep(max(0.0, args.start_at - time.time()))
            database_before = sum(cpu_seconds(pid) for pid in backends)
            cpu_before, started = _own_cpu_s(), time.time()
            await floor.play()
            ended = time.time()
            cpu = _own_cpu_s() - cpu_before
            database = sum(cpu_seconds(pid) for pid in backends) - database_before
        async with pool.connection() as conn:
            await conn.execute(f"DROP TABLE {TABLE}")
    finally:
        await pool.close()
    return {"started_at": started, "ended_at": ended, "cpu_s": cpu, "database_cpu_s": database}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent-url", required=True)
    parser.add_argument("--judge-url", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--scenarios", "-n", type=int, default=200)
    parser.add_argument("--turns", "-t", type=int, default=3)
    parser.add_argument("--criteria", "-c", type=int, default=2)
    parser.add_argument("--concurrency", "-k", type=int, default=50)
    parser.add_argument("--db-pool", type=int, default=10, help="connections (a worker's pool)")
    parser.add_argument(
        "--start-at",
        type=float,
        default=None,
        help="when to start playing (epoch seconds): the processes of one floor start together",
    )
    args = parser.parse_args(argv)
    print(msgspec.json.encode(asyncio.run(measure(args))).decode(), flush=True)


if __name__ == "__main__":
    main()
