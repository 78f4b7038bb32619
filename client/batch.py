"""``spar batch run``: a batch run from CI — start it, follow its events, gather what
failed, and an exit code that tells failures from errors.  What it shows and writes (the
progress bar, the table of failures, JUnit and JSON files) is :mod:`client.reports`; the
Markdown summary for a pull request (``--summary``), :mod:`client.summary`.

Exit codes: 0 every scenario passed; 1 a scenario failed (or, with ``--fail-under``, the
pass rate is below it); 2 a scenario ended in error or the batch itself errored (this
wins over 1); 3 a usage, configuration or connection problem.  With a baseline
(``--baseline``), 1 only for a significant regression (or a pass rate under
``--fail-under``): a failure the baseline had too, or a dip within chance, exits 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import click
import httpx
import msgspec
from httpx_sse import connect_sse
from rich.console import Console

from client.api import Api, UsageProblem, output_file
from client.profiles import org_option, profile_option, target
from client.reports import (
    FailedTurn,
    Outcome,
    json_report,
    junit_xml,
    print_comparison,
    print_reliability,
    print_results,
    print_trust,
    progress_bar,
    shown,
)
from client.summary import markdown_summary, write_summary
from client.terminal import make_console, say
from shared.batches.schemas import BatchComparison, BatchRunItemSummary, BatchRunRead
from shared.calibration.schemas import JudgeTrust
from shared.scenarios.schemas import CriterionResultRead, ScenarioRunRead, criterion_label

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


def _seconds(run: ScenarioRunRead | BatchRunItemSummary) -> float:
    if run.started_at is None or run.completed_at is None:
        return 0.0
    return max(0.0, (run.completed_at - run.started_at).total_seconds())


def _named(result: CriterionResultRead) -> str:
    """A criterion as reports name it, with the judge's votes when it voted more than once
    (``Polite? (votes 1 to 2)``, an en dash between: PASS then FAIL)."""
    label = criterion_label(result.criteria_type, result.question)
    votes = result.votes
    if votes and sum(votes.values()) > 1:
        label += f" (votes {votes.get('PASS', 0)}\N{EN DASH}{votes.get('FAIL', 0)})"
    return label


def outcomes(api: Api, batch: BatchRunRead) -> list[Outcome]:
    """Every run of the batch; the failed and errored ones with their failed turns."""
    found = []
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
        outcome.simulation_outcome = run.simulation_outcome
        outcome.failed_conversation = [
            (_named(c), c.verdict, c.critique)
            for c in run.conversation_results or []
            if c.verdict != "PASS"
        ]
        for turn in run.turn_results or []:
            if turn.passed or turn.status == "skipped":
                continue
            outcome.failed.append(
                FailedTurn(
                    turn_index=turn.turn_index,
                    user_message=turn.user_message,
                    response=turn.response_content,
                    # Each result names what it asked (the run's own copy of the
                    # scenario): the scenario may have been edited or deleted since.
                    criteria=[
                        (_named(c), c.verdict, c.critique)
                        for c in turn.criteria_results
                        if c.verdict != "PASS"
                    ],
                    tool_calls=[call.compact() for call in turn.tool_calls],
                )
            )
    return found


# --- the command -------------------------------------------------------------------------------


def pass_rate(batch: BatchRunRead) -> float:
    return batch.passed_scenarios / batch.total_scenarios if batch.total_scenarios else 1.0


def exit_code(
    batch: BatchRunRead,
    found: list[Outcome],
    fail_under: float | None,
    comparison: BatchComparison | None = None,
) -> int:
    """2 for any error; with a ``comparison`` (a baseline), 1 only for a significant
    regression or a pass rate under ``fail_under``; else 1 for a pass rate under
    ``fail_under``, or without it for any failure."""
    if batch.status == "error" or any(o.status not in ("passed", "failed") for o in found):
        return EXIT_ERROR
    if fail_under is not None and pass_rate(batch) < fail_under:
        return EXIT_FAILED
    if comparison is not None:
        return EXIT_FAILED if comparison.significant_regressions else EXIT_PASSED
    if fail_under is not None:
        return EXIT_PASSED
    return EXIT_FAILED if any(o.status == "failed" for o in found) else EXIT_PASSED


def baseline_verdict(comparison: BatchComparison | None, code: int) -> str | None:
    """What decided the exit code, with a baseline."""
    if comparison is None:
        return None
    if code == EXIT_ERROR:
        return "errors exit 2, whatever the comparison"
    count = comparison.significant_regressions
    if count:
        regressions = "regression" if count == 1 else "regressions"
        return f"{count} significant {regressions} (p < 0.05) against the baseline: exit {code}"
    return f"no significant regression against the baseline: exit {code}"


def resolve_baseline(api: Api, baseline: str, agent_id: str) -> str | None:
    """The baseline's id: ``latest`` is the organization's most recent completed batch of
    the agent (``None`` when it has none yet); anything else is taken as a batch id."""
    if baseline != "latest":
        return baseline
    path = api.path("scenarios/batch-runs")
    query = {"agent_id": agent_id, "status": "completed"}
    total = api.call("GET", path, params={**query, "limit": 1})["total"]
    if not total:
        return None
    last = api.call("GET", path, params={**query, "limit": 1, "offset": total - 1})
    return str(last["batch_runs"][0]["id"])


def threshold_verdict(batch: BatchRunRead, code: int, fail_under: float | None) -> str | None:
    """What decided the exit code, when ``--fail-under`` was given: whether the threshold
    was met, and that errors exit 2 whatever the rate."""
    if fail_under is None:
        return None
    rate, threshold = pass_rate(batch), f"--fail-under {fail_under:g} ({fail_under:.0%})"
    if code == EXIT_ERROR:
        return f"pass rate {rate:.0%}; not measured against {threshold}: errors exit 2"
    met = "met" if code == EXIT_PASSED else "not met"
    return f"pass rate {rate:.0%}: {threshold} {met}, exit {code}"


@click.group("batch")
def batch() -> None:
    """Batch runs."""


judge_repetitions_option = click.option(
    "--judge-repetitions",
    type=click.IntRange(1, 5),
    metavar="M",
    help="Have the judge decide each LLM-judged criterion M times (1 to 5) on the same "
    "conversation and keep the majority (a tie fails): the results give the votes and the "
    "judge's flip rate (the share of judged criteria whose votes split), its noise apart from "
    "the agent's.  Default 1 (a replay: as the replayed batch).",
)


@batch.command("run")
@click.option(
    "--agent",
    required=True,
    metavar="NAME|ID",
    help="The agent to run against, by name or id (the REST API's run and batch-run "
    "endpoints take only its agent_id: the CLI looks the name up).",
)
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
    help="Follow the batch to its end (progress bar, results, exit code), or only start it "
    "and print the link to its results page.",
)
@click.option(
    "--fail-under",
    type=click.FloatRange(0.0, 1.0),
    metavar="RATE",
    help="Exit 1 only when the share of runs passed is below RATE (0 to 1).",
)
@click.option(
    "--repetitions",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    metavar="K",
    help="Run each scenario K times (1 to 20), each run its own conversation: the results "
    "give each scenario's passes of its trials, pass^1..pass^K and the flaky scenarios (some "
    "runs passed, some failed); JUnit marks a flaky scenario with flakyFailure elements.",
)
@click.option(
    "--baseline",
    metavar="ID|latest",
    help="Compare with this batch run (its id), or with `latest`: the organization's most "
    "recent completed batch run of the same agent (when there is none yet, the batch runs "
    "without a baseline, and says so).  With a baseline, exit 1 only for a significant "
    "regression: a scenario whose pass rate fell with p < 0.05 (one-sided Fisher exact "
    "test on its trials; use --repetitions: with one run a side nothing is significant), "
    "or a pass rate under --fail-under; errors still exit 2.  The table shows each changed "
    "scenario's p-value.",
)
@judge_repetitions_option
@output_file("--junit", "junit_path", "Write JUnit XML: one testcase per scenario.")
@output_file("--json", "json_path", "Write the batch and every scenario's outcome as JSON.")
@output_file(
    "--summary",
    "summary_path",
    "Write a summary in GitHub Markdown, for a pull-request comment or $GITHUB_STEP_SUMMARY "
    "(at most 60,000 characters; `-`: standard output, the rest of the output then going "
    "to standard error).",
)
@profile_option
@org_option
def run(
    agent: str,
    tags: tuple[str, ...],
    scenario_names: tuple[str, ...],
    concurrency: int,
    wait: bool,
    fail_under: float | None,
    repetitions: int,
    baseline: str | None,
    judge_repetitions: int | None,
    junit_path: Path | None,
    json_path: Path | None,
    summary_path: Path | None,
    profile: str | None,
    org: str | None,
) -> None:
    """Run scenarios (by --tag and/or --scenario) against an agent as one batch, follow it
    with a progress bar, then print what failed and the link to the results page.  Exit
    0 all passed, 1 any failed (or the pass rate under --fail-under; with --baseline, only
    a significant regression), 2 any error, 3 usage or connection problems.  The agent and
    the scenarios are named as in the files (the REST API takes their ids)."""
    if not tags and not scenario_names:
        raise click.UsageError("give --tag or --scenario (or both)")
    if summary_path is not None and not wait:
        raise click.UsageError("--summary summarizes the batch at its end: not with --no-wait")
    api = Api(target(profile, org))
    try:
        code = run_batch(
            api,
            agent=agent,
            tags=list(tags),
            scenario_names=list(scenario_names),
            concurrency=concurrency,
            wait=wait,
            fail_under=fail_under,
            repetitions=repetitions,
            baseline=baseline,
            judge_repetitions=judge_repetitions,
            junit_path=junit_path,
            json_path=json_path,
            summary_path=summary_path,
            console=make_console(stderr=str(summary_path) == "-"),
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
    repetitions: int = 1,
    baseline: str | None = None,
    judge_repetitions: int | None = None,
    replay_of: str | None = None,
    junit_path: Path | None = None,
    json_path: Path | None = None,
    summary_path: Path | None = None,
    console: Console | None = None,
) -> int:
    """Start the batch (with ``replay_of``, a replay of that batch) and, with ``wait``,
    follow it to its end; the exit code."""
    console = console or make_console()
    chosen = api.resolve_agent(agent)
    baseline_id = resolve_baseline(api, baseline, chosen["id"]) if baseline else None
    if baseline and baseline_id is None:
        say(
            console,
            f"no completed batch run of {shown(chosen['name'])} yet: running without a "
            "baseline (exit 1 for any failure)",
        )
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
        "repetitions": repetitions,
    }
    if baseline_id is not None:
        body["baseline_batch_id"] = baseline_id
    if judge_repetitions is not None:
        body["judge_repetitions"] = judge_repetitions
    if replay_of is None:
        made = api.read(api.path("scenarios/batch-runs"), BatchRunRead, method="POST", json=body)
    else:
        options = {k: v for k, v in body.items() if k == "judge_repetitions"}
        replay = api.path(f"scenarios/batch-runs/{replay_of}/replay")
        made = api.read(replay, BatchRunRead, method="POST", json=options)
        say(console, f"replaying batch {replay_of}: its conversations judged again, no agent call")
    scenarios = made.total_scenarios // made.repetitions
    runs = f" x {made.repetitions} runs" if made.repetitions > 1 else ""
    say(
        console,
        f"batch {made.id}: {scenarios} scenarios{runs} against {shown(chosen['name'])}"
        + (f", compared with batch {baseline_id}" if baseline_id else ""),
    )
    link = f"{api.url}/ui/orgs/{api.org}/batches/{made.id}"
    results = f"results: {link}"
    if not wait:
        say(console, results)
        return EXIT_PASSED
    with progress_bar(console, made.total_scenarios) as show:
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
    comparison = None
    if baseline_id is not None:
        comparison = api.read(
            api.path("scenarios/batch-runs/compare"),
            BatchComparison,
            params={"a": baseline_id, "b": str(made.id)},
        )
    print_results(console, detail, found)
    print_reliability(console, detail)
    print_trust(console, detail)
    if comparison is not None:
        print_comparison(console, comparison)
    if junit_path is not None:
        junit_path.write_bytes(junit_xml(detail, found))
        say(console, f"JUnit XML: {junit_path}")
    if json_path is not None:
        json_path.write_text(json_report(detail, found, comparison))
        say(console, f"JSON: {json_path}")
    if summary_path is not None:
        write_summary(summary_path, markdown_summary(detail, found, link, comparison))
    say(console, results)
    code = exit_code(detail, found, fail_under, comparison)
    for verdict in (
        threshold_verdict(detail, code, fail_under),
        baseline_verdict(comparison, code),
    ):
        if verdict is not None:
            say(console, verdict)
    return code


@batch.command("replay")
@click.argument("batch_id", metavar="ID")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Follow the replay to its end (progress bar, results, exit code), or only start it "
    "and print the link to its results page.",
)
@click.option(
    "--fail-under",
    type=click.FloatRange(0.0, 1.0),
    metavar="RATE",
    help="Exit 1 only when the share of runs passed is below RATE (0 to 1).",
)
@judge_repetitions_option
@output_file("--junit", "junit_path", "Write JUnit XML: one testcase per scenario.")
@output_file("--json", "json_path", "Write the batch and every scenario's outcome as JSON.")
@profile_option
@org_option
def replay(
    batch_id: str,
    wait: bool,
    fail_under: float | None,
    judge_repetitions: int | None,
    junit_path: Path | None,
    json_path: Path | None,
    profile: str | None,
    org: str | None,
) -> None:
    """Judge a completed batch run's conversations again, as stored, with the scenarios'
    criteria as they are now and the agent's current judge: neither the agent nor the
    simulated user is called.  The new batch is followed like `spar batch run`'s, with the
    same results, files and exit codes (a scenario whose scripted turns changed in number,
    or that was deleted, is an error: "scenario changed")."""
    api = Api(target(profile, org))
    try:
        source = api.read(api.path(f"scenarios/batch-runs/{batch_id}"), BatchRunRead)
        code = run_batch(
            api,
            agent=str(source.agent_id),
            tags=[],
            scenario_names=[],
            concurrency=source.max_concurrency,
            wait=wait,
            fail_under=fail_under,
            judge_repetitions=judge_repetitions,
            replay_of=str(source.id),
            junit_path=junit_path,
            json_path=json_path,
        )
    finally:
        api.close()
    raise SystemExit(code)
