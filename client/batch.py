"""``spar batch run``: a batch run from CI — a live progress bar, a table of what failed,
JUnit and JSON result files, and an exit code that tells failures from errors.

Exit codes: 0 every scenario passed; 1 a scenario failed (or, with ``--fail-under``, the
pass rate is below it); 2 a scenario ended in error or the batch itself errored (this
wins over 1); 3 a usage, configuration or connection problem.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID
from xml.etree import ElementTree as ET

import click
import httpx
import msgspec
from httpx_sse import connect_sse
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from api.cli.client import Api, UsageProblem, profile_option, target
from shared.batches.schemas import BatchRunItemSummary, BatchRunRead
from shared.calibration.schemas import JudgeTrust
from shared.scenarios.schemas import ScenarioRead, ScenarioRunRead

EXIT_PASSED, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
RECONNECTS = 20  # consecutive failed reconnections before giving up
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
TRUST_WAIT_S = 5.0  # how long to wait for the judge trust once the batch is over


# --- following a batch: its Server-Sent Events, reconnecting when the stream drops -------------


def follow(api: Api, batch_id: UUID, on_progress: Callable[[BatchRunRead], None]) -> BatchRunRead:
    """Follow the batch's event stream until its ``end``, calling ``on_progress`` with each
    ``progress``.  A stream that drops, times out or meets a 5xx (a proxy, an API replica
    restarting) is opened again: each new stream starts with the current counters, so
    nothing is missed.  The batch as the last event gave it."""
    path = api.path(f"scenarios/batch-runs/{batch_id}/events")
    failures = 0
    while True:
        try:
            with connect_sse(
                api.http, "GET", path, timeout=httpx.Timeout(30.0, read=60.0)
            ) as source:
                status = source.response.status_code
                if 400 <= status < 500:
                    source.response.read()
                    api.call("GET", api.path(f"scenarios/batch-runs/{batch_id}"))  # says why
                    raise UsageProblem(f"the event stream answered {status}")
                if status < 400:
                    for sse in source.iter_sse():
                        failures = 0
                        if sse.event in ("progress", "end"):
                            batch = msgspec.json.decode(sse.data, type=BatchRunRead)
                            on_progress(batch)
                            if sse.event == "end":
                                return batch
        except httpx.HTTPError:
            pass
        failures += 1  # the stream ended or broke without its ``end``
        if failures > RECONNECTS:
            raise UsageProblem(f"lost the event stream of batch {batch_id} and could not reconnect")
        time.sleep(BACKOFF_S[min(failures - 1, len(BACKOFF_S) - 1)])


# --- what failed -------------------------------------------------------------------------------


@dataclass
class FailedTurn:
    turn_index: int  # from 0, as the API counts; shown from 1, as the results page does
    user_message: str
    response: str
    criteria: list[tuple[str, str, str]]  # (question, verdict, critique) of failed ones


@dataclass
class Outcome:
    """A scenario's run in the batch and, when it did not pass, why."""

    run_id: UUID
    scenario_id: UUID
    scenario: str
    status: str
    passed_turns: int
    total_turns: int
    seconds: float
    error: str | None = None
    failed: list[FailedTurn] = field(default_factory=list)


def _seconds(run: ScenarioRunRead | BatchRunItemSummary) -> float:
    if run.started_at is None or run.completed_at is None:
        return 0.0
    return max(0.0, (run.completed_at - run.started_at).total_seconds())


def outcomes(api: Api, batch: BatchRunRead) -> list[Outcome]:
    """Every run of the batch; the failed and errored ones with their failed turns."""
    found = []
    questions: dict[UUID, dict[UUID, str]] = {}
    for summary in batch.runs or []:
        outcome = Outcome(
            run_id=summary.id,
            scenario_id=summary.scenario_id,
            scenario=summary.scenario_name,
            status=summary.status,
            passed_turns=summary.passed_turns,
            total_turns=summary.total_turns,
            seconds=_seconds(summary),
        )
        found.append(outcome)
        if summary.status == "passed":
            continue
        run = api.read(api.path(f"scenarios/runs/{summary.id}"), ScenarioRunRead)
        outcome.error = run.error_message
        if summary.scenario_id not in questions:
            try:
                scenario = api.read(api.path(f"scenarios/{summary.scenario_id}"), ScenarioRead)
                turns = scenario.turns
            except UsageProblem:  # deleted since: criteria are shown by id
                turns = []
            questions[summary.scenario_id] = {c.id: c.question for t in turns for c in t.criteria}
        asked = questions[summary.scenario_id]
        for turn in run.turn_results or []:
            if turn.passed or turn.status == "skipped":
                continue
            outcome.failed.append(
                FailedTurn(
                    turn_index=turn.turn_index,
                    user_message=turn.user_message,
                    response=turn.response_content,
                    criteria=[
                        (asked.get(c.criteria_id, str(c.criteria_id)), c.verdict, c.critique)
                        for c in turn.criteria_results
                        if c.verdict != "PASS"
                    ],
                )
            )
    return found


# --- result files --------------------------------------------------------------------------------


