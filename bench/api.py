"""API throughput: Spar's authenticated reads against a bare app serving the same bodies.

Three servers on this machine, each one uvicorn process with the same settings:

* ``spar serve`` on a throwaway PostgreSQL database (created, migrated, dropped at the
  end), seeded over REST: a user, an organization, a few allowed domains and scenarios,
  an agent and a few queued batches of those scenarios, and a platform token;
* ``bare``: a bare Litestar app (this file, ``--serve-bare``) with the same routes
  answering the very JSON bodies Spar gave, from memory: no token, no database.  The
  ceiling of the framework and server;
* ``sql``: a bare Litestar app (this file, ``--serve-sql``) with the same routes that, per
  request, runs the SQL Spar runs for it on psycopg 3 (async, a psycopg_pool pool of
  Spar's size, autocommit): the token lookup (token, user and role in the organization,
  or the platform token) and the listing's count and page, and answers the rows as JSON
  (msgspec).  No framework of Spar's own: the honest ceiling for a request that must read
  the database.

Each request is driven against the three in the same run, at concurrency C for a fixed
duration, by a load generator in a process of its own (``wrk`` if installed, else an
asyncio client on aiohttp).  It prints req/s, p50 and p99 for each, the CPU per request
of each server and of the PostgreSQL backends (steadier than throughput on a shared
machine), and the ratios Spar / bare and Spar / sql; the targets, against the sql app,
are Spar >= 50 % of its throughput and p99 <= 2 x its p99.  Figures are printed, not
asserted.  Run from the repository root::

    python bench/api.py --duration 10 --concurrency 50

Environment: ``SPAR_BENCH_DATABASE_URL`` (default: the local PostgreSQL, database
``spar_bench_api_<pid>``, dropped afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from litestar import Request  # at module level: the handlers' annotations are resolved here

from bench.stack import (
    Stack,
    backend_cpu_seconds,
    cpu_seconds,
    database_url,
    ok,
    percentiles,
    psycopg_dsn,
    spar_stack,
    unwind_on_sigterm,
)
from tests.support.processes import free_port

# uvicorn's settings of ``spar serve`` (api/cli.py ``_serve``), given to the bare app too.
UVICORN_LOG_LEVEL = "warning"
SEED_DOMAINS = 5
SEED_SCENARIOS = 5
SEED_BATCHES = 5  # queued: no worker plays them
WRK_SCRIPT = """
done = function(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "non_2xx": %d, '
    .. '"socket_errors": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    errors.status, errors.connect + errors.read + errors.write + errors.timeout))
end
"""


@dataclass(frozen=True, slots=True)
class Target:
    """One request driven against both servers: ``route`` is the Litestar route template
    the bare app registers, ``path`` the concrete path requested."""

    name: str
    route: str
    path: str
    token: str


@dataclass(frozen=True, slots=True)
class Result:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    failed: int
    server_cpu_ms: float = 0.0  # CPU per request: the server process
    db_cpu_ms: float = 0.0  # ... and the PostgreSQL backends serving its database

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


@dataclass(frozen=True, slots=True)
class Server:
    name: str
    url: str
    pid: int
    database_url: str | None = None


# --- CPU accounting ------------------------------------------------------------------------------
# Throughput on a shared machine moves with everyone else's load; the CPU a request costs
# moves much less, and says where the time goes (the server, or PostgreSQL).


def cpu_snapshot(server: Server) -> tuple[float, dict[int, float]]:
    return cpu_seconds(server.pid), backend_cpu_seconds(server.database_url)


def with_cpu(result: Result, server: Server, before: tuple[float, dict[int, float]]) -> Result:
    own_before, backends_before = before
    own_after, backends_after = cpu_snapshot(server)
    # A backend that appeared during the pass spent all its CPU in it.
    db = sum(cpu - backends_before.get(pid, 0.0) for pid, cpu in backends_after.items())
    n = max(result.requests, 1)
    return dataclasses.replace(
        result, server_cpu_ms=(own_after - own_before) * 1000 / n, db_cpu_ms=db * 1000 / n
    )


# --- the bare app --------------------------------------------------------------------------------


def bare_app(bodies: dict[str, Any]) -> Any:
    """The same routes as Spar, each answering Spar's recorded body (decoded, so that the
    app encodes it as Spar does) without a token check or a database."""
    from litestar import Litestar, get

    def answering(route: str, body: Any) -> Any:
        if "{org_id" in route:  # parsed as a UUID, like Spar's ``PathId``

            async def in_org(org_id: uuid.UUID) -> Any:
                return body

            return get(route, name=route)(in_org)

        async def plain() -> Any:
            return body

        return get(route, name=route)(plain)

    async def live() -> dict[str, str]:
        return {"status": "ok"}

    handlers = [
        get("/health/live")(live),
        *(answering(route, body) for route, body in bodies.items()),
    ]
    return Litestar(route_handlers=handlers, debug=False)


def serve_bare(port: int, bodies_file: str) -> None:
    import uvicorn

    bodies = json.loads(Path(bodies_file).read_text())
    uvicorn.run(
        bare_app(bodies),
        host="127.0.0.1",
        port=port,
        workers=1,
        proxy_headers=True,
        log_level=UVICORN_LOG_LEVEL,
    )


@contextlib.contextmanager
def bare_process(bodies: dict[str, Any], logs: Path) -> Iterator[Server]:
    bodies_file = logs / "bodies.json"
    bodies_file.write_text(json.dumps(bodies))
    with _baseline("bare", ["--serve-bare", str(bodies_file)], logs) as server:
        yield server


@contextlib.contextmanager
def sql_process(database_url: str, logs: Path) -> Iterator[Server]:
    with _baseline("sql", ["--serve-sql", database_url], logs, database_url) as server:
        yield server


@contextlib.contextmanager
def _baseline(
    name: str, args: list[str], logs: Path, database_url: str | None = None
) -> Iterator[Server]:
    """This file serving as the baseline ``name`` (``--serve-<name> PORT ...``), until the
    block ends."""
    port = free_port()
    with (logs / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, __file__, args[0], str(port), *args[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/live", timeout=1).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the {name} app did not start:\n{(logs / f'{name}.log').read_text()}"
                )
            time.sleep(0.1)
        yield Server(name, url, process.pid, database_url)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


# --- the bare app on the database ----------------------------------------------------------------


def spar_sql() -> dict[str, Any]:
    """The SQL Spar runs for the bench's requests, by name: Spar's own compiled statements
    (their text, their constants, their order of arguments), so that both run the same SQL."""
    from shared.batches import services as batches
    from shared.db.models import AllowedDomain
    from shared.db.queries import _in_org
    from shared.identity import accounts, authentication
    from shared.outbound.configuration import _AGENT_AND_PROVIDERS
    from shared.scenarios import services as scenarios
    from shared.scenarios.services import _RUNS, _SCENARIOS

    statements = {
        "user_token": authentication._USER_TOKEN,
        "user_token_in_org": authentication._USER_TOKEN_IN_ORG,
        "platform_token": authentication._PLATFORM_TOKEN,
        "me": accounts._ME,
        "domains": _in_org(AllowedDomain).page()._statement,
        "scenarios": _SCENARIOS[False]._statement,
        "batches": batches._BATCHES[False].page()._statement,
        "runs": _RUNS.page()._statement,
        # A detail's three statements, and how its rows nest.
        "scenario": scenarios._SCENARIO_DETAIL,
        "run": scenarios._RUN_DETAIL,
        # A batch's detail: the batch, its runs' summaries and its replays at once; then,
        # while it runs, its agent and the providers (where its runs call out).
        "batch": (batches._BATCH.by_id(), batches._summaries(), batches._REPLAYS),
        "destinations": _AGENT_AND_PROVIDERS,
    }
    return statements


def sql_app(dsn: str, pool_size: int, sql: dict[str, Any]) -> Any:
    """The same routes as Spar's, each running Spar's SQL for it on psycopg: the token
    lookup (401 without a row, 404 without access to the organization), then the
    request's reads, answered as JSON.  No revocation or expiry rules beyond the row's
    presence, no permission catalogue: what is left is the database's work and the
    driver's, which no implementation of these requests can avoid."""
    import hashlib

    import msgspec
    from litestar import Litestar, get
    from litestar.exceptions import NotAuthorizedException, NotFoundException
    from psycopg import AsyncRawCursor
    from psycopg.rows import dict_row
    from psycopg.types.json import set_json_loads
    from psycopg_pool import AsyncConnectionPool

    async def configure(connection: Any) -> None:
        set_json_loads(msgspec.json.decode, connection)  # as Spar's connections decode JSON

    pool = AsyncConnectionPool(
        dsn,
        min_size=pool_size,
        max_size=pool_size,
        kwargs={"autocommit": True, "options": "-c jit=off -c TimeZone=UTC"},
        configure=configure,
        open=False,
    )

    async def rows(connection: Any, name: str, **given: Any) -> list[dict[str, Any]]:
        statement = sql[name]  # its text and its arguments, executed as Spar executes them
        async with AsyncRawCursor(connection, row_factory=dict_row) as cursor:
            await cursor.execute(statement.sql, statement.arguments(given))
            return await cursor.fetchall()

    async def caller(
        connection: Any, request: Request[Any, Any, Any], org_id: uuid.UUID | None
    ) -> Any:
        token = request.headers.get("authorization", "").partition(" ")[2].strip()
        digest = hashlib.sha256(token.encode()).hexdigest()
        if token.startswith("pat_"):
            found = await rows(connection, "platform_token", digest=digest)
            if found and org_id is not None and found[0]["organization_id"] != org_id:
                raise NotFoundException()
        elif org_id is None:
            found = await rows(connection, "user_token", digest=digest)
        else:
            found = await rows(connection, "user_token_in_org", digest=digest, org_id=org_id)
            if found and found[0]["role_id"] is None:
                raise NotFoundException()
        if not found:
            raise NotAuthorizedException()
        return found[0]

    def listing(route: str, key: str, statement: str) -> Any:
        async def handler(org_id: uuid.UUID, request: Request[Any, Any, Any]) -> dict[str, Any]:
            async with pool.connection() as connection:
                await caller(connection, request, org_id)
            async with pool.connection() as connection:
                page = await rows(connection, statement, p_org=org_id, p_limit=50, p_offset=0)
            total = page[0]["listing_total"]  # each row has it; an empty page is one null row
            for row in page:
                del row["listing_total"]
            return {key: [row for row in page if row["id"] is not None], "total": total}

        return get(route, name=route)(handler)

    async def together(connection: Any, *reads: tuple[Any, dict[str, Any]]) -> list[Any]:
        """``reads`` sent at once (pipeline mode), as Spar sends a detail's statements."""
        async with connection.pipeline():
            cursors = []
            for statement, arguments in reads:
                cursor = AsyncRawCursor(connection, row_factory=dict_row)
                await cursor.execute(statement.sql, statement.arguments(arguments))
                cursors.append(cursor)
        return [await cursor.fetchall() for cursor in cursors]

    def detail(route: str, name: str) -> Any:
        """A detail: Spar's three statements for it sent at once (pipeline mode), as Spar
        sends them, and the rows nested as Spar nests them."""
        tree = sql[name]

        async def handler(org_id: uuid.UUID, request: Request[Any, Any, Any]) -> dict[str, Any]:
            async with pool.connection() as connection:
                await caller(connection, request, org_id)
            given = {"p_id": uuid.UUID(request.path_params["id"])}
            reads = (
                (tree.row, {**given, "p_org": org_id}),
                (tree.turns, given),
                (tree.items, given),
            )
            async with pool.connection() as connection:
                found, turns, items = await together(connection, *reads)
            if not found:
                raise NotFoundException()
            on_turn: dict[Any, list[dict[str, Any]]] = {}
            own: list[dict[str, Any]] = []
            for item in items:
                turn_id = item[tree.turn_key]
                (own if turn_id is None else on_turn.setdefault(turn_id, [])).append(item)
            body = found[0]
            body[tree.turns_as] = [
                {**turn, tree.items_as: on_turn.get(turn["id"], [])} for turn in turns
            ]
            body[tree.own_as] = own
            return body

        return get(route, name=route)(handler)

    @get("/v1/orgs/{org_id:uuid}/scenarios/batch-runs/{id:str}")
    async def batch(org_id: uuid.UUID, request: Request[Any, Any, Any]) -> dict[str, Any]:
        """A batch's detail: Spar's statements, sent as Spar sends them, their rows
        answered as they are (no counts by scenario, no rate limit asked of anyone)."""
        async with pool.connection() as connection:
            await caller(connection, request, org_id)
        given = {"p_batch": uuid.UUID(request.path_params["id"]), "p_org": org_id}
        row, runs, replays = sql["batch"]
        async with pool.connection() as connection:
            found, summaries, replaying = await together(
                connection,
                (row, {"p_id": given["p_batch"], "p_org": org_id}),
                (runs, given),
                (replays, given),
            )
            if not found:
                raise NotFoundException()
            body = found[0]
            if body["status"] in ("queued", "running"):
                agent, providers = await together(
                    connection,
                    *(
                        (s, {"p_agent": body["agent_id"], "p_org": org_id})
                        for s in sql["destinations"]
                    ),
                )
                body["destinations"] = [*agent, *providers]
        body["runs"] = summaries
        body["replays"] = [r["id"] for r in replaying]
        return body

    @get("/v1/auth/me")
    async def me(request: Request[Any, Any, Any]) -> dict[str, Any]:
        async with pool.connection() as connection:
            user_id = (await caller(connection, request, None))["user_id"]
        async with pool.connection() as connection:
            (found,) = await rows(connection, "me", p_user=user_id)
        return found

    async def live() -> dict[str, str]:
        return {"status": "ok"}

    async def open_pool() -> None:
        await pool.open(wait=True)

    async def close_pool() -> None:
        await pool.close()

    handlers = [
        get("/health/live")(live),
        me,
        listing("/v1/orgs/{org_id:uuid}/allowed-domains/", "domains", "domains"),
        listing("/v1/orgs/{org_id:uuid}/scenarios/", "scenarios", "scenarios"),
        listing("/v1/orgs/{org_id:uuid}/scenarios/batch-runs/", "batch_runs", "batches"),
        listing("/v1/orgs/{org_id:uuid}/scenarios/runs", "runs", "runs"),
        detail("/v1/orgs/{org_id:uuid}/scenarios/{id:str}", "scenario"),
        detail("/v1/orgs/{org_id:uuid}/scenarios/runs/{id:str}", "run"),
        batch,
    ]
    return Litestar(
        route_handlers=handlers, on_startup=[open_pool], on_shutdown=[close_pool], debug=False
    )


