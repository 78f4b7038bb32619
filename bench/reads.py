"""Every authenticated read of the API: the server CPU each GET of the OpenAPI document
costs, one request after another.

``bench/api.py`` drives a few frequent reads at concurrency against two bare apps; this
one covers all of them, so that a read left on a slow path shows.  On a throwaway database
(``spar serve`` and one ``spar worker``, the loopback fakes answering at once) it seeds an
organization over REST with one of everything a read can name: scenarios, an agent, a
judge, a batch of the scenarios played to its end and a second one of three repetitions
whose judge fails some verdicts (the two compared), a platform token, a credential, a
knowledge collection with a document processed and bookmarked, a calibration, a scheduled
trigger fired a few times, a webhook endpoint; then enough more of what each listing lists
for a page of 25 (:func:`fill_pages`, and 25 calibrations and scheduled triggers).  Then,
for each GET operation of the served OpenAPI document (but the health checks and the event
stream), with those ids in its path: a warm-up, then ``--requests`` requests one after
another on one keep-alive connection, and the server's CPU per request from ``/proc``
(user + system; the clock ticks at 10 ms, so 500 requests measure to about 3 %).  An
operation whose path names something the seed lacks is listed as skipped.  Figures are
printed, not asserted; the target is 1.5 ms of server CPU per read.  Run from the repository root::

    python bench/reads.py [--requests 500] [--only PATH-FRAGMENT] [--baseline-tree DIR]

On a VM whose speed varies from minute to minute, two trees measured one after the other
differ by more than most changes do.  ``--baseline-tree`` names another checkout of Spar
(same migrations): a second ``spar serve`` runs it on the same database, and each read is
asked of both in turn, :data:`ROUNDS` rounds of ``--requests / ROUNDS`` requests, so both
are measured over the same minutes; the ratio of this tree's CPU to the baseline's is
printed beside each read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.batch import setup_org
from bench.stack import (
    SECRET_KEY,
    Fakes,
    Stack,
    cpu_seconds,
    database_url,
    loopback_fakes,
    ok,
    spar_stack,
    unwind_on_sigterm,
)
from tests.support.processes import spar_serve

TARGET_MS = 1.5
WARMUP = 30
ROUNDS = 10  # with --baseline-tree: each read asked of both trees in turn, this many times
SCENARIOS = 25
WAIT_S = 60.0
SKIPPED = ("/health/", "/events")  # not reads of a resource: checks, and a stream


def wait_for(read: Any, done: Any, what: str) -> Any:
    """``read()`` again until ``done(answer)``, for at most :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        answer = read()
        if done(answer):
            return answer
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not end in {WAIT_S:g} s: {answer}")
        time.sleep(0.2)