def junit_xml(batch: BatchRunRead, found: list[Outcome]) -> bytes:
    """One ``testsuite`` of the batch, one ``testcase`` per scenario: a ``failure`` carrying
    the failed turn, its criterion and the judge's critique; an ``error`` for a run that
    ended in error."""
    failures = sum(1 for o in found if o.status == "failed")
    errors = sum(1 for o in found if o.status not in ("passed", "failed"))
    suite = ET.Element(
        "testsuite",
        name=f"spar batch {batch.id}",
        tests=str(len(found)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{sum(o.seconds for o in found):.3f}",
        timestamp=(batch.started_at or batch.created_at).strftime("%Y-%m-%dT%H:%M:%S"),
    )
    properties = ET.SubElement(suite, "properties")
    for name in ("id", "agent_id", "agent_name", "status"):
        value = str(getattr(batch, name))
        ET.SubElement(properties, "property", name=f"batch.{name}", value=value)
    for outcome in found:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"spar.{batch.agent_name}",
            name=outcome.scenario,
            time=f"{outcome.seconds:.3f}",
        )
        if outcome.status == "failed":
            first = outcome.failed[0] if outcome.failed else None
            message = (
                f"turn {first.turn_index + 1}: {first.criteria[0][0]}"
                if first and first.criteria
                else "a required turn failed"
            )
            failure = ET.SubElement(case, "failure", message=message, type="criterion")
            failure.text = "\n\n".join(_describe(turn) for turn in outcome.failed)
        elif outcome.status != "passed":
            error = ET.SubElement(
                case, "error", message=outcome.error or outcome.status, type=outcome.status
            )
            error.text = outcome.error or ""
        ET.SubElement(case, "system-out").text = f"run {outcome.run_id}"
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def _describe(turn: FailedTurn) -> str:
    lines = [
        f"turn {turn.turn_index + 1}",
        f"  user:  {turn.user_message}",
        f"  agent: {turn.response}",
    ]
    for question, verdict, critique in turn.criteria:
        lines.append(f"  {verdict}: {question}")
        if critique:
            lines.append(f"    critique: {critique}")
    return "\n".join(lines)


def json_report(batch: BatchRunRead, found: list[Outcome]) -> str:
    report = {
        "batch": msgspec.structs.replace(batch, runs=msgspec.UNSET),
        "scenarios": [
            {
                "run_id": o.run_id,
                "scenario_id": o.scenario_id,
                "scenario": o.scenario,
                "status": o.status,
                "passed_turns": o.passed_turns,
                "total_turns": o.total_turns,
                "error": o.error,
                "failed_turns": [
                    {
                        "turn_index": t.turn_index,
                        "user_message": t.user_message,
                        "response": t.response,
                        "criteria": [
                            {"question": q, "verdict": v, "critique": c} for q, v, c in t.criteria
                        ],
                    }
                    for t in o.failed
                ],
            }
            for o in found
        ],
    }
    return msgspec.json.format(msgspec.json.encode(report), indent=2).decode()


# --- the command -------------------------------------------------------------------------------


def exit_code(batch: BatchRunRead, found: list[Outcome], fail_under: float | None) -> int:
    if batch.status == "error" or any(o.status not in ("passed", "failed") for o in found):
        return EXIT_ERROR
    if fail_under is not None:
        rate = batch.passed_scenarios / batch.total_scenarios if batch.total_scenarios else 1.0
        return EXIT_FAILED if rate < fail_under else EXIT_PASSED
    return EXIT_FAILED if any(o.status == "failed" for o in found) else EXIT_PASSED


def print_results(console: Console, batch: BatchRunRead, found: list[Outcome]) -> None:
    bad = [o for o in found if o.status != "passed"]
    if bad:
        table = Table(title="Scenarios that did not pass", show_lines=True, expand=True)
        table.add_column("scenario", ratio=2)
        table.add_column("turn", justify="right")
        table.add_column("criterion", ratio=3)
        table.add_column("critique", ratio=4)
        for outcome in bad:
            if outcome.status != "failed":
                table.add_row(outcome.scenario, "", Text(outcome.status, "red"), outcome.error)
            for turn in outcome.failed:
                for question, verdict, critique in turn.criteria or [("(required turn)", "", "")]:
                    table.add_row(
                        outcome.scenario,
                        str(turn.turn_index + 1),
                        f"{verdict} {question}",
                        critique,
                    )
        console.print(table)
    total = batch.total_scenarios
    rate = batch.passed_scenarios / total if total else 0.0
    console.print(
        f"batch {batch.id} {batch.status}: {batch.passed_scenarios} passed, "
        f"{batch.failed_scenarios} failed, {batch.error_scenarios} error "
        f"of {total} ({rate:.0%} passed)"
        + (f" - {batch.error_message}" if batch.error_message else ""),
        markup=False,
    )


