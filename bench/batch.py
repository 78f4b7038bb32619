"""Batch-run throughput against the limit set by the agent's and the judge's latency.

A real stack on this machine: a throwaway PostgreSQL database (migrated), a private
Redis, ``spar serve`` and ``--workers`` ``spar worker`` processes, and
loopback fakes answering after a fixed latency (the agent after ``--agent-ms`` per turn,
the judge after ``--judge-ms`` per criterion).  It submits a batch of N scenarios x T
turns x C LLM-judged criteria at ``max_concurrency`` K over REST, polls it to the end
and prints:

* the ideal wall time, ⌈N/K⌉ x T x (agent + judge latency) — the criteria of a turn
  are judged concurrently, so C does not multiply it;
* the measured wall time (submit → the poll that sees the batch completed) and the
  efficiency, ideal / measured (1.0 = no overhead at all);
* then a second batch with zero latency: scenario runs per second, the pipeline's own
  overhead (database, broker, HTTP, the workers' CPU).

Figures are printed, not asserted.  Run from the repository root::

    python bench/batch.py --scenarios 500 --turns 3 --criteria 2 --concurrency 100 \\
        --workers 2 --threads 64

Environment: ``SPAR_BENCH_DATABASE_URL`` (default: the local PostgreSQL, database
``spar_bench_<pid>``, dropped afterwards) and ``SPAR_BENCH_REDIS_URL`` (flushed before
and after; default: a private ``redis-server`` on a free port, so that two runs at once
never share a queue, falling back to ``redis://127.0.0.1:6379/13``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psutil
from sqlalchemy import create_engine, insert

from bench.stack import (
    FAKES,
    CpuMeter,
    CpuSpent,
    Fakes,
    Stack,
    database_url,
    loopback_fakes,
    ok,
    spar_stack,
    unwind_on_sigterm,
    wait_for_workers,
)
from shared.db.models import Criterion, Scenario, ScenarioTurn
from shared.settings import Settings

CHAIN_SLACK_S = 0.01  # a successor's dispatched_at is its predecessor's completed_at, give or take
POLL_S = 0.2  # the client's poll; the wall time itself is read off the batch (completed_at)


# --- database ------------------------------------------------------------------------------------


def insert_scenarios(url: str, org_id: str, count: int, turns: int, criteria: int) -> None:
    """``count`` scenarios straight into the tables, as the API would store them."""
    now = datetime.now(UTC)
    scenario_rows, turn_rows, criterion_rows = [], [], []
    for n in range(count):
        scenario_id = uuid.uuid4()
        scenario_rows.append(
            {
                "id": scenario_id,
                "organization_id": uuid.UUID(org_id),
                "name": f"bench {n}",
                "description": None,
                "tags": ["bench"],
                "customer_context": {},
                "created_at": now + timedelta(microseconds=n),
                "updated_at": now,
            }
        )
        for t in range(turns):
            turn_id = uuid.uuid4()
            turn_rows.append(
                {
                    "id": turn_id,
                    "scenario_id": scenario_id,
                    "order_index": t,
                    "user_message": f"question {t} of scenario {n}",
                    "required": False,
                }
            )
            criterion_rows.extend(
                {
                    "id": uuid.uuid4(),
                    "turn_id": turn_id,
                    "order_index": c,
                    "question": f"Does the reply answer question {t}? (criterion {c})",
                    "criteria_type": "llm_evaluated",
                    "few_shot_examples": [],
                }
                for c in range(criteria)
            )
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(Scenario), scenario_rows)
            conn.execute(insert(ScenarioTurn), turn_rows)
            if criterion_rows:
                conn.execute(insert(Criterion), criterion_rows)
    finally:
        engine.dispose()


# --- the API -------------------------------------------------------------------------------------


def setup_org(spar: Stack, agent_url: str, judge_url: str) -> str:
    """The stack's organization allowed to reach the fakes, its default judge, and an agent
    (its id)."""
    api, org, headers = spar.http, spar.org_id, spar.headers
    ok(api.post(f"/v1/orgs/{org}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=headers))
    ok(
        api.post(
            f"/v1/orgs/{org}/llm-providers",
            json={
                "name": "judge",
                "provider": "openai_compatible",
                "base_url": f"{judge_url}/v1",
                "default_model": "judge-1",
                "is_default_judge": True,
            },
            headers=headers,
        )
    )
    agent = ok(
        api.post(
            f"/v1/orgs/{org}/agents",
            json={"name": "bench agent", "kind": "http", "endpoint_url": f"{agent_url}/chat"},
            headers=headers,
        )
    )
    return agent["id"]


def run_batch(
    api: httpx.Client,
    org: str,
    auth: dict[str, str],
    agent_id: str,
    concurrency: int,
    timeout_s: float,
) -> dict[str, Any]:
    """One batch of every ``bench`` scenario (:func:`run_batches`)."""
    return run_batches(api, org, auth, agent_id, concurrency, timeout_s)[0]


def run_batches(
    api: httpx.Client,
    org: str,
    auth: dict[str, str],
    agent_id: str,
    concurrency: int,
    timeout_s: float,
    count: int = 1,
) -> list[dict[str, Any]]:
    """Submit ``count`` batches at once, each of every ``bench`` scenario; poll until all
    end.  Returns each batch with its wall time under ``"wall_s"``: from sending its
    create request to its ``completed_at`` (the commit of its last run; same machine, same
    clock), so the poll's own interval does not count.  ``"observed_s"`` is when the poll
    saw it."""
    path = f"/v1/orgs/{org}/scenarios/batch-runs"
    started_at: dict[str, float] = {}
    submitted: dict[str, float] = {}
    first = time.perf_counter()
    for _ in range(count):
        at, started = time.time(), time.perf_counter()
        batch = ok(
            api.post(
                f"{path}/",
                json={"agent_id": agent_id, "tags": ["bench"], "max_concurrency": concurrency},
                headers=auth,
            )
        )
        started_at[batch["id"]] = at
        submitted[batch["id"]] = time.perf_counter() - started
    deadline = first + timeout_s
    ended: dict[str, dict[str, Any]] = {}
    while len(ended) < count:
        # The listing carries the counters without the per-run summaries: a cheap poll.
        listing = ok(api.get(f"{path}/?limit=500", headers=auth), 200)
        for current in listing["batch_runs"]:
            over = current["status"] not in ("queued", "running")
            if over and current["id"] in started_at and current["id"] not in ended:
                current["observed_s"] = time.perf_counter() - first
                ended[current["id"]] = current
        if len(ended) < count:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{count - len(ended)} batches not done after {timeout_s}s")
            time.sleep(POLL_S)
    done = []
    for batch_id, at in started_at.items():
        current = ended[batch_id]
        completed = datetime.fromisoformat(current["completed_at"]).timestamp()
        current["wall_s"] = completed - at
        current["submit_s"] = submitted[batch_id]
        done.append(current)
    return done


class Occupancy(threading.Thread):
    """Samples, every ``interval_s`` until stopped, the runs in flight (running, in the
    database) and the resident memory of the worker processes (with their children): the
    memory a conversation in flight costs is the slope of one against the other."""

    def __init__(self, spar: Stack, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self._spar = spar
        self._interval_s = interval_s
        self._halt = threading.Event()
        self.samples: list[tuple[int, int]] = []  # (runs in flight, bytes resident)
        self.before = self._rss()

    def _rss(self) -> int:
        total = 0
        for pid in self._spar.worker_pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                parent = psutil.Process(pid)
                for process in [parent, *parent.children(recursive=True)]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        total += process.memory_info().rss
        return total

    def run(self) -> None:
        engine = create_engine(self._spar.database_url)
        try:
            while not self._halt.wait(self._interval_s):
                with engine.connect() as conn:
                    flying = conn.exec_driver_sql(
                        "SELECT count(*) FROM scenario_runs WHERE status = 'running'"
                    ).scalar_one()
                self.samples.append((int(flying), self._rss()))
        finally:
            engine.dispose()

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def report(self) -> None:
        if len(self.samples) < 3:
            return
        flying = [f for f, _ in self.samples]
        rss = [r for _, r in self.samples]
        peak = max(flying)
        mib = 1024 * 1024
        line = (
            f"  in flight           {peak:8d}     runs at most "
            f"(mean {statistics.mean(flying):.0f}); "
            f"workers' memory {self.before / mib:.0f} MiB before, {max(rss) / mib:.0f} MiB at most"
        )
        if peak:
            line += f"; {(max(rss) - self.before) / peak / 1024:.0f} KiB per run in flight"
        if len(set(flying)) > 1:
            slope = statistics.linear_regression(flying, rss).slope
            line += f" (slope {slope / 1024:.0f} KiB)"
        print(line)


def breakdown(url: str, batch_id: str) -> dict[str, float]:
    """Where the time went, from the rows: from the batch's creation to its first run's
    start; mean seconds from dispatch to start (broker and worker pick-up), from start to
    end, and the agent's and judge's latency per call as the workers measured it
    (``cost_summary``)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.exec_driver_sql(
                """
                SELECT extract(epoch FROM min(started_at)
                         - (SELECT created_at FROM batch_runs WHERE id = %(batch)s)),
                       extract(epoch FROM min(dispatched_at)
                         - (SELECT created_at FROM batch_runs WHERE id = %(batch)s)),
                       avg(extract(epoch FROM started_at - dispatched_at)),
                       avg(extract(epoch FROM completed_at - started_at)),
                       sum((cost_summary->'agent'->>'latency_ms')::float)
                         / nullif(sum((cost_summary->'agent'->>'calls')::float), 0),
                       sum((cost_summary->'judge'->>'latency_ms')::float)
                         / nullif(sum((cost_summary->'judge'->>'calls')::float), 0),
                       avg(extract(epoch FROM completed_at - started_at)) FILTER (
                         WHERE dispatched_at = (SELECT min(dispatched_at) FROM scenario_runs
                                                WHERE batch_run_id = %(batch)s))
                FROM scenario_runs WHERE batch_run_id = %(batch)s
                """,
                {"batch": batch_id},
            ).one()
            # Each turn's time, from the run's start (its first turn) or the previous turn's
            # commit to its own, for the first window's runs and for the others.
            turns = conn.exec_driver_sql(
                """
                WITH t AS (
                  SELECT r.dispatched_at = (SELECT min(dispatched_at) FROM scenario_runs
                                            WHERE batch_run_id = %(batch)s) AS first_window,
                         tr.turn_index,
                         extract(epoch FROM tr.created_at - coalesce(
                           lag(tr.created_at) OVER (PARTITION BY tr.run_id
                                                    ORDER BY tr.turn_index),
                           r.started_at)) AS took
                  FROM turn_results tr JOIN scenario_runs r ON r.id = tr.run_id
                  WHERE r.batch_run_id = %(batch)s)
                SELECT avg(took) FILTER (WHERE first_window AND turn_index = 0),
                       avg(took) FILTER (WHERE first_window AND turn_index > 0),
                       avg(took) FILTER (WHERE NOT first_window AND turn_index = 0),
                       avg(took) FILTER (WHERE NOT first_window AND turn_index > 0)
                FROM t
                """,
                {"batch": batch_id},
            ).one()
    finally:
        engine.dispose()
    first, handed, pickup, duration, agent_ms, judge_ms, first_window = (
        float(v or 0.0) for v in row
    )
    window_first, window_later, rest_first, rest_later = (float(v or 0.0) for v in turns)
    return {
        "turns_ms": (
            window_first * 1000,
            window_later * 1000,
            rest_first * 1000,
            rest_later * 1000,
        ),
        "first_window_s": first_window,
        "first_s": first,
        "handed_s": handed,
        "pickup_s": pickup,
        "run_s": duration,
        "agent_ms": agent_ms,
        "judge_ms": judge_ms,
    }


