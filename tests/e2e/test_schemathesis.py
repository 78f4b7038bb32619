"""Property-based fuzzing of the API's own OpenAPI schema, with every schemathesis check.

A real ``spar serve`` process on the test database; schemathesis generates valid and
invalid requests for every operation, authenticated as an organization's owner with
``org_id`` pinned to that organization so the fuzzing reaches past the tenant check.
Beyond "no 5xx": answers match the documented statuses, media types, headers and
schemas; OPTIONS ``Allow`` lists every method; invalid input is refused; public
operations need no token.

The run is bounded by case counts, not by time: in schemathesis 4 ``--max-time`` is a
budget that fuzzing and stateful testing repeat until spent (a 240 s bound took 240 s),
so it is not passed.  All four phases run once: examples (nothing to do while the schema
carries no examples, but free), coverage (every documented boundary and every
undocumented method, whatever ``--max-examples`` says), fuzzing (``--max-examples`` cases
per operation) and stateful (``--max-examples`` scenarios of at most ``max-steps`` calls).
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import owner_over_http, spar_serve

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

# Short scenarios: links are followed, a scenario ends after a few calls.
[phases.stateful]
max-steps = 5
"""

# Every input string of the schema carries ``^[^\x00]*$`` (no NUL: what PostgreSQL text
# cannot hold; the document leaves out the lone surrogates the server also refuses, which
# no request can carry and no client's regex engine compiles).  The fuzzer gets the schema
# without that bare NUL pattern: kept, it makes the coverage phase build boundary strings of
# up to 100,001 characters against a regex, minutes of CPU.  (A surrogate range, should a
# pattern name one again, is left out too: Rust's regex engine cannot name surrogates.)
# NUL refusal has its own tests (tests/integration/test_bad_input.py).
SURROGATES = "\\ud800-\\udfff"
NUL_ONLY = "^[^\\x00]*$"


def schema_for_schemathesis(document: Any) -> tuple[Any, int]:
    """The document with the surrogate range left out of every pattern (a pattern left
    refusing NUL only is dropped), and how many patterns changed."""
    if isinstance(document, list):
        pairs = [schema_for_schemathesis(item) for item in document]
        return [item for item, _ in pairs], sum(count for _, count in pairs)
    if not isinstance(document, dict):
        return document, 0
    result, changed = {}, 0
    for key, value in document.items():
        if (
            key == "pattern"
            and isinstance(value, str)
            and (SURROGATES in value or value == NUL_ONLY)
        ):
            changed += 1
            if value.replace(SURROGATES, "") != NUL_ONLY:
                result[key] = value.replace(SURROGATES, "")
        else:
            result[key], count = schema_for_schemathesis(value)
            changed += count
    return result, changed


def test_no_operation_answers_a_server_error(database_url, db, tmp_path: Path):
    env = {
        "SPAR_DATABASE_URL": database_url,
        "SPAR_SECRET_KEY": "fuzz-secret-key",
        "SPAR_LOG_LEVEL": "WARNING",
    }
    with spar_serve(env, cwd=tmp_path, health="/health/ready") as (base, _):
        with httpx.Client(base_url=base, timeout=10) as http:
            headers, org = owner_over_http(
                http, "fuzz-owner@example.com", "fuzzing-password", "Fuzz"
            )
            served = http.get("/schema/openapi.json")
            assert served.status_code == 200, served.text

        schema = tmp_path / "openapi.json"
        document, changed = schema_for_schemathesis(served.json())
        assert changed, "no pattern names the surrogate range any more: drop the rewrite"
        schema.write_text(json.dumps(document))

        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "--config-file",
                str(config),
                "run",
                str(schema),
                "--url",
                base,
                "--checks",
                "all",
                # Every operation, every check, a few generated cases each, so the suite
                # stays fast (the seed makes it repeatable).
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
                "SPAR_FUZZ_TOKEN": headers["Authorization"].removeprefix("Bearer "),
                "SPAR_FUZZ_ORG_ID": org["id"],
            },
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    output = result.stdout + result.stderr
    # The whole report, since pytest may cut a long assertion message.
    log = tmp_path / "schemathesis.log"
    log.write_text(output)
    assert result.returncode == 0, f"full report in {log}\n{output}"
    assert "Server error" not in output
    assert " passed" in output