def seed(spar: Stack, fakes: Fakes) -> dict[str, str]:
    """One of everything a read names, over REST; the ids, by the name of their path
    parameter."""
    api, org, h = spar.http, spar.org_id, spar.headers
    v1 = f"/v1/orgs/{org}"

    def get(path: str) -> Any:
        return ok(api.get(v1 + path, headers=h), 200)

    def played(**batch: Any) -> str:
        """A batch of the seeded scenarios, played to its end: its id."""
        batch = {"agent_id": agent_id, "tags": ["bench"], "max_concurrency": 10, **batch}
        batch_id = ok(api.post(f"{v1}/scenarios/batch-runs/", json=batch, headers=h))["id"]
        over = wait_for(
            lambda: get(f"/scenarios/batch-runs/{batch_id}"),
            lambda b: b["status"] not in ("queued", "running"),
            "the batch",
        )
        if over["error_scenarios"]:  # the reads of runs that never reached the fakes
            errors = {run["status"] for run in over["runs"]}
            raise RuntimeError(f"the seeded batch's runs ended in error: {errors}")
        return batch_id

    agent_id = setup_org(spar, fakes.agent_url, fakes.judge_url)
    criteria = [{"question": "Is it polite?"}, {"question": "Is it short?"}]
    for n in range(SCENARIOS):
        turns = [{"user_message": f"Question {t}?", "criteria": criteria} for t in range(3)]
        scenario = {"name": f"scenario {n}", "tags": ["bench"], "turns": turns}
        ok(api.post(f"{v1}/scenarios/", json=scenario, headers=h))
    batch_id = played()
    done = get(f"/scenarios/batch-runs/{batch_id}")
    # Compared with it, a batch of three repetitions whose judge fails one verdict in
    # twenty (about three runs in ten, of six verdicts each): its scenarios pass 0 to 3
    # times of 3, so that the pairs differ by 0, -1/3, -2/3 or -1, as two batches of a
    # changed agent do.
    fakes.fail_every(20)
    changed = played(repetitions=3)
    fakes.fail_every(None)
    a_scenario = get("/scenarios")["scenarios"][0]["id"]
    turns = get(f"/scenarios/{a_scenario}")["turns"]
    ids = {
        "org_id": org,
        "agent_id": agent_id,
        "batch_run_id": batch_id,
        "scenario_id": a_scenario,
        "run_id": done["runs"][0]["id"],
        "user_id": ok(api.get("/v1/auth/me", headers=h), 200)["user"]["id"],
        "role_id": get("/roles")["roles"][0]["id"],
        "domain_id": get("/allowed-domains")["domains"][0]["id"],
        "provider_id": get("/llm-providers")["llm_providers"][0]["id"],
        "key": "API_KEY",
    }
    token = {"name": "reader", "permissions": ["scenarios:read"]}
    ids["token_id"] = ok(api.post(f"{v1}/platform-tokens/", json=token, headers=h))["id"]
    ok(api.put(f"{v1}/credentials/{ids['key']}", json={"value": "not-a-secret"}, headers=h))
    collection = ok(api.post(f"{v1}/knowledge/collections", json={"name": "policies"}, headers=h))
    ids["collection_id"] = collection["id"]
    document = {
        "collectionId": collection["id"],
        "filename": "refunds.md",
        "content": "# Refunds\n\nWithin 30 days.\n\n## Exceptions\n\nGift cards.\n" * 20,
    }
    path = f"{v1}/knowledge/documents/structured"
    ids["document_id"] = ok(api.post(path, json=document, headers=h))["id"]
    wait_for(
        lambda: get(f"/knowledge/documents/{ids['document_id']}/status"),
        lambda s: s["status"] in ("ready", "failed"),
        "the document",
    )
    bookmark = {"bookmarkMode": "always", "agentIds": [agent_id]}
    path = f"{v1}/knowledge/documents/{ids['document_id']}/bookmark"
    ok(api.put(path, json=bookmark, headers=h), 200)
    examples = [
        {
            "id": f"example {n}",
            "user_message": "Where is my order?",
            "agent_response": "On its way.",
            "human_verdict": "PASS" if n % 2 else "FAIL",
            "criteria_id": turns[n % len(turns)]["criteria"][0]["id"],
        }
        for n in range(10)
    ]
    calibrate = f"{v1}/scenarios/calibrate?agent_id={agent_id}"
    for _ in range(SCENARIOS):  # a listing's page of them
        calibration = api.post(calibrate, json={"examples": examples}, headers=h)
        if calibration.status_code not in (200, 202):
            raise RuntimeError(f"calibrate answered {calibration.status_code}: {calibration.text}")
        ids.setdefault("calibration_id", calibration.json()["id"])
    wait_for(
        lambda: get("/scenarios/calibrations")["calibrations"],
        lambda page: all(c["status"] in ("completed", "failed") for c in page),
        "the calibrations",
    )
    trigger = {
        "name": "nightly",
        "trigger_type": "scheduled",
        "agent_id": agent_id,
        "message": "Hello?",
        "cron_expression": "0 3 * * *",
        "timezone": "Europe/Amsterdam",
    }
    ids["trigger_id"] = ok(api.post(f"{v1}/triggers/", json=trigger, headers=h))["id"]
    # A listing's page of scheduled triggers, each on a schedule of its own.
    zones = ("Europe/Amsterdam", "America/New_York", "Asia/Tokyo", "UTC")
    for n in range(1, SCENARIOS):
        other = {**trigger, "name": f"suite {n}", "timezone": zones[n % len(zones)]}
        other["cron_expression"] = f"{n} {n % 24} * * {n % 7}"
        ok(api.post(f"{v1}/triggers/", json=other, headers=h))
    for _ in range(3):
        fired = api.post(f"{v1}/triggers/{ids['trigger_id']}/fire", json={}, headers=h)
        ids["execution_id"] = ok(fired, 202)["id"]
    endpoint = {"url": "https://127.0.0.1/hook", "events": ["batch.completed"]}
    ids["endpoint_id"] = ok(api.post(f"{v1}/webhook-endpoints", json=endpoint, headers=h))["id"]
    ids["a"], ids["b"] = batch_id, changed  # the query of compareBatchRuns
    fill_pages(spar, ids)
    return ids