def print_breakdown(parts: dict[str, float], t: int, per_turn_s: float) -> None:
    print(
        f"  first run started   {parts['first_s'] * 1000:.0f} ms after the batch was created "
        f"(first runs handed out at {parts['handed_s'] * 1000:.0f} ms; the first window's "
        f"runs took {parts['first_window_s']:.2f} s each)"
    )
    print(
        f"  per run (means)     dispatch->start {parts['pickup_s'] * 1000:.0f} ms, "
        f"start->end {parts['run_s']:.2f} s (ideal {t * per_turn_s:.2f} s); "
        f"agent call {parts['agent_ms']:.0f} ms, judge call {parts['judge_ms']:.0f} ms "
        f"(as the workers saw them)"
    )
    window_first, window_later, rest_first, rest_later = parts["turns_ms"]
    print(
        f"  per turn (means)    start or previous commit -> commit: first window's runs "
        f"{window_first:.0f} ms for turn 1, {window_later:.0f} ms later; other runs "
        f"{rest_first:.0f} ms for turn 1, {rest_later:.0f} ms later (ideal {per_turn_s * 1000:.0f})"
    )


@dataclass(frozen=True)
class Link:
    """A run of the chain that ended last, its times in seconds: from the previous run's
    end (for the first, from the batch's creation) to its dispatch, from dispatch to start,
    and each turn, from the start or the previous turn's commit to its own commit."""

    to_dispatch_s: float
    to_start_s: float
    turns_s: list[float]


