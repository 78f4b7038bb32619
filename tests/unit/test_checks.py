"""The deterministic checks of a criterion: verdicts, and a runaway pattern's limit."""

from __future__ import annotations

import asyncio
import json

import pytest

from shared.outbound.schemas import ToolCall
from shared.scenarios import checks
from tests.support.loop import ticking

REPLY = "Your Order Number is AB-991. No refund possible."


@pytest.mark.parametrize(
    ("kind", "pattern", "expected"),
    [
        ("contains", "order number", ("PASS", "order number")),
        ("contains", "invoice", ("FAIL", "")),
        ("not_contains", "REFUND", ("FAIL", "REFUND")),
        ("not_contains", "discount", ("PASS", "")),
        ("regex", r"[A-Z]{2}-\d{3}\b", ("PASS", "AB-991")),
        ("regex", r"^No refund", ("FAIL", "")),
        ("regex", r"(?i)order\s+(?P<what>\w+)", ("PASS", "Order Number")),
    ],
)
async def test_verdicts(kind: str, pattern: str, expected: tuple[str, str]):
    verdict, critique, evidence = await checks.verdict(kind, pattern, REPLY)
    assert (verdict, evidence) == expected
    assert pattern in critique


async def test_invalid_patterns_are_refused_with_the_reason():
    with pytest.raises(checks.PatternError, match="missing \\)"):
        checks.compile_pattern("(unclosed")
    # One stored before patterns were checked leaves its check undecided, not a worker crash.
    with pytest.raises(checks.CheckUndecided, match="invalid: missing \\)"):
        await checks.verdict("regex", "(unclosed", REPLY)


async def test_a_runaway_pattern_is_stopped_and_leaves_the_event_loop_free():
    async with ticking() as ticks:
        # Stopped: undecided for running too long (without the timeout the match would run
        # for ages and wait_for would raise TimeoutError instead).
        with pytest.raises(checks.CheckUndecided, match=r"ran longer than 1 s"):
            await asyncio.wait_for(
                checks.verdict("regex", r"(x+x+)+y", "x" * 5000),
                timeout=10 * checks.REGEX_TIMEOUT_S,
            )
    # Blocked, the loop would have ticked once or twice in that second.
    assert ticks.count >= 20, ticks.count


# --- tool calls (DESIGN §5.10) -----------------------------------------------------------------

LOOKUP = ToolCall(name="lookup_order", arguments={"order_id": "AB-991"}, output={"total": 40})
REFUND = ToolCall(
    name="refund_order",
    arguments={"order_id": "AB-991", "amount": 40, "reason": {"code": "late", "notes": "x"}},
)
REFUND_ITEMS = ToolCall(
    name="refund_order", arguments={"order_id": "AB-992", "items": [1, 2], "express": True}
)
CALLS = [LOOKUP, REFUND, REFUND_ITEMS]


def test_tool_called_passes_on_any_call_of_the_tool_and_quotes_it():
    verdict, critique, evidence = checks.tool_verdict("tool_called", "lookup_order", None, CALLS)
    assert verdict == "PASS"
    assert "lookup_order was called once" in critique
    assert "calls seen: lookup_order, refund_order (2 calls)" in critique
    assert evidence == 'lookup_order({"order_id":"AB-991"}) -> {"total":40}'


def test_tool_called_fails_when_the_tool_was_not_called_and_names_what_was():
    verdict, critique, evidence = checks.tool_verdict("tool_called", "cancel_order", None, CALLS)
    assert (verdict, evidence) == ("FAIL", "")
    assert critique == (
        "cancel_order was not called; calls seen: lookup_order, refund_order (2 calls)"
    )
    assert (
        checks.tool_verdict("tool_called", "x", None, [])[1] == "x was not called; calls seen: none"
    )


