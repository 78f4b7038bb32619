"""Two real ``spar scheduler`` processes on one database for over three minutes of a
``* * * * *`` trigger, the active one killed with SIGKILL part way: every slot fires
exactly once, and the standby fires the slots after the kill on time.

The drill (``tests/support/failover.py``) starts when this test is collected and runs
beside the rest of the suite; this test, ordered last, waits for it and checks the record.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta

import pytest

from tests.support.failover import LEADER_RETRY_S, FailoverDrill, summary

pytestmark = pytest.mark.slow

DRILL_KEY = pytest.StashKey[FailoverDrill]()
LATE = timedelta(seconds=10)  # a slot's execution is recorded this soon after its time


def test_two_schedulers_fire_every_slot_exactly_once_through_a_kill(
    request: pytest.FixtureRequest,
) -> None:
    drill = request.config.stash.get(DRILL_KEY, None)
    assert drill is not None, "the drill starts at collection (tests/conftest.py)"
    result = drill.wait(timeout_s=600)
    if result.error is not None:
        raise AssertionError(summary(result)) from result.error
    context = summary(result)
    executions = result.executions
    slots = [e["scheduled_for"] for e in executions]

    # Over three minutes of consecutive minute slots from the first after the trigger was
    # made, none skipped, none twice, all run, nothing missed.
    assert slots[-1] - slots[0] >= timedelta(minutes=3), context
    assert slots[0] - result.trigger_created_at < timedelta(minutes=1), context
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(slots)), context
    assert [e["source"] for e in executions] == ["schedule"] * len(slots), context
    assert {e["status"] for e in executions} == {"succeeded"}, context
    assert all(e["response"] == "tock tick every minute" for e in executions), context

    # The agent heard each slot once.
    heard = Counter(c["metadata"]["trigger_execution_id"] for c in result.agent_calls)
    assert set(heard) == {e["id"] for e in executions}, context
    assert set(heard.values()) == {1}, context

    # The standby took over at its next try, and the slots after the kill fired on time.
    assert result.took_over_after_s is not None
    assert result.took_over_after_s < LEADER_RETRY_S + 5, context
    after = [e for e in executions if e["scheduled_for"] > result.killed_at]
    assert len(after) >= 2, context
    assert all(e["created_at"] - e["scheduled_for"] < LATE for e in executions), context