def last_chain(url: str, batch_id: str) -> list[Link]:
    """The runs whose wall time is the batch's: the run that ended last, the run whose end
    handed it out, and so on back to the first window.  A successor is handed out in its
    predecessor's end commit, so its ``dispatched_at`` is that run's ``completed_at`` (ends
    written together share it: any of them is the predecessor, their times are the same)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            created = conn.exec_driver_sql(
                "SELECT extract(epoch FROM created_at) FROM batch_runs WHERE id = %(batch)s",
                {"batch": batch_id},
            ).scalar_one()
            rows = conn.exec_driver_sql(
                """
                SELECT extract(epoch FROM r.dispatched_at), extract(epoch FROM r.started_at),
                       extract(epoch FROM r.completed_at),
                       array(SELECT extract(epoch FROM tr.created_at) FROM turn_results tr
                             WHERE tr.run_id = r.id ORDER BY tr.turn_index)
                FROM scenario_runs r
                WHERE r.batch_run_id = %(batch)s AND r.started_at IS NOT NULL
                """,
                {"batch": batch_id},
            ).all()
    finally:
        engine.dispose()
    runs = [(float(d), float(s), float(e), [float(t) for t in turns]) for d, s, e, turns in rows]
    first_window = min(run[0] for run in runs)
    chain = [max(runs, key=lambda run: run[2])]
    while chain[-1][0] > first_window:
        dispatched = chain[-1][0]
        ended_then = [
            run for run in runs if run[0] < dispatched and abs(run[2] - dispatched) <= CHAIN_SLACK_S
        ]
        if not ended_then:  # handed out by the sweeper's dispatch, not by a run's end
            break
        chain.append(min(ended_then, key=lambda run: abs(run[2] - dispatched)))
    chain.reverse()
    links, previous_end = [], float(created)
    for dispatched, started, ended, turns in chain:
        commits = [started, *turns]
        links.append(
            Link(
                to_dispatch_s=dispatched - previous_end,
                to_start_s=started - dispatched,
                turns_s=[b - a for a, b in pairwise(commits)],
            )
        )
        previous_end = ended
    return links


def print_last_chain(chain: list[Link], per_turn_s: float) -> None:
    """Where the chain that ended last lost its time against the ideal: before its first
    run started, in each turn over the ideal turn, between a run's end and the next's
    start."""
    start = (chain[0].to_dispatch_s + chain[0].to_start_s) * 1000
    over = [[(turn - per_turn_s) * 1000 for turn in link.turns_s] for link in chain]
    gaps = [(link.to_dispatch_s + link.to_start_s) * 1000 for link in chain[1:]]
    turns = " | ".join(" ".join(f"{ms:+.0f}" for ms in run) for run in over)
    print(
        f"  the last chain      {len(chain)} runs: created -> first started {start:.0f} ms "
        f"(handed out at {chain[0].to_dispatch_s * 1000:.0f}); turns over "
        f"{per_turn_s * 1000:.0f} ms: {turns} (sum {sum(map(sum, over)):.0f} ms); end -> next "
        f"start {', '.join(f'{ms:.0f}' for ms in gaps) or '-'} ms"
    )


def server_span(batch: dict[str, Any]) -> float:
    created = datetime.fromisoformat(batch["created_at"])
    completed = datetime.fromisoformat(batch["completed_at"])
    return (completed - created).total_seconds()


# --- main ----------------------------------------------------------------------------------------


def workload_arguments(
    parser: argparse.ArgumentParser, *, scenarios: int, concurrency: int, threads: int
) -> None:
    """The workload's options (N, T, C, K, the fakes' latency and kind) and Spar's (its
    workers, their threads, pool and prefetch), with these defaults: this bench's and
    ``bench/peers.py``'s."""
    parser.add_argument(
        "--scenarios", "-n", type=int, default=scenarios, help=f"N (default {scenarios})"
    )
    parser.add_argument("--turns", "-t", type=int, default=3, help="T turns each (default 3)")
    parser.add_argument("--criteria", "-c", type=int, default=2, help="C per turn (default 2)")
    parser.add_argument(
        "--concurrency",
        "-k",
        type=int,
        default=concurrency,
        help=f"K (1-100; default {concurrency})",
    )
    parser.add_argument("--agent-ms", type=float, default=200.0, help="agent latency per turn")
    parser.add_argument("--judge-ms", type=float, default=300.0, help="judge latency per call")
    parser.add_argument("--workers", type=int, default=2, help="spar worker processes")
    parser.add_argument("--threads", type=int, default=threads, help="threads per worker process")
    parser.add_argument("--db-pool", type=int, default=None, help="SPAR_DB_POOL_SIZE of workers")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="messages a worker process may hold (Dramatiq's dramatiq_queue_prefetch; "
        "its default is 2 x threads, which lets one process hoard runs it has no thread for)",
    )
    parser.add_argument(
        "--fakes",
        choices=sorted(FAKES),
        default="asyncio",
        help="the agent and judge fakes: asyncio (default; a process of their own, one event "
        "loop) or threaded (stdlib ThreadingHTTPServer, a thread per connection, inside this "
        "process beside its poll: how many users' own test agents are written)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per batch (peers.py: per tool)"
    )


