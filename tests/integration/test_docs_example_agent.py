"""The documentation stays true: docs/agents.md's example agent and commands, run for real.

The example agent is the Python block of docs/agents.md whose first line is
``# spar-example: echo_agent.py``; it is written to a file and started as a subprocess on
a free loopback port.  The commands are the ``sh`` block after the marker comment
``<!-- spar-example: steps -->``: each ``curl`` is expanded by bash (so quoting and
variables mean what they mean in a user's shell), then sent to the API through the test
client, and a ``VAR=$(curl … | pick FIELD)`` keeps the field, read with the block's own
``pick``.  A run the commands start is executed in-process, as the worker would; the
``python3 echo_agent.py`` and ``sleep`` lines are what this test does itself.  The last
command must print ``passed``.

Also: README.md and docs/ never point at ``../shared`` (a folder users do not have),
and every relative link in them leads to a file of the project.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.scenarios.runner import execute_run
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
AGENTS_DOC = ROOT / "docs" / "agents.md"
AGENT_MARKER = "# spar-example: echo_agent.py"
STEPS_MARKER = "<!-- spar-example: steps -->"
BASE_URL = "http://testserver.local"  # the test client's; $SPAR in the commands
_CAPTURE = re.compile(r"^(\w+)=\$\((curl\s.*?)\|\s*pick\s+(\w+)\s*\)$", re.DOTALL)
_PICKED = re.compile(r"^(curl\s.*?)\|\s*pick\s+(\w+)$", re.DOTALL)
_ASSIGN = re.compile(r"^(\w+)=(\S*)$")
_RUN_PATH = re.compile(r"^/v1/orgs/[^/]+/scenarios/[^/]+/run$")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """(offset of the opening fence, info string, content) of every fenced code block."""
    return [
        (m.start(), m.group(1).strip(), m.group(2))
        for m in re.finditer(r"^```([^\n]*)\n(.*?)^```\s*$", text, re.DOTALL | re.MULTILINE)
    ]


def example_agent_code() -> str:
    blocks = [
        code
        for _, info, code in fenced_blocks(AGENTS_DOC.read_text())
        if info == "python" and code.startswith(AGENT_MARKER)
    ]
    assert len(blocks) == 1, f"docs/agents.md needs one python block starting {AGENT_MARKER!r}"
    return blocks[0]


def example_steps() -> list[str]:
    """The commands of the steps block, each a complete shell command (continuations and
    multi-line quoted arguments kept together, as the shell reads them)."""
    text = AGENTS_DOC.read_text()
    marker = text.index(STEPS_MARKER)
    offset, info, code = next(b for b in fenced_blocks(text) if b[0] > marker)
    assert info == "sh" and text[marker:offset].strip() == STEPS_MARKER, "steps block misplaced"
    commands, pending = [], ""
    for line in code.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            commands.append(pending.strip())
        pending = ""
    assert not pending, f"unterminated command in the steps block: {pending!r}"
    return commands


def bash(script: str, env: dict[str, str], stdin: str | None = None) -> str:
    done = subprocess.run(
        ["/bin/bash", "-c", script],
        input=stdin,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, f"bash failed on {script!r}: {done.stderr}"
    return done.stdout


def curl_request(command: str, env: dict[str, str]) -> tuple[str, str, dict[str, str], str | None]:
    """The method, path, headers and body a ``curl …`` command line sends."""
    command = command.strip().removesuffix("\\").strip()  # the line went on to `| pick`
    args = bash(f"printf '%s\\0' {command[len('curl') :]}", env).split("\0")[:-1]
    method, url, headers, data = None, None, {}, None
    words = iter(args)
    for word in words:
        if word in {"-s", "-sS", "-S", "-f", "--fail", "--silent"}:
            continue
        if word in {"-H", "--header"}:
            name, _, value = next(words).partition(":")
            headers[name.strip()] = value.strip()
        elif word in {"-d", "--data", "--data-raw"}:
            data = next(words)
        elif word in {"-X", "--request"}:
            method = next(words)
        else:
            assert not word.startswith("-"), f"curl option the test does not know: {word}"
            assert url is None, f"two URLs in {command!r}"
            url = word
    assert url is not None, f"no URL in {command!r}"
    parts = urlsplit(url if "://" in url else f"http://{url}")
    assert f"{parts.scheme}://{parts.netloc}" == BASE_URL, f"{url} is not under $SPAR"
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return method or ("POST" if data is not None else "GET"), path, headers, data


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def example_agent(tmp_path: Path) -> Iterator[int]:
    """docs/agents.md's agent, running as a real process; yields its port."""
    script = tmp_path / "echo_agent.py"
    script.write_text(example_agent_code())
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(script), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            assert process.poll() is None, process.stderr.read().decode()  # type: ignore[union-attr]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the example agent did not start listening"
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_documented_agent_and_commands_give_a_passed_run(
    client: AsyncTestClient, app: Litestar, settings: Settings, example_agent: int
) -> None:
    env = {"SPAR": BASE_URL, "PORT": str(example_agent)}
    preset = set(env)
    pick_definition: str | None = None
    printed: list[str] = []
    last_run: dict[str, Any] | None = None

    async def curl(command: str) -> str:
        nonlocal last_run
        method, path, headers, data = curl_request(command, env)
        response = await client.request(method, path, headers=headers, content=data)
        assert response.status_code < 400, f"{command}\n→ {response.status_code} {response.text}"
        if method == "POST" and _RUN_PATH.match(path):
            last_run = response.json()
            # What the worker does with the run the command started (`sleep` in the doc).
            await execute_run(app.state.database, settings, UUID(last_run["id"]))
        return response.text

    def pick(answer: str, field: str) -> str:
        assert pick_definition is not None, "pick is used before it is defined"
        return bash(f"{pick_definition}\npick {field}", env, stdin=answer).strip()

    commands = example_steps()
    for command in commands:
        if command.startswith("pick() {"):
            pick_definition = command
        elif command.startswith("python3 echo_agent.py"):
            assert command == "python3 echo_agent.py $PORT &"  # the example_agent fixture
        elif command.startswith("sleep "):
            pass  # the run was executed when it was started
        elif captured := _CAPTURE.match(command):
            name, curl_command, field = captured.groups()
            env[name] = pick(await curl(curl_command.strip()), field)
            assert env[name] and env[name] != "None", f"{command} gave nothing"
        elif assigned := _ASSIGN.match(command):
            name, _value = assigned.groups()
            if name not in preset:
                env[name] = bash(f"printf %s {command.split('=', 1)[1]}", env)
        elif picked := _PICKED.match(command):
            printed.append(pick(await curl(picked.group(1).strip()), picked.group(2)))
        elif command.startswith("curl "):
            printed.append(await curl(command))
        else:
            pytest.fail(f"a step of docs/agents.md this test does not replay: {command!r}")

    assert last_run is not None, "the documented commands never start a run"
    assert printed and printed[-1] == "passed", printed

    # What the doc says the run shows: each turn's reply, the verdicts, the agent's usage.
    response = await client.get(
        f"/v1/orgs/{env['ORG']}/scenarios/runs/{last_run['id']}",
        headers={"authorization": f"Bearer {env['TOKEN']}"},
    )
    run = response.json()
    assert run["status"] == "passed", run
    replies = [turn["response_content"] for turn in run["turn_results"]]
    assert replies == [
        "Hello Ada! You said: Hi, I am Ada.",
        "Hello Ada! You said: Can I move booking B-1042 to Friday?",
    ]
    verdicts = [[c["verdict"] for c in t["criteria_results"]] for t in run["turn_results"]]
    assert verdicts == [["PASS", "PASS"], ["PASS", "PASS", "PASS"]]
    # The tool the second reply reported, kept with it and checked by tool_called.
    assert [t["tool_calls"] for t in run["turn_results"]] == [
        [],
        [
            {
                "name": "find_booking",
                "arguments": {"booking_id": "B-1042"},
                "output": {"day": "Tuesday"},
            }
        ],
    ]
    checked = run["turn_results"][1]["criteria_results"][2]
    assert (checked["criteria_type"], checked["question"]) == ("tool_called", "find_booking")
    assert run["session_id"] == f"spar-{run['id']}"
    assert run["cost_summary"]["agent"]["calls"] == 2
    assert run["cost_summary"]["agent"]["input_tokens"] == 1 + 3  # len(messages) per turn


