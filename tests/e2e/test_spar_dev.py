"""A newcomer's first command: ``spar dev`` on the embedded SQLite default, no services."""

import httpx
import pytest

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
