"""The deterministic checks of a criterion: verdicts, and a runaway pattern's limit."""

from __future__ import annotations

import asyncio

import pytest

from shared.scenarios import checks

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
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    # Stopped: undecided for running too long (without the timeout the match would run
    # for ages and wait_for would raise TimeoutError instead).
    with pytest.raises(checks.CheckUndecided, match=r"ran longer than 1 s"):
        await asyncio.wait_for(
            checks.verdict("regex", r"(x+x+)+y", "x" * 5000), timeout=10 * checks.REGEX_TIMEOUT_S
        )
    ticker.cancel()
    # Blocked, the loop would have ticked once or twice in that second.
    assert ticks >= 20, ticks
