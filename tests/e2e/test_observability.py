"""Real processes: ``spar serve --workers 2``, ``spar worker --processes 2 --metrics-port``
and ``spar scheduler --metrics-port``.

One run started with an ``X-Request-ID``: the id comes back on the response, is on the
API's access log line and on the worker's log line for that run's message; the API's
``/metrics`` and the worker's metrics port each add up their processes' metrics.  Each of
the three exports its own families only, under a Content-Type Prometheus reads, with the
counters behind the documented alerts there at 0 before they first move.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.parser import text_string_to_metric_families

from tests.support import metrics as families
from tests.support.factories import tenant
from tests.support.fakes import FakeAgent, FakeOpenAI
from tests.support.processes import free_port, spar_process, spar_serve, suite_env
from tests.support.scenario_setup import criterion, outbound_setup, turn, wait_for_run

pytestmark = pytest.mark.slow

VERDICT = json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "ok"})


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def json_lines(path: Path) -> list[dict]:
    entries = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            entries.append(json.loads(line))  # every line Spar writes is one JSON object
    return entries


def logs(directory: Path) -> tuple[Path, Path]:
    """The API's and the worker's log files (see ``spar_process``)."""
    (api,) = directory.glob("spar-serve-*.log")
    (worker,) = directory.glob("spar-worker-*.log")
    return api, worker


def wait_for_metric(url: str, name: str, labels: dict[str, str], within: float = 15.0) -> float:
    deadline = time.monotonic() + within
    while True:
        try:
            found = samples(httpx.get(url, timeout=2.0).text)
        except httpx.HTTPError:
            found = []
        total = sum(v for n, ls, v in found if n == name and labels.items() <= ls.items())
        if total > 0 or time.monotonic() > deadline:
            return total
        time.sleep(0.2)


async def test_a_request_id_follows_a_run_from_the_api_into_the_worker(
    client, database_url, settings, tmp_path: Path
) -> None:
    env = suite_env(database_url, settings, SPAR_LOG_LEVEL="INFO", SPAR_LOG_FORMAT="json")
    metrics_port, scheduler_port = free_port(), free_port()
    rid = f"e2e-{uuid.uuid4().hex}"
    work = ["worker", "--processes", "2", "--threads", "2", "--queues", "runs"]
    work += ["--metrics-port", str(metrics_port)]
    with (
        FakeAgent(reply=lambda body: f"Hello! {body['message']}") as agent,
        FakeOpenAI(reply=VERDICT) as judge,
        spar_serve(env, cwd=tmp_path, args=("--workers", "2")) as (api_url, _),
        spar_process(work, env, cwd=tmp_path),
        spar_process(["scheduler", "--metrics-port", str(scheduler_port)], env, cwd=tmp_path),
    ):
        async with httpx.AsyncClient(base_url=api_url, timeout=10.0) as api:
            t = await tenant(api)  # type: ignore[arg-type]
            setup = await outbound_setup(api, t, agent.url, judge.url)  # type: ignore[arg-type]
            scenario = await api.post(
                f"/v1/orgs/{t.id}/scenarios",
                json={"name": "greet", "turns": [turn("Hi", criterion("Is it polite?"))]},
                headers=t.owner.headers,
            )
            assert scenario.status_code == 201, scenario.text
            started = await api.post(
                f"/v1/orgs/{t.id}/scenarios/{scenario.json()['id']}/run",
                json={"agent_id": setup.agent_id},
                headers={**t.owner.headers, "X-Request-ID": rid},
            )
            assert started.status_code == 201, started.text
            assert started.headers["x-request-id"] == rid
            run = await wait_for_run(api, t, started.json()["id"])  # type: ignore[arg-type]
            assert run["status"] == "passed", run
            api_metrics = samples((await api.get("/metrics")).text)
            api_scrape = families.scrape(f"{api_url}/metrics")

        worker_url = f"http://127.0.0.1:{metrics_port}/metrics"
        run_labels = {"queue": "runs", "actor": "run_scenario", "outcome": "succeeded"}
        assert wait_for_metric(worker_url, "spar_actor_messages_total", run_labels) >= 1
        assert wait_for_metric(worker_url, "spar_runs_finished_total", {"status": "passed"}) >= 1
        agent_calls = {"target": "agent", "kind": "http", "provider": "spar"}
        assert wait_for_metric(worker_url, "spar_outbound_call_duration_seconds_count", agent_calls)
        judge_calls = {"target": "judge", "kind": "llm", "provider": "openai_compatible"}
        assert wait_for_metric(worker_url, "spar_outbound_call_duration_seconds_count", judge_calls)
        worker_scrape = families.scrape(worker_url)
        scheduler_scrape = families.scrape(f"http://127.0.0.1:{scheduler_port}/metrics")

    # Each process its own families, as a scraper reads them.  The API's Content-Type is
    # prometheus_client's own; the others are prometheus_client's server answering a
    # client that asks for no format in particular.
    assert api_scrape.content_type == CONTENT_TYPE_LATEST
    assert families.spar_families(api_scrape) <= families.API
    assert worker_scrape.content_type == CONTENT_TYPE_PLAIN_0_0_4
    assert families.spar_families(worker_scrape) <= families.WORKER
    assert scheduler_scrape.content_type == CONTENT_TYPE_PLAIN_0_0_4
    assert families.spar_families(scheduler_scrape) == families.SCHEDULER
    # The alerts' counters, at 0 before their first increment: per actor of the queue
    # the worker takes; every unit it plays; every outcome of a scheduled slot.
    dead = "spar_actor_messages_dead_lettered_total"
    assert worker_scrape.value(dead, queue="runs", actor="run_scenario") == 0
    assert worker_scrape.value(dead, queue="batches", actor="dispatch_batch") is None
    assert worker_scrape.value("spar_work_given_up_total", kind="run") == 0
    assert worker_scrape.value("spar_runs_finished_total", status="error") == 0
    assert scheduler_scrape.value("spar_trigger_slots_total", outcome="missed") == 0
    assert scheduler_scrape.value("spar_sweeper_resent_total", kind="calibrations") == 0

    # Both API processes' requests are in one scrape: every one of this test's requests.
    run_route = "/v1/orgs/{org_id}/scenarios/{scenario_id}/run"
    assert any(
        n == "spar_http_requests_total"
        and ls == {"method": "POST", "route": run_route, "status": "201"}
        and v == 1
        for n, ls, v in api_metrics
    )
    assert not any(t.id in str(ls) for _, ls, _ in api_metrics)

    api_log, worker_log = logs(tmp_path)
    access = [e for e in json_lines(api_log) if e.get("request_id") == rid]
    assert [(e["logger"], e["route"], e["status"]) for e in access] == [
        ("spar.access", run_route, 201)
    ]
    traced = [e for e in json_lines(worker_log) if e.get("request_id") == rid]
    assert ("run_scenario", "succeeded") in {(e.get("actor"), e.get("outcome")) for e in traced}
    assert t.owner.token not in api_log.read_text() + worker_log.read_text()
