"""What ``spar batch run`` writes of text no XML 1.0 document can hold and no terminal
should be handed: every such character, including those a live batch cannot bring (a lone
surrogate, U+FFFE, NUL, which PostgreSQL refuses), in the JUnit file, the JSON file and the
table.  tests/e2e/test_cli.py runs the same on a real batch."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import xmlschema
from junitparser import xunit2
from lxml import etree
from rich.console import Console

from client.batch import baseline_verdict, exit_code
from client.reports import (
    FailedTurn,
    Outcome,
    json_report,
    junit_xml,
    print_comparison,
    print_reliability,
    print_results,
    shown,
)
from shared.batches.schemas import (
    BatchComparison,
    BatchRunRead,
    Change,
    PassRateDifference,
    ScenarioComparison,
    ScenarioTrials,
)
from shared.scenarios.schemas import criterion_label

JUNIT_XSD = Path(__file__).parent.parent / "support" / "junit-10.xsd"
# Every kind: C0 controls (NUL, BEL, ESC, a lone CR), DEL, a C1 control (CSI), a lone
# surrogate, the two non-characters; and what stays: tab, LF, a CR LF line end, é, ✓.
AWKWARD = "\x00\x07\x1b[31mred\x1b[0m a\rb \x7f \x9b \udc80 \ufffe \uffff\tc\r\nd é ✓"
SHOWN = "\\x00\\x07\\x1b[31mred\\x1b[0m a\\x0db \\x7f \\x9b \\udc80 \\ufffe \\uffff\tc\nd é ✓"


def batch() -> BatchRunRead:
    now = datetime.now(UTC)
    return BatchRunRead(
        id=uuid.uuid4(),
        organization_id=uuid.uuid4(),
        agent_id=uuid.uuid4(),
        agent_name="bot \x1b[1m",
        status="completed",
        total_scenarios=2,
        completed_scenarios=2,
        passed_scenarios=0,
        failed_scenarios=1,
        error_scenarios=1,
        max_concurrency=2,
        started_at=now,
        completed_at=now,
        created_at=now,
        updated_at=now,
    )


def outcomes() -> list[Outcome]:
    failed = Outcome(
        run_id=uuid.uuid4(),
        scenario_id=uuid.uuid4(),
        scenario="[bold]colour\x1b",
        status="failed",
        passed_turns=0,
        total_turns=1,
        seconds=1.5,
        failed=[FailedTurn(0, "hi\x1b", AWKWARD, [("green?\x07", "FAIL", f"said {AWKWARD}")])],
    )
    errored = Outcome(
        run_id=uuid.uuid4(),
        scenario_id=uuid.uuid4(),
        scenario="crash",
        status="error",
        passed_turns=0,
        total_turns=1,
        seconds=0.5,
        error=f"agent answered HTTP 500: {AWKWARD} [/]",
    )
    return [failed, errored]


def test_shown_escapes_what_xml_or_a_terminal_cannot_take_and_keeps_the_rest() -> None:
    assert shown(AWKWARD) == SHOWN
    assert shown("plain text, [brackets] and a\ttab\n") == "plain text, [brackets] and a\ttab\n"


def test_junit_holds_every_character_as_its_escape_and_stays_valid(tmp_path: Path) -> None:
    path = tmp_path / "out.xml"
    path.write_bytes(junit_xml(batch(), outcomes()))
    document = etree.parse(str(path))
    etree.XMLSchema(etree.parse(str(JUNIT_XSD))).assertValid(document)
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(path))
    failure, error = document.find("testcase/failure"), document.find("testcase/error")
    assert f"agent: {SHOWN}" in failure.text
    assert failure.get("message") == "turn 1: green?\\x07"
    assert error.get("message") == f"agent answered HTTP 500: {SHOWN} [/]"
    assert document.find("testcase").get("classname") == "spar.bot \\x1b[1m"


def test_json_keeps_the_exact_text_in_escapes_and_replaces_only_lone_surrogates() -> None:
    text = json_report(batch(), outcomes())
    assert all(ch.isprintable() or ch in "\n" for ch in text)  # nothing raw, U+FFFD aside
    body = json.loads(text)
    response = body["scenarios"][0]["failed_turns"][0]["response"]
    assert response == AWKWARD.replace("\udc80", "\ufffd")
    assert body["batch"]["agent_name"] == "bot \x1b[1m"


def test_the_table_shows_escapes_and_brackets_as_text() -> None:
    out = io.StringIO()
    print_results(Console(file=out, width=400, highlight=False), batch(), outcomes())
    printed = out.getvalue()
    assert not any(ch in printed for ch in "\x00\x07\x1b\x7f\x9b\r")
    assert "[bold]colour\\x1b" in printed and "[/]" in printed
    assert "\\x1b[31mred\\x1b[0m" in printed


def test_a_failed_tool_check_is_named_by_what_it_checks_beside_the_calls_seen() -> None:
    critique = "refund_order was not called; calls seen: lookup_order"
    outcome = Outcome(
        run_id=uuid.uuid4(),
        scenario_id=uuid.uuid4(),
        scenario="refunds",
        status="failed",
        passed_turns=0,
        total_turns=1,
        seconds=1.0,
        failed=[
            FailedTurn(
                0,
                "Refund AB-1",
                "Looking into it.",
                [(criterion_label("tool_called", "refund_order"), "FAIL", critique)],
                tool_calls=['lookup_order({"order_id":"AB-1"}) -> {"total":40}'],
            )
        ],
    )
    failure = etree.fromstring(junit_xml(batch(), [outcome])).find("testcase/failure")
    assert failure.get("message") == "turn 1: tool_called refund_order"
    assert failure.text == (
        "turn 1\n  user:  Refund AB-1\n  agent: Looking into it.\n"
        '  tool call: lookup_order({"order_id":"AB-1"}) -> {"total":40}\n'
        f"  FAIL: tool_called refund_order\n    critique: {critique}"
    )
    out = io.StringIO()
    print_results(Console(file=out, width=400, highlight=False), batch(), [outcome])
    assert "FAIL tool_called refund_order" in out.getvalue() and critique in out.getvalue()
    (turn,) = json.loads(json_report(batch(), [outcome]))["scenarios"][0]["failed_turns"]
    assert turn["tool_calls"] == ['lookup_order({"order_id":"AB-1"}) -> {"total":40}']
    # The other types keep their question as their name.
    assert criterion_label("contains", "refund") == "refund"
    assert criterion_label("llm_evaluated", "Polite?") == "Polite?"


# --- repetitions and a baseline ------------------------------------------------------------------


def run(scenario_id: uuid.UUID, name: str, status: str) -> Outcome:
    """One run of a scenario that passed, failed (on its first turn) or errored."""
    failed = (
        [FailedTurn(0, "hi", "no", [("polite?", "FAIL", "curt")])] if status == "failed" else []
    )
    return Outcome(
        run_id=uuid.uuid4(),
        scenario_id=scenario_id,
        scenario=name,
        status=status,
        passed_turns=int(status == "passed"),
        total_turns=1,
        seconds=1.0,
        error="agent answered HTTP 503" if status == "error" else None,
        failed=failed,
    )


def repeated() -> list[Outcome]:
    """Four scenarios of a batch run with repetitions, their runs interleaved as a batch
    runs them: one flaky, one that never passed, one that always errored, one fine."""
    flaky, broken, down, fine = (uuid.uuid4() for _ in range(4))
    runs = []
    for statuses in (
        ("passed", "error", "error", "passed"),
        ("failed", "failed", "error", "passed"),
        ("passed", "failed", "error", "passed"),
        ("failed", "error", "error", "passed"),
    ):
        for scenario, name, status in zip(
            (flaky, broken, down, fine), ("flaky", "broken", "down", "fine"), statuses, strict=True
        ):
            runs.append(run(scenario, name, status))
    return runs


def test_junit_marks_repeated_scenarios_as_surefire_marks_reruns(tmp_path: Path) -> None:
    path = tmp_path / "out.xml"
    path.write_bytes(junit_xml(batch(), repeated()))
    document = etree.parse(str(path))
    etree.XMLSchema(etree.parse(str(JUNIT_XSD))).assertValid(document)
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(path))
    root = document.getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "1", "1")

    (suite,) = xunit2.JUnitXml.fromfile(str(path))  # Surefire's reruns, as junitparser reads them
    cases = {case.name: case for case in suite}
    assert list(cases) == ["flaky", "broken", "down", "fine"]
    flaky, broken, down, fine = cases.values()
    # Passed twice, failed twice: a flaky test, which passed.
    assert flaky.is_passed and flaky.is_flaky and not flaky.is_rerun
    assert len(flaky.flaky_failures()) == 2 and flaky.flaky_errors() == []
    assert flaky.flaky_failures()[0].message == "turn 1: polite?"
    assert "critique: curt" in flaky.flaky_failures()[0].stack_trace
    # Never passed: its first failure stands, the other runs are reruns.
    assert not broken.is_passed and not broken.is_flaky and broken.is_rerun
    assert [type(r).__name__ for r in broken.result] == ["Failure"]
    assert len(broken.rerun_failures()) == 1 and len(broken.rerun_errors()) == 2
    assert [type(r).__name__ for r in down.result] == ["Error"]
    assert len(down.rerun_errors()) == 3
    assert fine.is_passed and not fine.is_flaky and not fine.is_rerun
    assert fine.system_out.count("run ") == 4  # every run's id


def test_with_one_run_a_scenario_junit_has_no_rerun_or_flaky_element(tmp_path: Path) -> None:
    document = etree.fromstring(junit_xml(batch(), outcomes()))
    tags = {element.tag for element in document.iter()}
    assert not tags & {"flakyFailure", "flakyError", "rerunFailure", "rerunError"}
    assert {"failure", "error"} <= tags


def comparison(significant: int) -> BatchComparison:
    before, after = batch(), batch()
    row = ScenarioComparison(
        scenario_id=uuid.uuid4(),
        scenario_name="refund",
        change=Change.REGRESSED,
        a_trials=4,
        a_passes=4,
        b_trials=4,
        b_passes=0 if significant else 3,
        p_value=1 / 70 if significant else 0.5,
        significant=bool(significant),
        a=None,
        b=None,
    )
    return BatchComparison(
        a=before,
        b=after,
        scenarios=[row],
        regressions=1,
        fixes=0,
        edited=0,
        significant_regressions=significant,
        pass_rate_difference=PassRateDifference(
            difference=-0.25, low=-0.5, high=0.0, pairs=4, resamples=2000, seed=0
        ),
    )


def test_with_a_baseline_only_a_significant_regression_exits_1() -> None:
    failing = [run(uuid.uuid4(), "refund", "failed"), run(uuid.uuid4(), "greet", "passed")]
    done = msgspec.structs.replace(batch(), failed_scenarios=1, error_scenarios=0)
    assert exit_code(done, failing, None) == 1  # no baseline: a failure is a failure
    assert exit_code(done, failing, None, comparison(0)) == 0
    assert exit_code(done, failing, None, comparison(1)) == 1
    # --fail-under still holds with a baseline; errors still exit 2.
    assert exit_code(done, failing, 0.9, comparison(0)) == 1
    errored = [*failing, run(uuid.uuid4(), "crash", "error")]
    assert exit_code(done, errored, None, comparison(0)) == 2
    assert baseline_verdict(comparison(1), 1) == (
        "1 significant regression (p < 0.05) against the baseline: exit 1"
    )
    assert baseline_verdict(None, 1) is None


def test_the_table_shows_p_values_and_the_interval_and_flaky_scenarios() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, highlight=False)
    print_comparison(console, comparison(1))
    shown_comparison = out.getvalue()
    assert "0.0143" in shown_comparison and "significant" in shown_comparison
    assert "4 of 4" in shown_comparison and "0 of 4" in shown_comparison
    assert "1 regression (1 significant, p < 0.05)" in shown_comparison
    assert "pass rate -25.0% (95 % interval -50.0% to +0.0%, 4 scenarios)" in shown_comparison

    flaky = ScenarioTrials(
        scenario_id=uuid.uuid4(), scenario_name="refund", trials=4, passes=3, errors=0, flaky=True
    )
    steady = msgspec.structs.replace(flaky, scenario_name="greet", passes=4, flaky=False)
    repeated_batch = msgspec.structs.replace(
        batch(),
        repetitions=4,
        scenarios=[flaky, steady],
        pass_hat_k=[7 / 8, 3 / 4, 5 / 8, 1 / 2],
        pass_at_k=1.0,
        flaky_scenarios=1,
    )
    out = io.StringIO()
    print_reliability(Console(file=out, width=200, highlight=False), repeated_batch)
    printed = out.getvalue()
    assert "pass^1 88%, pass^2 75%, pass^3 62%, pass^4 50%; pass@4 100%" in printed
    assert "refund" in printed and "3 of 4" in printed and "greet" not in printed
    out = io.StringIO()
    print_reliability(Console(file=out, width=200), batch())  # one run each: nothing to say
    assert out.getvalue() == ""
