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

import xmlschema
from lxml import etree
from rich.console import Console

from client.reports import FailedTurn, Outcome, json_report, junit_xml, print_results, shown
from shared.batches.schemas import BatchRunRead
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
