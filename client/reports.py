r"""What ``spar batch run`` shows and writes of a batch, apart from the calls that follow it:
the live progress bar, the table of what did not pass, pass^k and the flaky scenarios,
the judge-trust table, the comparison with a baseline, the JUnit XML and the JSON result
files.  Each takes the batch as the API answered it and the :class:`Outcome` of each of
its runs.

What an agent says can hold any character: a reply coloured for a terminal
(``\x1b[31m``), a stack trace with control characters.  XML 1.0 cannot hold most of them
(one makes every JUnit reader reject the whole file) and a terminal obeys them, so the
JUnit file and the terminal show each as an escape that reads as what it is
(:func:`shown`); the JSON file keeps the exact text, in JSON's own escapes
(:func:`json_report`).  docs/cli.md says the same to users.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from uuid import UUID
from xml.etree import ElementTree as ET

import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from client.terminal import say
from shared.batches.schemas import BatchComparison, BatchRunRead, RateLimitedRead
from shared.calibration.schemas import JudgeTrust, TrustedCriterion

# --- what a scenario's run came to ---------------------------------------------------------------


@dataclass
class FailedTurn:
    turn_index: int  # from 0, as the API counts; shown from 1, as the results page does
    user_message: str
    response: str
    # (question, verdict, critique) of failed ones; a tool check named by what it checks
    # (shared.scenarios.schemas.criterion_label)
    criteria: list[tuple[str, str, str]]
    tool_calls: list[str] = field(default_factory=list)  # each call on one line


@dataclass
class Outcome:
    """A run of a scenario in the batch and, when it did not pass, why: its failed turns and
    its failed conversation criteria (judged on the whole conversation)."""

    run_id: UUID
    scenario_id: UUID
    scenario: str
    status: str
    passed_turns: int
    total_turns: int
    seconds: float
    error: str | None = None
    failed: list[FailedTurn] = field(default_factory=list)
    # (question, verdict, critique) of each conversation criterion that did not pass (a tool
    # check named by what it checks, as a turn's).
    failed_conversation: list[tuple[str, str, str]] = field(default_factory=list)
    # How its simulated user's conversation ended (None for a scripted scenario).
    simulation_outcome: str | None = None


# --- characters no reader or terminal should be handed raw ---------------------------------------

# XML 1.0 allows no C0 control but tab, LF and CR, no lone surrogate, neither U+FFFE nor
# U+FFFF; a terminal acts on C0 and C1 controls and DEL (ESC starts a colour or moves the
# cursor; a lone CR writes over its line).  Tab and LF are text everywhere.
_UNSHOWABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    r"""``text`` as the JUnit file and the terminal show it: a CR LF line end as LF, and
    every other character of :data:`_UNSHOWABLE` as its Python escape, ESC as the four
    characters ``\x1b`` and a lone surrogate as the six of ``\udc80``.  A reply coloured
    red reads ``\x1b[31mred\x1b[0m``."""
    return _UNSHOWABLE.sub(_escape, text.replace("\r\n", "\n"))


# --- result files --------------------------------------------------------------------------------


def junit_xml(batch: BatchRunRead, found: list[Outcome]) -> bytes:
    """One ``testsuite`` of the batch, one ``testcase`` per scenario.  With one run each: a
    ``failure`` carrying the failed turn, its criterion and the judge's critique; an
    ``error`` for a run that ended in error.  With repetitions, as Maven Surefire writes
    reruns (Jenkins reads them so): a scenario that passed at least once passes, each of
    its other runs a ``flakyFailure`` (or ``flakyError``) — a flaky test; one that never
    passed has its first failed run as the ``failure`` (else its first error as the
    ``error``) and each other run as a ``rerunFailure`` or ``rerunError``."""
    cases = _by_scenario(found)
    failures = sum(1 for runs in cases if _final(runs) == "failure")
    errors = sum(1 for runs in cases if _final(runs) == "error")
    suite = ET.Element(
        "testsuite",
        name=f"spar batch {batch.id}",
        tests=str(len(cases)),
        failures=str(failures),
        errors=str(errors),
        skipped="0",
        time=f"{sum(o.seconds for o in found):.3f}",
        timestamp=(batch.started_at or batch.created_at).strftime("%Y-%m-%dT%H:%M:%S"),
    )
    properties = ET.SubElement(suite, "properties")
    for name in ("id", "agent_id", "agent_name", "status", "repetitions"):
        value = str(getattr(batch, name))
        ET.SubElement(properties, "property", name=f"batch.{name}", value=value)
    for runs in cases:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"spar.{batch.agent_name}",
            name=runs[0].scenario,
            time=f"{sum(o.seconds for o in runs):.3f}",
        )
        final = _final(runs)
        unpassed = [o for o in runs if o.status != "passed"]
        if final == "failure":  # the first failed run stands for the testcase
            unpassed.sort(key=lambda o: o.status != "failed")
        for index, outcome in enumerate(unpassed):
            failed = outcome.status == "failed"
            if final is None:
                tag = "flakyFailure" if failed else "flakyError"
            elif index == 0:
                tag = final
            else:
                tag = "rerunFailure" if failed else "rerunError"
            _result(case, tag, outcome)
        ET.SubElement(case, "system-out").text = "\n".join(f"run {o.run_id}" for o in runs)
    for element in suite.iter():  # every string in the file, whoever wrote it
        element.text = element.text and shown(element.text)
        element.attrib = {name: shown(value) for name, value in element.attrib.items()}
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def first_failure(outcome: Outcome) -> str:
    """What failed first: a turn's criterion, else a conversation criterion."""
    first = outcome.failed[0] if outcome.failed else None
    if first and first.criteria:
        return f"turn {first.turn_index + 1}: {first.criteria[0][0]}"
    if outcome.failed_conversation:
        return f"conversation: {outcome.failed_conversation[0][0]}"
    return "a required turn failed"


def describe_conversation(outcome: Outcome) -> str:
    """The failed conversation criteria of a run as text, with its simulated user's
    outcome."""
    lines = ["the whole conversation"]
    if outcome.simulation_outcome:
        lines.append(f"  simulated user: {outcome.simulation_outcome}")
    for question, verdict, critique in outcome.failed_conversation:
        lines.append(f"  {verdict}: {question}")
        if critique:
            lines.append(f"    critique: {critique}")
    return "\n".join(lines)


def _by_scenario(found: list[Outcome]) -> list[list[Outcome]]:
    """The runs of each scenario, in the order of each scenario's first run."""
    grouped: dict[UUID, list[Outcome]] = {}
    for outcome in found:
        grouped.setdefault(outcome.scenario_id, []).append(outcome)
    return list(grouped.values())


def _final(runs: list[Outcome]) -> str | None:
    """A scenario's outcome as its testcase: ``None`` (passed: at least one run did),
    ``failure`` (none passed, one failed) or ``error`` (every run ended in error)."""
    if any(o.status == "passed" for o in runs):
        return None
    return "failure" if any(o.status == "failed" for o in runs) else "error"


def _result(case: ET.Element, tag: str, outcome: Outcome) -> None:
    """The ``tag`` element of one run that did not pass: its message, type and text; a
    rerun's or a flaky run's text (Surefire's ``rerunType``) in its ``stackTrace``, with
    the run's id as its ``system-out``."""
    if outcome.status == "failed":
        described = [describe_turn(turn) for turn in outcome.failed]
        if outcome.failed_conversation:
            described.append(describe_conversation(outcome))
        message, kind, text = first_failure(outcome), "criterion", "\n\n".join(described)
    else:
        message = outcome.error or outcome.status
        kind, text = outcome.status, outcome.error or ""
    element = ET.SubElement(case, tag, message=message, type=kind)
    if tag in ("failure", "error"):
        element.text = text
        return
    ET.SubElement(element, "stackTrace").text = text
    ET.SubElement(element, "system-out").text = f"run {outcome.run_id}"


def describe_turn(turn: FailedTurn) -> str:
    """A failed turn as text: what the user said, the reply, its tool calls, each failed
    criterion with its critique (the JUnit file's and the Markdown summary's)."""
    lines = [
        f"turn {turn.turn_index + 1}",
        f"  user:  {turn.user_message}",
        f"  agent: {turn.response}",
        *(f"  tool call: {call}" for call in turn.tool_calls),
    ]
    for question, verdict, critique in turn.criteria:
        lines.append(f"  {verdict}: {question}")
        if critique:
            lines.append(f"    critique: {critique}")
    return "\n".join(lines)


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Characters JSON may carry raw but a reader should not be handed raw (a terminal acts on
# DEL and C1 controls; U+FFFE and U+FFFF are no characters to show): written as escapes.
_JSON_ESCAPED = re.compile(r"[\x7f-\x9f\ufffe\uffff]")


def json_report(
    batch: BatchRunRead, found: list[Outcome], comparison: BatchComparison | None = None
) -> str:
    """The batch, every run's outcome and, with a baseline, the comparison with it (without
    each scenario's run summaries), each text exactly as the API gave it: the characters
    of :data:`_UNSHOWABLE` as JSON escapes (``\\u001b``), which every JSON reader turns
    back into them, except a lone surrogate, which is not a character (no UTF-8 file can
    hold it): U+FFFD instead."""
    report: dict[str, object] = {
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
                "simulation_outcome": o.simulation_outcome,
                "failed_conversation_criteria": [
                    {"question": q, "verdict": v, "critique": c}
                    for q, v, c in o.failed_conversation
                ],
                "failed_turns": [
                    {
                        "turn_index": t.turn_index,
                        "user_message": t.user_message,
                        "response": t.response,
                        "tool_calls": t.tool_calls,
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
    if comparison is not None:
        compared = msgspec.to_builtins(comparison)
        compared["a"], compared["b"] = str(comparison.a.id), str(comparison.b.id)
        for row in compared["scenarios"]:
            del row["a"], row["b"]
        report["comparison"] = compared
    encoded = msgspec.json.encode(_characters(msgspec.to_builtins(report)))
    text = msgspec.json.format(encoded, indent=2).decode()
    return _JSON_ESCAPED.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def _characters(value: object) -> object:
    """``value`` (builtins) with each lone surrogate of its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {key: _characters(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_characters(item) for item in value]
    return value


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
            limited = now.rate_limited
            if isinstance(limited, RateLimitedRead):  # the API says so while it lasts
                since = limited.since.astimezone().strftime("%H:%M:%S")
                tally += (
                    f" [yellow]held back by the rate limit of {escape(limited.destination)} "
                    f"({limited.kind} calls) since {since}[/]"
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
            scenario = Text(shown(outcome.scenario))  # Text: markup in a name is no markup
            if outcome.status != "failed":
                error = Text(shown(outcome.error or ""))
                table.add_row(scenario, "", Text(outcome.status, "red"), error)
            for turn in outcome.failed:
                for question, verdict, critique in turn.criteria or [("(required turn)", "", "")]:
                    table.add_row(
                        scenario,
                        str(turn.turn_index + 1),
                        Text(shown(f"{verdict} {question}")),
                        Text(shown(critique)),
                    )
            for question, verdict, critique in outcome.failed_conversation:
                table.add_row(
                    scenario,
                    "whole",
                    Text(shown(f"{verdict} {question} (conversation)")),
                    Text(shown(critique)),
                )
        console.print(table)
    total = batch.total_scenarios
    rate = batch.passed_scenarios / total if total else 0.0
    say(
        console,
        f"batch {batch.id} {batch.status}: {batch.passed_scenarios} passed, "
        f"{batch.failed_scenarios} failed, {batch.error_scenarios} error "
        f"of {total} ({rate:.0%} passed)"
        + (f" - {shown(batch.error_message)}" if batch.error_message else ""),
    )


def corrected_rate(criterion: TrustedCriterion) -> str:
    """A calibrated criterion's corrected pass rate with its 95 % interval, as shown."""
    if criterion.corrected_pass_rate is None or criterion.interval is None:
        return "no better than chance"
    low, high = criterion.interval.low, criterion.interval.high
    return f"{criterion.corrected_pass_rate:.0%} ({low:.0%} to {high:.0%})"


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
            note = Text(shown(f"stale: {c.stale_reason}"), "yellow") if c.stale else ""
            table.add_row(
                Text(shown(c.question)), f"{c.raw_pass_rate:.0%}", corrected_rate(c), note
            )
        console.print(table)
    if trust.uncalibrated:
        table = Table(
            title="Uncalibrated: no calibration measured the judge on these (raw pass rates)"
        )
        for column in ("criterion", "raw", "passed", "scenarios"):
            table.add_column(column)
        for u in trust.uncalibrated:
            passed = f"{u.passed} / {u.judged}"
            table.add_row(
                Text(shown(u.question)), f"{u.raw_pass_rate:.0%}", passed, str(u.scenarios)
            )
        console.print(table)


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def judge_votes_line(batch: BatchRunRead) -> str | None:
    """With judge votes (``judge_repetitions`` above 1), how many and the judge's flip rate
    in a line; else ``None``."""
    if batch.judge_repetitions < 2 or not isinstance(batch.judge_flip_rate, float):
        return None
    return (
        f"judge: {batch.judge_repetitions} votes on each judged criterion; "
        f"{batch.judge_flip_rate:.0%} of them split (its flip rate)"
    )


def reliability_line(batch: BatchRunRead) -> str | None:
    """With repetitions, pass^1..pass^k and pass@k in a line; else ``None``."""
    if batch.repetitions < 2 or not isinstance(batch.pass_hat_k, list):
        return None
    k = batch.repetitions
    hats = ", ".join(f"pass^{j} {_rate(rate)}" for j, rate in enumerate(batch.pass_hat_k, 1))
    at_k = batch.pass_at_k if isinstance(batch.pass_at_k, float) else None
    return f"{k} runs of each scenario: {hats}; pass@{k} {_rate(at_k)}"


def print_reliability(console: Console, batch: BatchRunRead) -> None:
    """With judge votes, the judge's flip rate; with repetitions: pass^1..pass^k, pass@k and
    the flaky scenarios with their passes of their trials."""
    votes = judge_votes_line(batch)
    if votes is not None:
        say(console, votes)
    line = reliability_line(batch)
    if line is None:
        return
    say(console, line)
    scenarios = batch.scenarios if isinstance(batch.scenarios, list) else []
    flaky = [scenario for scenario in scenarios if scenario.flaky]
    if not flaky:
        say(console, "no flaky scenario")
        return
    say(console, f"{len(flaky)} flaky: passed some runs, failed others")
    table = Table(title=f"Flaky scenarios ({len(flaky)})")
    for column in ("scenario", "passed", "errors"):
        table.add_column(column)
    for scenario in flaky:
        passed = f"{scenario.passes} of {scenario.trials}"
        table.add_row(Text(shown(scenario.scenario_name)), passed, str(scenario.errors))
    console.print(table)


def print_comparison(console: Console, comparison: BatchComparison) -> None:
    """The comparison with the baseline (A): each scenario that did not stay unchanged
    with its passes of its trials on each side and the p-value of its regression test,
    then the counts and the pass-rate difference with its interval."""
    baseline = comparison.a
    if baseline.status in ("queued", "running"):
        say(console, f"the baseline {baseline.id} is still running: compared with its runs so far")
    changed = [row for row in comparison.scenarios if row.change != "unchanged"]
    if changed:
        table = Table(title=f"Against the baseline {baseline.id}")
        for column in ("scenario", "change", "baseline", "now", "p-value", ""):
            table.add_column(column)
        for row in changed:
            p_value = "-" if row.p_value is None else f"{row.p_value:.4f}"
            table.add_row(
                Text(shown(row.scenario_name)),
                str(row.change),
                f"{row.a_passes} of {row.a_trials}",
                f"{row.b_passes} of {row.b_trials}",
                p_value,
                Text("significant", "red") if row.significant else "",
            )
        console.print(table)
    say(console, f"against the baseline: {comparison_counts(comparison)}")


def comparison_counts(comparison: BatchComparison) -> str:
    """The regressions (how many significant), the fixes and the pass-rate difference with
    its interval, in a line."""
    regressions = comparison.regressions
    counts = (
        f"{regressions} regression{'' if regressions == 1 else 's'} "
        f"({comparison.significant_regressions} significant, p < 0.05), "
        f"{comparison.fixes} fix{'' if comparison.fixes == 1 else 'es'}"
    )
    difference = comparison.pass_rate_difference
    if difference is not None:
        counts += (
            f"; pass rate {difference.difference:+.1%} (95 % interval {difference.low:+.1%} "
            f"to {difference.high:+.1%}, {difference.pairs} scenarios)"
        )
    return counts
