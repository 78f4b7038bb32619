"""One outbound call's CPU through each of Spar's layers, against bare aiohttp.

The same judge request (Spar's judge prompt, an OpenAI chat completion) to the loopback
fake judge of ``bench/fakes.py``, answering at once, in one process on one event loop,
``--calls`` times at ``--concurrency`` at once (1 and 30 by default), through:

* bare aiohttp (the process's session, as Spar makes it), the body encoded by msgspec;
* ``EgressClient.request`` without a limiter (policy, pinned address, deadline, redaction
  of the response's headers);
* the same with the in-process limiter (``LocalLimiter``);
* the same with the Redis limiter (``RedisLimiter``: two scripts per call, on a private
  ``redis-server`` or ``SPAR_BENCH_REDIS_URL``; Redis's own CPU is not counted);
* ``shared.llm.judge.judge`` over that: the prompt built, the verdict parsed, critique and
  evidence redacted, the call's metrics.

Prints the process's CPU per call (user + system) for each, and each over bare aiohttp.
Asserts nothing::

    python bench/calls.py [--calls 1500] [--concurrency 1 30]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from bench.floor import JSON, judge_request
from bench.stack import bench_redis, loopback_fakes
from shared.llm.judge import judge
from shared.outbound.egress import (
    DomainRule,
    EgressClient,
    EgressPolicy,
    ProviderConfig,
    new_http_session,
)
from shared.outbound.limits import LocalLimiter, RedisLimiter

CONVERSATION = [
    {"role": "user", "content": "question 0 of scenario 1"},
    {"role": "assistant", "content": "Echo: question 0 of scenario 1"},
]
QUESTION = "Does the reply answer question 0? (criterion 0)"
LIMITS = {"max_concurrency": 100, "wait_s": 60.0, "lease_s": 65.0}


async def cpu_per_call(call: Callable[[], Awaitable[object]], calls: int, at_once: int) -> float:
    """The process's CPU seconds per call, ``calls`` of them ``at_once`` at a time (after
    50 unmeasured)."""
    for _ in range(50):
        await call()

    async def lane() -> None:
        for _ in range(calls // at_once):
            await call()

    started = time.process_time()
    await asyncio.gather(*(lane() for _ in range(at_once)))
    return (time.process_time() - started) / (calls // at_once * at_once)


async def measure(judge_url: str, redis_url: str, calls: int, concurrency: list[int]) -> None:
    url = f"{judge_url}/v1/chat/completions"
    body = judge_request(QUESTION, CONVERSATION)
    policy = EgressPolicy(rules=[DomainRule("127.0.0.1")], allow_private=True)
    provider = ProviderConfig(
        id=uuid.uuid4(),
        provider="openai_compatible",
        base_url=f"{judge_url}/v1",
        default_model="judge",
        api_key="sk-bench-key-0123456789",
    )
    redis_limiter = RedisLimiter(redis_url, **LIMITS)  # type: ignore[arg-type]
    async with new_http_session() as http:

        async def bare() -> object:
            async with http.post(url, data=msgspec.json.encode(body), headers=JSON) as response:
                return msgspec.json.decode(await response.read())

        plain = EgressClient(policy, http=http)
        local = EgressClient(policy, http=http, limiter=LocalLimiter(**LIMITS))  # type: ignore[arg-type]
        shared = EgressClient(
            policy, http=http, limiter=redis_limiter, organization_id=uuid.uuid4()
        )
        layers: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("bare aiohttp", bare),
            ("EgressClient, no limiter", lambda: plain.request("POST", url, json=body)),
            ("EgressClient, in-process limiter", lambda: local.request("POST", url, json=body)),
            ("EgressClient, Redis limiter", lambda: shared.request("POST", url, json=body)),
            (
                "judge() on it",
                lambda: judge(shared, provider, question=QUESTION, conversation=CONVERSATION),
            ),
        ]
        try:
            for at_once in concurrency:
                print(f"{calls} calls, {at_once} at once: CPU per call (this process)")
                baseline = None
                for name, call in layers:
                    spent = await cpu_per_call(call, calls, at_once)
                    baseline = baseline or spent
                    print(f"  {name:34s} {spent * 1e6:7.0f} µs   {spent / baseline:5.2f} x")
        finally:
            await redis_limiter.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 30])
    args = parser.parse_args(argv)
    with loopback_fakes() as fakes, bench_redis() as redis_url:
        asyncio.run(measure(fakes.judge_url, redis_url, args.calls, args.concurrency))


if __name__ == "__main__":
    main()