def test_the_steps_block_is_what_the_doc_promises() -> None:
    """Registration, an organization, the allow-list, agent, scenario, run, result: in order."""
    steps = " ".join(example_steps())
    order = [
        "/v1/auth/register",
        "/v1/organizations",
        "/allowed-domains",
        "/agents",
        "/scenarios ",
        "/run ",
        "/scenarios/runs/$RUN",
    ]
    positions = [steps.find(piece) for piece in order]
    assert -1 not in positions and positions == sorted(positions), dict(
        zip(order, positions, strict=True)
    )


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_never_point_outside_the_project(path: Path) -> None:
    text = path.read_text()
    for forbidden in ("../shared", "/work/shared", "interface-spec.md", "DESIGN.md"):
        assert forbidden not in text, f"{path.name} names {forbidden}"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute URL
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.is_relative_to(ROOT), f"{path.name} links outside the project: {target}"
        assert linked.exists(), f"{path.name} links a missing file: {target}"
        if anchor:
            assert anchor in heading_anchors(linked), f"{path.name}: no such heading: {target}"


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file (outside code blocks)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)
    }


# --- docs/permissions.md against the code ----------------------------------------------------

PERMISSIONS_DOC = ROOT / "docs" / "permissions.md"
ROLE_COLUMNS = ("OWNER", "ADMIN", "MEMBER", "VIEWER", "GUEST")


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_permission_table_is_the_catalogue_and_the_system_roles() -> None:
    from shared.identity.permissions import ALL_PERMISSIONS, SYSTEM_ROLES

    rows = table_rows(PERMISSIONS_DOC.read_text(), "| permission | guards |")
    assert [row[0].strip("`") for row in rows] == list(ALL_PERMISSIONS)
    for column, role in enumerate(ROLE_COLUMNS, start=2):
        documented = {row[0].strip("`") for row in rows if row[column] == "✓"}
        assert documented == set(SYSTEM_ROLES[role]), role
    assert set(SYSTEM_ROLES) == set(ROLE_COLUMNS)


def _rule_text(rule: Any) -> str:
    if rule.public:
        return "public"
    if rule.role:
        return f"{rule.role} role"
    if rule.permission:
        return f"`{rule.permission}`"
    return "user" if rule.user_only else "any token"


async def test_endpoint_table_is_every_v1_route_with_its_access_rule(app: Litestar) -> None:
    actual = set()
    for route in app.routes:
        if not route.path.startswith("/v1/"):
            continue
        for handler in getattr(route, "route_handlers", []):
            for method in handler.http_methods - {"OPTIONS", "HEAD"}:
                path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
                actual.add((method, f"`{path}`", _rule_text(handler.opt["access"])))
    text = PERMISSIONS_DOC.read_text()
    rows = table_rows(text[text.index("<!-- spar-docs: endpoint rules -->") :], "| method")
    assert {len(row) for row in rows} == {4}, "every row: method, path, rule, and"
    # The fourth column ("and") tells what a service checks besides: its tests say so.
    documented = {tuple(row[:3]) for row in rows}
    assert len(documented) == len(rows), "a route is listed twice"
    assert not actual - documented, (
        f"routes missing from docs/permissions.md: {actual - documented}"
    )
    assert not documented - actual, f"docs/permissions.md lists too much: {documented - actual}"
