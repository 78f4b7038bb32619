"""A newcomer's first command: ``spar dev`` on its embedded PostgreSQL, no services."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from shared.db.embedded import running_postmasters
from tests.support import metrics as families
from tests.support.fakes import FakeAgent, FakeOpenAI
from tests.support.processes import free_port, owner_over_http, spar_executable, spar_process

pytestmark = pytest.mark.slow

# Unset the suite's PostgreSQL and Redis: spar dev must need nothing else.
DEV_ENV = {"SPAR_DATABASE_URL": "", "SPAR_REDIS_URL": "", "SPAR_SECRET_KEY": ""}
COLD_START_S = 60.0  # initdb on a busy machine


def test_spar_dev_migrates_its_embedded_postgres_and_serves_the_api(tmp_path):
    port = free_port()
    env = {
        # Unset the suite's PostgreSQL and Redis: spar dev must need nothing else.
        "SPAR_DATABASE_URL": "",
        "SPAR_REDIS_URL": "",
        "SPAR_SECRET_KEY": "",
    }
    base = f"http://127.0.0.1:{port}"
    with spar_process(
        ["dev", "--port", str(port)],
        env,
        cwd=tmp_path,
        health_url=f"{base}/health/ready",
        timeout=COLD_START_S,
    ):
        assert (tmp_path / ".spar-dev" / "pg" / "PG_VERSION").exists()
        secret = tmp_path / ".spar-dev" / "secret"
        assert secret.exists() and secret.stat().st_mode & 0o077 == 0
        with httpx.Client(base_url=base, timeout=10) as http:
            headers, _ = owner_over_http(http, "newcomer@example.com", "first-password", "Dev org")
            me = http.get("/v1/auth/me", headers=headers).json()
            assert [o["role"]["name"] for o in me["organizations"]] == ["OWNER"]
            login = http.post(
                "/v1/auth/login",
                json={"email": "newcomer@example.com", "password": "first-password"},
            )
            assert login.status_code == 200
            assert http.get("/schema/openapi.json").status_code == 200


def test_spar_serve_refuses_to_start_without_a_secret_key(tmp_path):
    import subprocess

    from tests.support.processes import spar_executable

    result = subprocess.run(
        [spar_executable(), "serve", "--port", str(free_port())],
        env={"PATH": "", "SPAR_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/x"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "SPAR_SECRET_KEY" in result.stderr


def test_spar_dev_runs_a_scenario_with_its_embedded_worker(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"SPAR_DATABASE_URL": "", "SPAR_REDIS_URL": "", "SPAR_SECRET_KEY": ""}
    verdict = json.dumps({"verdict": "PASS", "critique": "polite", "evidence": "Hello"})
    with (
        FakeAgent(reply=lambda body: f"Hello, {body['message']}") as agent,
        FakeOpenAI(reply=verdict) as judge,
        spar_process(
            ["dev", "--port", str(port)],
            env,
            cwd=tmp_path,
            health_url=f"{base}/health/ready",
            timeout=COLD_START_S,
        ),
        httpx.Client(base_url=base, timeout=10) as http,
    ):
        h, made = owner_over_http(http, "dev@example.com", "dev-password", "Dev")
        org = made["id"]
        assert (
            http.put(
                f"/v1/orgs/{org}/credentials/judge_key", json={"value": "sk-dev"}, headers=h
            ).status_code
            == 201
        )
        http.post(f"/v1/orgs/{org}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=h)
        http.post(
            f"/v1/orgs/{org}/llm-providers",
            json={
                "name": "judge",
                "provider": "openai_compatible",
                "base_url": judge.url,
                "default_model": "judge-1",
                "credential_key": "judge_key",
                "is_default_judge": True,
            },
            headers=h,
        )
        agent_id = http.post(
            f"/v1/orgs/{org}/agents",
            json={"name": "bot", "kind": "http", "endpoint_url": agent.url},
            headers=h,
        ).json()["id"]
        scenario_id = http.post(
            f"/v1/orgs/{org}/scenarios",
            json={
                "name": "hello",
                "turns": [{"user_message": "Hi", "criteria": [{"question": "Polite?"}]}],
            },
            headers=h,
        ).json()["id"]
        run = http.post(
            f"/v1/orgs/{org}/scenarios/{scenario_id}/run", json={"agent_id": agent_id}, headers=h
        )
        assert run.status_code == 201, run.text
        deadline = time.monotonic() + 20
        while True:
            state = http.get(f"/v1/orgs/{org}/scenarios/runs/{run.json()['id']}", headers=h).json()
            if state["status"] in {"passed", "failed", "error"} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # A trigger fired by hand runs on the same embedded worker.
        trigger = http.post(
            f"/v1/orgs/{org}/triggers/",
            json={
                "name": "morning",
                "trigger_type": "scheduled",
                "agent_id": agent_id,
                "message": "Good morning from {{ trigger.name }}",
                "cron_expression": "0 9 * * 1-5",
                "timezone": "Europe/Amsterdam",
            },
            headers=h,
        )
        assert trigger.status_code == 201, trigger.text
        # No SPAR_PUBLIC_BASE_URL: webhook URLs are on the address spar dev listens on.
        webhook_url = trigger.json()["webhook_url"]
        assert webhook_url == f"{base}/v1/hooks/triggers/{trigger.json()['id']}"
        executions = f"/v1/orgs/{org}/triggers/{trigger.json()['id']}/executions"
        fired = http.post(f"/v1/orgs/{org}/triggers/{trigger.json()['id']}/fire", headers=h)
        assert fired.status_code == 202, fired.text
        deadline = time.monotonic() + 20
        while True:
            execution = http.get(f"{executions}/{fired.json()['id']}", headers=h).json()
            if execution["status"] in {"succeeded", "failed"} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        scraped = families.scrape(f"{base}/metrics")
    assert state["status"] == "passed", state
    assert state["turn_results"][0]["response_content"] == "Hello, Hi"
    assert execution["status"] == "succeeded", execution
    assert execution["response"] == "Hello, Good morning from morning"
    # The judge got the decrypted credential, through the egress policy.
    assert judge.requests[0].header("authorization") == "Bearer sk-dev"
    # Each log line written once, also after the workers' modules configured logging.
    (log,) = tmp_path.glob("spar-dev-*.log")
    lines = log.read_text().splitlines()
    assert sum("Application startup complete." in line for line in lines) == 1, lines
    requests = [line for line in lines if " spar.access " in line]
    assert requests and len(requests) == len(set(requests)), requests

    # /metrics: what production's API, workers and scheduler export between them, under
    # prometheus_client's Content-Type, the alerts' counters at 0 before they first move.
    assert scraped.content_type == CONTENT_TYPE_LATEST
    assert families.spar_families(scraped) == families.API | families.WORKER | families.SCHEDULER
    assert scraped.value("spar_runs_finished_total", status="passed") == 1
    assert scraped.value("spar_runs_finished_total", status="error") == 0
    dead = "spar_actor_messages_dead_lettered_total"
    for queue, actor in (("runs", "run_scenario"), ("calibration", "calibrate")):
        assert scraped.value(dead, queue=queue, actor=actor) == 0
    assert scraped.value("spar_trigger_slots_total", outcome="missed") == 0
    assert scraped.value("spar_scheduler_leading") is not None


@pytest.mark.parametrize("command", ["serve", "migrate", "worker", "scheduler"])
def test_other_commands_name_the_database_variable_when_it_is_unset(tmp_path, command):
    result = subprocess.run(
        [spar_executable(), command],
        env={"PATH": "", "SPAR_SECRET_KEY": "k", "SPAR_REDIS_URL": "redis://127.0.0.1:1/0"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "SPAR_DATABASE_URL must be set" in result.stderr
    assert not (tmp_path / ".spar-dev").exists()


def expected_status(n: int) -> str:
    return ("passed", "passed", "failed")[n % 3]


def dev_scenario(n: int) -> dict[str, Any]:
    """Two turns with deterministic checks: the second fails for ``failed`` scenarios."""
    second = f"second {n}"
    check = "never-said" if expected_status(n) == "failed" else "second"
    return {
        "name": f"dev {n}",
        "tags": ["dev"],
        "turns": [
            {
                "user_message": f"first {n}",
                "criteria": [{"question": "first", "criteria_type": "contains"}],
            },
            {
                "user_message": second,
                "criteria": [{"question": check, "criteria_type": "contains"}],
            },
        ],
    }


def pgdata(cwd: Path) -> Path:
    return (cwd / ".spar-dev" / "pg").resolve()


def wait_stopped(pg: Path, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := running_postmasters(pg)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def gone(path: Path, timeout: float = 10.0) -> bool:
    """Whether ``path`` is gone, or goes within ``timeout``: a postmaster that shuts down
    cleanly removes its ``postmaster.pid`` as it exits, and psutil can stop listing a
    process that is still exiting (seen once in CI on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def test_spar_dev_runs_a_batch_and_keeps_its_data_across_a_restart(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    credentials = {"email": "dev@example.com", "password": "dev-password"}
    scenarios = 6
    with (
        FakeAgent(reply=lambda body: f"Echo: {body['message']}") as agent,
        spar_process(
            ["dev", "--port", str(port)],
            DEV_ENV,
            cwd=tmp_path,
            health_url=f"{base}/health/ready",
            timeout=COLD_START_S,
        ) as dev,
        httpx.Client(base_url=base, timeout=10) as http,
    ):
        assert running_postmasters(pgdata(tmp_path))
        registered = http.post(
            "/v1/auth/register", json={**credentials, "first_name": "D", "last_name": "V"}
        )
        assert registered.status_code == 201, registered.text
        h = {"Authorization": f"Bearer {registered.json()['access_token']}"}
        org = http.post("/v1/organizations", json={"name": "Dev"}, headers=h).json()["id"]
        allowed = http.post(
            f"/v1/orgs/{org}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=h
        )
        assert allowed.status_code == 201, allowed.text
        created = http.post(
            f"/v1/orgs/{org}/agents",
            json={"name": "bot", "kind": "http", "endpoint_url": agent.url},
            headers=h,
        )
        assert created.status_code == 201, created.text
        for n in range(scenarios):
            response = http.post(f"/v1/orgs/{org}/scenarios", json=dev_scenario(n), headers=h)
            assert response.status_code == 201, response.text
        path = f"/v1/orgs/{org}/scenarios/batch-runs"
        batch = http.post(
            f"{path}/",
            json={"agent_id": created.json()["id"], "tags": ["dev"], "max_concurrency": 2},
            headers=h,
        )
        assert batch.status_code == 201, batch.text
        assert batch.json()["total_scenarios"] == scenarios
        batch_id = batch.json()["id"]
        deadline = time.monotonic() + 30
        while (state := http.get(f"{path}/{batch_id}", headers=h).json())["status"] != "completed":
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        counters = {
            key: state[key]
            for key in (
                "total_scenarios",
                "completed_scenarios",
                "passed_scenarios",
                "failed_scenarios",
                "error_scenarios",
            )
        }
        assert counters == {
            "total_scenarios": 6,
            "completed_scenarios": 6,
            "passed_scenarios": 4,
            "failed_scenarios": 2,
            "error_scenarios": 0,
        }
        assert len(agent.requests) == 2 * scenarios

    # Stopped by SIGTERM (spar_process): a clean exit that took the server with it.
    assert dev.returncode == 128 + signal.SIGTERM
    assert wait_stopped(pgdata(tmp_path)) == []
    assert gone(pgdata(tmp_path) / "postmaster.pid")

    with (
        spar_process(
            ["dev", "--port", str(port)],
            DEV_ENV,
            cwd=tmp_path,
            health_url=f"{base}/health/ready",
        ),
        httpx.Client(base_url=base, timeout=10) as http,
    ):
        login = http.post("/v1/auth/login", json=credentials)
        assert login.status_code == 200, login.text
        h = {"Authorization": f"Bearer {login.json()['access_token']}"}
        kept = http.get(f"{path}/{batch_id}", headers=h)
        assert kept.status_code == 200, kept.text
        assert kept.json()["status"] == "completed"
        assert {key: kept.json()[key] for key in counters} == counters
    assert wait_stopped(pgdata(tmp_path)) == []


def test_spar_dev_recovers_from_what_a_kill_9_left_behind(tmp_path):
    """A killed spar dev leaves its pid in ``.handle_pids.json`` and the server running;
    later, ``postmaster.pid`` may name a pid the system gave to another process."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pg = pgdata(tmp_path)

    def dev() -> Any:
        return spar_process(
            ["dev", "--port", str(port)],
            DEV_ENV,
            cwd=tmp_path,
            health_url=f"{base}/health/ready",
            timeout=COLD_START_S,
        )

    with dev() as killed:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert json.loads((pg / ".handle_pids.json").read_text()) == [killed.pid]
    (orphan,) = running_postmasters(pg)  # the server outlived it
    pid_file = (pg / "postmaster.pid").read_text()

    # The next run takes the orphan over and, being its last holder, stops it.
    with dev(), httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/health/ready").status_code == 200
        assert running_postmasters(pg) == [orphan]
    assert wait_stopped(pg) == []

    # A postmaster.pid naming a live stranger: neither trusted nor killed.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lines = pid_file.split("\n")
        (pg / "postmaster.pid").write_text("\n".join([str(stranger.pid), *lines[1:]]))
        with dev(), httpx.Client(base_url=base, timeout=10) as http:
            ready = http.get("/health/ready")
            assert ready.status_code == 200, ready.text
            assert len(running_postmasters(pg)) == 1
        assert wait_stopped(pg) == []
        assert psutil.pid_exists(stranger.pid) and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
