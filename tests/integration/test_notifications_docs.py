"""The verifying lines of docs/notifications.md (Python and shell), run as a reader would run
them against a delivery Spar really sent to a loopback receiver: each accepts it, and
refuses it tampered with."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from standardwebhooks import WebhookVerificationError

from shared.settings import Settings
from shared.triggers.executions import execute
from tests.support.factories import stub_broker, tenant
from tests.support.fakes import FakeAgent, FakeServer, Reply
from tests.support.notifications import create_endpoint, play_notifications
from tests.support.scenario_setup import outbound_setup
from tests.support.triggers import create, path, webhook

DOC = Path(__file__).resolve().parents[2] / "docs" / "notifications.md"


def python_block() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return block


def verifying_sh() -> str:
    text = DOC.read_text()
    after = text[text.index("<!-- spar-docs: verify a delivery -->") :]
    match = re.match(r"<!--[^>]*-->\n```sh\n(.*?)```", after, flags=re.S)
    assert match is not None, "the verifying block follows its marker"
    return match.group(1)


def run_sh(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", verifying_sh()], env=env, cwd=cwd, capture_output=True, text=True, timeout=30
    )


def run_python(
    secret: str, body: bytes, headers: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    """The Python verifier, run as written with the secret in its environment, on ``body``."""
    script = python_block() + (
        "\nimport json, sys\n"
        "print(json.dumps(verified(sys.stdin.buffer.read(), json.loads(sys.argv[1]))))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, json.dumps(headers)],
        input=body,
        env={"SPAR_WEBHOOK_SECRET": secret},
        capture_output=True,
        timeout=60,
    )


async def recorded_delivery(
    client: AsyncTestClient, app: Litestar, settings: Settings
) -> tuple[str, Any]:
    """A ``trigger.execution.failed`` delivery as the receiver got it, and its secret."""
    with FakeAgent() as agent, FakeServer(Reply(status=204)) as receiver:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        endpoint = await create_endpoint(client, t, receiver.url, "trigger.execution.failed")
        trigger = await create(client, t, webhook(setup.agent_id))
        fired = await client.post(
            path(t, trigger["id"], "fire"), json={"payload": {}}, headers=t.owner.headers
        )
        broker = stub_broker()
        await execute(app.state.database, settings, fired.json()["id"], broker=broker)
        await play_notifications(app, settings, broker)
        (request,) = receiver.requests
    return endpoint["secret"], request


async def test_the_documented_verifiers_accept_a_real_delivery_and_refuse_a_forged_one(
    client: AsyncTestClient, app: Litestar, settings: Settings, tmp_path: Path
) -> None:
    secret, request = await recorded_delivery(client, app, settings)
    headers = {
        "WEBHOOK_ID": request.header("webhook-id"),
        "WEBHOOK_TIMESTAMP": request.header("webhook-timestamp"),
        "WEBHOOK_SIGNATURE": request.header("webhook-signature"),
    }
    env = {"SPAR_WEBHOOK_SECRET": secret, "PATH": "/usr/bin:/bin", **headers}
    tampered = request.body.replace(b'"failed"', b'"succeeded"')
    assert tampered != request.body
    for body, verdict in ((request.body, 0), (tampered, 1)):
        (tmp_path / "body.json").write_bytes(body)
        shell = run_sh(env, tmp_path)
        assert shell.returncode == verdict, (shell.stdout, shell.stderr)
        assert ("verified" in shell.stdout) == (verdict == 0), shell.stdout
    stale = {**env, "WEBHOOK_TIMESTAMP": str(int(headers["WEBHOOK_TIMESTAMP"]) - 600)}
    (tmp_path / "body.json").write_bytes(request.body)
    shell = run_sh(stale, tmp_path)
    assert shell.returncode == 1 and "stale timestamp" in shell.stderr

    for body, ok in ((request.body, True), (tampered, False)):
        run = run_python(secret, body, request.headers)
        assert (run.returncode == 0) == ok, run.stderr
        if ok:
            assert json.loads(run.stdout)["type"] == "trigger.execution.failed"
        else:
            assert WebhookVerificationError.__name__.encode() in run.stderr
