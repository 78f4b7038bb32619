"""Property-based fuzzing of the API's own OpenAPI schema, with every schemathesis check.

A real ``spar serve`` process on the test database; schemathesis generates valid and
invalid requests for every operation, authenticated as an organization's owner with
``org_id`` pinned to that organization so the fuzzing reaches past the tenant check.
Beyond "no 5xx": answers match the documented statuses, media types, headers and
schemas; OPTIONS ``Allow`` lists every method; invalid input is refused; public
operations need no token.  The run is bounded in time (``--max-time``).
"""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.processes import free_port, spar_process

pytestmark = pytest.mark.slow

CONFIG = """
headers = { Authorization = "Bearer ${SPAR_FUZZ_TOKEN}" }

[parameters]
"path.org_id" = "${SPAR_FUZZ_ORG_ID}"

# Rules a JSON Schema cannot state (IANA zone names, host names, references that must
# exist, fields required together, expiry in the future) answer 422 to schema-valid bodies;
# the fuzzer's wrong passwords soon meet the login throttle (429).
[checks.positive_data_acceptance]
expected-statuses = ["2XX", "401", "403", "404", "409", "422", "429"]
"""


def test_no_operation_answers_a_server_error(database_url, db, tmp_path: Path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "SPAR_DATABASE_URL": database_url,
        "SPAR_SECRET_KEY": "fuzz-secret-key",
        "SPAR_LOG_LEVEL": "WARNING",
    }
    with spar_process(
        ["serve", "--host", "127.0.0.1", "--port", str(port)],
        env,
        cwd=tmp_path,
        health_url=f"{base}/health/ready",
    ):
        with httpx.Client(base_url=base, timeout=10) as http:
            registered = http.post(
                "/v1/auth/register",
                json={
                    "email": "fuzz-owner@example.com",
                    "password": "fuzzing-password",
                    "first_name": "Fuzz",
                    "last_name": "Owner",
                },
            )
            assert registered.status_code == 201, registered.text
            user = registered.json()
            headers = {"Authorization": f"Bearer {user['access_token']}"}
            created = http.post("/v1/organizations", json={"name": "Fuzz"}, headers=headers)
            assert created.status_code == 201, created.text
            org = created.json()

        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "--config-file",
                str(config),
                "run",
                f"{base}/schema/openapi.json",
                "--checks",
                "all",
                # A bound for the whole run: every operation, every check, a few examples
                # each, so the suite stays fast (the seed makes it repeatable).
                "--max-time",
                "240",
                "--max-examples",
                "8",
                "--seed",
                "20261122",
                # One worker: hypothesis' lambda-source cache is not thread-safe
                # ("AST constructor recursion depth mismatch" under two).
                "--workers",
                "1",
                "--request-timeout",
                "30",
                # Logging out or deleting the org would end the session under the fuzzer;
                # both have their own tests.
                "--exclude-operation-id",
                "logout",
                "--exclude-operation-id",
                "deleteOrganization",
                # DELETE on a platform token revokes it, and the token stays readable with
                # is_active false (its own tests): use_after_free would call that a failure.
                "--exclude-operation-id",
                "revokePlatformToken",
                "--no-color",
            ],
            env={
                **os.environ,
                "SPAR_FUZZ_TOKEN": user["access_token"],
                "SPAR_FUZZ_ORG_ID": org["id"],
            },
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Server error" not in output
    assert " passed" in output