def fill_pages(spar: Stack, ids: dict[str, str]) -> None:
    """Enough more of what each listing lists for a page of :data:`SCENARIOS` (a listing of
    one row costs less than its users' pages do): credentials, agents, allowed domains
    and providers using the seeded credential (its usage), platform tokens, roles, webhook
    endpoints, collections, documents in the seeded collection, a trigger's executions."""
    api, h, v1 = spar.http, spar.headers, f"/v1/orgs/{spar.org_id}"

    def post(path: str, body: dict[str, Any], status: int = 201) -> Any:
        return ok(api.post(v1 + path, json=body, headers=h), status)

    for n in range(1, SCENARIOS):
        key = f"KEY_{n}"
        ok(api.put(f"{v1}/credentials/{key}", json={"value": f"value {n}"}, headers=h))
        post(
            "/agents",
            {"name": f"agent {n}", "kind": "http", "endpoint_url": f"https://a{n}.test/chat"},
        )
        header = {"Authorization": f"Bearer {{{{credentials.{ids['key']}}}}}"}
        post("/allowed-domains/", {"domain": f"a{n}.test", "headers": header})
        post("/platform-tokens/", {"name": f"reader {n}", "permissions": ["scenarios:read"]})
        post("/roles", {"name": f"role {n}", "permissions": ["scenarios:read"]})
        hook = {"url": f"https://hooks{n}.test/spar", "events": ["batch.completed"]}
        post("/webhook-endpoints", hook)
        post("/knowledge/collections", {"name": f"collection {n}"})
        document = {
            "collectionId": ids["collection_id"],
            "filename": f"policy {n}.md",
            "content": f"# Policy {n}\n\nWithin {n} days.\n",
        }
        post("/knowledge/documents/structured", document)
        post(f"/triggers/{ids['trigger_id']}/fire", {}, 202)
    for n in range(1, 5):
        provider = {
            "name": f"provider {n}",
            "provider": "openai_compatible",
            "base_url": f"https://llm{n}.test/v1",
            "default_model": "model-1",
            "credential_key": ids["key"],
        }
        post("/llm-providers", provider)


