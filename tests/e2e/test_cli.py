"""The ``spar`` client commands against a real Spar: a ``spar serve`` and a ``spar worker``
on the suite's database and Redis, the CLI run as its own process (its exit code and
output are what CI sees), agents and the judge faked as loopback servers.

Exit codes: 0 all passed, 1 a scenario failed (or under ``--fail-under``; with a
baseline, only a significant regression), 2 an error, 3 usage or connection problems.
Also: push idempotence, YAML errors with file and line, JUnit XML read by lxml, Jenkins'
JUnit schema (lxml and xmlschema) and junitparser (flaky scenarios as Surefire's reruns),
even when the agent answers with terminal colours or control characters, and the event
stream's reconnection."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import textwrap
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import junitparser
import pytest
import xmlschema
from click.testing import CliRunner
from junitparser import xunit2
from litestar.testing import AsyncTestClient
from lxml import etree

from client.cli import main
from tests.support.action import SCRIPT, script_env
from tests.support.factories import Tenant, tenant
from tests.support.fakes import (
    FakeAgent,
    FakeFlakyAgent,
    FakeOpenAI,
    FakeSimulator,
    Reply,
    VoteQuota,
    verdict_from_marker,
)
from tests.support.processes import (
    free_port,
    spar_executable,
    spar_process,
    spar_serve,
    suite_env,
)
from tests.support.proxy import DroppingProxy
from tests.support.scenario_setup import (
    create_judge_provider,
    create_scenario,
    criterion,
    outbound_setup,
    turn,
)

# One worker takes the module: its spar serve and worker start once under xdist.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli")]


RED = "\u001b[31mred\u001b[0m"  # a reply coloured for a terminal
CRASH = "\u001b[1mTraceback\u001b[0m: [/bold] boom\u0007"  # a 500's body: ESC, BEL, no markup


class ShopAgent(FakeAgent):
    """Echoes the message; a message carrying ``[break]`` gets HTTP 400 (the run errors),
    one carrying ``[colour]`` gets :data:`RED`, one carrying ``[crash]`` HTTP 500 with
    :data:`CRASH` as its body."""

    def handle(self, request: Any) -> Reply:
        body = request.json
        message = str(body.get("message")) if isinstance(body, dict) else ""
        if "[break]" in message:
            return Reply(status=400, json={"error": "broken on purpose"})
        if "[colour]" in message:
            return Reply(json={"content": RED})
        if "[crash]" in message:
            return Reply(status=500, body=CRASH)
        return super().handle(request)


def shop_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The shop's tool calls: a refund asked for is a refund made."""
    if "refund" not in body["message"]:
        return []
    return [{"name": "refund_order", "arguments": {"order_id": "AB-1", "amount": 40}}]


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopAgent]:
    reply = lambda body: f"Echo: {body['message']} [judge:PASS]"  # noqa: E731
    with ShopAgent(reply=reply, tool_calls=shop_tools) as fake:
        yield fake


@pytest.fixture(scope="module")
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=verdict_from_marker) as fake:
        yield fake


