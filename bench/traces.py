"""What the traces of runs cost a run's calls: with tracing off (the default), and on.

Each hook the run engine calls is timed against the same code without it, in one process,
on the same event loop: an agent call (``@agent_span`` around an async function that
returns at once), a judge call (``@llm_span``), a turn's span (``tracing.turn``), the
verdict events of a turn of three criteria (``tracing.verdicts``) and the response model
noted by the LLM client (``traces.response_model``).  Off, each must cost under 1 µs per
call; on, the spans go to an exporter that drops them (the batch processor's queue and
thread as in production, no network), inside a run's root span.

    python bench/traces.py [--calls 200000] [--repeat 5]

Prints, per hook, the best of ``--repeat`` rounds of ``--calls`` calls: ns per call of the
baseline, of the hook off and on, and the overhead off and on.  Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from shared import traces
from shared.outbound.agents import AgentConfig
from shared.outbound.egress import ProviderConfig
from shared.scenarios import tracing
from shared.scenarios.records import SnapshotCriterion


class Dropped(SpanExporter):
    def export(self, spans: Sequence[object]) -> SpanExportResult:  # type: ignore[override]
        return SpanExportResult.SUCCESS


@dataclass(frozen=True)
class Reply:
    input_tokens: int = 17
    output_tokens: int = 3


@dataclass(frozen=True)
class Verdict:
    verdict: str = "PASS"
    critique: str = "fine"


AGENT = AgentConfig(
    id=uuid.uuid4(), name="bot", kind="http", endpoint_url="http://127.0.0.1:9/chat"
)
PROVIDER = ProviderConfig(
    id=uuid.uuid4(),
    provider="openai_compatible",
    base_url="http://127.0.0.1:9/v1",
    default_model="judge-model",
    api_key=None,
)
CRITERIA = [
    SnapshotCriterion(id=str(uuid.uuid4()), order_index=n, question=f"q{n}", criteria_type="x")
    for n in range(3)
]
VERDICTS = [Verdict()] * 3


async def call(_egress: object, _target: object, **_: object) -> Reply:
    return Reply()


agent_call = traces.agent_span(call)
judge_call = traces.llm_span("judge")(call)


async def bare_call() -> None:
    await call(None, AGENT, session_id="s")


async def hooked_agent() -> None:
    await agent_call(None, AGENT, session_id="s")


async def hooked_judge() -> None:
    await judge_call(None, PROVIDER, model="judge-model")


async def bare_block() -> None:
    pass


async def hooked_turn() -> None:
    with tracing.turn(0):
        pass


async def hooked_verdicts() -> None:
    tracing.verdicts(CRITERIA, VERDICTS)


async def hooked_model() -> None:
    traces.response_model("judge-model-0613")


HOOKS: list[tuple[str, Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]] = [
    ("agent call (@agent_span)", bare_call, hooked_agent),
    ("judge call (@llm_span)", bare_call, hooked_judge),
    ("turn span (tracing.turn)", bare_block, hooked_turn),
    ("3 verdict events (tracing.verdicts)", bare_block, hooked_verdicts),
    ("response model (traces.response_model)", bare_block, hooked_model),
]


async def best_ns(fn: Callable[[], Awaitable[None]], calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter_ns()
        for _ in range(calls):
            await fn()
        best = min(best, (time.perf_counter_ns() - started) / calls)
    return best


async def measure(calls: int, repeat: int) -> None:
    rows = []
    for name, bare, hooked in HOOKS:
        traces.shutdown()
        baseline = await best_ns(bare, calls, repeat)
        off = await best_ns(hooked, calls, repeat)
        traces.start(Dropped(), default_service="spar-bench")
        with traces.root("scenario_run bench", {"spar.run.id": "bench"}):
            on = await best_ns(hooked, max(calls // 10, 1), repeat)
        traces.shutdown()
        rows.append((name, baseline, off, on))
    print(f"{'hook':42} {'baseline':>9} {'off':>9} {'on':>9} {'+off':>8} {'+on':>9}  (ns/call)")
    for name, baseline, off, on in rows:
        print(
            f"{name:42} {baseline:9.0f} {off:9.0f} {on:9.0f} {off - baseline:8.0f} "
            f"{on - baseline:9.0f}"
        )
    worst = max(off - baseline for _, baseline, off, _ in rows)
    print(f"worst overhead with tracing off: {worst / 1000:.3f} µs per call (target < 1 µs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(measure(args.calls, args.repeat))


if __name__ == "__main__":
    main()
