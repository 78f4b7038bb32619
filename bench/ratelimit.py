"""A batch against an LLM judge that allows R requests a second: wall time against the
limit's own bound, and what the 429s cost.

A real stack on this machine (``bench/stack.py``): a throwaway PostgreSQL database, a
private Redis, ``spar serve`` and ``--workers`` ``spar worker`` processes, and the loopback
fakes of ``bench/fakes.py``: a fast agent (``--agent-ms``) and a judge (OpenAI chat
completions, ``--judge-ms``) behind a token bucket of ``--rate`` R requests a second and
bursts of ``--burst`` B, answering 429 at once past it with a ``Retry-After`` in the form
``--retry-after`` names.  It submits one batch of N scenarios x T turns x C LLM-judged
criteria at ``max_concurrency`` K (far above what R allows), polls it to the end and
prints:

* the bound ``(N x T x C - B) / R``: no client can be judged faster than the bucket refills
  after its first burst;
* the measured wall time (submit → the batch's ``completed_at``) and its ratio to the
  bound (which flatters a batch whose runs ended ``error``: their later calls were never
  made);
* the 429s the judge answered and the peak of its concurrent calls (admitted, not yet
  answered);
* the runs by status, and the messages of the runs that ended ``error``, grouped.

Figures are printed, not asserted; it exits non-zero if the stack does not start or the
batch does not end within ``--timeout``.  Run from the repository root::

    python bench/ratelimit.py -n 200 -t 3 -c 2 --rate 20 --burst 5 -k 100

Environment: as ``bench/batch.py`` (``SPAR_BENCH_DATABASE_URL``, ``SPAR_BENCH_REDIS_URL``);
every process gets the script's environment, so Spar's settings pass through.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine

from bench.batch import insert_scenarios, report_worker_errors, run_batch, setup_org
from bench.fakes import RETRY_AFTER_FORMS
from bench.stack import (
    database_url,
    loopback_fakes,
    spar_stack,
    unwind_on_sigterm,
    wait_for_workers,
)


def error_messages(url: str, batch_id: str) -> list[tuple[int, str]]:
    """The ``error`` runs' messages, most frequent first, with their counts."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                """
                SELECT count(*), coalesce(error_message, '(no message)') FROM scenario_runs
                WHERE batch_run_id = %(batch)s AND status = 'error'
                GROUP BY 2 ORDER BY 1 DESC, 2
                """,
                {"batch": batch_id},
            ).all()
    finally:
        engine.dispose()
    return [(int(count), str(message)) for count, message in rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", "-n", type=int, default=200, help="N (default 200)")
    parser.add_argument("--turns", "-t", type=int, default=3, help="T turns each (default 3)")
    parser.add_argument("--criteria", "-c", type=int, default=2, help="C per turn (default 2)")
    parser.add_argument("--concurrency", "-k", type=int, default=100, help="K (default 100)")
    parser.add_argument(
        "--rate",
        "-r",
        type=float,
        default=20.0,
        help="R: the judge's requests per second (default 20; 0 for no limit)",
    )
    parser.add_argument("--burst", "-b", type=int, default=5, help="B: the bucket's size (5)")
    parser.add_argument(
        "--retry-after",
        choices=RETRY_AFTER_FORMS,
        default="seconds",
        help="how a 429 gives its wait: Retry-After in seconds (default), Retry-After as an "
        "HTTP date, or retry-after-ms",
    )
    parser.add_argument("--agent-ms", type=float, default=20.0, help="agent latency (20 ms)")
    parser.add_argument("--judge-ms", type=float, default=100.0, help="judge latency (100 ms)")
    parser.add_argument("--workers", type=int, default=2, help="spar worker processes (2)")
    parser.add_argument("--threads", type=int, default=64, help="threads per worker (64)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the batch")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    unwind_on_sigterm()
    bench(args, database_url("ratelimit"))


def bench(args: argparse.Namespace, url: str) -> None:
    n, t, c, k, rate, burst = (
        args.scenarios,
        args.turns,
        args.criteria,
        args.concurrency,
        args.rate,
        args.burst,
    )
    calls = n * t * c
    limit = (
        f"judge limited to {rate:g} requests/s (bursts of {burst}, Retry-After as "
        f"{args.retry_after})"
        if rate
        else "judge not limited"
    )
    print(
        f"rate-limit benchmark: N={n} scenarios x T={t} turns x C={c} criteria = {calls} "
        f"judge calls, K={k}; {limit}; agent {args.agent_ms:g} ms, judge {args.judge_ms:g} ms; "
        f"{args.workers} worker process(es) x {args.threads} threads; {os.cpu_count()} CPUs",
        flush=True,
    )
    worker_args = ["--processes", "1", "--threads", str(args.threads), "--queues", "runs,batches"]
    with (
        loopback_fakes() as fake,
        spar_stack(
            url,
            env={"SPAR_EGRESS_ALLOW_PRIVATE": "true"},
            workers=args.workers,
            worker_args=worker_args,
        ) as spar,
    ):
        agent_id = setup_org(spar, fake.agent_url, fake.judge_url)
        insert_scenarios(url, spar.org_id, n, t, c)
        if spar.redis_url is None:
            raise RuntimeError("the workers need Redis")
        wait_for_workers(spar.redis_url, args.workers, 120)
        print(f"workers ready {time.perf_counter() - spar.workers_started:.2f} s after start")
        fake.set_latency(args.agent_ms / 1000, args.judge_ms / 1000)
        fake.set_limit(rate or None, burst, args.retry_after)

        done = run_batch(spar.http, spar.org_id, spar.headers, agent_id, k, args.timeout)
        wall = done["wall_s"]
        served = fake.served()
        print(
            f"batch: {done['completed_scenarios']}/{done['total_scenarios']} completed "
            f"({done['passed_scenarios']} passed, {done['failed_scenarios']} failed, "
            f"{done['error_scenarios']} error), status {done['status']}"
        )
        if rate:
            bound = max(calls - burst, 0) / rate
            formula = f"({n} x {t} x {c} - {burst}) / {rate:g}"
            print(f"  bound               {bound:8.2f} s   ({formula})")
        print(
            f"  measured wall time  {wall:8.2f} s   (submit -> completed_at; the poll saw it "
            f"at {done['observed_s']:.2f} s)"
        )
        if rate:
            ratio = wall / bound if bound else float("inf")
            caveat = (
                "; runs ended error, so calls were never made: the ratio flatters them"
                if done["error_scenarios"]
                else ""
            )
            print(
                f"  ratio               {ratio:8.3f}     (measured / bound; target <= 1.15{caveat})"
            )
        print(
            f"  judge               {served['judge_429']} answered 429, {served['judge']} "
            f"served ({calls} needed), peak {served['judge_peak']} concurrent calls; "
            f"agent {served['agent']} served ({n * t} needed)"
        )
        errors = error_messages(url, done["id"])
        print(f"runs that ended error: {sum(count for count, _ in errors) or 'none'}")
        for count, message in errors:
            print(f"  {count} x {message[:300]}")
        report_worker_errors(spar.logs)


if __name__ == "__main__":
    main()
