"""What ``spar batch run`` shows and writes of a batch, apart from the calls that follow it:
the live progress bar, the table of what did not pass, the judge-trust table, the JUnit
XML and the JSON result files.  Each takes the batch as the API answered it and the
:class:`Outcome` of each of its scenarios.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from uuid import UUID
from xml.etree import ElementTree as ET

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from client.terminal import say
from shared.batches.schemas import BatchRunRead
from shared.calibration.schemas import JudgeTrust

# --- what a scenario's run came to ---------------------------------------------------------------


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


# --- on the terminal ---------------------------------------------------------------------------


@contextmanager
def progress_bar(console: Console, total: int) -> Iterator[Callable[[BatchRunRead], None]]:
    """A live bar of the batch's runs while the block lasts; the function that moves it to
    the batch's counters as they come."""
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tally]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("running", total=total, tally="")

        def show(now: BatchRunRead) -> None:
            tally = (
                f"[green]{now.passed_scenarios} passed[/] [red]{now.failed_scenarios} "
                f"failed[/] [magenta]{now.error_scenarios} error[/]"
            )
            progress.update(
                task, completed=now.completed_scenarios, description=now.status, tally=tally
            )

        yield show


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
    say(
        console,
        f"batch {batch.id} {batch.status}: {batch.passed_scenarios} passed, "
        f"{batch.failed_scenarios} failed, {batch.error_scenarios} error "
        f"of {total} ({rate:.0%} passed)"
        + (f" - {batch.error_message}" if batch.error_message else ""),
    )


def print_trust(console: Console, batch: BatchRunRead) -> None:
    """The batch's judge trust as its results page shows it: the calibrated criteria with
    their corrected pass rates, then the uncalibrated ones with their raw rates only."""
    trust = batch.judge_trust
    if not isinstance(trust, JudgeTrust):
        return
    if trust.status == "computing":
        say(console, "judge trust: still computing (the results page shows it once done)")
        return
    if trust.criteria:
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
    if trust.uncalibrated:
        table = Table(
            title="Uncalibrated: no calibration measured the judge on these (raw pass rates)"
        )
        for column in ("criterion", "raw", "passed", "scenarios"):
            table.add_column(column)
        for u in trust.uncalibrated:
            passed = f"{u.passed} / {u.judged}"
            table.add_row(u.question, f"{u.raw_pass_rate:.0%}", passed, str(u.scenarios))
        console.print(table)