@pytest.mark.parametrize(
    "expected",
    [
        {"order_id": "AB-991"},
        {"amount": 40.0},  # numbers equal as JSON numbers
        {"reason": {"code": "late"}},  # nested objects: a subset too
        {"order_id": "AB-992", "items": [1, 2], "express": True},  # the second call matches
        {},
    ],
    ids=["one key", "number", "nested subset", "second call", "empty"],
)
def test_tool_called_passes_when_some_call_carries_every_expected_argument(expected):
    verdict, critique, evidence = checks.tool_verdict(
        "tool_called", "refund_order", expected, CALLS
    )
    assert verdict == "PASS", critique
    matching = REFUND_ITEMS if "items" in expected else REFUND
    assert evidence == matching.compact()
    assert "refund_order was called with" in critique


@pytest.mark.parametrize(
    ("expected", "why"),
    [
        (
            {"order_id": "ZZ-1"},
            'call 1: order_id is "AB-991", expected "ZZ-1"; '
            'call 2: order_id is "AB-992", expected "ZZ-1"',
        ),
        ({"currency": "EUR"}, "call 1: currency is missing; call 2: currency is missing"),
        (
            {"reason": {"code": "early"}},
            'call 1: reason.code is "late", expected "early"; call 2: reason is missing',
        ),
        ({"reason": {"gone": 1}}, "call 1: reason.gone is missing; call 2: reason is missing"),
        (
            {"order_id": {"nested": 1}},
            'call 1: order_id is "AB-991", not an object; call 2: order_id is "AB-992", not an '
            "object",
        ),
        ({"items": [1]}, "call 1: items is missing; call 2: items is [1,2], expected [1]"),
        ({"express": 1}, "call 1: express is missing; call 2: express is true, expected 1"),
    ],
    ids=["value", "missing key", "nested value", "nested missing", "object", "list", "bool"],
)
def test_tool_called_fails_when_no_call_carries_them_and_says_why(expected, why):
    verdict, critique, evidence = checks.tool_verdict(
        "tool_called", "refund_order", expected, CALLS
    )
    assert verdict == "FAIL"
    wanted = json.dumps(expected, separators=(",", ":"), sort_keys=True)
    assert critique == (
        f"refund_order was called 2 times, never with {wanted} ({why}); "
        "calls seen: lookup_order, refund_order (2 calls)"
    )
    assert evidence == REFUND.compact()


def test_json_equality_is_jsons_own():
    assert checks.json_equal(1, 1.0) and checks.json_equal([1, {"a": 2}], [1.0, {"a": 2.0}])
    assert not checks.json_equal(True, 1) and not checks.json_equal(0, False)
    assert not checks.json_equal([1, 2], [2, 1]) and not checks.json_equal([1], [1, 1])
    assert not checks.json_equal(None, 0) and not checks.json_equal("1", 1)
    assert not checks.json_equal({"a": 1}, {"a": 1, "b": 2})  # inside a list: whole
    assert checks.mismatch({"a": [{"b": 1}]}, {"a": [{"b": 1, "c": 2}]}) is not None


def test_tool_not_called():
    verdict, critique, evidence = checks.tool_verdict(
        "tool_not_called", "cancel_order", None, CALLS
    )
    assert (verdict, evidence) == ("PASS", "")
    assert critique == (
        "cancel_order was not called; calls seen: lookup_order, refund_order (2 calls)"
    )
    verdict, critique, evidence = checks.tool_verdict(
        "tool_not_called", "refund_order", None, CALLS
    )
    assert verdict == "FAIL"
    assert critique.startswith("refund_order was called 2 times;")
    assert evidence == REFUND.compact()


def test_a_long_call_is_quoted_cut_and_many_tools_are_named_briefly():
    huge = ToolCall(name="dump", arguments={"blob": "x" * 10_000})
    many = [ToolCall(name=f"tool_{n}") for n in range(30)]
    _, critique, evidence = checks.tool_verdict("tool_called", "dump", None, [huge, *many])
    assert len(evidence) == checks.MAX_QUOTED and evidence.endswith("…")
    assert critique.endswith("tool_18, and 11 more")
    _, critique, _ = checks.tool_verdict("tool_called", "dump", {"blob": "y"}, [huge] * 7)
    assert "call 5: blob is" in critique and "call 6" not in critique
    assert f'blob is "{"x" * (checks.MAX_VALUE - 2)}…, expected "y"' in critique
    assert "; and 2 more); calls seen: dump (7 calls)" in critique