def ideal_s(args: argparse.Namespace) -> float:
    """⌈N/K⌉ x T x (agent + judge latency): a conversation's turns are sequential and a
    turn's criteria are judged at once, so C does not multiply it."""
    return math.ceil(args.scenarios / args.concurrency) * args.turns * turn_ideal_s(args)


def target(args: argparse.Namespace) -> float:
    """The efficiency Spar aims at in this mode: the first batch after the workers start
    0.95 with the asyncio fakes and 0.85 with the threaded ones; any other batch (each of
    ``--thousand``'s too) 0.9."""
    if args.first_batch and args.batches == 1:
        return 0.95 if args.fakes == "asyncio" else 0.85
    return 0.9


def turn_ideal_s(args: argparse.Namespace) -> float:
    """A turn's ideal: the agent's latency, and the judge's if the turn has criteria."""
    return (args.agent_ms + (args.judge_ms if args.criteria else 0.0)) / 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(parser, scenarios=500, concurrency=100, threads=64)
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="scenarios of an unmeasured warm-up batch (default: K; 0 for none)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="latency passes (default 3): a shared machine's noise moves one pass by a few "
        "percent, so the median is the figure to quote",
    )
    parser.add_argument("--no-zero-pass", action="store_true", help="skip the zero-latency pass")
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the floor pass (bench/floor.py: the same conversations on bare asyncio, "
        "aiohttp and psycopg, whose CPU per turn Spar's is divided by)",
    )
    parser.add_argument(
        "--first-batch",
        action="store_true",
        help="measure only the first batch after the workers start: no warm-up, one latency "
        "pass, no zero-latency pass (the target at -n 200 -k 50 is 0.95 with the asyncio "
        "fakes, 0.85 with the threaded ones)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=1,
        help="B batches submitted at once, each of the N scenarios at K (default 1): B x K "
        "conversations in flight",
    )
    parser.add_argument(
        "--thousand",
        action="store_true",
        help="1,000 conversations in flight: --batches 10 -n 200 -k 100 --agent-ms 2000 "
        "--judge-ms 1000 --first-batch (real models' latencies); prints each batch's "
        "efficiency and the workers' memory per run in flight",
    )
    args = parser.parse_args(argv)
    if args.thousand:
        args.batches, args.scenarios, args.concurrency = 10, 200, 100
        args.agent_ms, args.judge_ms, args.first_batch = 2000.0, 1000.0, True
    if args.first_batch:
        args.warmup, args.repeat, args.no_zero_pass = 0, 1, True
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    unwind_on_sigterm()
    bench(args, database_url(""))