def serve_sql(port: int, database_url: str) -> None:
    import uvicorn

    from shared.settings import Settings

    app = sql_app(psycopg_dsn(database_url), Settings().db_pool_size, spar_sql())
    uvicorn.run(
        app, host="127.0.0.1", port=port, workers=1, proxy_headers=True, log_level=UVICORN_LOG_LEVEL
    )


# --- load generators -----------------------------------------------------------------------------


def run_wrk(url: str, token: str, concurrency: int, seconds: float, logs: Path) -> Result:
    script = logs / "report.lua"
    script.write_text(WRK_SCRIPT)
    out = subprocess.run(
        [
            shutil.which("wrk") or "wrk",
            "--threads",
            "1",  # one thread does far more than a Python server: it leaves the CPU to it
            "--connections",
            str(concurrency),
            "--duration",
            f"{seconds:g}s",
            "--timeout",
            "30s",
            "--script",
            str(script),
            "--header",
            f"Authorization: Bearer {token}",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("{"))
    report = json.loads(line)
    return Result(
        requests=report["requests"],
        seconds=report["duration_us"] / 1e6,
        p50_ms=report["p50_us"] / 1000,
        p99_ms=report["p99_us"] / 1000,
        failed=report["non_2xx"] + report["socket_errors"],
    )


async def _drive(url: str, token: str, concurrency: int, seconds: float) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    failed = 0
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as client:
        started = time.perf_counter()
        deadline = started + seconds

        async def user() -> None:
            nonlocal failed
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                async with client.get(url) as response:
                    await response.read()
                    if response.status >= 300:
                        failed += 1
                latencies.append(time.perf_counter() - sent)

        await asyncio.gather(*(user() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    cut = percentiles(latencies)
    return {
        "requests": len(latencies),
        "seconds": elapsed,
        "p50_ms": cut["p50"],
        "p99_ms": cut["p99"],
        "failed": failed,
    }


def run_aiohttp(url: str, token: str, concurrency: int, seconds: float) -> Result:
    out = subprocess.run(
        [sys.executable, __file__, "--drive", url, token, str(concurrency), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Result(**json.loads(out.splitlines()[-1]))


def drive(args: argparse.Namespace, url: str, token: str, seconds: float, logs: Path) -> Result:
    if args.client == "wrk":
        return run_wrk(url, token, args.concurrency, seconds, logs)
    return run_aiohttp(url, token, args.concurrency, seconds)


# --- seeding -------------------------------------------------------------------------------------


def seed(spar: Stack) -> list[Target]:
    """The stack's organization given a few rows, all over REST; the requests to drive."""
    api, org, auth, user_token = spar.http, spar.org_id, spar.headers, spar.token
    for n in range(SEED_DOMAINS):
        domain = {"domain": f"agent{n}.example.com"}
        ok(api.post(f"/v1/orgs/{org}/allowed-domains/", json=domain, headers=auth))
    for n in range(SEED_SCENARIOS):
        scenario = {
            "name": f"bench scenario {n}",
            "tags": ["bench"],
            "turns": [
                {"user_message": "Hello?", "criteria": [{"question": "Is it polite?"}]},
                {"user_message": "Where is my order?"},
            ],
        }
        made = ok(api.post(f"/v1/orgs/{org}/scenarios/", json=scenario, headers=auth))
    a_scenario = made["id"]
    agent = {"name": "agent", "kind": "http", "endpoint_url": "https://agent0.example.com/chat"}
    agent_id = ok(api.post(f"/v1/orgs/{org}/agents", json=agent, headers=auth))["id"]
    judge = {
        "name": "judge",
        "provider": "openai_compatible",
        "base_url": "https://agent1.example.com/v1",
        "default_model": "judge-1",
        "is_default_judge": True,
    }
    ok(api.post(f"/v1/orgs/{org}/llm-providers", json=judge, headers=auth))
    for _ in range(SEED_BATCHES):
        batch = {"agent_id": agent_id, "tags": ["bench"], "max_concurrency": 5}
        a_batch = ok(api.post(f"/v1/orgs/{org}/scenarios/batch-runs/", json=batch, headers=auth))
    # A run not played (no worker): its detail is its row, with no turns yet.
    runs = ok(api.get(f"/v1/orgs/{org}/scenarios/runs?limit=1", headers=auth), 200)["runs"]
    a_run = runs[0]["id"]
    pat = ok(
        api.post(
            f"/v1/orgs/{org}/platform-tokens/",
            json={"name": "bench", "permissions": ["domains:read", "scenarios:read"]},
            headers=auth,
        )
    )["token"]
    domains = "/v1/orgs/{org_id:str}/allowed-domains/"
    scenarios = "/v1/orgs/{org_id:str}/scenarios/"
    batches = "/v1/orgs/{org_id:str}/scenarios/batch-runs/"
    runs = "/v1/orgs/{org_id:str}/scenarios/runs"
    return [
        Target("GET /v1/auth/me (user token)", "/v1/auth/me", "/v1/auth/me", user_token),
        Target(
            "GET allowed-domains/ (user token)",
            domains,
            f"/v1/orgs/{org}/allowed-domains/",
            user_token,
        ),
        Target("GET scenarios/ (user token)", scenarios, f"/v1/orgs/{org}/scenarios/", user_token),
        Target("GET scenarios/ (platform token)", scenarios, f"/v1/orgs/{org}/scenarios/", pat),
        Target(
            "GET batch-runs/ (user token)",
            batches,
            f"/v1/orgs/{org}/scenarios/batch-runs/",
            user_token,
        ),
        Target(
            "GET scenarios/runs (user token)", runs, f"/v1/orgs/{org}/scenarios/runs", user_token
        ),
        Target(
            "GET scenarios/{id} (user token)",
            "/v1/orgs/{org_id:str}/scenarios/{scenario_id:str}",
            f"/v1/orgs/{org}/scenarios/{a_scenario}",
            user_token,
        ),
        Target(
            "GET batch-runs/{id} (user token)",
            "/v1/orgs/{org_id:str}/scenarios/batch-runs/{batch_run_id:str}",
            f"/v1/orgs/{org}/scenarios/batch-runs/{a_batch['id']}",
            user_token,
        ),
        Target(
            "GET scenarios/runs/{id} (user token)",
            "/v1/orgs/{org_id:str}/scenarios/runs/{run_id:str}",
            f"/v1/orgs/{org}/scenarios/runs/{a_run}",
            user_token,
        ),
    ]


def record_bodies(api: httpx.Client, targets: list[Target]) -> dict[str, Any]:
    """Spar's answer to each target, by route (a route's targets must answer the same)."""
    bodies: dict[str, Any] = {}
    for target in targets:
        body = ok(api.get(target.path, headers={"Authorization": f"Bearer {target.token}"}), 200)
        if bodies.setdefault(target.route, body) != body:
            raise RuntimeError(f"{target.route}: two tokens, two bodies")
    return bodies


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", "-d", type=float, default=10.0, help="seconds per pass")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    parser.add_argument("--concurrency", "-c", type=int, default=50, help="open connections")
    parser.add_argument("--repeat", type=int, default=1, help="passes per target; the median")
    parser.add_argument(
        "--client",
        choices=["wrk", "aiohttp"],
        default="wrk" if shutil.which("wrk") else "aiohttp",
        help="load generator (default: wrk if installed)",
    )
    parser.add_argument("--only", default="", help="run only targets whose name contains this")
    parser.add_argument("--keep", action="store_true", help="wait for Enter before stopping")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # Internal roles of this file in its child processes.
    if argv[:1] == ["--serve-bare"]:
        serve_bare(int(argv[1]), argv[2])
        return
    if argv[:1] == ["--serve-sql"]:
        serve_sql(int(argv[1]), argv[2])
        return
    if argv[:1] == ["--drive"]:
        import uvloop

        url, token, concurrency, seconds = argv[1], argv[2], int(argv[3]), float(argv[4])
        print(json.dumps(uvloop.run(_drive(url, token, concurrency, seconds))))
        return
    args = parse_args(argv)
    unwind_on_sigterm()
    bench(args, database_url("api"))


def bench(args: argparse.Namespace, url: str) -> None:
    print(
        f"API benchmark: concurrency {args.concurrency}, {args.duration:g} s per pass "
        f"(after {args.warmup:g} s of warm-up), {args.repeat} pass(es), client {args.client}; "
        f"{os.cpu_count()} CPUs; one uvicorn process per server",
        flush=True,
    )
    with spar_stack(url, with_redis=False, log_level=UVICORN_LOG_LEVEL.upper()) as stack:
        spar = Server("spar", stack.base, stack.serve_pid, url)
        targets = [t for t in seed(stack) if args.only in t.name]
        with (
            bare_process(record_bodies(stack.http, targets), stack.logs) as bare,
            sql_process(url, stack.logs) as sql,
        ):
            servers = (spar, bare, sql)
            check_sql_app(sql, targets)
            if args.keep:
                for target in targets:
                    print(f"{target.name}: {target.path} with {target.token}")
                print(
                    f"spar at {spar.url} (pid {spar.pid}), bare app at {bare.url}, "
                    f"sql app at {sql.url} (pid {sql.pid}); Enter stops them"
                )
                input()
            rows = [(t, measure(args, t, servers, stack.logs)) for t in targets]
    report(rows)


def check_sql_app(sql: Server, targets: list[Target]) -> None:
    """The sql app answers every target with 200, and refuses a token it does not know: it
    does read the token."""
    for target in targets:
        ok(
            httpx.get(sql.url + target.path, headers={"Authorization": f"Bearer {target.token}"}),
            200,
        )
        refused = httpx.get(sql.url + target.path, headers={"Authorization": "Bearer ust_nobody"})
        if refused.status_code != 401:
            raise RuntimeError(f"the sql app let an unknown token read {target.path}")


def measure(
    args: argparse.Namespace, target: Target, servers: tuple[Server, ...], logs: Path
) -> dict[str, Result]:
    """Alternate the servers pass by pass, so that a slow moment of a shared machine does
    not fall on one of them only; the pass with the median throughput of each."""
    passes: dict[str, list[Result]] = {server.name: [] for server in servers}
    for _ in range(args.repeat):
        for server in servers:
            url = server.url + target.path
            if args.warmup:
                drive(args, url, target.token, args.warmup, logs)
            before = cpu_snapshot(server)
            result = drive(args, url, target.token, args.duration, logs)
            passes[server.name].append(with_cpu(result, server, before))
    return {name: _median(results) for name, results in passes.items()}


def _median(results: list[Result]) -> Result:
    by_rps = sorted(results, key=lambda r: r.rps)
    return by_rps[len(by_rps) // 2]


def report(rows: list[tuple[Target, dict[str, Result]]]) -> None:
    print()
    header = (
        f"{'request':36} {'server':9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6} "
        f"{'CPU ms/req: server':>18} {'PostgreSQL':>10}"
    )
    print(header)
    print("-" * len(header))
    for target, results in rows:
        for name, r in results.items():
            label = target.name if name == "spar" else ""
            print(
                f"{label:36} {name:9} {r.rps:8.0f} {r.p50_ms:8.1f} {r.p99_ms:8.1f} "
                f"{r.failed:6d} {r.server_cpu_ms:18.2f} {r.db_cpu_ms:10.2f}"
            )
        spar = results["spar"]
        for name in ("bare", "sql"):
            base = results[name]
            throughput, tail = spar.rps / base.rps, spar.p99_ms / base.p99_ms
            line = (
                f"{'':36} {'spar/' + name:9} {throughput:8.2f} {spar.p50_ms / base.p50_ms:8.2f} "
                f"{tail:8.2f}        {spar.server_cpu_ms / base.server_cpu_ms:18.2f}"
            )
            if name == "sql":
                verdict = "ok" if throughput >= 0.5 and tail <= 2.0 else "below target"
                line += f"   {verdict} (targets: req/s >= 0.50, p99 <= 2.00)"
            print(line)
    print()
    for name in ("bare", "sql"):
        print(
            f"median over requests, spar/{name}: throughput ratio "
            f"{statistics.median(r['spar'].rps / r[name].rps for _, r in rows):.2f}, p99 ratio "
            f"{statistics.median(r['spar'].p99_ms / r[name].p99_ms for _, r in rows):.2f}"
        )


if __name__ == "__main__":
    main()