def print_trust(console: Console, batch: BatchRunRead) -> None:
    trust = batch.judge_trust
    if not isinstance(trust, JudgeTrust) or trust.status != "ready" or not trust.criteria:
        return
    table = Table(title="Pass rates with the judge's measured error taken out")
    for column in ("criterion", "raw", "corrected (95 % interval)", ""):
        table.add_column(column)
    for c in trust.criteria:
        if c.corrected_pass_rate is None or c.interval is None:
            corrected = "no better than chance"
        else:
            low, high = c.interval.low, c.interval.high
            corrected = f"{c.corrected_pass_rate:.0%} ({low:.0%} to {high:.0%})"
        note = Text(f"stale: {c.stale_reason}", "yellow") if c.stale else ""
        table.add_row(c.question, f"{c.raw_pass_rate:.0%}", corrected, note)
    console.print(table)


@click.group("batch")
def batch() -> None:
    """Batch runs."""


@batch.command("run")
@click.option("--agent", required=True, metavar="NAME|ID", help="The agent to run against.")
@click.option(
    "--tag", "tags", multiple=True, metavar="TAG", help="Run scenarios with this tag (repeatable)."
)
@click.option(
    "--scenario",
    "scenario_names",
    multiple=True,
    metavar="NAME",
    help="Run the scenario of this name (repeatable).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 100),
    default=10,
    show_default=True,
    help="Runs in flight at once.",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Follow the batch to its end (progress bar, results, exit code), or only start it.",
)
@click.option(
    "--fail-under",
    type=click.FloatRange(0.0, 1.0),
    metavar="RATE",
    help="Exit 1 only when the share of scenarios passed is below RATE (0 to 1).",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write JUnit XML: one testcase per scenario.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the batch and every scenario's outcome as JSON.",
)
@profile_option
def run(
    agent: str,
    tags: tuple[str, ...],
    scenario_names: tuple[str, ...],
    concurrency: int,
    wait: bool,
    fail_under: float | None,
    junit_path: Path | None,
    json_path: Path | None,
    profile: str | None,
) -> None:
    """Run scenarios (by --tag and/or --scenario) against an agent as one batch, follow it
    with a progress bar, then print what failed.  Exit 0 all passed, 1 any failed (or the
    pass rate under --fail-under), 2 any error, 3 usage or connection problems."""
    if not tags and not scenario_names:
        raise click.UsageError("give --tag or --scenario (or both)")
    api = Api(target(profile))
    try:
        code = run_batch(
            api,
            agent=agent,
            tags=list(tags),
            scenario_names=list(scenario_names),
            concurrency=concurrency,
            wait=wait,
            fail_under=fail_under,
            junit_path=junit_path,
            json_path=json_path,
        )
    finally:
        api.close()
    raise SystemExit(code)


def run_batch(
    api: Api,
    *,
    agent: str,
    tags: list[str],
    scenario_names: list[str],
    concurrency: int,
    wait: bool = True,
    fail_under: float | None = None,
    junit_path: Path | None = None,
    json_path: Path | None = None,
    console: Console | None = None,
) -> int:
    """Start the batch and, with ``wait``, follow it to its end; the exit code."""
    console = console or Console(highlight=False)
    chosen = api.resolve_agent(agent)
    ids: list[str] = []
    if scenario_names:
        by_name = {s["name"]: s["id"] for s in api.pages("scenarios", "scenarios")}
        unknown = [n for n in scenario_names if n not in by_name]
        if unknown:
            raise UsageProblem(f"no scenario named {', '.join(map(repr, unknown))}")
        ids = [by_name[n] for n in scenario_names]
    body = {
        "agent_id": chosen["id"],
        "scenario_ids": ids,
        "tags": tags,
        "max_concurrency": concurrency,
    }
    made = api.read(api.path("scenarios/batch-runs"), BatchRunRead, method="POST", json=body)
    console.print(
        f"batch {made.id}: {made.total_scenarios} scenarios against {chosen['name']}",
        markup=False,
    )
    if not wait:
        return EXIT_PASSED
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tally]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("running", total=made.total_scenarios, tally="")

        def show(now: BatchRunRead) -> None:
            tally = (
                f"[green]{now.passed_scenarios} passed[/] [red]{now.failed_scenarios} "
                f"failed[/] [magenta]{now.error_scenarios} error[/]"
            )
            progress.update(
                task, completed=now.completed_scenarios, description=now.status, tally=tally
            )

        follow(api, made.id, show)
    detail_path = api.path(f"scenarios/batch-runs/{made.id}")
    detail = api.read(detail_path, BatchRunRead)
    deadline = time.monotonic() + TRUST_WAIT_S
    while isinstance(detail.judge_trust, JudgeTrust) and detail.judge_trust.status == "computing":
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
        detail = api.read(detail_path, BatchRunRead)
    found = outcomes(api, detail)
    print_results(console, detail, found)
    print_trust(console, detail)
    if junit_path is not None:
        junit_path.write_bytes(junit_xml(detail, found))
        console.print(f"JUnit XML: {junit_path}")
    if json_path is not None:
        json_path.write_text(json_report(detail, found))
        console.print(f"JSON: {json_path}")
    console.print(f"results: {api.url}/ui/orgs/{api.org}/batches/{detail.id}", markup=False)
    return exit_code(detail, found, fail_under)