@pytest.fixture(scope="module")
def spar_api(
    database_url: str, settings: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``spar serve`` and ``spar worker`` on the suite's database; the API's URL."""
    env = suite_env(database_url, settings, SPAR_LOG_LEVEL="WARNING", SPAR_DB_POOL_SIZE="4")
    cwd = tmp_path_factory.mktemp("spar-cli")
    with (
        spar_serve(env, cwd=cwd) as (url, _),
        spar_process(["worker", "--processes", "1", "--threads", "8"], env, cwd=cwd),
    ):
        yield url


def cli(
    *args: str, url: str, token: str, cwd: Path, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """``spar *args`` as its own process, its output a pipe (as in a CI log); ``env``
    adds to its environment, a ``None`` value unsets."""
    environment: dict[str, str | None] = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPAR_")},
        "SPAR_URL": url,
        "SPAR_TOKEN": token,
        "XDG_CONFIG_HOME": str(cwd / "config"),
        "COLUMNS": "200",
        **(env or {}),
    }
    return subprocess.run(
        [spar_executable(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={k: v for k, v in environment.items() if v is not None},
        check=False,
    )


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str


# What the client reads from the environment: unset unless a test gives it.
CLIENT_ENVIRONMENT = ("SPAR_URL", "SPAR_TOKEN", "SPAR_ORG", "SPAR_PROFILE", "SPAR_PASSWORD")


def spar_here(
    *args: str, config: Path, env: dict[str, str] | None = None, stdin: str | None = None
) -> Ran:
    """``spar *args`` run in this process as its entry point runs it (click's CliRunner
    for the streams): cheaper than a process, with the same exit codes.  ``config`` is
    the ``XDG_CONFIG_HOME``; no terminal, and no ``COLUMNS``: rich's 80 columns."""
    environment: dict[str, str | None] = dict.fromkeys(CLIENT_ENVIRONMENT)
    environment.update(XDG_CONFIG_HOME=str(config), COLUMNS=None, **(env or {}))
    with CliRunner().isolation(input=stdin, env=environment) as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        return Ran(code, out.getvalue().decode(), err.getvalue().decode())


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def ansi_suite(directory: Path) -> None:
    """Two scenarios whose agent answers with control characters: a failing one (a reply
    in colour) and one in error (a 500 whose body holds ESC)."""
    write(
        directory,
        "colour.yaml",
        """
        name: colour
        tags: [ansi]
        turns:
          - user_message: say it in colour [colour]
            criteria:
              - question: green
                criteria_type: contains
        """,
    )
    write(
        directory,
        "crash.yaml",
        """
        name: crash
        tags: [ansi]
        turns:
          - user_message: this one [crash]
            criteria:
              - question: anything
                criteria_type: contains
        """,
    )


def suite(directory: Path) -> None:
    write(
        directory,
        "greet.yaml",
        """
        name: greet
        tags: [smoke, ok]
        turns:
          - user_message: hello there
            criteria:
              - question: hello
                criteria_type: contains
              - question: refund_order
                criteria_type: tool_not_called
        """,
    )
    write(
        directory,
        "refund.yaml",
        """
        name: refund
        tags: [smoke, bad]
        turns:
          - user_message: refund please
            criteria:
              - question: refund
                criteria_type: contains
              - question: refund_order
                criteria_type: tool_called
                expected_arguments: {order_id: AB-1}
          - user_message: and the policy?
            criteria:
              - question: 30 days
                criteria_type: contains
        """,
    )
    write(
        directory,
        "broken.yaml",
        """
        name: broken
        tags: [err]
        turns:
          - user_message: this one [break]
            criteria:
              - question: anything
                criteria_type: contains
        """,
    )


async def world(client: AsyncTestClient, shop: ShopAgent, judge: FakeOpenAI) -> Tenant:
    t = await tenant(client)
    await outbound_setup(client, t, shop.url, judge.url, agent_fields={"name": "support-bot"})
    return t


async def pushed_world(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> str:
    """:func:`world` with :func:`suite` pushed by the CLI; the owner's token."""
    t = await world(client, shop, judge)
    suite(tmp_path / "scenarios")
    pushed = cli(
        "scenarios",
        "push",
        str(tmp_path / "scenarios"),
        url=spar_api,
        token=t.owner.token,
        cwd=tmp_path,
    )
    assert pushed.returncode == 0, pushed.stderr
    return t.owner.token


async def test_push_creates_then_changes_nothing_then_updates_with_a_diff_and_prunes(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    t = await world(client, shop, judge)
    scenarios = tmp_path / "scenarios"
    suite(scenarios)

    def push(*extra: str) -> subprocess.CompletedProcess[str]:
        return cli(
            "scenarios",
            "push",
            str(scenarios),
            *extra,
            url=spar_api,
            token=t.owner.token,
            cwd=tmp_path,
        )

    first = push()
    assert first.returncode == 0, first.stderr
    assert "3 created, 0 updated, 0 deleted, 0 unchanged" in first.stdout
    listing = (await client.get(f"/v1/orgs/{t.id}/scenarios", headers=t.owner.headers)).json()
    before = {s["name"]: s for s in listing["scenarios"]}
    assert set(before) == {"greet", "refund", "broken"}
    assert before["refund"]["turn_count"] == 2

    again = push()
    assert again.returncode == 0, again.stderr
    assert "0 created, 0 updated, 0 deleted, 3 unchanged" in again.stdout
    listing = (await client.get(f"/v1/orgs/{t.id}/scenarios", headers=t.owner.headers)).json()
    assert {s["name"]: s["updated_at"] for s in listing["scenarios"]} == {
        n: s["updated_at"] for n, s in before.items()
    }

    refund = (scenarios / "refund.yaml").read_text().replace("30 days", "thirty days")
    (scenarios / "refund.yaml").write_text(refund)
    (scenarios / "broken.yaml").unlink()
    dry = push("--prune", "--dry-run")
    assert dry.returncode == 0 and "nothing was sent" in dry.stdout
    changed = push("--prune")
    assert changed.returncode == 0, changed.stderr
    assert "~ update refund" in changed.stdout and "- delete broken" in changed.stdout
    assert "    -  - question: 30 days\n    +  - question: thirty days" in changed.stdout
    assert "0 created, 1 updated, 1 deleted, 1 unchanged" in changed.stdout
    detail = (
        await client.get(
            f"/v1/orgs/{t.id}/scenarios/{before['refund']['id']}", headers=t.owner.headers
        )
    ).json()
    assert detail["turns"][1]["criteria"][0]["question"] == "thirty days"
    tool_check = detail["turns"][0]["criteria"][1]
    assert (tool_check["criteria_type"], tool_check["expected_arguments"]) == (
        "tool_called",
        {"order_id": "AB-1"},
    )
    listing = (await client.get(f"/v1/orgs/{t.id}/scenarios", headers=t.owner.headers)).json()
    assert {s["name"] for s in listing["scenarios"]} == {"greet", "refund"}


async def test_push_names_the_file_and_line_of_each_problem_and_sends_nothing(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    t = await world(client, shop, judge)
    scenarios = tmp_path / "scenarios"
    suite(scenarios)
    write(
        scenarios,
        "nested/typo.yaml",
        """
        name: typo
        turns:
          - user_message: hi
          - required: true
            criteria: []
        """,
    )
    write(scenarios, "syntax.yml", "name: syntax\nturns: [\n  - oops: {\n")
    write(
        scenarios,
        "rules.yaml",
        """
        name: rules
        customer_context: {name: Ada}
        turns:
          - user_message: "Hi, I am {{ name }}"
            criteria:
              - question: "(unclosed"
                criteria_type: regex
        """,
    )
    write(
        scenarios,
        "tools.yaml",
        """
        name: tools
        turns:
          - user_message: hi
            criteria:
              - question: refund_order
                criteria_type: tool_not_called
                expected_arguments: {order_id: AB-1}
        """,
    )
    done = cli("scenarios", "push", str(scenarios), url=spar_api, token=t.owner.token, cwd=tmp_path)
    assert done.returncode == 3
    typo = scenarios / "nested" / "typo.yaml"
    assert (
        f"{typo}:4: Object missing required field `user_message` (loc: body.turns.1.user_message)"
        in done.stderr
    )
    assert f"{scenarios / 'syntax.yml'}:3: not valid YAML" in done.stderr
    # The service's own rules, checked locally too: a regular expression that won't compile.
    rules = scenarios / "rules.yaml"
    assert f"{rules}:6: Invalid regular expression" in done.stderr
    assert "(loc: body.turns.0.criteria.0.question)" in done.stderr
    tools = scenarios / "tools.yaml"
    assert (
        f"{tools}:7: expected_arguments is for tool_called criteria; a tool_not_called criterion"
        in done.stderr
    )
    assert "(loc: body.turns.0.criteria.0.expected_arguments)" in done.stderr
    listing = (await client.get(f"/v1/orgs/{t.id}/scenarios", headers=t.owner.headers)).json()
    assert listing["total"] == 0


JUNIT_XSD = Path(__file__).parent.parent / "support" / "junit-10.xsd"


def check_junit(path: Path) -> Any:
    """The file as CI tools read it: lxml parses it, it is valid against Jenkins' JUnit
    schema (tests/support/junit-10.xsd, vendored from the xUnit plugin) for lxml and for
    xmlschema, junitparser reads the same counts; its root."""
    schema = etree.XMLSchema(etree.parse(str(JUNIT_XSD)))
    document = etree.parse(str(path))
    schema.assertValid(document)
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(path))
    root = document.getroot()
    cases = root.findall("testcase")
    assert int(root.get("tests")) == len(cases)
    assert int(root.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
    assert int(root.get("errors")) == sum(1 for c in cases if c.find("error") is not None)
    (read,) = junitparser.JUnitXml.fromfile(str(path))  # the one testsuite
    assert (read.tests, read.failures, read.errors) == (
        len(cases),
        int(root.get("failures")),
        int(root.get("errors")),
    )
    assert [case.name for case in read] == [c.get("name") for c in cases]
    return root


async def test_batch_run_exit_codes_result_files_and_fail_under(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    token = await pushed_world(client, spar_api, shop, judge, tmp_path)

    def batch(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return cli(
            "batch",
            "run",
            "--agent",
            "support-bot",
            *args,
            url=spar_api,
            token=token,
            cwd=tmp_path,
            **kwargs,
        )

    # Output to a pipe with no COLUMNS, as in a CI log: rich's 80 columns, and still the
    # link and the summary each on one line, whole.
    passed = batch("--tag", "ok", env={"COLUMNS": None})
    assert passed.returncode == 0, passed.stdout + passed.stderr
    lines = passed.stdout.splitlines()
    (summary,) = [line for line in lines if line.startswith("batch ") and " completed: " in line]
    assert re.fullmatch(
        r"batch \S{36} completed: 1 passed, 0 failed, 0 error of 1 \(100% passed\)", summary
    )
    (link,) = [line for line in lines if line.startswith("results: ")]
    assert re.fullmatch(rf"results: {spar_api}/ui/orgs/\S{{36}}/batches/\S{{36}}", link), lines
    assert len(summary) > 80 and len(link) > 80

    junit, report = tmp_path / "out.xml", tmp_path / "out.json"
    failed = batch("--tag", "smoke", "--junit", str(junit), "--json", str(report))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "1 passed, 1 failed, 0 error of 2" in failed.stdout
    assert "FAIL 30 days" in failed.stdout and "/ui/orgs/" in failed.stdout
    root = check_junit(junit)
    cases = {c.get("name"): c for c in root.findall("testcase")}
    assert set(cases) == {"greet", "refund"}
    failure = cases["refund"].find("failure")
    assert failure is not None and failure.get("message") == "turn 2: 30 days"
    assert "and the policy?" in failure.text and "critique:" in failure.text
    assert cases["greet"].find("failure") is None
    assert all(float(c.get("time")) > 0 for c in cases.values())  # each run's own duration
    body = json.loads(report.read_text())
    assert body["batch"]["status"] == "completed"
    by_name = {s["scenario"]: s for s in body["scenarios"]}
    assert by_name["refund"]["failed_turns"][0]["criteria"][0]["verdict"] == "FAIL"
    # Turn 1's tool check passed (the shop refunded AB-1): only turn 2 failed.
    assert [t["turn_index"] for t in by_name["refund"]["failed_turns"]] == [1]

    met = batch("--tag", "smoke", "--fail-under", "0.5")
    assert met.returncode == 0
    assert "pass rate 50%: --fail-under 0.5 (50%) met, exit 0" in met.stdout
    missed = batch("--tag", "smoke", "--fail-under", "0.75")
    assert missed.returncode == 1
    assert "pass rate 50%: --fail-under 0.75 (75%) not met, exit 1" in missed.stdout
    errored = batch("--tag", "smoke", "--tag", "err", "--junit", str(junit))
    assert errored.returncode == 2, errored.stdout + errored.stderr
    root = check_junit(junit)
    (error,) = [c.find("error") for c in root.findall("testcase") if c.find("error") is not None]
    assert "400" in error.get("message")
    by_scenario = batch("--scenario", "greet")
    assert by_scenario.returncode == 0 and "of 1" in by_scenario.stdout

    # Usage and connection problems: 3.
    assert batch("--tag", "smoke", "--agent", "nobody").returncode == 3
    assert batch().returncode == 3  # neither --tag nor --scenario
    assert batch("--scenario", "no-such").returncode == 3
    closed = f"http://127.0.0.1:{free_port()}"
    unreachable = batch("--tag", "ok", env={"SPAR_URL": closed})
    assert unreachable.returncode == 3 and "cannot reach Spar" in unreachable.stderr
    bad_token = batch("--tag", "ok", env={"SPAR_TOKEN": "ust_not-a-token"})
    assert bad_token.returncode == 3 and "401" in bad_token.stderr
    unset = cli("batch", "run", "--agent", "x", "--tag", "ok", url="", token="", cwd=tmp_path)
    assert unset.returncode == 3 and "SPAR_URL" in unset.stderr


async def test_a_simulated_scenario_pushed_from_yaml_runs_and_names_its_failed_criterion(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    """A YAML scenario with a simulated user and conversation criteria (tool checks among
    them): pushed (and pushed again, unchanged), run by ``spar batch run``, its failed
    conversation criteria named in the table, the JUnit file and the JSON report."""
    t = await world(client, shop, judge)
    scenarios = tmp_path / "simulated"
    write(
        scenarios,
        "rebook.yaml",
        """
        name: rebook
        tags: [simulated]
        turns:
          - user_message: I need a refund for order AB-1
        simulation:
          persona: A hurried customer who writes short messages
          goal: Get order AB-1 refunded by Friday
          max_turns: 4
        conversation_criteria:
          - question: refund_order
            criteria_type: tool_called
            expected_arguments: {order_id: AB-1}
          - question: customer message 1
            criteria_type: contains
          - question: refund_order
            criteria_type: tool_not_called
          - question: Friday
            criteria_type: contains
        """,
    )
    with FakeSimulator(done_at=2) as simulator:
        await create_judge_provider(
            client, t, simulator.url, is_default_judge=False, is_default_simulator=True
        )

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return cli(*args, url=spar_api, token=t.owner.token, cwd=tmp_path)

        pushed = run("scenarios", "push", str(scenarios))
        assert pushed.returncode == 0, pushed.stderr
        assert "1 created" in pushed.stdout
        again = run("scenarios", "push", str(scenarios))
        assert "0 created, 0 updated, 0 deleted, 1 unchanged" in again.stdout, again.stdout
        junit, report = tmp_path / "simulated.xml", tmp_path / "simulated.json"
        ran = run(
            "batch",
            "run",
            "--agent",
            "support-bot",
            "--tag",
            "simulated",
            "--junit",
            str(junit),
            "--json",
            str(report),
        )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "0 passed, 1 failed, 0 error of 1" in ran.stdout
    assert "FAIL tool_not_called refund_order (conversation)" in ran.stdout
    assert "FAIL Friday (conversation)" in ran.stdout
    assert "no reply contains 'Friday'" in ran.stdout
    (case,) = check_junit(junit).findall("testcase")
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message") == "conversation: tool_not_called refund_order"
    assert "simulated user: goal_reached" in failure.text
    assert "(called in turn 1)" in failure.text
    (scenario,) = json.loads(report.read_text())["scenarios"]
    assert scenario["simulation_outcome"] == "goal_reached"
    refused, friday = scenario["failed_conversation_criteria"]
    assert (refused["question"], refused["verdict"]) == ("tool_not_called refund_order", "FAIL")
    assert friday == {
        "question": "Friday",
        "verdict": "FAIL",
        "critique": "no reply contains 'Friday'",
    }
    assert (scenario["passed_turns"], scenario["total_turns"]) == (2, 2)
    assert simulator.asked_per_exchange() == {1: 1, 2: 1}


@pytest.fixture(scope="module")
def wobbly() -> Iterator[FakeFlakyAgent]:
    with FakeFlakyAgent() as fake:
        yield fake


async def test_repetitions_show_the_flaky_and_a_baseline_exits_1_only_for_a_significant_regression(
    client: AsyncTestClient, spar_api: str, wobbly: FakeFlakyAgent, tmp_path: Path
) -> None:
    t = await tenant(client)
    await outbound_setup(client, t, wobbly.url, agent_fields={"name": "wobbly-bot"})
    # The agent fails one conversation of every four of "wobbly" (flaky in every batch of
    # four runs), and every conversation of "lost" from the ninth on (the third batch).
    for name, share in (("steady", ""), ("wobbly", " [fails 1/4]"), ("lost", " [fails 4/12]")):
        await create_scenario(
            client,
            t,
            name=name,
            tags=["rel"],
            turns=[turn(f"hello {name}{share}", criterion("hello", "contains"))],
        )

    def batch(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(
            "batch",
            "run",
            "--agent",
            "wobbly-bot",
            "--tag",
            "rel",
            "--repetitions",
            "4",
            *args,
            url=spar_api,
            token=t.owner.token,
            cwd=tmp_path,
        )

    junit = tmp_path / "flaky.xml"
    first = batch("--baseline", "latest", "--junit", str(junit))
    output = first.stdout + first.stderr
    # Nothing to compare with yet: a failure is a failure.
    assert "no completed batch run of wobbly-bot yet: running without a baseline" in output
    assert first.returncode == 1, output
    assert "3 scenarios x 4 runs" in output
    assert "11 passed, 1 failed, 0 error of 12" in output
    assert "pass^1 92%, pass^2 83%, pass^3 75%, pass^4 67%; pass@4 100%" in output
    assert "Flaky scenarios (1)" in output and "3 of 4" in output
    root = check_junit(junit)
    assert [c.get("name") for c in root.findall("testcase")] == ["steady", "wobbly", "lost"]
    (suite,) = xunit2.JUnitXml.fromfile(str(junit))  # as Jenkins reads Surefire's reruns
    cases = {case.name: case for case in suite}
    assert cases["wobbly"].is_flaky and cases["wobbly"].is_passed
    assert len(cases["wobbly"].flaky_failures()) == 1
    assert not cases["steady"].is_flaky and not cases["lost"].is_flaky

    # The same again against the latest: wobbly is as flaky as before, nothing regressed.
    second = batch("--baseline", "latest")
    output = second.stdout + second.stderr
    assert second.returncode == 0, output
    assert "no significant regression against the baseline: exit 0" in output
    assert "0 regressions (0 significant, p < 0.05), 0 fixes; pass rate +0.0%" in output
    (made,) = re.findall(r"^batch (\S{36}): 3 scenarios", second.stdout, re.MULTILINE)

    # "lost" now fails every time: 4 of 4, then 0 of 4, p = 1/70.
    third = batch("--baseline", made)
    output = third.stdout + third.stderr
    assert third.returncode == 1, output
    assert f"compared with batch {made}" in output
    assert "1 significant regression (p < 0.05) against the baseline: exit 1" in output
    (row,) = [line for line in output.splitlines() if "lost" in line and "regressed" in line]
    assert "4 of 4" in row and "0 of 4" in row and "0.0143" in row and "significant" in row


async def test_judge_votes_show_the_flip_rate_and_a_replay_rejudges_without_the_agent(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, tmp_path: Path
) -> None:
    """``--judge-repetitions 3``: the judge's 2-1 is a pass and its flip rate is shown; the
    criterion reworded, ``spar batch replay`` judges the stored reply again (its 1-2 a
    failure: exit 1) with no request to the agent."""
    t = await tenant(client)
    with FakeOpenAI(reply=VoteQuota()) as voter:
        await outbound_setup(client, t, shop.url, voter.url, agent_fields={"name": "voting-bot"})
        scenario = await create_scenario(
            client,
            t,
            name="votes",
            tags=["votes"],
            turns=[turn("hello votes", criterion("Polite? [judge:votes 2/3]"))],
        )
        env = {"SPAR_URL": spar_api, "SPAR_TOKEN": t.owner.token}
        run = ("batch", "run", "--agent", "voting-bot", "--tag", "votes")
        ran = spar_here(*run, "--judge-repetitions", "3", config=tmp_path, env=env)
        assert ran.code == 0, ran.stdout + ran.stderr
        assert "judge: 3 votes on each judged criterion; 100% of them split" in ran.stdout
        (made,) = re.findall(r"^batch (\S{36}): 1 scenarios", ran.stdout, re.MULTILINE)

        reworded = {
            "name": "votes",
            "tags": ["votes"],
            "turns": [turn("hello votes", criterion("Polite now? [judge:votes 1/3]"))],
        }
        put = await client.put(
            f"/v1/orgs/{t.id}/scenarios/{scenario['id']}", json=reworded, headers=t.owner.headers
        )
        assert put.status_code == 200, put.text
        asked = len(shop.requests)
        json_path = tmp_path / "replay.json"
        ran = spar_here("batch", "replay", made, "--json", str(json_path), config=tmp_path, env=env)
        output = ran.stdout + ran.stderr
        assert ran.code == 1, output
        assert f"replaying batch {made}" in output
        assert "(votes 1\N{EN DASH}2)" in output  # the failed criterion's votes
        assert len(shop.requests) == asked
        report = json.loads(json_path.read_text())
        assert report["batch"]["replay_of"] == made
        assert report["batch"]["judge_repetitions"] == 3


async def test_control_characters_from_the_agent_reach_no_report_raw(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    """A reply in terminal colours and a 500 whose body holds ESC: JUnit that every reader
    accepts and JSON that keeps the text exactly; the table and the Markdown summary show
    the escapes as text."""
    token = await pushed_world(client, spar_api, shop, judge, tmp_path)
    ansi_suite(tmp_path / "ansi")
    pushed = cli(
        "scenarios", "push", str(tmp_path / "ansi"), url=spar_api, token=token, cwd=tmp_path
    )
    assert pushed.returncode == 0, pushed.stderr
    junit, report = tmp_path / "ansi.xml", tmp_path / "ansi.json"
    summary = tmp_path / "ansi.md"
    done = cli(
        "batch",
        "run",
        "--agent",
        "support-bot",
        "--tag",
        "ansi",
        "--junit",
        str(junit),
        "--json",
        str(report),
        "--summary",
        str(summary),
        url=spar_api,
        token=token,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "1 failed, 1 error of 2" in done.stdout

    # JUnit: no control character but line ends; each one written as its escape, in the
    # failure's text and in the error's message and text.
    assert not set(junit.read_bytes()) & (set(range(0x20)) - {0x09, 0x0A, 0x0D})
    root = check_junit(junit)
    cases = {c.get("name"): c for c in root.findall("testcase")}
    failure = cases["colour"].find("failure")
    assert "agent: \\x1b[31mred\\x1b[0m" in failure.text
    error = cases["crash"].find("error")
    shown = "\\x1b[1mTraceback\\x1b[0m: [/bold] boom\\x07"
    assert shown in error.get("message") and shown in error.text
    ((read,),) = [
        [case for case in suite if case.name == "crash"]
        for suite in junitparser.JUnitXml.fromfile(str(junit))
    ]
    (result,) = read.result
    assert isinstance(result, junitparser.Error) and shown in result.message

    # JSON: the exact text, in JSON's escapes.
    text = report.read_text()
    assert "\x1b" not in text and "\\u001b[31mred" in text
    body = json.loads(text)
    by_name = {s["scenario"]: s for s in body["scenarios"]}
    assert by_name["colour"]["failed_turns"][0]["response"] == RED
    assert CRASH in by_name["crash"]["error"]

    # The Markdown summary: the escapes as text, in the code blocks of what did not pass.
    markdown = summary.read_text()
    assert "\x1b" not in markdown and "\x07" not in markdown
    assert "agent: \\x1b[31mred\\x1b[0m" in markdown
    assert "\\x1b[1mTraceback\\x1b[0m: [/bold] boom\\x07" in markdown

    # The terminal: the agent's escapes as text, its brackets as text (no markup).
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "\\x1b[1mTraceback\\x1b[0m: [/bold] boom" in done.stdout


async def test_a_dropped_event_stream_is_reconnected_and_the_batch_followed_to_its_end(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    token = await pushed_world(client, spar_api, shop, judge, tmp_path)
    upstream = int(spar_api.rsplit(":", 1)[1])
    with DroppingProxy(upstream) as proxy:
        done = cli(
            "batch",
            "run",
            "--agent",
            "support-bot",
            "--tag",
            "smoke",
            url=proxy.url,
            token=token,
            cwd=tmp_path,
        )
    assert proxy.dropped == 1 and proxy.event_streams >= 2, (proxy.event_streams, done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "completed: 1 passed, 1 failed, 0 error of 2" in done.stdout


async def test_a_profile_configures_the_client_and_calibrate_prints_the_agreement(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    t = await world(client, shop, judge)
    config = tmp_path / "config" / "spar" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[profiles.ci]\nurl = "{spar_api}"\ntoken = "{t.owner.token}"\n')
    examples = tmp_path / "labels.jsonl"
    lines = [
        {
            "id": f"ex-{n}",
            "user_message": "hi",
            "agent_response": f"answer {n}" + (" [judge:PASS]" if n < 3 else ""),
            "criterion_question": "Is it right?",
            "human_verdict": "PASS" if n < 2 or n == 3 else "FAIL",
        }
        for n in range(5)
    ]
    examples.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    done = cli(
        "calibrate",
        str(examples),
        "--agent",
        "support-bot",
        "--profile",
        "ci",
        "--json",
        str(tmp_path / "c.json"),
        url="",
        token="",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Judge PASS on ex-0..2; humans PASS on ex-0, ex-1, ex-3: TP 2, FN 1, TN 1, FP 1.
    measured = json.loads((tmp_path / "c.json").read_text())
    assert (measured["true_positives"], measured["false_negatives"]) == (2, 1)
    assert (measured["true_negatives"], measured["false_positives"]) == (1, 1)
    assert "agreement" in done.stdout and "60.0%" in done.stdout
    assert "ex-2: human FAIL, judge PASS" in done.stdout
    # A later batch asking that question reports it with the judge's error taken out
    # (the worker's judge_trust actor): judged PASS every time, corrected within [0, 1].
    scenarios = tmp_path / "judged"
    write(
        scenarios,
        "judged.yaml",
        """
        name: judged
        tags: [judged]
        turns:
          - user_message: hi
            criteria:
              - question: Is it right?
              - question: Is it kind?
        """,
    )
    pushed = cli(
        "scenarios", "push", str(scenarios), "--profile", "ci", url="", token="", cwd=tmp_path
    )
    assert pushed.returncode == 0, pushed.stderr
    judged = cli(
        "batch",
        "run",
        "--agent",
        "support-bot",
        "--tag",
        "judged",
        "--profile",
        "ci",
        url="",
        token="",
        cwd=tmp_path,
    )
    assert judged.returncode == 0, judged.stdout + judged.stderr
    assert "Pass rates with the judge's measured error taken out" in judged.stdout
    assert "Is it right?" in judged.stdout and "100% (" in judged.stdout
    # No calibration asked "Is it kind?": listed with its raw rate, as the results page does.
    uncalibrated = judged.stdout.split("Uncalibrated", 1)[1]
    assert re.search(r"Is it kind\?\s+│\s+100%\s+│\s+1 / 1\s+│\s+1", uncalibrated), judged.stdout
    assert "Is it right?" not in uncalibrated
    # A bad line: its line number, nothing sent.
    examples.write_text(json.dumps(lines[0]) + "\n" + json.dumps({"id": "x"}) + "\n")
    bad = cli(
        "calibrate",
        str(examples),
        "--agent",
        "support-bot",
        "--profile",
        "ci",
        url="",
        token="",
        cwd=tmp_path,
    )
    assert bad.returncode == 3
    assert f"{examples}:2: Object missing required field" in bad.stderr
    missing = cli(
        "batch",
        "run",
        "--agent",
        "x",
        "--tag",
        "y",
        "--profile",
        "nope",
        url="",
        token="",
        cwd=tmp_path,
    )
    assert missing.returncode == 3 and "no profile 'nope'" in missing.stderr


def test_spar_demo_runs_the_whole_path_with_nothing_configured(tmp_path: Path) -> None:
    """The README's first command: an embedded PostgreSQL, a demo agent with a flaw, the
    demo suite pushed and run; exits 0 with --exit once the batch is over."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPAR_")}
    done = subprocess.run(
        [
            spar_executable(),
            "demo",
            "--exit",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**env, "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 created" in done.stdout
    assert "4 passed, 1 failed, 0 error of 5" in done.stdout
    assert "demo · no refund after 30 days" in done.stdout
    assert f"http://127.0.0.1:{port}/ui/orgs/" in done.stdout
    assert "spar providers add" in done.stdout
    # The token to sign in with, even with --exit.
    assert f"sign in at http://127.0.0.1:{port}/ui/login with this token:" in done.stdout
    assert re.search(r"^  ust_\S+$", done.stdout, re.MULTILINE), done.stdout


async def test_spar_serve_hands_out_webhook_urls_on_the_address_it_serves(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI
) -> None:
    """No SPAR_PUBLIC_BASE_URL: the webhook URL is where this spar serve listens, not
    http://localhost:8000."""
    t = await world(client, shop, judge)
    agents = (await client.get(f"/v1/orgs/{t.id}/agents", headers=t.owner.headers)).json()
    async with httpx.AsyncClient(timeout=30) as http:
        made = await http.post(
            f"{spar_api}/v1/orgs/{t.id}/triggers/",
            json={
                "name": "on push",
                "trigger_type": "webhook",
                "agent_id": agents["agents"][0]["id"],
                "message": "hello",
            },
            headers=t.owner.headers,
        )
    assert made.status_code == 201, made.text
    trigger = made.json()
    assert trigger["webhook_url"] == f"{spar_api}/v1/hooks/triggers/{trigger['id']}"


async def test_a_new_user_sets_up_from_the_terminal_and_ci_runs_with_the_token_it_made(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    """The README's path without curl: spar login --register (a profile), the set-up
    commands (each printing what it made, or --json), then CI with the platform token
    made: push, a batch judged with the provider's key, output in a CI log."""
    config, password, api_key = tmp_path / "config", "a-long-secret-password", "sk-from-stdin-42"
    secrets = (password, api_key)

    def spar(*args: str, **kwargs: Any) -> Ran:
        ran = spar_here(*args, config=config, **kwargs)
        assert not any(s in ran.stdout + ran.stderr for s in secrets), ran
        return ran

    signed = spar(
        "login",
        "--register",
        "--url",
        spar_api,
        "--email",
        "new@example.com",
        "--first-name",
        "New",
        "--last-name",
        "User",
        "--password-stdin",
        stdin=password + "\n",
    )
    assert signed.code == 0, signed
    path = config / "spar" / "config.toml"
    assert f"profile 'default' saved in {path} (mode 0600)" in signed.stdout
    assert "no organization yet: spar orgs create NAME" in signed.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    profile = tomllib.loads(path.read_text())["profiles"]["default"]
    assert profile["url"] == spar_api and profile["token"].startswith("ust_")
    assert password not in path.read_text()
    # Signing in again (password from SPAR_PASSWORD) keeps other profiles and the URL.
    path.write_text(path.read_text() + '\n[profiles.other]\nurl = "http://elsewhere"\n')
    again = spar("login", "--email", "new@example.com", "--json", env={"SPAR_PASSWORD": password})
    assert again.code == 0, again
    assert json.loads(again.stdout)["url"] == spar_api
    kept = tomllib.loads(path.read_text())["profiles"]
    assert kept["other"] == {"url": "http://elsewhere"}
    assert kept["default"]["token"] != profile["token"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    wrong = spar("login", "--email", "new@example.com", env={"SPAR_PASSWORD": "not-it"})
    assert wrong.code == 3 and "401" in wrong.stderr

    org = spar("orgs", "create", "Acme", "--json")
    assert org.code == 0, org
    org_id = json.loads(org.stdout)["id"]
    assert tomllib.loads(path.read_text())["profiles"]["default"]["org"] == org_id
    second = spar("orgs", "create", "Acme")
    assert second.stdout.startswith(f"organization Acme ({org_id}) exists"), second

    allowed = spar("hosts", "allow", "127.0.0.1")
    assert allowed.code == 0 and re.match(r"host 127\.0\.0\.1 \(\S{36}\) allowed", allowed.stdout)
    assert "was already allowed" in spar("hosts", "allow", "127.0.0.1").stdout

    judge_added = spar(
        "providers",
        "add",
        "judge",
        "--provider",
        "openai_compatible",
        "--base-url",
        f"{judge.url}/v1",
        "--model",
        "judge-1",
        "--api-key-stdin",
        "--judge",
        "--json",
        stdin=api_key,
    )
    assert judge_added.code == 0, judge_added
    provider = json.loads(judge_added.stdout)
    assert (provider["credential_key"], provider["is_default_judge"]) == ("JUDGE_API_KEY", True)

    agent = spar("agents", "add", "support", "--url", f"{shop.url}/chat")
    assert agent.code == 0, agent
    assert re.match(
        rf"agent support \(\S{{36}}\) added: http agent at {shop.url}/chat \(spar\)", agent.stdout
    )
    judged_by = spar("agents", "add", "support", "--judge", "judge", "--json")
    assert json.loads(judged_by.stdout)["judge_provider_id"] == provider["id"]

    token = spar("tokens", "create", "ci")
    assert token.code == 0, token
    assert "created: agents:read, scenarios:read, scenarios:write, scenarios:run;" in token.stdout
    (pat,) = re.findall(r"^pat_\S+$", token.stdout, re.MULTILINE)

    # CI: the platform token in the environment, no profile.
    ci = {"SPAR_URL": spar_api, "SPAR_TOKEN": pat}
    write(
        tmp_path / "scenarios",
        "judged.yaml",
        """
        name: judged
        tags: [ci]
        turns:
          - user_message: hello
            criteria:
              - question: Was the agent polite?
        """,
    )
    ci_config = tmp_path / "ci-config"
    pushed = spar_here("scenarios", "push", str(tmp_path / "scenarios"), config=ci_config, env=ci)
    assert pushed.code == 0 and "1 created" in pushed.stdout, pushed
    started = spar_here(
        "batch", "run", "--agent", "support", "--tag", "ci", "--no-wait", config=ci_config, env=ci
    )
    assert started.code == 0, started
    assert re.search(
        rf"^results: {spar_api}/ui/orgs/{org_id}/batches/\S{{36}}$", started.stdout, re.MULTILINE
    )
    ran = spar_here(
        "batch",
        "run",
        "--agent",
        "support",
        "--tag",
        "ci",
        "--fail-under",
        "1",
        config=ci_config,
        env=ci,
    )
    assert ran.code == 0, ran
    assert "1 passed, 0 failed, 0 error of 1" in ran.stdout
    assert "pass rate 100%: --fail-under 1 (100%) met, exit 0" in ran.stdout
    assert any(r.header("authorization") == f"Bearer {api_key}" for r in judge.requests)


def test_spar_demo_beside_a_running_spar_prints_the_token_to_sign_in_with(
    spar_api: str, tmp_path: Path
) -> None:
    """``spar demo`` finding a Spar on its port uses it, and still says how to sign in:
    the token it prints opens the results page."""
    port = spar_api.rsplit(":", 1)[1]
    done = spar_here(
        "demo", "--exit", "--port", port, "--data-dir", str(tmp_path / "d"), config=tmp_path
    )
    assert done.code == 0, done
    assert f"using the Spar already running at {spar_api}" in done.stdout
    assert "4 passed, 1 failed, 0 error of 5" in done.stdout
    assert f"sign in at {spar_api}/ui/login with this token:" in done.stdout
    (token,) = re.findall(r"^  (ust_\S+)$", done.stdout, re.MULTILINE)
    with httpx.Client(base_url=spar_api, timeout=30) as http:
        signed_in = http.post("/ui/login", data={"token": token})
        assert signed_in.status_code == 303, signed_in.text
        assert "spar_ui_token" in signed_in.headers["set-cookie"]
        page = http.get(signed_in.headers["location"], follow_redirects=True)
        assert page.status_code == 200 and "/ui/orgs/" in str(page.url), page.url


async def test_the_github_action_leaves_a_summary_junit_and_outputs_and_exits_by_spar_codes(
    client: AsyncTestClient, spar_api: str, shop: ShopAgent, judge: FakeOpenAI, tmp_path: Path
) -> None:
    """The Action's script (.github/actions/spar/run.sh) with the environment action.yml
    gives it and the runner's files (GITHUB_STEP_SUMMARY, GITHUB_OUTPUT): it pushes the
    scenarios, runs the batch, appends the Markdown summary to the job summary, writes
    the JUnit file and the outputs, and exits 0 for a suite that passed, 1 for one that
    failed, 2 for an error; the token appears nowhere."""
    t = await world(client, shop, judge)
    suite(tmp_path / "scenarios")
    step_summary, outputs = tmp_path / "step-summary.md", tmp_path / "outputs"

    def step(**inputs: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        outputs.write_text("")
        given = {
            "url": spar_api,
            "token": t.owner.token,
            "agent": "support-bot",
            "scenarios": str(tmp_path / "scenarios"),
            **inputs,
        }
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SPAR_")},
            # The client's install, as actions/setup-python puts it first on the PATH.
            "PATH": f"{Path(spar_executable()).parent}{os.pathsep}{os.environ['PATH']}",
            "GITHUB_STEP_SUMMARY": str(step_summary),
            "GITHUB_OUTPUT": str(outputs),
            "RUNNER_TEMP": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            **script_env(**given),
        }
        ran = subprocess.run(
            ["bash", str(SCRIPT)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
            check=False,
        )
        written = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
        return ran, written

    passed, written = step(tags="ok", baseline="latest", junit=str(tmp_path / "ok.xml"))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "3 created" in passed.stdout  # spar scenarios push
    assert "no completed batch run of support-bot yet" in passed.stdout  # --baseline latest
    assert (written["exit-code"], written["pass-rate"]) == ("0", "1.0")
    batch_id = written["batch-id"]
    summary = step_summary.read_text()
    assert "### Spar: 1 passed, 0 failed, 0 error of 1 runs (100% passed)" in summary
    assert f"[results page]({spar_api}/ui/orgs/{t.id}/batches/{batch_id})" in summary
    assert Path(written["summary-file"]).read_text() in summary  # noqa: ASYNC240
    assert [c.get("name") for c in check_junit(tmp_path / "ok.xml").findall("testcase")] == [
        "greet"
    ]

    # Two tags, between a comma and a space; two runs of each; the JUnit file by default.
    failed, written = step(tags="smoke, bad", repetitions="2")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "0 created, 0 updated, 0 deleted, 3 unchanged" in failed.stdout
    assert (written["exit-code"], written["pass-rate"]) == ("1", "0.5")
    assert written["batch-id"] != batch_id
    summary = step_summary.read_text()
    assert summary.count("### Spar: ") == 2  # appended to what the job summary had
    assert "### Spar: 2 passed, 2 failed, 0 error of 4 runs (50% passed)" in summary
    assert "2 scenarios x 2 runs" in summary and "pass^1 50%, pass^2 50%" in summary
    assert "<summary>refund: turn 2: 30 days</summary>" in summary
    assert "FAIL: 30 days\n    critique: " in summary
    cases = check_junit(tmp_path / "spar-junit.xml").findall("testcase")
    assert sorted(c.get("name") for c in cases) == ["greet", "refund"]

    # No directory to push: the scenarios already in Spar; an agent failing: exit 2.
    errored, written = step(tags="err", scenarios="", junit="")
    assert errored.returncode == 2, errored.stdout + errored.stderr
    assert "created" not in errored.stdout
    assert written["exit-code"] == "2" and written["pass-rate"] == "0.0"
    for text in (passed.stdout, passed.stderr, failed.stdout, failed.stderr, errored.stdout):
        assert t.owner.token not in text
    assert t.owner.token not in step_summary.read_text() + outputs.read_text()

    # --summary -: the Markdown alone on standard output, the rest on standard error.
    env = {"SPAR_URL": spar_api, "SPAR_TOKEN": t.owner.token}
    out = spar_here(
        "batch", "run", "--agent", "support-bot", "--tag", "ok", "--summary", "-",
        config=tmp_path, env=env,
    )  # fmt: skip
    assert out.code == 0, out
    assert out.stdout.startswith("### Spar: 1 passed, 0 failed, 0 error of 1 runs")
    assert "results: " in out.stderr and "results: " not in out.stdout
    no_wait = spar_here(
        "batch", "run", "--agent", "x", "--tag", "ok", "--summary", "s.md", "--no-wait",
        config=tmp_path, env=env,
    )  # fmt: skip
    assert no_wait.code == 3 and "not with --no-wait" in no_wait.stderr
