"""A newcomer's first command: ``spar dev`` on the embedded SQLite default, no services."""

import json
import time

import httpx
import pytest

from tests.support.fakes import FakeAgent, FakeOpenAI
from tests.support.processes import free_port, spar_process

pytestmark = pytest.mark.slow


def test_spar_dev_migrates_sqlite_and_serves_the_api(tmp_path):
    port = free_port()
    env = {
        # Unset the suite's PostgreSQL and Redis: spar dev must need nothing else.
        "SPAR_DATABASE_URL": "",
        "SPAR_REDIS_URL": "",
        "SPAR_SECRET_KEY": "",
    }
    base = f"http://127.0.0.1:{port}"
    with spar_process(
        ["dev", "--port", str(port)], env, cwd=tmp_path, health_url=f"{base}/health/ready"
    ):
        assert (tmp_path / "spar-dev.db").exists()
        secret = tmp_path / ".spar-dev-secret"
        assert secret.exists() and secret.stat().st_mode & 0o077 == 0
        with httpx.Client(base_url=base, timeout=10) as http:
            registered = http.post(
                "/v1/auth/register",
                json={
                    "email": "newcomer@example.com",
                    "password": "first-password",
                    "first_name": "New",
                    "last_name": "Comer",
                },
            )
            assert registered.status_code == 201, registered.text
            headers = {"Authorization": f"Bearer {registered.json()['access_token']}"}
            org = http.post("/v1/organizations", json={"name": "Dev org"}, headers=headers)
            assert org.status_code == 201, org.text
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
        env={"PATH": "", "SPAR_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/x.db"},
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
            ["dev", "--port", str(port)], env, cwd=tmp_path, health_url=f"{base}/health/ready"
        ),
        httpx.Client(base_url=base, timeout=10) as http,
    ):
        token = http.post(
            "/v1/auth/register",
            json={
                "email": "dev@example.com",
                "password": "dev-password",
                "first_name": "D",
                "last_name": "V",
            },
        ).json()["access_token"]
        h = {"Authorization": f"Bearer {token}"}
        org = http.post("/v1/organizations", json={"name": "Dev"}, headers=h).json()["id"]
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
    assert state["status"] == "passed", state
    assert state["turn_results"][0]["response_content"] == "Hello, Hi"
    # The judge got the decrypted credential, through the egress policy.
    assert judge.requests[0].header("authorization") == "Bearer sk-dev"