def bench(args: argparse.Namespace, url: str) -> None:
    n, t, c, k = args.scenarios, args.turns, args.criteria, args.concurrency
    warmup = k if args.warmup is None else args.warmup
    print(
        f"batch benchmark: N={n} scenarios x T={t} turns x C={c} criteria, K={k}; "
        f"agent {args.agent_ms:g} ms/turn, judge {args.judge_ms:g} ms/criterion; "
        f"{f'{args.batches} batches at once; ' if args.batches > 1 else ''}"
        f"{args.workers} worker process(es) x {args.threads} threads"
        f"{f', prefetch {args.prefetch}' if args.prefetch else ''}; {args.fakes} fakes; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    with (
        loopback_fakes(args.fakes) as fake,
        spar_stack(url, **stack_settings(args, args.batches)) as spar,
    ):
        api, org, auth = spar.http, spar.org_id, spar.headers
        agent_id = ready(spar, fake, args)
        if warmup:
            insert_scenarios(url, org, warmup, t, c)
            done = run_batch(api, org, auth, agent_id, k, args.timeout)
            print(f"warm-up: {warmup} runs at zero latency in {done['wall_s']:.2f} s")
            # The warm-up scenarios are not part of the measured batches.
            _untag(url)
        insert_scenarios(url, org, n, t, c)

        fake.set_latency(args.agent_ms / 1000, args.judge_ms / 1000)
        efficiencies, per_turn = [], []
        for attempt in range(1, args.repeat + 1):
            batches, spent = latency_pass(spar, fake, agent_id, args, attempt)
            efficiencies += [batch["efficiency"] for batch in batches]
            per_turn.append(spent.stack / (args.batches * n * t))
        if args.repeat > 1 and args.batches == 1:
            print(
                f"efficiency over {args.repeat} latency passes: median "
                f"{statistics.median(efficiencies):.3f} (min {min(efficiencies):.3f}, "
                f"max {max(efficiencies):.3f}; target {target(args):g})"
            )

        if not args.no_floor:
            report_floor(floor_pass(args, url, fake), args, statistics.median(per_turn))

        if not args.no_zero_pass:
            fake.set_latency(0.0, 0.0)
            meter = CpuMeter(spar, fake)
            meter.start()
            zero = run_batch(api, org, auth, agent_id, k, args.timeout)
            spent = meter.stop()
            report_zero_pass(zero, n, t, c)
            report_cpu(spent, n * t, n * t * (1 + c))
            print_breakdown(breakdown(url, zero["id"]), t, 0.0)
        served = fake.served()
        print(f"requests served by the fakes: agent {served['agent']}, judge {served['judge']}")
        report_worker_errors(spar.logs)


