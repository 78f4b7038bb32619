"""The webhook sender's lines in docs/triggers.md (Python and curl), run as a reader would
run them, against a real ``spar serve``: each must start one execution."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import owner_over_http, spar_serve

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "triggers.md"


def code_block(language: str) -> str:
    (block,) = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    return block


def test_the_documented_python_and_curl_senders_start_executions(
    client, database_url, settings, tmp_path: Path
) -> None:
    env = {
        "SPAR_DATABASE_URL": database_url,
        "SPAR_REDIS_URL": settings.redis_url,
        "SPAR_SECRET_KEY": settings.secret_key or "",
    }
    with (
        spar_serve(env, cwd=tmp_path, public_url=True) as (base, _),
        httpx.Client(base_url=base, timeout=30) as http,
    ):
        h, org = owner_over_http(http, "sender@example.com", "sender-password", "hooks")
        v1 = f"/v1/orgs/{org['id']}"
        http.post(f"{v1}/allowed-domains/", json={"domain": "127.0.0.1"}, headers=h)
        agent = http.post(
            f"{v1}/agents",
            json={"name": "a", "kind": "http", "endpoint_url": "http://127.0.0.1:9/chat"},
            headers=h,
        ).json()
        trigger = http.post(
            f"{v1}/triggers/",
            json={
                "name": "releases",
                "trigger_type": "webhook",
                "agent_id": agent["id"],
                "message": "Release {{ payload.version }}",
            },
            headers=h,
        ).json()
        sender_env = {
            "SPAR_WEBHOOK_URL": trigger["webhook_url"],
            "SPAR_WEBHOOK_SECRET": trigger["webhook_secret"],
            "PATH": "/usr/bin:/bin",
        }
        assert trigger["webhook_url"].startswith(base)

        python = subprocess.run(
            [sys.executable, "-c", code_block("python")],
            env=sender_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert python.returncode == 0, python.stderr
        assert "execution_id" in python.stdout, python.stdout
        shell = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code_block("sh")],
            env=sender_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shell.returncode == 0, shell.stderr
        assert '"execution_id"' in shell.stdout, shell.stdout

        executions = http.get(f"{v1}/triggers/{trigger['id']}/executions", headers=h).json()
        assert executions["total"] == 2
        assert [e["payload"] for e in executions["executions"]] == [{"version": "v1.4.2"}] * 2
        assert {e["source"] for e in executions["executions"]} == {"webhook"}
