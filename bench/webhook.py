"""Webhook deliveries: how fast a signed call to a trigger's URL is answered.

One ``spar serve`` (one uvicorn process) on a throwaway PostgreSQL database and a
private ``redis-server``, seeded over REST with an organization, an agent and a webhook
trigger.  Deliveries are signed with the ``standardwebhooks`` reference library, as a
sender would sign them, before the clock starts.  Two measurements, each against a
baseline taken in the same run on the same server:

1. **one at a time** (``--sequential``, default 300 deliveries): the latency of
   ``POST /v1/hooks/triggers/{id}`` (p50, p95, p99), against ``GET /health/live`` (the
   framework and the server with no work, the floor any answer pays);
2. **concurrently** (``--concurrency`` senders, ``--concurrent`` deliveries): throughput
   and p99.

Figures are printed, not asserted; the target is a p99 well under 100 ms one at a time.
Run from the repository root::

    python bench/webhook.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from standardwebhooks import Webhook

from bench.stack import database_url, ok, percentiles, spar_stack


def signed_deliveries(secret: str, count: int) -> list[tuple[bytes, dict[str, str]]]:
    hook = Webhook(secret)
    deliveries = []
    for n in range(count):
        body = json.dumps({"version": f"v1.{n}", "service": "checkout"})
        msg_id, now = f"msg_{uuid.uuid4().hex}", datetime.now(UTC)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": hook.sign(msg_id, now, body),
            "content-type": "application/json",
        }
        deliveries.append((body.encode(), headers))
    return deliveries


def one_at_a_time(http: httpx.Client, path: str, deliveries, baseline: str) -> None:
    timed: list[float] = []
    for body, headers in deliveries:
        started = time.perf_counter()
        response = http.post(path, content=body, headers=headers)
        timed.append(time.perf_counter() - started)
        assert response.status_code == 202, response.text
    floor: list[float] = []
    for _ in deliveries:
        started = time.perf_counter()
        http.get(baseline).raise_for_status()
        floor.append(time.perf_counter() - started)
    hook, base = percentiles(timed, 50, 95, 99), percentiles(floor, 50, 95, 99)
    print(f"one at a time, {len(deliveries)} deliveries:")
    for key in ("p50", "p95", "p99"):
        print(
            f"  {key}  webhook {hook[key]:6.1f} ms   GET /health/live {base[key]:5.1f} ms"
            f"   ratio {hook[key] / base[key]:5.1f}"
        )


async def concurrently(base_url: str, path: str, deliveries, senders: int) -> None:
    queue: asyncio.Queue = asyncio.Queue()
    for delivery in deliveries:
        queue.put_nowait(delivery)
    timed: list[float] = []

    async def sender(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            body, headers = queue.get_nowait()
            started = time.perf_counter()
            response = await http.post(path, content=body, headers=headers)
            timed.append(time.perf_counter() - started)
            assert response.status_code == 202, response.text

    limits = httpx.Limits(max_connections=senders)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as http:
        started = time.perf_counter()
        await asyncio.gather(*(sender(http) for _ in range(senders)))
        wall = time.perf_counter() - started
    spread = percentiles(timed)
    print(
        f"{senders} senders, {len(deliveries)} deliveries: {len(deliveries) / wall:.0f}/s, "
        f"p50 {spread['p50']:.1f} ms, p99 {spread['p99']:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--concurrent", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    with spar_stack(database_url("webhook")) as spar:
        http, org_id, h = spar.http, spar.org_id, spar.headers
        agent = ok(
            http.post(
                f"/v1/orgs/{org_id}/agents",
                json={"name": "a", "kind": "http", "endpoint_url": "http://127.0.0.1:9/"},
                headers=h,
            )
        )
        trigger = ok(
            http.post(
                f"/v1/orgs/{org_id}/triggers/",
                json={
                    "name": "deploys",
                    "trigger_type": "webhook",
                    "agent_id": agent["id"],
                    "message": "Deployed {{ payload.version }}",
                },
                headers=h,
            )
        )
        path = trigger["webhook_url"].removeprefix(spar.base)
        for body, headers in signed_deliveries(trigger["webhook_secret"], 50):  # warm-up
            http.post(path, content=body, headers=headers)
        print(f"webhook benchmark: spar serve (1 process), {os.cpu_count()} CPUs")
        one_at_a_time(
            http,
            path,
            signed_deliveries(trigger["webhook_secret"], args.sequential),
            "/health/live",
        )
        asyncio.run(
            concurrently(
                spar.base,
                path,
                signed_deliveries(trigger["webhook_secret"], args.concurrent),
                args.concurrency,
            )
        )


if __name__ == "__main__":
    main()