def ready(spar: Stack, fake: Fakes, args: argparse.Namespace) -> str:
    """The organization set up against the fakes (its agent's id), once every worker
    consumes: a batch sent before the workers have booted measures their boot, not Spar's
    path from a batch to its runs."""
    agent_id = setup_org(spar, fake.agent_url, fake.judge_url)
    assert spar.redis_url is not None
    wait_for_workers(spar.redis_url, args.workers, args.timeout)
    print(f"workers ready {time.perf_counter() - spar.workers_started:.2f} s after start")
    return agent_id


def latency_pass(
    spar: Stack, fake: Fakes, agent_id: str, args: argparse.Namespace, attempt: int
) -> tuple[list[dict[str, Any]], CpuSpent]:
    """``args.batches`` batches of the ``bench`` scenarios at once, at the fakes' latency:
    each batch (with its ``efficiency``) and the CPU the stack spent, printed as they
    come."""
    n, t, c, k, b = args.scenarios, args.turns, args.criteria, args.concurrency, args.batches
    ideal, turn_s = ideal_s(args), turn_ideal_s(args)
    meter = CpuMeter(spar, fake)
    occupancy = Occupancy(spar)
    meter.start()
    occupancy.start()
    batches = run_batches(spar.http, spar.org_id, spar.headers, agent_id, k, args.timeout, b)
    spent = meter.stop()
    occupancy.stop()
    if args.first_batch:
        print("first batch after the workers start (no warm-up):")
    for done in batches:
        report_latency_pass(done, n, t, c, k, ideal, turn_s, attempt, target(args))
        done["efficiency"] = ideal / done["wall_s"]
    if b > 1:
        each = [done["efficiency"] for done in batches]
        print(
            f"{b} batches at once: efficiency min {min(each):.3f}, median "
            f"{statistics.median(each):.3f}, max {max(each):.3f} (target {target(args):g} each)"
        )
    report_cpu(spent, b * n * t, b * n * t * (1 + c))
    occupancy.report()
    print_breakdown(breakdown(spar.database_url, batches[0]["id"]), t, turn_s)
    print_last_chain(last_chain(spar.database_url, batches[0]["id"]), turn_s)
    return batches, spent