def reads(api: httpx.Client, ids: dict[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """``(operation path, URL)`` of each GET of the served OpenAPI document, its path
    parameters filled from ``ids``; and the paths skipped (one names what is not seeded)."""
    document = ok(api.get("/schema/openapi.json"), 200)
    found, skipped = [], []
    for path, operations in document["paths"].items():
        if "get" not in operations or any(part in path for part in SKIPPED):
            continue
        url = path
        for name in re.findall(r"{(\w+)}", path):
            if name not in ids:
                skipped.append(path)
                break
            url = url.replace("{" + name + "}", ids[name])
        else:
            required = [
                p["name"]
                for p in operations["get"].get("parameters", [])
                if p.get("in") == "query" and p.get("required")
            ]
            if required:
                url += "?" + "&".join(f"{name}={ids[name]}" for name in required)
            found.append((path, url))
    return found, skipped


def measure(
    servers: list[tuple[httpx.Client, int]], url: str, headers: dict[str, str], count: int
) -> tuple[list[float], float, int]:
    """Server CPU per request (ms) of each of ``servers`` (a client and the server's pid),
    the first one's wall time per request (ms) and the body's size: ``count`` requests each
    after :data:`WARMUP`, asked of the servers in turn, :data:`ROUNDS` rounds when there
    are two."""
    rounds = ROUNDS if len(servers) > 1 else 1
    size = 0
    for api, _ in servers:
        first = api.get(url, headers=headers)
        if first.status_code != 200:
            raise RuntimeError(f"{url} answered {first.status_code}: {first.text[:300]}")
        size = size or len(first.content)
        for _ in range(WARMUP):
            api.get(url, headers=headers)
    cpu, wall, asked = [0.0] * len(servers), 0.0, count // rounds * rounds
    for _ in range(rounds):
        for n, (api, pid) in enumerate(servers):
            started, began = cpu_seconds(pid), time.perf_counter()
            for _ in range(asked // rounds):
                api.get(url, headers=headers)
            cpu[n] += cpu_seconds(pid) - started
            if n == 0:
                wall += time.perf_counter() - began
    return [c / asked * 1000 for c in cpu], wall / asked * 1000, size


@contextlib.contextmanager
def baseline_server(spar: Stack, tree: str) -> Iterator[list[tuple[httpx.Client, int]]]:
    """``spar serve`` of the checkout ``tree`` on ``spar``'s database and Redis: its client
    and pid, in a list (none without a tree)."""
    if not tree:
        yield []
        return
    env = {
        "SPAR_DATABASE_URL": spar.database_url,
        "SPAR_SECRET_KEY": SECRET_KEY,
        "SPAR_LOG_LEVEL": "WARNING",
        "SPAR_EGRESS_ALLOW_PRIVATE": "true",
        "PYTHONPATH": str(Path(tree).resolve()),  # its packages before the installed ones
        **({"SPAR_REDIS_URL": spar.redis_url} if spar.redis_url else {}),
    }
    with (
        spar_serve(env, cwd=spar.logs, public_url=True) as (base, process),
        httpx.Client(base_url=base, timeout=60) as api,
    ):
        yield [(api, process.pid)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="measured requests per read")
    parser.add_argument("--only", default="", help="only the paths containing this")
    parser.add_argument(
        "--baseline-tree", default="", help="another checkout, measured alongside this one"
    )
    args = parser.parse_args(argv)
    unwind_on_sigterm()
    print(
        f"Every authenticated read: server CPU per request, {args.requests} requests one after "
        f"another per read; {os.cpu_count()} CPUs",
        flush=True,
    )
    worker = ["--processes", "1", "--threads", "8"]
    with (
        loopback_fakes() as fakes,
        spar_stack(
            database_url("reads"),
            env={"SPAR_EGRESS_ALLOW_PRIVATE": "true"},  # the fakes, on loopback
            workers=1,
            worker_args=worker,
        ) as spar,
    ):
        fakes.set_latency(0, 0)
        ids = seed(spar, fakes)
        found, skipped = reads(spar.http, ids)
        with baseline_server(spar, args.baseline_tree) as baseline:
            servers = [(spar.http, spar.serve_pid), *baseline]
            rows = [
                (path, *measure(servers, url, spar.headers, args.requests))
                for path, url in found
                if args.only in path
            ]
    against = f" {'baseline':>9} {'ratio':>6}" if args.baseline_tree else ""
    print(f"\n{'server CPU ms':>13}{against} {'wall ms':>8} {'bytes':>7}  GET")
    for path, cpu, wall, size in sorted(rows, key=lambda row: -row[1][0]):
        flag = "" if cpu[0] <= TARGET_MS else f"   over the target ({TARGET_MS} ms)"
        beside = f" {cpu[1]:9.2f} {cpu[0] / cpu[1]:6.3f}" if len(cpu) > 1 else ""
        print(f"{cpu[0]:13.2f}{beside} {wall:8.2f} {size:7d}  {path}{flag}")
    over = sum(cpu[0] > TARGET_MS for _, cpu, _, _ in rows)
    print(f"\n{len(rows)} reads, {over} over {TARGET_MS} ms of server CPU")
    for path in skipped:
        print(f"skipped (names what the seed lacks): {path}")


if __name__ == "__main__":
    main()