def report_worker_errors(logs: Path) -> None:
    """Failed deliveries are retried (the run resumes after its last committed turn), so
    they cost time, not correctness: count them and show the first."""
    failures = []
    for log in sorted(logs.glob("spar-worker-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if " ERROR " in line:
                rest = []
                for following in lines[index + 1 :]:
                    if re.match(r"^\d{4}-\d\d-\d\d ", following):
                        break
                    rest.append(following)
                failures.append((line, rest))
    if not failures:
        print("worker errors: none")
        return
    kinds = Counter(_exception_line(rest) for _, rest in failures)
    print(f"worker errors: {len(failures)} failed deliveries (Dramatiq retries them):")
    for kind, count in kinds.most_common(3):
        print(f"  {count} x {kind[:300]}")


def _exception_line(traceback: list[str]) -> str:
    """The ``ExceptionType: message`` line that ends a logged traceback."""
    found = [line for line in traceback if re.match(r"^[\w.]+(Error|Exception|Timeout)\b", line)]
    return found[-1] if found else (traceback[0] if traceback else "?")


def _untag(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE scenarios SET tags = '[]'::jsonb")
    finally:
        engine.dispose()


def report_latency_pass(
    done: dict[str, Any],
    n: int,
    t: int,
    c: int,
    k: int,
    ideal_s: float,
    per_turn_s: float,
    attempt: int,
    aim: float,
) -> None:
    measured = done["wall_s"]
    counts = (
        f"{done['completed_scenarios']}/{done['total_scenarios']} completed "
        f"({done['passed_scenarios']} passed, {done['failed_scenarios']} failed, "
        f"{done['error_scenarios']} error), status {done['status']}"
    )
    print(f"latency pass {attempt}: {counts}")
    print(f"  N={n} T={t} C={c} K={k}")
    print(
        f"  ideal wall time     {ideal_s:8.2f} s   "
        f"(ceil({n}/{k}) = {math.ceil(n / k)} x {t} turns x {per_turn_s * 1000:.0f} ms)"
    )
    print(
        f"  measured wall time  {measured:8.2f} s   (submit -> completed_at; the batch's own "
        f"created -> completed: {server_span(done):.2f} s; submit answered in "
        f"{done['submit_s'] * 1000:.0f} ms; the {POLL_S:g} s poll saw it at "
        f"{done['observed_s']:.2f} s)"
    )
    print(f"  efficiency          {ideal_s / measured:8.3f}     (ideal / measured; target {aim:g})")


def report_cpu(spent: CpuSpent, turns: int, calls: int) -> None:
    """The CPU the stack spent in the batch's window (submit to the poll that saw it end),
    per turn and per outbound call (the agent's and the judge's)."""
    per_turn = spent.stack / turns * 1000
    print(
        f"  CPU per turn        {per_turn:8.2f} ms  (Spar {spent.spar / turns * 1000:.2f}, of "
        f"which spar serve {spent.serve / turns * 1000:.2f}, + "
        f"PostgreSQL {spent.database / turns * 1000:.2f} + Redis "
        f"{spent.redis / turns * 1000:.2f}; per outbound call {spent.stack / calls * 1000:.2f} "
        f"ms; {spent.stack:.2f} s of CPU in {spent.wall_s:.2f} s; the fakes' process "
        f"{spent.fakes:.2f} s apart)"
    )


def floor_pass(args: argparse.Namespace, url: str, fake: Fakes) -> dict[str, float]:
    """``bench/floor.py`` on the workload of a latency pass (all B x N conversations, B x K
    at a time), against the same fakes at the same latency, while Spar idles: as many
    processes as Spar has workers, each with a worker's pool and its share of the
    conversations, started together.  Their wall time (first start to last end) and CPU."""
    total, lanes = args.batches * args.scenarios, args.batches * args.concurrency
    shares = _shares(total, lanes, args.workers)
    start_at = time.time() + 5.0  # past the processes' imports and pools
    running = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("floor.py")),
                *("--agent-url", fake.agent_url, "--judge-url", fake.judge_url),
                *("--database-url", url, "--db-pool", str(args.db_pool or Settings().db_pool_size)),
                *("-n", str(scenarios), "-t", str(args.turns)),
                *("-c", str(args.criteria), "-k", str(at_once)),
                *("--start-at", str(start_at)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for scenarios, at_once in shares
    ]
    parts = []
    for process in running:
        out, _ = process.communicate()
        if process.returncode:
            raise RuntimeError(f"bench/floor.py failed ({process.returncode})")
        parts.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "wall_s": max(p["ended_at"] for p in parts) - min(p["started_at"] for p in parts),
        "cpu_s": sum(p["cpu_s"] for p in parts),
        "database_cpu_s": sum(p["database_cpu_s"] for p in parts),
        "processes": len(shares),
    }


def _shares(total: int, lanes: int, processes: int) -> list[tuple[int, int]]:
    """``total`` conversations ``lanes`` at a time shared out between at most ``processes``:
    each process's (conversations, lanes at once), the lanes as evenly as they go and the
    conversations by lanes, so that no process needs more rounds of conversations than
    the whole (⌈total / lanes⌉: shared evenly instead, 25 conversations at 12 lanes would
    take three rounds where 50 at 25 take two)."""
    rounds = math.ceil(total / lanes)
    shares, left = [], total
    for i in range(min(processes, lanes)):
        at_once = lanes // processes + (i < lanes % processes)
        scenarios = min(at_once * rounds, left)
        left -= scenarios
        if scenarios:
            shares.append((scenarios, at_once))
    return shares


def report_floor(floor: dict[str, float], args: argparse.Namespace, spar_per_turn: float) -> None:
    turns = args.batches * args.scenarios * args.turns
    per_turn = (floor["cpu_s"] + floor["database_cpu_s"]) / turns
    print(
        f"floor pass (bench/floor.py: the same conversations in {floor['processes']:.0f} "
        "process(es), one asyncio loop each with aiohttp and psycopg, a write per turn; no "
        "queue, claims, limits or metrics):"
    )
    print(
        f"  efficiency          {ideal_s(args) / floor['wall_s']:8.3f}     (ideal / measured; "
        f"{floor['wall_s']:.2f} s)"
    )
    print(
        f"  CPU per turn        {per_turn * 1000:8.2f} ms  (its processes "
        f"{floor['cpu_s'] / turns * 1000:.2f} + PostgreSQL "
        f"{floor['database_cpu_s'] / turns * 1000:.2f})"
    )
    print(
        f"  Spar / floor        {spar_per_turn / per_turn:8.2f} x   (Spar's CPU per turn, "
        f"{spar_per_turn * 1000:.2f} ms{' median' if args.repeat > 1 else ''}, over the floor's)"
    )


def report_zero_pass(zero: dict[str, Any], n: int, t: int, c: int) -> None:
    wall = zero["wall_s"]
    print(
        f"zero-latency pass: {zero['completed_scenarios']}/{zero['total_scenarios']} completed, "
        f"status {zero['status']}"
    )
    print(f"  measured wall time  {wall:8.2f} s")
    print(
        f"  scenario runs/s     {n / wall:8.1f}     ({n * t / wall:.0f} turns/s, "
        f"{n * t * (1 + c) / wall:.0f} agent+judge calls/s)"
    )


# --- the first batch's figures, for bench/peers.py -----------------------------------------------


def stack_settings(args: argparse.Namespace, batches: int = 1) -> dict[str, Any]:
    """:func:`spar_stack`'s arguments for the batch bench's options: its workers and their
    settings."""
    worker_args = ["--processes", "1", "--threads", str(args.threads)]
    worker_args += ["--queues", "runs,batches"]
    if args.prefetch:
        worker_args += ["--prefetch", str(args.prefetch)]
    return {
        "env": {
            "SPAR_EGRESS_ALLOW_PRIVATE": "true",
            # Each destination's concurrency (default 100) must not be the bound: B x K
            # conversations call the one agent, and each judges C criteria at once.
            "SPAR_OUTBOUND_MAX_CONCURRENCY": str(
                max(100, batches * args.concurrency * max(1, args.criteria))
            ),
        },
        "workers": args.workers,
        "worker_args": worker_args,
        "worker_env": {"SPAR_DB_POOL_SIZE": str(args.db_pool)} if args.db_pool else {},
    }


def first_batch(args: argparse.Namespace, url: str, fake: Fakes) -> tuple[dict[str, Any], CpuSpent]:
    """``--first-batch`` against fakes already running at their latency: the batch (its
    ``wall_s``) and the CPU the stack spent on it, printed as :func:`bench` prints them and
    returned, so that ``bench/peers.py`` can set them beside another tool's."""
    with spar_stack(url, **stack_settings(args)) as spar:
        agent_id = ready(spar, fake, args)
        insert_scenarios(url, spar.org_id, args.scenarios, args.turns, args.criteria)
        batches, spent = latency_pass(spar, fake, agent_id, args, 1)
        report_worker_errors(spar.logs)
    return batches[0], spent


if __name__ == "__main__":
    main()
